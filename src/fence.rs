//! Resource-side fencing for stores outside the lock service.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::{Error, FencingToken, Result};

/// The HTTP header that carries a fencing token: `Fencing-Token: <lock>=<token>`.
pub const FENCING_TOKEN_HEADER: &str = "Fencing-Token";

/// Keeps the highest token seen per lock and refuses lower ones: the check a protected resource
/// makes so that a paused, expired holder cannot overwrite its successor's work.
///
/// Hold the returned [`FencePermit`] across the write: a newer holder's token cannot be admitted
/// in between, so an older write can never land after a newer one.
///
/// ```
/// use fencelock::{Error, Fence, FencingToken};
///
/// let fence = Fence::new();
/// let mut account = 0;
/// {
///     let _permit = fence.admit("payouts", FencingToken::new(7)).unwrap();
///     account += 10; // the write, while the permit is held
/// }
/// // A holder whose lease ended long ago wakes up with token 5:
/// let stale = fence.admit("payouts", FencingToken::new(5));
/// assert!(matches!(stale, Err(Error::StaleToken { .. })));
/// assert_eq!(account, 10);
/// ```
///
/// # The same rule elsewhere
/// - **SQL row**: keep a `fence_token` column next to the data and make every write conditional:
///   `UPDATE jobs SET state = $2, fence_token = $1 WHERE id = $3 AND fence_token <= $1`;
///   zero rows updated means a newer holder exists, so stop.
/// - **HTTP**: send [`FENCING_TOKEN_HEADER`] (`Fencing-Token: payouts=7`, see
///   [`format_header`]/[`parse_header`]); the server admits it with a `Fence` and answers
///   `409 Conflict` on [`Error::StaleToken`].
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<HashMap<String, FencingToken>>,
}

/// Admission through a [`Fence`]; no other token of any lock is admitted while it is held.
#[derive(Debug)]
#[must_use = "hold the permit across the write it protects"]
pub struct FencePermit<'a> {
    _highest: MutexGuard<'a, HashMap<String, FencingToken>>,
    token: FencingToken,
}

impl FencePermit<'_> {
    /// The token that was admitted.
    pub fn token(&self) -> FencingToken {
        self.token
    }
}

impl Fence {
    /// An empty fence: the first token of each lock is admitted.
    pub fn new() -> Self {
        Fence::default()
    }

    /// Admits `token` for `lock` if it is at least the highest seen, and records it.
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a higher token was already admitted.
    pub fn admit(&self, lock: &str, token: FencingToken) -> Result<FencePermit<'_>> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        match highest.get(lock) {
            Some(&seen) if token < seen => {
                return Err(Error::StaleToken {
                    lock: lock.to_owned(),
                    presented: token,
                    highest: seen,
                })
            }
            _ => {
                highest.insert(lock.to_owned(), token);
            }
        }
        Ok(FencePermit {
            _highest: highest,
            token,
        })
    }

    /// The highest token admitted for `lock`.
    pub fn highest(&self, lock: &str) -> Option<FencingToken> {
        self.highest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(lock)
            .copied()
    }
}

/// Formats the value of a [`FENCING_TOKEN_HEADER`] header: `lock=token`.
pub fn format_header(lock: &str, token: FencingToken) -> String {
    format!("{lock}={token}")
}

/// Parses the value of a [`FENCING_TOKEN_HEADER`] header.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the header when it is not `lock=token`.
pub fn parse_header(value: &str) -> Result<(String, FencingToken)> {
    let bad = || {
        Error::config(
            "Fencing-Token header",
            format!("expected `<lock>=<token>`, got {value:?}"),
        )
    };
    let (lock, token) = value.rsplit_once('=').ok_or_else(bad)?;
    let token = token.parse().map_err(|_| bad())?;
    if lock.is_empty() {
        return Err(bad());
    }
    Ok((lock.to_owned(), token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tokens_pass_lower_fail_per_lock() {
        let fence = Fence::new();
        drop(fence.admit("a", FencingToken::new(5)).unwrap());
        drop(fence.admit("a", FencingToken::new(5)).unwrap());
        drop(fence.admit("b", FencingToken::new(1)).unwrap());
        let err = fence.admit("a", FencingToken::new(4)).unwrap_err();
        assert!(matches!(err, Error::StaleToken { presented, highest, .. }
            if presented.get() == 4 && highest.get() == 5));
        assert_eq!(fence.highest("a"), Some(FencingToken::new(5)));
    }

    #[test]
    fn header_round_trips() {
        let v = format_header("payouts", FencingToken::new(9));
        assert_eq!(
            parse_header(&v).unwrap(),
            ("payouts".into(), FencingToken::new(9))
        );
        assert!(parse_header("payouts").is_err());
        assert!(parse_header("=9").is_err());
        assert!(parse_header("a=x").is_err());
    }
}
