//! A contender process: takes the lock again and again and, holding it, increments the
//! register's value with read-modify-write steps, checking `is_held()` before each step (but,
//! like real code, not between its read and its write: a pause there is the classic bug). Its
//! release is reported before it releases: the belief ends when the holder lets go, not when
//! the store's reply comes back.
//!
//! With MODE `elect`, each critical section is a leadership of the election LOCK_NAME instead,
//! its term the token, given up with `resign`.
//!
//! With MODE `permits`, each critical section is one of `fencelock_faults::PERMITS` permits of
//! the semaphore LOCK_NAME.
//!
//! With MODE `rw`, each critical section is a hold of the reader-writer lock LOCK_NAME, to read
//! and to write in turn (reading first), every third hold a long one. A reader only reads. Here
//! a holder reports its loss as soon as `lost` fires (not at the next step) and its release
//! before it releases, so that its belief, as the register logs it, ends before the store can
//! grant the lock to anyone else: the RW check counts any overlap with a writer, with no
//! allowance.
//!
//! Usage: contender BACKEND_URL LOCK_NAME REGISTER_ADDR STEP_MILLIS [lock|elect|permits|rw]
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test process: a panic is its report

use std::time::Duration;

use fencelock::{Access, LockBackend, LockBackendExt, LockGuard, LockName, ReleaseOutcome, Wait};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

struct Register {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl Register {
    /// Sends one request; `None` when the harness says stop.
    async fn ask(&mut self, request: String) -> Option<String> {
        self.writer
            .write_all(format!("{request}\n").as_bytes())
            .await
            .ok()?;
        let reply = self.lines.next_line().await.ok()??;
        (reply != "STOP").then_some(reply)
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, name, register, step) = (
        &args[1],
        &args[2],
        &args[3],
        Duration::from_millis(args[4].parse().unwrap()),
    );
    let mode = args.get(5).map_or("lock", String::as_str);
    let pid = std::process::id();
    let backend = fencelock_connect::connect(url)
        .await
        .expect("connect to the lock service");
    let stream = TcpStream::connect(register)
        .await
        .expect("connect to the register");
    let (read, writer) = stream.into_split();
    let mut register = Register {
        lines: BufReader::new(read).lines(),
        writer,
    };
    if mode == "rw" {
        rw_sections(backend.as_ref(), name, &mut register, step, pid).await;
        return;
    }
    // Bounded: the harness stops every contender long before this many critical sections.
    for _ in 0..100_000 {
        let guard = match next_section(backend.as_ref(), name, mode, pid).await {
            Ok(guard) => guard,
            Err(e) => {
                eprintln!("contender {pid}: acquire failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = guard.token().get();
        if register
            .ask(format!("ACQUIRED {pid} {token}"))
            .await
            .is_none()
        {
            return;
        }
        for _ in 0..3 {
            if !guard.is_held() {
                break;
            }
            let Some((value, version)) = read_register(&mut register, pid, token).await else {
                return;
            };
            tokio::time::sleep(step).await; // the work; a SIGSTOP lands here
            if register
                .ask(format!("WRITE {pid} {token} {} {version}", value + 1))
                .await
                .is_none()
            {
                return;
            }
        }
        if guard.is_held() {
            // The belief ends here, before the release: from now on this holder writes nothing.
            // Reported after `release` returned, it would last as long as the release's reply,
            // which a stalled leader can hold back past the successor's grant (the delete
            // applied, the reply lost) until `lost` fires.
            if register
                .ask(format!("RELEASED {pid} {token}"))
                .await
                .is_none()
            {
                return;
            }
            let sent = std::time::Instant::now();
            match guard.release().await {
                Ok(ReleaseOutcome::Released) => {}
                outcome => eprintln!(
                    "contender {pid}: release of {token} after {:?}: {outcome:?}",
                    sent.elapsed()
                ),
            }
        } else {
            if register.ask(format!("LOST {pid} {token}")).await.is_none() {
                return;
            }
            drop(guard);
        }
    }
}

/// The lock, or the leadership (its guard: the same powers, `release` = resign).
async fn next_section(
    backend: &dyn LockBackend,
    name: &str,
    mode: &str,
    pid: u32,
) -> fencelock::Result<LockGuard> {
    let limit = Wait::Timeout(Duration::from_secs(30));
    match mode {
        "elect" => {}
        "permits" => {
            let name = LockName::new(name)?;
            return backend
                .acquire_permit(&name, fencelock_faults::PERMITS, limit)
                .await;
        }
        _ => return backend.lock_timeout(name, Duration::from_secs(30)).await,
    }
    let leadership = backend
        .acquire_leadership(&LockName::new(name)?, pid.to_string().as_bytes(), limit)
        .await?;
    Ok(leadership.into_guard())
}

/// Mode `rw`: read holds and write holds in turn. A writer increments the value as in the other
/// modes; a reader only reads. The belief ends, in the register's log, before the holder lets
/// go: `LOST` as soon as `lost` fires (the steps select on it), `RELEASED` before `release`.
async fn rw_sections(
    backend: &dyn LockBackend,
    name: &str,
    register: &mut Register,
    step: Duration,
    pid: u32,
) {
    let name = LockName::new(name).unwrap();
    let mut access = Access::Read;
    let mut granted = 0u64;
    // Bounded: the harness stops every contender long before this many critical sections.
    for _ in 0..100_000 {
        let guard = match backend
            .acquire_rw(&name, access, Wait::Timeout(Duration::from_secs(30)))
            .await
        {
            Ok(guard) => guard,
            Err(e) => {
                eprintln!("contender {pid}: acquire {access:?} failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = guard.token().get();
        let report = match access {
            Access::Read => format!("ACQUIRED {pid} {token} read"),
            Access::Write => format!("ACQUIRED {pid} {token}"),
        };
        if register.ask(report).await.is_none() {
            return;
        }
        // Every third hold (a read, then a write, in turn) outlasts the 2 s lease: a holder cut
        // off then hears `lost` mid-hold. The others are short, for many handovers.
        let steps = if granted % 3 == 2 { 16 } else { 3 };
        granted += 1;
        let mut held = true;
        for _ in 0..steps {
            if !guard.is_held() {
                held = false;
                break;
            }
            let Some((value, version)) = read_register(register, pid, token).await else {
                return;
            };
            tokio::select! {
                biased;
                () = guard.lost() => {
                    held = false;
                    break;
                }
                () = tokio::time::sleep(step) => {} // the work; a SIGSTOP lands here
            }
            if access == Access::Write
                && register
                    .ask(format!("WRITE {pid} {token} {} {version}", value + 1))
                    .await
                    .is_none()
            {
                return;
            }
        }
        if held && guard.is_held() {
            if register
                .ask(format!("RELEASED {pid} {token}"))
                .await
                .is_none()
            {
                return;
            }
            match guard.release().await {
                Ok(ReleaseOutcome::Released) => {}
                // Held by the guard's account a moment ago: worth a line in the contender's log.
                outcome => eprintln!("contender {pid}: release of {token}: {outcome:?}"),
            }
        } else {
            if register.ask(format!("LOST {pid} {token}")).await.is_none() {
                return;
            }
            drop(guard);
        }
        access = match access {
            Access::Read => Access::Write,
            Access::Write => Access::Read,
        };
    }
}

/// Reads the register as holder `pid` with `token`: its value and version, or `None` when the
/// register has stopped.
async fn read_register(register: &mut Register, pid: u32, token: u64) -> Option<(u64, u64)> {
    let reply = register.ask(format!("READ {pid} {token}")).await?;
    let mut words = reply.split_whitespace().skip(1);
    let value = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let version = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    Some((value, version))
}
