//! A server's folder does not outlive the test process that started it, also when the server
//! is never dropped (a `static` shared by a binary's tests): outside `scripts/test` nothing
//! else deletes it, and each etcd member's is about 123 MB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use fencelock_testsupport::{tmp_root, unique, EtcdCluster};

const CHILD: &str = "FENCELOCK_REAP_CHILD";

#[test]
fn a_server_folder_is_deleted_once_its_test_process_is_gone() {
    if std::env::var_os(CHILD).is_some() {
        // The child: a server that is never dropped, as a `static` is not, whose folder must
        // stay while the process lives (past the watchdog's first looks).
        let cluster = EtcdCluster::start(1);
        std::thread::sleep(Duration::from_secs(3));
        assert!(cluster.dir.exists(), "deleted while its process lives");
        println!("folder={}", cluster.dir.display());
        std::mem::forget(cluster);
        return;
    }
    // Not the server's: must survive its reaping.
    let bystander = tmp_root().join(unique("reap-bystander"));
    std::fs::create_dir_all(&bystander).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_server_folder_is_deleted_once_its_test_process_is_gone",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let folder = stdout
        .lines()
        .find_map(|l| l.split_once("folder=").map(|(_, folder)| folder))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("the child printed no folder: {stdout}"));
    // The watchdog looks once a second, kills the server, waits 2 s and deletes.
    let started = Instant::now();
    while folder.exists() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !folder.exists(),
        "{} still exists {:?} after its test process ended",
        folder.display(),
        started.elapsed()
    );
    assert!(bystander.exists(), "a folder not the server's was deleted");
    std::fs::remove_dir_all(&bystander).unwrap();
}
