//! The store half of an etcd lock: owner-checked release and fenced state.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use fencelock::{Error, FencingToken, HeldLock, LockName, ReleaseOutcome, Result, StateKey};
use tokio::sync::OwnedMutexGuard;

use crate::keys::Keys;
use crate::mutex::{delete_if_created, txn_call};
use crate::session::Session;

/// Every operation is one Txn conditioned on `create_revision(our key) == token`: true exactly
/// while our key, from this acquisition, exists, which is exactly while we hold the lock (keys
/// created later cannot get ahead of ours).
pub(crate) struct EtcdHeld {
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    pub(crate) name: LockName,
    pub(crate) key: String,
    pub(crate) token: i64,
    pub(crate) limit: Duration,
    /// Keeps the session (and its lease) alive while the guard lives.
    pub(crate) _session: Arc<Session>,
    /// This session's turn on the name, held until the release is done.
    pub(crate) _turn: OwnedMutexGuard<()>,
}

impl EtcdHeld {
    async fn fenced(&self, what: &str, op: TxnOp) -> Result<Option<TxnOpResponse>> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.token,
            )])
            .and_then([op]);
        let resp = txn_call(what, &self.client, txn, self.limit).await?;
        if !resp.succeeded() {
            return Err(Error::NotHeld {
                name: self.name.to_string(),
                token: FencingToken::new(self.token.unsigned_abs()),
            });
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
        let released = delete_if_created(&self.client, &self.key, self.token, self.limit).await?;
        tracing::info!(lock = %self.name, token = self.token, released, "etcd: release");
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

    fn release_in_background(self: Box<Self>) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                if let Err(e) = self.release().await {
                    tracing::warn!(lock = %self.name, error = %e, "etcd: background release failed; the lease will end the lock");
                }
            })),
            Err(_) => tracing::warn!(lock = %self.name, "etcd: guard dropped outside a Tokio runtime; the lock ends with its lease"),
        }
    }
}
