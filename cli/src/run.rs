//! `run`, `status` and `list`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{LockBackend, LockName, Wait};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::exit;

async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, u8> {
    fencelock_connect::connect(url)
        .await
        .map_err(|e| exit::report(&e))
}

/// Sends `signal` to CMD's whole process group, so its children stop too.
fn signal_group(pgid: Option<u32>, signal: Signal) {
    if let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()) {
        let _ = killpg(Pid::from_raw(pgid), signal);
    }
}

pub async fn run(
    url: &str,
    name: &LockName,
    wait: Wait,
    grace: Duration,
    command: &[String],
) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    let (Some(program), args) = (command.first(), command.get(1..).unwrap_or_default()) else {
        eprintln!("fencelock: no command given after --");
        return exit::USAGE;
    };
    // Listen before acquiring, so that a signal while waiting is ours to handle.
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("fencelock: cannot install signal handlers");
        return exit::SOFTWARE;
    };
    eprintln!(
        "fencelock: waiting for lock `{name}` on {}",
        fencelock_connect::redact(url)
    );
    let guard = tokio::select! {
        acquired = backend.acquire(name, wait) => match acquired {
            Ok(guard) => guard,
            Err(e) => return exit::report(&e),
        },
        _ = interrupt.recv() => return 128 + Signal::SIGINT as u8,
        _ = terminate.recv() => return 128 + Signal::SIGTERM as u8,
    };
    let token = guard.token();
    eprintln!("fencelock: acquired `{name}` with token {token}; running {program}");
    let child = Command::new(program)
        .args(args)
        .env("FENCELOCK_TOKEN", token.to_string())
        .env("FENCELOCK_NAME", name.as_str())
        .env("FENCELOCK_BACKEND", fencelock_connect::redact(url))
        .stdin(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!("fencelock: cannot run {program}: {e}");
            let _ = guard.release().await;
            return exit::CANNOT_RUN;
        }
    };
    let pgid = child.id();
    let mut lost_at: Option<Instant> = None;
    let mut killed = false;
    // Each pass handles one event; the loop ends when CMD exits, which SIGKILL forces at the
    // latest `grace` after a loss.
    let status = loop {
        let kill_at = lost_at.map(|at| at + grace);
        tokio::select! {
            status = child.wait() => break status,
            () = guard.lost(), if lost_at.is_none() => {
                eprintln!("fencelock: LOST lock `{name}` (token {token}); sending SIGTERM to {program}");
                signal_group(pgid, Signal::SIGTERM);
                lost_at = Some(Instant::now());
            }
            () = sleep_until(kill_at), if kill_at.is_some() && !killed => {
                eprintln!("fencelock: {program} still running {grace:?} after SIGTERM; sending SIGKILL");
                signal_group(pgid, Signal::SIGKILL);
                killed = true;
            }
            _ = interrupt.recv() => signal_group(pgid, Signal::SIGINT),
            _ = terminate.recv() => signal_group(pgid, Signal::SIGTERM),
        }
    };
    // Whatever CMD left in its group goes with it.
    signal_group(pgid, Signal::SIGKILL);
    match guard.release().await {
        Ok(outcome) => eprintln!("fencelock: released `{name}`: {outcome:?}"),
        Err(e) => {
            eprintln!("fencelock: release of `{name}` failed ({e}); the lock ends with its lease")
        }
    }
    if lost_at.is_some() {
        return exit::LOST;
    }
    match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => u8::try_from(code).unwrap_or(exit::SOFTWARE),
                (None, Some(signal)) => 128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
                _ => exit::SOFTWARE,
            }
        }
        Err(e) => {
            eprintln!("fencelock: waiting for {program} failed: {e}");
            exit::SOFTWARE
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub async fn status(url: &str, name: &LockName, json: bool) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    let status = match backend.status(name).await {
        Ok(status) => status,
        Err(e) => return exit::report(&e),
    };
    if json {
        let value = serde_json::json!({
            "name": status.name.as_str(),
            "held": status.holder.is_some(),
            "token": status.holder.map(|t| t.get()),
            "waiting": status.waiting,
            "age_ms": status.age.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
        });
        println!("{value}");
    } else {
        match (status.holder, status.age) {
            (Some(token), Some(age)) => println!(
                "{name}: held by token {token} for {:.1}s; {} waiting",
                age.as_secs_f64(),
                status.waiting
            ),
            (Some(token), None) => {
                println!("{name}: held by token {token}; {} waiting", status.waiting)
            }
            (None, _) => println!("{name}: free"),
        }
    }
    0
}

pub async fn list(url: &str, prefix: &str, json: bool) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    match backend.list(prefix).await {
        Ok(names) if json => {
            let names: Vec<&str> = names.iter().map(LockName::as_str).collect();
            println!("{}", serde_json::json!(names));
            0
        }
        Ok(names) => {
            for name in names {
                println!("{name}");
            }
            0
        }
        Err(e) => exit::report(&e),
    }
}
