//! Readers share, a writer waits its turn: `cargo run --example rwlock`.
//!
//! Four processes' worth of instances on one in-memory store (etcd or ZooKeeper work the same:
//! swap the backend). Two readers hold `config` together; a writer arrives and waits; a reader
//! that arrives after the writer waits behind it (arrival order: no writer starvation). The
//! writer admits its token at the resource's fence; a reader checks its own token against the
//! fence to know whether a writer got in after its grant.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use fencelock::{Fence, FencingToken, MemoryStore, Result, RwLock};

/// A reader's check at the resource: its grant came after every write with a lower token, so
/// what it read is current while no writer with a greater token has been admitted.
fn still_current(fence: &Fence, read: FencingToken) -> bool {
    fence.highest("config").is_none_or(|written| written < read)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let store = MemoryStore::new();
    let fence = Arc::new(Fence::new());
    let (a, b) = (store.backend(), store.backend());
    let first = RwLock::new(&a, "config")?.read().await?;
    let second = RwLock::new(&b, "config")?.read().await?;
    println!(
        "readers 1 and 2 hold `config` together (tokens {} and {})",
        first.token(),
        second.token()
    );

    let (backend, fence_w) = (store.backend(), Arc::clone(&fence));
    let writer = tokio::spawn(async move {
        let guard = RwLock::new(&backend, "config")?.write().await?;
        println!("writer: granted with token {}", guard.token());
        let permit = fence_w.admit("config", guard.token()).await?;
        drop(permit); // the write itself happens while the permit is held
        guard.release().await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (backend, fence_r) = (store.backend(), Arc::clone(&fence));
    let late = tokio::spawn(async move {
        let guard = RwLock::new(&backend, "config")?.read().await?;
        println!(
            "late reader: granted with token {}, after the writer; reads current data: {}",
            guard.token(),
            still_current(&fence_r, guard.token())
        );
        guard.release().await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!(
        "the writer waits for the readers, the late reader for the writer: {}",
        !writer.is_finished() && !late.is_finished()
    );

    let old = first.token();
    let _ = (first.release().await?, second.release().await?);
    println!("readers 1 and 2: released");
    for task in [writer, late] {
        match task.await {
            Ok(released) => drop(released?),
            Err(e) => println!("a task failed: {e}"),
        }
    }
    println!(
        "a reader still acting on token {old} would read current data: {} (a writer got in)",
        still_current(&fence, old)
    );
    Ok(())
}
