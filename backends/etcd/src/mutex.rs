//! The lock protocol, wire-compatible with Go's `concurrency.Mutex` (and so `etcdctl lock`):
//! every request the etcd lock sends is built here. The crate docs describe the protocol and
//! its request counts, once; the comments here say why each step is as it is.

use std::fmt::Write as _;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use fencelock::raw::{Backoff, Budget, Live, Withdraw};
use fencelock::{Error, LockName, Result};
use tokio::sync::OwnedMutexGuard;

use crate::call;
use crate::keys::QueueAt;
use crate::session::Session;

/// The outcome of the first acquire Txn.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) key: String,
    /// Our key's create revision: what every later request compares to know it is still ours.
    pub(crate) created: i64,
    pub(crate) owner: bool,
    pub(crate) checkpoint: Option<Vec<u8>>,
    /// The key created just before ours, and its create revision, when at least two keys are
    /// ahead of ours: the enqueue's own Range names it, so the wait watches it without looking
    /// first.
    pub(crate) predecessor: Option<(Vec<u8>, i64)>,
}

/// A granted acquire: the token is the revision at which the grant was seen, which is what
/// `etcdctl lock` exports (`Mutex.Header().Revision`). A waiter's key was created long before
/// its turn, so its create revision can be lower than the token of a holder that queued later
/// and was granted first through another client; the grant revision cannot: it is above the
/// revision at which the predecessor's key was deleted, and so above the predecessor's token.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) token: i64,
    pub(crate) checkpoint: Option<Vec<u8>>,
}

/// Puts our key in the queue, with `value` (a lock's is unique to this attempt; a candidate's
/// is what it publishes); tells whether we already own the lock.
pub(crate) async fn enqueue(
    client: &Client,
    at: &QueueAt,
    name: &LockName,
    session: &Session,
    value: &[u8],
    limit: Duration,
) -> Result<Queued> {
    let (key, prefix, checkpoint_key) = (at.key.clone(), &at.prefix, &at.checkpoint);
    // At most one leftover key of ours can be in the way; the second pass always creates.
    for _ in 0..3 {
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    value.to_vec(),
                    Some(PutOptions::new().with_lease(session.lease)),
                ),
                TxnOp::get(prefix.as_str(), Some(newest_two())),
                TxnOp::get(checkpoint_key.as_str(), None),
            ])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = txn_call("enqueue for the lock", client, txn, limit).await?;
        // Taken once: etcd-client copies every response (keys and values) on each call.
        let ops = resp.op_responses();
        if !resp.succeeded() {
            let stale = first_kv(&ops, 0).map(|kv| kv.0);
            if let Some(stale) = stale {
                tracing::debug!(lock = %name, stale, "etcd: deleting a leftover key of this session");
                delete_if_created(client, &key, stale, limit).await?;
            }
            continue;
        }
        // Fail closed: a reply without its revision or its owner Range grants nothing.
        let created = revision(&resp, "enqueue for the lock")?;
        // A reader's scan range holds only writers; everyone else's holds their own key too.
        let ours_scanned = key.starts_with(prefix.as_str());
        // Fail closed: no Range, or a Range without the key just put, grants nothing.
        let no_owner_key = || {
            Error::protocol(
                crate::KIND,
                format!(
                    "enqueue for lock `{name}`: the reply has no owner key (ours was just put)"
                ),
            )
        };
        let Some(TxnOpResponse::Get(range)) = ops.get(1) else {
            return Err(no_owner_key());
        };
        // The Range counts every key under the prefix (ours included, if it is there) in the
        // same transaction as our put: the queue ahead of us, exactly.
        let ahead = range.count().saturating_sub(i64::from(ours_scanned));
        fencelock::telemetry::record_queue_ahead(crate::KIND, usize::try_from(ahead).unwrap_or(0));
        // Newest first, and ours is the newest key: it comes first, then the key just before
        // it, if any. A reader's range holds writers only, so its first key is the one before.
        let mut newest = range.kvs().iter();
        if ours_scanned && newest.next().map(|kv| kv.create_revision()) != Some(created) {
            return Err(no_owner_key());
        }
        // We own the lock exactly when no key is older than ours.
        let just_before = newest
            .next()
            .map(|kv| (kv.key().to_vec(), kv.create_revision()));
        let owner = just_before.is_none();
        // With one key ahead, that is the holder, who may be gone before a watch would exist
        // (a short hold): the wait's first look is then the grant, one request where the watch
        // costs four. Further back, the key just before ours is a waiter, who holds before it
        // leaves: it is watched at once.
        let predecessor = just_before.filter(|_| ahead >= 2);
        let checkpoint = first_kv(&ops, 2).map(|(_, value)| value);
        return Ok(Queued {
            key,
            created,
            owner,
            checkpoint,
            predecessor,
        });
    }
    Err(Error::protocol(
        crate::KIND,
        format!("enqueue for lock `{name}`: our key {key} keeps reappearing; is another process using this session's lease?"),
    ))
}

/// Waits until every key created before ours under the lock's prefix is gone, watching only the
/// one just before ours each time; returns the checkpoint.
///
/// Each pass is one Txn that both confirms our key (Go added that check after Jepsen,
/// etcd#11456: an expired session's key is gone) and looks for the key just before ours, and
/// reads the checkpoint: when no older key is left, that one request is the grant. Go spends two
/// (a Range, then a Get of its key) after every predecessor's delete. Behind two keys or more,
/// the first predecessor needs no look: the enqueue's Range named it (Go looks for it with a
/// Range of its own).
pub(crate) async fn wait_for_turn(
    client: &Client,
    at: &QueueAt,
    name: &LockName,
    queued: &Queued,
    session: &Session,
    limit: Duration,
) -> Result<Granted> {
    let prefix = &at.prefix;
    let older = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_max_create_revision(queued.created - 1);
    let checkpoint = &at.checkpoint;
    // Each pass waits out one predecessor; a failed request is retried after a pause that grows
    // while requests keep failing (no retry storm against a struggling cluster), and the
    // session's end (at most one TTL after the cluster stops answering) ends the loop.
    let mut backoff = Backoff::new();
    // The look this saves would also confirm our key; the pass after the watch does that
    // anyway, before any grant.
    let mut known = queued.predecessor.clone();
    loop {
        if !session.is_live() {
            return Err(Error::lost(name));
        }
        if let Some((key, created)) = known.take() {
            tokio::select! {
                watched = watch_delete(client, key, created) => match watched {
                    // The predecessor went: progress, so the next failure pauses briefly again.
                    Ok(()) => backoff = Backoff::new(),
                    Err(e) => {
                        tracing::warn!(lock = %name, error = %e, "etcd: watch failed while waiting; retrying");
                        pause_or_lost(&mut backoff, session, name).await?;
                    }
                },
                () = session.clock.lost_token().cancelled() => return Err(Error::lost(name)),
            }
            continue;
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                queued.key.as_str(),
                CompareOp::Equal,
                queued.created,
            )])
            .and_then([
                TxnOp::get(prefix.as_str(), Some(older.clone())),
                TxnOp::get(checkpoint.as_str(), None),
            ]);
        let resp = match txn_call("look for older contenders", client, txn, limit).await {
            Ok(resp) => resp,
            Err(e) => {
                tracing::warn!(lock = %name, error = %e, "etcd: looking for older contenders failed; retrying");
                pause_or_lost(&mut backoff, session, name).await?;
                continue;
            }
        };
        if !resp.succeeded() {
            return Err(Error::lost(name));
        }
        let ops = resp.op_responses();
        // Fail closed: only a Range that came back empty means no older contender.
        let predecessor = match ops.first() {
            Some(TxnOpResponse::Get(range)) => range
                .kvs()
                .first()
                .map(|kv| (kv.key().to_vec(), kv.create_revision())),
            other => {
                return Err(Error::protocol(
                    crate::KIND,
                    format!("look for older contenders: unexpected reply {other:?}"),
                ))
            }
        };
        if predecessor.is_none() {
            return Ok(Granted {
                token: revision(&resp, "look for older contenders")?,
                checkpoint: first_kv(&ops, 1).map(|(_, value)| value),
            });
        }
        known = predecessor;
    }
}

async fn pause_or_lost(backoff: &mut Backoff, session: &Session, name: &LockName) -> Result<()> {
    if backoff.pause_unless(session.clock.lost_token()).await {
        Ok(())
    } else {
        Err(Error::lost(name))
    }
}

/// Resolves when the incarnation of `key` created at `created` is deleted, or when the watch
/// cannot tell (it was cancelled): the caller then looks again.
///
/// etcd serves a watch that starts at or before its current revision from a background pass
/// every 100 ms ("unsynced"); only a watch that starts after it gets events at once. Go's
/// `waitDelete` watches from the Range's revision, which under contention is nearly always
/// behind by then: the benchmark showed handoffs of 100 ms. So:
/// - we watch from "now", and look the key up once the watch exists, to cover a delete that
///   landed before it. The lookup compares the create revision, not mere existence: the key is
///   named after its owner's lease, so a predecessor that released and queued again has a key of
///   the same name, and taking that for the old one would make us wait for a contender queued
///   behind us.
/// - we register the same watch twice on one stream. etcd 3.4 reads "now" before it takes the
///   store's lock to register a watch; a write that holds the lock in between makes that watch
///   unsynced after all (seen in the benchmark as the slowest 2% of handoffs: events arriving
///   together up to 100 ms late, always with the lookup's revision above the created one). The
///   server handles the second request right after the first, so both are rarely unlucky.
async fn watch_delete(
    client: &Client,
    key: Vec<u8>,
    created: i64,
) -> Result<(), etcd_client::Error> {
    let (mut watches, mut kv) = (client.watch_client(), client.kv_client());
    let mut stream = watches.watch(key.clone(), None).await?;
    stream.watch(key.clone(), None).await?;
    let mut registered = 0;
    // Ends on a delete, a cancellation, or the stream's end.
    while let Some(resp) = stream.message().await? {
        if resp.created() {
            registered += 1;
            // Both watches now see every later write; anything earlier, the lookup sees.
            if registered == 2 {
                let now = kv.get(key.clone(), None).await?;
                if now
                    .kvs()
                    .first()
                    .is_none_or(|kv| kv.create_revision() != created)
                {
                    return Ok(());
                }
            }
        }
        if resp.canceled() {
            tracing::debug!(
                reason = resp.cancel_reason(),
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

/// Withdraws the key of an acquire that did not end in a guard ([`fencelock::raw::Enqueued`]).
///
/// With the enqueue's reply, the delete compares the key's create revision, so it can only
/// remove *this* attempt's key. Without one (the enqueue failed: its Put may or may not have
/// landed), a lock's delete compares the attempt's unique value; a candidate's value is the
/// user's and need not be unique, so its withdrawal first reads the key and deletes that
/// incarnation by create revision. Both are safe because this session's turn on the name is
/// held here until the withdrawal is done, so no later key of ours can exist yet, and a late
/// retry of either delete can only hit this attempt's key.
pub(crate) struct Unqueue {
    pub(crate) client: std::sync::Arc<Client>,
    pub(crate) session: std::sync::Arc<Session>,
    pub(crate) key: String,
    /// The value this attempt's enqueue writes, if it is unique to the attempt
    /// ([`attempt_value`]); `None` for a candidate.
    pub(crate) value: Option<String>,
    pub(crate) limit: Duration,
    /// This session's turn on the name (`None` for an entry whose key is unique to the attempt,
    /// which needs none).
    pub(crate) turn: Option<OwnedMutexGuard<()>>,
}

impl Withdraw<Queued> for Unqueue {
    const BACKEND: &'static str = crate::KIND;

    async fn withdraw(&mut self, first: Option<&Queued>) -> Result<()> {
        let key = self.key.as_str();
        let compare = match (first, &self.value) {
            (Some(queued), _) => Compare::create_revision(key, CompareOp::Equal, queued.created),
            // The value is unique to this attempt: a retry of this withdrawal that lands late
            // cannot delete a later key of ours (the lease would match that one too).
            (None, Some(value)) => Compare::value(key, CompareOp::Equal, value.as_str()),
            (None, None) => {
                let mut kv = self.client.kv_client();
                let now = call("read a cancelled candidate's key", self.limit, async move {
                    kv.get(key, None).await
                })
                .await?;
                let Some(created) = now.kvs().first().map(|kv| kv.create_revision()) else {
                    return Ok(()); // the Put never landed
                };
                Compare::create_revision(key, CompareOp::Equal, created)
            }
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::delete(key, None)]);
        // Deleted, or the compare failed (nothing of this attempt there): both are definite.
        txn_call(
            "withdraw a cancelled acquire",
            &self.client,
            txn,
            self.limit,
        )
        .await
        .map(drop)
    }

    fn session_alive(&self) -> bool {
        self.session.is_live()
    }
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

/// Owner-checked delete, retried within `budget`; true if it deleted the key (or an attempt
/// whose reply was lost may have). During a leader change a single request can hang until the
/// server gives up on it; the compare makes every retry safe.
pub(crate) async fn release_key(
    client: &Client,
    key: &str,
    token: i64,
    attempt: Duration,
    budget: Duration,
) -> Result<bool> {
    let budget = Budget::start(budget);
    // Whether an earlier attempt may have deleted the key without our hearing of it.
    let mut maybe_applied = false;
    // Bounded by `budget`.
    loop {
        match delete_if_created(client, key, token, budget.attempt(attempt)).await {
            // After a lost reply, a key found gone is most likely gone by our own delete: it
            // was ours when that attempt was sent (review F12). The compare on the create
            // revision means no attempt can have deleted anyone else's key.
            Ok(done) => return Ok(done || maybe_applied),
            Err(e) if !budget.allows_retry_after(RETRY_PAUSE) => return Err(e),
            Err(e) => {
                tracing::debug!(%key, error = %e, "etcd: release attempt failed; retrying");
                maybe_applied = true;
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
    // The KV client alone: a whole `Client` is eight gRPC clients to clone and drop.
    let mut kv = client.kv_client();
    // Boxed: the gRPC call's future is several KB, and unboxed it was copied into each future
    // that awaits it on the way up (14 copies per acquire + release; callgrind).
    call(what, limit, Box::pin(async move { kv.txn(txn).await })).await
}

/// The enqueue's Range: our key (the newest) and the one created just before it. etcd reads the
/// whole prefix for any sorted Range, so this costs what Go's "first created" Range costs.
fn newest_two() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2)
}

/// The first key of the `i`th Range of a Txn's responses: (create revision, value).
pub(crate) fn first_kv(ops: &[TxnOpResponse], i: usize) -> Option<(i64, Vec<u8>)> {
    match ops.get(i)? {
        TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .map(|kv| (kv.create_revision(), kv.value().to_vec())),
        _ => None,
    }
}

/// The revision in a Txn's header.
fn revision(resp: &TxnResponse, what: &str) -> Result<i64> {
    resp.header()
        .map(|h| h.revision())
        .filter(|r| *r > 0)
        .ok_or_else(|| Error::protocol(crate::KIND, format!("{what}: the reply has no revision")))
}

/// Our key's value: `<unix millis>-<nonce> <owner>`. The millis say when we queued, for
/// `status`; the nonce makes the value unique to this attempt, for a withdrawal that does not
/// know the key's create revision; the owner says who queued ([`fencelock::Owner::encode`],
/// encoded once per backend). Go's Mutex and etcdctl ignore the value; the key's put carries
/// it, so it costs no request.
pub(crate) fn attempt_value(owner: &str) -> String {
    // Sized up front: the owner is long, and `format!` grew its buffer several times.
    let mut value = String::with_capacity(owner.len() + 64);
    // Writing to a String cannot fail.
    let _ = write!(value, "{}-{:016x} {}", unix_millis(), nonce(), owner);
    value
}

/// A number no other attempt of this process (or, with overwhelming odds, any other) draws.
pub(crate) fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut nonce = std::collections::hash_map::RandomState::new().build_hasher();
    nonce.write_u128(unix_millis());
    nonce.finish()
}

/// The millis part of a value written by [`attempt_value`] (or by older versions: millis only).
pub(crate) fn queued_at(value: &[u8]) -> Option<u128> {
    let text = std::str::from_utf8(value).ok()?;
    text.split('-').next()?.parse().ok()
}

pub(crate) fn unix_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use fencelock_testsupport::{unique, EtcdCluster};

    use super::*;

    /// A predecessor that released and queued again before our watch existed has a key of the
    /// same name: the old incarnation is gone and the wait must end, not last until the new one
    /// (queued behind us) leaves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_requeued_predecessor_counts_as_gone() {
        let cluster = EtcdCluster::start(1);
        let mut client = Client::connect(cluster.endpoints(), None).await.unwrap();
        let key = format!("{}/job/694d", unique("wd"));
        let old = client.put(key.as_str(), "", None).await.unwrap();
        let created = old.header().unwrap().revision();
        client.delete(key.as_str(), None).await.unwrap();
        client.put(key.as_str(), "", None).await.unwrap();
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            watch_delete(&client, key.into_bytes(), created),
        )
        .await;
        assert!(
            matches!(waited, Ok(Ok(()))),
            "the wait took the requeued key for the old one: {waited:?}"
        );
    }
}
