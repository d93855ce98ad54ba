//! Parsing backend URLs. Hand-written: `host1:2379,host2:2379` is not a valid host for URL
//! parsers, and every error must name the part that is wrong.

use std::time::Duration;

use fencelock::{Error, MemoryConfig, Result};

/// What a URL names, with every setting applied.
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendUrl {
    /// `mem://`.
    Memory(MemoryConfig),
    /// `etcd://` or `etcds://`.
    #[cfg(feature = "etcd")]
    Etcd(Box<fencelock_etcd::EtcdConfig>),
    /// `zk://`.
    #[cfg(feature = "zookeeper")]
    ZooKeeper(Box<fencelock_zookeeper::ZkConfig>),
}

fn bad(reason: impl Into<String>) -> Error {
    Error::config("url", reason)
}

struct Parts<'a> {
    scheme: &'a str,
    // Only network URLs use it; the memory-only build (the demo) has none.
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    user: Option<(String, String)>,
    hosts: Vec<&'a str>,
    path: &'a str,
    query: Vec<(&'a str, &'a str)>,
}

fn split(url: &str) -> Result<Parts<'_>> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        bad(format!(
            "{:?} has no scheme: start it with etcd://, etcds://, zk:// or mem://",
            redact(url)
        ))
    })?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (name, password) = userinfo
                .split_once(':')
                .ok_or_else(|| bad("credentials must be written user:password@"))?;
            (
                Some((decode("user name", name)?, decode("password", password)?)),
                hosts,
            )
        }
        None => (None, authority),
    };
    let hosts: Vec<&str> = if hosts.is_empty() {
        Vec::new()
    } else {
        hosts.split(',').collect()
    };
    let mut pairs = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| bad(format!("query part {pair:?} must be key=value")))?;
        pairs.push((k, v));
    }
    Ok(Parts {
        scheme,
        user,
        hosts,
        path,
        query: pairs,
    })
}

/// Percent-decodes one part of the user info (`%40` is `@`), as every URL parser does.
fn decode(what: &str, raw: &str) -> Result<String> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|d| d.into_owned())
        .map_err(|_| bad(format!("the {what} is not UTF-8 once percent-decoded")))
}

// Only network URLs use it; the memory-only build (the demo) has none.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
fn check_hosts(hosts: &[&str], default_port: &str) -> Result<Vec<String>> {
    if hosts.is_empty() {
        return Err(bad(
            "no host: write host:port, or several separated by commas",
        ));
    }
    hosts
        .iter()
        .map(|host| {
            let (name, port) = host.rsplit_once(':').unwrap_or((host, default_port));
            if name.is_empty() {
                return Err(bad(format!("host {host:?} has no name")));
            }
            port.parse::<u16>().map_err(|_| {
                bad(format!(
                    "host {host:?}: port {port:?} is not a number from 1 to 65535"
                ))
            })?;
            Ok(format!("{name}:{port}"))
        })
        .collect()
}

/// Parses a duration written `500ms`, `10s`, `2m` or `1h`, as URLs and the CLI take them.
///
/// # Errors
/// [`Error::InvalidConfig`] saying how to write it.
pub fn parse_duration(value: &str) -> Result<Duration> {
    duration("duration", value)
}

fn duration(key: &str, value: &str) -> Result<Duration> {
    // humantime also takes `1m30s`, `1.5s` and `2min`; a bare number has no unit, and is refused.
    humantime::parse_duration(value).map_err(|e| {
        bad(format!(
            "{key}={value:?}: {e}; write a duration with a unit, e.g. 500ms, 10s, 1m30s or 1.5s"
        ))
    })
}

// Only network URLs use it; the memory-only build (the demo) has none.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `label=`: this process, with the label (percent-decoded) that `status` shows.
fn labelled(raw: &str) -> Result<fencelock::Owner> {
    fencelock::Owner::current().with_label(decode("label", raw)?)
}

fn unknown(key: &str, known: &str) -> Error {
    bad(format!(
        "unknown setting {key:?}; this backend knows {known}"
    ))
}

/// Parses a backend URL without connecting.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the part that is wrong.
pub fn parse(url: &str) -> Result<BackendUrl> {
    let parts = split(url.trim())?;
    match parts.scheme {
        "mem" => memory(&parts),
        "etcd" | "etcds" => etcd(parts),
        "zk" => zookeeper(parts),
        other => Err(bad(format!(
            "unknown scheme {other:?}: use etcd://, etcds://, zk:// or mem://"
        ))),
    }
}

fn memory(parts: &Parts<'_>) -> Result<BackendUrl> {
    if !parts.hosts.is_empty() || !parts.path.trim_matches('/').is_empty() {
        return Err(bad(
            "mem:// takes no host or path: write mem:// or mem://?ttl=3s",
        ));
    }
    let mut config = MemoryConfig::default();
    for &(key, value) in &parts.query {
        match key {
            "ttl" => {
                // Not `with_ttl`: that would drop a label given before the ttl.
                config.ttl = duration(key, value)?;
                config.safety_margin = config.ttl / 10;
            }
            "label" => config.owner = labelled(value)?,
            _ => return Err(unknown(key, "ttl, label")),
        }
    }
    Ok(BackendUrl::Memory(config))
}

#[cfg(not(feature = "etcd"))]
fn etcd(_: Parts<'_>) -> Result<BackendUrl> {
    Err(bad("etcd:// needs fencelock-connect's `etcd` feature"))
}

#[cfg(feature = "etcd")]
fn etcd(parts: Parts<'_>) -> Result<BackendUrl> {
    use fencelock_etcd::{EtcdConfig, EtcdTls};
    let tls = parts.scheme == "etcds";
    let scheme = if tls { "https" } else { "http" };
    let endpoints: Vec<String> = check_hosts(&parts.hosts, "2379")?
        .into_iter()
        .map(|h| format!("{scheme}://{h}"))
        .collect();
    let mut config = EtcdConfig::new(endpoints);
    let prefix = parts.path.trim_start_matches('/');
    if !prefix.is_empty() {
        config.prefix = if prefix.ends_with('/') {
            prefix.to_owned()
        } else {
            format!("{prefix}/")
        };
    }
    let (mut ca, mut cert, mut key) = (None, None, None);
    for &(k, v) in &parts.query {
        match k {
            "ttl" => config = config.ttl(duration(k, v)?),
            "safety_margin" => config.safety_margin = duration(k, v)?,
            "connect_timeout" => config.connect_timeout = duration(k, v)?,
            "request_timeout" => config.request_timeout = duration(k, v)?,
            "ca" => ca = Some(v.to_owned()),
            "cert" => cert = Some(v.to_owned()),
            "key" => key = Some(v.to_owned()),
            "label" => config.owner = labelled(v)?,
            _ => {
                return Err(unknown(
                    k,
                    "ttl, safety_margin, connect_timeout, request_timeout, ca, cert, key, label",
                ))
            }
        }
    }
    if let Some((user, password)) = parts.user {
        config = config.credentials(user, password);
    }
    if let (Some(user), Some(password)) =
        (env("FENCELOCK_ETCD_USER"), env("FENCELOCK_ETCD_PASSWORD"))
    {
        config = config.credentials(user, password);
    }
    let ca = env("FENCELOCK_ETCD_CA").or(ca);
    let cert = env("FENCELOCK_ETCD_CERT").or(cert);
    let key = env("FENCELOCK_ETCD_KEY").or(key);
    if tls {
        let read = |what: &str, path: &str| {
            std::fs::read(path).map_err(|e| bad(format!("{what} file {path:?}: {e}")))
        };
        let ca = ca.ok_or_else(|| {
            bad("etcds:// needs the CA certificate: ?ca=/path/ca.pem or FENCELOCK_ETCD_CA")
        })?;
        let mut settings = EtcdTls::with_ca(read("ca", &ca)?);
        match (cert, key) {
            (Some(cert), Some(key)) => {
                settings = settings.client_cert(read("cert", &cert)?, read("key", &key)?)
            }
            (None, None) => {}
            _ => {
                return Err(bad(
                    "give both cert and key for a client certificate, or neither",
                ))
            }
        }
        config = config.tls(settings);
    } else if ca.is_some() || cert.is_some() || key.is_some() {
        return Err(bad("ca, cert and key need etcds://"));
    }
    config.validate()?;
    Ok(BackendUrl::Etcd(Box::new(config)))
}

#[cfg(not(feature = "zookeeper"))]
fn zookeeper(_: Parts<'_>) -> Result<BackendUrl> {
    Err(bad("zk:// needs fencelock-connect's `zookeeper` feature"))
}

#[cfg(feature = "zookeeper")]
fn zookeeper(parts: Parts<'_>) -> Result<BackendUrl> {
    use fencelock_zookeeper::ZkConfig;
    let mut config = ZkConfig::new(check_hosts(&parts.hosts, "2181")?.join(","));
    let base = parts.path.trim_end_matches('/');
    if !base.is_empty() {
        config = config.base_path(base);
    }
    let mut margin = None;
    for &(k, v) in &parts.query {
        match k {
            "session_timeout" => config = config.session_timeout(duration(k, v)?),
            "tick_time" => config = config.tick_time(duration(k, v)?),
            // Applied last: session_timeout and tick_time reset the margin to its default.
            "safety_margin" => margin = Some(duration(k, v)?),
            "connect_timeout" => config.connect_timeout = duration(k, v)?,
            "request_timeout" => config.request_timeout = duration(k, v)?,
            "label" => config.owner = labelled(v)?,
            _ => {
                return Err(unknown(
                    k,
                    "session_timeout, tick_time, safety_margin, connect_timeout, request_timeout, \
                     label",
                ))
            }
        }
    }
    if let Some(margin) = margin {
        config.safety_margin = margin;
    }
    if let Some((user, password)) = parts.user {
        config = config.digest(user, password);
    }
    if let (Some(user), Some(password)) = (env("FENCELOCK_ZK_USER"), env("FENCELOCK_ZK_PASSWORD")) {
        config = config.digest(user, password);
    }
    config.validate()?;
    Ok(BackendUrl::ZooKeeper(Box::new(config)))
}

/// `url` with the setting `key=value` added to its query, the value percent-encoded (as for
/// `fencelock run --label`). A later setting wins, so this overrides one already there.
///
/// ```
/// let url = fencelock_connect::with_setting("etcd://h:2379?ttl=5s", "label", "worker 3");
/// assert_eq!(url, "etcd://h:2379?ttl=5s&label=worker%203");
/// ```
pub fn with_setting(url: &str, key: &str, value: &str) -> String {
    let value = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC);
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{key}={value}")
}

/// The URL with any password replaced by `***`, for logs and child environments.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{hosts}{}", &rest[end..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn reason(url: &str) -> String {
        match parse(url) {
            Err(Error::InvalidConfig { reason, .. }) => reason,
            other => panic!("{url}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn etcd_urls() {
        let BackendUrl::Etcd(c) =
            parse("etcd://h1:2379,h2/jobs?ttl=5s&request_timeout=2s").unwrap()
        else {
            panic!()
        };
        assert_eq!(c.endpoints, ["http://h1:2379", "http://h2:2379"]);
        assert_eq!(
            (c.prefix.as_str(), c.ttl, c.safety_margin),
            ("jobs/", Duration::from_secs(5), Duration::from_millis(500))
        );
        assert_eq!(c.request_timeout, Duration::from_secs(2));
        let BackendUrl::Etcd(c) = parse("etcd://u:p%w@h1").unwrap() else {
            panic!()
        };
        assert_eq!(
            (c.user.as_deref(), c.password.as_deref(), c.prefix.as_str()),
            (Some("u"), Some("p%w"), "fencelock/")
        );
        // Percent-encoded user info, as in any URL: `@`, `:` and `/` can be in a password.
        let BackendUrl::Etcd(c) = parse("etcd://u%40corp:p%40ss%3Aw%2Fd@h1?ttl=1m30s").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (c.user.as_deref(), c.password.as_deref()),
            (Some("u@corp"), Some("p@ss:w/d"))
        );
        assert_eq!(c.ttl, Duration::from_secs(90));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    }

    #[test]
    fn zk_and_mem_urls() {
        let BackendUrl::ZooKeeper(c) =
            parse("zk://a:2181,b/base/path/?session_timeout=6s").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (c.connect.as_str(), c.base_path.as_str()),
            ("a:2181,b:2181", "/base/path")
        );
        assert_eq!(c.session_timeout, Duration::from_secs(6));
        let BackendUrl::Memory(c) = parse("mem://?ttl=3s").unwrap() else {
            panic!()
        };
        assert_eq!(c.ttl, Duration::from_secs(3));
        assert!(matches!(parse("mem://").unwrap(), BackendUrl::Memory(_)));
    }

    #[test]
    fn each_error_names_the_wrong_part() {
        assert!(reason("localhost:2379").contains("no scheme"));
        assert!(reason("redis://h").contains("unknown scheme \"redis\""));
        assert!(reason("etcd://").contains("no host"));
        assert!(reason("etcd://h:99999").contains("port \"99999\""));
        assert!(reason("etcd://h?ttl=10").contains("ttl=\"10\""));
        assert!(reason("etcd://h?ttl=10q").contains("unknown time unit"));
        assert!(reason("etcd://u:p%ff@h").contains("password"));
        assert!(reason("etcd://h?colour=red").contains("unknown setting \"colour\""));
        assert!(reason("etcd://h?ttl").contains("key=value"));
        assert!(reason("etcds://h").contains("CA certificate"));
        assert!(reason("etcd://h?ca=/x").contains("etcds://"));
        assert!(reason("zk://h?ttl=1s").contains("unknown setting \"ttl\""));
        assert!(reason("mem://host").contains("no host or path"));
        // Values a backend rejects name the backend's field.
        assert!(matches!(
            parse("etcd://h?ttl=1s"),
            Err(Error::InvalidConfig { field: "ttl", .. })
        ));
    }

    #[test]
    fn a_label_rides_with_every_backend_whatever_comes_after_it() {
        let label = |c: &fencelock::Owner| c.label().map(str::to_owned);
        let want = Some("billing worker/3".to_owned());
        let BackendUrl::Memory(m) = parse("mem://?label=billing%20worker/3&ttl=3s").unwrap() else {
            panic!()
        };
        assert_eq!(
            (label(&m.owner), m.ttl),
            (want.clone(), Duration::from_secs(3))
        );
        let BackendUrl::Etcd(e) = parse("etcd://h?label=billing%20worker/3&ttl=5s").unwrap() else {
            panic!()
        };
        assert_eq!(label(&e.owner), want);
        let BackendUrl::ZooKeeper(z) =
            parse("zk://h?label=billing%20worker/3&session_timeout=6s").unwrap()
        else {
            panic!()
        };
        assert_eq!(label(&z.owner), want);
        assert_eq!(z.owner.pid(), std::process::id());
        assert!(reason("mem://?label=a%0Ab").contains("control"));
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact("etcd://app:s3cret@h1:2379/p?ttl=5s"),
            "etcd://app:***@h1:2379/p?ttl=5s"
        );
        assert_eq!(redact("zk://h:2181/base"), "zk://h:2181/base");
    }
}
