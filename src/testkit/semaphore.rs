//! The conformance checks of semaphores ([`LockBackend::acquire_permit`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::checks::{ok, release};
use super::{bounded, BackendFactory};
use crate::{Error, LockBackend, LockGuard, LockName, ReleaseOutcome, Wait};

async fn permit<B: LockBackend + ?Sized>(
    what: &str,
    backend: &B,
    name: &LockName,
    permits: u32,
) -> LockGuard {
    ok(
        what,
        bounded(what, backend.acquire_permit(name, permits, Wait::Forever)).await,
    )
}

async fn assert_full<B: LockBackend + ?Sized>(what: &str, backend: &B, name: &LockName, n: u32) {
    let tried = bounded(what, backend.acquire_permit(name, n, Wait::Try)).await;
    assert!(
        matches!(tried, Err(Error::WouldBlock { .. })),
        "{what}: every permit is taken, yet: {tried:?}"
    );
}

/// `N` holders at once, never more: two instances hold the two permits together, a third is
/// refused; then contenders on several instances loop through a shared counter of holders
/// inside, each writing its own fenced state, and the counter never exceeds `N`.
pub async fn semaphore_admits_at_most_n<F: BackendFactory>(factory: &F) {
    const N: u32 = 2;
    const INSTANCES: usize = 3;
    const TASKS: usize = 2;
    const ROUNDS: usize = 3;
    let name = factory.name("sem-n");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let one = ok(
        "first",
        bounded("first", a.acquire_permit(&name, N, Wait::Try)).await,
    );
    let two = ok(
        "second",
        bounded("second", b.acquire_permit(&name, N, Wait::Try)).await,
    );
    assert_ne!(
        one.token(),
        two.token(),
        "each permit has a token of its own"
    );
    assert_full("third", &c, &name, N).await;
    release("first", one).await;
    let three = ok(
        "third after a release",
        bounded("third", c.acquire_permit(&name, N, Wait::Try)).await,
    );
    assert!(three.token() > two.token(), "tokens grow with each grant");
    release("second", two).await;
    release("third", three).await;

    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..INSTANCES {
        let backend = Arc::new(factory.connect().await);
        for task in 0..TASKS {
            let (backend, name, inside, most) = (
                Arc::clone(&backend),
                name.clone(),
                Arc::clone(&inside),
                Arc::clone(&most),
            );
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let guard = permit("semaphore: acquire", &*backend, &name, N).await;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let key = format!("t{task}");
                    ok(
                        "semaphore: the store refused a live permit's fenced write",
                        guard.fenced_put(key.as_str(), round.to_string()).await,
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    release("semaphore: release", guard).await;
                }
            }));
        }
    }
    for task in tasks {
        if let Err(e) = task.await {
            panic!("semaphore: a contender failed: {e}");
        }
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= N as usize, "{most} permit holders at once, of {N}");
}

/// A granted permit has left the way in open when it returns (as Curator's
/// `InterProcessSemaphoreV2` releases its lock before `acquire` returns): right after one
/// instance's grant, the status shows no waiter, and another instance's try gets a free permit.
pub async fn semaphore_grant_leaves_the_way_open<F: BackendFactory>(factory: &F) {
    const N: u32 = 2;
    // The way in was once cleared in the background: a try raced it, about 1 run in 5 under load.
    const ROUNDS: usize = 30;
    let name = factory.name("sem-open");
    let (a, b) = (factory.connect().await, factory.connect().await);
    for round in 0..ROUNDS {
        let first = ok(
            "open: first",
            bounded("open: first", a.acquire_permit(&name, N, Wait::Try)).await,
        );
        let status = ok(
            "open: status",
            bounded("status", b.permit_status(&name)).await,
        );
        assert_eq!(
            (status.holders, status.waiting),
            (1, 0),
            "round {round}: a granted permit still stands in the queue: {status:?}"
        );
        let second = bounded("open: second", b.acquire_permit(&name, N, Wait::Try)).await;
        let second = second
            .unwrap_or_else(|e| panic!("round {round}: a permit is free, yet the try got: {e}"));
        release("open: first", first).await;
        release("open: second", second).await;
    }
}

/// A holder whose session ends gives its permit back: `lost` fires, a waiter gets the permit,
/// and the store refuses the lost holder's fenced writes and release.
pub async fn semaphore_lost_permit_returns<F: BackendFactory>(factory: &F) {
    const N: u32 = 2;
    let name = factory.name("sem-lost");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let doomed = permit("lost: first", &a, &name, N).await;
    let kept = permit("lost: second", &b, &name, N).await;
    let waiter = c.acquire_permit(&name, N, Wait::Forever);
    let (next, ()) = tokio::join!(bounded("lost: the waiter", waiter), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        factory.break_session(&a).await;
    });
    let next = ok("lost: the waiter gets the lost permit", next);
    bounded("lost: lost must fire", doomed.lost_token().cancelled()).await;
    let refused = doomed.fenced_put("k", b"v").await;
    assert!(refused.is_err(), "a lost permit's write: {refused:?}");
    let outcome = ok("lost: release", doomed.release().await);
    assert_eq!(outcome, ReleaseOutcome::NotOwned);
    assert_full("lost: both permits held again", &a, &name, N).await;
    release("lost: second", kept).await;
    release("lost: waiter", next).await;
}

/// A timed-out and a refused permit acquire are not queued when they return; they and a
/// dropped one leave nothing behind: once a holder releases, a try gets its permit at once, and
/// the status shows no waiter.
pub async fn semaphore_cancelled_acquire_leaves_nothing<F: BackendFactory>(factory: &F) {
    const N: u32 = 2;
    let name = factory.name("sem-cancel");
    let (a, b, c, d) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let first = permit("cancel: first", &a, &name, N).await;
    let second = permit("cancel: second", &b, &name, N).await;
    let timed = c
        .acquire_permit(&name, N, Wait::Timeout(Duration::from_millis(300)))
        .await;
    assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
    let tried = bounded("cancel: try", c.acquire_permit(&name, N, Wait::Try)).await;
    assert!(matches!(tried, Err(Error::WouldBlock { .. })), "{tried:?}");
    // Both returned only once their entries were gone: no one sees them queued.
    let status = ok(
        "cancel: status",
        bounded("status", d.permit_status(&name)).await,
    );
    assert_eq!(
        (status.holders, status.waiting),
        (2, 0),
        "a refused try or a timed-out acquire is still queued: {status:?}"
    );
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        c.acquire_permit(&name, N, Wait::Forever),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the dropped acquire should have been waiting"
    );
    release("cancel: first", first).await;
    // `c` keeps its session: anything its acquires left would stand in `d`'s way.
    let mut again = None;
    for _ in 0..50 {
        match bounded("cancel: try", d.acquire_permit(&name, N, Wait::Try)).await {
            Ok(guard) => {
                again = Some(guard);
                break;
            }
            // A withdrawal runs in the background; give it a moment, boundedly.
            Err(Error::WouldBlock { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("cancel: try: {e}"),
        }
    }
    let again = again
        .unwrap_or_else(|| panic!("cancel: a cancelled acquire left a permit or a waiter behind"));
    let status = ok(
        "cancel: status",
        bounded("status", d.permit_status(&name)).await,
    );
    assert_eq!((status.holders, status.waiting), (2, 0), "{status:?}");
    assert_eq!(status.permits, Some(N), "{status:?}");
    release("cancel: second", second).await;
    release("cancel: again", again).await;
    let gone = ok(
        "cancel: status",
        bounded("status", d.permit_status(&name)).await,
    );
    assert_eq!((gone.holders, gone.waiting), (0, 0), "{gone:?}");
}

/// A contender with another count is refused with [`Error::PermitsMismatch`] while permits
/// are held, waits or not, and takes nothing; a count of 0 is refused up front.
pub async fn semaphore_mismatched_count_refused<F: BackendFactory>(factory: &F) {
    let name = factory.name("sem-count");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let zero = b.acquire_permit(&name, 0, Wait::Try).await;
    assert!(matches!(zero, Err(Error::InvalidConfig { .. })), "{zero:?}");
    let held = permit("count: holder", &a, &name, 2).await;
    for wait in [Wait::Try, Wait::Forever] {
        let other = bounded("count: other count", b.acquire_permit(&name, 3, wait)).await;
        assert!(
            matches!(
                other,
                Err(Error::PermitsMismatch {
                    stored: 2,
                    requested: 3,
                    ..
                })
            ),
            "{wait:?}: {other:?}"
        );
    }
    let status = ok(
        "count: status",
        bounded("status", b.permit_status(&name)).await,
    );
    assert_eq!(
        (status.holders, status.waiting),
        (1, 0),
        "the refusal left something: {status:?}"
    );
    let second = permit("count: same count", &b, &name, 2).await;
    release("count: holder", held).await;
    release("count: second", second).await;
}

/// Waiters are served in arrival order, and the status lists holders, then waiters.
pub async fn semaphore_fifo_and_status<F: BackendFactory>(factory: &F) {
    const N: u32 = 2;
    let name = factory.name("sem-fifo");
    let (a, b, c, d) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let first = permit("fifo: first", &a, &name, N).await;
    let second = permit("fifo: second", &b, &name, N).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let wait = |backend: F::Backend, who: &'static str| {
        let (name, order) = (name.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = permit("fifo: waiter", &backend, &name, N).await;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(who);
            (guard, backend)
        })
    };
    // Each waiter is seen queued before the next comes: FIFO is then the store's order.
    let (reader, named) = (&a, &name);
    let queued = |n: usize| {
        super::until(
            "fifo: a waiter queues",
            move || async move {
                ok(
                    "fifo: status",
                    bounded("status", reader.permit_status(named)).await,
                )
            },
            move |status| status.waiting >= n,
        )
    };
    let c_waits = wait(c, "c");
    queued(1).await;
    let d_waits = wait(d, "d");
    let status = queued(2).await;
    assert_eq!(
        (status.holders, status.waiting, status.permits),
        (2, 2, Some(N)),
        "{status:?}"
    );
    let holding: Vec<_> = status.holding().iter().map(|e| e.token).collect();
    assert!(
        holding.contains(&first.token()) && holding.contains(&second.token()),
        "{status:?}"
    );
    release("fifo: first", first).await;
    let (c_guard, _c) = match bounded("fifo: c", c_waits).await {
        Ok(got) => got,
        Err(e) => panic!("fifo: c failed: {e}"),
    };
    release("fifo: second", second).await;
    let (d_guard, _d) = match bounded("fifo: d", d_waits).await {
        Ok(got) => got,
        Err(e) => panic!("fifo: d failed: {e}"),
    };
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(order, ["c", "d"], "waiters must be served in arrival order");
    release("fifo: c", c_guard).await;
    release("fifo: d", d_guard).await;
}
