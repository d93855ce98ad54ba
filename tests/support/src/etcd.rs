//! etcd single nodes and clusters.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use std::net::TcpStream;

use crate::process::{free_port, http_get_contains, tmp_root, unique, Server};
use crate::TlsFiles;

/// The variable naming etcd servers started elsewhere, for tests that only use a server.
pub const ETCD_ENV: &str = "FENCELOCK_TEST_ETCD_ENDPOINTS";

/// What to set [`ETCD_ENV`] to for the cluster in `docker-compose.yml`.
pub const COMPOSE_ETCD_ENDPOINTS: &str =
    "http://127.0.0.1:2379,http://127.0.0.1:22379,http://127.0.0.1:32379";

/// One member of an [`EtcdCluster`].
#[derive(Debug)]
pub struct EtcdMember {
    /// The member's name (`n0`, `n1`, ...).
    pub name: String,
    /// Client port on 127.0.0.1.
    pub client_port: u16,
    /// Peer port on 127.0.0.1.
    pub peer_port: u16,
    server: Server,
}

/// A real etcd cluster (1 or 3 members) on loopback, stopped on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    /// The members, in start order.
    pub members: Vec<EtcdMember>,
    /// TLS material when the client URLs are `https://`.
    pub tls: Option<TlsFiles>,
    /// Endpoints of servers started elsewhere (`FENCELOCK_TEST_ETCD_ENDPOINTS`).
    external: Option<Vec<String>>,
    /// The folder holding every member's data and log.
    pub dir: PathBuf,
}

impl EtcdCluster {
    /// Starts a cluster of `size` members and waits until it is healthy.
    pub fn start(size: usize) -> Self {
        Self::start_with(size, &[])
    }

    /// Starts a single member serving clients over TLS only, requiring client certificates
    /// signed by its CA.
    pub fn start_tls() -> Self {
        let dir = tmp_root().join(unique("etcd-tls"));
        let tls = TlsFiles::generate(&dir.join("tls"), "fencelock-client");
        Self::start_in(dir, 1, &[], Some(tls))
    }

    /// Starts a cluster of `size` members with `extra` flags on each.
    pub fn start_with(size: usize, extra: &[&str]) -> Self {
        Self::start_in(tmp_root().join(unique("etcd")), size, extra, None)
    }

    fn start_in(dir: PathBuf, size: usize, extra: &[&str], tls: Option<TlsFiles>) -> Self {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("n{i}=http://127.0.0.1:{peer}"))
            .collect();
        let token = unique("cluster");
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, peer_port))| {
                let name = format!("n{i}");
                let member_dir = dir.join(&name);
                let mut args: Vec<String> = [
                    "--name",
                    &name,
                    "--data-dir",
                    &member_dir.join("data").to_string_lossy(),
                    "--listen-client-urls",
                    &format!("{scheme}://127.0.0.1:{client_port}"),
                    "--advertise-client-urls",
                    &format!("{scheme}://127.0.0.1:{client_port}"),
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                    "--initial-cluster",
                    &initial.join(","),
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    &token,
                    "--unsafe-no-fsync",
                    "--log-level",
                    "warn",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                args.extend(extra.iter().map(|s| s.to_string()));
                if let Some(tls) = &tls {
                    for (flag, file) in [
                        ("--cert-file", &tls.server_cert),
                        ("--key-file", &tls.server_key),
                        ("--trusted-ca-file", &tls.ca),
                    ] {
                        args.push(flag.to_owned());
                        args.push(file.to_string_lossy().into_owned());
                    }
                    args.push("--client-cert-auth".to_owned());
                }
                EtcdMember {
                    name,
                    client_port,
                    peer_port,
                    server: Server::spawn("etcd", args, &member_dir, &dir),
                }
            })
            .collect();
        let mut cluster = EtcdCluster {
            members,
            dir,
            tls,
            external: None,
        };
        for i in 0..size {
            cluster.wait_healthy(i);
        }
        cluster
    }

    fn wait_healthy(&mut self, i: usize) {
        let tls = self.tls.is_some();
        let member = &mut self.members[i];
        let port = member.client_port;
        let what = format!("etcd member {} on 127.0.0.1:{port}", member.name);
        if !tls {
            member
                .server
                .wait_ready(&what, Duration::from_secs(30), || {
                    http_get_contains(port, "/health", "\"health\":\"true\"")
                });
            return;
        }
        // No plain-HTTP health endpoint: wait for the listener, then for etcdctl over TLS.
        member
            .server
            .wait_ready(&what, Duration::from_secs(30), || {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
        let limit = std::time::Instant::now() + Duration::from_secs(30);
        while self.etcdctl(&["endpoint", "health"]).is_err() {
            assert!(
                std::time::Instant::now() < limit,
                "{what} not healthy over TLS; log:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// For tests that only use a server: the cluster named by `FENCELOCK_TEST_ETCD_ENDPOINTS`
    /// (comma-separated client URLs, e.g. the docker-compose.yml cluster) when it is set, else a
    /// new one of `size` members started here.
    pub fn from_env_or_start(size: usize) -> Self {
        match std::env::var(ETCD_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            Some(list) => EtcdCluster {
                members: Vec::new(),
                dir: tmp_root(),
                tls: None,
                external: Some(list.split(',').map(|e| e.trim().to_owned()).collect()),
            },
            None => Self::start(size),
        }
    }

    /// Client URLs of all members: `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        if let Some(external) = &self.external {
            return external.clone();
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        self.members[i].server.kill();
    }

    /// Restarts member `i` (after [`kill`](Self::kill)) with its data, and waits for it.
    pub fn restart(&mut self, i: usize) {
        self.members[i].server.start();
        self.wait_healthy(i);
    }

    /// Saves a snapshot of a single-member cluster's data to `file` (`etcdctl snapshot save`).
    pub fn save_snapshot(&self, file: &std::path::Path) {
        assert_eq!(self.members.len(), 1, "snapshots of single members only");
        if let Err(e) = self.etcdctl(&["snapshot", "save", &file.to_string_lossy()]) {
            panic!("etcdctl snapshot save: {e}");
        }
    }

    /// Replaces a single-member cluster's data with `file`, as an operator restores a backup:
    /// stops the member, `etcdctl snapshot restore` into a fresh data dir, starts it again.
    pub fn restore_snapshot(&mut self, file: &std::path::Path) {
        assert_eq!(self.members.len(), 1, "snapshots of single members only");
        self.kill(0);
        let member = &self.members[0];
        let data = self.dir.join(&member.name).join("data");
        if let Err(e) = std::fs::remove_dir_all(&data) {
            panic!("remove {}: {e}", data.display());
        }
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore", &file.to_string_lossy()])
            .arg(format!("--data-dir={}", data.to_string_lossy()))
            .arg(format!("--name={}", member.name))
            .arg(format!("--initial-cluster={}={peer}", member.name))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster-token={}", unique("restored")))
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "etcdctl snapshot restore: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => panic!("cannot run etcdctl: {e}"),
        }
        self.restart(0);
    }

    /// Pauses (`true`) or resumes member `i` with SIGSTOP / SIGCONT.
    pub fn pause(&self, i: usize, paused: bool) {
        self.members[i]
            .server
            .signal(if paused { "-STOP" } else { "-CONT" });
    }

    /// The index of the current leader, as the members report it.
    pub fn leader(&self) -> Option<usize> {
        let out = self.etcdctl(&["endpoint", "status", "-w", "simple"]).ok()?;
        // Lines: endpoint, id, version, db size, is_leader, ...
        for line in out.lines() {
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            if cols.len() > 4 && cols[4] == "true" {
                return self.endpoints().iter().position(|e| e == cols[0]);
            }
        }
        None
    }

    /// Runs `etcdctl` (API v3) against the live members; stdout on success.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let live: Vec<String> = match &self.external {
            Some(external) => external.clone(),
            None => self
                .endpoints()
                .into_iter()
                .zip(&self.members)
                .filter(|(_, m)| m.server.child.is_some())
                .map(|(e, _)| e)
                .collect(),
        };
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", live.join(",")));
        if let Some(tls) = &self.tls {
            for (flag, file) in [
                ("--cacert", &tls.ca),
                ("--cert", &tls.client_cert),
                ("--key", &tls.client_key),
            ] {
                cmd.arg(format!("{flag}={}", file.to_string_lossy()));
            }
        }
        let out = cmd
            .args(args)
            .output()
            .map_err(|e| format!("cannot run etcdctl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// gRPC messages member `i` has received for `method` (`Txn`, `Range`, `Watch`,
    /// `LeaseGrant`, `LeaseKeepAlive`, ...), from its `/metrics`: one per unary call, one per
    /// stream message.
    pub fn rpc_count(&self, i: usize, method: &str) -> u64 {
        let port = self.members[i].client_port;
        let text = crate::process::http_get(port, "/metrics");
        let needle = format!("grpc_method=\"{method}\"");
        text.lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total") && l.contains(&needle))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    /// The value of the plain (label-free) metric `name` on member `i`, from its `/metrics`
    /// (for example `etcd_debugging_mvcc_events_total`, the watch events it has sent); 0 if absent.
    pub fn metric(&self, i: usize, name: &str) -> f64 {
        let port = self.members[i].client_port;
        crate::process::http_get(port, "/metrics")
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// The last lines of every member's log, for panic messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("--- {} ---\n{}", m.name, m.server.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
