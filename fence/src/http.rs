//! Fencing for HTTP services: a `tower` layer that admits the `Fencing-Token` header through a
//! [`FenceStore`], and a client side that stamps the header from a lock guard.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use fencelock::{parse_header, Error, FencingToken, FENCING_TOKEN_HEADER};
use http::{header, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::store::FenceStore;

mod body;
#[cfg(feature = "reqwest")]
mod reqwest;
mod stamp;
#[cfg(feature = "reqwest")]
pub use self::reqwest::FencedRequest;
pub use body::FencedBody;
pub use stamp::{header_of, BoxError, Stamp, StampLayer, StampService, TokenSource};

/// The token a request was admitted with, in its extensions for the handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The lock named by the header.
    pub lock: String,
    /// The admitted token.
    pub token: FencingToken,
}

/// A `tower` layer that fences every request: it reads `Fencing-Token: <lock>=<token>`,
/// admits the token through a [`FenceStore`] and holds the admission until the response's body
/// has ended (or is dropped), so no newer holder's request is admitted while this one runs,
/// streamed responses included: a handler may produce its effect while its body streams.
/// Responses come in a [`FencedBody`], which is the inner body with the admission attached.
///
/// Refusals are answered without calling the inner service, with the cause in the body:
/// - `409 Conflict`: a stale token (a newer holder was admitted: the sender must stop), a token
///   not claimed (compare-and-set stores), or a lock this service does not serve;
/// - `428 Precondition Required`: no header (unless [`optional`](FenceLayer::optional));
/// - `400 Bad Request`: a header that is not `<lock>=<token>`;
/// - `503 Service Unavailable`: the fence store failed (retry later).
///
/// The handler finds the admitted token in the request's extensions as [`Admitted`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use fencelock_fence::http::FenceLayer;
/// use fencelock_fence::Fence;
///
/// let layer = FenceLayer::new(Arc::new(Fence::new())).only_locks(["payouts"]);
/// // axum: Router::new().route(...).layer(layer)
/// # let _ = layer;
/// # }
/// ```
pub struct FenceLayer<S> {
    store: Arc<S>,
    locks: Option<Arc<HashSet<String>>>,
    optional: bool,
}

impl<S> Clone for FenceLayer<S> {
    fn clone(&self) -> Self {
        FenceLayer {
            store: Arc::clone(&self.store),
            locks: self.locks.clone(),
            optional: self.optional,
        }
    }
}

impl<S> std::fmt::Debug for FenceLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceLayer")
            .field("locks", &self.locks)
            .field("optional", &self.optional)
            .finish_non_exhaustive()
    }
}

impl<S: FenceStore> FenceLayer<S> {
    /// Fences requests through `store`, for any lock, requiring the header.
    pub fn new(store: Arc<S>) -> Self {
        FenceLayer {
            store,
            locks: None,
            optional: false,
        }
    }

    /// Admits tokens of these locks only (default: any); others get `409 Conflict`.
    pub fn only_locks<I, N>(mut self, locks: I) -> Self
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        self.locks = Some(Arc::new(locks.into_iter().map(Into::into).collect()));
        self
    }

    /// Lets requests without the header through, unfenced (default: `428`). For services whose
    /// reads need no token; every request that sends one is still checked.
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }
}

impl<S, I> Layer<I> for FenceLayer<S> {
    type Service = FenceService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        FenceService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`FenceLayer`] wraps around the inner one.
pub struct FenceService<S, I> {
    inner: I,
    layer: FenceLayer<S>,
}

impl<S, I: Clone> Clone for FenceService<S, I> {
    fn clone(&self) -> Self {
        FenceService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, I: std::fmt::Debug> std::fmt::Debug for FenceService<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, I, ReqBody, ResBody> Service<Request<ReqBody>> for FenceService<S, I>
where
    S: FenceStore,
    I: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<FencedBody<ResBody>>;
    type Error = I::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request; the new one waits for readiness.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let presented = match read_header(&request, &layer) {
                Ok(Some(presented)) => presented,
                Ok(None) => return Ok(inner.call(request).await?.map(FencedBody::unfenced)),
                Err(refusal) => return Ok(refusal.into_response()),
            };
            let (lock, token) = presented;
            let admission = match layer.store.admit(&lock, token).await {
                Ok(admission) => admission,
                Err(e) => return Ok(Refusal::from_error(&e).into_response()),
            };
            request.extensions_mut().insert(Admitted { lock, token });
            // An error drops the admission here; a response carries it in its body.
            let response = inner.call(request).await?;
            Ok(response.map(|body| FencedBody::holding(body, admission)))
        })
    }
}

fn read_header<B, S>(
    request: &Request<B>,
    layer: &FenceLayer<S>,
) -> Result<Option<(String, FencingToken)>, Refusal> {
    let Some(value) = request.headers().get(FENCING_TOKEN_HEADER) else {
        if layer.optional {
            return Ok(None);
        }
        return Err(Refusal::new(
            StatusCode::PRECONDITION_REQUIRED,
            format!("this service needs a {FENCING_TOKEN_HEADER}: <lock>=<token> header"),
        ));
    };
    let text = value.to_str().map_err(|_| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("the {FENCING_TOKEN_HEADER} header is not text"),
        )
    })?;
    let (lock, token) =
        parse_header(text).map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    if let Some(locks) = &layer.locks {
        if !locks.contains(&lock) {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                format!("this service is not fenced by lock {lock:?}"),
            ));
        }
    }
    Ok(Some((lock, token)))
}

struct Refusal {
    status: StatusCode,
    cause: String,
}

impl Refusal {
    fn new(status: StatusCode, cause: String) -> Self {
        Refusal { status, cause }
    }

    fn from_error(e: &Error) -> Self {
        let status = match e {
            Error::StaleToken { .. } | Error::TokenNotClaimed { .. } => StatusCode::CONFLICT,
            Error::InvalidConfig { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Refusal::new(status, e.to_string())
    }

    fn into_response<B: From<String>>(self) -> Response<FencedBody<B>> {
        let body = FencedBody::unfenced(B::from(format!("{}\n", self.cause)));
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}
