//! The semaphore protocol, compatible with Curator's `InterProcessSemaphoreV2`:
//! 1. take the gate, an `InterProcessMutex` at `B/N/locks` (so admissions happen one at a
//!    time, in arrival order, and only one contender waits on the permits: no herd);
//! 2. create our lease `B/N/leases/_c_<uuid>-lease-` EPHEMERAL_SEQUENTIAL (its czxid is the
//!    permit's token: leases are created one at a time, so tokens grow with each grant);
//! 3. read the stored count and list the leases, in one multi-read (sent right behind the
//!    lease's create, and used if it lists our lease): at most N leases, ours included, means
//!    held (Curator's rule); otherwise list them with a watch, wait for it, and list again (the
//!    uncontended permit sends no watch);
//! 4. delete our gate node, for the next contender.
//!
//! The count lives in the data of `B/N/leases` (written by fencelock; Curator leaves it empty
//! and does not read it): a gate holder that finds other leases checks it, and one that finds
//! none writes its own. Only a gate holder writes it, so no two contenders race on it.

use std::time::Duration;

use fencelock::raw::{Backoff, Live};
use fencelock::{Error, LockName, Result};

use crate::election::timed;
use crate::mutex::{self, Node, TurnRead};
use crate::session::ZkSession;
use crate::zk_error;
use zookeeper_client::{Client, MultiReadResult};

/// The count of permits `B/N/leases` stores, if it holds one.
pub(crate) fn stored_permits(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

/// Holding the gate, with our lease created: checks the stored count, then waits until at most
/// `permits` leases exist, ours included.
///
/// `early` is the count's read when it was sent right behind our lease's create
/// ([`count_read`]); it is used only if it lists our lease.
pub(crate) async fn admit(
    session: &ZkSession,
    name: &LockName,
    leases: &str,
    (lease, early): (&Node, Option<TurnRead<'_>>),
    permits: u32,
    try_once: bool,
    limit: Duration,
) -> Result<()> {
    let client = &session.client;
    let children = check_count(session, name, leases, (lease, early), permits, limit).await?;
    let lost = || Error::lost(name);
    let most = usize::try_from(permits).unwrap_or(usize::MAX);
    // The count's read already listed the leases, after our lease was created and while we
    // hold the gate: with room, that listing admits us (the watched listing below is needed
    // only to wait), as it is the same read the first pass would make.
    if !children.iter().any(|c| c == lease.child()) {
        return Err(lost());
    }
    if children.len() <= most {
        return Ok(());
    }
    let mut backoff = Backoff::new();
    // Each pass lists the leases with a watch, then waits for it; failures pause with backoff,
    // and the session's end ends the loop.
    loop {
        if !session.is_live() {
            return Err(lost());
        }
        let listed = tokio::select! {
            listed = timed("list the leases", limit, client.list_and_watch_children(leases)) => listed,
            () = session.clock.lost_token().cancelled() => return Err(lost()),
        };
        let (children, watcher) = match listed {
            Ok(Ok(listed)) => listed,
            Ok(Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::SessionExpired)) => {
                return Err(lost())
            }
            Ok(Err(e)) if !zk_error("list", e.clone()).is_retryable() => {
                return Err(zk_error("list the leases", e))
            }
            outcome => {
                tracing::warn!(semaphore = %name, ?outcome, "zookeeper: listing the leases failed; retrying");
                pause_or_lost(&mut backoff, session, name).await?;
                continue;
            }
        };
        if !children.iter().any(|c| c == lease.child()) {
            return Err(lost()); // our lease is gone: the session expired, or someone deleted it
        }
        if children.len() <= most {
            return Ok(());
        }
        if try_once {
            return Err(Error::would_block(name));
        }
        tokio::select! {
            _ = watcher.changed() => backoff = Backoff::new(),
            () = session.clock.lost_token().cancelled() => return Err(lost()),
        }
    }
}

/// Refuses a count other than the stored one while others hold; stores ours when no one does
/// (or when only Curator contenders, which store none, do). Returns the leases, listed in the
/// same multi-read as the count.
async fn check_count(
    session: &ZkSession,
    name: &LockName,
    leases: &str,
    (lease, early): (&Node, Option<TurnRead<'_>>),
    permits: u32,
    limit: Duration,
) -> Result<Vec<String>> {
    let client = &session.client;
    let early = match early {
        Some(read) => match timed("read the count of permits", limit, read).await {
            Ok(Ok(read)) if mutex::lists(&read, 1, lease.child()) => Some(read),
            _ => None, // read again, as if it had not been sent
        },
        None => None,
    };
    let read = match early {
        Some(read) => read,
        None => timed(
            "read the count of permits",
            limit,
            count_read(client, leases)?,
        )
        .await?
        .map_err(|e| zk_error("read the count of permits", e))?,
    };
    let (data, children) = match <[MultiReadResult; 2]>::try_from(read) {
        Ok([MultiReadResult::Data { data, .. }, MultiReadResult::Children { children }]) => {
            (data, children)
        }
        other => {
            return Err(Error::protocol(
                crate::KIND,
                format!("read the count of permits: unexpected reply {other:?}"),
            ))
        }
    };
    let others = children.iter().any(|c| c != lease.child());
    let stored = stored_permits(&data);
    match stored {
        Some(n) if n == permits => return Ok(children),
        Some(n) if others => return Err(Error::permits_mismatch(name, n, permits)),
        _ => {}
    }
    let count = permits.to_string();
    timed(
        "store the count of permits",
        limit,
        client.set_data(leases, count.as_bytes(), None),
    )
    .await?
    .map_err(|e| zk_error("store the count of permits", e))?;
    Ok(children)
}

/// Sends the count's read (sent when this is called): the data of `leases` (the count) and
/// its children (the leases), in one multi-read.
pub(crate) fn count_read<'a>(client: &'a Client, leases: &str) -> Result<TurnRead<'a>> {
    let mut reader = client.new_multi_reader();
    for add in [reader.add_get_data(leases), reader.add_get_children(leases)] {
        add.map_err(|e| zk_error("read the count of permits", e))?;
    }
    Ok(Box::pin(reader.commit()))
}

async fn pause_or_lost(backoff: &mut Backoff, session: &ZkSession, name: &LockName) -> Result<()> {
    if backoff.pause_unless(session.clock.lost_token()).await {
        Ok(())
    } else {
        Err(Error::lost(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_plain_digits() {
        assert_eq!(stored_permits(b"3"), Some(3));
        assert_eq!(stored_permits(b""), None); // a parent Curator created
        assert_eq!(stored_permits(b"127.0.0.1"), None);
    }
}
