//! Faults against real etcd: a client cut off by a black hole, and the leader killed during holds.
//! Each test starts its own servers, since it breaks them.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{LockBackend, LockBackendExt};
use fencelock_etcd::EtcdBackend;
use fencelock_testsupport::{unique, EtcdCluster, ProxyMode, TcpProxy};
use tokio::time::Instant;

const BOUND: Duration = Duration::from_secs(60);

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_client_is_lost_before_a_successor_is_granted_and_is_fenced() {
    let cluster = EtcdCluster::start(1);
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("cut"));
    let a = EtcdBackend::connect(common::config(vec![proxy.endpoint()], &prefix))
        .await
        .unwrap();
    let b = Arc::new(
        EtcdBackend::connect(common::config(cluster.endpoints(), &prefix))
            .await
            .unwrap(),
    );
    let stale = a.lock("job").await.unwrap();
    stale.fenced_put("owner", "stale").await.unwrap();
    proxy.set_mode(ProxyMode::BlackHole);
    let (lost, granted) = fencelock::testkit::cut_off_holder(stale, &a, b, "job", || {
        proxy.set_mode(ProxyMode::Forward)
    })
    .await;
    eprintln!("cut-off: lost {lost:?} after the cut, successor granted {granted:?} after the cut (TTL {:?})", common::TTL);
}

/// Contenders loop on one lock while the leader is killed and restarted: no two holders at
/// once, every accepted fenced write carries a greater token, and work goes on afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_exclusion_and_progress() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut cluster = EtcdCluster::start(3);
    let prefix = format!("{}/", unique("leader"));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    // (token, the value written, when): the value is what the holder read plus one.
    let accepted = Arc::new(Mutex::new(Vec::<(u64, u64, Instant)>::new()));
    // Puts that failed: during the kill a put can be applied although its reply is lost.
    let unknown = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let backend = EtcdBackend::connect(common::config(cluster.endpoints(), &prefix))
            .await
            .unwrap();
        let (inside, overlaps, accepted, unknown, lost, stop) = (
            Arc::clone(&inside),
            Arc::clone(&overlaps),
            Arc::clone(&accepted),
            Arc::clone(&unknown),
            Arc::clone(&lost),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            // Bounded: at most 2,000 rounds, and the test stops it long before.
            for _ in 0..2_000 {
                if *stop.borrow() {
                    break;
                }
                let guard = match backend
                    .lock_timeout("ledger", Duration::from_secs(10))
                    .await
                {
                    Ok(guard) => guard,
                    Err(e) => {
                        tracing::warn!(error = %e, "contender: acquire failed");
                        continue;
                    }
                };
                let work = guard.run(async {
                    let _inside = Inside::enter(&inside, &overlaps);
                    let n: u64 = match guard.fenced_get("n").await {
                        Ok(v) => v
                            .and_then(|v| String::from_utf8(v).ok())
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0),
                        Err(_) => return,
                    };
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    if guard.fenced_put("n", (n + 1).to_string()).await.is_ok() {
                        accepted
                            .lock()
                            .unwrap()
                            .push((guard.token().get(), n + 1, Instant::now()));
                    } else {
                        unknown.fetch_add(1, Ordering::SeqCst);
                    }
                });
                if work.await.is_err() {
                    lost.fetch_add(1, Ordering::SeqCst);
                }
                let _ = guard.release().await;
            }
        }));
    }
    let count = || accepted.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = cluster.leader().expect("a leader");
    let before_kill = count();
    tracing::warn!("KILLING LEADER {leader}");
    cluster.kill(leader);
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.restart(leader);
    let after_restart = count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let at_end = count();
    let _ = stop_tx.send(true);
    for task in tasks {
        bounded("contender stops", task).await.unwrap();
    }
    let accepted = accepted.lock().unwrap().clone();
    eprintln!(
        "leader kill: {before_kill} writes before the kill, {} during, {} after the restart; {} critical sections lost",
        after_restart - before_kill,
        at_end - after_restart,
        lost.load(Ordering::SeqCst)
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert!(
        accepted.windows(2).all(|w| w[0].0 < w[1].0),
        "accepted tokens must increase: {accepted:?}"
    );
    assert!(
        before_kill > 0 && at_end > after_restart,
        "work must go on before and after the kill"
    );
    // No lost update: each accepted write raised the counter past every earlier one (two
    // holders reading the same value would write the same value twice). A failed put may
    // still have been applied (its reply lost in the kill), so the final counter is the last
    // accepted value plus at most the failed puts.
    let values: Vec<u64> = accepted.iter().map(|a| a.1).collect();
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "accepted writes must raise the counter: {values:?}"
    );
    let unknown = unknown.load(Ordering::SeqCst) as u64;
    let check = EtcdBackend::connect(common::config(cluster.endpoints(), &prefix))
        .await
        .unwrap();
    let guard = check.lock("ledger").await.unwrap();
    let n = guard.fenced_get("n").await.unwrap().unwrap();
    let n: u64 = String::from_utf8(n).unwrap().parse().unwrap();
    let last = values.last().copied().unwrap_or(0);
    assert!(
        (last..=last + unknown).contains(&n),
        "counter {n}: the last accepted write set {last}, and {unknown} puts failed"
    );
    assert!(
        n - (values.len() as u64) <= unknown,
        "counter {n} is above the {} accepted writes by more than the {unknown} failed puts",
        values.len()
    );
}

struct Inside<'a>(&'a AtomicUsize);

impl<'a> Inside<'a> {
    fn enter(inside: &'a AtomicUsize, overlaps: &AtomicUsize) -> Self {
        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
            overlaps.fetch_add(1, Ordering::SeqCst);
        }
        Inside(inside)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A release that gets no answer gives up within `request_timeout`: its retries share that
/// budget, and the last one is cut to what is left of it. Before, the last retry could start
/// just inside the budget and run a whole attempt past it (1.5 s with a 1 s timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_gets_no_answer_gives_up_within_the_request_timeout() {
    let cluster = common::shared_single();
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("release-budget"));
    // A short TTL makes one attempt (TTL / 3) shorter than the timeout, so that it is retried.
    let mut config = common::config(vec![proxy.endpoint()], &prefix).ttl(Duration::from_secs(2));
    config.request_timeout = Duration::from_secs(1);
    let backend = EtcdBackend::connect(config).await.unwrap();
    let guard = backend.lock("job").await.unwrap();
    proxy.set_mode(ProxyMode::BlackHole);
    let start = Instant::now();
    let released = guard.release().await;
    let took = start.elapsed();
    eprintln!("release: {released:?} after {took:?}");
    assert!(released.is_err(), "{released:?}");
    // Halfway between the budget (1 s) and what it took before (1.5 s).
    assert!(
        took < Duration::from_millis(1250),
        "the release took {took:?} with a request timeout of 1 s"
    );
    proxy.set_mode(ProxyMode::Forward);
}

/// Review F1: B's `lock_timeout` times out while its link is black-holed, so its withdrawal
/// cannot reach etcd then, but its session outlives the cut. Before the shared `Enqueued`, the
/// one withdrawal attempt failed and B's key stayed queued on a live lease: every later
/// contender waited forever. Now the withdrawal is retried until etcd answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquire_whose_withdrawal_fails_leaves_nothing_behind() {
    let cluster = EtcdCluster::start(1);
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("withdraw"));
    let direct = || EtcdBackend::connect(common::config(cluster.endpoints(), &prefix));
    let (a, c) = (direct().await.unwrap(), direct().await.unwrap());
    let mut config = common::config(vec![proxy.endpoint()], &prefix).ttl(Duration::from_secs(10));
    config.request_timeout = Duration::from_secs(1);
    let b = Arc::new(EtcdBackend::connect(config).await.unwrap());

    let held = a.lock("job").await.unwrap();
    let start = Instant::now();
    let waiting = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.lock_timeout("job", Duration::from_secs(2)).await })
    };
    tokio::time::sleep_until(start + Duration::from_millis(1500)).await;
    proxy.set_mode(ProxyMode::BlackHole);
    let timed_out = bounded("b's timeout", waiting).await.unwrap();
    assert!(
        matches!(timed_out, Err(fencelock::Error::Timeout { .. })),
        "{timed_out:?}"
    );
    tokio::time::sleep_until(start + Duration::from_millis(4500)).await;
    proxy.set_mode(ProxyMode::Forward);
    assert!(b.lease_id().await.is_some(), "b's session outlived the cut");

    let _ = held.release().await.unwrap();
    let next = c.lock_timeout("job", Duration::from_secs(8)).await;
    assert!(
        next.is_ok(),
        "c must get the lock: b's cancelled acquire left its key behind: {next:?}"
    );
    let status = c
        .status(&fencelock::LockName::new("job").unwrap())
        .await
        .unwrap();
    assert_eq!(status.waiting, 0, "nothing of b queued: {status:?}");
}

/// Issue 13.4 (the etcd#11456 class): a waiter whose own lease is revoked while it waits fails
/// with `LockLost` and is never granted, and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_is_revoked_is_never_granted() {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let connect =
        || EtcdBackend::connect(common::config(factory.endpoints.clone(), &factory.prefix));
    let (a, b, c) = (
        connect().await.unwrap(),
        Arc::new(connect().await.unwrap()),
        connect().await.unwrap(),
    );
    let held = a.lock("job").await.unwrap();
    let _ = b.lock("warm").await.unwrap().release().await.unwrap();
    let waiting = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.lock("job").await })
    };
    // Revoked once b's key waits in the store: revoked before its put, b would campaign
    // again on a new lease and be granted, which is not the case under test.
    let name = fencelock::LockName::new("job").unwrap();
    fencelock::testkit::until_queued("b's wait reaches the store", &c, &name, 1).await;
    let lease = b.lease_id().await.unwrap();
    common::shared_single()
        .etcdctl(&["lease", "revoke", &format!("{lease:x}")])
        .unwrap();
    let _ = held.release().await.unwrap();
    let outcome = bounded("the revoked waiter", waiting).await.unwrap();
    assert!(
        matches!(outcome, Err(fencelock::Error::LockLost { .. })),
        "a waiter without a lease must not be granted: {:?}",
        outcome.map(|g| g.token())
    );
    let next = c.try_lock("job").await;
    assert!(next.is_ok(), "nothing left behind: {next:?}");
}

/// Review F8: the session's lease is revoked behind its back; the next acquire opens a new
/// session at once instead of failing until the keepalive notices (up to TTL/3 later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_after_a_revoke_behind_our_back_opens_a_new_session() {
    let (_factory, backend) = slow_keepalive_backend().await;
    let _ = backend.lock("warm").await.unwrap().release().await.unwrap();
    let old = backend.lease_id().await.unwrap();
    common::shared_single()
        .etcdctl(&["lease", "revoke", &format!("{old:x}")])
        .unwrap();
    let guard = backend.try_lock("job").await;
    assert!(
        guard.is_ok(),
        "a revoked lease must be replaced at once: {guard:?}"
    );
    let new = backend.lease_id().await.unwrap();
    assert_ne!(new, old);
}

/// A backend whose keepalive would not notice a lost key for 10 s (TTL 30 s), on the shared
/// single node.
async fn slow_keepalive_backend() -> (common::EtcdFactory, EtcdBackend) {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let mut config = common::config(factory.endpoints.clone(), &factory.prefix);
    config.ttl = Duration::from_secs(30);
    config.safety_margin = Duration::from_secs(1);
    let backend = EtcdBackend::connect(config).await.unwrap();
    (factory, backend)
}

/// The key of the lock `job` held now, read with etcdctl.
fn job_key(factory: &common::EtcdFactory) -> String {
    let keys = common::shared_single()
        .etcdctl(&[
            "get",
            "--prefix",
            "--keys-only",
            &format!("{}job/", factory.prefix),
        ])
        .unwrap();
    keys.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap()
        .trim()
        .to_owned()
}

/// Issue 13.3 (review F5): the holder's key is deleted behind its back (`etcdctl del`), or its
/// lease revoked: `lost` fires within about a round trip, not at the next keepalive (or never,
/// for a delete while the lease lives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_or_revoked_behind_our_back_fires_lost_at_once() {
    let (factory, backend) = slow_keepalive_backend().await;
    for how in ["del", "revoke"] {
        let guard = backend.lock("job").await.unwrap();
        let key = job_key(&factory);
        tokio::time::sleep(Duration::from_millis(200)).await; // the watch goes out after the grant
        let at = Instant::now();
        match how {
            "del" => common::shared_single().etcdctl(&["del", &key]).unwrap(),
            _ => {
                let lease = backend.lease_id().await.unwrap();
                common::shared_single()
                    .etcdctl(&["lease", "revoke", &format!("{lease:x}")])
                    .unwrap()
            }
        };
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{how}: lost must fire well before the next keepalive"));
        eprintln!("{how}: lost {:?} after it", at.elapsed());
        assert!(!guard.is_held());
        assert_eq!(
            guard.release().await.unwrap(),
            fencelock::ReleaseOutcome::NotOwned
        );
    }
}

/// A key's watch outlives the release and covers the name's next grants (`src/watch.rs`): a
/// delete behind the back of a grant that reused the watch fires `lost` at once, and the
/// deletes of the grants before it (their events can arrive after the next grant) do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_granted_again_is_watched_by_its_earlier_watch() {
    let (factory, backend) = slow_keepalive_backend().await;
    let first = backend.lock("job").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the watch goes out after the grant
    let _ = first.release().await.unwrap();
    for i in 0..30 {
        let guard = backend.lock("job").await.unwrap();
        if i % 3 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            guard.is_held(),
            "grant {i} lost to an earlier grant's delete"
        );
        let _ = guard.release().await.unwrap();
    }
    let guard = backend.lock("job").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // every earlier delete has arrived
    assert!(guard.is_held(), "lost to an earlier grant's delete");
    let key = job_key(&factory);
    let at = Instant::now();
    common::shared_single().etcdctl(&["del", &key]).unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost must fire well before the next keepalive");
    eprintln!("del: lost {:?} after it", at.elapsed());
    assert_eq!(
        guard.release().await.unwrap(),
        fencelock::ReleaseOutcome::NotOwned
    );
    // And the name is free for the session's next task, watched again.
    let next = backend.lock("job").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(next.is_held());
    let _ = next.release().await.unwrap();
}

/// Issue 16: an observer cut off while the leader changes reports the leader of now once the
/// link is back (the old connections are dropped by the proxy, so the client reconnects).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_cut_off_while_the_leader_changes_reports_the_leader_now() {
    let cluster = EtcdCluster::start(1);
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("gap"));
    let connect = |endpoints| EtcdBackend::connect(common::config(endpoints, &prefix));
    let observer = connect(vec![proxy.endpoint()]).await.unwrap();
    let (a, b) = (
        connect(cluster.endpoints()).await.unwrap(),
        connect(cluster.endpoints()).await.unwrap(),
    );
    let name = fencelock::LockName::new("sched").unwrap();
    fencelock::testkit::observe_across_a_gap(
        &observer,
        (&a, &b),
        &name,
        (
            || proxy.set_mode(ProxyMode::BlackHole),
            || proxy.set_mode(ProxyMode::Forward),
        ),
        Duration::from_secs(3),
    )
    .await;
}

/// Issue 19.2: a lock watcher cut off while the lock changes hands, with the store compacted
/// past every revision it saw, reports the holder of now once the link is back (the proxy
/// closes the old connections, so the client reconnects; the stream's next wait starts from a
/// compacted revision, which etcd cancels, and the loop reads again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_cut_off_across_a_handoff_and_a_compaction_reports_the_holder_now() {
    let cluster = EtcdCluster::start(1);
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("wgap"));
    let connect = |endpoints| EtcdBackend::connect(common::config(endpoints, &prefix));
    let watcher = connect(vec![proxy.endpoint()]).await.unwrap();
    let (a, b) = (
        connect(cluster.endpoints()).await.unwrap(),
        connect(cluster.endpoints()).await.unwrap(),
    );
    let name = fencelock::LockName::new("job").unwrap();
    let compact = async {
        let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .unwrap();
        let now = admin
            .get("any", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let physical = etcd_client::CompactionOptions::new().with_physical();
        admin.compact(now, Some(physical)).await.unwrap();
        eprintln!("compacted at revision {now}");
        // Longer than the watch's idle limit (the TTL): the watcher reads into the black hole
        // and retries, as well as finding its connection closed on the heal.
        tokio::time::sleep(common::TTL + Duration::from_secs(2)).await;
    };
    fencelock::testkit::watch_across_a_gap(
        &watcher,
        (&a, &b),
        &name,
        || proxy.set_mode(ProxyMode::BlackHole),
        compact,
        || proxy.set_mode(ProxyMode::Forward),
    )
    .await;
}

/// Issue 13.1: a guard dropped on a thread outside any Tokio runtime (a plain `std::thread`,
/// a destructor in a C callback) still releases: the guard keeps its runtime's handle. Before,
/// the release found no runtime, logged a warning and left the key to the lease, which the live
/// session kept renewing: the lock stayed held for the session's life.
#[test]
fn a_guard_dropped_outside_the_runtime_is_still_released() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cluster = EtcdCluster::start(1);
    let prefix = format!("{}/", unique("drop"));
    let (a, b) = runtime.block_on(async {
        let connect = || EtcdBackend::connect(common::config(cluster.endpoints(), &prefix));
        (connect().await.unwrap(), connect().await.unwrap())
    });
    let guard = runtime.block_on(a.lock("job")).unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    // `a` keeps its session: only the release can let `b` in.
    let next = runtime.block_on(async { tokio::time::timeout(common::TTL, b.lock("job")).await });
    let next = next
        .expect("the guard dropped outside the runtime must release")
        .unwrap();
    assert_eq!(
        runtime.block_on(next.release()).unwrap(),
        fencelock::ReleaseOutcome::Released
    );
    drop(a);
}

/// Review F12: the release's delete is applied but its reply is lost (the proxy drops the
/// server's bytes), so the first attempt times out; the retry, once the link is back, finds the
/// key gone. Our delete freed the lock: `Released`, not `NotOwned` (which tells the caller its
/// work may have been overwritten).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_reports_released() {
    let cluster = EtcdCluster::start(1);
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("lost-reply"));
    let ttl = Duration::from_secs(9);
    let a = EtcdBackend::connect(common::config(vec![proxy.endpoint()], &prefix).ttl(ttl))
        .await
        .unwrap();
    let b = EtcdBackend::connect(common::config(cluster.endpoints(), &prefix))
        .await
        .unwrap();
    let guard = a.lock("job").await.unwrap();
    proxy.set_mode(ProxyMode::DropReplies);
    let release = tokio::spawn(guard.release());
    // Past the first attempt's limit (TTL/3 = 3 s, capped by the request timeout).
    let first_attempt = ttl / 3;
    tokio::time::sleep(first_attempt + Duration::from_millis(300)).await;
    assert!(
        b.try_lock("job").await.is_ok_and(|g| {
            drop(g);
            true
        }),
        "the delete must have been applied while its reply was dropped"
    );
    proxy.set_mode(ProxyMode::Forward);
    let outcome = bounded("release", release).await.unwrap().unwrap();
    assert_eq!(outcome, fencelock::ReleaseOutcome::Released);
}

/// An operator deletes a stuck holder's key (`fencelock break`, `etcdctl del`): the next task of
/// the same instance is granted while the lost guard lives, as another instance would be (the
/// session's per-name turn ends when the key is known gone, not when the guard is dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_lock_is_granted_to_the_next_task_of_the_same_instance() {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let backend = fencelock::testkit::BackendFactory::connect(&factory).await;
    let stuck = backend.lock("broken").await.unwrap();
    // No wait for the key's watch: it starts at the key's create revision + 1, so a delete
    // before it is registered is still reported.
    let broken = backend
        .break_lock(&fencelock::LockName::new("broken").unwrap())
        .await
        .unwrap();
    assert!(broken.is_some(), "the holder's key was removed");
    bounded("lost fires", stuck.lost()).await;
    let next = tokio::time::timeout(Duration::from_secs(5), backend.lock("broken"))
        .await
        .expect("the next task of the instance is granted while the lost guard lives")
        .unwrap();
    assert!(next.token() > stuck.token());
    assert_eq!(
        stuck.release().await.unwrap(),
        fencelock::ReleaseOutcome::NotOwned
    );
    assert!(
        next.is_held(),
        "the lost guard's release leaves the new grant alone"
    );
    assert_eq!(
        next.release().await.unwrap(),
        fencelock::ReleaseOutcome::Released
    );
}
