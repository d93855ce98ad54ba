//! Fencing at the resource: the PostgreSQL guarded write against the plain write, and the
//! tower layer's cost per request, measured in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::put;
use axum::Router;
use fencelock::{format_header, FencingToken};
use fencelock_fence::http::FenceLayer;
use fencelock_fence::postgres::{PgFence, PgFenceStore};
use fencelock_fence::Fence;
use fencelock_testsupport::PgServer;
use tokio_postgres::{Client, NoTls};
use tower::{Service, ServiceExt};

use crate::stats::{cpu_time, ms, percentiles, ratio, tree_cpu_time};

const WRITES: usize = 2000;
const REQUESTS: usize = 20_000;
const TASKS: usize = 4;
/// The writes in each block of concurrent writes (enough for half a second or more: a shorter
/// block measures the scheduler).
const BLOCK_WRITES: usize = 8000;

/// Alternating blocks of the concurrent writes, 8 of each kind; `FENCELOCK_BENCH_BLOCKS` sets
/// another count (more for a steadier ratio on a noisy machine).
fn blocks() -> usize {
    crate::count_from_env("FENCELOCK_BENCH_BLOCKS", 8)
}

async fn connect(pg: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// How a bench write is guarded.
#[derive(Clone, Copy, PartialEq)]
enum Guard {
    Plain,
    /// Not a guard: the plain write with one trivial statement (`SELECT 1`) pipelined beside
    /// it, the least any admission that is a statement of its own can cost.
    Floor,
    Admit,
    Pipelined,
    /// Not a guard: the plain write with the admission's row lock alone (`SELECT ... FOR
    /// SHARE` of the fence row, the held token's path without the `coalesce` around it)
    /// pipelined beside it: the least an admission that locks the row can cost.
    RowLock,
    /// The plain UPDATE in autocommit (no `BEGIN`/`COMMIT`): what `Condition` compares with.
    Autocommit,
    /// The admission inside the UPDATE's own `WHERE` (`PgFence::condition`, `execute`), in
    /// autocommit.
    Condition,
}

/// Where in `guards` the write that `guard`'s ratios are taken against is: the plain write
/// with the same transaction shape.
fn reference_of(guards: &[(Guard, &str)], guard: Guard) -> usize {
    let reference = match guard {
        Guard::Autocommit | Guard::Condition => Guard::Autocommit,
        _ => Guard::Plain,
    };
    guards
        .iter()
        .position(|(g, _)| *g == reference)
        .unwrap_or(0)
}

const UPDATE: &str = "UPDATE bench_acct SET value = value + 1 WHERE id = $1";

/// `n` transactions updating row `id`, guarded as `guard` says, the UPDATE and the admission
/// prepared once (`prepared`, as a statement cache does) or sent as text (parsed by each
/// call); latencies.
async fn writes(
    client: &mut Client,
    fence: &PgFence,
    guard: Guard,
    prepared: bool,
    id: i32,
    n: usize,
    start: Option<&tokio::sync::Barrier>,
) -> Vec<Duration> {
    let statement = client.prepare(UPDATE).await.unwrap();
    let admission = fence.prepare(&*client).await.unwrap();
    let one = client.prepare("SELECT 1").await.unwrap();
    let conditioned = format!("{UPDATE} AND {}", fence.condition(2).unwrap());
    let conditioned_statement = client.prepare(&conditioned).await.unwrap();
    let row_lock = client
        .prepare(&format!(
            "SELECT token FROM {} WHERE lock = 'bench' AND token = 7 FOR SHARE",
            fence.table()
        ))
        .await
        .unwrap();
    if let Some(start) = start {
        start.wait().await;
    }
    let mut samples = Vec::with_capacity(n);
    let token = FencingToken::new(7);
    for _ in 0..n {
        let started = Instant::now();
        if matches!(guard, Guard::Autocommit | Guard::Condition) {
            let client = &*client;
            let updated = match (guard, prepared) {
                (Guard::Autocommit, true) => client.execute(&statement, &[&id]).await.unwrap(),
                (Guard::Autocommit, false) => client.execute(UPDATE, &[&id]).await.unwrap(),
                (_, true) => fence
                    .execute(client, &conditioned_statement, &[&id], "bench", token)
                    .await
                    .unwrap(),
                (_, false) => fence
                    .execute(client, conditioned.as_str(), &[&id], "bench", token)
                    .await
                    .unwrap(),
            };
            assert_eq!(updated, 1);
            samples.push(started.elapsed());
            continue;
        }
        let tx = client.transaction().await.unwrap();
        let update = async {
            if prepared {
                tx.execute(&statement, &[&id]).await
            } else {
                tx.execute(UPDATE, &[&id]).await
            }
        };
        let updated = match guard {
            Guard::Plain => update.await,
            Guard::Autocommit | Guard::Condition => unreachable!("sent in autocommit, above"),
            Guard::Floor | Guard::RowLock => {
                let beside = if guard == Guard::Floor {
                    &one
                } else {
                    &row_lock
                };
                let (selected, updated) = tokio::join!(tx.query_one(beside, &[]), update);
                selected.unwrap();
                updated
            }
            Guard::Admit if prepared => {
                admission.admit(&tx, "bench", token).await.unwrap();
                update.await
            }
            Guard::Admit => {
                fence.admit(&tx, "bench", token).await.unwrap();
                update.await
            }
            Guard::Pipelined if prepared => admission
                .admit_then(&tx, "bench", token, update)
                .await
                .unwrap(),
            Guard::Pipelined => fence.admit_then(&tx, "bench", token, update).await.unwrap(),
        };
        assert_eq!(updated.unwrap(), 1);
        tx.commit().await.unwrap();
        samples.push(started.elapsed());
    }
    samples
}

/// What a block of concurrent writes took: wall time, and CPU time in this process (the
/// clients) and in the server.
#[derive(Clone, Copy, Default)]
struct Took {
    elapsed: Duration,
    client: Duration,
    server: Duration,
}

impl Took {
    fn add(&mut self, block: Took) {
        self.elapsed += block.elapsed;
        self.client += block.client;
        self.server += block.server;
    }
}

/// `TASKS` connections writing their own rows at once, `BLOCK_WRITES` in all; what that took
/// (connected and prepared before the clock starts).
async fn concurrent(pg: &Arc<PgServer>, guard: Guard) -> Took {
    let start = Arc::new(tokio::sync::Barrier::new(TASKS + 1));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let pg = Arc::clone(pg);
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                let mut client = connect(&pg).await;
                let fence = PgFence::new("bench_fence").unwrap();
                let id = i32::try_from(i).unwrap() + 10;
                writes(
                    &mut client,
                    &fence,
                    guard,
                    true,
                    id,
                    BLOCK_WRITES / TASKS,
                    Some(&start),
                )
                .await;
            })
        })
        .collect();
    start.wait().await;
    let server = pg.pid().unwrap();
    let (started, client, served) = (Instant::now(), cpu_time(), tree_cpu_time(server));
    for t in tasks {
        t.await.unwrap();
    }
    Took {
        elapsed: started.elapsed(),
        client: cpu_time().saturating_sub(client),
        server: tree_cpu_time(server).saturating_sub(served),
    }
}

/// `n` requests through `router` in process (no network), with the header; latencies.
async fn requests(router: Router, n: usize) -> Vec<Duration> {
    let mut service = router.into_service::<axum::body::Body>();
    let header = format_header("bench", FencingToken::new(7));
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let request = http::Request::put("/w")
            .header("Fencing-Token", &header)
            .body(axum::body::Body::empty())
            .unwrap();
        let started = Instant::now();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        samples.push(started.elapsed());
    }
    samples
}

pub async fn run() {
    let pg = Arc::new(PgServer::start());
    let mut client = connect(&pg).await;
    client
        .batch_execute(
            "CREATE TABLE bench_acct (id int PRIMARY KEY, value bigint NOT NULL); \
             INSERT INTO bench_acct SELECT g, 0 FROM generate_series(1, 20) g",
        )
        .await
        .unwrap();
    let fence = PgFence::new("bench_fence").unwrap();
    fence.create_table(&client).await.unwrap();

    println!("\n## Fencing at the resource (PostgreSQL 15, one connection per writer)\n");
    let guards = [
        (Guard::Plain, "plain transaction (UPDATE)"),
        (Guard::Admit, "guarded: admit, then UPDATE"),
        (Guard::Pipelined, "guarded: admit_then(UPDATE), pipelined"),
        (Guard::Autocommit, "plain UPDATE in autocommit"),
        (
            Guard::Condition,
            "guarded, autocommit: the admission in the UPDATE's WHERE (`condition`)",
        ),
    ];
    println!(
        "| write | UPDATE and admission | p50 | p99 | p50 / plain, same shape (target <= 1.3x) | p99 / plain |"
    );
    println!("|---|---|---|---|---|---|");
    // "Same shape": the transaction rows against the plain transaction, the autocommit rows
    // against the plain UPDATE in autocommit.
    for prepared in [true, false] {
        // Warm up, then alternate blocks so that drift in the machine hits all alike.
        for (guard, _) in guards {
            writes(&mut client, &fence, guard, prepared, 1, 200, None).await;
        }
        let mut samples = [(); 5].map(|()| Vec::new());
        for _ in 0..4 {
            for (i, (guard, _)) in guards.iter().enumerate() {
                samples[i].extend(
                    writes(&mut client, &fence, *guard, prepared, 1, WRITES / 4, None).await,
                );
            }
        }
        let figures: Vec<_> = samples.iter_mut().map(|s| percentiles(s)).collect();
        let kind = if prepared { "prepared" } else { "text" };
        for (i, (guard, name)) in guards.iter().enumerate() {
            let (p50, p99) = figures[i];
            let reference = reference_of(&guards, *guard);
            let (ratio50, ratio99) = if reference == i {
                ("-".to_owned(), "-".to_owned())
            } else {
                let (ref50, ref99) = figures[reference];
                (ratio(p50, ref50), ratio(p99, ref99))
            };
            println!(
                "| {name} | {kind} | {} | {} | {ratio50} | {ratio99} |",
                ms(p50),
                ms(p99)
            );
        }
    }
    println!("\n{TASKS} writers at once, own rows, UPDATE and admission prepared:\n");
    println!(
        "| write | writes/s | plain / this | client CPU / write | server CPU / write | \
         CPU / plain's |"
    );
    println!("|---|---|---|---|---|---|");
    // Alternating blocks, as above: drift in the machine hits all alike.
    let floor = (Guard::Floor, "floor: plain + a pipelined `SELECT 1`");
    let row_lock = (
        Guard::RowLock,
        "row lock alone: plain + a pipelined `SELECT ... FOR SHARE`",
    );
    let guards = [
        guards[0], guards[1], guards[2], floor, row_lock, guards[3], guards[4],
    ];
    let mut took = [Took::default(); 7];
    let blocks = blocks();
    for _ in 0..blocks {
        for (i, (guard, _)) in guards.iter().enumerate() {
            took[i].add(concurrent(&pg, *guard).await);
        }
    }
    let writes = (blocks * BLOCK_WRITES) as f64;
    let rate = |i: usize| writes / took[i].elapsed.as_secs_f64();
    let per_write = |d: Duration| d.as_secs_f64() * 1e6 / writes;
    let cpu = |i: usize| per_write(took[i].client + took[i].server);
    for (i, (guard, name)) in guards.iter().enumerate() {
        let reference = reference_of(&guards, *guard);
        println!(
            "| {name} | {:.0} | {:.2}x | {:.0} µs | {:.0} µs | {:.2}x |",
            rate(i),
            rate(reference) / rate(i),
            per_write(took[i].client),
            per_write(took[i].server),
            cpu(i) / cpu(reference)
        );
    }

    println!("\n## FenceLayer per request (axum, in process, no network)\n");
    let app = || Router::new().route("/w", put(|| async { "ok" }));
    let store = Arc::new(
        PgFenceStore::connect(&pg.url(), "bench_layer", 4)
            .await
            .unwrap(),
    );
    requests(app(), 1000).await;
    let (mut bare, mut memory) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        bare.extend(requests(app(), REQUESTS / 4).await);
        memory.extend(
            requests(
                app().layer(FenceLayer::new(Arc::new(Fence::new()))),
                REQUESTS / 4,
            )
            .await,
        );
    }
    let mut postgres = requests(app().layer(FenceLayer::new(store)), WRITES).await;
    let (bare50, bare99) = percentiles(&mut bare);
    let (memory50, memory99) = percentiles(&mut memory);
    let (pg50, pg99) = percentiles(&mut postgres);
    println!("| service | p50 | p99 | added at p50 |");
    println!("|---|---|---|---|");
    println!("| no layer | {} | {} | - |", us(bare50), us(bare99));
    println!(
        "| FenceLayer, memory Fence | {} | {} | {} |",
        us(memory50),
        us(memory99),
        us(memory50.saturating_sub(bare50))
    );
    println!(
        "| FenceLayer, PgFenceStore | {} | {} | {} |",
        us(pg50),
        us(pg99),
        us(pg50.saturating_sub(bare50))
    );
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}
