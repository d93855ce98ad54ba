//! The servers of one size, and clients for them.

use std::time::Duration;

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

    pub async fn etcd_backend(&self, prefix: &str) -> EtcdBackend {
        let config = EtcdConfig::new(self.etcd.endpoints())
            .prefix(prefix)
            .ttl(Duration::from_secs(10));
        EtcdBackend::connect(config).await.unwrap()
    }

    pub async fn zk_backend(&self, base: &str) -> ZkBackend {
        let config = ZkConfig::new(self.zk.connect_string())
            .base_path(base)
            .session_timeout(Duration::from_secs(10));
        ZkBackend::connect(config).await.unwrap()
    }

    pub fn prefix() -> String {
        format!("{}/", unique("bench"))
    }

    pub fn base() -> String {
        format!("/{}", unique("bench"))
    }
}
