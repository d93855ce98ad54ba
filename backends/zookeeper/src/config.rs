//! Settings of a [`ZkBackend`](crate::ZkBackend).

use std::fmt;
use std::time::Duration;

use fencelock::{Error, Owner, Result};

/// Settings of a [`ZkBackend`](crate::ZkBackend). Start from [`ZkConfig::new`]; every field has
/// a documented default.
///
/// ```
/// use std::time::Duration;
/// use fencelock_zookeeper::ZkConfig;
///
/// let config = ZkConfig::new("10.0.0.1:2181,10.0.0.2:2181")
///     .base_path("/billing")
///     .session_timeout(Duration::from_secs(15))
///     .digest("billing", "s3cret");
/// assert_eq!(config.safety_margin, Duration::from_millis(2500)); // a tenth + tick_time / 2
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ZkConfig {
    /// Servers, `host:port,host:port`. No default.
    pub connect: String,
    /// The base path under which lock `N` uses the children of `<base>/N` (Curator's lock path).
    /// Absolute, no trailing `/`. Default `"/fencelock"`.
    pub base_path: String,
    /// Session timeout to ask for; the server must grant exactly this (it allows 2 to 20 ticks).
    /// Default 10 s.
    pub session_timeout: Duration,
    /// The ensemble's `tickTime`. Default 2 s (ZooKeeper's own default). The leader, which
    /// alone expires sessions, learns of a session's activity at a follower from its pings,
    /// every `tick_time / 2`; the probes run that often too (or every `session_timeout / 3` if
    /// that is shorter), and the margin covers that delay.
    pub tick_time: Duration,
    /// How long before the session could expire (counted from when the last successful probe
    /// was sent) the holder gives its locks up. Default `session_timeout / 10 + tick_time / 2`:
    /// the relay of the session's last activity to the leader (`tick_time / 2`) plus a tenth for
    /// clock-rate drift and for stopping the work. Must be at least `tick_time / 2` and less
    /// than a third of the timeout.
    pub safety_margin: Duration,
    /// Limit for establishing the session. Default 5 s.
    pub connect_timeout: Duration,
    /// Limit for each request. Default 5 s.
    pub request_timeout: Duration,
    /// Digest credentials `(user, password)`; with them, lock nodes and their parents get the
    /// creator-only ACL so other users cannot delete them. Default none (open ACL).
    pub digest: Option<(String, String)>,
    /// Who this backend's acquisitions say they are, stored as each lock node's data and shown
    /// by `status`. Default [`Owner::current`], without a label.
    pub owner: Owner,
}

/// `session_timeout / 10 + tick_time / 2` (see [`ZkConfig::safety_margin`]).
fn default_margin(session_timeout: Duration, tick_time: Duration) -> Duration {
    session_timeout / 10 + tick_time / 2
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("connect", &self.connect)
            .field("base_path", &self.base_path)
            .field("session_timeout", &self.session_timeout)
            .field("tick_time", &self.tick_time)
            .field("safety_margin", &self.safety_margin)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field(
                "digest",
                &self.digest.as_ref().map(|(user, _)| (user, "<hidden>")),
            )
            .field("owner", &self.owner)
            .finish()
    }
}

impl ZkConfig {
    /// Defaults for the servers in `connect` (`host:port,host:port`).
    pub fn new(connect: impl Into<String>) -> Self {
        let session_timeout = Duration::from_secs(10);
        let tick_time = Duration::from_secs(2);
        ZkConfig {
            connect: connect.into(),
            base_path: "/fencelock".to_owned(),
            session_timeout,
            tick_time,
            safety_margin: default_margin(session_timeout, tick_time),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            digest: None,
            owner: Owner::current(),
        }
    }

    /// Sets the base path.
    pub fn base_path(mut self, base_path: impl Into<String>) -> Self {
        self.base_path = base_path.into();
        self
    }

    /// Sets the session timeout and resets the margin to its default.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self.safety_margin = default_margin(timeout, self.tick_time);
        self
    }

    /// Sets the ensemble's `tickTime` and resets the margin to its default.
    pub fn tick_time(mut self, tick_time: Duration) -> Self {
        self.tick_time = tick_time;
        self.safety_margin = default_margin(self.session_timeout, tick_time);
        self
    }

    /// Sets digest credentials.
    pub fn digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// Checks every setting; the error names the field and what would be accepted.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        if self.connect.trim().is_empty() {
            return Err(Error::config(
                "connect",
                "give at least one server, e.g. 127.0.0.1:2181",
            ));
        }
        let base = &self.base_path;
        if !base.starts_with('/') || base.ends_with('/') || base.contains("//") {
            return Err(Error::config(
                "base_path",
                format!("{base:?}: must be an absolute ZooKeeper path without a trailing '/', e.g. /fencelock"),
            ));
        }
        if base
            .split('/')
            .any(|s| s == "." || s == ".." || s.starts_with(".state"))
        {
            return Err(Error::config(
                "base_path",
                format!("{base:?}: '.', '..' and '.state' segments are not allowed"),
            ));
        }
        if self.session_timeout < Duration::from_millis(100) {
            return Err(Error::config(
                "session_timeout",
                "must be at least 100 ms (servers allow 2 to 20 ticks)",
            ));
        }
        if self.tick_time.is_zero() {
            return Err(Error::config("tick_time", "must be more than zero"));
        }
        if self.safety_margin < self.tick_time / 2 {
            return Err(Error::config(
                "safety_margin",
                format!(
                    "{:?} must be at least tick_time / 2 ({:?}): the leader learns of the \
                     session's activity that late",
                    self.safety_margin,
                    self.tick_time / 2
                ),
            ));
        }
        if self.safety_margin >= self.session_timeout / 3 {
            return Err(Error::config(
                "safety_margin",
                format!(
                    "{:?} must be less than a third of the session timeout {:?}: with tick_time \
                     {:?}, choose a session timeout of at least {:?}, or set tick_time to the \
                     ensemble's",
                    self.safety_margin,
                    self.session_timeout,
                    self.tick_time,
                    (self.tick_time * 3 / 2).mul_f64(10.0 / 7.0)
                ),
            ));
        }
        for (field, value) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(field, "must be more than zero"));
            }
        }
        if let Some((user, _)) = &self.digest {
            if user.is_empty() || user.contains(':') {
                return Err(Error::config(
                    "digest",
                    "the user must be non-empty and without ':'",
                ));
            }
        }
        Ok(())
    }
}
