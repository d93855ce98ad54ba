//! The etcd backend of [fencelock]: a lease shared by the session, keys compatible with Go's
//! `concurrency.Mutex`, and the lock key's create revision as the fencing token.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::LockBackendExt;
//! use fencelock_etcd::{EtcdBackend, EtcdConfig};
//!
//! let config = EtcdConfig::new(["http://127.0.0.1:2379"]).ttl(Duration::from_secs(10));
//! let locks = EtcdBackend::connect(config).await?;
//! let guard = locks.lock("nightly-report").await?; // key fencelock/nightly-report/<lease hex>
//! guard.run(async { /* work; pass guard.token() to what you write */ }).await?;
//! let _ = guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Interoperability
//! The lock `N` under prefix `P` (default `fencelock/`) uses the keys `P N / <lease hex>`, the
//! same Txn and the same ordering as Go's `concurrency.NewMutex(session, "P N")`, so Go services,
//! `etcdctl lock P N` and fencelock exclude each other on one lock. The token is the key's create
//! revision: what `etcdctl lock` exports to its child as `ETCD_LOCK_REV`.
//!
//! # The protocol (`src/mutex.rs`)
//! - acquire: one Txn `If create_revision(key) == 0 Then Put(key, lease), Range(P N /, first
//!   created), Get(checkpoint)`; we own the lock if the first created key is ours;
//! - otherwise wait: Range the key created just before ours (`max_create_revision = token - 1`),
//!   watch only that key for its delete, repeat; then one Txn confirms our key still exists;
//! - release: one Txn `If create_revision(key) == token Then Delete(key)`, retried within the
//!   request timeout, then in the background while the session lives;
//! - fenced state: at `P .state/ N / <key>`, outside every lock's range, by Txns with the same
//!   compare.
//!
//! | operation | requests |
//! |---|---|
//! | first acquire of a session | 1 LeaseGrant + 1 Txn |
//! | uncontended acquire | 1 Txn |
//! | contended acquire | 1 Txn, then per predecessor 1 Range + 1 Watch, then 1 Range + 1 Txn |
//! | release, fenced put/get/delete | 1 Txn |
//! | renewal (whole session) | 1 LeaseKeepAlive message per TTL/3 |
//!
//! # Loss
//! The session's lease is renewed every TTL/3 by the backend itself (etcd-client has no timer
//! and no reconnect). Each renewal moves the local deadline to *send time + TTL - margin*; when
//! it passes without a renewal, or the server says the lease is gone, every guard of the session
//! fires `lost`, and the next acquire grants a new lease.
#![forbid(unsafe_code)]

mod backend;
mod config;
mod held;
mod keys;
mod mutex;
mod session;

use std::future::Future;
use std::time::Duration;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, EtcdTls, MIN_TTL};

pub(crate) const KIND: &str = "etcd";

/// Runs one etcd request with a time limit, turning failures into [`fencelock::Error::Backend`].
pub(crate) async fn call<T>(
    what: &str,
    limit: Duration,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> fencelock::Result<T> {
    match tokio::time::timeout(limit, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(fencelock::Error::backend(KIND, what.to_owned(), e)),
        Err(_) => Err(fencelock::Error::backend(
            KIND,
            format!("{what}: no answer within {limit:?}"),
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )),
    }
}
