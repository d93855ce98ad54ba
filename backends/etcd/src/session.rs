//! The session: one lease per backend instance, kept alive by us at TTL/3.
//!
//! etcd-client's keeper sends one request per call and never reconnects: the schedule and the
//! conservative deadline are [`fencelock::raw::keep_renewed`]'s; the request, and the reopening
//! of a broken stream, are [`KeepAlive`]'s.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use fencelock::raw::{keep_renewed, LeaseClock, Live, LocalTurns, Renew, Renewal, Withdrawals};
use fencelock::{Error, Result};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::watch::HeldKeys;
use crate::{call, EtcdConfig};

/// One granted lease and everything tied to it.
pub(crate) struct Session {
    pub(crate) lease: i64,
    pub(crate) clock: Arc<LeaseClock>,
    client: Client,
    request_timeout: Duration,
    keep_alive: JoinHandle<()>,
    /// The keys this session holds, watched so that a deleted key fires its guard's `lost`.
    pub(crate) held_keys: HeldKeys,
    watcher: JoinHandle<()>,
    /// All contenders of one session share one key per lock (the key is named after the lease),
    /// so tasks of this session take turns per lock name here before touching etcd.
    pub(crate) turns: LocalTurns,
    /// Cancelled acquires of this session still being withdrawn.
    pub(crate) withdrawals: Arc<Withdrawals>,
}

impl Session {
    /// Grants a lease and starts keeping it alive.
    pub(crate) async fn grant(client: &Client, config: &EtcdConfig) -> Result<Arc<Session>> {
        let ttl_secs =
            i64::try_from(config.ttl.as_secs()).map_err(|_| Error::config("ttl", "too large"))?;
        let sent = Instant::now();
        let granted = call("grant a session lease", config.request_timeout, {
            let mut client = client.clone();
            async move { client.lease_grant(ttl_secs, None).await }
        })
        .await?;
        // The server may grant more than asked (its minimum); never assume more than we asked.
        let ttl = Duration::from_secs(granted.ttl().clamp(0, ttl_secs).unsigned_abs());
        let clock = LeaseClock::start(sent, ttl, config.safety_margin);
        tracing::info!(
            lease = format_args!("{:x}", granted.id()),
            ?ttl,
            "etcd: session lease granted"
        );
        let renewer = KeepAlive {
            shared: client.clone(),
            endpoints: config.endpoints.clone(),
            options: crate::connect::options(config),
            own: None,
            turn: 0,
            lease: granted.id(),
            stream: None,
        };
        let keep_alive = tokio::spawn(keep_alive(
            client.clone(),
            renewer,
            ttl,
            config.request_timeout,
            Arc::clone(&clock),
        ));

        let (held_keys, watcher) = HeldKeys::start(client.clone(), clock.lost_token().clone());
        Ok(Arc::new(Session {
            lease: granted.id(),
            clock,
            client: client.clone(),
            request_timeout: config.request_timeout,
            keep_alive,
            held_keys,
            watcher,
            turns: LocalTurns::default(),
            withdrawals: Arc::default(),
        }))
    }
}

impl Live for Session {
    fn is_live(&self) -> bool {
        !self.clock.lost_token().is_cancelled()
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &format_args!("{:x}", self.lease))
            .field("live", &self.is_live())
            .finish_non_exhaustive()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Like Go's Session.Close: revoke, so our keys vanish now instead of after the TTL.
        self.keep_alive.abort();
        self.watcher.abort();
        self.clock.lose();
        let (mut client, lease, limit) = (self.client.clone(), self.lease, self.request_timeout);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(limit, client.lease_revoke(lease)).await;
            });
        }
    }
}

/// Renews the session's lease until it is lost, then revokes it.
async fn keep_alive(
    client: Client,
    renewer: KeepAlive,
    ttl: Duration,
    request_timeout: Duration,
    clock: Arc<LeaseClock>,
) {
    let lease = renewer.lease;
    keep_renewed(crate::KIND, clock, ttl, request_timeout, renewer).await;
    tracing::warn!(lease = format_args!("{lease:x}"), "etcd: session lost");
    // Best effort: free our keys for the next holders now rather than at server-side expiry.
    let mut client = client;
    let _ = tokio::time::timeout(request_timeout.min(ttl / 3), client.lease_revoke(lease)).await;
}

/// One keepalive on the session's stream, opening it first when there is none.
///
/// With several endpoints the stream runs on a connection of its own to one endpoint, and a
/// failed renewal moves it to the next (review F6): through the shared, balanced channel a
/// reopened stream could land on the same black-holed connection, which looks ready until
/// HTTP/2 keepalive gives up on it, after the lease is gone.
struct KeepAlive {
    shared: Client,
    endpoints: Vec<String>,
    options: etcd_client::ConnectOptions,
    /// The connection to `endpoints[turn]`, once opened.
    own: Option<Client>,
    turn: usize,
    lease: i64,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl KeepAlive {
    /// The client the next stream opens on.
    async fn client(&mut self) -> std::result::Result<Client, etcd_client::Error> {
        if self.endpoints.len() <= 1 {
            return Ok(self.shared.clone());
        }
        if let Some(own) = &self.own {
            return Ok(own.clone());
        }
        let endpoint = &self.endpoints[self.turn % self.endpoints.len()];
        let own = Client::connect([endpoint], Some(self.options.clone())).await?;
        tracing::debug!(%endpoint, lease = format_args!("{:x}", self.lease), "etcd: keepalive connection opened");
        self.own = Some(own.clone());
        Ok(own)
    }
}

impl Renew for KeepAlive {
    async fn renew(&mut self) -> Renewal {
        let Some((keeper, responses)) = self.stream.as_mut() else {
            let mut client = match self.client().await {
                Ok(client) => client,
                Err(e) => return Renewal::Failed(e.to_string()),
            };
            // Opening a stream sends a first renewal and waits for its answer.
            return match client.lease_keep_alive(self.lease).await {
                Ok(opened) => {
                    self.stream = Some(opened);
                    Renewal::Alive(Duration::MAX)
                }
                Err(e) if lease_gone(&e) => Renewal::Gone(e.to_string()),
                Err(e) => Renewal::Failed(e.to_string()),
            };
        };
        if let Err(e) = keeper.keep_alive().await {
            return Renewal::Failed(e.to_string());
        }
        match responses.message().await {
            Ok(Some(resp)) if resp.ttl() > 0 => {
                Renewal::Alive(Duration::from_secs(resp.ttl().unsigned_abs()))
            }
            Ok(Some(_)) => Renewal::Gone("the server says the lease has expired".into()),
            Ok(None) => Renewal::Failed("keepalive stream closed".into()),
            Err(e) if lease_gone(&e) => Renewal::Gone(e.to_string()),
            Err(e) => Renewal::Failed(e.to_string()),
        }
    }

    fn reset(&mut self) {
        // The next renewal opens a new stream, on a new connection to the next endpoint.
        self.stream = None;
        if self.endpoints.len() > 1 {
            self.own = None;
            self.turn = (self.turn + 1) % self.endpoints.len();
        }
    }
}

fn lease_gone(e: &etcd_client::Error) -> bool {
    e.to_string().contains("lease not found")
}
