//! `cargo run --release -p fencelock-bench -- all`: latency, handoff, semaphores, many locks at
//! once, scale, loss detection and election failover on real etcd and ZooKeeper (single node and
//! 3-node cluster), each figure next to its limit and the peer clients, as ratios measured in
//! the same run. Writes `target/bench/handoff.svg`.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is the report

mod cpu;
mod failover;
mod fence;
mod handoff;
mod latency;
mod loss;
mod many;
mod plot;
mod scale;
mod semaphore;
mod servers;
mod stats;

use servers::Servers;
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

/// Counts heap bytes, for the memory per held lock.
#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// A count of 1 or more from the environment variable `name`, `default` when it is unset; a
/// bad value stops the run with its name, not a silent default.
fn count_from_env(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{name}={n:?}: a count of 1 or more")),
    }
}

#[tokio::main]
async fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let known = [
        "all",
        "latency",
        "handoff",
        "semaphore",
        "scale",
        "many",
        "loss",
        "failover",
        "fence",
        "cpu",
    ];
    if !known.contains(&what.as_str()) {
        eprintln!("usage: fencelock-bench [{}]", known.join("|"));
        std::process::exit(64);
    }
    if what == "cpu" {
        // For a profile: one client, `n` operations (see `cpu.rs`).
        let arg = |i: usize| std::env::args().nth(i).unwrap_or_default();
        cpu::run(&arg(2), &arg(3), arg(4).parse().unwrap_or(0)).await;
        return;
    }
    let wants = |part: &str| what == "all" || what == part;
    let started = std::time::Instant::now();
    let mut handoffs = Vec::new();
    // `FENCELOCK_BENCH_SIZES=1` (or `3`) runs one cluster size only, e.g. for a profile.
    let sizes = std::env::var("FENCELOCK_BENCH_SIZES").unwrap_or_else(|_| "1,3".into());
    for size in [1, 3] {
        if what == "fence" {
            break; // needs only PostgreSQL
        }
        if !sizes.split(',').any(|s| s.trim() == size.to_string()) {
            continue;
        }
        let servers = Servers::start(size);
        if wants("latency") {
            latency::run(&servers).await;
        }
        if wants("handoff") {
            handoffs.extend(handoff::run(&servers).await);
        }
        if wants("semaphore") {
            semaphore::run(&servers).await;
        }
        if wants("many") {
            many::run(&servers).await;
        }
        if size == 1 && wants("scale") {
            scale::run(&servers).await;
        }
        if size == 1 && wants("loss") {
            loss::run(&servers).await;
        }
        if wants("failover") {
            failover::run(&servers).await;
        }
    }
    if wants("fence") {
        fence::run().await;
    }
    if !handoffs.is_empty() {
        let path = plot::write(&handoffs);
        println!("\nplot: {}", path.display());
    }
    println!("\nall done in {:.0?}", started.elapsed());
}
