//! [`observe_leader`]: the one loop behind every backend's `observe`.

use std::future::Future;

use futures::stream::{self, BoxStream, StreamExt};

use crate::raw::Backoff;
use crate::{Leader, LockName, Result};

/// What a backend provides so that [`observe_leader`] can follow an election: a read of the
/// leader that also arms a watch, and a wait on that watch.
///
/// The pair must leave no gap: a change after the read must end the wait
/// ([`changed`](LeaderSource::changed) with the read's `Seen`). etcd: the read's revision, and a
/// watch from the revision after it; ZooKeeper: the watches set by the reads themselves; memory:
/// a change counter subscribed before the read.
pub trait LeaderSource: Send + Sync {
    /// Whatever the wait needs to start where the read ended.
    type Seen: Send;

    /// The leader now (a linearizable read), and where it was read.
    fn read(
        &self,
        name: &LockName,
    ) -> impl Future<Output = Result<(Option<Leader>, Self::Seen)>> + Send;

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
pub fn observe_leader<'a, S: LeaderSource + 'a>(
    backend: &'static str,
    source: S,
    name: LockName,
) -> BoxStream<'a, Result<Option<Leader>>> {
    struct State<S: LeaderSource> {
        source: S,
        name: LockName,
        last: Option<Option<Leader>>,
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
        // Each pass waits for one change and reads once; it yields when the leader differs.
        loop {
            if let Some(seen) = state.seen.take() {
                if let Err(e) = state.source.changed(&state.name, seen).await {
                    if !e.is_retryable() {
                        state.ended = true;
                        return Some((Err(e), state));
                    }
                    tracing::warn!(backend, election = %state.name, error = %e, "observe: the watch failed; reading again");
                    backoff.pause().await;
                }
            }
            match state.source.read(&state.name).await {
                Ok((leader, seen)) => {
                    state.seen = Some(seen);
                    backoff = Backoff::new();
                    if state.last.as_ref() != Some(&leader) {
                        state.last = Some(leader.clone());
                        return Some((Ok(leader), state));
                    }
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(backend, election = %state.name, error = %e, "observe: reading the leader failed; retrying");
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
