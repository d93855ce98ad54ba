//! The ZooKeeper backend of [fencelock]: Curator-compatible ephemeral sequential nodes, the
//! node's czxid as the fencing token, and session state driving the guards' `lost`.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::LockBackendExt;
//! use fencelock_zookeeper::{ZkBackend, ZkConfig};
//!
//! let config = ZkConfig::new("127.0.0.1:2181").session_timeout(Duration::from_secs(10));
//! let locks = ZkBackend::connect(config).await?;
//! let guard = locks.lock("nightly-report").await?; // node /fencelock/nightly-report/_c_<uuid>-lock-<seq>
//! guard.run(async { /* work; pass guard.token() to what you write */ }).await?;
//! let _ = guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Interoperability
//! The lock `N` under base `B` (default `/fencelock`) is Curator's lock path `B/N`: Java's
//! `new InterProcessMutex(client, "B/N")` and fencelock exclude each other.
//!
//! Tasks of one backend instance that want the same lock take turns locally first (FIFO, as
//! etcd's backend must), so an instance normally has one node in a lock's queue: a name that K
//! tasks of a process contend for is listed with one node of it, not K, and a handover between
//! them costs the next task one acquire's requests, waking and listing no other waiter. The
//! turn ends with the node (our release's delete, or an operator's), so after a lock is broken
//! the next task of the instance proceeds while the lost guard lives. Across instances the
//! queue is ZooKeeper's, in create order.
//!
//! The election `N` is Curator's `LeaderLatch` path `B/N` (nodes `_c_<uuid>-latch-<seq>`, the
//! data the participant id): `new LeaderLatch(client, "B/N", id)` and fencelock candidates lead
//! in turn and see each other's ids. A leader's term is its node's czxid; a proclaim sets its
//! node's data (Curator's latch ignores it).
//!
//! # The token
//! The lock node's czxid (from the create2 reply): zxids are totally ordered across the
//! ensemble, so it grows with every acquisition. Sequence numbers are not tokens: they are per
//! parent and restart when the parent is recreated.
//!
//! # Loss detection
//! Only the leader expires sessions, and a follower keeps answering reads for
//! `syncLimit x tickTime` after it has lost its leader. So the probe is a `sync`, which the
//! follower forwards to the leader: its answer proves the session was alive at the leader. The
//! leader learns of a session's activity at a follower from the follower's ping replies, every
//! `tickTime / 2`, so the probes run that often (at most every `timeout / 3`), and the deadline
//! is *send time of the last successful probe + timeout - margin* with
//! `margin >= tick_time / 2` (default `timeout / 10 + tick_time / 2`; set
//! [`ZkConfig::tick_time`] to the ensemble's `tickTime`, default 2 s). The leader's record of the
//! session is then no older than one probe interval before that send time, so `lost` fires
//! before the leader can expire the session and hand a lock on, also when the client's server
//! is cut off from the leader (tested with a 3-node ensemble whose follower is black-holed).
//! After a disconnect, reconnecting before the deadline keeps the locks (each node is checked
//! to still be ours); `Expired` fires `lost` at once. ZooKeeper renegotiates the timeout on
//! every reconnect: a server that grants less than the configured timeout (other `tickTime` or
//! `min/maxSessionTimeout` settings) fires `lost` at once too, as the deadline would then
//! outlast the session.
//!
//! # Fenced state
//! Stored at `B/.state/N/<key>`; writes are multi-ops with a check on our lock node, reads a
//! multi-read that includes our lock node.
#![forbid(unsafe_code)]

mod backend;
mod config;
mod election;
mod held;
mod mutex;
mod own_nodes;
mod paths;
mod queue;
mod semaphore;
mod session;

pub use backend::ZkBackend;
pub use config::ZkConfig;

pub(crate) const KIND: &str = "zookeeper";

/// Turns a client error into [`fencelock::Error`] of the right
/// [`StoreFailure`](fencelock::StoreFailure), saying what to check.
pub(crate) fn zk_error(what: &str, e: zookeeper_client::Error) -> fencelock::Error {
    use fencelock::StoreFailure::{Protocol, Unauthorized, Unavailable};
    use zookeeper_client::Error as Zk;
    // zookeeper-client gives a connection up when the server has not answered for 8 of its
    // ticks (a stalled or paused server) and fails the requests in flight with a custom error
    // that carries only this message; it then reconnects, so it is as transient as a
    // connection loss. Its text is pinned by the vendored copy (`vendor/`).
    let io = caused_by_io(&e)
        || matches!(&e, Zk::Custom(_) if e.to_string().contains("no response from connection"));
    let (kind, hint) = match e {
        Zk::NoAuth => (
            Unauthorized,
            " (permission denied: check the digest credentials and the nodes' ACLs)",
        ),
        Zk::AuthFailed => (
            Unauthorized,
            " (authentication failed: check the digest credentials)",
        ),
        Zk::SessionExpired => (Unavailable, " (the session expired: acquire again)"),
        Zk::ConnectionLoss
        | Zk::Timeout
        | Zk::SessionMoved
        | Zk::ClientClosed
        | Zk::NoHosts
        | Zk::Throttled
        | Zk::NotReadOnly => (Unavailable, ""),
        // zookeeper-client reports a reset or broken connection as a custom error with the I/O
        // error as its source (review F8), or a silent one as above: as transient as a
        // connection loss.
        Zk::Custom(_) if io => (Unavailable, " (the connection failed)"),
        _ => (Protocol, ""),
    };
    fencelock::Error::store(KIND, kind, format!("{what}{hint}"), Some(Box::new(e)))
}

/// Whether an I/O error is somewhere in `e`'s chain of sources (zookeeper-client keeps it
/// behind an `Arc<dyn Error>`, which hides it from a plain downcast).
fn caused_by_io(e: &zookeeper_client::Error) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut source = std::error::Error::source(e);
    // Bounded by the chain's length.
    while let Some(cause) = source {
        let shared = cause.downcast_ref::<Shared>().map(|s| &**s);
        if cause.is::<std::io::Error>() || shared.is_some_and(|s| s.is::<std::io::Error>()) {
            return true;
        }
        source = cause.source();
    }
    false
}
