//! Shared by the etcd test binaries: servers, a factory for the conformance suite, helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each binary uses a part

use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use fencelock::testkit::BackendFactory;
use fencelock::LockName;
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_testsupport::{unique, EtcdCluster};

/// The TTL the tests use: short, so loss is quick to observe, with room for a noisy machine.
pub const TTL: Duration = Duration::from_secs(3);

/// One single-node etcd per test binary; tests only use it, each under its own prefix.
pub fn shared_single() -> &'static EtcdCluster {
    static SERVER: OnceLock<EtcdCluster> = OnceLock::new();
    SERVER.get_or_init(|| EtcdCluster::from_env_or_start(1))
}

/// One 3-node cluster per test binary, for tests that only use it.
pub fn shared_cluster() -> &'static EtcdCluster {
    static SERVER: OnceLock<EtcdCluster> = OnceLock::new();
    SERVER.get_or_init(|| EtcdCluster::from_env_or_start(3))
}

pub fn config(endpoints: Vec<String>, prefix: &str) -> EtcdConfig {
    EtcdConfig::new(endpoints).prefix(prefix).ttl(TTL)
}

pub async fn admin(endpoints: &[String]) -> Client {
    Client::connect(endpoints, None)
        .await
        .expect("admin client")
}

/// Makes backends under a prefix unique to one test.
pub struct EtcdFactory {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub admin: Client,
}

impl EtcdFactory {
    pub async fn on(cluster: &EtcdCluster) -> Self {
        let endpoints = cluster.endpoints();
        EtcdFactory {
            admin: admin(&endpoints).await,
            prefix: format!("{}/", unique("t")),
            endpoints,
        }
    }
}

#[async_trait]
impl BackendFactory for EtcdFactory {
    type Backend = EtcdBackend;

    async fn connect(&self) -> EtcdBackend {
        EtcdBackend::connect(config(self.endpoints.clone(), &self.prefix))
            .await
            .expect("connect to the test etcd")
    }

    async fn break_session(&self, backend: &EtcdBackend) {
        let lease = backend.lease_id().await.expect("a live session to break");
        self.admin
            .clone()
            .lease_revoke(lease)
            .await
            .expect("revoke");
    }

    async fn steal(&self, name: &LockName) {
        let prefix = format!("{}{}/", self.prefix, name);
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut admin = self.admin.clone();
        let holder = admin.get(prefix, Some(first)).await.expect("range");
        let key = holder
            .kvs()
            .first()
            .expect("a holder to steal from")
            .key()
            .to_vec();
        admin.delete(key, None).await.expect("delete");
    }

    fn name(&self, base: &str) -> LockName {
        LockName::new(base).expect("valid name")
    }
}
