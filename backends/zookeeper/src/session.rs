//! The session: one ZooKeeper session per backend instance, watched by us.
//!
//! zookeeper-client pings the server but does not say when the server last answered, so the
//! session probes it every timeout/3 with one request and counts the local deadline from when
//! each successful probe was *sent*. The ensemble expires a session only after a full timeout
//! without hearing from the client, and it heard our probe after we sent it, so with the safety
//! margin `lost` fires before the ensemble can expire the session and hand a lock on.

use foldhash::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencelock::raw::{keep_renewed, LeaseClock, Live, LocalTurns, Renew, Renewal, Withdrawals};
use fencelock::{Error, Result};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Acls, Client, SessionState};

use crate::own_nodes::{watch_own_nodes, OwnNode};
use crate::paths::Paths;
use crate::{zk_error, ZkConfig};

pub(crate) struct ZkSession {
    pub(crate) client: Client,
    pub(crate) clock: Arc<LeaseClock>,
    /// Held lock nodes and the trigger of each guard's `lost`, re-checked after a reconnect.
    /// foldhash, at a fraction of SipHash's cost: a node's path (about 90 bytes) is hashed twice
    /// per acquire. Our own paths, so no key here is chosen by anyone else.
    held: Mutex<HashMap<Arc<str>, CancellationToken>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Granted nodes, for the task that watches them (`own_nodes`).
    own_nodes: mpsc::UnboundedSender<OwnNode>,
    /// Cancelled acquires of this session still being withdrawn.
    pub(crate) withdrawals: Arc<Withdrawals>,
    /// The per-name turns of this session's tasks on a lock.
    pub(crate) turns: LocalTurns,
    /// The request timeout (for the deletes after a loss, and a held lock's requests).
    pub(crate) limit: Duration,
    /// Where the instance's locks live, and the ACLs of the nodes it creates: here, not in
    /// each held lock.
    pub(crate) paths: Paths,
    pub(crate) acls: Acls<'static>,
    /// The session timeout the deadline counts with (the one granted at connect).
    timeout: Duration,
}

impl std::fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.client.session_id())
            .field("live", &self.is_live())
            .finish_non_exhaustive()
    }
}

impl ZkSession {
    pub(crate) async fn connect(config: &ZkConfig) -> Result<Arc<ZkSession>> {
        let timeout = config.session_timeout;
        let mut connector = Client::connector().with_session_timeout(timeout);
        if let Some((user, password)) = &config.digest {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let sent = Instant::now();
        let reach = format!(
            "connect to {:?} (check that ZooKeeper runs there and the credentials)",
            config.connect
        );
        let client =
            match tokio::time::timeout(config.connect_timeout, connector.connect(&config.connect))
                .await
            {
                Ok(Ok(client)) => client,
                Ok(Err(e)) => return Err(zk_error(&reach, e)),
                Err(_) => {
                    return Err(Error::timed_out(
                        crate::KIND,
                        format!("{reach}: no session"),
                        config.connect_timeout,
                    ))
                }
            };
        let granted = client.session_timeout();
        if granted != timeout {
            return Err(Error::config(
                "session_timeout",
                format!(
                    "asked for {timeout:?} but the server granted {granted:?}: servers allow 2 to 20 ticks \
                     (minSessionTimeout/maxSessionTimeout); choose a timeout in that range"
                ),
            ));
        }
        let clock = LeaseClock::start(sent, timeout, config.safety_margin);
        tracing::info!(
            session = format_args!("{:x}", client.session_id().0),
            ?timeout,
            "zookeeper: session established"
        );
        let (own_nodes, granted) = mpsc::unbounded_channel();
        let watcher = tokio::spawn(watch_own_nodes(
            client.clone(),
            granted,
            clock.lost_token().clone(),
        ));
        let session = Arc::new(ZkSession {
            client,
            clock,
            held: Mutex::new(HashMap::default()),
            tasks: Mutex::new(vec![watcher]),
            own_nodes,
            withdrawals: Arc::default(),
            turns: LocalTurns::default(),
            limit: config.request_timeout,
            paths: Paths::new(&config.base_path),
            acls: crate::backend::acls(config),
            timeout,
        });
        let probe = tokio::spawn(keep_renewed(
            crate::KIND,
            Arc::clone(&session.clock),
            timeout,
            config.request_timeout,
            Probe {
                client: session.client.clone(),
                timeout,
                tick_time: config.tick_time,
            },
        ));
        let monitor = tokio::spawn(monitor(Arc::downgrade(&session)));
        session
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend([probe, monitor]);
        Ok(session)
    }

    /// Whether the server may still hold nodes of this session: until the client says the
    /// session expired, closed or was refused.
    pub(crate) fn nodes_may_remain(&self) -> bool {
        !self.client.state().is_terminated()
    }

    /// After a local loss (the deadline passed; the session may yet reconnect): deletes every
    /// held node in the background, so that no lock stays held by a guard that knows it lost
    /// it, and a new acquire of this instance (on a new session) does not queue behind its own
    /// node (review F3).
    fn delete_held_after_loss(self: &Arc<Self>) {
        if !self.nodes_may_remain() {
            return; // the server removed them with the session
        }
        let paths: Vec<String> = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(path, _)| path.to_string())
            .collect();
        for path in paths {
            tracing::info!(%path, "zookeeper: deleting the node of a lock lost to the local deadline");
            crate::held::keep_deleting(Arc::clone(self), path, self.limit);
        }
    }

    /// Holds a granted node: checked after every reconnect and deleted after a local loss
    /// until [`unregister`](Self::unregister)ed, and watched until it is deleted (the watch
    /// fires its guard's `lost` if that was not our release).
    pub(crate) fn hold(&self, node: OwnNode) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(Arc::clone(&node.path), node.trigger.clone());
        // Refused only once the session is over, which fires every guard's `lost` anyway.
        let _ = self.own_nodes.send(node);
    }

    pub(crate) fn unregister(&self, path: &str) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(path);
    }

    /// After a reconnect: a lock whose node is gone, or no longer ours, is lost even though the
    /// session survived.
    async fn verify_held(&self) {
        let held: Vec<(Arc<str>, CancellationToken)> = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(p, t)| (p.clone(), t.clone()))
            .collect();
        let me = self.client.session_id().0;
        for (path, trigger) in held {
            match self.client.check_stat(&path).await {
                Ok(Some(stat)) if stat.ephemeral_owner == me => {}
                Ok(_) => {
                    tracing::warn!(%path, "zookeeper: lock node gone after reconnect; lock lost");
                    trigger.cancel();
                }
                Err(e) => {
                    tracing::debug!(%path, error = %e, "zookeeper: could not check a lock node after reconnect")
                }
            }
        }
    }
}

impl Live for ZkSession {
    fn is_live(&self) -> bool {
        !self.clock.lost_token().is_cancelled()
    }
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        // Dropping the last client handle closes the session, which deletes our nodes now.
        self.clock.lose();
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }
}

/// One `sync` as a renewal. A follower answers reads from its own copy even after it has lost
/// its leader (for up to syncLimit x tickTime), while the leader, which alone expires sessions,
/// no longer hears of ours; a `sync` is forwarded to the leader and answered only once the
/// leader has processed it. So its answer proves the session was alive at the leader when the
/// probe was sent, and the deadline moves to that send time plus the session timeout, minus the
/// margin (which covers how late the leader may have learnt of the session's last touch).
struct Probe {
    client: Client,
    timeout: Duration,
    tick_time: Duration,
}

impl Renew for Probe {
    async fn renew(&mut self) -> Renewal {
        match self.client.sync("/").await {
            // The reply came over the connection whose connect response set the value we read:
            // no answer from a session renegotiated to less than the deadline assumes extends it.
            Ok(_) => match renegotiated_below(&self.client, self.timeout) {
                Some(why) => Renewal::Gone(why),
                None => Renewal::Alive(self.timeout),
            },
            Err(
                e @ (zookeeper_client::Error::SessionExpired
                | zookeeper_client::Error::ClientClosed),
            ) => Renewal::Gone(e.to_string()),
            Err(e) => Renewal::Failed(e.to_string()),
        }
    }

    /// Every `tick_time / 2`: the leader then holds a record of the session no older than one
    /// probe interval before the last successful probe, which the margin covers.
    fn interval(&self, ttl: Duration) -> Duration {
        (self.tick_time / 2).min(ttl / 3)
    }
}

/// Why the session can no longer be trusted with our deadline: the server granted less than
/// `timeout` on a reconnect (review F7). ZooKeeper renegotiates the timeout on every connect
/// request, so a server with other `tickTime` or `min/maxSessionTimeout` settings shortens
/// the session's expiry below the deadline counted with `timeout`. A longer grant is harmless:
/// the deadline then comes earlier than the expiry.
fn renegotiated_below(client: &Client, timeout: Duration) -> Option<String> {
    let granted = client.negotiated_session_timeout();
    (granted < timeout).then(|| {
        format!(
            "on reconnect the server granted a session timeout of {granted:?}, below the {timeout:?} \
             the local deadline counts with; every server must allow the same timeouts (tickTime, \
             minSessionTimeout, maxSessionTimeout)"
        )
    })
}

async fn monitor(session: std::sync::Weak<ZkSession>) {
    let (mut states, lost) = match session.upgrade() {
        Some(s) => (s.client.state_watcher(), s.clock.lost_token().clone()),
        None => return,
    };
    // One state change per pass; terminal states and the session's end stop it.
    loop {
        let state = tokio::select! {
            () = lost.cancelled() => {
                if let Some(session) = session.upgrade() {
                    session.delete_held_after_loss();
                }
                return;
            }
            state = states.changed() => state,
        };
        let Some(session) = session.upgrade() else {
            return;
        };
        tracing::info!(?state, "zookeeper: session state");
        match state {
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                tracing::warn!(
                    ?state,
                    "zookeeper: session over; every lock of this session is lost"
                );
                session
                    .clock
                    .lose_because(format!("the ZooKeeper session ended ({state:?})"));
                return;
            }
            SessionState::Disconnected => {}
            // Every connect is checked, not only one after a Disconnected seen here: the state
            // watcher keeps only the latest state, so a quick reconnect may show no gap.
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                if let Some(why) = renegotiated_below(&session.client, session.timeout) {
                    tracing::warn!(reason = %why, "zookeeper: every lock of this session is lost");
                    session.clock.lose_because(why);
                    continue; // the lost branch deletes the held nodes and stops
                }
                session.verify_held().await;
            }
        }
    }
}
