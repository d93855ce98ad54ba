//! A leader that fences its writes with its term: `cargo run --example leader`.
//!
//! Two candidates on one in-memory store (etcd or ZooKeeper work the same: swap the backend).
//! The first leader stalls past its lease; the second is elected and writes; when the first
//! wakes and writes with its old term, the resource refuses it.
#![forbid(unsafe_code)]

use std::time::Duration;

use fencelock::{Fence, LockBackend, LockBackendExt, LockName, MemoryConfig, MemoryStore, Result};
use futures::StreamExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let store = MemoryStore::new();
    let config = MemoryConfig::with_ttl(Duration::from_millis(300));
    let (a, b) = (
        fencelock::MemoryBackend::with_config(&store, config.clone())?,
        fencelock::MemoryBackend::with_config(&store, config)?,
    );
    let jobs = Fence::new(); // lives in the resource the leader writes to
    let name = LockName::new("scheduler")?;

    // An observer: the leader now, then every change.
    let mut changes = b.observe(&name);
    let mut observe = async || match changes.next().await {
        Some(Ok(Some(leader))) => println!(
            "  observed: {} leads (term {})",
            leader.value_lossy(),
            leader.term
        ),
        Some(Ok(None)) => println!("  observed: no leader"),
        Some(Err(e)) => println!("  observe failed: {e}"),
        None => {}
    };
    observe().await;

    let first = a.campaign("scheduler", "node-a").await?;
    let write = jobs.admit("scheduler", first.term()).await?;
    println!("node-a leads with term {}, writes", first.term());
    drop(write);
    observe().await;

    a.pause_renewals(true).await; // node-a stalls: a GC pause, a frozen VM
    let second = b.campaign("scheduler", "node-b").await?; // elected once node-a's lease ends
    let write = jobs.admit("scheduler", second.term()).await?;
    println!("node-b leads with term {}, writes", second.term());
    drop(write);
    observe().await;

    // node-a wakes and writes with its old term: the resource refuses it.
    match jobs.admit("scheduler", first.term()).await {
        Err(e) => println!("node-a's write refused: {e}"),
        Ok(_) => println!("node-a's write accepted: fencing failed"),
    }
    let _ = second.resign().await?;
    observe().await;
    drop(first);
    Ok(())
}
