//! The servers of one size, and clients for them.

use std::sync::Arc;
use std::time::Duration;

use fencelock::{LockBackend, LockBackendExt};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_testsupport::{unique, EtcdCluster, ZkEnsemble};
use fencelock_zookeeper::{ZkBackend, ZkConfig};

pub struct Servers {
    pub size: usize,
    pub etcd: EtcdCluster,
    pub zk: ZkEnsemble,
}

impl Servers {
    pub fn start(size: usize) -> Self {
        Servers {
            size,
            etcd: EtcdCluster::start(size),
            zk: ZkEnsemble::start(size),
        }
    }

    pub fn label(&self, backend: &str) -> String {
        format!("{backend} x{}", self.size)
    }

    /// Every client of the benchmark talks to member 0, so that on a cluster the path to the
    /// leader (direct or forwarded) is the same for fencelock, the raw requests and the peers.
    pub fn etcd_endpoint(&self) -> Vec<String> {
        self.etcd.endpoints().into_iter().take(1).collect()
    }

    /// Member 0's address (see [`Self::etcd_endpoint`]).
    pub fn zk_connect(&self) -> String {
        let all = self.zk.connect_string();
        all.split(',').next().unwrap_or_default().to_owned()
    }

    /// What member 0 is in each cluster, for the table headings.
    pub fn member0(&self) -> String {
        if self.size == 1 {
            return "single node".into();
        }
        let etcd = if self.etcd.leader() == Some(0) {
            "leader"
        } else {
            "follower"
        };
        format!(
            "3 nodes; all clients on member 0: etcd {etcd}, zookeeper {}",
            self.zk.mode(0)
        )
    }

    pub async fn etcd_backend(&self, prefix: &str) -> EtcdBackend {
        let config = EtcdConfig::new(self.etcd_endpoint())
            .prefix(prefix)
            .ttl(Duration::from_secs(10));
        EtcdBackend::connect(config).await.unwrap()
    }

    pub async fn zk_backend(&self, base: &str) -> ZkBackend {
        let config = ZkConfig::new(self.zk_connect())
            .base_path(base)
            .tick_time(fencelock_testsupport::ZK_TICK)
            .session_timeout(Duration::from_secs(10));
        ZkBackend::connect(config).await.unwrap()
    }

    /// `n` instances of `backend` (`"etcd"` or `"zookeeper"`) on one fresh prefix, each with
    /// its session already open, so that no timing includes a session's setup.
    pub async fn contenders(&self, backend: &str, n: usize) -> Vec<Arc<dyn LockBackend>> {
        let (prefix, base) = (Servers::prefix(), Servers::base());
        let mut backends: Vec<Arc<dyn LockBackend>> = Vec::with_capacity(n);
        for _ in 0..n {
            let b: Arc<dyn LockBackend> = if backend == "etcd" {
                Arc::new(self.etcd_backend(&prefix).await)
            } else {
                Arc::new(self.zk_backend(&base).await)
            };
            let _ = b.lock("warm").await.unwrap().release().await.unwrap();
            backends.push(b);
        }
        backends
    }

    pub fn prefix() -> String {
        format!("{}/", unique("bench"))
    }

    pub fn base() -> String {
        format!("/{}", unique("bench"))
    }
}
