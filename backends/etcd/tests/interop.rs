//! Interoperability with `etcdctl lock` (Go's concurrency.Mutex) on the same lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::process::Stdio;
use std::time::Duration;

use fencelock::{LockBackend, LockBackendExt, LockName, ReleaseOutcome};
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
    // Who is queued: etcdctl's key says nothing of its writer (foreign); ours names us.
    let observer = EtcdBackend::connect(common::config(factory.endpoints.clone(), &factory.prefix))
        .await
        .unwrap();
    let seen = observer
        .status(&LockName::new("shared").unwrap())
        .await
        .unwrap();
    fencelock::testkit::assert_foreign_holder_then_ours(&seen, etcdctl_rev.unsigned_abs());
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

/// A mixed fleet on one lock: two fencelock instances and two `etcdctl lock` loops take turns,
/// and every critical section appends its token to one log. A resource fencing on max(token)
/// needs those tokens strictly increasing in section (grant) order, whoever holds. etcdctl
/// exports `Mutex.Header().Revision` at the grant, so fencelock's token must be the revision
/// of its grant too, not its key's create revision (which a waiter got long before its turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_in_grant_order_across_fencelock_and_etcdctl() {
    const ROUNDS: usize = 15;
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let lock_name = format!("{}mixed", factory.prefix);
    let log = fencelock_testsupport::tmp_root().join(fencelock_testsupport::unique("mixed-log"));
    std::fs::write(&log, "").unwrap();
    let mut tasks = Vec::new();
    for who in ["etcdctl-1", "etcdctl-2"] {
        let script = format!(
            "for i in $(seq {ROUNDS}); do etcdctl --endpoints={} lock --ttl 5 {lock_name} -- \
             sh -c 'echo {who} $ETCD_LOCK_REV >> {}; sleep 0.02' || exit 1; done",
            factory.endpoints.join(","),
            log.display()
        );
        let mut child = Command::new("sh");
        child
            .args(["-c", &script])
            .env("ETCDCTL_API", "3")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        tasks.push(tokio::spawn(async move {
            let status = child.status().await.unwrap();
            assert!(status.success(), "the etcdctl loop failed: {status}");
        }));
    }
    for who in ["fencelock-1", "fencelock-2"] {
        let backend =
            EtcdBackend::connect(common::config(factory.endpoints.clone(), &factory.prefix))
                .await
                .unwrap();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = backend.lock("mixed").await.unwrap();
                let line = format!("{who} {}\n", guard.token());
                let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
                std::io::Write::write_all(&mut file, line.as_bytes()).unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("every contender finishes")
            .unwrap();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let sections: Vec<(&str, u64)> = text
        .lines()
        .map(|l| {
            let (who, token) = l.split_once(' ').unwrap();
            (who, token.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(sections.len(), 4 * ROUNDS, "{text}");
    let backwards: Vec<_> = sections
        .windows(2)
        .filter(|w| w[1].1 <= w[0].1)
        .map(|w| format!("{} {} then {} {}", w[0].0, w[0].1, w[1].0, w[1].1))
        .collect();
    assert!(
        backwards.is_empty(),
        "tokens went backwards {} times in {} sections: {backwards:?}",
        backwards.len(),
        sections.len()
    );
}
