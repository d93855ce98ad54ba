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
//! `etcdctl lock P N` and fencelock exclude each other on one lock. The token is the key's
//! create revision (`ETCD_LOCK_REV` in `etcdctl lock`'s child environment... where set).
//!
//! # Fenced state
//! Stored at `P .state/ N / <key>`, outside every lock's key range, written only by Txns that
//! compare `create_revision(our lock key) == token`.
//!
//! See [`mutex`](crate#the-protocol) below for the protocol and [`EtcdBackend`] for round trips.
//!
//! # The protocol
#![doc = "See the `mutex` module source (`src/mutex.rs`): acquire is one Txn when uncontended, \
          waiters watch only their predecessor, release is one owner-checked Txn."]
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
