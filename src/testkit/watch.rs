//! The conformance check of `watch`: a lock's holder and queue, followed.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::checks::{ok, release};
use super::{bounded, BackendFactory};
use crate::{Error, FencingToken, LockBackend, LockBackendExt, LockStatus, Result, Wait};

async fn next_status(
    what: &str,
    changes: &mut (impl futures::Stream<Item = Result<LockStatus>> + Unpin),
) -> LockStatus {
    match bounded(what, changes.next()).await {
        Some(item) => ok(what, item),
        None => panic!("{what}: the watch ended"),
    }
}

fn tokens(status: &LockStatus) -> Vec<FencingToken> {
    status.queue.iter().map(|e| e.token).collect()
}

/// `watch` yields the lock now (free), then each change in order: a holder, a waiter joining,
/// the handoff to the waiter, and free again; each item once, with the owners `status` shows.
/// Backends that answer [`Error::Unsupported`] pass.
pub async fn watch_sees_acquire_handoff_and_release<F: BackendFactory>(factory: &F) {
    let name = factory.name("watch");
    let (a, b, watcher) = (
        factory.connect().await,
        Arc::new(factory.connect().await),
        factory.connect().await,
    );
    let mut changes = watcher.watch(&name);
    let first = match bounded("watch: first item", changes.next()).await {
        Some(Err(Error::Unsupported { .. })) => return,
        Some(item) => ok("watch: first item", item),
        None => panic!("watch: the stream ended at once"),
    };
    assert_eq!((first.holder, first.waiting), (None, 0), "free: {first:?}");

    let held = ok("watch: a", bounded("watch: a", a.lock(name.as_str())).await);
    let seen = next_status("watch: a holds", &mut changes).await;
    assert_eq!(tokens(&seen), vec![held.token()], "{seen:?}");
    let owner = seen.owner.clone();
    assert!(
        owner
            .as_ref()
            .is_some_and(|o| o.pid() == std::process::id()),
        "the holder's owner: {seen:?}"
    );

    let waiting = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { b.acquire(&name, Wait::Forever).await })
    };
    let seen = next_status("watch: b waits", &mut changes).await;
    assert_eq!(seen.holder, Some(held.token()), "{seen:?}");
    assert_eq!(seen.waiting, 1, "{seen:?}");
    let queued = seen.queue[1].token;

    // A spell without a change of this lock yields nothing, though ages change and another
    // lock changes hands (which wakes some stores' waits: the memory store has one counter).
    let other = factory.name("watch-other");
    let unrelated = ok(
        "watch: other",
        bounded("watch: other", a.lock(other.as_str())).await,
    );
    release("watch: other released", unrelated).await;
    let quiet = tokio::time::timeout(Duration::from_millis(700), changes.next()).await;
    assert!(quiet.is_err(), "an item without a change: {quiet:?}");

    release("watch: a releases", held).await;
    let seen = next_status("watch: handoff", &mut changes).await;
    assert_eq!(tokens(&seen), vec![queued], "the waiter holds: {seen:?}");
    let next = match bounded("watch: b granted", waiting).await {
        Ok(next) => ok("watch: b", next),
        Err(e) => panic!("watch: b's acquire failed: {e}"),
    };
    // etcd's grant token is the revision the grant was seen at, which may exceed the queue
    // entry's create revision that `status` shows; never less.
    assert!(
        next.token() >= queued,
        "b's token {} < its entry's {queued}",
        next.token()
    );

    release("watch: b releases", next).await;
    let seen = next_status("watch: free again", &mut changes).await;
    assert_eq!((seen.holder, seen.waiting), (None, 0), "{seen:?}");
    assert!(seen.owner.is_none() && seen.queue.is_empty(), "{seen:?}");
}

/// The watcher-gap scenario, for backends' fault tests: `watcher` follows lock `name`; `cut`
/// cuts it off from the store; meanwhile the lock changes hands (`a` releases, `b` acquires),
/// then `in_gap` runs (an etcd test compacts the store there) and `heal` restores the link (it
/// may do nothing if `cut` heals on a timer). The watcher's next item must be the lock *now*,
/// held by `b`, with nothing stale in between; then `b`'s release shows it free.
///
/// # Panics
/// When the watch yields a stale item, an error, or nothing within [`BOUND`](super::BOUND).
pub async fn watch_across_a_gap<W, A, B>(
    watcher: &W,
    (a, b): (&A, &B),
    name: &crate::LockName,
    cut: impl FnOnce(),
    in_gap: impl std::future::Future<Output = ()>,
    heal: impl FnOnce(),
) where
    W: LockBackend + ?Sized,
    A: LockBackend + ?Sized,
    B: LockBackend + ?Sized,
{
    let mut changes = watcher.watch(name);
    let free = next_status("gap: first item", &mut changes).await;
    assert_eq!(free.holder, None, "gap: free at first: {free:?}");
    let first = ok("gap: a", bounded("gap: a", a.lock(name.as_str())).await);
    let seen = next_status("gap: a holds", &mut changes).await;
    assert_eq!(tokens(&seen), vec![first.token()], "{seen:?}");
    cut();
    release("gap: a releases", first).await;
    let second = ok("gap: b", bounded("gap: b", b.lock(name.as_str())).await);
    in_gap.await;
    heal();
    let after = next_status("gap: after", &mut changes).await;
    assert_eq!(
        tokens(&after),
        vec![second.token()],
        "after the gap the watcher must report the holder now: {after:?}"
    );
    release("gap: b releases", second).await;
    let free = next_status("gap: free", &mut changes).await;
    assert_eq!((free.holder, free.waiting), (None, 0), "{free:?}");
}
