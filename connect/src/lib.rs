//! A fencelock backend from a URL, so that platform teams swap backends by configuration.
//!
//! | URL | backend |
//! |---|---|
//! | `etcd://host1:2379,host2:2379/prefix?ttl=10s` | etcd over plain HTTP/2; keys under `prefix/` (default `fencelock/`) |
//! | `etcds://host:2379/prefix?ca=/ca.pem&cert=/c.pem&key=/k.pem` | etcd over TLS |
//! | `zk://host1:2181,host2:2181/base/path?session_timeout=6s` | ZooKeeper; lock paths under `/base/path` (default `/fencelock`) |
//! | `mem://` or `mem://?ttl=3s` | the in-memory backend (one process) |
//!
//! Credentials go in the URL (`etcd://user:password@host:2379`, `zk://user:password@host:2181`)
//! or in the environment, which wins: `FENCELOCK_ETCD_USER` / `FENCELOCK_ETCD_PASSWORD`,
//! `FENCELOCK_ZK_USER` / `FENCELOCK_ZK_PASSWORD`; for `etcds://`, `FENCELOCK_ETCD_CA`,
//! `FENCELOCK_ETCD_CERT`, `FENCELOCK_ETCD_KEY` (file paths) stand in for `ca`, `cert`, `key`.
//!
//! Query settings: etcd `ttl`, `safety_margin`, `connect_timeout`, `request_timeout`;
//! ZooKeeper `session_timeout`, `safety_margin`, `connect_timeout`, `request_timeout`; memory
//! `ttl`. Durations are written `500ms`, `10s`, `2m`. Each backend is behind the cargo feature
//! of its name (both on by default).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
//! use fencelock::LockBackendExt;
//! let locks = fencelock_connect::connect("mem://?ttl=3s").await?;
//! let guard = locks.lock("job").await?;
//! # let _ = guard.release().await?; Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod url;

use std::sync::Arc;

use fencelock::{LockBackend, MemoryBackend, MemoryStore, Result};

pub use crate::url::{parse, parse_duration, redact, with_setting, BackendUrl};

/// Connects to the backend that `url` names.
///
/// # Errors
/// [`fencelock::Error::InvalidConfig`] with `field` set to `"url"` (the message names the part
/// that is wrong) or to the setting that is out of range; otherwise as the backend's `connect`.
///
/// # Cancel safety
/// As cancel-safe as the backend's `connect`.
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>> {
    Ok(match parse(url)? {
        BackendUrl::Memory(config) => {
            Arc::new(MemoryBackend::with_config(&MemoryStore::new(), config)?)
        }
        #[cfg(feature = "etcd")]
        BackendUrl::Etcd(config) => Arc::new(fencelock_etcd::EtcdBackend::connect(*config).await?),
        #[cfg(feature = "zookeeper")]
        BackendUrl::ZooKeeper(config) => {
            Arc::new(fencelock_zookeeper::ZkBackend::connect(*config).await?)
        }
    })
}
