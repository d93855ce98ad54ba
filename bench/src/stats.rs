//! Percentiles and table rows.

use std::time::Duration;

/// p50 and p99 of `samples` (sorted in place).
pub fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).copied().unwrap_or_default()
    };
    (at(0.50), at(0.99))
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

pub fn ratio(a: Duration, b: Duration) -> String {
    if b.is_zero() {
        return "-".into();
    }
    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
}
