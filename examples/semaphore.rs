//! A pool of 2 permits shared by 4 workers: `cargo run --example semaphore`.
//!
//! Four workers on one in-memory store (etcd or ZooKeeper work the same: swap the backend), as
//! four processes would be. At most two work at once; a worker whose lease runs out loses its
//! permit (`lost` stops its work), and a waiting worker gets it.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::{MemoryBackend, MemoryConfig, MemoryStore, Result, Semaphore};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let store = MemoryStore::new();
    let config = MemoryConfig::with_ttl(Duration::from_millis(300));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for id in 0..4 {
        let backend = MemoryBackend::with_config(&store, config.clone())?;
        let inside = Arc::clone(&inside);
        workers.push(tokio::spawn(async move {
            let pool = Semaphore::new(&backend, "encoders", 2)?;
            let permit = pool.acquire().await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            println!(
                "worker {id}: permit with token {} ({now} of 2 in use)",
                permit.token()
            );
            if id == 0 {
                // Worker 0 stalls: its renewals stop, the store expires its lease, and `run`
                // drops its work the moment `lost` fires, before the permit is handed on.
                backend.pause_renewals(true).await;
                let outcome = permit.run(tokio::time::sleep(Duration::from_secs(5))).await;
                println!(
                    "worker {id}: {}",
                    match outcome {
                        Ok(()) => "finished".to_owned(),
                        Err(e) => format!("stopped: {e}"),
                    }
                );
            } else {
                permit
                    .run(tokio::time::sleep(Duration::from_millis(200)))
                    .await?;
                println!("worker {id}: done, releasing");
            }
            inside.fetch_sub(1, Ordering::SeqCst);
            let _ = permit.release().await;
            Result::Ok(())
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for worker in workers {
        match worker.await {
            Ok(outcome) => outcome?,
            Err(e) => println!("a worker failed: {e}"),
        }
    }
    Ok(())
}
