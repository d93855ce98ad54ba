//! `run` and `elect` (CMD under a lock or a leadership), `status`, `break` and `list`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Access, LockBackend, LockName, ReleaseOutcome, Wait};
use futures::StreamExt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::SignalKind;
use tokio::time::Instant;

use crate::exit;
use crate::logging::say;

/// The signals `run` passes on to CMD (and that end a wait before CMD starts).
const FORWARDED: [(SignalKind, Signal); 4] = [
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
];

/// Listens for the [`FORWARDED`] signals.
pub(crate) struct Signals(Vec<(tokio::signal::unix::Signal, Signal)>);

impl Signals {
    pub(crate) fn listen() -> std::io::Result<Self> {
        FORWARDED
            .iter()
            .map(|(kind, signal)| Ok((tokio::signal::unix::signal(*kind)?, *signal)))
            .collect::<std::io::Result<_>>()
            .map(Signals)
    }

    /// The next forwarded signal to arrive.
    pub(crate) async fn next(&mut self) -> Signal {
        let waits = self.0.iter_mut().map(|(listener, signal)| {
            let signal = *signal;
            Box::pin(async move {
                listener.recv().await;
                signal
            })
        });
        futures::future::select_all(waits).await.0
    }

    /// A signal that already arrived, if any, without waiting.
    fn pending(&mut self) -> Option<Signal> {
        use futures::FutureExt;
        self.next().now_or_never()
    }
}

pub(crate) async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, u8> {
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

/// What `run` waits for before it starts CMD.
pub enum Seek {
    /// The lock (`fencelock run`).
    Lock,
    /// The leadership of the election, publishing this value (`fencelock elect`).
    Leadership(String),
    /// One of this many permits of the semaphore (`fencelock run --permits`).
    Permit(u32),
    /// The reader-writer lock, as a reader or a writer (`fencelock run --read|--write`).
    Rw(Access),
}

impl Seek {
    async fn acquire(
        &self,
        backend: &dyn LockBackend,
        name: &LockName,
        wait: Wait,
    ) -> fencelock::Result<fencelock::LockGuard> {
        match self {
            Seek::Lock => backend.acquire(name, wait).await,
            Seek::Permit(permits) => backend.acquire_permit(name, *permits, wait).await,
            Seek::Rw(access) => backend.acquire_rw(name, *access, wait).await,
            Seek::Leadership(value) => backend
                .acquire_leadership(name, value.as_bytes(), wait)
                .await
                .map(fencelock::Leadership::into_guard),
        }
    }

    fn waiting(&self) -> &'static str {
        match self {
            Seek::Lock => "waiting for lock",
            Seek::Permit(_) => "waiting for a permit of semaphore",
            Seek::Rw(Access::Read) => "waiting to read under lock",
            Seek::Rw(Access::Write) => "waiting to write under lock",
            Seek::Leadership(_) => "campaigning in election",
        }
    }

    fn granted(&self) -> &'static str {
        match self {
            Seek::Lock => "acquired",
            Seek::Permit(_) => "acquired a permit of",
            Seek::Rw(Access::Read) => "acquired for reading",
            Seek::Rw(Access::Write) => "acquired for writing",
            Seek::Leadership(_) => "elected leader of",
        }
    }
}

pub async fn run(
    url: &str,
    (name, seek): (&LockName, Seek),
    wait: Wait,
    grace: Duration,
    command: &[String],
) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    let code = supervise(url, &backend, (name, seek), wait, grace, command).await;
    // A failed try or timeout waited for its withdrawal, but only up to the request timeout,
    // and a guard's release may still be retried; the process must not exit before they are
    // done, or the entry waits for the TTL.
    if let Err(e) = backend.close().await {
        say!("fencelock: closing the session failed ({e}); it ends with its lease");
    }
    code
}

async fn supervise(
    url: &str,
    backend: &Arc<dyn LockBackend>,
    (name, seek): (&LockName, Seek),
    wait: Wait,
    grace: Duration,
    command: &[String],
) -> u8 {
    let Some(program) = command.first() else {
        eprintln!("fencelock: no command given after --");
        return exit::USAGE;
    };
    if backend.kind() == "memory" {
        eprintln!(
            "fencelock: warning: mem:// excludes nothing across processes: another `fencelock \
             run` elsewhere takes the same lock at the same time. Use etcd:// or zk://"
        );
    }
    // Listen before acquiring, so that a signal while waiting is ours to handle.
    let Ok(mut signals) = Signals::listen() else {
        eprintln!("fencelock: cannot install signal handlers");
        return exit::SOFTWARE;
    };
    say!(
        "fencelock: {} `{name}` on {}",
        seek.waiting(),
        fencelock_connect::redact(url)
    );
    let guard = tokio::select! {
        acquired = seek.acquire(backend.as_ref(), name, wait) => match acquired {
            Ok(guard) => guard,
            Err(e) => return exit::report(&e),
        },
        signal = signals.next() => return 128 + signal as u8,
    };
    // A signal that came while the grant was on its way: CMD must not start.
    if let Some(signal) = signals.pending() {
        say!("fencelock: got {signal} as the lock was granted; not starting {program}");
        let _ = guard.release().await;
        return 128 + signal as u8;
    }
    let token = guard.token();
    say!(
        "fencelock: {} `{name}` with token {token}; running {program}",
        seek.granted()
    );
    let Ok(me) = std::env::current_exe() else {
        eprintln!("fencelock: cannot find its own executable to start {program}");
        let _ = guard.release().await;
        return exit::SOFTWARE;
    };
    // CMD is started through `fencelock exec-child`, which makes it die with this process.
    let child = Command::new(me)
        .arg("exec-child")
        .arg(std::process::id().to_string())
        .arg("--")
        .args(command)
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
    let foreground = crate::terminal::Foreground::hand_to(pgid);
    let mut lost_at: Option<Instant> = None;
    let mut killed = false;
    // Each pass handles one event; the loop ends when CMD exits, which SIGKILL forces at the
    // latest `grace` after a loss.
    let status = loop {
        let kill_at = lost_at.map(|at| at + grace);
        tokio::select! {
            status = child.wait() => break status,
            () = guard.lost(), if lost_at.is_none() => {
                let cause = guard.loss_cause().unwrap_or_else(|| "unknown".into());
                eprintln!("fencelock: LOST lock `{name}` (token {token}): {cause}; sending SIGTERM to {program}");
                signal_group(pgid, Signal::SIGTERM);
                lost_at = Some(Instant::now());
            }
            () = sleep_until(kill_at), if kill_at.is_some() && !killed => {
                eprintln!("fencelock: {program} still running {grace:?} after SIGTERM; sending SIGKILL");
                signal_group(pgid, Signal::SIGKILL);
                killed = true;
            }
            signal = signals.next() => signal_group(pgid, signal),
        }
    };
    drop(foreground);
    // Whatever CMD left in its group goes with it.
    signal_group(pgid, Signal::SIGKILL);
    match guard.release().await {
        Ok(ReleaseOutcome::Released) => say!("fencelock: released `{name}`"),
        Ok(ReleaseOutcome::NotOwned) => {
            say!("fencelock: `{name}` was no longer ours at release; nothing deleted")
        }
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

pub async fn status(url: &str, name: &LockName, json: bool, permits: bool) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    let status = if permits {
        backend.permit_status(name).await
    } else {
        backend.status(name).await
    };
    match status {
        Ok(status) => {
            println!("{}", describe(&status, json));
            0
        }
        Err(e) => exit::report(&e),
    }
}

/// `status --watch`: a line at each change of holder or queue, until SIGINT/SIGTERM.
pub async fn watch(url: &str, name: &LockName, json: bool) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    let Ok(mut signals) = Signals::listen() else {
        eprintln!("fencelock: cannot install signal handlers");
        return exit::SOFTWARE;
    };
    let mut changes = backend.watch(name);
    // One line per change, until a signal or an error the stream cannot retry.
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(Ok(status)) => println!("{}", describe(&status, json)),
                Some(Err(e)) => return exit::report(&e),
                None => return 0,
            },
            _ = signals.next() => return 0,
        }
    }
}

fn millis(age: Option<Duration>) -> Option<u64> {
    age.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX))
}

/// A status as `--json` prints it.
fn to_json(status: &fencelock::LockStatus) -> serde_json::Value {
    let owner = |o: &Option<fencelock::Owner>| {
        o.as_ref().map(|o| {
            serde_json::json!({
                "host": o.host(), "pid": o.pid(), "started": o.started(), "label": o.label(),
            })
        })
    };
    let queue: Vec<_> = status
        .queue
        .iter()
        .map(|e| {
            serde_json::json!({
                "token": e.token.get(),
                "age_ms": millis(e.age),
                "owner": owner(&e.owner),
                "foreign": e.owner.is_none(),
                "access": e.access.map(|a| match a {
                    Access::Read => "read",
                    Access::Write => "write",
                }),
            })
        })
        .collect();
    serde_json::json!({
        "name": status.name.as_str(),
        "held": status.holder.is_some(),
        "token": status.holder.map(|t| t.get()),
        "waiting": status.waiting,
        "age_ms": millis(status.age),
        "owner": owner(&status.owner),
        "foreign": status.holder.is_some() && status.owner.is_none(),
        "holders": status.holders,
        "permits": status.permits,
        "queue": queue,
    })
}

fn describe(status: &fencelock::LockStatus, json: bool) -> String {
    if json {
        return to_json(status).to_string();
    }
    let name = &status.name;
    let who = |owner: &Option<fencelock::Owner>| match owner {
        Some(owner) => owner.to_string(),
        None => "a foreign client".to_owned(),
    };
    let since = |age: Option<Duration>| match age {
        Some(age) => format!(" for {:.1}s", age.as_secs_f64()),
        None => String::new(),
    };
    let Some(token) = status.holder else {
        return format!("{name}: free");
    };
    if let Some(permits) = status.permits {
        let mut out = format!(
            "{name}: {} of {permits} permits held; {} waiting",
            status.holders, status.waiting
        );
        for (i, entry) in status.queue.iter().enumerate() {
            let role = if i < status.holders {
                "holding"
            } else {
                "waiting"
            };
            out.push_str(&format!(
                "\n  {role}: token {}{} ({})",
                entry.token,
                since(entry.age),
                who(&entry.owner)
            ));
        }
        return out;
    }
    if status.queue.first().is_some_and(|e| e.access.is_some()) {
        let holding = match status.holders {
            1 if status.queue[0].access == Some(Access::Write) => "a writer holds it".to_owned(),
            1 => "1 reader holds it".to_owned(),
            n => format!("{n} readers hold it"),
        };
        let mut out = format!("{name}: {holding}; {} waiting", status.waiting);
        for (i, entry) in status.queue.iter().enumerate() {
            let role = match (i < status.holders, entry.access) {
                (true, Some(Access::Write)) => "writing",
                (true, _) => "reading",
                (false, Some(Access::Write)) => "waiting to write",
                (false, _) => "waiting to read",
            };
            out.push_str(&format!(
                "\n  {role}: token {}{} ({})",
                entry.token,
                since(entry.age),
                who(&entry.owner)
            ));
        }
        return out;
    }
    let mut out = format!(
        "{name}: held by token {token}{} ({}); {} waiting",
        since(status.age),
        who(&status.owner),
        status.waiting
    );
    for waiter in status.queue.iter().skip(1) {
        out.push_str(&format!(
            "\n  waiting: token {}{} ({})",
            waiter.token,
            since(waiter.age),
            who(&waiter.owner)
        ));
    }
    out
}

/// `break`: removes the holder's entry, after asking (unless `--yes`).
pub async fn break_lock(url: &str, name: &LockName, yes: bool) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    if !yes {
        let status = match backend.status(name).await {
            Ok(status) => status,
            Err(e) => return exit::report(&e),
        };
        if status.holder.is_none() {
            println!("{name}: free; nothing to break");
            return 0;
        }
        if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            eprintln!("fencelock: refusing to break `{name}` without confirmation: pass --yes");
            return exit::USAGE;
        }
        eprint!(
            "{}: break it, so that the next contender proceeds? [y/N] ",
            describe(&status, false)
        );
        let mut answer = String::new();
        if std::io::stdin().read_line(&mut answer).is_err()
            || !matches!(answer.trim(), "y" | "Y" | "yes")
        {
            eprintln!("fencelock: not broken");
            return exit::USAGE;
        }
    }
    match backend.break_lock(name).await {
        Ok(Some(token)) => {
            println!("{name}: removed the holder with token {token}; the next contender proceeds");
            0
        }
        Ok(None) => {
            println!("{name}: free (or it changed hands meanwhile); nothing broken");
            0
        }
        Err(e) => exit::report(&e),
    }
}

/// `list`: each lock under `prefix` with its holder and waiters, as `status` shows them.
pub async fn list(url: &str, prefix: &str, json: bool) -> u8 {
    let backend = match connect(url).await {
        Ok(backend) => backend,
        Err(code) => return code,
    };
    let names = match backend.list(prefix).await {
        Ok(names) => names,
        Err(e) => return exit::report(&e),
    };
    let mut shown = Vec::with_capacity(names.len());
    for name in &names {
        match backend.status(name).await {
            // Released between the two reads: no longer held or waited for.
            Ok(status) if status.holder.is_none() => {}
            Ok(status) => shown.push(status),
            Err(e) => return exit::report(&e),
        }
    }
    if json {
        let all: Vec<serde_json::Value> = shown.iter().map(to_json).collect();
        println!("{}", serde_json::Value::Array(all));
    } else {
        for status in &shown {
            println!("{}", describe(status, false));
        }
    }
    0
}
