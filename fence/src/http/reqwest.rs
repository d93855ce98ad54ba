//! The client side typed for reqwest (feature `reqwest`).

use fencelock::Result;

use super::stamp::{header_of, TokenSource};

/// Stamps a reqwest request with `Fencing-Token` from a guard (or a [`Stamp`](super::Stamp)),
/// refusing to build it once the lock is lost.
///
/// ```no_run
/// # async fn f(guard: &fencelock::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// use fencelock_fence::http::FencedRequest;
///
/// let client = reqwest::Client::new();
/// let response = client
///     .put("http://ledger.internal/accounts/42")
///     .fenced_by(guard)? // Err(LockLost) once lost: nothing is sent
///     .body("balance=100")
///     .send()
///     .await?;
/// # let _ = response; Ok(()) }
/// ```
pub trait FencedRequest: Sized {
    /// The request with the `Fencing-Token` header of `source`'s lock and token.
    ///
    /// # Errors
    /// [`Error::LockLost`](fencelock::Error::LockLost) once the lock is lost;
    /// [`Error::InvalidConfig`](fencelock::Error::InvalidConfig) for a lock name that cannot be
    /// sent in a header.
    fn fenced_by(self, source: &(impl TokenSource + ?Sized)) -> Result<Self>;
}

impl FencedRequest for reqwest::RequestBuilder {
    fn fenced_by(self, source: &(impl TokenSource + ?Sized)) -> Result<Self> {
        let (name, value) = header_of(source)?;
        Ok(self.header(name, value))
    }
}
