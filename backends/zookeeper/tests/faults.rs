//! Faults against real ZooKeeper: the connected server stops, and a client is cut off.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::sync::Arc;
use std::time::Duration;

use fencelock::{LockBackendExt, ReleaseOutcome};
use fencelock_testsupport::{ProxyMode, TcpProxy, ZkEnsemble};
use fencelock_zookeeper::ZkBackend;
use tokio::time::Instant;

/// The member whose `cons` lists our session.
async fn connected_member(ensemble: &ZkEnsemble, backend: &ZkBackend) -> Option<usize> {
    let sid = format!("sid=0x{:x}", backend.session_info().await?.id().0);
    (0..ensemble.members.len()).find(|&i| ensemble.connections(i).contains(&sid))
}

/// `backend.lock(name)` in a task of its own: the outcome, and when it came.
fn lock_in_background(
    backend: &Arc<ZkBackend>,
    name: &'static str,
) -> tokio::task::JoinHandle<(fencelock::Result<fencelock::LockGuard>, Instant)> {
    let backend = Arc::clone(backend);
    tokio::spawn(async move {
        let outcome = backend.lock(name).await;
        (outcome, Instant::now())
    })
}

/// A backend whose session landed on a follower, and that follower's index.
async fn on_a_follower(ensemble: &ZkEnsemble, factory: &common::ZkFactory) -> (ZkBackend, usize) {
    for _ in 0..20 {
        let backend = factory.backend().await;
        let guard = backend.lock("probe").await.unwrap();
        let _ = guard.release().await.unwrap();
        if let Some(i) = connected_member(ensemble, &backend).await {
            if ensemble.mode(i) == "follower" {
                return (backend, i);
            }
        }
    }
    panic!("no client landed on a follower in 20 tries")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_moves_to_another_server_and_keeps_its_locks() {
    let mut ensemble = ZkEnsemble::start(3);
    let factory = common::ZkFactory::on(&ensemble).await;
    // Stopping a follower tests the move itself; a leader's loss adds an election, which may
    // rightly cost the locks (the local deadline does not wait for it).
    let (backend, member) = on_a_follower(&ensemble, &factory).await;
    let guard = backend.lock("job").await.unwrap();
    guard.fenced_put("k", "before").await.unwrap();
    ensemble.kill(member);
    let killed_at = Instant::now();
    // Well within the session timeout the client has moved, and after two more timeouts it
    // still holds: the session survived.
    tokio::time::sleep(common::TIMEOUT * 2).await;
    assert!(
        guard.is_held(),
        "the lock must survive a move between servers"
    );
    guard.fenced_put("k", "after").await.unwrap();
    let now = connected_member(&ensemble, &backend).await;
    assert!(
        now.is_some() && now != Some(member),
        "the client must be on another server: {now:?}"
    );
    eprintln!(
        "moved from server {} to {:?}; held {:?} after the kill",
        member + 1,
        now.map(|i| i + 1),
        killed_at.elapsed()
    );
    ensemble.restart(member);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Issue 19.2: a lock watcher whose server dies while the lock changes hands moves to another
/// server and reports the holder of now (its read syncs first, so a lagging follower cannot
/// show an older holder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_whose_server_dies_during_a_handoff_reports_the_holder_now() {
    let mut ensemble = ZkEnsemble::start(3);
    let factory = common::ZkFactory::on(&ensemble).await;
    let (watcher, member) = on_a_follower(&ensemble, &factory).await;
    let (a, b) = (factory.backend().await, factory.backend().await);
    let name = fencelock::LockName::new("job").unwrap();
    fencelock::testkit::watch_across_a_gap(
        &watcher,
        (&a, &b),
        &name,
        || ensemble.kill(member),
        tokio::time::sleep(Duration::from_secs(1)),
        || {},
    )
    .await;
    let now = connected_member(&ensemble, &watcher).await;
    assert!(
        now.is_some() && now != Some(member),
        "the watcher must be on another server: {now:?}"
    );
    ensemble.restart(member);
}

/// Issue 19.2: a lock watcher cut off from its server (for half a session timeout) while the
/// lock changes hands reports the holder of now once the link is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_cut_off_across_a_handoff_reports_the_holder_now() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let watcher = factory.proxied_backend().await;
    let (a, b) = (factory.backend().await, factory.backend().await);
    let name = fencelock::LockName::new("watched").unwrap();
    let gap = common::TIMEOUT / 2;
    fencelock::testkit::watch_across_a_gap(
        &watcher,
        (&a, &b),
        &name,
        || factory.cut_off(&watcher, gap),
        tokio::time::sleep(gap),
        || {},
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_client_is_lost_before_the_ensemble_expires_it_and_is_fenced() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let a = factory.proxied_backend().await;
    let b = Arc::new(factory.backend().await);
    let stale = a.lock("job").await.unwrap();
    stale.fenced_put("owner", "stale").await.unwrap();
    // The link heals by itself after three session timeouts.
    factory.cut_off(&a, common::TIMEOUT * 3);
    let (lost, granted) = fencelock::testkit::cut_off_holder(stale, &a, b, "job", || {}).await;
    eprintln!(
        "cut-off: lost {lost:?} after the cut, successor granted {granted:?} after the cut (session timeout {:?})",
        common::TIMEOUT
    );
}

/// Issue 14.1 (review F1): the holder is connected to a follower that is then cut off from the
/// other two members. The follower keeps answering the holder's reads for syncLimit x tickTime
/// after losing its leader, while the leader expires the session and hands the lock to a
/// client of its own. `lost` must fire before that grant, in every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_cut_off_follower_is_lost_before_the_leader_hands_the_lock_on() {
    let (ensemble, links) = ZkEnsemble::start_partitionable().await;
    let leader = (0..3)
        .find(|&i| ensemble.mode(i) == "leader")
        .expect("a leader");
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let on = |i: usize| format!("127.0.0.1:{}", ensemble.members[i].client_port);
    let base = format!("/{}", fencelock_testsupport::unique("partition"));
    let holder = ZkBackend::connect(common::config(&on(follower), &base))
        .await
        .unwrap();
    let successor = Arc::new(
        ZkBackend::connect(common::config(&on(leader), &base))
            .await
            .unwrap(),
    );
    let guard = holder.lock("job").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // a probe or two through the follower
    links.cut(follower, true);
    let cut_at = Instant::now();
    let waiting = lock_in_background(&successor, "job");
    tokio::time::timeout(common::TIMEOUT * 4, guard.lost())
        .await
        .expect("the cut-off holder must fire lost");
    let lost_at = Instant::now();
    let (next, granted_at) = tokio::time::timeout(common::TIMEOUT * 4, waiting)
        .await
        .expect("the leader's client must be granted")
        .unwrap();
    let next = next.unwrap();
    eprintln!(
        "follower {} cut off: lost after {:?}, successor granted after {:?}",
        follower + 1,
        lost_at - cut_at,
        granted_at - cut_at
    );
    assert!(
        lost_at < granted_at,
        "lost fired {:?} after the cut, but the leader granted the lock after {:?}",
        lost_at - cut_at,
        granted_at - cut_at
    );
    assert!(next.token() > guard.token());
    links.cut(follower, false);
    let _ = next.release().await;
}

/// As an operator would (`zkCli.sh delete`): deletes the one node of lock `name`, once the
/// holder's watch on it is set; when it was deleted.
async fn delete_the_only_node(factory: &common::ZkFactory, name: &str) -> Instant {
    tokio::time::sleep(Duration::from_millis(200)).await; // the watch is set after the grant
    let admin = zookeeper_client::Client::connect(&factory.connect)
        .await
        .unwrap();
    let dir = format!("{}/{name}", factory.base);
    let children = admin.list_children(&dir).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let deleted_at = Instant::now();
    admin
        .delete(&format!("{dir}/{}", children[0]), None)
        .await
        .unwrap();
    deleted_at
}

/// Issue 14.4 (review F10): an operator deletes the holder's node (`zkCli.sh delete`): `lost`
/// fires within about a round trip, long before the session could end. Before, nothing noticed
/// until the session itself ended or a fenced operation was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_behind_our_back_fires_lost_at_once() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let backend = factory.backend().await;
    let guard = backend.lock("job").await.unwrap();
    let deleted_at = delete_the_only_node(&factory, "job").await;
    tokio::time::timeout(common::TIMEOUT, guard.lost())
        .await
        .expect("lost must fire well within the session timeout");
    eprintln!("lost {:?} after the delete", deleted_at.elapsed());
    assert!(!guard.is_held());
    assert!(
        guard.loss_cause().is_some_and(|c| c.contains("deleted")),
        "{:?}",
        guard.loss_cause()
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotOwned);
}

/// The instance's per-name turn ends with its node: once an operator has deleted the holder's
/// node (`fencelock break`, a stuck holder), another task of the same instance is granted at
/// once, while the lost guard is still alive (review of stop 33: the turn was kept by the
/// guard, so that task waited for the lost guard to be dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_lock_is_granted_to_the_next_task_of_the_same_instance() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let backend = factory.backend().await;
    let stuck = backend.lock("broken").await.unwrap();
    delete_the_only_node(&factory, "broken").await;
    tokio::time::timeout(common::TIMEOUT, stuck.lost())
        .await
        .expect("lost fires");
    let next = tokio::time::timeout(Duration::from_secs(5), backend.lock("broken"))
        .await
        .expect("the next task of the instance is granted while the lost guard lives")
        .unwrap();
    assert!(next.token() > stuck.token());
    assert_eq!(stuck.release().await.unwrap(), ReleaseOutcome::NotOwned);
    assert!(
        next.is_held(),
        "the lost guard's release leaves the new grant alone"
    );
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
}

/// One task watches every node of a session: a node deleted behind our back fires the `lost`
/// of its own guard only, the session's other watches go on (each fires for its own node
/// later), and a released guard's watch ends without firing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_held_node_of_a_session_is_watched_on_its_own() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let backend = factory.backend().await;
    let names = ["a", "b", "c", "d"];
    let mut guards = Vec::new();
    for name in names {
        guards.push(backend.lock(name).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // the watches are set after the grants
    let admin = zookeeper_client::Client::connect(&factory.connect)
        .await
        .unwrap();
    let node_of = |name: &str| {
        let (admin, dir) = (&admin, format!("{}/{name}", factory.base));
        async move {
            let children = admin.list_children(&dir).await.unwrap();
            assert_eq!(children.len(), 1, "{children:?}");
            format!("{dir}/{}", children[0])
        }
    };
    // "d" released: its watch ends quietly; its node is gone.
    let d = guards.pop().unwrap();
    assert_eq!(d.release().await.unwrap(), ReleaseOutcome::Released);
    for (i, name) in [(1, "b"), (0, "a")] {
        admin.delete(&node_of(name).await, None).await.unwrap();
        tokio::time::timeout(common::TIMEOUT, guards[i].lost())
            .await
            .unwrap_or_else(|_| panic!("{name}: lost must fire after its node's delete"));
        let still: Vec<bool> = guards.iter().map(|g| g.is_held()).collect();
        let expect: Vec<bool> = match name {
            "b" => vec![true, false, true],
            _ => vec![false, false, true],
        };
        assert_eq!(
            still, expect,
            "after deleting {name}'s node (a, b, c held?)"
        );
    }
    let c = guards.pop().unwrap();
    assert_eq!(c.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Review F5: someone writes to our lock node (Curator's `Revoker`, `zkCli set`). That is a
/// loss (`lost` fires), and the release must still delete the node: deletes with version 0 left
/// it in place, blocking every other contender until our session ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_data_was_changed_is_still_released() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let (backend, other) = (factory.backend().await, factory.backend().await);
    let guard = backend.lock("revoked").await.unwrap();
    let admin = zookeeper_client::Client::connect(&factory.connect)
        .await
        .unwrap();
    let dir = format!("{}/revoked", factory.base);
    let children = admin.list_children(&dir).await.unwrap();
    admin
        .set_data(&format!("{dir}/{}", children[0]), b"__REVOKE__", None)
        .await
        .unwrap();
    tokio::time::timeout(common::TIMEOUT, guard.lost())
        .await
        .expect("a foreign write to our node fires lost");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let next = tokio::time::timeout(common::TIMEOUT, other.try_lock("revoked"))
        .await
        .expect("try_lock answers")
        .expect("the node must be gone after the release");
    let _ = next.release().await.unwrap();
}

/// Issue 16: an observer cut off while the leader changes reports the leader of now once the
/// link is back (within the session timeout: the session survives, its watches are reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_cut_off_while_the_leader_changes_reports_the_leader_now() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let observer = factory.proxied_backend().await;
    let (a, b) = (factory.backend().await, factory.backend().await);
    let name = fencelock::LockName::new("sched").unwrap();
    let gap = common::TIMEOUT / 2;
    fencelock::testkit::observe_across_a_gap(
        &observer,
        (&a, &b),
        &name,
        (|| factory.cut_off(&observer, gap), || {}),
        gap,
    )
    .await;
}

/// Review F3: a holder cut off past its local deadline but not past the server's expiry gets
/// its *same* session back when the link heals. Its node must not outlive the loss: before, the
/// node stayed while the lost guard lived (and after it was dropped, as the background delete
/// stopped with the local clock), so `guard = backend.lock(..).await?` with the lost guard still
/// alive queued behind its own node for good. Session timeout 6 s, margin 1.9 s: `lost` comes
/// at most 4.1 s after the cut, the server expires at least 5.75 s after it; the heal comes as
/// soon as `lost` fired, which may take until 5 s (a busy machine's late timer), never later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locally_lost_lock_leaves_no_node_when_the_session_comes_back() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let timeout = Duration::from_secs(6);
    let proxy = fencelock_testsupport::TcpProxy::start(factory.connect.clone()).await;
    let mut config = common::config(&format!("127.0.0.1:{}", proxy.port), &factory.base)
        .session_timeout(timeout);
    config.safety_margin = Duration::from_millis(1900);
    let a = ZkBackend::connect(config).await.unwrap();
    let b = factory.backend().await;
    let old = a.lock("job").await.unwrap();
    let before = a.session_info().await.unwrap().id();
    proxy.set_mode(fencelock_testsupport::ProxyMode::BlackHole);
    tokio::time::timeout(Duration::from_millis(5000), old.lost())
        .await
        .expect("lost fires before the server could expire the session");
    proxy.set_mode(fencelock_testsupport::ProxyMode::Forward);

    // The self-deadlock pattern: a new acquire on the same backend while the lost guard lives.
    let new = tokio::time::timeout(timeout * 3, a.lock("job"))
        .await
        .expect("the new acquire must not wait behind the lost guard's node");
    let new = new.unwrap();
    let after = a.session_info().await.unwrap().id();
    assert_ne!(before, after, "the new acquire runs on a new session");
    assert_eq!(old.release().await.unwrap(), ReleaseOutcome::NotOwned);
    assert_eq!(new.release().await.unwrap(), ReleaseOutcome::Released);
    let next = tokio::time::timeout(timeout * 3, b.lock("job"))
        .await
        .expect("nothing of a's is left in the queue")
        .unwrap();
    let _ = next.release().await.unwrap();
}

/// Issue 14.2 (review F2): the reply to our create is lost (the connection closes right after
/// the request went out, so the server applied it), and so is the reply to the next children
/// read, by which the client looks for its node. The acquire must still end in one grant with
/// exactly one node of ours: a failed lookup taken as "not found" made a second node behind the
/// first, which then waited for its own orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_leaves_no_orphan_node() {
    use fencelock_testsupport::zk_op;
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let (a, proxy) = framed_backend(&factory).await;
    let b = factory.backend().await;
    // A session and the lock's parent exist first, so the create is the first request lost.
    let warm = a.lock("orphan").await.unwrap();
    assert_eq!(warm.release().await.unwrap(), ReleaseOutcome::Released);
    proxy.lose_reply_to(&[zk_op::CREATE2, zk_op::CREATE]);
    proxy.lose_reply_to(&[zk_op::GET_CHILDREN, zk_op::GET_CHILDREN2]);
    let guard = tokio::time::timeout(common::TIMEOUT * 3, a.lock("orphan"))
        .await
        .expect("the acquire must be granted, not wait behind its own orphan")
        .unwrap();
    assert_eq!(proxy.armed(), 0, "both replies must have been lost");
    let dir = format!("{}/orphan", factory.base);
    let children = factory.admin.list_children(&dir).await.unwrap();
    assert_eq!(
        children.len(),
        1,
        "one node of ours, no orphan: {children:?}"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let next = b.try_lock("orphan").await.expect("nothing of a's is left");
    let _ = next.release().await.unwrap();
}

/// Review F9: the reply to the release's delete is lost (the server applied it); the retry
/// finds no node. The lock was ours and our delete freed it: `Released`, not `NotOwned`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_reports_released() {
    use fencelock_testsupport::zk_op;
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let (a, proxy) = framed_backend(&factory).await;
    let guard = a.lock("lost-reply").await.unwrap();
    proxy.lose_reply_to(&[zk_op::DELETE]);
    let outcome = guard.release().await.unwrap();
    assert_eq!(proxy.armed(), 0, "the delete's reply must have been lost");
    assert_eq!(outcome, ReleaseOutcome::Released);
    let next = factory.backend().await.try_lock("lost-reply").await;
    assert!(next.is_ok(), "the lock is free: {next:?}");
}

/// Review F8: the connection is reset (RST) right after our create went out. zookeeper-client
/// reports that as an I/O error, not a connection loss; `lock()` waits forever, so it must find
/// its node (or create one) on the reconnected session, not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_the_create_does_not_fail_a_waiting_acquire() {
    use fencelock_testsupport::zk_op;
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let (a, proxy) = framed_backend(&factory).await;
    let warm = a.lock("reset").await.unwrap();
    assert_eq!(warm.release().await.unwrap(), ReleaseOutcome::Released);
    proxy.reset_after(&[zk_op::CREATE2, zk_op::CREATE]);
    let guard = tokio::time::timeout(common::TIMEOUT * 3, a.lock("reset"))
        .await
        .expect("granted")
        .expect("a reset is no reason to fail a waiting acquire");
    assert_eq!(proxy.armed(), 0, "the reset must have happened");
    let dir = format!("{}/reset", factory.base);
    let children = factory.admin.list_children(&dir).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A backend whose link goes through a [`ZkFrameProxy`](fencelock_testsupport::ZkFrameProxy),
/// which can lose the reply to a chosen request.
async fn framed_backend(
    factory: &common::ZkFactory,
) -> (ZkBackend, fencelock_testsupport::ZkFrameProxy) {
    let proxy = fencelock_testsupport::ZkFrameProxy::start(factory.connect.clone()).await;
    let connect = format!("127.0.0.1:{}", proxy.port);
    let backend = ZkBackend::connect(common::config(&connect, &factory.base))
        .await
        .unwrap();
    (backend, proxy)
}

/// Issue 14.6 (review F7): ZooKeeper renegotiates the session timeout on every reconnect, and a
/// member with other settings may grant less. Member 3 allows sessions of at most 2 s; the
/// holder asked for 4 s and got them from member 1. Member 1 dies and the session moves to
/// member 3, which grants 2 s: from then on the ensemble expires the session 2 s after its last
/// touch, while a deadline counted with 4 s would run on for longer. Once moved, the holder is
/// cut off: its `lost` must fire before a successor is granted, and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_renegotiated_lower_on_reconnect_fires_lost_before_a_successor() {
    let mut ensemble = ZkEnsemble::start_with_each(3, &|i| {
        if i == 2 {
            vec!["maxSessionTimeout=2000".to_owned()]
        } else {
            Vec::new()
        }
    });
    let on = |i: usize| format!("127.0.0.1:{}", ensemble.members[i].client_port);
    let proxies = [TcpProxy::start(on(0)).await, TcpProxy::start(on(2)).await];
    let connect = proxies
        .iter()
        .map(|p| format!("127.0.0.1:{}", p.port))
        .collect::<Vec<_>>()
        .join(",");
    let base = format!("/{}", fencelock_testsupport::unique("renegotiated"));
    // The connect-time check refuses a session that member 3 granted (2 s, not 4 s): bounded
    // retries until the session is on member 1.
    let mut holder = None;
    for _ in 0..30 {
        match ZkBackend::connect(common::config(&connect, &base)).await {
            Ok(backend) => {
                holder = Some(backend);
                break;
            }
            Err(e) => assert!(e.to_string().contains("granted"), "{e}"),
        }
    }
    let holder = holder.expect("a session on member 1 in 30 tries");
    let successor = Arc::new(
        ZkBackend::connect(common::config(&on(1), &base))
            .await
            .unwrap(),
    );
    let guard = holder.lock("job").await.unwrap();
    let lost = {
        let lost = guard.lost_token();
        tokio::spawn(async move {
            lost.cancelled().await;
            Instant::now()
        })
    };
    let sid = format!("sid=0x{:x}", holder.session_info().await.unwrap().id().0);
    assert!(ensemble.connections(0).contains(&sid), "on member 1 first");

    ensemble.kill(0);
    let killed = Instant::now();
    // Bounded: 100 x 50 ms for the client to reach member 3.
    for _ in 0..100 {
        if ensemble.connections(2).contains(&sid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ensemble.connections(2).contains(&sid),
        "the session must have moved to member 3"
    );
    let moved = killed.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await; // a probe or two through member 3
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::BlackHole);
    }
    let cut = Instant::now();
    let waiting = lock_in_background(&successor, "job");
    let lost_at = tokio::time::timeout(common::TIMEOUT * 2, lost)
        .await
        .expect("the holder must fire lost")
        .unwrap();
    let (next, granted_at) = tokio::time::timeout(common::TIMEOUT * 3, waiting)
        .await
        .expect("the successor must be granted")
        .unwrap();
    let next = next.unwrap();
    eprintln!(
        "after the kill: moved to member 3 at {moved:?}, cut off at {:?}, lost at {:?}, the successor granted at {:?}; cause: {:?}",
        cut - killed,
        lost_at - killed,
        granted_at - killed,
        guard.loss_cause()
    );
    assert!(
        lost_at < granted_at,
        "lost fired {:?} after the kill, but the successor was granted after {:?}",
        lost_at - killed,
        granted_at - killed
    );
    let cause = guard.loss_cause().unwrap_or_default();
    assert!(cause.contains("granted a session timeout of 2s"), "{cause}");
    assert!(next.token() > guard.token());
    let _ = next.release().await;
    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Forward);
    }
}

/// Issue 14.5 (review F11): a waiting acquire whose client is cut off ends once the session's
/// local deadline passes (`lost`, at most timeout - margin after the last answered probe), not
/// when zookeeper-client itself gives the session up (1.4 x the timeout): a request made while
/// disconnected waits inside the client, so every wait is raced against `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_cut_off_ends_at_the_local_deadline() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let holder = factory.backend().await;
    let guard = holder.lock("job").await.unwrap();
    let waiter = Arc::new(factory.proxied_backend().await);
    let waiting = {
        let waiter = Arc::clone(&waiter);
        tokio::spawn(async move {
            let outcome = waiter.lock("job").await;
            (outcome.map(|g| g.token()), Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await; // queued, watching the holder's node
    factory.cut_off(&waiter, common::TIMEOUT * 3);
    let cut = Instant::now();
    let (outcome, ended) = tokio::time::timeout(common::TIMEOUT * 3, waiting)
        .await
        .expect("the cut-off acquire must end")
        .unwrap();
    let after = ended - cut;
    eprintln!("the cut-off waiter's acquire ended {after:?} after the cut: {outcome:?}");
    assert!(outcome.is_err(), "granted while cut off: {outcome:?}");
    // The deadline: at most timeout - margin (3.35 s) after the cut; the client's own expiry:
    // 1.4 x 4 s = 5.6 s. Halfway between, for a loaded machine.
    assert!(
        after < common::TIMEOUT * 6 / 5,
        "the acquire outlived the local deadline: {after:?}"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A server that stops answering (SIGSTOP) while an acquire's create is in flight:
/// zookeeper-client gives the connection up after 8 of its ticks (1.6 s with a 4 s session) and
/// fails the request with a custom "no response from connection" error, which is as transient
/// as a connection loss (review F8's class): the acquire retries and is granted once the server
/// answers again, well within the session. (Before, it failed: `Protocol`, "create the lock
/// node", "no response from connection in 1600ms".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_through_a_server_that_stops_answering_is_retried() {
    let ensemble = ZkEnsemble::start(1);
    let factory = common::ZkFactory::on(&ensemble).await;
    let backend = Arc::new(factory.backend().await);
    ensemble.pause(0, true);
    let acquiring = {
        let backend = Arc::clone(&backend);
        tokio::spawn(async move { backend.lock("job").await })
    };
    // Past the client's 1.6 s (+ one 200 ms tick), well before the session's local deadline
    // (at least 3.1 s after the pause: 4 s - 0.65 s margin - one 250 ms probe interval).
    tokio::time::sleep(Duration::from_millis(2200)).await;
    ensemble.pause(0, false);
    let granted = tokio::time::timeout(common::TIMEOUT * 3, acquiring)
        .await
        .expect("the acquire must end")
        .unwrap();
    let guard = granted.unwrap_or_else(|e| panic!("the stalled server failed the acquire: {e:?}"));
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Issue 20: an uncontended acquire sends the listing that grants it right behind its create,
/// without waiting for the create's reply (ZooKeeper answers a session's requests in order), so
/// both take one round trip. The proxy holds the server's replies from the create on: the
/// listing must reach it while the create's reply is still held. (Before, the client sent it
/// only after the reply: the hold ran out after 3 s and the listing came after it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_listing_goes_out_behind_the_create() {
    use fencelock_testsupport::zk_op;
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let (backend, proxy) = framed_backend(&factory).await;
    let sent = sent_behind_a_create(&proxy, 1, || async {
        let guard = backend.lock("pipelined").await.unwrap();
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    })
    .await;
    assert_eq!(
        sent,
        [zk_op::CREATE2, zk_op::MULTI_READ],
        "the listing must be sent before the create's reply arrives"
    );
}

/// As above for a semaphore's permit: the read of the count and the leases goes out right
/// behind the lease's create (the second create of the acquire; the first is the gate's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_read_goes_out_behind_the_lease_create() {
    use fencelock::{LockBackend, LockName, Wait};
    use fencelock_testsupport::zk_op;
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let (backend, proxy) = framed_backend(&factory).await;
    let name = LockName::new("permits").unwrap();
    let sent = sent_behind_a_create(&proxy, 2, || async {
        let guard = backend
            .acquire_permit(&name, 2, Wait::Forever)
            .await
            .unwrap();
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    })
    .await;
    assert_eq!(
        sent,
        [zk_op::CREATE2, zk_op::MULTI_READ],
        "the count's read must be sent before the lease's create is answered"
    );
}

/// Runs `op` once (so that its directories exist), then again with the server's replies held
/// from its `nth` create on; the requests sent while they were held, the session's own probes
/// left out.
async fn sent_behind_a_create<F: std::future::Future<Output = ()>>(
    proxy: &fencelock_testsupport::ZkFrameProxy,
    nth: usize,
    op: impl Fn() -> F,
) -> Vec<i32> {
    use fencelock_testsupport::zk_op;
    op().await;
    // The first grant's exists-watch goes out from a task of its own, possibly after the
    // release (and then a removeWatches): let it pass before the hold counts requests.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.hold_replies_after_nth(zk_op::CREATE2, nth);
    op().await;
    let mut sent = proxy.sent_while_held();
    sent.retain(|op| ![zk_op::SYNC, zk_op::PING].contains(op));
    sent
}
