//! The store half of an etcd lock: owner-checked release and fenced state.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use fencelock::raw::{keep_retrying, HeldLock, SharedTurn};
use fencelock::{Error, FencingToken, LockName, ReleaseOutcome, Result, StateKey};

use crate::keys::Keys;
use crate::mutex::{attempt_limit, delete_if_created, release_key, txn_call};
use crate::session::Session;

/// Every operation is one Txn conditioned on `create_revision(our key) == created`: true exactly
/// while our key, from this acquisition, exists, which is exactly while we hold the lock (keys
/// created later cannot get ahead of ours).
pub(crate) struct EtcdHeld {
    pub(crate) client: Arc<Client>,
    pub(crate) keys: Keys,
    pub(crate) name: LockName,
    /// Shared with the session's watch on it: one copy per held lock.
    pub(crate) key: Arc<str>,
    /// Our key's create revision, which every request compares.
    pub(crate) created: i64,
    /// The grant's fencing token (the revision of the grant; see `mutex::Granted`).
    pub(crate) token: FencingToken,
    pub(crate) limit: Duration,
    pub(crate) ttl: Duration,
    /// The session's lease, which a proclaimed value is put with (as the key was).
    pub(crate) lease: i64,
    /// Keeps the session (and its lease) alive while the guard lives.
    pub(crate) session: Arc<Session>,
    /// This session's turn on the name, shared with the session's watch on the key: it ends
    /// when the watch sees the key deleted (an operator's break) or when this is dropped
    /// (the release done, or a failed one handed to `keep_releasing`, whose key the next
    /// enqueue deletes as a leftover), whichever is first. `None` for a permit: an instance
    /// may hold several permits of one semaphore.
    pub(crate) turn: Option<SharedTurn>,
}

/// The release is done (or a failed one handed to the background, which deletes only this
/// key): the next task of the session may queue, even while the watch on the key has not seen
/// it go. [`SharedTurn`] does not end itself on a drop, so this half must.
impl Drop for EtcdHeld {
    fn drop(&mut self) {
        if let Some(turn) = &self.turn {
            turn.end();
        }
    }
}

impl EtcdHeld {
    /// A key left behind blocks every other contender until our session ends, so a release that
    /// failed goes on in the background while the session lives (like Curator's guaranteed
    /// delete). The compare on the token keeps it from touching a later key of ours.
    fn keep_releasing(&self) {
        let (client, key, token, session) = (
            Arc::clone(&self.client),
            self.key.clone(),
            self.created,
            Arc::clone(&self.session),
        );
        let attempt = attempt_limit(self.limit, self.ttl);
        tracing::warn!(key = %self.key, "etcd: release failed; retrying in the background while the session lives");
        keep_retrying(crate::KIND, format!("release {key}"), session, move |_| {
            let (client, key) = (Arc::clone(&client), key.clone());
            async move {
                delete_if_created(&client, &key, token, attempt)
                    .await
                    .map(drop)
            }
        });
    }

    async fn fenced(&self, what: &str, op: TxnOp) -> Result<Option<TxnOpResponse>> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_bytes(),
                CompareOp::Equal,
                self.created,
            )])
            .and_then([op]);
        // One attempt, never retried here: a request stuck on a dead leader is abandoned within
        // min(request timeout, TTL/3) and reported, and a write whose reply was lost is applied
        // at most once (a caller's retry is a fresh compare on the token).
        let attempt = attempt_limit(self.limit, self.ttl);
        let resp = txn_call(what, &self.client, txn, attempt).await?;
        if !resp.succeeded() {
            return Err(Error::not_held(&self.name, self.token));
        }
        Ok(resp.op_responses().into_iter().next())
    }
}

impl std::fmt::Debug for EtcdHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdHeld")
            .field("key", &self.key)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl HeldLock for EtcdHeld {
    async fn release(&self) -> Result<ReleaseOutcome> {
        let attempt = attempt_limit(self.limit, self.ttl);
        let released =
            match release_key(&self.client, &self.key, self.created, attempt, self.limit).await {
                Ok(released) => released,
                Err(e) => {
                    self.keep_releasing();
                    return Err(e);
                }
            };
        tracing::info!(lock = %self.name, token = %self.token, released, "etcd: release");
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwned
        })
    }

    async fn put_state(&self, key: &StateKey, value: &[u8]) -> Result<()> {
        let op = TxnOp::put(self.keys.state_key(&self.name, key), value, None);
        self.fenced("fenced put", op).await.map(drop)
    }

    async fn get_state(&self, key: &StateKey) -> Result<Option<Vec<u8>>> {
        let op = TxnOp::get(self.keys.state_key(&self.name, key), None);
        Ok(match self.fenced("fenced get", op).await? {
            Some(TxnOpResponse::Get(got)) => got.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
    }

    async fn delete_state(&self, key: &StateKey) -> Result<bool> {
        let op = TxnOp::delete(self.keys.state_key(&self.name, key), None);
        Ok(match self.fenced("fenced delete", op).await? {
            Some(TxnOpResponse::Delete(deleted)) => deleted.deleted() > 0,
            _ => false,
        })
    }

    async fn set_value(&self, value: &[u8]) -> Result<()> {
        // As Go's `Election.Proclaim`: a put of our own key, with its lease, if it is still ours.
        let op = TxnOp::put(
            self.key.as_bytes(),
            value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        self.fenced("proclaim", op).await.map(drop)
    }

    fn release_in_background(self: Box<Self>) {
        // A withdrawal (review F12); `self` is dropped when the release is done, which ends
        // the instance's turn on the name if the key's watch has not already.
        let (session, name) = (Arc::clone(&self.session), self.name.clone());
        session
            .withdrawals
            .release_in_background(crate::KIND, &name, async move {
                // A failed release goes on in `keep_releasing`; this only reports it.
                if let Err(e) = self.release().await {
                    tracing::warn!(lock = %self.name, error = %e, "etcd: background release failed; retrying while the session lives");
                }
            });
    }
}
