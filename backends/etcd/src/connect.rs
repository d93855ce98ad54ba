//! The gRPC connection settings every client of a backend uses: the shared, balanced one and
//! the per-endpoint ones that carry the keepalive stream.

use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::EtcdConfig;

/// Timeouts, HTTP/2 keepalive, credentials and TLS from `config`.
pub(crate) fn options(config: &EtcdConfig) -> ConnectOptions {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        // etcd answers pings more often than every 5 s (its default
        // --grpc-keepalive-min-time) with GOAWAY, and pings on a connection without streams
        // more often than every 2 h after the third (review F13): ping only while streams are
        // open; an idle connection's death shows at its next request, which has a timeout.
        .with_keep_alive(
            Duration::from_secs(5).max(config.ttl / 3),
            config.request_timeout,
        )
        .with_keep_alive_while_idle(false)
        .with_require_leader(true);
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        // etcd's auth tokens expire (5 min by default); a lock service runs for days.
        options = options
            .with_user(user.clone(), password.clone())
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &config.tls {
        let mut tls_options = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.client_cert_pem {
            tls_options = tls_options.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &tls.domain {
            tls_options = tls_options.domain_name(domain.clone());
        }
        options = options.with_tls(tls_options);
    }
    options
}
