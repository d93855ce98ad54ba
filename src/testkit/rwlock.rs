//! The conformance checks of reader-writer locks ([`LockBackend::acquire_rw`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::checks::{ok, release};
use super::{bounded, BackendFactory};
use crate::{Access, Error, LockBackend, LockGuard, LockName, ReleaseOutcome, Wait};

async fn take<B: LockBackend + ?Sized>(
    what: &str,
    backend: &B,
    name: &LockName,
    access: Access,
    wait: Wait,
) -> LockGuard {
    ok(
        what,
        bounded(what, backend.acquire_rw(name, access, wait)).await,
    )
}

async fn assert_blocked<B: LockBackend + ?Sized>(
    what: &str,
    backend: &B,
    name: &LockName,
    access: Access,
) {
    let tried = bounded(what, backend.acquire_rw(name, access, Wait::Try)).await;
    assert!(
        matches!(tried, Err(Error::WouldBlock { .. })),
        "{what}: must not be granted now: {tried:?}"
    );
}

/// Readers on separate instances hold together, and so do two of one instance; a writer is
/// refused while they do and gets the lock after them with a greater token; while it writes,
/// readers and writers are refused.
pub async fn rw_readers_share_writers_exclude<F: BackendFactory>(factory: &F) {
    let name = factory.name("rw-share");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let r1 = take("first reader", &a, &name, Access::Read, Wait::Try).await;
    let r2 = take("second reader", &b, &name, Access::Read, Wait::Try).await;
    assert_ne!(r1.token(), r2.token());
    let status = ok(
        "status while two read",
        bounded("status", c.status(&name)).await,
    );
    let sides: Vec<_> = status.queue.iter().map(|e| e.access).collect();
    assert_eq!(
        (status.holders, status.waiting, sides),
        (2, 0, vec![Some(Access::Read); 2]),
        "status must show both readers holding: {status:?}"
    );
    // A refused try is not queued when it returns: the reader tries after it are not held back.
    assert_blocked("a writer while two read", &c, &name, Access::Write).await;
    let r1_again = take(
        "a second reader of the first instance",
        &a,
        &name,
        Access::Read,
        Wait::Try,
    )
    .await;
    release("the first instance's second reader", r1_again).await;
    release("first reader", r1).await;
    assert_blocked("a writer while one reads", &c, &name, Access::Write).await;
    let r2_token = r2.token();
    release("second reader", r2).await;
    let w = take("writer", &c, &name, Access::Write, Wait::Try).await;
    assert!(
        w.token() > r2_token,
        "a writer's token exceeds earlier readers'"
    );
    ok("writer's fenced write", w.fenced_put("k", b"v").await);
    let status = ok(
        "status while one writes",
        bounded("status", a.status(&name)).await,
    );
    assert_eq!(
        (status.holders, status.holder, status.queue[0].access),
        (1, Some(w.token()), Some(Access::Write)),
        "status must show the writer holding: {status:?}"
    );
    assert_blocked("a reader while one writes", &a, &name, Access::Read).await;
    assert_blocked("a writer while one writes", &b, &name, Access::Write).await;
    let w_token = w.token();
    release("writer", w).await;
    let r3 = take(
        "reader after the writer",
        &a,
        &name,
        Access::Read,
        Wait::Try,
    )
    .await;
    assert!(
        r3.token() > w_token,
        "a reader's token exceeds earlier writers'"
    );
    release("reader after the writer", r3).await;
}

/// Arrival order: a reader that comes after a waiting writer waits too (no writer
/// starvation), and is granted after that writer.
pub async fn rw_waiting_writer_holds_back_later_readers<F: BackendFactory>(factory: &F) {
    let name = factory.name("rw-fifo");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let reading = take("reader", &a, &name, Access::Read, Wait::Try).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn = |backend: F::Backend, access: Access, who: &'static str| {
        let (name, order) = (name.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = take("waiter", &backend, &name, access, Wait::Forever).await;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(who);
            (guard, backend)
        })
    };
    let writer = spawn(b, Access::Write, "writer");
    let d = factory.connect().await;
    // Refused once the writer is queued; a read granted before that (the writer still on its
    // way: no fixed pause is long enough on a busy machine) is released and tried again.
    let (reader, named) = (&d, &name);
    super::until(
        "a reader behind a waiting writer is refused",
        move || async move {
            let tried = bounded(
                "a reader behind a waiting writer",
                reader.acquire_rw(named, Access::Read, Wait::Try),
            )
            .await;
            match tried {
                Ok(early) => {
                    release("a read before the writer queued", early).await;
                    false
                }
                Err(Error::WouldBlock { .. }) => true,
                Err(e) => panic!("a reader behind a waiting writer: {e}"),
            }
        },
        |refused| *refused,
    )
    .await;
    let reader = spawn(c, Access::Read, "late reader");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !writer.is_finished() && !reader.is_finished(),
        "both must wait for the reader"
    );
    release("first reader", reading).await;
    let (w, _b) = match bounded("rw: the writer", writer).await {
        Ok(got) => got,
        Err(e) => panic!("rw: the writer failed: {e}"),
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !reader.is_finished(),
        "the late reader must wait for the writer"
    );
    let w_token = w.token();
    release("writer", w).await;
    let (r, _c) = match bounded("rw: the late reader", reader).await {
        Ok(got) => got,
        Err(e) => panic!("rw: the late reader failed: {e}"),
    };
    assert!(r.token() > w_token);
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(order, ["writer", "late reader"]);
    release("late reader", r).await;
}

/// A reader whose session ends lets the waiting writer in; its `lost` fires and the store
/// refuses its release.
pub async fn rw_lost_reader_lets_the_writer_in<F: BackendFactory>(factory: &F) {
    let name = factory.name("rw-lost");
    let (a, b) = (factory.connect().await, factory.connect().await);
    let reading = take("reader", &a, &name, Access::Read, Wait::Try).await;
    let (writing, ()) = tokio::join!(
        bounded(
            "rw: the writer",
            b.acquire_rw(&name, Access::Write, Wait::Forever)
        ),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            factory.break_session(&a).await;
        }
    );
    let writing = ok("rw: the writer gets in after the reader's loss", writing);
    bounded("rw: lost must fire", reading.lost_token().cancelled()).await;
    assert!(writing.token() > reading.token());
    let outcome = ok("rw: the lost reader's release", reading.release().await);
    assert_eq!(outcome, ReleaseOutcome::NotOwned);
    release("writer", writing).await;
}

/// A timed-out read and a dropped write acquire leave nothing behind; several readers and
/// writers on several instances then loop, and no writer ever shares the lock.
pub async fn rw_cancelled_acquires_leave_nothing_and_writers_stay_alone<F: BackendFactory>(
    factory: &F,
) {
    let name = factory.name("rw-cancel");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let writing = take("writer", &a, &name, Access::Write, Wait::Try).await;
    let timed = b
        .acquire_rw(
            &name,
            Access::Read,
            Wait::Timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        b.acquire_rw(&name, Access::Write, Wait::Forever),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the dropped acquire should have been waiting"
    );
    release("writer", writing).await;
    let next = take("next writer", &c, &name, Access::Write, Wait::Forever).await;
    release("next writer", next).await;

    const INSTANCES: usize = 3;
    const ROUNDS: usize = 4;
    let (readers, writers) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let shared = Arc::new(AtomicUsize::new(0)); // the most readers seen together
    let mut tasks = Vec::new();
    for i in 0..INSTANCES {
        let backend = Arc::new(factory.connect().await);
        for access in [Access::Read, Access::Read, Access::Write] {
            let (backend, name) = (Arc::clone(&backend), name.clone());
            let (readers, writers, shared) = (
                Arc::clone(&readers),
                Arc::clone(&writers),
                Arc::clone(&shared),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = take("loop", &*backend, &name, access, Wait::Forever).await;
                    let (mine, other) = match access {
                        Access::Read => (&readers, &writers),
                        Access::Write => (&writers, &readers),
                    };
                    let now = mine.fetch_add(1, Ordering::SeqCst) + 1;
                    if access == Access::Read {
                        shared.fetch_max(now, Ordering::SeqCst);
                    }
                    let alone =
                        other.load(Ordering::SeqCst) == 0 && (access == Access::Read || now == 1);
                    assert!(
                        alone,
                        "instance {i}: {access:?} shares the lock with a writer"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    mine.fetch_sub(1, Ordering::SeqCst);
                    release("loop", guard).await;
                }
            }));
        }
    }
    for task in tasks {
        if let Err(e) = task.await {
            panic!("rw: a contender failed: {e}");
        }
    }
}
