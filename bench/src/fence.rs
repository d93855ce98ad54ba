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

use crate::stats::{ms, percentiles, ratio};

const WRITES: usize = 2000;
const REQUESTS: usize = 20_000;
const TASKS: usize = 4;

async fn connect(pg: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// `n` transactions updating row `id`, guarded by `fence` or not; per-transaction latencies.
async fn writes(client: &mut Client, fence: Option<&PgFence>, id: i32, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let tx = client.transaction().await.unwrap();
        if let Some(fence) = fence {
            fence
                .admit(&tx, "bench", FencingToken::new(7))
                .await
                .unwrap();
        }
        tx.execute(
            "UPDATE bench_acct SET value = value + 1 WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        samples.push(started.elapsed());
    }
    samples
}

/// `TASKS` connections writing their own rows at once; writes per second.
async fn concurrent(pg: &Arc<PgServer>, fenced: bool) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let pg = Arc::clone(pg);
            tokio::spawn(async move {
                let mut client = connect(&pg).await;
                let fence = PgFence::new("bench_fence").unwrap();
                let id = i32::try_from(i).unwrap() + 10;
                writes(&mut client, fenced.then_some(&fence), id, WRITES / TASKS).await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (WRITES / TASKS * TASKS) as f64 / started.elapsed().as_secs_f64()
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
    // Warm up, then alternate blocks so that drift in the machine hits both alike.
    writes(&mut client, Some(&fence), 1, 200).await;
    writes(&mut client, None, 1, 200).await;
    let (mut plain, mut guarded) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        plain.extend(writes(&mut client, None, 1, WRITES / 4).await);
        guarded.extend(writes(&mut client, Some(&fence), 1, WRITES / 4).await);
    }
    let (plain50, plain99) = percentiles(&mut plain);
    let (guarded50, guarded99) = percentiles(&mut guarded);
    let plain_rate = concurrent(&pg, false).await;
    let guarded_rate = concurrent(&pg, true).await;
    println!("| write | p50 | p99 | {TASKS} writers at once (own rows) |");
    println!("|---|---|---|---|");
    println!(
        "| plain transaction (UPDATE) | {} | {} | {plain_rate:.0}/s |",
        ms(plain50),
        ms(plain99)
    );
    println!(
        "| guarded (PgFence::admit + UPDATE) | {} | {} | {guarded_rate:.0}/s |",
        ms(guarded50),
        ms(guarded99)
    );
    println!(
        "| ratio guarded / plain (target <= 1.3x) | {} | {} | {:.2}x |",
        ratio(guarded50, plain50),
        ratio(guarded99, plain99),
        plain_rate / guarded_rate
    );

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
