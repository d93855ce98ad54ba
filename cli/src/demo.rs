//! `fencelock demo`: a paused holder, its successor, and a resource with and without fencing.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use fencelock::{
    Fence, FencingToken, LockBackend, LockBackendExt, LockName, MemoryBackend, MemoryStore,
};
use fencelock_connect::BackendUrl;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::exit;

/// The balance after B's deposit: what survives when the fence refuses A's stale write.
const B_DEPOSIT: &str = "150 (100 + 50 deposit)";

/// The protected resource: one balance, behind a fence or not, in memory or in PostgreSQL.
struct Register {
    fence: Option<Fence>,
    balance: Mutex<String>,
    #[cfg(feature = "postgres")]
    pg: Option<crate::demo_pg::PgResource>,
}

impl Register {
    async fn write(&self, who: &str, token: FencingToken, value: &str) {
        #[cfg(feature = "postgres")]
        if let Some(pg) = &self.pg {
            use crate::demo_pg::Refused;
            match pg.write(token, value, self.fence.is_some()).await {
                Ok(()) => println!(
                    "  resource (PostgreSQL): committed {who}'s write: balance = {value} (token {token})"
                ),
                Err(Refused::Stale(e)) => {
                    println!("  resource (PostgreSQL): REFUSED {who}'s write ({e})")
                }
                Err(Refused::Failed(e)) => println!("  resource (PostgreSQL): {who}'s write failed: {e}"),
            }
            return;
        }
        let mut balance = self.balance.lock().await;
        if let Some(fence) = &self.fence {
            if let Err(e) = fence.admit("balance", token).await {
                println!("  resource: REFUSED {who}'s write ({e})");
                return;
            }
        }
        println!("  resource: accepted {who}'s write: balance = {value} (token {token})");
        *balance = value.to_owned();
    }
}

/// Worker A: holds the lock, then is paused past its TTL.
enum WorkerA {
    /// In this process (mem://): a pause is simulated by stopping renewals.
    Local {
        _session: MemoryBackend,
        guard: fencelock::LockGuard,
    },
    /// A child process (real backends): really stopped with SIGSTOP.
    Process(
        tokio::process::Child,
        tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    ),
}

pub async fn demo(url: &str, resource: Option<&str>) -> u8 {
    if let Some(resource) = resource {
        if !(resource.starts_with("postgres://") || resource.starts_with("postgresql://")) {
            eprintln!("fencelock: --resource takes a postgres:// URL, not {resource:?}");
            return exit::USAGE;
        }
        if cfg!(not(feature = "postgres")) {
            eprintln!("fencelock: this build has no PostgreSQL resource (feature `postgres`)");
            return exit::USAGE;
        }
    }
    let memory = match fencelock_connect::parse(url) {
        // In memory, a short TTL keeps the demo to a few seconds.
        Ok(BackendUrl::Memory(config)) => Some(fencelock::MemoryConfig::with_ttl(
            config.ttl.min(Duration::from_secs(3)),
        )),
        Ok(_) => None,
        Err(e) => return exit::report(&e),
    };
    println!("fencelock demo on {}", fencelock_connect::redact(url));
    if let Some(resource) = resource {
        println!(
            "resource: PostgreSQL at {}",
            fencelock_connect::redact(resource)
        );
    }
    println!();
    for fenced in [true, false] {
        if fenced {
            println!("With fencing (the resource checks the token):");
        } else {
            println!("\nWithout fencing (a lease alone):");
        }
        let store = MemoryStore::new();
        let name = match LockName::new(format!("fencelock-demo-{}-{fenced}", std::process::id())) {
            Ok(name) => name,
            Err(e) => return exit::report(&e),
        };
        let outcome = scenario(
            url,
            memory.as_ref().map(|c| (&store, c)),
            &name,
            fenced,
            resource,
        )
        .await;
        // The verdict reads the balance the resource holds, so a fence that let A's stale write
        // through shows as the lost update it is, and fails the demo.
        match outcome {
            Ok(balance) if balance == B_DEPOSIT => {
                println!("  => final balance {balance}: B's deposit survived")
            }
            Ok(balance) => {
                println!("  => final balance {balance}: B's deposit is LOST (a lost update)");
                if fenced {
                    eprintln!("fencelock: the fence let a stale write through");
                    return exit::SOFTWARE;
                }
            }
            Err(code) => return code,
        }
    }
    0
}

async fn scenario(
    url: &str,
    memory: Option<(&MemoryStore, &fencelock::MemoryConfig)>,
    name: &LockName,
    fenced: bool,
    resource: Option<&str>,
) -> Result<String, u8> {
    #[cfg(feature = "postgres")]
    let pg = match resource {
        Some(url) => match crate::demo_pg::PgResource::connect(url, name.as_str(), "100").await {
            Ok(pg) => Some(pg),
            Err(e) => {
                eprintln!("fencelock: {e}");
                return Err(exit::UNAVAILABLE);
            }
        },
        None => None,
    };
    #[cfg(not(feature = "postgres"))]
    let _ = resource;
    let register = Register {
        fence: fenced.then(Fence::new),
        balance: Mutex::new("100".into()),
        #[cfg(feature = "postgres")]
        pg,
    };
    let report = |e: fencelock::Error| exit::report(&e);
    // Worker A takes the lock and reads the balance.
    let (mut a, a_token) = match memory {
        Some((store, config)) => {
            let backend = MemoryBackend::with_config(store, config.clone()).map_err(report)?;
            let guard = backend
                .acquire(name, fencelock::Wait::Forever)
                .await
                .map_err(report)?;
            let token = guard.token();
            backend.pause_renewals(true).await;
            (
                WorkerA::Local {
                    _session: backend,
                    guard,
                },
                token,
            )
        }
        None => {
            let exe = std::env::current_exe().map_err(|_| exit::SOFTWARE)?;
            let mut child = Command::new(exe)
                .args(["--backend", url, "demo-worker", name.as_str()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|_| exit::SOFTWARE)?;
            let mut lines = BufReader::new(child.stdout.take().ok_or(exit::SOFTWARE)?).lines();
            let token = match lines.next_line().await {
                Ok(Some(line)) => line.strip_prefix("TOKEN ").and_then(|t| t.parse().ok()),
                _ => None,
            };
            let Some(token) = token else {
                eprintln!("fencelock: the demo worker did not get the lock");
                return Err(exit::UNAVAILABLE);
            };
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            }
            (WorkerA::Process(child, lines), token)
        }
    };
    println!(
        "  A: acquired the lock with token {a_token}, read balance 100, then PAUSES (GC, SIGSTOP)"
    );

    // Worker B waits; it gets the lock only once A's lease has run out on the server.
    let b_backend: Arc<dyn LockBackend> = match memory {
        Some((store, config)) => {
            Arc::new(MemoryBackend::with_config(store, config.clone()).map_err(report)?)
        }
        None => fencelock_connect::connect(url).await.map_err(report)?,
    };
    let started = Instant::now();
    let b = b_backend.lock(name.as_str()).await.map_err(report)?;
    println!(
        "  B: A's lease ran out; B acquired the lock with token {} after {:.1}s",
        b.token(),
        started.elapsed().as_secs_f64()
    );
    register.write("B", b.token(), B_DEPOSIT).await;
    let _ = b.release().await;

    // A wakes up and writes what it computed before the pause.
    let held = match &mut a {
        WorkerA::Local { guard, .. } => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            guard.is_held()
        }
        WorkerA::Process(child, lines) => {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
            if let Some(stdin) = child.stdin.as_mut() {
                let _ = stdin.write_all(b"go\n").await;
            }
            matches!(lines.next_line().await, Ok(Some(line)) if line == "HELD true")
        }
    };
    println!("  A: wakes up; its guard says held = {held}; it writes anyway (the classic bug)");
    register
        .write(
            "A",
            FencingToken::new(a_token.get()),
            "70 (100 - 30 withdrawal)",
        )
        .await;
    if let WorkerA::Process(mut child, _) = a {
        let _ = child.wait().await;
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = &register.pg {
        let balance = pg.balance().await;
        pg.clean_up().await;
        return balance.map_err(|e| {
            eprintln!("fencelock: {e}");
            exit::UNAVAILABLE
        });
    }
    let balance = register.balance.lock().await.clone();
    Ok(balance)
}

/// The child side: take the lock, say the token, and after being resumed say whether the
/// guard still believes it holds the lock.
pub async fn worker(url: &str, name: &LockName) -> u8 {
    let backend = match fencelock_connect::connect(url).await {
        Ok(backend) => backend,
        Err(e) => return exit::report(&e),
    };
    let guard = match backend.acquire(name, fencelock::Wait::Forever).await {
        Ok(guard) => guard,
        Err(e) => return exit::report(&e),
    };
    println!("TOKEN {}", guard.token());
    let mut line = String::new();
    let _ = BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await;
    println!("HELD {}", guard.is_held());
    let _ = guard.release().await;
    0
}
