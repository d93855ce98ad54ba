//! The client side: stamp `Fencing-Token` from a lock guard, refusing once the lock is lost.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use fencelock::{format_header, Error, FencingToken, LockGuard, Result};
use http::{HeaderName, HeaderValue, Request};
use tokio_util::sync::CancellationToken;
use tower_layer::Layer;
use tower_service::Service;

/// What stamps a request: the lock and its token, while the lock is held.
pub trait TokenSource: Send + Sync + 'static {
    /// The lock's name and token.
    ///
    /// # Errors
    /// [`Error::LockLost`] once the lock is lost: the request must not be sent.
    fn current(&self) -> Result<(String, FencingToken)>;
}

impl TokenSource for LockGuard {
    fn current(&self) -> Result<(String, FencingToken)> {
        let token = self.ensure_held()?;
        Ok((self.name().to_string(), token))
    }
}

impl<T: TokenSource + ?Sized> TokenSource for Arc<T> {
    fn current(&self) -> Result<(String, FencingToken)> {
        (**self).current()
    }
}

/// A guard's lock, token and `lost` signal, detached from the guard so that clients and
/// layers can keep it while the guard stays with its owner (who can still release it).
///
/// It refuses once `lost` has fired. `lost` fires before the store can hand the lock on, but
/// through a timer task; [`LockGuard`] itself (a [`TokenSource`] too) also checks the clock,
/// so use the guard where you can.
///
/// With any HTTP client (reqwest: `request.header(name, value)`):
/// ```no_run
/// # fn f(guard: &fencelock::LockGuard) -> fencelock::Result<()> {
/// use fencelock_fence::http::Stamp;
/// let (name, value) = Stamp::of(guard).header()?; // Err(LockLost) once lost: do not send
/// # let _ = (name, value); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Stamp {
    lock: String,
    token: FencingToken,
    lost: CancellationToken,
}

impl Stamp {
    /// The stamp of `guard`'s lock.
    pub fn of(guard: &LockGuard) -> Self {
        Stamp {
            lock: guard.name().to_string(),
            token: guard.token(),
            lost: guard.lost_token(),
        }
    }

    /// The `Fencing-Token` header to send.
    ///
    /// # Errors
    /// [`Error::LockLost`] once the lock is lost.
    pub fn header(&self) -> Result<(HeaderName, HeaderValue)> {
        header_of(self)
    }
}

impl TokenSource for Stamp {
    fn current(&self) -> Result<(String, FencingToken)> {
        if self.lost.is_cancelled() {
            return Err(Error::LockLost {
                name: self.lock.clone(),
            });
        }
        Ok((self.lock.clone(), self.token))
    }
}

/// The header from `source`, for any HTTP client.
///
/// # Errors
/// [`Error::LockLost`] once the lock is lost.
pub fn header_of(source: &(impl TokenSource + ?Sized)) -> Result<(HeaderName, HeaderValue)> {
    let (lock, token) = source.current()?;
    let value = HeaderValue::from_str(&format_header(&lock, token))
        .map_err(|_| Error::config("lock", format!("{lock:?} cannot be sent in an HTTP header")))?;
    Ok((HeaderName::from_static("fencing-token"), value))
}

/// A `tower` layer for clients: stamps every request with `Fencing-Token` from a
/// [`TokenSource`] and fails the call, unsent, with [`Error::LockLost`] once the lock is lost.
#[derive(Debug)]
pub struct StampLayer<T> {
    source: Arc<T>,
}

impl<T> Clone for StampLayer<T> {
    fn clone(&self) -> Self {
        StampLayer {
            source: Arc::clone(&self.source),
        }
    }
}

impl<T: TokenSource> StampLayer<T> {
    /// Stamps from `source` (a [`Stamp`], or an `Arc<LockGuard>`).
    pub fn new(source: T) -> Self {
        StampLayer {
            source: Arc::new(source),
        }
    }
}

impl<T, I> Layer<I> for StampLayer<T> {
    type Service = StampService<T, I>;

    fn layer(&self, inner: I) -> Self::Service {
        StampService {
            inner,
            source: Arc::clone(&self.source),
        }
    }
}

/// The service [`StampLayer`] wraps around a client.
#[derive(Debug)]
pub struct StampService<T, I> {
    inner: I,
    source: Arc<T>,
}

impl<T, I: Clone> Clone for StampService<T, I> {
    fn clone(&self) -> Self {
        StampService {
            inner: self.inner.clone(),
            source: Arc::clone(&self.source),
        }
    }
}

/// The error of a stamped call: the client's, or [`Error::LockLost`] (boxed, as tower's
/// `BoxError`; downcast to [`fencelock::Error`]).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type StampFuture<R> = Pin<Box<dyn Future<Output = std::result::Result<R, BoxError>> + Send>>;

impl<T, I, B> Service<Request<B>> for StampService<T, I>
where
    T: TokenSource,
    I: Service<Request<B>>,
    I::Error: Into<BoxError>,
    I::Future: Send + 'static,
{
    type Response = I::Response;
    type Error = BoxError;
    type Future = StampFuture<I::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        match header_of(&*self.source) {
            Ok((name, value)) => {
                request.headers_mut().insert(name, value);
                let call = self.inner.call(request);
                Box::pin(async move { call.await.map_err(Into::into) })
            }
            Err(e) => Box::pin(async move { Err(Box::new(e) as BoxError) }),
        }
    }
}
