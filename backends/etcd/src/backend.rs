//! [`EtcdBackend`]: sessions, local turns, and the acquire flow.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, SortOrder,
    SortTarget, TlsOptions, Txn, TxnOp,
};
use fencelock::{Error, FencingToken, LockBackend, LockGuard, LockName, LockStatus, Result, Wait};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use tokio::task::JoinHandle;

use crate::held::EtcdHeld;
use crate::keys::Keys;
use crate::mutex::{self, Queued};
use crate::session::{lost_error, Session};
use crate::{call, EtcdConfig, KIND};

/// A [`LockBackend`] on an etcd cluster.
///
/// One instance is one client session: one lease, granted on the first acquire, kept alive by
/// the instance at TTL/3 and shared by all its locks; when it is lost, every guard of the
/// session fires `lost` and the next acquire starts a new lease. Separate instances contend like
/// separate processes. Locks are compatible with Go's `concurrency.Mutex` and `etcdctl lock`
/// (see the crate docs for the key layout).
///
/// Round trips: an uncontended acquire with a live session is one Txn (the first acquire of a
/// session adds one lease grant); a contended acquire adds, per predecessor, one Txn that finds
/// it (and confirms our key), one Watch stream on its key (two registrations, see the mutex
/// module) and one Get of that key once the watch exists, then one last such Txn, which finds
/// no older key and is the grant; release is one Txn; each fenced operation is one Txn.
pub struct EtcdBackend {
    /// Shared: the client is 3.5 KB by value, and every held lock keeps a handle.
    client: Arc<Client>,
    config: EtcdConfig,
    keys: Keys,
    session: AsyncMutex<Option<Arc<Session>>>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the cluster and checks that it answers (and that the credentials work).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for bad settings; [`Error::Backend`] when no endpoint answers
    /// within `connect_timeout` or authentication fails.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is written to etcd.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            // etcd answers pings more often than every 5 s (its default
            // --grpc-keepalive-min-time) with GOAWAY.
            .with_keep_alive(
                Duration::from_secs(5).max(config.ttl / 3),
                config.request_timeout,
            )
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            // etcd's auth tokens expire (5 min by default); a lock service runs for days.
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        if let Some(tls) = &config.tls {
            let mut tls_options =
                TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.client_cert_pem {
                tls_options = tls_options.identity(Identity::from_pem(cert, key));
            }
            if let Some(domain) = &tls.domain {
                tls_options = tls_options.domain_name(domain.clone());
            }
            options = options.with_tls(tls_options);
        }
        let reach = format!(
            "connect to {:?} (check that etcd runs there, the endpoints, credentials and TLS settings)",
            config.endpoints
        );
        let client = call(
            &reach,
            config.connect_timeout,
            Client::connect(&config.endpoints, Some(options)),
        )
        .await?;
        let probe = GetOptions::new().with_count_only();
        call(&reach, config.connect_timeout, {
            let (mut client, prefix) = (client.clone(), config.prefix.clone());
            async move { client.get(prefix, Some(probe)).await }
        })
        .await?;
        Ok(EtcdBackend {
            client: Arc::new(client),
            keys: Keys::new(&config.prefix),
            config,
            session: AsyncMutex::new(None),
        })
    }

    /// The settings this backend runs with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The current session's lease id, if a session is live (for diagnostics: it is the hex
    /// suffix of this instance's lock keys).
    pub async fn lease_id(&self) -> Option<i64> {
        self.session
            .lock()
            .await
            .as_ref()
            .filter(|s| s.is_live())
            .map(|s| s.lease)
    }

    async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        if let Some(live) = slot.as_ref().filter(|s| s.is_live()) {
            return Ok(Arc::clone(live));
        }
        // Boxed: opening a session is rare, and its state would enlarge every acquire future.
        let session = Box::pin(Session::grant(&self.client, &self.config)).await?;
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    async fn acquire_once(&self, name: &LockName, try_once: bool) -> Result<LockGuard> {
        let session = self.session().await?;
        session
            .withdrawals
            .settled(name, self.config.request_timeout)
            .await;
        let queue = session.local_queue(name);
        let turn = if try_once {
            queue.try_lock_owned().map_err(|_| would_block(name))?
        } else {
            session
                .local_turn(queue)
                .await
                .ok_or_else(|| lost_error(name))?
        };
        let limit = self.config.request_timeout;
        let mut pending = Pending {
            enqueue: Some(tokio::spawn({
                // Handles, not clones: a `Client` by value would make every acquire future
                // (and this task) kilobytes larger, and moving them costs on the hot path.
                let (client, keys, name, session) = (
                    Arc::clone(&self.client),
                    self.keys.clone(),
                    name.clone(),
                    Arc::clone(&session),
                );
                async move { mutex::enqueue(&client, &keys, &name, &session, limit).await }
            })),
            key: Some(self.keys.lock_key(name, session.lease)),
            lease: session.lease,
            session: Arc::clone(&session),
            name: name.clone(),
            client: Arc::clone(&self.client),
            limit,
            turn: Some(turn),
        };
        let queued = pending.queued(name).await?;
        let checkpoint = if queued.owner {
            queued.checkpoint.clone()
        } else if try_once {
            return Err(would_block(name)); // `pending` deletes our key
        } else {
            // Boxed: its state (a watch stream among it) would otherwise make the future of
            // every acquire, contended or not, larger.
            Box::pin(mutex::wait_for_turn(
                &self.client,
                &self.keys,
                name,
                &queued,
                &session,
                limit,
            ))
            .await?
        };
        let turn = pending.disarm()?;
        tracing::info!(lock = %name, token = queued.token, key = %queued.key, "etcd: acquired");
        let held = EtcdHeld {
            client: Arc::clone(&self.client),
            keys: self.keys.clone(),
            name: name.clone(),
            key: queued.key,
            token: queued.token,
            limit,
            ttl: self.config.ttl,
            _session: Arc::clone(&session),
            _turn: turn,
        };
        Ok(LockGuard::new(
            KIND,
            name.clone(),
            FencingToken::new(queued.token.unsigned_abs()),
            Arc::clone(&session.clock),
            checkpoint,
            Box::new(held),
        ))
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(&self, name: &LockName, wait: Wait) -> Result<LockGuard> {
        wait.limit(name, self.acquire_once(name, wait == Wait::Try))
            .await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = call("read the lock's queue", self.config.request_timeout, {
            let (mut client, prefix) = (Client::clone(&self.client), self.keys.lock_prefix(name));
            async move { client.get(prefix, Some(all)).await }
        })
        .await?;
        let Some(holder) = resp.kvs().first() else {
            return Ok(LockStatus::new(name.clone(), None, 0, None));
        };
        let age = std::str::from_utf8(holder.value())
            .ok()
            .and_then(|v| v.parse::<u128>().ok())
            .map(|since| {
                let ms = mutex::unix_millis().saturating_sub(since);
                Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
            });
        Ok(LockStatus::new(
            name.clone(),
            Some(FencingToken::new(holder.create_revision().unsigned_abs())),
            resp.kvs().len() - 1,
            age,
        ))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        let keys = GetOptions::new().with_prefix().with_keys_only();
        let resp = call("list locks", self.config.request_timeout, {
            let (mut client, range) = (
                Client::clone(&self.client),
                format!("{}{prefix}", self.config.prefix),
            );
            async move { client.get(range, Some(keys)).await }
        })
        .await?;
        let mut names: Vec<LockName> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let rest = kv.key().strip_prefix(self.config.prefix.as_bytes())?;
                let name = std::str::from_utf8(rest).ok()?.split('/').next()?;
                LockName::new(name).ok()
            })
            .collect();
        names.dedup();
        Ok(names)
    }
}

fn would_block(name: &LockName) -> Error {
    Error::WouldBlock {
        name: name.to_string(),
    }
}

/// An acquire in progress. Unless disarmed, dropping it (the acquire failed, timed out or was
/// cancelled) deletes our key in the background, after the enqueue request has finished so that
/// a Put still in flight cannot land after the delete, and keeps this session's turn on the
/// name until then, so that the delete cannot hit the key of our own next acquisition.
struct Pending {
    enqueue: Option<JoinHandle<Result<Queued>>>,
    key: Option<String>,
    lease: i64,
    session: Arc<Session>,
    name: LockName,
    client: Arc<Client>,
    limit: Duration,
    turn: Option<OwnedMutexGuard<()>>,
}

impl Pending {
    async fn queued(&mut self, name: &LockName) -> Result<Queued> {
        let Some(task) = self.enqueue.as_mut() else {
            return Err(lost_error(name));
        };
        let out = task
            .await
            .map_err(|e| Error::backend(KIND, "enqueue task failed", e))?;
        self.enqueue = None;
        out
    }

    fn disarm(mut self) -> Result<OwnedMutexGuard<()>> {
        self.key = None;
        self.turn
            .take()
            .ok_or_else(|| Error::backend(KIND, "internal: turn already taken", "no turn"))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let withdrawal = self.session.withdrawals.begin(&self.name);
        let (enqueue, turn) = (self.enqueue.take(), self.turn.take());
        let (client, lease, limit) = (Arc::clone(&self.client), self.lease, self.limit);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%key, "etcd: acquire dropped outside a runtime; its key ends with the lease");
            return;
        };
        runtime.spawn(async move {
            if let Some(task) = enqueue {
                let _ = task.await;
            }
            // Any key of this name on our lease is from this attempt (we hold the turn).
            let txn = Txn::new()
                .when([Compare::lease(key.as_str(), CompareOp::Equal, lease)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            match mutex::txn_call("withdraw a cancelled acquire", &client, txn, limit).await {
                Ok(_) => tracing::debug!(%key, "etcd: cancelled acquire withdrawn"),
                Err(e) => tracing::warn!(%key, error = %e, "etcd: could not withdraw a cancelled acquire; its key ends with the lease"),
            }
            drop(turn);
            drop(withdrawal);
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use fencelock::{LockBackend, LockName, Wait};
    use fencelock_testsupport::{unique, EtcdCluster};

    use super::*;

    async fn single_node_backend() -> (EtcdCluster, EtcdBackend) {
        let cluster = EtcdCluster::start(1);
        let config = EtcdConfig::new(cluster.endpoints()).prefix(format!("{}/", unique("b")));
        let backend = EtcdBackend::connect(config).await.unwrap();
        (cluster, backend)
    }

    /// The state a cancelled acquire leaves for a moment: its withdrawal still holds this
    /// session's turn on the name. A try must wait for it, not report "held by another".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn try_waits_for_our_own_withdrawal() {
        let (_cluster, backend) = single_node_backend().await;
        let name = LockName::new("job").unwrap();
        let session = backend.session().await.unwrap();
        let turn = session.local_queue(&name).lock_owned().await;
        let withdrawal = session.withdrawals.begin(&name);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(turn);
            drop(withdrawal);
        });
        let guard = backend.acquire(&name, Wait::Try).await.unwrap();
        drop(guard);
    }

    /// Every acquire's future is boxed (async-trait) and moved; at 15 KB (a `Client` by value,
    /// the contended path and the session grant inline) that copy showed in profiles.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_acquire_future_stays_small() {
        let (_cluster, backend) = single_node_backend().await;
        let name = LockName::new("job").unwrap();
        let size = std::mem::size_of_val(&backend.acquire_once(&name, false));
        assert!(size <= 2048, "the acquire future is {size} bytes");
    }
}
