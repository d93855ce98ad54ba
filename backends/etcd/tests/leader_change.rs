//! Issue 13.6: a holder's requests while the etcd leader is killed: each completes or fails
//! within one attempt, and the throughput through the change is measured.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use fencelock::LockBackendExt;
use fencelock_etcd::EtcdBackend;
use fencelock_testsupport::{unique, EtcdCluster};
use tokio::time::Instant;

/// Ops done in one phase: (answered ok, failed, slowest call).
#[derive(Default)]
struct Phase {
    ok: usize,
    failed: usize,
    slowest: Duration,
}

/// Fenced puts, fenced gets and checkpoints in a loop through a leader kill (request timeout
/// 5 s, TTL 3 s: one attempt may take min(5 s, TTL/3) = 1 s). No call may stall past one
/// attempt (plus scheduling slack): a request sent to the dead leader is abandoned and reported
/// as an error, which says the write may or may not have been applied; fencelock does not retry
/// it, so it is applied at most once (and a caller's retry is a fresh compare on the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_requests_through_a_leader_kill_complete_or_fail_within_one_attempt() {
    let mut cluster = EtcdCluster::start(3);
    let config = common::config(cluster.endpoints(), &format!("{}/", unique("lc")));
    let attempt = config.request_timeout.min(config.ttl / 3);
    let backend = EtcdBackend::connect(config).await.unwrap();
    let guard = backend.lock("job").await.unwrap();
    let mut phases: [Phase; 3] = Default::default();
    let mut i = 0u64;
    let run = |phase: &mut Phase, elapsed: Duration, ok: bool| {
        phase.slowest = phase.slowest.max(elapsed);
        if ok {
            phase.ok += 1;
        } else {
            phase.failed += 1;
        }
    };
    let durations = [
        Duration::from_secs(2),
        Duration::from_secs(4),
        Duration::from_secs(3),
    ];
    let mut killed = None;
    for (p, length) in durations.iter().enumerate() {
        if p == 1 {
            let leader = cluster.leader().expect("a leader");
            cluster.kill(leader);
            killed = Some(leader);
        }
        if p == 2 {
            cluster.restart(killed.unwrap());
        }
        let end = Instant::now() + *length;
        while Instant::now() < end {
            i += 1;
            let started = Instant::now();
            let ok = match i % 3 {
                0 => guard.fenced_put("n", i.to_string()).await.is_ok(),
                1 => guard.fenced_get("n").await.is_ok(),
                _ => guard.checkpoint(i.to_string()).await.is_ok(),
            };
            run(&mut phases[p], started.elapsed(), ok);
            if !ok {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let held = guard.is_held();
    let started = Instant::now();
    let released = guard.release().await;
    let release_took = started.elapsed();
    eprintln!("| phase | ok | failed | ok/s | slowest call |\n|---|---|---|---|---|");
    for (phase, (name, length)) in phases.iter().zip(
        ["before the kill", "leader killed", "after the restart"]
            .iter()
            .zip(durations),
    ) {
        #[allow(clippy::cast_precision_loss)]
        let rate = phase.ok as f64 / length.as_secs_f64();
        eprintln!(
            "| {name} | {} | {} | {rate:.0} | {:?} |",
            phase.ok, phase.failed, phase.slowest
        );
    }
    eprintln!("held at the end: {held}; release: {released:?} in {release_took:?}");
    let slack = Duration::from_millis(750);
    for (p, phase) in phases.iter().enumerate() {
        assert!(
            phase.slowest <= attempt + slack,
            "phase {p}: a call stalled {:?}, past one attempt ({attempt:?})",
            phase.slowest
        );
    }
    // A lease lost in the election (longer than the TTL) fails every later call, at once.
    assert!(phases[2].ok > 0 || !held, "no progress after the restart");
    assert!(released.is_ok(), "the release must complete: {released:?}");
}
