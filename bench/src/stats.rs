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

/// This process's CPU time so far (user + system), from `/proc/self/stat` in clock ticks of
/// 10 ms (`CLK_TCK` is 100 on Linux).
pub fn cpu_time() -> Duration {
    ticks(
        &std::fs::read_to_string("/proc/self/stat").unwrap_or_default(),
        2,
    )
}

/// The CPU time so far of process `pid` and its children, live or ended (user + system; a
/// server's connections are its children): `pid`'s own and reaped children's times, and each
/// child's still in `/proc`.
pub fn tree_cpu_time(pid: u32) -> Duration {
    let read = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let mut total = Duration::ZERO;
    // A child reaped during the scan would be counted twice (scanned, then in `pid`'s reaped
    // times) or not at all: take the reading only when `pid`'s reaped times are the same before
    // and after the scan, so that no child was reaped in between.
    for _ in 0..10 {
        let before = read();
        let children = children_cpu_time(pid);
        let after = read();
        let reaped = |stat: &str| ticks(stat, 4).saturating_sub(ticks(stat, 2));
        total = ticks(&before, 4) + children;
        if reaped(&before) == reaped(&after) {
            break;
        }
    }
    total
}

/// What every live child of `pid` has used, its own reaped children's included.
fn children_cpu_time(pid: u32) -> Duration {
    let parent = pid.to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            // ppid is the second field after the name.
            stat.rsplit(')')
                .next()
                .and_then(|f| f.split_whitespace().nth(1))
                == Some(&parent)
        })
        .map(|stat| ticks(&stat, 4))
        .sum()
}

/// The first `n` of utime, stime, cutime, cstime in a `/proc/<pid>/stat` line, added.
fn ticks(stat: &str, n: usize) -> Duration {
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<u64> = after_name
        .split_whitespace()
        .skip(11) // state .. cmajflt: utime and stime come next
        .take(n)
        .filter_map(|f| f.parse().ok())
        .collect();
    Duration::from_millis(fields.iter().sum::<u64>() * 10)
}
