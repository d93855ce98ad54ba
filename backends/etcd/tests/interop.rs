//! Interoperability with `etcdctl lock` (Go's concurrency.Mutex) on the same lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::process::Stdio;
use std::time::Duration;

use fencelock::{LockBackendExt, ReleaseOutcome};
use fencelock_etcd::EtcdBackend;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BOUND: Duration = Duration::from_secs(30);

fn etcdctl(endpoints: &[String]) -> Command {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_waits_for_fencelock_and_sees_a_greater_revision() {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let backend = EtcdBackend::connect(common::config(factory.endpoints.clone(), &factory.prefix))
        .await
        .unwrap();
    let guard = backend.lock("shared").await.unwrap();
    let lock_name = format!("{}shared", factory.prefix);
    let mut child = etcdctl(&factory.endpoints)
        .args([
            "lock",
            "--ttl",
            "5",
            &lock_name,
            "--",
            "sh",
            "-c",
            "echo \"REV=$ETCD_LOCK_REV KEY=$ETCD_LOCK_KEY\"",
        ])
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "etcdctl lock must wait while fencelock holds the lock"
    );
    let token = guard.token();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let out = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .expect("etcdctl finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "etcdctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rev: u64 = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("REV="))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no ETCD_LOCK_REV in {stdout:?}"));
    assert!(
        rev > token.get(),
        "etcdctl's revision {rev} must exceed our token {token}"
    );
    assert!(stdout.contains(&format!("KEY={lock_name}/")), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencelock_waits_for_etcdctl_and_gets_a_greater_token() {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let lock_name = format!("{}shared", factory.prefix);
    let mut child = etcdctl(&factory.endpoints)
        .args(["lock", "--ttl", "5", &lock_name])
        .spawn()
        .unwrap();
    // etcdctl prints its key once it holds the lock.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let key = tokio::time::timeout(BOUND, lines.next_line())
        .await
        .expect("etcdctl locks")
        .unwrap()
        .unwrap();
    assert!(key.starts_with(&format!("{lock_name}/")), "{key}");
    let held = factory.admin.clone().get(key.as_str(), None).await.unwrap();
    let etcdctl_rev = held.kvs()[0].create_revision();

    let backend = EtcdBackend::connect(common::config(factory.endpoints.clone(), &factory.prefix))
        .await
        .unwrap();
    assert!(matches!(
        backend.try_lock("shared").await,
        Err(fencelock::Error::WouldBlock { .. })
    ));
    let waiting = tokio::spawn(async move {
        let guard = backend.lock("shared").await;
        (backend, guard)
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !waiting.is_finished(),
        "fencelock must wait while etcdctl holds the lock"
    );
    // SIGINT: etcdctl unlocks and closes its session.
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    let (_backend, guard) = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("fencelock acquires")
        .unwrap();
    let guard = guard.unwrap();
    assert!(guard.token().get() > etcdctl_rev.unsigned_abs());
    let _ = child.wait().await;
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}
