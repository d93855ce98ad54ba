//! The semaphore protocol (see the crate docs, "Semaphores"): a gate, which is a Go Mutex, and
//! permit keys. Only the gate's holder puts a permit key and counts, so admissions happen one
//! at a time, in the gate's (arrival) order, and only that one contender watches the permits:
//! a release wakes one process, never a herd.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use fencelock::raw::{Backoff, Live, Withdraw};
use fencelock::{Error, LockName, Result};

use crate::mutex::{self, txn_call, Queued};
use crate::session::Session;

/// A permit key's value: `permits=<N> <millis>-<nonce> <owner>`. The count is what later
/// contenders check theirs against; the rest is a lock key's value ([`mutex::attempt_value`]).
pub(crate) fn permit_value(permits: u32, owner: &str) -> String {
    format!("{PERMITS}{permits} {}", mutex::attempt_value(owner))
}

const PERMITS: &str = "permits=";

/// The count a permit key's value carries.
pub(crate) fn stored_permits(value: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(value).ok()?.strip_prefix(PERMITS)?;
    text.split(' ').next()?.parse().ok()
}

/// When a permit key's value says it was queued.
pub(crate) fn queued_at(value: &[u8]) -> Option<u128> {
    let text = std::str::from_utf8(value).ok()?;
    let rest = text.strip_prefix(PERMITS)?.split_once(' ')?.1;
    mutex::queued_at(rest.as_bytes())
}

/// Our permit key (unique to this attempt: it names the gate key's create revision).
#[derive(Clone, Debug)]
pub(crate) struct PermitKey {
    pub(crate) key: String,
    pub(crate) prefix: String,
}

/// Our gate key (key, create revision), our permit key and its create revision: what every
/// count compares, so that it counts only while both are ours.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ours<'a> {
    pub(crate) gate: (&'a str, i64),
    pub(crate) permit: &'a PermitKey,
    pub(crate) created: i64,
}

/// The permit keys as one read saw them.
#[derive(Debug)]
pub(crate) struct Counted {
    /// The revision of the read: a grant's token.
    pub(crate) revision: i64,
    /// Our permit key's create revision.
    pub(crate) created: i64,
    /// Every permit key's value, in create order (ours among them).
    values: Vec<(i64, Vec<u8>)>,
}

fn sorted() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

/// Puts our permit key and reads every permit key, in one Txn that holds only while our gate
/// key is there (Go's check after Jepsen, etcd#11456): no one else can be counting meanwhile.
pub(crate) async fn put_permit(
    client: &Client,
    name: &LockName,
    gate: (&str, i64),
    permit: &PermitKey,
    value: &str,
    lease: i64,
    limit: Duration,
) -> Result<Counted> {
    let txn = Txn::new()
        .when([
            Compare::create_revision(gate.0, CompareOp::Equal, gate.1),
            Compare::create_revision(permit.key.as_str(), CompareOp::Equal, 0),
        ])
        .and_then([
            TxnOp::put(
                permit.key.as_str(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(permit.prefix.as_str(), Some(sorted())),
        ]);
    let resp = txn_call("put a permit key", client, txn, limit).await?;
    if !resp.succeeded() {
        return Err(Error::lost(name));
    }
    let revision = resp.header().map_or(0, |h| h.revision());
    counted(&resp, 1, revision, revision, "put a permit key")
}

/// Reads every permit key, if our gate key and permit key are both still there.
async fn count(
    client: &Client,
    name: &LockName,
    ours: Ours<'_>,
    limit: Duration,
) -> Result<Counted> {
    let Ours {
        gate,
        permit,
        created,
    } = ours;
    let txn = Txn::new()
        .when([
            Compare::create_revision(gate.0, CompareOp::Equal, gate.1),
            Compare::create_revision(permit.key.as_str(), CompareOp::Equal, created),
        ])
        .and_then([TxnOp::get(permit.prefix.as_str(), Some(sorted()))]);
    let resp = txn_call("count the permit holders", client, txn, limit).await?;
    if !resp.succeeded() {
        return Err(Error::lost(name));
    }
    let revision = resp.header().map_or(0, |h| h.revision());
    counted(&resp, 0, revision, created, "count the permit holders")
}

fn counted(
    resp: &etcd_client::TxnResponse,
    at: usize,
    revision: i64,
    created: i64,
    what: &str,
) -> Result<Counted> {
    // Fail closed: a reply without its revision or its Range admits no one.
    let Some(TxnOpResponse::Get(range)) = resp.op_responses().into_iter().nth(at) else {
        return Err(Error::protocol(
            crate::KIND,
            format!("{what}: the reply has no Range"),
        ));
    };
    if revision <= 0 {
        return Err(Error::protocol(
            crate::KIND,
            format!("{what}: the reply has no revision"),
        ));
    }
    let values = range
        .kvs()
        .iter()
        .map(|kv| (kv.create_revision(), kv.value().to_vec()))
        .collect();
    Ok(Counted {
        revision,
        created,
        values,
    })
}

impl Counted {
    /// Whether we may hold now: at most `permits` keys, ours included, as Curator counts.
    /// Refuses when another holder's key carries another count.
    pub(crate) fn admits(&self, name: &LockName, permits: u32) -> Result<bool> {
        let other = self
            .values
            .iter()
            .filter(|(created, _)| *created != self.created)
            .find_map(|(_, value)| stored_permits(value).filter(|n| *n != permits));
        if let Some(stored) = other {
            return Err(Error::permits_mismatch(name, stored, permits));
        }
        Ok(self.values.len() <= usize::try_from(permits).unwrap_or(usize::MAX))
    }
}

/// Waits, holding the gate, until a permit is free; returns the token (the revision of the
/// count that saw it free).
pub(crate) async fn wait_for_permit(
    client: &Client,
    name: &LockName,
    ours: Ours<'_>,
    permits: u32,
    session: &Session,
    limit: Duration,
) -> Result<i64> {
    let mut backoff = Backoff::new();
    // Each pass counts once, after a watch on the permit keys exists (so no release between the
    // count and the wait goes unseen), then waits for one delete; failures pause with backoff,
    // and the session's end ends the loop.
    loop {
        if !session.is_live() {
            return Err(Error::lost(name));
        }
        let outcome = tokio::select! {
            outcome = wait_once(client, name, ours, permits, limit) => outcome,
            () = session.clock.lost_token().cancelled() => return Err(Error::lost(name)),
        };
        match outcome {
            Ok(Some(token)) => return Ok(token),
            Ok(None) => backoff = Backoff::new(),
            Err(e) if e.is_lost() || matches!(e, Error::PermitsMismatch { .. }) => return Err(e),
            Err(e) => {
                tracing::warn!(lock = %name, error = %e, "etcd: waiting for a permit failed; retrying");
                if !backoff.pause_unless(session.clock.lost_token()).await {
                    return Err(Error::lost(name));
                }
            }
        }
    }
}

/// One count under a fresh watch: the token if a permit is free, `None` after a delete (or a
/// cancelled watch).
async fn wait_once(
    client: &Client,
    name: &LockName,
    ours: Ours<'_>,
    permits: u32,
    limit: Duration,
) -> Result<Option<i64>> {
    let permit = ours.permit;
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut]);
    let mut watches = client.watch_client();
    let mut stream = watches
        .watch(permit.prefix.as_str(), Some(options))
        .await
        .map_err(|e| crate::etcd_error("watch the permit keys", e))?;
    // Ends on a delete, a cancellation, or the stream's end.
    loop {
        let Some(resp) = stream
            .message()
            .await
            .map_err(|e| crate::etcd_error("watch the permit keys", e))?
        else {
            return Err(Error::unavailable(
                crate::KIND,
                "the permit watch ended",
                None,
            ));
        };
        if resp.created() {
            let counted = count(client, name, ours, limit).await?;
            if counted.admits(name, permits)? {
                return Ok(Some(counted.revision));
            }
        }
        if resp.canceled()
            || resp
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
        {
            return Ok(None);
        }
    }
}

/// Withdraws the permit key of an attempt that did not end in a guard. The key is unique to the
/// attempt, so an unconditional delete can only remove this attempt's key.
pub(crate) struct Unpermit {
    pub(crate) client: std::sync::Arc<Client>,
    pub(crate) session: std::sync::Arc<Session>,
    pub(crate) key: String,
    pub(crate) limit: Duration,
}

impl Withdraw<Counted> for Unpermit {
    const BACKEND: &'static str = crate::KIND;

    async fn withdraw(&mut self, _first: Option<&Counted>) -> Result<()> {
        let txn = Txn::new().and_then([TxnOp::delete(self.key.as_str(), None)]);
        txn_call("withdraw a permit key", &self.client, txn, self.limit)
            .await
            .map(drop)
    }

    fn session_alive(&self) -> bool {
        self.session.is_live()
    }
}

/// The semaphore's gate key: what our [`Queued`] names.
pub(crate) fn gate(queued: &Queued) -> (String, i64) {
    (queued.key.clone(), queued.created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_carries_the_count_and_the_owner() {
        let owner = fencelock::Owner::current().with_label("w1").unwrap();
        let value = permit_value(3, &owner.encode());
        assert_eq!(stored_permits(value.as_bytes()), Some(3));
        assert!(queued_at(value.as_bytes()).is_some());
        assert_eq!(fencelock::Owner::decode(value.as_bytes()), Some(owner));
        assert_eq!(stored_permits(b"1733000000000-00ab fencelock/1"), None);
    }
}
