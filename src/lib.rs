//! Distributed locks you can trust: **a lease plus a fencing token**.
//!
//! A lease alone is a hint: a holder can pause (GC, network, SIGSTOP) past its TTL and wake up
//! believing it still holds the lock while a new holder proceeds. fencelock gives every
//! acquisition a [`FencingToken`] that grows with each acquisition, a [`LockGuard::lost`] signal
//! that fires *before* the store could hand the lock to someone else, and the means for a
//! resource to refuse writes from a stale holder: fenced state inside the lock store
//! ([`LockGuard::fenced_put`]) and a [`Fence`] for external stores.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
//! use std::sync::Arc;
//! use fencelock::{Fence, LockBackend, LockBackendExt, MemoryBackend};
//!
//! let locks: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new()); // or etcd, ZooKeeper
//! let ledger = Fence::new(); // lives in the protected resource
//!
//! let guard = locks.lock("ledger").await?;
//! guard
//!     .run(async {
//!         let _permit = ledger.admit("ledger", guard.token()).await?; // refuses stale holders
//!         // ... write ...
//!         fencelock::Result::Ok(())
//!     })
//!     .await??;
//! let _ = guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Backends: [`MemoryBackend`] here; `fencelock-etcd` and `fencelock-zookeeper` in their own
//! crates. Every backend passes the same conformance suite ([`testkit`], feature `testkit`).
#![forbid(unsafe_code)]

mod backend;
mod election;
mod error;
mod fence;
mod guard;
mod lease;
pub mod memory;
mod name;
mod owner;
pub mod raw;
mod rwlock;
mod semaphore;
pub mod telemetry;
mod token;
mod withdrawals;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use backend::{LockBackend, LockBackendExt, LockStatus, QueueEntry, ReleaseOutcome, Wait};
pub use election::{Leader, Leadership};
pub use error::{BoxError, Error, Result, StoreFailure};
pub use fence::{format_header, parse_header, Fence, FenceMode, FencePermit, FENCING_TOKEN_HEADER};
pub use guard::LockGuard;
pub use memory::{MemoryBackend, MemoryConfig, MemoryStore};
pub use name::{LockName, StateKey, MAX_NAME_LEN};
pub use owner::{Owner, MAX_LABEL_LEN};
pub use rwlock::{Access, RwLock};
pub use semaphore::Semaphore;
pub use token::FencingToken;
