//! ZooKeeper standalone servers and ensembles.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::process::{free_port, tmp_root, unique, Server};
use crate::proxy::{ProxyMode, TcpProxy};

/// ZooKeeper's tick in these tests: sessions may last 2 to 20 ticks (1 s to 10 s).
pub const TICK: Duration = Duration::from_millis(500);

/// The variable naming ZooKeeper servers started elsewhere, for tests that only use a server.
pub const ZK_ENV: &str = "FENCELOCK_TEST_ZK_CONNECT";

/// What to set [`ZK_ENV`] to for the ensemble in `docker-compose.yml`.
pub const COMPOSE_ZK_CONNECT: &str = "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183";

/// One member of a [`ZkEnsemble`].
#[derive(Debug)]
pub struct ZkMember {
    /// The server id (`myid`), from 1.
    pub id: usize,
    /// Client port on 127.0.0.1.
    pub client_port: u16,
    server: Server,
}

/// A real ZooKeeper (standalone, or an ensemble of 3) on loopback, stopped on drop.
#[derive(Debug)]
pub struct ZkEnsemble {
    /// The members, in id order.
    pub members: Vec<ZkMember>,
    /// The folder holding every member's data and log.
    pub dir: PathBuf,
    /// Servers started elsewhere (`FENCELOCK_TEST_ZK_CONNECT`).
    external: Option<String>,
}

impl ZkEnsemble {
    /// Starts `size` servers (1 = standalone) and waits until each serves clients.
    pub fn start(size: usize) -> Self {
        Self::start_with(size, &[])
    }

    /// Starts `size` servers with `extra` lines in each `zoo.cfg`.
    pub fn start_with(size: usize, extra: &[&str]) -> Self {
        Self::start_with_each(size, &|_| extra.iter().map(|s| s.to_string()).collect())
    }

    /// Starts `size` servers; `extra(i)` gives the lines added to member i's `zoo.cfg` (index
    /// from 0), for ensembles whose members differ, as during a rolling change of settings.
    pub fn start_with_each(size: usize, extra: &dyn Fn(usize) -> Vec<String>) -> Self {
        let ports = Self::ports(size);
        Self::start_routed(&ports, extra, &|_, j| (ports[j].1, ports[j].2))
    }

    /// Client, quorum and election ports for `size` members.
    fn ports(size: usize) -> Vec<(u16, u16, u16)> {
        (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect()
    }

    /// A 3-member ensemble whose every link between two members goes through a [`TcpProxy`] of
    /// its own, so that one member can be cut off from the others ([`PeerLinks::cut`]) while
    /// its clients still reach it: a follower that has lost its leader.
    pub async fn start_partitionable() -> (Self, PeerLinks) {
        let ports = Self::ports(3);
        let mut links = Vec::new();
        // In member i's zoo.cfg, member j (j != i) is reached through proxies of its own.
        let mut routes = std::collections::HashMap::new();
        for i in 0..3 {
            for j in (0..3).filter(|&j| j != i) {
                let quorum = TcpProxy::start(format!("127.0.0.1:{}", ports[j].1)).await;
                let election = TcpProxy::start(format!("127.0.0.1:{}", ports[j].2)).await;
                routes.insert((i, j), (quorum.port, election.port));
                links.push(((i, j), quorum));
                links.push(((i, j), election));
            }
        }
        let route = |i: usize, j: usize| match routes.get(&(i, j)) {
            Some(&proxied) => proxied,
            None => (ports[j].1, ports[j].2), // its own line: the ports it listens on
        };
        let ensemble =
            tokio::task::block_in_place(|| Self::start_routed(&ports, &|_| Vec::new(), &route));
        (ensemble, PeerLinks { links })
    }

    /// Starts one member per entry of `ports`, with `extra(i)` lines in member i's zoo.cfg;
    /// `route(i, j)` is the quorum and election port that member i's zoo.cfg gives for member j.
    fn start_routed(
        ports: &[(u16, u16, u16)],
        extra: &dyn Fn(usize) -> Vec<String>,
        route: &dyn Fn(usize, usize) -> (u16, u16),
    ) -> Self {
        let size = ports.len();
        let dir = tmp_root().join(unique("zk"));
        let peers = |i: usize| -> Vec<String> {
            (0..size)
                .map(|j| {
                    let (quorum, election) = route(i, j);
                    format!("server.{}=127.0.0.1:{quorum}:{election}", j + 1)
                })
                .collect()
        };
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, _, _))| {
                let id = i + 1;
                let member_dir = dir.join(format!("zk{id}"));
                let data = member_dir.join("data");
                std::fs::create_dir_all(&data).expect("zk data dir");
                let mut cfg = vec![
                    format!("tickTime={}", TICK.as_millis()),
                    format!("dataDir={}", data.display()),
                    format!("clientPort={client_port}"),
                    "clientPortAddress=127.0.0.1".to_owned(),
                    "admin.enableServer=false".to_owned(),
                    "4lw.commands.whitelist=*".to_owned(),
                    "initLimit=10".to_owned(),
                    "syncLimit=5".to_owned(),
                    "forceSync=no".to_owned(),
                ];
                if size > 1 {
                    std::fs::write(data.join("myid"), id.to_string()).expect("myid");
                    cfg.extend(peers(i));
                }
                cfg.extend(extra(i));
                let cfg_path = member_dir.join("zoo.cfg");
                std::fs::write(&cfg_path, cfg.join("\n") + "\n").expect("zoo.cfg");
                let args = vec![
                    "-Xmx128m".to_owned(),
                    "-XX:+UseSerialGC".to_owned(),
                    "-XX:TieredStopAtLevel=1".to_owned(),
                    "-cp".to_owned(),
                    "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar".to_owned(),
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain".to_owned(),
                    cfg_path.to_string_lossy().into_owned(),
                ];
                ZkMember {
                    id,
                    client_port,
                    server: Server::spawn("java", args, &member_dir, &dir),
                }
            })
            .collect();
        let mut ensemble = ZkEnsemble {
            members,
            dir,
            external: None,
        };
        for i in 0..size {
            ensemble.wait_serving(i);
        }
        ensemble
    }

    fn wait_serving(&mut self, i: usize) {
        let member = &mut self.members[i];
        let port = member.client_port;
        let what = format!("zookeeper {} on 127.0.0.1:{port}", member.id);
        member
            .server
            .wait_ready(&what, Duration::from_secs(60), || {
                four_letter(port, "srvr").contains("Mode: ")
            });
    }

    /// For tests that only use a server: the servers named by `FENCELOCK_TEST_ZK_CONNECT`
    /// (`host:port,...`, e.g. the docker-compose.yml ensemble, whose tick must be 500 ms) when
    /// it is set, else a new ensemble of `size` started here.
    pub fn from_env_or_start(size: usize) -> Self {
        match std::env::var(ZK_ENV).ok().filter(|v| !v.trim().is_empty()) {
            Some(connect) => ZkEnsemble {
                members: Vec::new(),
                dir: tmp_root(),
                external: Some(connect.trim().to_owned()),
            },
            None => Self::start(size),
        }
    }

    /// `127.0.0.1:p1,127.0.0.1:p2,...`: a connect string for all members.
    pub fn connect_string(&self) -> String {
        if let Some(external) = &self.external {
            return external.clone();
        }
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The member's role: `standalone`, `leader` or `follower` (empty if it does not answer).
    pub fn mode(&self, i: usize) -> String {
        four_letter(self.members[i].client_port, "srvr")
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .unwrap_or_default()
            .to_owned()
    }

    /// Session ids connected to member `i` (from the `cons` command).
    pub fn connections(&self, i: usize) -> String {
        four_letter(self.members[i].client_port, "cons")
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        self.members[i].server.kill();
    }

    /// Restarts member `i` with its data and waits until it serves.
    pub fn restart(&mut self, i: usize) {
        self.members[i].server.start();
        self.wait_serving(i);
    }

    /// Pauses (`true`) or resumes member `i` with SIGSTOP / SIGCONT.
    pub fn pause(&self, i: usize, paused: bool) {
        self.members[i]
            .server
            .signal(if paused { "-STOP" } else { "-CONT" });
    }
}

/// The proxied links between the members of [`ZkEnsemble::start_partitionable`].
#[derive(Debug)]
pub struct PeerLinks {
    /// ((from member, to member), proxy), by member index from 0; two per pair and direction.
    links: Vec<((usize, usize), TcpProxy)>,
}

impl PeerLinks {
    /// Black-holes (`true`) or restores every link from or to member `i` (index from 0): its
    /// clients still reach it, but it hears nothing of the others.
    pub fn cut(&self, i: usize, cut: bool) {
        let mode = if cut {
            ProxyMode::BlackHole
        } else {
            ProxyMode::Forward
        };
        for ((from, to), proxy) in &self.links {
            if *from == i || *to == i {
                proxy.set_mode(mode);
            }
        }
    }
}

/// Sends a four-letter command and returns the answer ("" if the server does not answer).
pub fn four_letter(port: u16, command: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(command.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}
