//! Handoff with N permits: contenders (separate sessions) each loop acquire a permit, hold it
//! briefly, release. Run with 8 and with 32 contenders: the requests per handoff must not grow
//! with the contenders (only the gate's holder waits on the permits: no herd).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{LockBackend, Semaphore};
use fencelock_testsupport::four_letter;

use crate::servers::Servers;
use crate::stats::{ms, percentiles};

const PERMITS: [u32; 3] = [1, 2, 4];
const CONTENDERS: [usize; 2] = [8, 32];

/// Grants after which every contender leaves at its next grant.
const GRANTS: usize = 200;

/// Long enough that more permits can mean more throughput; short next to the run.
const HOLD: Duration = Duration::from_millis(5);

/// Contenders also stop asking after this long; the run is abandoned a little later.
const LIMIT: Duration = Duration::from_secs(60);

/// How long the open, idle sessions are watched for the requests they send on their own
/// (ZooKeeper's loss probes and pings, 32 sessions' worth), which are then subtracted.
const IDLE: Duration = Duration::from_secs(2);

enum Mark {
    Acquired(Instant),
    Releasing(Instant),
}

struct Run {
    waits: Vec<Duration>,
    /// Grants whose wait began at the previous grant: a permit was already free.
    gate_bound: usize,
    grants: usize,
    elapsed: Duration,
}

async fn contend(backends: Vec<Arc<dyn LockBackend>>, permits: u32) -> Option<Run> {
    let marks = Arc::new(Mutex::new(Vec::new()));
    let grants = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks: Vec<_> = backends
        .into_iter()
        .map(|backend| {
            let (marks, grants) = (Arc::clone(&marks), Arc::clone(&grants));
            tokio::spawn(async move {
                let pool = Semaphore::new(backend.as_ref(), "handoff", permits).unwrap();
                // Bounded by GRANTS grants in all (or LIMIT); then every task leaves at its turn.
                loop {
                    let permit = pool.acquire().await.unwrap();
                    marks.lock().unwrap().push(Mark::Acquired(Instant::now()));
                    let n = grants.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(HOLD).await;
                    marks.lock().unwrap().push(Mark::Releasing(Instant::now()));
                    let _ = permit.release().await.unwrap();
                    if n >= GRANTS || started.elapsed() > LIMIT {
                        return;
                    }
                }
            })
        })
        .collect();
    let joined = tokio::time::timeout(LIMIT + Duration::from_secs(30), async {
        for task in &mut tasks {
            task.await.unwrap();
        }
    })
    .await;
    if joined.is_err() {
        tasks.iter().for_each(|t| t.abort());
        return None;
    }
    let elapsed = started.elapsed();
    let marks = marks.lock().unwrap();
    let (waits, gate_bound) = waits(&marks, permits, started);
    Some(Run {
        waits,
        gate_bound,
        grants: grants.load(Ordering::SeqCst),
        elapsed,
    })
}

/// Each grant's wait (after the first), and how many of them waited on the gate rather than on
/// a release. A grant needs a free permit and the gate: its wait starts when both were there,
/// at the later of the previous grant (the gate's last admission) and the time a permit was
/// free since (the start for the N permits, else a release call, oldest first: permits are
/// alike). Pairing grants only with releases, as a first version did, found no handoff at all
/// on the 3-node clusters with 4 permits: the gate admitted more slowly than permits came
/// back, so a permit was always free and no grant waited for a release.
fn waits(marks: &[Mark], permits: u32, started: Instant) -> (Vec<Duration>, usize) {
    let mut free: VecDeque<Instant> = (0..permits).map(|_| started).collect();
    let (mut previous, mut gate_bound) = (None, 0);
    let mut waits = Vec::new();
    for mark in marks {
        match mark {
            Mark::Releasing(at) => free.push_back(*at),
            Mark::Acquired(at) => {
                // Never empty: between the marks, at most N permits are held.
                let freed = free.pop_front().unwrap_or(*at);
                if let Some(previous) = previous {
                    gate_bound += usize::from(previous >= freed);
                    waits.push(at.saturating_duration_since(freed.max(previous)));
                }
                previous = Some(*at);
            }
        }
    }
    (waits, gate_bound)
}

/// Server-side counters, summed over the members: etcd's Txn, Range and Watch messages and the
/// watch events it sent; ZooKeeper's packets received and sent (`srvr`; sent includes watch
/// notifications, where a herd would show).
fn counts(servers: &Servers, backend: &str) -> [f64; 4] {
    let sum = |f: &dyn Fn(usize) -> f64| (0..servers.size).map(f).sum::<f64>();
    if backend == "etcd" {
        let rpc = |m: &str| sum(&|i| servers.etcd.rpc_count(i, m) as f64);
        let events = sum(&|i| servers.etcd.metric(i, "etcd_debugging_mvcc_events_total"));
        [rpc("Txn"), rpc("Range"), rpc("Watch"), events]
    } else {
        let srvr = |what: &str| {
            sum(&|i| {
                four_letter(servers.zk.members[i].client_port, "srvr")
                    .lines()
                    .find_map(|l| l.strip_prefix(what))
                    .and_then(|n| n.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            })
        };
        [srvr("Received: "), srvr("Sent: "), 0.0, 0.0]
    }
}

fn delta(after: [f64; 4], before: [f64; 4]) -> [f64; 4] {
    std::array::from_fn(|i| after[i] - before[i])
}

/// "a txn, b range, ..." per handoff.
fn per_handoff(backend: &str, counts: [f64; 4], handoffs: f64) -> String {
    let [a, b, c, d] = counts.map(|n| n / handoffs);
    if backend == "etcd" {
        format!("{a:.1} txn, {b:.1} range, {c:.1} watch msgs; {d:.1} watch events sent")
    } else {
        format!("{a:.1} received, {b:.1} sent")
    }
}

pub async fn run(servers: &Servers) {
    println!(
        "\n### Semaphore handoff ({}; each contender: acquire, hold {HOLD:?}, release; {GRANTS} grants, then each leaves at its next grant)\n",
        servers.member0()
    );
    println!("Wait: from the moment a grant became possible (a permit free and the gate's previous admission done, whichever came later) to the grant. Gate-bound: the share of grants for which a permit was already free, so the gate's serial admissions, not the permits, set the pace.\n");
    println!("Requests are counted by the servers and are per handoff, net of what the idle sessions sent on their own over {IDLE:?} (scaled to the run; shown last).\n");
    println!("| setup | permits | contenders | permits granted/s | handoffs | gate-bound | p50 wait | p99 wait | requests per handoff (server side) | idle sessions' own, per handoff |\n|---|---|---|---|---|---|---|---|---|---|");
    for backend in ["etcd", "zookeeper"] {
        let label = servers.label(backend);
        for permits in PERMITS {
            for n in CONTENDERS {
                let backends = servers.contenders(backend, n).await;
                let idle_from = counts(servers, backend);
                tokio::time::sleep(IDLE).await;
                let idle = delta(counts(servers, backend), idle_from);
                let before = counts(servers, backend);
                let Some(mut run) = contend(backends, permits).await else {
                    println!(
                        "| {label} | {permits} | {n} | timed out after {LIMIT:?} | | | | | | |"
                    );
                    continue;
                };
                let used = delta(counts(servers, backend), before);
                let scale = run.elapsed.as_secs_f64() / IDLE.as_secs_f64();
                let background = idle.map(|x| x * scale);
                let net = std::array::from_fn(|i| used[i] - background[i]);
                let handoffs = run.waits.len().max(1) as f64;
                let (p50, p99) = percentiles(&mut run.waits);
                println!(
                    "| {label} | {permits} | {n} | {:.0} | {} | {:.0}% | {} | {} | {} | {} |",
                    run.grants as f64 / run.elapsed.as_secs_f64(),
                    run.waits.len(),
                    100.0 * run.gate_bound as f64 / handoffs,
                    ms(p50),
                    ms(p99),
                    per_handoff(backend, net, handoffs),
                    per_handoff(backend, background, handoffs)
                );
            }
        }
    }
}
