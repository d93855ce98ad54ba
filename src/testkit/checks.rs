//! The conformance checks. Each takes a [`BackendFactory`] and panics on a broken property.
//!
//! Every `pub async fn name<F: BackendFactory>` here is a check, and
//! [`conformance_tests!`](crate::conformance_tests) must list it: the test
//! `every_check_is_run` in `testkit/mod.rs` fails when one is missing, so a check cannot be
//! written and never run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{bounded, BackendFactory};
use crate::{
    Error, Fence, FencingToken, LockBackend, LockBackendExt, LockGuard, ReleaseOutcome, Result,
    Wait,
};

pub(super) fn ok<T>(what: &str, result: Result<T>) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("{what}: unexpected error: {e}"),
    }
}

async fn acquire<B: LockBackend + ?Sized>(what: &str, backend: &B, name: &str) -> LockGuard {
    ok(what, bounded(what, backend.lock(name)).await)
}

pub(super) async fn release(what: &str, guard: LockGuard) {
    let outcome = ok(what, bounded(what, guard.release()).await);
    assert_eq!(outcome, ReleaseOutcome::Released, "{what}");
}

/// Makes sure each instance has a live session, so later timing between instances reflects
/// waiting, not session setup.
async fn warm<B: LockBackend + ?Sized>(backend: &B, name: &str) {
    release("warm-up", acquire("warm-up", backend, name).await).await;
}

/// Many tasks on several instances increment a counter kept in fenced state, and log every
/// critical section: no two overlap, tokens increase in grant order, no increment is lost.
pub async fn mutual_exclusion<F: BackendFactory>(factory: &F) {
    const INSTANCES: usize = 3;
    const TASKS: usize = 3;
    const ROUNDS: usize = 4;
    let name = factory.name("mutex").to_string();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let fence = Arc::new(Fence::new());
    let log = Arc::new(Mutex::new(Vec::<FencingToken>::new()));
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let backend = Arc::new(factory.connect().await);
        for _ in 0..TASKS {
            let (backend, name, inside, overlaps, fence, log) = (
                Arc::clone(&backend),
                name.clone(),
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&fence),
                Arc::clone(&log),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = acquire("mutual_exclusion: acquire", &*backend, &name).await;
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    ok(
                        "mutual_exclusion: token refused by the fence",
                        fence.admit(&name, guard.token()).await.map(drop),
                    );
                    let counter = ok("fenced_get", guard.fenced_get("counter").await);
                    let n: usize = counter
                        .and_then(|b| String::from_utf8(b).ok())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    ok(
                        "fenced_put",
                        guard.fenced_put("counter", (n + 1).to_string()).await,
                    );
                    log.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(guard.token());
                    inside.fetch_sub(1, Ordering::SeqCst);
                    release("mutual_exclusion: release", guard).await;
                }
            }));
        }
    }
    for task in tasks {
        if let Err(e) = task.await {
            panic!("mutual_exclusion: a contender failed: {e}");
        }
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let log = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(log.len(), INSTANCES * TASKS * ROUNDS);
    assert!(
        log.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase in grant order: {log:?}"
    );
    let backend = factory.connect().await;
    let guard = acquire("mutual_exclusion: final read", &backend, &name).await;
    let total = ok("fenced_get", guard.fenced_get("counter").await);
    assert_eq!(
        total.as_deref(),
        Some((INSTANCES * TASKS * ROUNDS).to_string().as_bytes()),
        "lost increments: the fenced counter disagrees with the number of critical sections"
    );
    release("final release", guard).await;
}

/// Alternating holders on separate instances get strictly increasing tokens.
pub async fn tokens_increase<F: BackendFactory>(factory: &F) {
    let name = factory.name("tokens").to_string();
    let backends = [factory.connect().await, factory.connect().await];
    let mut last: Option<FencingToken> = None;
    for round in 0..6 {
        let guard = acquire("tokens_increase", &backends[round % 2], &name).await;
        if let Some(prev) = last {
            assert!(guard.token() > prev, "token {} after {prev}", guard.token());
        }
        last = Some(guard.token());
        release("tokens_increase", guard).await;
    }
}

/// `Wait::Try` fails fast with `WouldBlock`, `Wait::Timeout` with `Timeout`, and neither is
/// queued when it returns; both succeed once free.
pub async fn try_and_timeout<F: BackendFactory>(factory: &F) {
    let name = factory.name("try");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let held = acquire("try: holder", &a, name.as_str()).await;
    let tried = bounded("try", b.acquire(&name, Wait::Try)).await;
    assert!(
        matches!(tried, Err(Error::WouldBlock { .. })),
        "try on a held lock: {tried:?}"
    );
    let timed = bounded(
        "timeout",
        b.acquire(&name, Wait::Timeout(Duration::from_millis(300))),
    )
    .await;
    assert!(
        matches!(timed, Err(Error::Timeout { .. })),
        "timeout on a held lock: {timed:?}"
    );
    // Both returned only once their entries were gone, as Go's `Mutex.Lock` and Curator's
    // `acquire(time)` delete theirs before returning: no one sees them queued.
    match bounded("status", a.status(&name)).await {
        Ok(status) => assert_eq!(
            (status.holder, status.waiting),
            (Some(held.token()), 0),
            "a refused try or a timed-out acquire is still queued: {status:?}"
        ),
        Err(Error::Unsupported { .. }) => {}
        Err(e) => panic!("try: status: {e}"),
    }
    release("try: holder", held).await;
    let tried = ok(
        "try on a free lock",
        bounded("try", b.acquire(&name, Wait::Try)).await,
    );
    release("try", tried).await;
    let timed = ok(
        "timeout on a free lock",
        bounded(
            "timeout",
            b.acquire(&name, Wait::Timeout(Duration::from_secs(10))),
        )
        .await,
    );
    release("timeout", timed).await;
}

/// Waiters are granted in arrival order.
pub async fn fifo_order<F: BackendFactory>(factory: &F) {
    let name = factory.name("fifo").to_string();
    let holder = factory.connect().await;
    let held = acquire("fifo: holder", &holder, &name).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for label in ["first", "second", "third"] {
        let backend = factory.connect().await;
        warm(&backend, &format!("{name}-warm")).await;
        let (name, order) = (name.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let guard = acquire("fifo: waiter", &backend, &name).await;
            order
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(label);
            release("fifo: waiter", guard).await;
        }));
        // Arrival order is what is being tested: give each waiter time to queue.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    release("fifo: holder", held).await;
    for waiter in waiters {
        if let Err(e) = bounded("fifo: waiter", waiter).await {
            panic!("fifo: a waiter failed: {e}");
        }
    }
    let order = order.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(
        order,
        ["first", "second", "third"],
        "waiters must be granted in arrival order"
    );
}

/// A waiter whose contender just ahead gives up while the lock is still held waits on, for the
/// holder: that departure grants nothing by itself (a waiter that watches only the key just
/// before its own must look again before it takes the lock).
pub async fn waiter_ahead_gives_up<F: BackendFactory>(factory: &F) {
    let name = factory.name("ahead");
    let (holder, ahead, behind) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    warm(&ahead, &format!("{name}-warm")).await;
    warm(&behind, &format!("{name}-warm")).await;
    let held = acquire("ahead: holder", &holder, name.as_str()).await;
    // The first waiter gives up when told, once the second is queued behind it (a timed acquire
    // would race the second's queueing on a slow machine); its instance, and so its session,
    // lives on.
    let (give_up, told) = tokio::sync::oneshot::channel::<()>();
    let gives_up = {
        let name = name.clone();
        tokio::spawn(async move {
            tokio::select! {
                granted = ahead.lock(name.as_str()) => panic!("ahead: the first waiter was granted behind the holder: {granted:?}"),
                _ = told => ahead,
            }
        })
    };
    super::until_queued("ahead: the first waiter", &holder, &name, 1).await;
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move { (behind.lock(name.as_str()).await, behind) })
    };
    super::until_queued("ahead: the second waiter", &holder, &name, 2).await;
    let _ = give_up.send(());
    let _ahead = match bounded("ahead: the first waiter", gives_up).await {
        Ok(ahead) => ahead,
        Err(e) => panic!("ahead: the first waiter's task failed: {e}"),
    };
    // Its entry withdrawn (a backend without `status`: a pause), then long enough for the
    // second waiter to see it go and look again.
    let (reader, named) = (&holder, &name);
    match holder.status(&name).await {
        Err(Error::Unsupported { .. }) => tokio::time::sleep(Duration::from_millis(300)).await,
        _ => {
            super::until(
                "ahead: the first waiter's entry withdrawn",
                || async move { ok("ahead: status", reader.status(named).await) },
                |status| status.waiting == 1,
            )
            .await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the second waiter was granted while the holder still held the lock"
    );
    release("ahead: holder", held).await;
    let (next, _behind) = match bounded("ahead: the second waiter", waiting).await {
        Ok(out) => out,
        Err(e) => panic!("ahead: the second waiter's task failed: {e}"),
    };
    release(
        "ahead: the second waiter",
        ok("ahead: the second waiter", next),
    )
    .await;
}

/// A timed-out acquire and a dropped acquire future leave nothing that blocks a later contender.
pub async fn cancelled_acquire_leaves_nothing<F: BackendFactory>(factory: &F) {
    let name = factory.name("cancel");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let held = acquire("cancel: holder", &a, name.as_str()).await;
    let timed = b
        .acquire(&name, Wait::Timeout(Duration::from_millis(300)))
        .await;
    assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
    let dropped = tokio::time::timeout(Duration::from_millis(300), b.lock(name.as_str())).await;
    assert!(
        dropped.is_err(),
        "the dropped acquire should still have been waiting"
    );
    release("cancel: holder", held).await;
    // `b` keeps its session alive: if either cancelled acquire had left a queue entry, `c`
    // would wait behind it until the bound.
    let next = acquire("cancel: next contender", &c, name.as_str()).await;
    release("cancel: next contender", next).await;
    let again = acquire("cancel: the cancelled instance again", &b, name.as_str()).await;
    release("cancel", again).await;
}

/// A guard whose grant was taken away cannot release its successor's lock.
pub async fn release_is_owner_checked<F: BackendFactory>(factory: &F) {
    let name = factory.name("owner");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let stale = acquire("owner: first holder", &a, name.as_str()).await;
    factory.steal(&name).await;
    let next = acquire("owner: successor", &b, name.as_str()).await;
    assert!(next.token() > stale.token());
    let outcome = ok(
        "owner: stale release",
        bounded("release", stale.release()).await,
    );
    assert_eq!(
        outcome,
        ReleaseOutcome::NotOwned,
        "a stale release must not delete anything"
    );
    let tried = bounded("try", c.acquire(&name, Wait::Try)).await;
    assert!(
        matches!(tried, Err(Error::WouldBlock { .. })),
        "the successor must still hold the lock after a stale release: {tried:?}"
    );
    ok(
        "owner: successor still writes",
        next.fenced_put("k", b"v").await,
    );
    release("owner: successor", next).await;
}

/// After the session breaks, `lost` fires, work in `run` stops, and another instance acquires
/// with a greater token.
pub async fn lost_fires_and_run_stops<F: BackendFactory>(factory: &F) {
    let name = factory.name("lost");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let guard = acquire("lost: holder", &a, name.as_str()).await;
    let watcher = guard.lost_token();
    let work_done = AtomicUsize::new(0);
    let (outcome, ()) = bounded("lost: run must stop after the session broke", async {
        tokio::join!(
            guard.run(async {
                tokio::time::sleep(super::BOUND * 2).await;
                work_done.fetch_add(1, Ordering::SeqCst);
            }),
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                factory.break_session(&a).await;
            }
        )
    })
    .await;
    assert!(
        matches!(outcome, Err(Error::LockLost { .. })),
        "run: {outcome:?}"
    );
    assert_eq!(
        work_done.load(Ordering::SeqCst),
        0,
        "work must be dropped, not finished"
    );
    assert!(watcher.is_cancelled(), "lost_token() must fire too");
    assert!(!guard.is_held());
    assert!(guard.ensure_held().is_err());
    let next = acquire("lost: successor", &b, name.as_str()).await;
    assert!(next.token() > guard.token());
    let outcome = ok("lost: release of the lost guard", guard.release().await);
    assert_eq!(outcome, ReleaseOutcome::NotOwned);
    release("lost: successor", next).await;
    // The broken instance recovers with a new session.
    let again = ok(
        "lost: the broken instance acquires again",
        bounded(
            "again",
            a.lock_timeout(name.as_str(), Duration::from_secs(20)),
        )
        .await,
    );
    release("lost: again", again).await;
}

/// A holder that has not noticed its loss has its fenced writes refused by the store itself.
pub async fn stale_fenced_writes_refused<F: BackendFactory>(factory: &F) {
    let name = factory.name("stale");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let stale = acquire("stale: first holder", &a, name.as_str()).await;
    ok("stale: first write", stale.fenced_put("owner", b"a").await);
    factory.steal(&name).await;
    let next = acquire("stale: successor", &b, name.as_str()).await;
    ok(
        "stale: successor write",
        next.fenced_put("owner", b"b").await,
    );
    let refused = stale.fenced_put("owner", b"a-again").await;
    assert!(
        matches!(&refused, Err(e) if e.is_lost()),
        "the store must refuse a stale holder's write: {refused:?}"
    );
    assert!(
        stale.lost_token().is_cancelled(),
        "a refused write must fire lost"
    );
    assert!(stale.checkpoint(b"stale").await.is_err());
    assert!(stale.fenced_delete("owner").await.is_err());
    let seen = ok("stale: successor read", next.fenced_get("owner").await);
    assert_eq!(seen.as_deref(), Some(&b"b"[..]));
    release("stale: successor", next).await;
}

/// The last checkpoint goes to the next holder, also when the previous holder lost the lock.
pub async fn checkpoint_handed_to_successor<F: BackendFactory>(factory: &F) {
    let name = factory.name("checkpoint");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let first = acquire("checkpoint: first", &a, name.as_str()).await;
    assert_eq!(first.last_checkpoint(), None);
    ok("checkpoint 1", first.checkpoint(b"step-1").await);
    ok("checkpoint 2", first.checkpoint(b"step-2").await);
    release("checkpoint: first", first).await;
    let second = acquire("checkpoint: second", &b, name.as_str()).await;
    assert_eq!(second.last_checkpoint(), Some(&b"step-2"[..]));
    ok("checkpoint 3", second.checkpoint(b"step-3").await);
    factory.break_session(&b).await;
    bounded("checkpoint: loss noticed", second.lost()).await;
    let third = acquire("checkpoint: third", &a, name.as_str()).await;
    assert_eq!(
        third.last_checkpoint(),
        Some(&b"step-3"[..]),
        "a lost holder's checkpoint"
    );
    ok("clear", third.clear_checkpoint().await);
    release("checkpoint: third", third).await;
    let fourth = acquire("checkpoint: fourth", &a, name.as_str()).await;
    assert_eq!(
        fourth.last_checkpoint(),
        None,
        "a cleared checkpoint must not come back"
    );
    release("checkpoint: fourth", fourth).await;
}

/// Dropping a guard releases the lock (in the background) while its session lives on.
pub async fn drop_releases<F: BackendFactory>(factory: &F) {
    let name = factory.name("drop");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let guard = acquire("drop: holder", &a, name.as_str()).await;
    let lost = guard.lost_token();
    drop(guard);
    assert!(lost.is_cancelled(), "dropping a guard fires its lost");
    // `a` keeps its session alive, so only the release can free the lock.
    let next = acquire("drop: next holder", &b, name.as_str()).await;
    release("drop: next holder", next).await;
}

/// The instance that dropped a guard can take the lock again at once: its next acquire waits
/// for the background release of its own dropped guard (review F12: before, a `try_lock`
/// right after the drop could find the old entry still there and be refused).
pub async fn try_right_after_own_drop<F: BackendFactory>(factory: &F) {
    let name = factory.name("drop-try");
    let a = factory.connect().await;
    for round in 0..30 {
        let guard = acquire("drop-try: holder", &a, name.as_str()).await;
        drop(guard);
        let again = bounded("drop-try: try", a.try_lock(name.as_str())).await;
        match again {
            Ok(guard) => release("drop-try: again", guard).await,
            Err(e) => panic!("round {round}: a try right after our own drop was refused: {e}"),
        }
    }
}

/// One instance holds many locks at once; another sees each of them held, then free.
pub async fn many_locks_on_one_instance<F: BackendFactory>(factory: &F) {
    const LOCKS: usize = 100;
    let (a, b) = (factory.connect().await, factory.connect().await);
    let names: Vec<String> = (0..LOCKS)
        .map(|i| factory.name(&format!("many-{i}")).to_string())
        .collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(acquire("many: acquire", &a, name).await);
    }
    assert!(guards.iter().all(LockGuard::is_held));
    for name in names.iter().step_by(10) {
        let tried = bounded("many: try", b.try_lock(name)).await;
        assert!(
            matches!(tried, Err(Error::WouldBlock { .. })),
            "{name}: {tried:?}"
        );
    }
    for guard in guards {
        release("many: release", guard).await;
    }
    for name in names.iter().step_by(10) {
        release(
            "many: other instance",
            acquire("many: other", &b, name).await,
        )
        .await;
    }
}

/// Two tasks of one instance contend like strangers: no second guard for the same name.
pub async fn same_instance_contends<F: BackendFactory>(factory: &F) {
    let name = factory.name("local");
    let a = Arc::new(factory.connect().await);
    let first = acquire("local: first", &*a, name.as_str()).await;
    let tried = bounded("local: try", a.try_lock(name.as_str())).await;
    assert!(matches!(tried, Err(Error::WouldBlock { .. })), "{tried:?}");
    let timed = bounded(
        "local: timeout",
        a.lock_timeout(name.as_str(), Duration::from_millis(300)),
    )
    .await;
    assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
    let waiter = {
        let (a, name) = (Arc::clone(&a), name.clone());
        tokio::spawn(async move { acquire("local: second", &*a, name.as_str()).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the second task must wait while the first holds"
    );
    assert!(first.is_held());
    let first_token = first.token();
    release("local: first", first).await;
    let second = match bounded("local: second", waiter).await {
        Ok(guard) => guard,
        Err(e) => panic!("local: the waiting task failed: {e}"),
    };
    assert!(second.token() > first_token);
    release("local: second", second).await;
}

/// Names that would collide or break keys are refused before anything is sent.
pub async fn invalid_names_rejected<F: BackendFactory>(factory: &F) {
    let a = factory.connect().await;
    for bad in [
        "",
        "a/b",
        "..",
        ".",
        "nul\0",
        &"x".repeat(crate::MAX_NAME_LEN + 1),
    ] {
        let got = bounded("invalid name", a.try_lock(bad)).await;
        assert!(
            matches!(got, Err(Error::InvalidName { .. })),
            "{bad:?}: {got:?}"
        );
    }
    // Names that share a textual prefix are independent locks.
    let base = factory.name("pre").to_string();
    let one = acquire("prefix: a", &a, &base).await;
    let two = acquire("prefix: a-longer", &a, &format!("{base}-longer")).await;
    let three = acquire("prefix: ab", &a, &format!("{base}x")).await;
    for g in [one, two, three] {
        release("prefix", g).await;
    }
}

/// Fenced state survives holders; bad keys are refused.
pub async fn fenced_state_round_trip<F: BackendFactory>(factory: &F) {
    let name = factory.name("state");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let g = acquire("state: first", &a, name.as_str()).await;
    assert_eq!(ok("get missing", g.fenced_get("k").await), None);
    ok("put", g.fenced_put("k", b"1").await);
    ok("put other", g.fenced_put("other", b"x").await);
    assert_eq!(
        ok("get", g.fenced_get("k").await).as_deref(),
        Some(&b"1"[..])
    );
    assert!(ok("delete", g.fenced_delete("other").await));
    assert!(!ok("delete again", g.fenced_delete("other").await));
    for bad in ["a/b", "", "__checkpoint"] {
        let got = g.fenced_put(bad, b"v").await;
        assert!(
            matches!(got, Err(Error::InvalidName { .. })),
            "{bad:?}: {got:?}"
        );
    }
    assert!(g.is_held(), "a refused key must not cost the lock");
    release("state: first", g).await;
    let h = acquire("state: second", &b, name.as_str()).await;
    assert_eq!(
        ok("get after handover", h.fenced_get("k").await).as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(
        ok("deleted stays deleted", h.fenced_get("other").await),
        None
    );
    release("state: second", h).await;
}

/// A try right after the same instance's acquire timed out succeeds once the holder is gone:
/// the instance's own leftover, still being withdrawn, is not "another holder".
pub async fn try_after_own_cancelled_acquire<F: BackendFactory>(factory: &F) {
    let name = factory.name("retry");
    let (a, b) = (factory.connect().await, factory.connect().await);
    warm(&b, name.as_str()).await;
    // Each round races the withdrawal of B's timed-out acquire against A's release (one round
    // trip each), so a backend that lets B trip over its own leftover fails within a few rounds.
    for round in 0..10 {
        let held = acquire("retry: holder", &a, name.as_str()).await;
        let timed = bounded(
            "retry: timeout",
            b.acquire(&name, Wait::Timeout(Duration::from_millis(50))),
        )
        .await;
        assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
        release("retry: holder", held).await;
        let tried = bounded("retry: try", b.acquire(&name, Wait::Try)).await;
        let guard = match tried {
            Ok(guard) => guard,
            Err(e) => panic!(
                "round {round}: try on a free lock right after our own timed-out acquire: {e}"
            ),
        };
        release("retry", guard).await;
    }
}

/// `status` names the holder's token and owner and lists the queue; `list` finds held locks. Backends that
/// answer [`Error::Unsupported`] pass.
pub async fn status_and_list<F: BackendFactory>(factory: &F) {
    let name = factory.name("status");
    let (a, b) = (factory.connect().await, Arc::new(factory.connect().await));
    match a.status(&name).await {
        Err(Error::Unsupported { .. }) => return,
        Ok(free) => assert_eq!((free.holder, free.waiting), (None, 0), "{free:?}"),
        Err(e) => panic!("status of a free lock: {e}"),
    }
    let held = acquire("status: holder", &a, name.as_str()).await;
    let waiter = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { acquire("status: waiter", &*b, name.as_str()).await })
    };
    let (reader, named) = (&a, &name);
    let status = super::until(
        "status: the waiter queues",
        || async move { ok("status", reader.status(named).await) },
        |status| status.waiting == 1,
    )
    .await;
    assert_eq!(status.holder, Some(held.token()), "{status:?}");
    assert!(
        status.age.is_some_and(|age| age < super::BOUND),
        "{status:?}"
    );
    // Who holds and who waits: both entries were written here, so both name this process.
    let owner = status
        .owner
        .as_ref()
        .unwrap_or_else(|| panic!("no owner: {status:?}"));
    assert_eq!(owner.pid(), std::process::id(), "{status:?}");
    assert_eq!(owner.host(), crate::Owner::current().host(), "{status:?}");
    assert_eq!(status.queue.len(), 2, "{status:?}");
    assert_eq!(status.queue[0].token, held.token(), "{status:?}");
    assert!(status.queue[1].token > held.token(), "{status:?}");
    assert!(
        status.queue.iter().all(|e| e.owner.as_ref() == Some(owner)),
        "{status:?}"
    );
    let listed = ok("list", a.list("").await);
    assert!(listed.contains(&name), "{name} missing from {listed:?}");
    assert!(ok("list with another prefix", a.list("no-such-prefix").await).is_empty());
    release("status: holder", held).await;
    let next = bounded("status: waiter", waiter)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    release("status: waiter", next).await;
    let free = ok("status after release", a.status(&name).await);
    assert_eq!((free.holder, free.waiting), (None, 0), "{free:?}");
}

/// `break_lock` removes the holder's entry: it returns the holder's token, the next contender
/// is granted with a greater one, and the old holder's fenced writes are refused.
pub async fn break_lets_the_next_contender_in<F: BackendFactory>(factory: &F) {
    let (a, b, c) = (
        factory.connect().await,
        Arc::new(factory.connect().await),
        factory.connect().await,
    );
    let name = factory.name("break");
    warm(&a, name.as_str()).await;
    warm(b.as_ref(), name.as_str()).await;
    let stuck = acquire("break: holder", &a, name.as_str()).await;
    let waiting = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { b.lock(name.as_str()).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = ok("break: status", c.status(&name).await);
    let broken = ok("break", bounded("break", c.break_lock(&name)).await);
    assert_eq!(
        broken, seen.holder,
        "break returns the removed holder's token, as status shows it"
    );
    let next = match bounded("break: the waiter is granted", waiting).await {
        Ok(next) => ok("break: waiter", next),
        Err(e) => panic!("break: the waiter failed: {e}"),
    };
    assert!(
        next.token() > stuck.token(),
        "the next holder's token must be greater"
    );
    let refused = stuck.fenced_put("after-break", "stale").await;
    assert!(
        matches!(&refused, Err(e) if e.is_lost()),
        "a broken holder's write: {refused:?}"
    );
    release("break: next", next).await;
    assert_eq!(
        ok("break: free", c.break_lock(&name).await),
        None,
        "nothing left to break"
    );
}

/// `close` waits for the withdrawal of a failed try before it returns, so that a process that
/// exits right after leaves nothing queued; the instance's guards lose their locks. The exit is
/// a runtime of its own, dropped after `close` as a process's would be: its background tasks
/// never run again.
pub async fn close_leaves_nothing_queued<F: BackendFactory>(factory: &F) {
    let name = factory.name("close");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let held = acquire("close: holder", &a, name.as_str()).await;
    let exited = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let process = scope.spawn(|| {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => panic!("close: a runtime for the exiting process: {e}"),
                };
                let tried = runtime.block_on(async {
                    let exiting = factory.connect().await;
                    let tried = exiting.try_lock(name.as_str()).await;
                    ok("close", bounded("close", exiting.close()).await);
                    tried.map(drop)
                });
                drop(runtime);
                tried
            });
            process.join()
        })
    });
    match exited {
        Ok(Err(Error::WouldBlock { .. })) => {}
        other => panic!("close: the exiting process's try: {other:?}"),
    }
    let status = ok("close: status", c.status(&name).await);
    assert_eq!(
        status.waiting, 0,
        "the failed try must be withdrawn before close returns"
    );
    let other = acquire("close: b's own lock", &b, factory.name("close-b").as_str()).await;
    ok("close: b", bounded("close: b", b.close()).await);
    bounded("close: b's guard loses its lock", other.lost()).await;
    release("close: holder", held).await;
}
