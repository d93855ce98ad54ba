//! Issue 13.5: one black-holed member must not cost a client its locks while the other members
//! answer: renewals move to another endpoint within the TTL.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use fencelock::{LockBackend, LockBackendExt};
use fencelock_etcd::EtcdBackend;
use fencelock_testsupport::{unique, EtcdCluster, ProxyMode, TcpProxy};

/// Runs (`FENCELOCK_FAILOVER_RUNS`, default 3; the figure is over 20).
fn runs() -> usize {
    std::env::var("FENCELOCK_FAILOVER_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
}

/// Three members, one proxy each, the client on all three. In each run, each member's link is
/// black-holed in turn for longer than the TTL, so whichever carries the keepalive stream is
/// cut once; the lock must survive every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_member_costs_no_lock_while_the_others_answer() {
    let cluster = EtcdCluster::start(3);
    let mut proxies = Vec::new();
    for member in &cluster.members {
        proxies.push(TcpProxy::start(format!("127.0.0.1:{}", member.client_port)).await);
    }
    let endpoints: Vec<String> = proxies.iter().map(TcpProxy::endpoint).collect();
    let ttl = common::TTL;
    let (mut losses, runs) = (0, runs());
    for run in 0..runs {
        let config = common::config(endpoints.clone(), &format!("{}/", unique("failover")));
        let backend = EtcdBackend::connect(config).await.unwrap();
        let guard = backend.lock("job").await.unwrap();
        let mut lost_at = None;
        for (i, proxy) in proxies.iter().enumerate() {
            proxy.set_mode(ProxyMode::BlackHole);
            let cut = tokio::time::timeout(ttl + Duration::from_secs(1), guard.lost()).await;
            proxy.set_mode(ProxyMode::Forward);
            if cut.is_ok() {
                lost_at = Some(i);
                break;
            }
            // Let the healed link come back before cutting the next one.
            tokio::time::sleep(ttl / 3).await;
        }
        match lost_at {
            Some(i) => {
                losses += 1;
                eprintln!("run {run}: lost while member {i} was black-holed");
            }
            None => eprintln!("run {run}: held through all three cuts"),
        }
        drop(guard);
        let _ = backend.close().await;
    }
    eprintln!("losses: {losses} of {runs} runs");
    assert_eq!(losses, 0, "{losses} of {runs} runs lost the lock");
}
