//! The demonstration: why a lease needs a fencing token. Runs in well under a minute on the
//! in-memory backend, no servers needed: `cargo run --example demo`.
//!
//! Two workers share a lock with a 3 s TTL. Worker A takes it, then "pauses" (as in a long GC
//! pause) past its TTL; worker B takes the lock with a greater token and writes; A wakes up and
//! tries to write. With fencing the resource refuses A; without, A's write silently overwrites B's.

use std::time::Duration;

use fencelock::{Fence, FencingToken, LockBackendExt, MemoryBackend, MemoryConfig, MemoryStore};
use tokio::sync::Mutex;

const TTL: Duration = Duration::from_secs(3);

/// The protected resource: one value, optionally behind a fence.
struct Register {
    fence: Option<Fence>,
    value: Mutex<String>,
}

impl Register {
    async fn write(&self, who: &str, token: FencingToken, value: &str) {
        let mut current = self.value.lock().await;
        if let Some(fence) = &self.fence {
            match fence.admit("balance", token) {
                Ok(_permit) => {}
                Err(e) => {
                    println!("  resource: REFUSED {who}'s write ({e})");
                    return;
                }
            }
        }
        println!("  resource: accepted {who}'s write {value:?} (token {token})");
        *current = value.to_owned();
    }
}

async fn scenario(fenced: bool) -> fencelock::Result<String> {
    let store = MemoryStore::new();
    let worker_a = MemoryBackend::with_config(&store, MemoryConfig::with_ttl(TTL))?;
    let worker_b = MemoryBackend::with_config(&store, MemoryConfig::with_ttl(TTL))?;
    let register = Register {
        fence: fenced.then(Fence::new),
        value: Mutex::new("100".into()),
    };

    let a = worker_a.lock("balance").await?;
    println!(
        "  A: acquired `balance` with token {}, read balance 100",
        a.token()
    );
    println!(
        "  A: pauses (GC, SIGSTOP) for {:?}, longer than the {TTL:?} TTL",
        TTL * 2
    );
    worker_a.pause_renewals(true).await; // a paused process sends no renewals

    let b = worker_b.lock("balance").await?;
    println!(
        "  B: the lease ran out; B acquired `balance` with token {}",
        b.token()
    );
    register
        .write("B", b.token(), "150 (100 + 50 deposit)")
        .await;
    let _ = b.release().await?;

    tokio::time::sleep(TTL).await; // A's pause continues a little longer
    println!(
        "  A: wakes up; its guard says held = {} (a careful worker would stop here)",
        a.is_held()
    );
    // The classic bug: A acts on what it read before the pause, ignoring the guard.
    register
        .write("A", a.token(), "70 (100 - 30 withdrawal)")
        .await;
    let outcome = a.release().await?;
    println!("  A: release -> {outcome:?} (owner-checked: B's lock was never touched)");
    let final_value = register.value.lock().await.clone();
    Ok(final_value)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> fencelock::Result<()> {
    // Tokio's paused clock makes the run instant and the same every time.
    tokio::time::pause();
    println!("With fencing (the resource checks the token):");
    let fenced = scenario(true).await?;
    println!("  => final balance {fenced}: B's deposit survived\n");
    println!("Without fencing (a lease alone):");
    let unfenced = scenario(false).await?;
    println!("  => final balance {unfenced}: B's deposit is LOST (lost update)");
    Ok(())
}
