//! `FencedRequest` on a real reqwest client against an axum service behind `FenceLayer`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Extension;
use axum::routing::put;
use axum::Router;
use fencelock::{format_header, Error, LockBackendExt, MemoryStore};
use fencelock_fence::http::{Admitted, FenceLayer, FencedRequest, Stamp};
use fencelock_fence::Fence;
use http::StatusCode;

async fn serve() -> String {
    let router =
        Router::new()
            .route(
                "/ledger",
                put(|Extension(admitted): Extension<Admitted>| async move {
                    admitted.token.to_string()
                }),
            )
            .layer(FenceLayer::new(Arc::new(Fence::new())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ledger", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// A holder's requests carry its token; once its lock is lost, `fenced_by` refuses to build the
/// request (nothing is sent), and a request stamped by hand with the old token after a newer
/// holder's is refused by the service with 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_token_and_none_is_built_once_lost() {
    let url = serve().await;
    let client = reqwest::Client::new();
    let store = MemoryStore::new();
    let (a, b) = (store.backend(), store.backend());
    let first = a.lock("ledger").await.unwrap();
    let stamp = Stamp::of(&first);
    for source in [&stamp as &dyn fencelock_fence::http::TokenSource, &first] {
        let response = client
            .put(&url)
            .fenced_by(source)
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.text().await.unwrap(), first.token().to_string());
    }

    a.expire_session().await;
    tokio::time::timeout(Duration::from_secs(10), first.lost())
        .await
        .unwrap();
    for refused in [
        client.put(&url).fenced_by(&first).map(drop),
        client.put(&url).fenced_by(&stamp).map(drop),
    ] {
        assert!(
            matches!(refused, Err(Error::LockLost { .. })),
            "{refused:?}"
        );
    }

    let second = b.lock("ledger").await.unwrap();
    let response = client
        .put(&url)
        .fenced_by(&second)
        .unwrap()
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let stale = client
        .put(&url)
        .header("Fencing-Token", format_header("ledger", first.token()))
        .send()
        .await
        .unwrap();
    assert_eq!(stale.status(), StatusCode::CONFLICT);
}
