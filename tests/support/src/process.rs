//! Server processes: ports, folders, logs, and the watchdog.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A loopback port that was free a moment ago.
///
/// The port comes from 20000-31999, below Linux's ephemeral range (32768-60999): a port the
/// kernel picked (`bind(0)`) is free only until some process's next outgoing connection takes it
/// as its source port, which happened between our check and the server's own bind under load
/// ("address already in use"). A process never hands out the same port twice.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::{Mutex, OnceLock, PoisonError};
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let mut handed_out = HANDED_OUT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
    seed.write_u32(std::process::id());
    let mut state = seed.finish();
    // Bounded: 12,000 candidates, and a busy machine leaves most of them free.
    for _ in 0..2000 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let port = 20_000 + u16::try_from((state >> 33) % 12_000).expect("below 12,000");
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in 20000-31999 after 2000 tries")
}

/// The folder under which every server keeps its data and log.
pub fn tmp_root() -> PathBuf {
    let root = std::env::var_os("FENCELOCK_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("fencelock-test"));
    std::fs::create_dir_all(&root).expect("create the test tmp folder");
    root
}

/// A string unique within this machine's test runs: for prefixes, folders and names.
pub fn unique(base: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{base}-{}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A server process with its log file, killed on drop and by a watchdog when the test exits;
/// the watchdog then deletes the server's folder (see [`watchdog`]).
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) child: Option<Child>,
    pub(crate) log: PathBuf,
    program: String,
    args: Vec<String>,
    reap: PathBuf,
}

impl Server {
    /// Starts `program` with its log in `dir`; `reap` (`dir` or a folder holding it) is
    /// deleted once the test process is gone: outside `scripts/test`, which deletes its own
    /// folder, nothing else would, and an etcd member's data is about 123 MB.
    pub(crate) fn spawn(program: &str, args: Vec<String>, dir: &Path, reap: &Path) -> Server {
        std::fs::create_dir_all(dir).expect("create the server folder");
        let mut server = Server {
            child: None,
            log: dir.join("server.log"),
            program: program.to_owned(),
            args,
            reap: reap.to_owned(),
        };
        server.start();
        server
    }

    pub(crate) fn start(&mut self) {
        assert!(self.child.is_none(), "server already running");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the server log");
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; run scripts/test, which installs the servers",
                    self.program
                )
            });
        watchdog(child.id(), &self.reap);
        self.child = Some(child);
    }

    /// SIGKILL and wait.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` and waits up to `limit` for the process to exit, then kills it. For
    /// servers that must clean up after themselves on the way out; never panics (drops call it).
    pub(crate) fn stop(&mut self, signal: &str, limit: Duration) {
        if let Some(child) = self.child.as_mut() {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
            let start = Instant::now();
            while start.elapsed() < limit {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill();
    }

    /// SIGSTOP / SIGCONT.
    pub(crate) fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("run kill");
            assert!(status.success(), "kill {signal} failed");
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Panics with the log unless `ready` turns true within `limit`.
    pub(crate) fn wait_ready(&mut self, what: &str, limit: Duration, ready: impl Fn() -> bool) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if ready() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "{what} exited with {status} while starting; log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{what} was not ready within {limit:?}; log:\n{}",
            self.log_tail()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills `pid` once this test process is gone (checked every second, for at most an hour),
/// then deletes `reap` if the test process is gone by then, unless `FENCELOCK_TEST_KEEP` is
/// set (to read the servers' logs after a failure: only a server that fails to start, or a
/// test that asks for them, puts its log in the panic). The 2 s pause lets the watchdogs of
/// the other members of a cluster, which look at other moments, kill theirs before the
/// folder they share goes.
fn watchdog(pid: u32, reap: &Path) {
    let keep = std::env::var_os("FENCELOCK_TEST_KEEP").is_some_and(|v| !v.is_empty());
    let script = watchdog_script(std::process::id(), pid, start_time(pid), keep);
    let _ = Command::new("sh")
        .args(["-c", &script, "watchdog"])
        .arg(reap)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// When `pid` started (field 22 of `/proc/<pid>/stat`, in clock ticks since boot): with the
/// pid, it names one process; the pid alone names whichever process holds it now.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces: state is field 3.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// The watchdog's shell script. The kill checks that `pid` still names the server: most
/// servers are dropped (killed and reaped) long before the test process ends, and with the
/// kernel's default of 32,768 pids, cycled through by the watchdogs' own `sleep`s, the pid may
/// by then be another process's (another test's server, or the build).
fn watchdog_script(me: u32, pid: u32, start: Option<String>, keep: bool) -> String {
    let reap_step = if keep {
        String::new()
    } else {
        format!("; sleep 2; kill -0 {me} 2>/dev/null || rm -rf -- \"$1\"")
    };
    let kill = match start {
        Some(start) => format!(
            "[ \"$(sed 's/^.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20)\" = {start} ] \
             && kill -9 {pid} 2>/dev/null"
        ),
        // No /proc: as before, trusting the pid.
        None => format!("kill -9 {pid} 2>/dev/null"),
    };
    format!(
        "i=0; while kill -0 {me} 2>/dev/null && [ $i -lt 3600 ]; do sleep 1; i=$((i+1)); done; \
         {kill}{reap_step}"
    )
}

/// True when an HTTP GET of `path` on `port` answers with `expect` in the body.
pub(crate) fn http_get_contains(port: u16, path: &str, expect: &str) -> bool {
    http_get(port, path).contains(expect)
}

/// The raw response to an HTTP GET of `path` on loopback `port`; empty on failure.
pub(crate) fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A pid that no process holds any more.
    fn gone() -> u32 {
        let mut child = Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        child.id()
    }

    /// Runs the script of a watchdog whose test process is gone, aimed at a live process
    /// with the start time `start`; true when that process survived.
    fn survives(start: impl FnOnce(u32) -> Option<String>) -> bool {
        let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
        let script = watchdog_script(gone(), victim.id(), start(victim.id()), true);
        let status = Command::new("sh").args(["-c", &script]).status().unwrap();
        assert!(status.success() || status.code() == Some(1), "{status}");
        // A SIGKILL is delivered, and the process reaped, a moment after `kill` returns.
        let start = Instant::now();
        while matches!(victim.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let alive = matches!(victim.try_wait(), Ok(None));
        let _ = victim.kill();
        let _ = victim.wait();
        alive
    }

    #[test]
    fn the_watchdog_kills_its_server() {
        assert!(!survives(start_time), "the server outlived its watchdog");
    }

    #[test]
    fn the_watchdog_spares_a_process_that_took_the_servers_pid() {
        // The same pid, another start time: what a reused pid looks like.
        let other = |pid| start_time(pid).map(|t| format!("{}", t.parse::<u64>().unwrap() + 1));
        assert!(
            survives(other),
            "a process holding a dead server's pid was killed"
        );
    }
}
