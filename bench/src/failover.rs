//! Failover: from the leader's end to the next leader elected (and, for ours, to its first
//! fenced write accepted), when the leader resigns and when it dies. Ours beside `etcdctl
//! elect` and Curator's `LeaderLatch` on the same servers, with the same TTL.
//!
//! "Dies": the peers' leader process is SIGKILLed; ours is cut off by a black hole, which is
//! the same to the store (no more renewals, no goodbye) and keeps it in this process.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::{LockBackend, LockBackendExt};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_testsupport::{compile_java, JavaProgram, ProxyMode, TcpProxy};
use fencelock_zookeeper::{ZkBackend, ZkConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::servers::Servers;
use crate::stats::percentiles;

const TTL: Duration = Duration::from_secs(4);
const ROUNDS: usize = 3;
const BOUND: Duration = Duration::from_secs(60);
/// How long a follower waits before the leader ends, so that it is queued and watching.
const QUEUED: Duration = Duration::from_millis(300);

/// Times of one failover: to the next leader elected, and to its first fenced write.
type Times = (Duration, Option<Duration>);

/// Ours: `leader` leads, `next` campaigns, then `end` ends the leadership.
async fn ours(
    leader: &dyn LockBackend,
    next: Arc<dyn LockBackend>,
    name: &str,
    end: impl AsyncFnOnce(fencelock::Leadership),
) -> Times {
    let led = leader.campaign(name, "a").await.unwrap();
    let waiting = {
        let name = name.to_owned();
        tokio::spawn(async move {
            let elected = next.campaign(&name, "b").await.unwrap();
            let at = Instant::now();
            elected.fenced_put("work", "b").await.unwrap();
            let written = Instant::now();
            let _ = elected.resign().await;
            (at, written)
        })
    };
    tokio::time::sleep(QUEUED).await;
    let start = Instant::now();
    end(led).await;
    let (elected, written) = tokio::time::timeout(BOUND, waiting).await.unwrap().unwrap();
    (elected - start, Some(written - start))
}

async fn ours_rounds(
    label: &str,
    direct: impl AsyncFn() -> Arc<dyn LockBackend>,
    cut: impl AsyncFn() -> (Arc<dyn LockBackend>, TcpProxy),
) -> [Vec<Times>; 2] {
    let (mut resigned, mut died) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (a, b) = (direct().await, direct().await);
        resigned.push(
            ours(
                a.as_ref(),
                b,
                &format!("{label}-resign-{round}"),
                async |led| {
                    let _ = led.resign().await;
                },
            )
            .await,
        );
        let ((a, proxy), b) = (cut().await, direct().await);
        died.push(
            ours(
                a.as_ref(),
                b,
                &format!("{label}-die-{round}"),
                async |led| {
                    proxy.set_mode(ProxyMode::BlackHole);
                    drop(led); // its background release cannot get through; the lease ends it
                },
            )
            .await,
        );
    }
    [resigned, died]
}

fn etcdctl(endpoint: &str, args: &[&str]) -> tokio::process::Child {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn first_line(child: &mut tokio::process::Child) -> String {
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(BOUND, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

/// `etcdctl elect`: the leader gets SIGINT, and resigns. (etcdctl 3.4's `elect` has no `--ttl`:
/// its session TTL is 60 s, so a SIGKILLed etcdctl leader is replaced after about a minute; that
/// is not measured.)
async fn etcdctl_rounds(endpoint: &str, prefix: &str) -> Vec<Times> {
    let mut out = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("{prefix}etcdctl-{round}");
        let mut leader = etcdctl(endpoint, &["elect", &name, "a"]);
        let key = first_line(&mut leader).await;
        assert!(key.starts_with(&name), "etcdctl elect printed {key:?}");
        let mut next = etcdctl(endpoint, &["elect", &name, "b"]);
        let mut lines = BufReader::new(next.stdout.take().unwrap()).lines();
        tokio::time::sleep(QUEUED).await;
        let start = Instant::now();
        let pid = leader.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap();
        let key = tokio::time::timeout(BOUND, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        out.push((start.elapsed(), None));
        assert!(key.starts_with(&name), "etcdctl elect printed {key:?}");
        let _ = leader.kill().await;
        let _ = next.kill().await;
    }
    out
}

/// Curator's `LeaderLatch`: the leader closes its latch (it resigns) or gets SIGKILL.
async fn curator_rounds(connect: &str, base: &str) -> [Vec<Times>; 2] {
    let java = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../backends/zookeeper/tests/java");
    let classes = compile_java(&[java.join("CuratorLatch.java")]);
    let session = TTL.as_millis().to_string();
    let mut out = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        for (i, times) in out.iter_mut().enumerate() {
            let path = format!("{base}/curator-{round}-{i}");
            let latch = |id: &str| {
                JavaProgram::start(&classes, &["CuratorLatch", connect, &path, id, &session])
            };
            let mut leader = latch("a");
            leader.expect("STARTED", BOUND).await;
            leader.send("await").await;
            leader.expect("LEADER", BOUND).await;
            let mut next = latch("b");
            next.expect("STARTED", BOUND).await;
            next.send("await").await;
            tokio::time::sleep(QUEUED).await;
            let start = Instant::now();
            if i == 0 {
                leader.send("close").await;
            } else {
                let _ = leader.child.start_kill();
            }
            next.expect("LEADER", BOUND).await;
            times.push((start.elapsed(), None));
        }
    }
    out
}

fn cell(times: &[Times]) -> String {
    let mut elected: Vec<Duration> = times.iter().map(|t| t.0).collect();
    let mut written: Vec<Duration> = times.iter().filter_map(|t| t.1).collect();
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let elected = ms(percentiles(&mut elected).0);
    if written.is_empty() {
        return format!("{elected} | -");
    }
    format!("{elected} | {}", ms(percentiles(&mut written).0))
}

pub async fn run(servers: &Servers) {
    println!("\n### Failover (TTL / session timeout {TTL:?}; median of {ROUNDS})\n");
    println!("| setup | resigns: next elected | resigns: next's first write | dies: next elected | dies: next's first write |\n|---|---|---|---|---|");
    let prefix = Servers::prefix();
    let endpoint = servers.etcd_endpoint()[0].clone();
    let etcd_config = |endpoints: Vec<String>| EtcdConfig::new(endpoints).prefix(&prefix).ttl(TTL);
    let [resigned, died] = ours_rounds(
        "etcd",
        async || {
            Arc::new(
                EtcdBackend::connect(etcd_config(vec![endpoint.clone()]))
                    .await
                    .unwrap(),
            ) as Arc<dyn LockBackend>
        },
        async || {
            let proxy = TcpProxy::start(endpoint.trim_start_matches("http://").to_owned()).await;
            let backend = EtcdBackend::connect(etcd_config(vec![proxy.endpoint()]))
                .await
                .unwrap();
            (Arc::new(backend) as Arc<dyn LockBackend>, proxy)
        },
    )
    .await;
    println!(
        "| fencelock, {} | {} | {} |",
        servers.label("etcd"),
        cell(&resigned),
        cell(&died)
    );
    let resigned = etcdctl_rounds(&endpoint, &prefix).await;
    println!(
        "| etcdctl elect, {} | {} | not measured (no --ttl: 60 s) | - |",
        servers.label("etcd"),
        cell(&resigned),
    );

    let base = Servers::base();
    let connect = servers.zk_connect();
    let zk_config = |connect: String| {
        ZkConfig::new(connect)
            .base_path(&base)
            .tick_time(fencelock_testsupport::ZK_TICK)
            .session_timeout(TTL)
    };
    let [resigned, died] = ours_rounds(
        "zk",
        async || {
            Arc::new(
                ZkBackend::connect(zk_config(connect.clone()))
                    .await
                    .unwrap(),
            ) as Arc<dyn LockBackend>
        },
        async || {
            let proxy = TcpProxy::start(connect.clone()).await;
            let backend = ZkBackend::connect(zk_config(format!("127.0.0.1:{}", proxy.port)))
                .await
                .unwrap();
            (Arc::new(backend) as Arc<dyn LockBackend>, proxy)
        },
    )
    .await;
    println!(
        "| fencelock, {} | {} | {} |",
        servers.label("zookeeper"),
        cell(&resigned),
        cell(&died)
    );
    let [resigned, died] = curator_rounds(&connect, &base).await;
    println!(
        "| Curator LeaderLatch, {} | {} | {} |",
        servers.label("zookeeper"),
        cell(&resigned),
        cell(&died)
    );
}
