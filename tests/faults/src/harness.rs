//! Servers, proxies and contender processes, and the faults applied to them.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use fencelock_testsupport::{
    tmp_root, unique, zk_op, EtcdCluster, PeerLinks, ProxyMode, TcpProxy, ZkEnsemble, ZkFrameProxy,
};
use tokio::process::{Child, Command};

use crate::{check, Event, Kind, Register, Report};

/// Which lock service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A 3-node etcd cluster.
    Etcd,
    /// A 3-node ZooKeeper ensemble.
    ZooKeeper,
}

/// What the contenders contend for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    /// The lock: each critical section is one acquisition.
    Lock,
    /// An election: each critical section is one leadership, its term the token.
    Election,
    /// A semaphore of [`PERMITS`] permits: each critical section is one permit.
    Semaphore,
    /// A reader-writer lock: each contender alternates, a read hold then a write hold.
    RwLock,
}

/// The permits of [`Primitive::Semaphore`].
pub const PERMITS: u32 = 2;

impl Primitive {
    fn arg(self) -> &'static str {
        match self {
            Primitive::Lock => "lock",
            Primitive::Election => "elect",
            Primitive::Semaphore => "permits",
            Primitive::RwLock => "rw",
        }
    }
}

/// A fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGSTOP the holder mid-section for two TTLs, then SIGCONT.
    Pause,
    /// Black-hole the holder's links to every server for two TTLs, then heal.
    Partition,
    /// SIGKILL the cluster's leader, restart it two seconds later.
    Kill,
    /// ZooKeeper only: the reply to the holder's next delete (its release) and to a waiter's
    /// next create is lost; the connection closes after the request went out, so the server
    /// applied it. (On etcd, which has no such proxy here, it is not applied.)
    LostReplies,
    /// ZooKeeper only: a follower is cut off from the other two members (its clients still
    /// reach it) for two TTLs, then heals: the holder may be on it (review F1).
    FollowerPartition,
    /// SIGSTOP the cluster's leader (not killed: it resumes believing it leads) for two TTLs,
    /// then SIGCONT, while the contenders renew through the other members (etcd review F4).
    StallLeader,
}

/// Faults to apply in order, from a seed that is printed so a run can be replayed.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The seed of the random part (0 for a fixed schedule).
    pub seed: u64,
    /// The faults, each after a pause of the given length.
    pub faults: Vec<(Fault, Duration)>,
}

impl Schedule {
    /// `count` random faults with random gaps of 0.5 to 2 s, from `seed` (xorshift64).
    pub fn random(seed: u64, count: usize) -> Self {
        let mut x = seed.max(1);
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let faults = (0..count)
            .map(|_| {
                let fault = [
                    Fault::Pause,
                    Fault::Partition,
                    Fault::Kill,
                    Fault::LostReplies,
                    Fault::FollowerPartition,
                    Fault::StallLeader,
                ][usize::try_from(next() % 6).unwrap_or(0)];
                (fault, Duration::from_millis(500 + next() % 1500))
            })
            .collect();
        Schedule { seed, faults }
    }

    /// These faults, one second apart.
    pub fn fixed(faults: &[Fault]) -> Self {
        Schedule {
            seed: 0,
            faults: faults
                .iter()
                .map(|&f| (f, Duration::from_secs(1)))
                .collect(),
        }
    }
}

struct Contender {
    child: Child,
    proxies: Vec<TcpProxy>,
    /// ZooKeeper: behind each proxy, one that reads frames, to lose chosen replies.
    frames: Vec<ZkFrameProxy>,
}

/// A running setup: a 3-node cluster, a register, contenders.
pub struct Harness {
    backend: Backend,
    etcd: Option<EtcdCluster>,
    zk: Option<ZkEnsemble>,
    /// ZooKeeper: the links between members, each through a proxy of its own.
    links: Option<PeerLinks>,
    /// The protected resource.
    pub register: Register,
    contenders: Vec<Contender>,
    ttl: Duration,
    /// Faults applied, by kind.
    pub applied: BTreeMap<Fault, usize>,
}

const STEP_MS: u64 = 150;

impl Harness {
    /// Starts a fresh 3-node cluster, a register (fenced or not) and `contenders` processes of
    /// the `contender` binary at `program`, contending for `primitive`.
    pub async fn start(
        program: &str,
        (backend, primitive): (Backend, Primitive),
        fenced: bool,
        contenders: usize,
    ) -> Self {
        let ttl = Duration::from_secs(2);
        let (etcd, zk, links, targets) = match backend {
            Backend::Etcd => {
                let cluster = EtcdCluster::start(3);
                let targets = cluster
                    .members
                    .iter()
                    .map(|m| format!("127.0.0.1:{}", m.client_port))
                    .collect();
                (Some(cluster), None, None, targets)
            }
            Backend::ZooKeeper => {
                let (ensemble, links) = ZkEnsemble::start_partitionable().await;
                let targets: Vec<String> = ensemble
                    .connect_string()
                    .split(',')
                    .map(str::to_owned)
                    .collect();
                (None, Some(ensemble), Some(links), targets)
            }
        };
        let register = Register::start(fenced).await;
        let prefix = unique("faults");
        let logs = tmp_root().join(&prefix);
        std::fs::create_dir_all(&logs).unwrap();
        let mut running = Vec::new();
        for i in 0..contenders {
            let (mut proxies, mut frames) = (Vec::new(), Vec::new());
            for target in &targets {
                // ZooKeeper: contender -> black-hole proxy -> frame proxy -> server.
                let target = if backend == Backend::ZooKeeper {
                    let frame = ZkFrameProxy::start(target.clone()).await;
                    let hop = format!("127.0.0.1:{}", frame.port);
                    frames.push(frame);
                    hop
                } else {
                    target.clone()
                };
                proxies.push(TcpProxy::start(target).await);
            }
            let hosts: Vec<String> = proxies
                .iter()
                .map(|p| format!("127.0.0.1:{}", p.port))
                .collect();
            let url = match backend {
                Backend::Etcd => format!(
                    "etcd://{}/{prefix}?ttl=2s&request_timeout=1s",
                    hosts.join(",")
                ),
                Backend::ZooKeeper => format!(
                    "zk://{}/{prefix}?session_timeout=2s&tick_time=500ms&request_timeout=1s",
                    hosts.join(",")
                ),
            };
            let log = std::fs::File::create(logs.join(format!("contender-{i}.log"))).unwrap();
            let child = Command::new(program)
                .args([
                    url.as_str(),
                    "register",
                    register.addr.as_str(),
                    &STEP_MS.to_string(),
                    primitive.arg(),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            running.push(Contender {
                child,
                proxies,
                frames,
            });
        }
        Harness {
            backend,
            etcd,
            zk,
            links,
            register,
            contenders: running,
            ttl,
            applied: BTreeMap::new(),
        }
    }

    /// Lets the contenders work for `how_long`.
    pub async fn settle(&self, how_long: Duration) {
        tokio::time::sleep(how_long).await;
    }

    /// The contender that holds the lock now (of several readers, the latest granted), by the
    /// register's log.
    fn holder(&self) -> Option<usize> {
        let log = self.register.log();
        let mut open: Vec<(u32, u64)> = Vec::new();
        for event in &log {
            let key = (event.pid, event.token);
            match event.kind {
                Kind::Acquired | Kind::AcquiredRead => open.push(key),
                Kind::Lost | Kind::Released => open.retain(|&k| k != key),
                _ => {}
            }
        }
        let &(pid, _) = open.last()?;
        self.contenders
            .iter()
            .position(|c| c.child.id() == Some(pid))
    }

    /// Waits (at most 20 s) until the holder has just read: a pause then lands mid-section.
    async fn holder_mid_section(&self) -> Option<usize> {
        let mut events = self.register.subscribe();
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        while let Ok(Ok(event)) = tokio::time::timeout_at(until, events.recv()).await {
            if event.kind == Kind::Read {
                return self
                    .contenders
                    .iter()
                    .position(|c| c.child.id() == Some(event.pid));
            }
        }
        None
    }

    /// The store's leader, waiting up to 10 s for one (an election after the last fault may
    /// still be running).
    async fn leader(&self) -> Option<usize> {
        for _ in 0..50 {
            let leader = match self.backend {
                Backend::Etcd => self.etcd.as_ref().and_then(EtcdCluster::leader),
                Backend::ZooKeeper => self
                    .zk
                    .as_ref()
                    .and_then(|zk| (0..3).find(|&i| zk.mode(i) == "leader")),
            };
            if leader.is_some() {
                return leader;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// Applies every fault of `schedule`, printing it.
    pub async fn run(&mut self, schedule: &Schedule) {
        for &(fault, gap) in &schedule.faults {
            self.settle(gap).await;
            self.apply(fault).await;
        }
    }

    async fn apply(&mut self, fault: Fault) {
        let two_ttls = self.ttl * 2 + Duration::from_millis(500);
        match fault {
            Fault::Pause => {
                let Some(i) = self.holder_mid_section().await else {
                    return;
                };
                let Some(pid) = self.contenders[i].child.id() else {
                    return;
                };
                signal(pid, "-STOP");
                tokio::time::sleep(two_ttls).await;
                signal(pid, "-CONT");
            }
            Fault::Partition => {
                let Some(i) = self.holder() else { return };
                for proxy in &self.contenders[i].proxies {
                    proxy.set_mode(ProxyMode::BlackHole);
                }
                tokio::time::sleep(two_ttls).await;
                for proxy in &self.contenders[i].proxies {
                    proxy.set_mode(ProxyMode::Forward);
                }
            }
            Fault::LostReplies => {
                if self.backend != Backend::ZooKeeper {
                    return;
                }
                let holder = self.holder();
                for (i, contender) in self.contenders.iter().enumerate() {
                    let ops: &[i32] = if Some(i) == holder {
                        &[zk_op::DELETE]
                    } else {
                        &[zk_op::CREATE2, zk_op::CREATE]
                    };
                    // A rule per server: whichever the contender's session is on fires.
                    for frame in &contender.frames {
                        frame.lose_reply_to(ops);
                    }
                }
                tokio::time::sleep(two_ttls).await;
                // Rules not fired (on the servers a contender is not connected to) are dropped.
                for contender in &self.contenders {
                    for frame in &contender.frames {
                        frame.disarm();
                    }
                }
            }
            Fault::FollowerPartition => {
                let (Some(ensemble), Some(links)) = (&self.zk, &self.links) else {
                    return;
                };
                let modes: Vec<String> = (0..3).map(|i| ensemble.mode(i)).collect();
                let Some(follower) = modes.iter().position(|m| m == "follower") else {
                    eprintln!("faults: no follower to cut off (modes {modes:?})");
                    return;
                };
                links.cut(follower, true);
                tokio::time::sleep(two_ttls).await;
                links.cut(follower, false);
            }
            Fault::StallLeader => {
                let Some(leader) = self.leader().await else {
                    eprintln!("faults: no leader to stall within 10 s");
                    return;
                };
                let pause = |paused| match (&self.etcd, &self.zk) {
                    (Some(cluster), _) => cluster.pause(leader, paused),
                    (_, Some(ensemble)) => ensemble.pause(leader, paused),
                    _ => {}
                };
                pause(true);
                tokio::time::sleep(two_ttls).await;
                pause(false);
            }
            Fault::Kill => match self.backend {
                Backend::Etcd => {
                    let cluster = self.etcd.as_mut().unwrap();
                    let Some(leader) = cluster.leader() else {
                        return;
                    };
                    cluster.kill(leader);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    cluster.restart(leader);
                }
                Backend::ZooKeeper => {
                    let ensemble = self.zk.as_mut().unwrap();
                    let Some(leader) = (0..3).find(|&i| ensemble.mode(i) == "leader") else {
                        return;
                    };
                    ensemble.kill(leader);
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    ensemble.restart(leader);
                }
            },
        }
        *self.applied.entry(fault).or_default() += 1;
    }

    /// Stops the contenders and checks the history.
    pub async fn finish(mut self) -> (Report, Vec<Event>, BTreeMap<Fault, usize>) {
        self.register.stop();
        for contender in &mut self.contenders {
            // A contender still waiting for the lock hears STOP only once granted.
            if tokio::time::timeout(Duration::from_secs(20), contender.child.wait())
                .await
                .is_err()
            {
                let _ = contender.child.kill().await;
            }
        }
        let log = self.register.log();
        (check(&log), log, self.applied)
    }
}

fn signal(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}
