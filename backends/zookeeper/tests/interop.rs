//! Interoperability with Curator's InterProcessMutex (Java, Debian's libcurator-recipes-java).
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use fencelock::{LockBackendExt, ReleaseOutcome};
use fencelock_testsupport::{tmp_root, unique};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const BOUND: Duration = Duration::from_secs(60);
const JARS: [&str; 16] = [
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
    "netty-handler",
    "netty-transport",
    "netty-common",
    "netty-buffer",
    "netty-resolver",
    "netty-codec",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
];

fn classpath() -> String {
    JARS.iter()
        .map(|j| format!("/usr/share/java/{j}.jar"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Compiles the Java contender once per test binary.
fn compiled() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tmp_root().join(unique("curator"));
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java/CuratorLock.java");
        let out = std::process::Command::new("javac")
            .args(["-cp", &classpath(), "-d"])
            .arg(&dir)
            .arg(&source)
            .output()
            .expect("run javac (scripts/test installs a JDK and libcurator-recipes-java)");
        assert!(
            out.status.success(),
            "javac failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

struct Curator {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Curator {
    fn start(connect: &str, path: &str) -> Self {
        let cp = format!("{}:{}", compiled().display(), classpath());
        let mut child = Command::new("java")
            .args(["-Xmx64m", "-cp", &cp, "CuratorLock", connect, path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start java");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Curator { child, lines }
    }

    async fn expect(&mut self, prefix: &str) -> String {
        let line = tokio::time::timeout(BOUND, self.lines.next_line())
            .await
            .expect("curator answers")
            .unwrap();
        let line = line.unwrap_or_else(|| panic!("curator exited before {prefix}"));
        assert!(line.starts_with(prefix), "expected {prefix}, got {line}");
        line
    }

    async fn release(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"release\n").await.unwrap();
        stdin.flush().await.unwrap();
        self.expect("RELEASED").await;
    }
}

fn is_curator_node(path: &str) -> bool {
    let child = path.rsplit('/').next().unwrap_or_default();
    let Some(rest) = child.strip_prefix("_c_") else {
        return false;
    };
    let Some((uuid, seq)) = rest.split_once("-lock-") else {
        return false;
    };
    uuid.len() == 36 && seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencelock_waits_for_curator_and_gets_a_greater_token() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let mut curator = Curator::start(&factory.connect, &format!("{}/shared", factory.base));
    curator.expect("WAITING").await;
    let line = curator.expect("ACQUIRED").await;
    let curator_node = line.trim_start_matches("ACQUIRED ").to_owned();
    assert!(is_curator_node(&curator_node), "{curator_node}");
    let curator_czxid = factory
        .admin
        .check_stat(&curator_node)
        .await
        .unwrap()
        .unwrap()
        .czxid;

    let backend = std::sync::Arc::new(factory.backend().await);
    assert!(matches!(
        backend.try_lock("shared").await,
        Err(fencelock::Error::WouldBlock { .. })
    ));
    let waiting = {
        let backend = std::sync::Arc::clone(&backend);
        tokio::spawn(async move { backend.lock("shared").await })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !waiting.is_finished(),
        "fencelock must wait while Curator holds the lock"
    );
    curator.release().await;
    let guard = tokio::time::timeout(BOUND, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(guard.token().get() > curator_czxid.unsigned_abs());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_waits_for_fencelock() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let backend = factory.backend().await;
    let guard = backend.lock("shared").await.unwrap();
    let children = factory
        .admin
        .list_children(&format!("{}/shared", factory.base))
        .await
        .unwrap();
    assert!(
        children.iter().all(|c| is_curator_node(c)),
        "our node must be named as Curator's: {children:?}"
    );

    let mut curator = Curator::start(&factory.connect, &format!("{}/shared", factory.base));
    curator.expect("WAITING").await;
    let early = tokio::time::timeout(Duration::from_millis(1500), curator.lines.next_line()).await;
    assert!(
        early.is_err(),
        "Curator must wait while fencelock holds the lock: {early:?}"
    );
    let token = guard.token();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let line = curator.expect("ACQUIRED").await;
    let node = line.trim_start_matches("ACQUIRED ");
    let czxid = factory.admin.check_stat(node).await.unwrap().unwrap().czxid;
    assert!(czxid.unsigned_abs() > token.get());
    curator.release().await;
}
