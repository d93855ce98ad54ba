//! `FenceLayer` on a real axum service, with tokens from a real etcd and the durable store in a
//! real PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Extension, State};
use axum::routing::get;
use axum::Router;
use fencelock::{
    format_header, FencingToken, LockBackend, LockBackendExt, MemoryBackend, MemoryStore,
};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_fence::http::{Admitted, FenceLayer, Stamp, StampLayer};
use fencelock_fence::postgres::PgFenceStore;
use fencelock_fence::{Fence, FenceStore};
use fencelock_testsupport::{unique, EtcdCluster, PgServer};
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceBuilder, ServiceExt};

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `method url` with `header` as `Fencing-Token` (if any); the status and the body.
async fn send(
    http: &Http,
    method: &str,
    url: &str,
    header: Option<String>,
    body: String,
) -> (StatusCode, String) {
    let mut request = http::Request::builder().method(method).uri(url);
    if let Some(header) = header {
        request = request.header("Fencing-Token", header);
    }
    let response = http
        .request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The resource: a register and the tokens of the writes that landed, in order.
#[derive(Default)]
struct Register {
    value: Mutex<(i64, Vec<u64>)>,
}

fn app(register: Arc<Register>) -> Router {
    Router::new()
        .route(
            "/value",
            get(|State(r): State<Arc<Register>>| async move { r.value.lock().unwrap().0.to_string() })
                .put(
                    |State(r): State<Arc<Register>>, admitted: Option<Extension<Admitted>>, body: String| async move {
                        let mut value = r.value.lock().unwrap();
                        value.0 = body.trim().parse().unwrap();
                        value.1.push(admitted.map_or(0, |a| a.token.get()));
                        "stored"
                    },
                ),
        )
        .with_state(register)
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/value", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

#[derive(Default)]
struct Tally {
    committed: AtomicU64,
    refused: AtomicU64,
}

/// One writer, as in the PostgreSQL test: takes the lock and lets it go (from then on it is a
/// holder that has not noticed it lost the lock), then reads and writes the register over HTTP
/// with its token, while newer holders do the same.
async fn writer(backend: Arc<dyn LockBackend>, url: String, seed: u64, tally: Arc<Tally>) {
    let http = client();
    let jitter = |i: u64| Duration::from_millis((seed * 7 + i * 13) % 17);
    for round in 0..10u64 {
        let guard = backend.lock("account").await.unwrap();
        let header = Some(format_header("account", guard.token()));
        let _ = guard.release().await.unwrap();
        tokio::time::sleep(jitter(round)).await;
        let (status, body) = send(&http, "GET", &url, header.clone(), String::new()).await;
        if status == StatusCode::CONFLICT {
            assert!(body.contains("stale"), "{body}");
            tally.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        let value: i64 = body.trim().parse().unwrap();
        tokio::time::sleep(jitter(round + 5)).await;
        let (status, body) = send(&http, "PUT", &url, header, (value + 1).to_string()).await;
        if status == StatusCode::CONFLICT {
            tally.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        tally.committed.fetch_add(1, Ordering::Relaxed);
    }
}

async fn run(etcd: &EtcdCluster, store: Option<Arc<PgFenceStore>>) -> (u64, u64, i64, Vec<u64>) {
    let register = Arc::new(Register::default());
    let router = match store {
        Some(store) => {
            app(Arc::clone(&register)).layer(FenceLayer::new(store).only_locks(["account"]))
        }
        None => app(Arc::clone(&register)),
    };
    let url = serve(router).await;
    let config = EtcdConfig::new(etcd.endpoints())
        .prefix(format!("{}/", unique("/fence-http")))
        .ttl(Duration::from_secs(5));
    let backend: Arc<dyn LockBackend> = Arc::new(EtcdBackend::connect(config).await.unwrap());
    let tally = Arc::new(Tally::default());
    let writers: Vec<_> = (0..6)
        .map(|seed| {
            tokio::spawn(writer(
                Arc::clone(&backend),
                url.clone(),
                seed,
                Arc::clone(&tally),
            ))
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let _ = backend.close().await;
    let (value, tokens) = register.value.lock().unwrap().clone();
    (
        tally.committed.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        value,
        tokens,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_holders_never_write_through_the_layer_and_plain_writes_lose_updates() {
    let pg = PgServer::start();
    let etcd = EtcdCluster::start(1);
    let store = Arc::new(
        PgFenceStore::connect(&pg.url(), "http_fence", 16)
            .await
            .unwrap(),
    );

    let (committed, refused, value, tokens) = run(&etcd, Some(store)).await;
    println!("fenced: {committed} committed, {refused} refused, register = {value}");
    assert!(
        refused > 0,
        "no stale token was presented: the test proves nothing"
    );
    assert_eq!(
        u64::try_from(value).unwrap(),
        committed,
        "a committed write was lost"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "a stale token wrote after a newer one: {tokens:?}"
    );

    let (committed, _, value, _) = run(&etcd, None).await;
    println!("plain: {committed} committed, register = {value}");
    assert!(
        u64::try_from(value).unwrap() < committed,
        "the control lost no update: the interleaving does not exercise the fence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_refuses_with_the_cause_and_the_client_stops_once_lost() {
    let fence = Arc::new(Fence::new());
    let url =
        serve(app(Arc::default()).layer(FenceLayer::new(Arc::clone(&fence)).only_locks(["jobs"])))
            .await;
    let http = client();
    let header = |t: u64| Some(format_header("jobs", FencingToken::new(t)));

    assert_eq!(
        send(&http, "PUT", &url, header(5), "1".into()).await.0,
        StatusCode::OK
    );
    let (status, body) = send(&http, "PUT", &url, header(4), "2".into()).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body.contains("stale") && body.contains("reset"), "{body}");
    let (status, body) = send(&http, "PUT", &url, None, "2".into()).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    let (status, body) = send(&http, "PUT", &url, Some("jobs:5".into()), "2".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let other = Some(format_header("payouts", FencingToken::new(9)));
    let (status, body) = send(&http, "PUT", &url, other, "2".into()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("payouts"), "{body}");
    assert_eq!(Fence::highest(&fence, "jobs"), Some(FencingToken::new(5)));

    // An optional layer lets unfenced requests through and still checks fenced ones.
    let url =
        serve(app(Arc::default()).layer(FenceLayer::new(Arc::clone(&fence)).optional())).await;
    assert_eq!(
        send(&http, "GET", &url, None, String::new()).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&http, "GET", &url, header(4), String::new()).await.0,
        StatusCode::CONFLICT
    );

    // The client side: stamped from a guard while held; refused, unsent, once lost.
    let store = MemoryStore::new();
    let backend = MemoryBackend::with_config(
        &store,
        fencelock::MemoryConfig::with_ttl(Duration::from_millis(300)),
    )
    .unwrap();
    let guard = backend.lock("reports").await.unwrap();
    let mut stamped = ServiceBuilder::new()
        .layer(StampLayer::new(Stamp::of(&guard)))
        .service(http.clone());
    let put = || {
        http::Request::put(&url)
            .body(Full::new(Bytes::from_static(b"7")))
            .unwrap()
    };
    let response = stamped.ready().await.unwrap().call(put()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(Fence::highest(&fence, "reports"), Some(guard.token()));
    backend.pause_renewals(true).await;
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    let err = stamped
        .ready()
        .await
        .unwrap()
        .call(put())
        .await
        .unwrap_err();
    let err = err.downcast::<fencelock::Error>().unwrap();
    assert!(matches!(*err, fencelock::Error::LockLost { .. }), "{err}");
}

/// A newer token waits while an older one's request runs, in another replica too: both
/// replicas share the PostgreSQL fence, and the older request's admission holds its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_token_waits_for_an_older_request_in_another_replica() {
    let pg = PgServer::start();
    let a = PgFenceStore::connect(&pg.url(), "replica_fence", 4)
        .await
        .unwrap();
    let b = PgFenceStore::connect(&pg.url(), "replica_fence", 4)
        .await
        .unwrap();
    let older = a.admit("jobs", FencingToken::new(3)).await.unwrap();
    let same = b.admit("jobs", FencingToken::new(3)).await.unwrap(); // shares, does not wait
                                                                     // Timed from here, not from the task's first poll, which a busy machine may delay.
    let started = Instant::now();
    let newer = tokio::spawn(async move {
        let admission = b.admit("jobs", FencingToken::new(4)).await.unwrap();
        (started.elapsed(), admission.token())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !newer.is_finished(),
        "the newer token was admitted while older requests ran"
    );
    drop(same);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !newer.is_finished(),
        "admitted while one older request still ran"
    );
    drop(older);
    let (waited, token) = tokio::time::timeout(Duration::from_secs(10), newer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(token, FencingToken::new(4));
    assert!(waited >= Duration::from_millis(700), "{waited:?}");
    assert!(matches!(
        a.admit("jobs", FencingToken::new(3)).await,
        Err(fencelock::Error::StaleToken { .. })
    ));
    assert_eq!(a.highest("jobs").await.unwrap(), Some(FencingToken::new(4)));
}

/// A streamed response is fenced to its last frame: its handler may still be producing the
/// effect while the body streams, so a newer token's request waits until the body has ended.
/// Before, the admission ended when the response's head was ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_holds_its_admission_until_its_last_frame() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let streamed = {
        let gate = Arc::clone(&gate);
        move || async move {
            // "first" at once, "last" only once the test opens the gate.
            let chunks = futures::stream::unfold(0, move |step| {
                let gate = Arc::clone(&gate);
                async move {
                    match step {
                        0 => Some((Ok::<_, std::io::Error>(Bytes::from("first\n")), 1)),
                        1 => {
                            gate.notified().await;
                            Some((Ok(Bytes::from("last\n")), 2))
                        }
                        _ => None,
                    }
                }
            });
            axum::body::Body::from_stream(chunks)
        }
    };
    let router = Router::new()
        .route("/value", get(streamed))
        .route("/other", get(|| async { "ok" }))
        .layer(FenceLayer::new(Arc::new(Fence::new())));
    let url = serve(router).await;
    let other = url.replace("/value", "/other");
    let header = |t: u64| format_header("jobs", FencingToken::new(t));
    let http = client();

    let request = |url: &str, t: u64| {
        http::Request::builder()
            .uri(url)
            .header("Fencing-Token", header(t))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let response = http.request(request(&url, 5)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, Bytes::from("first\n"));

    let newer = {
        let (http, request) = (http.clone(), request(&other, 6));
        tokio::spawn(async move { http.request(request).await.unwrap().status() })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !newer.is_finished(),
        "a newer token was admitted while an older request's body still streamed"
    );
    gate.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, Bytes::from("last\n"));
    let status = tokio::time::timeout(Duration::from_secs(10), newer)
        .await
        .expect("the newer token is admitted once the older body ended")
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let stale = http.request(request(&other, 5)).await.unwrap();
    assert_eq!(stale.status(), StatusCode::CONFLICT);
}

// --- The service as a process of its own, restarted -------------------------------------

/// Not a test by itself: the service process that the restart test starts (by running this
/// test binary with `FENCE_SERVICE` set). Without the variable it returns at once.
#[test]
fn service_process() {
    let Ok(store) = std::env::var("FENCE_SERVICE") else {
        return;
    };
    let port_file = std::env::var("FENCE_SERVICE_PORT_FILE").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let layer: Router = if store == "memory" {
            app(Arc::default()).layer(FenceLayer::new(Arc::new(Fence::new())))
        } else {
            let store = PgFenceStore::connect(&store, "service_fence", 4)
                .await
                .unwrap();
            app(Arc::default()).layer(FenceLayer::new(Arc::new(store)))
        };
        let url = serve(layer).await;
        // Written whole, then renamed: the parent never reads half a URL.
        std::fs::write(format!("{port_file}.tmp"), url).unwrap();
        std::fs::rename(format!("{port_file}.tmp"), &port_file).unwrap();
        // Bounded: the parent kills it long before.
        tokio::time::sleep(Duration::from_secs(120)).await;
    });
}

struct ServiceProcess {
    child: Child,
    url: String,
}

impl ServiceProcess {
    fn start(store: &str) -> ServiceProcess {
        let dir = tempdir();
        let port_file = format!("{dir}/url");
        let mut service = ServiceProcess {
            child: Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "service_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("FENCE_SERVICE", store)
                .env("FENCE_SERVICE_PORT_FILE", &port_file)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
            url: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(url) = std::fs::read_to_string(&port_file) {
                service.url = url;
                return service;
            }
            assert!(
                Instant::now() < deadline,
                "the service process did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tempdir() -> String {
    let dir = std::env::temp_dir().join(unique("fence-service"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_fence_survives_a_restart_of_the_service_process() {
    let pg = PgServer::start();
    let http = client();
    let header = |t: u64| Some(format_header("jobs", FencingToken::new(t)));
    for (store, remembers) in [(pg.url(), true), ("memory".to_owned(), false)] {
        let service = ServiceProcess::start(&store);
        let (status, body) = send(&http, "PUT", &service.url, header(10), "1".into()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        service.kill(); // SIGKILL: nothing is flushed on the way out

        let service = ServiceProcess::start(&store);
        let (status, body) = send(&http, "PUT", &service.url, header(9), "2".into()).await;
        if remembers {
            assert_eq!(status, StatusCode::CONFLICT, "after a restart: {body}");
            assert!(body.contains("stale"), "{body}");
        } else {
            // The control: an in-memory fence forgets, and the stale holder gets through.
            assert_eq!(
                status,
                StatusCode::OK,
                "the memory fence remembered? {body}"
            );
        }
        assert_eq!(
            send(&http, "PUT", &service.url, header(11), "3".into())
                .await
                .0,
            StatusCode::OK
        );
        service.kill();
    }
}
