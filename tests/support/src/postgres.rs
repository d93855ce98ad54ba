//! PostgreSQL servers: `initdb` in a temp folder, `postgres` on a free loopback port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{free_port, tmp_root, unique, Server};

/// A real PostgreSQL server on loopback (trust authentication, user `fencelock`, database
/// `postgres`), stopped on drop by an immediate shutdown, which removes its shared memory. Run
/// as root, it runs as the `postgres` system user.
#[derive(Debug)]
pub struct PgServer {
    /// The port on 127.0.0.1.
    pub port: u16,
    /// The folder holding the data, the socket and the log.
    pub dir: PathBuf,
    server: Server,
}

fn bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin").join(name))
                .collect()
        })
        .unwrap_or_default();
    found.retain(|p| p.exists());
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!("no /usr/lib/postgresql/*/bin/{name}; run scripts/test, which installs postgresql")
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The program and arguments that run `program` as the `postgres` user when we are root
/// (PostgreSQL refuses to run as root); `setpriv` execs, so a kill reaches the server itself.
fn as_server_user(program: &Path, args: &[String]) -> (String, Vec<String>) {
    let program = program.to_string_lossy().into_owned();
    if !is_root() {
        return (program, args.to_vec());
    }
    let mut all: Vec<String> = [
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    all.push(program);
    all.extend(args.iter().cloned());
    ("setpriv".to_owned(), all)
}

impl PgServer {
    /// Initializes a database cluster and starts it; waits until it accepts connections.
    pub fn start() -> Self {
        let root = tmp_root();
        let dir = root.join(unique("postgres"));
        std::fs::create_dir_all(&dir).expect("create the postgres folder");
        if is_root() {
            // The server user must reach its folder through the test root.
            let _ = Command::new("chmod").args(["o+x"]).arg(&root).status();
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("run chown");
            assert!(
                ok.success(),
                "chown of {} to postgres failed",
                dir.display()
            );
        }
        let data = dir.join("data");
        let init_args: Vec<String> = [
            "-D",
            &data.to_string_lossy(),
            "-A",
            "trust",
            "-U",
            "fencelock",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (program, args) = as_server_user(&bin("initdb"), &init_args);
        let out = Command::new(&program)
            .args(&args)
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let server_args: Vec<String> = [
            "-D",
            &data.to_string_lossy(),
            "-p",
            &port.to_string(),
            "-k",
            &dir.to_string_lossy(),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (program, args) = as_server_user(&bin("postgres"), &server_args);
        let server = Server::spawn(&program, args, &dir, &dir);
        let mut pg = PgServer { port, dir, server };
        pg.wait_ready();
        pg
    }

    fn wait_ready(&mut self) {
        let port = self.port;
        let ready = bin("pg_isready");
        self.server.wait_ready(
            &format!("postgres on 127.0.0.1:{port}"),
            Duration::from_secs(60),
            || {
                Command::new(&ready)
                    .args([
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &port.to_string(),
                        "-U",
                        "fencelock",
                    ])
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
    }

    /// The connection string for tokio-postgres and `psql`.
    pub fn url(&self) -> String {
        format!("postgres://fencelock@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server in immediate mode (SIGQUIT: no checkpoint, crash recovery at the next
    /// start) and starts it again on its data.
    pub fn restart(&mut self) {
        self.server.stop("-QUIT", Duration::from_secs(10));
        self.server.start();
        self.wait_ready();
    }

    /// The postmaster's process id while it runs (its backends are its children).
    pub fn pid(&self) -> Option<u32> {
        self.server.child.as_ref().map(|c| c.id())
    }

    /// The end of the server's log.
    pub fn logs(&self) -> String {
        self.server.log_tail()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // An immediate shutdown (SIGQUIT) still removes the server's shared memory; a SIGKILL
        // leaves a System V segment and a /dev/shm file until the machine reboots, and past
        // the kernel's 4,096 segments no server starts (tests/pg_shm.rs).
        self.server.stop("-QUIT", Duration::from_secs(10));
    }
}
