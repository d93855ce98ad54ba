//! The lock protocol, wire-compatible with Go's `concurrency.Mutex` (and so `etcdctl lock`).
//!
//! Acquire (one Txn when uncontended):
//! ```text
//! If   create_revision(P N / lease) == 0
//! Then Put(P N / lease, "", lease), Range(P N /, sort CREATE ASCEND, limit 1), Get(checkpoint)
//! Else Get(P N / lease)
//! ```
//! The token is the Txn's header revision, which is our key's create revision. We own the lock
//! when the owner Range returns our key. Otherwise we wait for the key created just before ours
//! (`Range(P N /, sort CREATE DESCEND, limit 1, max_create_revision = token - 1)`) to be
//! deleted, with one watch on that one key, repeat until no older key is left, and confirm with
//! one Txn that our key still exists (`create_revision == token`) while reading the checkpoint.
//!
//! The Else branch means a key of this session from an earlier acquisition is still there
//! (a release that failed). Go would reuse it, but its revision is an old token, so we delete it
//! (owner-checked) and retry: tokens must grow on every acquisition.
//!
//! Release is one Txn: `If create_revision(key) == token Then Delete(key)`.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use fencelock::{LockName, Result, StateKey};

use crate::call;
use crate::keys::Keys;
use crate::session::{lost_error, Session};

/// The outcome of the first acquire Txn.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) key: String,
    pub(crate) token: i64,
    pub(crate) owner: bool,
    pub(crate) checkpoint: Option<Vec<u8>>,
}

/// Puts our key in the queue; tells whether we already own the lock.
pub(crate) async fn enqueue(
    client: &Client,
    keys: &Keys,
    name: &LockName,
    session: &Session,
    limit: Duration,
) -> Result<Queued> {
    let key = keys.lock_key(name, session.lease);
    let prefix = keys.lock_prefix(name);
    let checkpoint_key = keys.state_key(name, &StateKey::checkpoint());
    // At most one leftover key of ours can be in the way; the second pass always creates.
    for _ in 0..3 {
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    unix_millis().to_string(),
                    Some(PutOptions::new().with_lease(session.lease)),
                ),
                TxnOp::get(prefix.as_str(), Some(first_created())),
                TxnOp::get(checkpoint_key.as_str(), None),
            ])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = txn_call("enqueue for the lock", client, txn, limit).await?;
        if !resp.succeeded() {
            let stale = first_kv(&resp, 0).map(|kv| kv.0);
            if let Some(stale) = stale {
                tracing::debug!(lock = %name, stale, "etcd: deleting a leftover key of this session");
                delete_if_created(client, &key, stale, limit).await?;
            }
            continue;
        }
        let token = resp.header().map_or(0, |h| h.revision());
        let owner = first_kv(&resp, 1).is_none_or(|(rev, _)| rev == token);
        let checkpoint = first_kv(&resp, 2).map(|(_, value)| value);
        return Ok(Queued {
            key,
            token,
            owner,
            checkpoint,
        });
    }
    Err(fencelock::Error::backend(
        crate::KIND,
        format!("enqueue for lock `{name}`: our key {key} keeps reappearing; is another process using this session's lease?"),
        "leftover key",
    ))
}

/// Waits until every key created before ours under the lock's prefix is gone, watching only the
/// one just before ours each time; then confirms our key is still there and reads the checkpoint.
pub(crate) async fn wait_for_turn(
    client: &Client,
    keys: &Keys,
    name: &LockName,
    queued: &Queued,
    session: &Session,
    limit: Duration,
) -> Result<Option<Vec<u8>>> {
    let prefix = keys.lock_prefix(name);
    let older = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_max_create_revision(queued.token - 1);
    // Each pass waits out one predecessor; a failed watch is retried after a pause, and the
    // session's end (at most one TTL after the cluster stops answering) ends the loop.
    loop {
        if !session.is_live() {
            return Err(lost_error(name));
        }
        let range = call("look for older contenders", limit, {
            let (mut client, prefix, older) = (client.clone(), prefix.clone(), older.clone());
            async move { client.get(prefix, Some(older)).await }
        })
        .await;
        let range = match range {
            Ok(range) => range,
            Err(e) => {
                tracing::warn!(lock = %name, error = %e, "etcd: range failed while waiting; retrying");
                pause_or_lost(session, name).await?;
                continue;
            }
        };
        let Some(predecessor) = range.kvs().first() else {
            break;
        };
        let revision = range.header().map_or(0, |h| h.revision());
        let predecessor = predecessor.key().to_vec();
        tokio::select! {
            watched = watch_delete(client, predecessor, revision) => {
                if let Err(e) = watched {
                    tracing::warn!(lock = %name, error = %e, "etcd: watch failed while waiting; retrying");
                    pause_or_lost(session, name).await?;
                }
            }
            () = session.clock.lost_token().cancelled() => return Err(lost_error(name)),
        }
    }
    // Go added this check after Jepsen (etcd#11456): an expired session's key is gone.
    let txn = Txn::new()
        .when([Compare::create_revision(
            queued.key.as_str(),
            CompareOp::Equal,
            queued.token,
        )])
        .and_then([TxnOp::get(
            keys.state_key(name, &StateKey::checkpoint()),
            None,
        )]);
    let resp = txn_call("confirm the lock after waiting", client, txn, limit).await?;
    if !resp.succeeded() {
        return Err(lost_error(name));
    }
    Ok(first_kv(&resp, 0).map(|(_, value)| value))
}

async fn pause_or_lost(session: &Session, name: &LockName) -> Result<()> {
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(200)) => Ok(()),
        () = session.clock.lost_token().cancelled() => Err(lost_error(name)),
    }
}

/// Resolves when `key`, which a Range saw alive at `revision`, is deleted, or when the watch
/// cannot tell (the revision was compacted, the watch was cancelled): the caller then looks
/// again.
///
/// The watch starts at `revision + 1`, not at `revision` as Go's `waitDelete` does: etcd serves a
/// watch that starts at or before its current revision from a background pass every 100 ms
/// ("unsynced"), which the benchmark showed as 100 ms handoffs. If the store moved on between
/// the Range and the watch's creation, the watch is unsynced anyway, so the key is looked up
/// once: a delete in that gap is seen at once instead of at the next pass.
async fn watch_delete(
    client: &Client,
    key: Vec<u8>,
    revision: i64,
) -> Result<(), etcd_client::Error> {
    let mut client = client.clone();
    let mut stream = client
        .watch(
            key.clone(),
            Some(WatchOptions::new().with_start_revision(revision + 1)),
        )
        .await?;
    // Ends on a delete, a cancellation, or the stream's end.
    while let Some(resp) = stream.message().await? {
        if resp.created() && resp.header().is_some_and(|h| h.revision() > revision) {
            let now = client
                .get(key.clone(), Some(GetOptions::new().with_count_only()))
                .await?;
            if now.count() == 0 {
                return Ok(());
            }
        }
        if resp.canceled() || resp.compact_revision() != 0 {
            tracing::debug!(
                reason = resp.cancel_reason(),
                compact = resp.compact_revision(),
                "etcd: watch cancelled; looking again"
            );
            return Ok(());
        }
        if resp
            .events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete)
        {
            return Ok(());
        }
    }
    Err(etcd_client::Error::WatchError("watch stream ended".into()))
}

/// Deletes `key` only if its create revision is `token`; true if it did.
pub(crate) async fn delete_if_created(
    client: &Client,
    key: &str,
    token: i64,
    limit: Duration,
) -> Result<bool> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, token)])
        .and_then([TxnOp::delete(key, None)]);
    Ok(txn_call("release the lock", client, txn, limit)
        .await?
        .succeeded())
}

/// How long one attempt of a retried request may take: short enough that a request stuck on a
/// dead leader is abandoned well within the request budget.
pub(crate) fn attempt_limit(request_timeout: Duration, ttl: Duration) -> Duration {
    request_timeout.min((ttl / 3).max(Duration::from_millis(500)))
}

/// Owner-checked delete, retried within `budget`. During a leader change a single request can
/// hang until the server gives up on it; the compare makes every retry safe.
pub(crate) async fn release_key(
    client: &Client,
    key: &str,
    token: i64,
    attempt: Duration,
    budget: Duration,
) -> Result<bool> {
    let start = tokio::time::Instant::now();
    // Bounded by `budget`.
    loop {
        match delete_if_created(client, key, token, attempt).await {
            Ok(done) => return Ok(done),
            Err(e) if start.elapsed() + RETRY_PAUSE >= budget => return Err(e),
            Err(e) => {
                tracing::debug!(%key, error = %e, "etcd: release attempt failed; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

const RETRY_PAUSE: Duration = Duration::from_millis(200);

pub(crate) async fn txn_call(
    what: &str,
    client: &Client,
    txn: Txn,
    limit: Duration,
) -> Result<TxnResponse> {
    let mut client = client.clone();
    call(what, limit, async move { client.txn(txn).await }).await
}

fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The first key of the `i`th Range in a Txn response: (create revision, value).
pub(crate) fn first_kv(resp: &TxnResponse, i: usize) -> Option<(i64, Vec<u8>)> {
    match resp.op_responses().into_iter().nth(i)? {
        TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .map(|kv| (kv.create_revision(), kv.value().to_vec())),
        _ => None,
    }
}

/// Written as our key's value: when we queued, for `status` (Go's Mutex and etcdctl ignore it).
pub(crate) fn unix_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
