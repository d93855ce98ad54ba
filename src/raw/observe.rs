//! [`observe_leader`] and [`watch_queue`]: the one loop behind every backend's `observe` and
//! `watch`.

use std::future::Future;

use futures::stream::{self, BoxStream, StreamExt};

use crate::raw::Backoff;
use crate::{Leader, LockName, LockStatus, Result};

/// What a backend provides so that [`observe_leader`] (an election's leader) or
/// [`watch_queue`] (a lock's holder and waiters) can follow a name: a read that also arms a
/// watch, and a wait on that watch.
///
/// The pair must leave no gap: a change after the read must end the wait
/// ([`changed`](Watched::changed) with the read's `Seen`). etcd: the read's revision, and a
/// watch from the revision after it; ZooKeeper: the watches set by the reads themselves; memory:
/// a change counter subscribed before the read.
pub trait Watched: Send + Sync {
    /// What a read returns: `Option<Leader>` for an election, [`LockStatus`] for a lock.
    type Item: Clone + Send;

    /// Whatever the wait needs to start where the read ended.
    type Seen: Send;

    /// The item now (a linearizable read), and where it was read.
    fn read(
        &self,
        name: &LockName,
    ) -> impl Future<Output = Result<(Self::Item, Self::Seen)>> + Send;

    /// Returns once something under `name` may have changed since `seen`, or when the wait
    /// cannot tell any more (a watch cancelled by compaction, a new session): the loop reads
    /// again either way, so returning early costs a read and never a wrong item.
    fn changed(&self, name: &LockName, seen: Self::Seen)
        -> impl Future<Output = Result<()>> + Send;
}

/// The stream [`LockBackend::observe`](crate::LockBackend::observe) returns: read, yield the
/// leader if it differs from the last item, wait for a change, read again. A retryable error
/// is logged and retried with [`Backoff`]; any other is yielded and ends the stream.
///
/// `source` is usually a small struct of references into the backend, so that the stream
/// borrows the backend.
///
/// Every item comes from a read made after the last change was seen, so a gap (a reconnect, a
/// compacted watch) can delay an item, never make it stale.
pub fn observe_leader<'a, S: Watched<Item = Option<Leader>> + 'a>(
    backend: &'static str,
    source: S,
    name: LockName,
) -> BoxStream<'a, Result<Option<Leader>>> {
    follow(backend, source, name, PartialEq::eq)
}

/// The stream [`LockBackend::watch`](crate::LockBackend::watch) returns, as
/// [`observe_leader`] does for elections: an item whenever the holder or the queue differs
/// from the last item (ages alone do not count).
pub fn watch_queue<'a, S: Watched<Item = LockStatus> + 'a>(
    backend: &'static str,
    source: S,
    name: LockName,
) -> BoxStream<'a, Result<LockStatus>> {
    follow(backend, source, name, same_queue)
}

/// The same contenders in the same order, with the same owners.
fn same_queue(a: &LockStatus, b: &LockStatus) -> bool {
    a.holder == b.holder
        && a.queue.len() == b.queue.len()
        && a.queue
            .iter()
            .zip(&b.queue)
            .all(|(x, y)| x.token == y.token && x.owner == y.owner)
}

fn follow<'a, S: Watched + 'a>(
    backend: &'static str,
    source: S,
    name: LockName,
    same: fn(&S::Item, &S::Item) -> bool,
) -> BoxStream<'a, Result<S::Item>> {
    struct State<S: Watched> {
        source: S,
        name: LockName,
        last: Option<S::Item>,
        seen: Option<S::Seen>,
        ended: bool,
    }
    let state = State {
        source,
        name,
        last: None,
        seen: None,
        ended: false,
    };
    stream::unfold(state, move |mut state| async move {
        if state.ended {
            return None;
        }
        let mut backoff = Backoff::new();
        // Each pass waits for one change and reads once; it yields when the item differs.
        loop {
            if let Some(seen) = state.seen.take() {
                if let Err(e) = state.source.changed(&state.name, seen).await {
                    if !e.is_retryable() {
                        state.ended = true;
                        return Some((Err(e), state));
                    }
                    tracing::warn!(backend, name = %state.name, error = %e, "watch: the store's watch failed; reading again");
                    backoff.pause().await;
                }
            }
            match state.source.read(&state.name).await {
                Ok((item, seen)) => {
                    state.seen = Some(seen);
                    backoff = Backoff::new();
                    if !state.last.as_ref().is_some_and(|last| same(last, &item)) {
                        state.last = Some(item.clone());
                        return Some((Ok(item), state));
                    }
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(backend, name = %state.name, error = %e, "watch: reading failed; retrying");
                    backoff.pause().await;
                }
                Err(e) => {
                    state.ended = true;
                    return Some((Err(e), state));
                }
            }
        }
    })
    .boxed()
}
