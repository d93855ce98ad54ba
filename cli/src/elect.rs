//! `leader` (and the default value of `elect`).

use fencelock::{Leader, LockName};
use futures::StreamExt;

use crate::exit;
use crate::run::{connect, Signals};

/// `HOSTNAME/PID`: who leads, for an operator reading `fencelock leader`.
pub fn default_value() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    format!("{host}/{}", std::process::id())
}

/// `leader NAME [--json] [--watch]`: the leader now, or a line at each change until a signal.
pub async fn leader(url: &str, name: &LockName, json: bool, watch: bool) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    if !watch {
        return match backend.leader(name).await {
            Ok(leader) => {
                println!("{}", describe(name, leader.as_ref(), json));
                0
            }
            Err(e) => exit::report(&e),
        };
    }
    let Ok(mut signals) = Signals::listen() else {
        eprintln!("fencelock: cannot install signal handlers");
        return exit::SOFTWARE;
    };
    let mut changes = backend.observe(name);
    // One line per change, until a signal or an error the stream cannot retry.
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(leader)) => println!("{}", describe(name, leader.as_ref(), json)),
                Some(Err(e)) => return exit::report(&e),
                None => return 0,
            },
            _ = signals.next() => return 0,
        }
    }
}

fn describe(name: &LockName, leader: Option<&Leader>, json: bool) -> String {
    if json {
        return serde_json::json!({
            "name": name.as_str(),
            "leader": leader.is_some(),
            "term": leader.map(|l| l.term.get()),
            "value": leader.map(Leader::value_lossy),
        })
        .to_string();
    }
    match leader {
        Some(leader) => format!(
            "{name}: led by {} (term {})",
            leader.value_lossy(),
            leader.term
        ),
        None => format!("{name}: no leader"),
    }
}
