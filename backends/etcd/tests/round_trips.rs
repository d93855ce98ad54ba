//! Requests per operation, counted by the server (its gRPC metrics), not timed.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use fencelock::LockBackendExt;
use fencelock_etcd::EtcdBackend;
use fencelock_testsupport::{unique, EtcdCluster};

const METHODS: [&str; 5] = ["Txn", "Range", "Watch", "LeaseGrant", "DeleteRange"];

/// The watch of a granted key is registered by the session's watcher task just after the call
/// returns: give its message the time to arrive.
async fn settled(cluster: &EtcdCluster) -> BTreeMap<&'static str, u64> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    counts(cluster)
}

fn counts(cluster: &EtcdCluster) -> BTreeMap<&'static str, u64> {
    METHODS
        .iter()
        .map(|m| (*m, cluster.rpc_count(0, m)))
        .collect()
}

fn delta(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    METHODS
        .iter()
        .map(|m| (*m, after[m] - before[m]))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A single node of its own (its request counts are this test's alone) and a backend on it.
async fn one_node() -> (EtcdCluster, EtcdBackend) {
    let cluster = EtcdCluster::start(1);
    let prefix = format!("{}/", unique("rt"));
    let backend = EtcdBackend::connect(common::config(cluster.endpoints(), &prefix))
        .await
        .unwrap();
    (cluster, backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_are_one_txn_each() {
    let (cluster, backend) = one_node().await;

    let before = counts(&cluster);
    let first = backend.lock("warm").await.unwrap();
    let first_acquire = delta(&before, &settled(&cluster).await);
    let _ = first.release().await.unwrap();

    let before = settled(&cluster).await;
    let guard = backend.lock("job").await.unwrap();
    let acquire = delta(&before, &settled(&cluster).await);
    let before = counts(&cluster);
    let _ = guard.release().await.unwrap();
    let release = delta(&before, &settled(&cluster).await);
    eprintln!(
        "first acquire of a session: {first_acquire:?}\nacquire: {acquire:?}\nrelease: {release:?}"
    );
    // Plus one message on the session's watch stream when a key is first granted (watch it),
    // off the request path. A release sends none: the watch stays for the next grant of the
    // same key.
    assert_eq!(
        first_acquire,
        BTreeMap::from([("LeaseGrant", 1), ("Txn", 1), ("Watch", 1)])
    );
    assert_eq!(acquire, BTreeMap::from([("Txn", 1), ("Watch", 1)]));
    assert_eq!(release, BTreeMap::from([("Txn", 1)]));

    // The same name again: the session's key is the same, and so is its watch.
    let before = counts(&cluster);
    let again = backend.lock("job").await.unwrap();
    let acquire = delta(&before, &settled(&cluster).await);
    let before = counts(&cluster);
    let _ = again.release().await.unwrap();
    let release = delta(&before, &settled(&cluster).await);
    eprintln!("acquire again: {acquire:?}\nrelease again: {release:?}");
    assert_eq!(acquire, BTreeMap::from([("Txn", 1)]));
    assert_eq!(release, BTreeMap::from([("Txn", 1)]));
}

/// A released key's watch is kept for its next grant, but not without bound: past 1,024 idle
/// keys the session cancels the watch of the one idle longest, one cancel per key over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_watches_are_bounded() {
    let (cluster, backend) = one_node().await;
    // Held until every key is watched (a guard released before its watch went out is not
    // watched at all), then released: 1,024 idle watches.
    let before = counts(&cluster);
    let mut guards = Vec::new();
    for i in 0..1024 {
        guards.push(backend.lock(&format!("n{i}")).await.unwrap());
    }
    let watched = || delta(&before, &counts(&cluster)).get("Watch").copied();
    for _ in 0..600 {
        if watched() == Some(1024) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(watched(), Some(1024));
    for guard in guards {
        let _ = guard.release().await.unwrap();
    }
    let cycle = |name: String| {
        let (backend, cluster) = (&backend, &cluster);
        async move {
            let guard = backend.lock(&name).await.unwrap();
            let _ = settled(cluster).await;
            let _ = guard.release().await.unwrap();
        }
    };
    let before = settled(&cluster).await;
    for i in 1024..1027 {
        cycle(format!("n{i}")).await;
    }
    let over = delta(&before, &settled(&cluster).await);
    eprintln!("3 names over the bound: {over:?}");
    // Per name: its acquire and release Txns, the watch of its key and the cancel of the
    // longest idle one's.
    assert_eq!(over, BTreeMap::from([("Txn", 6), ("Watch", 6)]));
    // The first names' watches are gone, the latest kept: n1026 again is watched already, n0
    // anew (and the longest idle, n3's, is cancelled).
    let before = counts(&cluster);
    cycle("n1026".to_owned()).await;
    let kept = delta(&before, &settled(&cluster).await);
    assert_eq!(kept, BTreeMap::from([("Txn", 2)]));
    let before = counts(&cluster);
    cycle("n0".to_owned()).await;
    let anew = delta(&before, &settled(&cluster).await);
    assert_eq!(anew, BTreeMap::from([("Txn", 2), ("Watch", 2)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_watches_only_its_predecessor() {
    let cluster = EtcdCluster::start(1);
    let prefix = format!("{}/", unique("rt"));
    let connect = || EtcdBackend::connect(common::config(cluster.endpoints(), &prefix));
    let holder = connect().await.unwrap();
    let guard = holder.lock("job").await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let backend = connect().await.unwrap();
        let _ = backend.lock("warm").await.unwrap().release().await.unwrap();
        waiters.push(backend);
    }
    let before = settled(&cluster).await;
    let mut tasks = Vec::new();
    for backend in waiters {
        tasks.push(tokio::spawn(async move {
            let guard = backend.lock("job").await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = guard.release().await.unwrap();
            backend // kept until counted: its session ends with it
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let queued = delta(&before, &counts(&cluster));
    let _ = guard.release().await.unwrap();
    let mut kept = Vec::new();
    for task in tasks {
        kept.push(
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let all = delta(&before, &settled(&cluster).await);
    eprintln!("3 waiters queueing: {queued:?}\n3 handoffs in all (incl. 4 releases): {all:?}");
    // Queueing: per waiter the enqueue Txn, one watch stream carrying two registrations of its
    // predecessor's key (see `watch_delete`), and one Get of that key once the watches exist.
    // The first waiter, right behind the holder, looks before it watches (one Txn: the holder
    // may be gone already); the others' enqueue Range names their predecessor.
    assert_eq!(queued.get("Txn"), Some(&(3 + 1)));
    assert_eq!(queued.get("Range"), Some(&3));
    assert_eq!(queued.get("Watch"), Some(&6));
    // Each handoff: one Txn by the woken waiter, which finds no older key and is the grant; plus 4
    // release Txns. No herd: a release wakes one watcher, so no other request is made.
    assert_eq!(all.get("Range"), Some(&3));
    // The 6 predecessor watches, plus per grant one watch of the new holder's key; releases
    // keep theirs for the next grant.
    assert_eq!(all.get("Watch"), Some(&(6 + 3)));
    assert_eq!(all.get("Txn"), Some(&(3 + 1 + 3 + 4)));
}

/// A writer's release wakes the readers just behind it and no one else: readers queued behind
/// a second writer watch that writer, not the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_wakes_only_the_readers_behind_it() {
    use fencelock::{Access, LockBackend, LockName, Wait};
    let cluster = EtcdCluster::start(1);
    let prefix = format!("{}/", unique("rt"));
    let connect = || EtcdBackend::connect(common::config(cluster.endpoints(), &prefix));
    let name = LockName::new("config").unwrap();
    let holder = connect().await.unwrap();
    let writing = holder
        .acquire_rw(&name, Access::Write, Wait::Try)
        .await
        .unwrap();
    // Behind it, in this order: 3 readers, a second writer, 3 more readers.
    let mut waiting = Vec::new();
    for access in [Access::Read; 3]
        .into_iter()
        .chain([Access::Write])
        .chain([Access::Read; 3])
    {
        let backend = connect().await.unwrap();
        let _ = backend.lock("warm").await.unwrap().release().await.unwrap();
        let name = name.clone();
        waiting.push(tokio::spawn(async move {
            let guard = backend.acquire_rw(&name, access, Wait::Forever).await;
            (guard, backend)
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let before = settled(&cluster).await;
    let _ = writing.release().await.unwrap();
    let mut granted = Vec::new();
    for task in waiting.drain(..3) {
        let (guard, backend) = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
        granted.push((guard.unwrap(), backend));
    }
    let woken = delta(&before, &settled(&cluster).await);
    eprintln!(
        "a writer's release with 3 readers behind it, then a writer and 3 readers: {woken:?}"
    );
    assert!(
        waiting.iter().all(|task| !task.is_finished()),
        "the second writer and the readers behind it must still wait"
    );
    // The release Txn, then one Txn per woken reader (the pass that finds no writer ahead is
    // its grant); the readers behind the second writer send nothing.
    assert_eq!(woken.get("Txn"), Some(&(1 + 3)));
    assert_eq!(woken.get("Range"), None);
    for (guard, _) in granted {
        let _ = guard.release().await.unwrap();
    }
    for task in waiting {
        let (guard, _backend) = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
        let _ = guard.unwrap().release().await.unwrap();
    }
}
