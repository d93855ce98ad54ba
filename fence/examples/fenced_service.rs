//! An axum service fenced by `FenceLayer`: `cargo run -p fencelock-fence --features tower
//! --example fenced_service`.
//!
//! Two workers on one in-memory lock store (etcd or ZooKeeper work the same: swap the backend).
//! Worker A takes the lock and stamps a request, which is delayed in the network; A stalls past
//! its lease, B takes the lock and writes; then A's delayed request arrives and the service
//! refuses it with `409 Conflict`. A's client, asked to send another, refuses locally: the lock
//! is lost. Swap `Fence::new()` for a `PgFenceStore` and every replica of the service shares
//! the fence, across restarts.
#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Extension;
use axum::routing::put;
use axum::Router;
use fencelock::{LockBackendExt, MemoryBackend, MemoryConfig, MemoryStore};
use fencelock_fence::http::{Admitted, FenceLayer, Stamp, StampLayer};
use fencelock_fence::Fence;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceBuilder, ServiceExt};

type Boxed = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Boxed> {
    // The resource: a value only the current holder may set.
    let value = Arc::new(Mutex::new(String::from("(empty)")));
    let state = Arc::clone(&value);
    let app = Router::new()
        .route(
            "/value",
            put(
                move |Extension(admitted): Extension<Admitted>, body: String| async move {
                    *state.lock().unwrap_or_else(|p| p.into_inner()) = body.clone();
                    format!("stored {body:?} under token {}\n", admitted.token)
                },
            ),
        )
        .layer(FenceLayer::new(Arc::new(Fence::new())).only_locks(["payouts"]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/value", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let store = MemoryStore::new();
    let config = MemoryConfig::with_ttl(Duration::from_millis(300));
    let (a, b) = (
        MemoryBackend::with_config(&store, config.clone())?,
        MemoryBackend::with_config(&store, config)?,
    );
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let put = |body: &'static str| {
        http::Request::put(&url).body(Full::new(Bytes::from_static(body.as_bytes())))
    };

    let guard_a = a.lock("payouts").await?;
    let mut client_a = ServiceBuilder::new()
        .layer(StampLayer::new(Stamp::of(&guard_a)))
        .service(http.clone());
    // A stamps a request while it holds the lock; the network delays it.
    let delayed = {
        let (name, header) = Stamp::of(&guard_a).header()?;
        let mut request = put("from A")?;
        request.headers_mut().insert(name, header);
        request
    };
    println!("A holds payouts with token {}", guard_a.token());

    a.pause_renewals(true).await; // A stalls: a GC pause, a frozen VM
    let guard_b = b.lock("payouts").await?; // granted once A's lease ends
    let mut client_b = ServiceBuilder::new()
        .layer(StampLayer::new(Stamp::of(&guard_b)))
        .service(http.clone());
    let response = client_b.ready().await?.call(put("from B")?).await?;
    println!(
        "B (token {}): {} {}",
        guard_b.token(),
        response.status(),
        text(response).await?.trim()
    );

    let response = http.request(delayed).await?;
    println!(
        "A's delayed request: {} {}",
        response.status(),
        text(response).await?.trim()
    );
    match client_a.ready().await?.call(put("from A, again")?).await {
        Ok(response) => println!("A's client sent again: {}", response.status()),
        Err(e) => println!("A's client refuses to send: {e}"),
    }
    println!("value: {}", value.lock().unwrap_or_else(|p| p.into_inner()));
    drop(guard_a);
    let _ = guard_b.release().await?;
    Ok(())
}

async fn text(response: http::Response<hyper::body::Incoming>) -> Result<String, Boxed> {
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
