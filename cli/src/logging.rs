//! stderr for people: the CLI's own progress lines, and the library's log events.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

static QUIET: AtomicBool = AtomicBool::new(false);

/// The crates whose events `-v` and `-vv` turn up; other crates stay at `warn`, since a
/// transport's debug output can carry request contents.
const OURS: [&str; 4] = [
    "fencelock",
    "fencelock_etcd",
    "fencelock_zookeeper",
    "fencelock_cli",
];

/// Installs the log subscriber: `FENCELOCK_LOG`, else `RUST_LOG`, else from `-v`/`-q`
/// (default `warn`: renewal trouble and losses, with the lock's name where the event has one).
pub fn init(verbose: u8, quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
    let from_env = ["FENCELOCK_LOG", "RUST_LOG"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()))
        .and_then(|filter| EnvFilter::try_new(filter).ok());
    let filter = from_env.unwrap_or_else(|| {
        let ours = match (quiet, verbose) {
            (true, _) => return EnvFilter::new("error"),
            (false, 0) => return EnvFilter::new("warn"),
            (false, 1) => "info",
            (false, _) => "debug",
        };
        let directives: Vec<String> = OURS.iter().map(|c| format!("{c}={ours}")).collect();
        EnvFilter::new(format!("warn,{}", directives.join(",")))
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Whether `-q` asked for errors only.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A progress line on stderr, unless `-q`.
macro_rules! say {
    ($($arg:tt)*) => {
        if !$crate::logging::quiet() {
            eprintln!($($arg)*);
        }
    };
}
pub(crate) use say;
