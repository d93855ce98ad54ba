//! Requests per operation, counted by the server (`srvr`'s Received), not timed.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use fencelock::LockBackendExt;
use fencelock_testsupport::{four_letter, unique, ZkEnsemble};
use fencelock_zookeeper::{ZkBackend, ZkConfig};

fn received(ensemble: &ZkEnsemble) -> u64 {
    four_letter(ensemble.members[0].client_port, "srvr")
        .lines()
        .find_map(|l| l.strip_prefix("Received: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("srvr reports Received")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_is_two_requests_and_release_one_plus_a_watch_of_our_node() {
    let ensemble = ZkEnsemble::start(1);
    // A long timeout keeps the session's own probes (one per timeout/3) out of the window.
    let config = ZkConfig::new(ensemble.connect_string())
        .base_path(format!("/{}", unique("rt")))
        .session_timeout(Duration::from_secs(10));
    let backend = ZkBackend::connect(config).await.unwrap();
    let _ = backend.lock("job").await.unwrap().release().await.unwrap();
    // Each `srvr` is itself one received packet.
    let idle = {
        let a = received(&ensemble);
        received(&ensemble) - a
    };
    const CYCLES: u64 = 20;
    let before = received(&ensemble);
    for _ in 0..CYCLES {
        let guard = backend.lock("job").await.unwrap();
        // The exists-watch on our node goes out from a task of its own right after the grant;
        // a lock released before that task runs never sends it. Give it the time to go out
        // (20 ms was once too short on the busy machine of a full run: 79 of 80).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = guard.release().await.unwrap();
    }
    let used = received(&ensemble) - before - idle;
    eprintln!(
        "{CYCLES} acquire+release cycles: {used} requests ({:.2} per cycle)",
        used as f64 / CYCLES as f64
    );
    // create + multi-read + exists-watch + delete per cycle; at most one probe or ping may
    // fall in the window (probes every tick_time / 2 = 1 s here).
    assert!(
        (4 * CYCLES..=4 * CYCLES + 2).contains(&used),
        "{used} requests for {CYCLES} cycles"
    );
}
