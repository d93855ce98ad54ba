//! Issue 13.9: a waiter whose requests fail at once backs off; it does not retry in a storm.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::LockBackendExt;
use fencelock_etcd::EtcdBackend;
use fencelock_testsupport::{unique, EtcdCluster, ProxyMode, TcpProxy};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Counts the waiter's "…; retrying" events for one lock: each follows one failed request.
struct Retries {
    lock: &'static str,
    seen: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Fields {
    message: String,
    lock: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "lock" => self.lock = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Retries {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.lock == self.lock && fields.message.contains("retrying") {
            self.seen.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The waiter's only link refuses every connection: each of its requests fails at once. Its
/// failed requests then come after pauses of 100 ms doubling to 2 s, not at a fixed pace: over
/// 6 s, at most 8 (a fixed 200 ms pause makes about 30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_requests_fail_at_once_backs_off() {
    let seen = Arc::new(AtomicUsize::new(0));
    let layer = Retries {
        lock: "storm",
        seen: Arc::clone(&seen),
    };
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let cluster = EtcdCluster::start(1);
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("storm"));
    // A long TTL: the waiter's session outlives the test's 6 s of failures.
    let config = |endpoints| common::config(endpoints, &prefix).ttl(Duration::from_secs(30));
    let holder = EtcdBackend::connect(config(cluster.endpoints()))
        .await
        .unwrap();
    let waiter = Arc::new(
        EtcdBackend::connect(config(vec![proxy.endpoint()]))
            .await
            .unwrap(),
    );
    let guard = holder.lock("storm").await.unwrap();
    let waiting = {
        let waiter = Arc::clone(&waiter);
        tokio::spawn(async move { waiter.lock("storm").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_mode(ProxyMode::Refuse);
    let before = seen.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let retries = seen.load(Ordering::SeqCst) - before;
    eprintln!("waiter retries in 6 s of refused connections: {retries}");
    waiting.abort();
    drop(guard);
    assert!(retries >= 1, "the waiter must have noticed the failures");
    assert!(retries <= 8, "{retries} retries in 6 s: no backoff");
}
