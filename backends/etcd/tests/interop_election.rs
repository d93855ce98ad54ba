//! Interoperability with `etcdctl elect` (Go's concurrency.Election) on the same election:
//! one leader at a time across both, each sees the other's value.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, LockBackend, LockBackendExt, LockName, ReleaseOutcome};
use fencelock_etcd::EtcdBackend;
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const BOUND: Duration = Duration::from_secs(30);

fn etcdctl(endpoints: &[String], args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("run etcdctl (scripts/test installs etcd-client)");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

async fn line(lines: &mut Lines<BufReader<ChildStdout>>, what: &str) -> String {
    tokio::time::timeout(BOUND, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{what}: etcdctl printed nothing"))
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: etcdctl exited"))
}

/// SIGINT: `etcdctl elect` resigns and closes its session, as on Ctrl-C.
async fn interrupt(mut child: Child) {
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    let _ = tokio::time::timeout(BOUND, child.wait()).await;
}

async fn create_revision(factory: &common::EtcdFactory, key: &str) -> i64 {
    let got = factory.admin.clone().get(key, None).await.unwrap();
    got.kvs()[0].create_revision()
}

async fn backend(factory: &common::EtcdFactory) -> EtcdBackend {
    EtcdBackend::connect(common::config(factory.endpoints.clone(), &factory.prefix))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_waits_for_our_leader_and_both_see_each_others_value() {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let ours = backend(&factory).await;
    let election = format!("{}jobs", factory.prefix);
    let leader = ours.campaign("jobs", "fencelock-1").await.unwrap();

    // Go's Observe (etcdctl elect -l) prints the leader's key, then its value.
    let (observer, mut observed) = etcdctl(&factory.endpoints, &["elect", "-l", &election]);
    let key = line(&mut observed, "observe").await;
    assert!(key.starts_with(&format!("{election}/")), "{key}");
    assert_eq!(line(&mut observed, "observe").await, "fencelock-1");

    let (theirs, mut elected) = etcdctl(&factory.endpoints, &["elect", &election, "etcdctl-1"]);
    let early = tokio::time::timeout(Duration::from_millis(1500), elected.next_line()).await;
    assert!(
        early.is_err(),
        "etcdctl elect must wait while we lead: {early:?}"
    );
    let term = leader.term();
    assert_eq!(leader.resign().await.unwrap(), ReleaseOutcome::Released);
    let their_key = line(&mut elected, "elected").await;
    assert_eq!(line(&mut elected, "elected").await, "etcdctl-1");
    assert_eq!(line(&mut observed, "observe").await, their_key);
    assert_eq!(line(&mut observed, "observe").await, "etcdctl-1");

    // While etcdctl leads: our reads see its value, with its key's create revision as term.
    let name = LockName::new("jobs").unwrap();
    let seen = ours.leader(&name).await.unwrap().expect("etcdctl leads");
    assert_eq!(seen.value, b"etcdctl-1");
    let created = create_revision(&factory, &their_key).await;
    assert_eq!(seen.term.get(), created.unsigned_abs());
    assert!(seen.term > term);
    assert!(matches!(
        ours.try_campaign("jobs", "fencelock-2").await,
        Err(Error::WouldBlock { .. })
    ));
    let mut changes = ours.observe(&name);
    let first = tokio::time::timeout(BOUND, changes.next()).await.unwrap();
    assert_eq!(first.unwrap().unwrap(), Some(seen));
    interrupt(theirs).await;
    let next = tokio::time::timeout(BOUND, changes.next()).await.unwrap();
    assert_eq!(next.unwrap().unwrap(), None, "etcdctl resigned: no leader");
    interrupt(observer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_wait_for_an_etcdctl_leader_and_get_a_greater_term() {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let election = format!("{}sched", factory.prefix);
    let (theirs, mut elected) = etcdctl(&factory.endpoints, &["elect", &election, "etcdctl-1"]);
    let their_key = line(&mut elected, "elected").await;
    let their_rev = create_revision(&factory, &their_key).await;

    let ours = Arc::new(backend(&factory).await);
    let waiting = {
        let ours = Arc::clone(&ours);
        tokio::spawn(async move { ours.campaign("sched", "fencelock-1").await })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!waiting.is_finished(), "we must wait while etcdctl leads");
    let (observer, mut observed) = etcdctl(&factory.endpoints, &["elect", "-l", &election]);
    assert_eq!(line(&mut observed, "observe").await, their_key);
    assert_eq!(line(&mut observed, "observe").await, "etcdctl-1");
    interrupt(theirs).await;
    let mut leader = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("we are elected")
        .unwrap()
        .unwrap();
    assert!(leader.term().get() > their_rev.unsigned_abs());
    let our_key = line(&mut observed, "observe").await;
    assert_eq!(line(&mut observed, "observe").await, "fencelock-1");
    // Go's Observe reports a proclaim as a new value of the same key.
    leader.proclaim("fencelock-1b").await.unwrap();
    assert_eq!(line(&mut observed, "observe").await, our_key);
    assert_eq!(line(&mut observed, "observe").await, "fencelock-1b");
    assert_eq!(leader.resign().await.unwrap(), ReleaseOutcome::Released);
    interrupt(observer).await;
}
