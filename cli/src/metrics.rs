//! `--metrics-listen ADDR`: fencelock's metrics in Prometheus text format, for as long as the
//! command runs.

use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;

use crate::exit;

/// Serves the metrics at `http://ADDR/` (any path), or says why it cannot.
pub fn serve(addr: SocketAddr) -> Result<(), u8> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| {
            eprintln!("fencelock: cannot serve metrics on {addr}: {e}");
            exit::UNAVAILABLE
        })?;
    fencelock::telemetry::describe();
    Ok(())
}
