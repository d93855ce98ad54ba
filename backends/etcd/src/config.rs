//! Settings of an [`EtcdBackend`](crate::EtcdBackend).

use std::fmt;
use std::time::Duration;

use fencelock::{Error, Owner, Result};

/// The shortest lease etcd grants with default server settings: `3 * election_ticks / 2`
/// heartbeats = 1.5 s, rounded up to whole seconds.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// TLS material for `https://` endpoints, as PEM.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct EtcdTls {
    /// The CA that signed the servers' certificates.
    pub ca_pem: Vec<u8>,
    /// A client certificate and its private key, for servers with `--client-cert-auth`.
    pub client_cert_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify in the server certificate; defaults to the endpoint's host.
    pub domain: Option<String>,
}

impl EtcdTls {
    /// Trust servers signed by `ca_pem`.
    pub fn with_ca(ca_pem: impl Into<Vec<u8>>) -> Self {
        EtcdTls {
            ca_pem: ca_pem.into(),
            ..EtcdTls::default()
        }
    }

    /// Present a client certificate (`cert_pem`, `key_pem`).
    pub fn client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_cert_pem = Some((cert_pem.into(), key_pem.into()));
        self
    }
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem", &format_args!("<{} bytes>", self.ca_pem.len()))
            .field(
                "client_cert_pem",
                &self
                    .client_cert_pem
                    .as_ref()
                    .map(|_| "<certificate and private key hidden>"),
            )
            .field("domain", &self.domain)
            .finish()
    }
}

/// Settings of an [`EtcdBackend`](crate::EtcdBackend). Start from [`EtcdConfig::new`]; every
/// field has a documented default.
///
/// ```
/// use std::time::Duration;
/// use fencelock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::new(["http://10.0.0.1:2379", "http://10.0.0.2:2379"])
///     .prefix("billing/")
///     .ttl(Duration::from_secs(15))
///     .credentials("billing", "s3cret");
/// assert_eq!(config.safety_margin, Duration::from_millis(1500)); // ttl / 10
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// Client URLs (`http://host:2379` or `https://...`); several for a cluster. No default.
    pub endpoints: Vec<String>,
    /// Put in front of every lock name; must end with `/`. Default `"fencelock/"`, so the lock
    /// `jobs` uses keys `fencelock/jobs/<lease hex>`, as `etcdctl lock fencelock/jobs` does.
    pub prefix: String,
    /// Lease TTL, whole seconds, at least [`MIN_TTL`]. Default 10 s (as `etcdctl lock`);
    /// renewed every `ttl / 3`.
    pub ttl: Duration,
    /// How long before `ttl` (counted from when the last successful renewal was sent) the
    /// holder gives the lock up. Default `ttl / 10`; must be less than `ttl / 3`.
    pub safety_margin: Duration,
    /// Limit for reaching the cluster in [`EtcdBackend::connect`](crate::EtcdBackend::connect).
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// Limit for each request (Txn, grant, renewal). Default 5 s.
    pub request_timeout: Duration,
    /// User name for etcd auth. Default none.
    pub user: Option<String>,
    /// Password for etcd auth; never printed by `Debug`. Default none.
    pub password: Option<String>,
    /// TLS for `https://` endpoints. Default none.
    pub tls: Option<EtcdTls>,
    /// Who this backend's acquisitions say they are, stored in each lock key's value and shown
    /// by `status`. Default [`Owner::current`], without a label.
    pub owner: Owner,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .field("safety_margin", &self.safety_margin)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("tls", &self.tls)
            .field("owner", &self.owner)
            .finish()
    }
}

impl EtcdConfig {
    /// Defaults for `endpoints`.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        let ttl = Duration::from_secs(10);
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: "fencelock/".to_owned(),
            ttl,
            safety_margin: ttl / 10,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            user: None,
            password: None,
            tls: None,
            owner: Owner::current(),
        }
    }

    /// Sets the key prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the TTL and resets the margin to its default (`ttl / 10`).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self.safety_margin = ttl / 10;
        self
    }

    /// Sets user name and password.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Sets TLS material.
    pub fn tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Checks every setting; the error names the field and what would be accepted.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() || self.endpoints.iter().any(|e| e.trim().is_empty()) {
            return Err(Error::config(
                "endpoints",
                "give at least one etcd client URL, e.g. http://127.0.0.1:2379",
            ));
        }
        let https = self
            .endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https != 0 && https != self.endpoints.len() {
            return Err(Error::config(
                "endpoints",
                "mix of http:// and https:// endpoints; use one scheme",
            ));
        }
        if https != 0 && self.tls.is_none() {
            return Err(Error::config(
                "tls",
                "https:// endpoints need TLS settings (at least the CA certificate)",
            ));
        }
        if https == 0 && self.tls.is_some() {
            return Err(Error::config(
                "tls",
                "TLS settings given but the endpoints are http://; use https:// URLs",
            ));
        }
        if self.ttl.subsec_nanos() != 0 {
            return Err(Error::config(
                "ttl",
                format!("etcd leases are whole seconds; got {:?}", self.ttl),
            ));
        }
        if self.ttl < MIN_TTL {
            return Err(Error::config(
                "ttl",
                format!("{:?} is below the {MIN_TTL:?} etcd grants at least with default settings (it would silently grant more)", self.ttl),
            ));
        }
        if self.safety_margin >= self.ttl / 3 {
            return Err(Error::config(
                "safety_margin",
                "must be less than a third of the ttl, or the lock is lost between renewals",
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
        if self.user.is_some() != self.password.is_some() {
            return Err(Error::config(
                "user",
                "give both a user and a password, or neither",
            ));
        }
        validate_prefix(&self.prefix)
    }
}

fn validate_prefix(prefix: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::config("prefix", format!("{prefix:?}: {why}")));
    if !prefix.ends_with('/') {
        // Without it, lock `b` under prefix `a` and lock `ab` under prefix `` share keys.
        return bad("must end with '/' so that no lock's keys fall under another lock's range");
    }
    if prefix.chars().any(char::is_control) {
        return bad("must not contain NUL or control characters");
    }
    if prefix.split('/').any(|segment| segment.starts_with('.')) {
        // `.state` segments hold fenced state; a prefix inside one would mix the two.
        return bad("no segment may start with '.' (reserved for fenced state)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(config: &EtcdConfig) -> &'static str {
        match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected an invalid config, got {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_settings_by_field() {
        let ok = EtcdConfig::new(["http://127.0.0.1:2379"]);
        assert!(ok.validate().is_ok());
        assert_eq!(field(&EtcdConfig::new(Vec::<String>::new())), "endpoints");
        assert_eq!(field(&ok.clone().ttl(Duration::from_secs(1))), "ttl");
        assert_eq!(field(&ok.clone().ttl(Duration::from_millis(2500))), "ttl");
        assert_eq!(field(&ok.clone().prefix("locks")), "prefix");
        assert_eq!(field(&ok.clone().prefix("a/.state/")), "prefix");
        assert_eq!(field(&EtcdConfig::new(["https://h:2379"])), "tls");
        let mut half = ok.clone();
        half.user = Some("root".into());
        assert_eq!(field(&half), "user");
    }

    #[test]
    fn debug_hides_secrets() {
        let config = EtcdConfig::new(["https://h:2379"])
            .credentials("app", "s3cret-pw")
            .tls(EtcdTls::with_ca("CA").client_cert("CERT", "PRIVATE-KEY"));
        let text = format!("{config:?}");
        assert!(
            !text.contains("s3cret-pw") && !text.contains("PRIVATE-KEY"),
            "{text}"
        );
        assert!(text.contains("app"));
    }
}
