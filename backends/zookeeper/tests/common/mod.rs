//! Shared by the ZooKeeper test binaries: servers, a factory for the conformance suite.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each binary uses a part

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use fencelock::testkit::BackendFactory;
use fencelock::LockName;
use fencelock_testsupport::{unique, ProxyMode, TcpProxy, ZkEnsemble};
use fencelock_zookeeper::{ZkBackend, ZkConfig};
use zookeeper_client::Client;

/// The session timeout the tests use (the test servers allow 1 s to 10 s).
pub const TIMEOUT: Duration = Duration::from_secs(4);

/// One standalone server per test binary; tests only use it, each under its own base path.
pub fn shared_standalone() -> &'static ZkEnsemble {
    static SERVER: OnceLock<ZkEnsemble> = OnceLock::new();
    SERVER.get_or_init(|| ZkEnsemble::from_env_or_start(1))
}

/// One 3-node ensemble per test binary, for tests that only use it.
pub fn shared_ensemble() -> &'static ZkEnsemble {
    static SERVER: OnceLock<ZkEnsemble> = OnceLock::new();
    SERVER.get_or_init(|| ZkEnsemble::from_env_or_start(3))
}

pub fn config(connect: &str, base: &str) -> ZkConfig {
    ZkConfig::new(connect)
        .base_path(base)
        .tick_time(fencelock_testsupport::ZK_TICK)
        .session_timeout(TIMEOUT)
}

/// Makes backends under a base path unique to one test. Each backend reaches the servers
/// through proxies of its own, so that one backend can be cut off.
pub struct ZkFactory {
    pub connect: String,
    pub base: String,
    pub admin: Client,
    targets: Vec<String>,
    proxies: Mutex<HashMap<String, Arc<Vec<TcpProxy>>>>,
}

impl ZkFactory {
    pub async fn on(ensemble: &ZkEnsemble) -> Self {
        let connect = ensemble.connect_string();
        ZkFactory {
            admin: Client::connect(&connect).await.expect("admin client"),
            base: format!("/{}", unique("t")),
            targets: connect.split(',').map(str::to_owned).collect(),
            connect,
            proxies: Mutex::new(HashMap::new()),
        }
    }

    /// A backend connected straight to the servers.
    pub async fn backend(&self) -> ZkBackend {
        ZkBackend::connect(config(&self.connect, &self.base))
            .await
            .expect("connect to the test ZooKeeper")
    }

    /// A backend connected through proxies that [`ZkFactory::cut_off`] can black-hole.
    pub async fn proxied_backend(&self) -> ZkBackend {
        let mut proxies = Vec::new();
        for target in &self.targets {
            proxies.push(TcpProxy::start(target.clone()).await);
        }
        let connect: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        let connect = connect.join(",");
        let backend = ZkBackend::connect(config(&connect, &self.base))
            .await
            .expect("connect through the proxies");
        self.proxies
            .lock()
            .unwrap()
            .insert(connect, Arc::new(proxies));
        backend
    }

    /// Cuts `backend` off (no RST: a black hole) for `how_long`, then heals the link.
    pub fn cut_off(&self, backend: &ZkBackend, how_long: Duration) {
        let proxies = self
            .proxies
            .lock()
            .unwrap()
            .get(&backend.config().connect)
            .cloned()
            .expect("a proxied backend");
        for proxy in proxies.iter() {
            proxy.set_mode(ProxyMode::BlackHole);
        }
        tokio::spawn(async move {
            tokio::time::sleep(how_long).await;
            for proxy in proxies.iter() {
                proxy.set_mode(ProxyMode::Forward);
            }
        });
    }
}

#[async_trait]
impl BackendFactory for ZkFactory {
    type Backend = ZkBackend;

    async fn connect(&self) -> ZkBackend {
        self.proxied_backend().await
    }

    /// The real thing: the ensemble expires a session it has not heard from for a timeout.
    async fn break_session(&self, backend: &ZkBackend) {
        self.cut_off(backend, TIMEOUT + Duration::from_millis(1500));
    }

    async fn steal(&self, name: &LockName) {
        let dir = format!("{}/{}", self.base, name);
        let mut children = self
            .admin
            .list_children(&dir)
            .await
            .expect("list contenders");
        children.sort_by_key(|c| c.rsplit("lock-").next().unwrap_or_default().to_owned());
        let first = children.first().expect("a holder to steal from");
        self.admin
            .delete(&format!("{dir}/{first}"), None)
            .await
            .expect("delete the holder's node");
    }

    fn name(&self, base: &str) -> LockName {
        LockName::new(base).expect("valid name")
    }
}

/// `_c_<uuid>-<recipe><10 digits>`, as Curator's protected sequential nodes are named.
pub fn is_protected(child: &str, recipe: &str) -> bool {
    let Some((uuid, seq)) = child.strip_prefix("_c_").and_then(|r| r.split_once(recipe)) else {
        return false;
    };
    uuid.len() == 36 && seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit())
}
