//! The conformance suite against the in-memory backend.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use async_trait::async_trait;
use fencelock::testkit::BackendFactory;
use fencelock::{LockName, MemoryBackend, MemoryConfig, MemoryStore};

struct MemoryFactory {
    store: MemoryStore,
}

#[async_trait]
impl BackendFactory for MemoryFactory {
    type Backend = MemoryBackend;

    async fn connect(&self) -> MemoryBackend {
        // A short TTL so that renewal and expiry are exercised within each test.
        MemoryBackend::with_config(
            &self.store,
            MemoryConfig::with_ttl(Duration::from_millis(600)),
        )
        .expect("valid config")
    }

    async fn break_session(&self, backend: &MemoryBackend) {
        backend.expire_session().await;
    }

    async fn steal(&self, name: &LockName) {
        self.store
            .release_behind_back(name)
            .expect("a holder to steal from");
    }

    fn name(&self, base: &str) -> LockName {
        LockName::new(base).expect("valid name")
    }
}

fencelock::conformance_tests!(MemoryFactory {
    store: MemoryStore::new()
});
