//! Interoperability with Curator's InterProcessMutex and LeaderLatch (Java, Debian's
//! libcurator-recipes-java).
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use fencelock::{LockBackend, LockBackendExt, ReleaseOutcome};
use fencelock_testsupport::{compile_java, JavaProgram};

const BOUND: Duration = Duration::from_secs(60);

/// Compiles the Java programs once per test binary.
fn compiled() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let java = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java");
        compile_java(&[
            java.join("CuratorLock.java"),
            java.join("CuratorLatch.java"),
        ])
    })
}

struct Curator(JavaProgram);

impl Curator {
    fn start(connect: &str, path: &str) -> Self {
        Curator(JavaProgram::start(
            compiled(),
            &["CuratorLock", connect, path],
        ))
    }

    /// A `LeaderLatch` participant with id `id`.
    fn latch(connect: &str, path: &str, id: &str) -> Self {
        Curator(JavaProgram::start(
            compiled(),
            &["CuratorLatch", connect, path, id],
        ))
    }

    async fn expect(&mut self, prefix: &str) -> String {
        self.0.expect(prefix, BOUND).await
    }

    async fn release(&mut self) {
        self.0.send("release").await;
        self.expect("RELEASED").await;
    }

    /// Sends `command` and returns the answer, which must start with `prefix`.
    async fn ask(&mut self, command: &str, prefix: &str) -> String {
        self.0.send(command).await;
        self.expect(prefix).await
    }
}

fn is_curator_node(path: &str) -> bool {
    is_protected_node(path, "-lock-")
}

fn is_protected_node(path: &str, recipe: &str) -> bool {
    let child = path.rsplit('/').next().unwrap_or_default();
    let Some(rest) = child.strip_prefix("_c_") else {
        return false;
    };
    let Some((uuid, seq)) = rest.split_once(recipe) else {
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
    // Who is queued: Curator's node holds its IP address (foreign); ours names us.
    let seen = backend
        .status(&fencelock::LockName::new("shared").unwrap())
        .await
        .unwrap();
    fencelock::testkit::assert_foreign_holder_then_ours(&seen, curator_czxid.unsigned_abs());
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
    let early =
        tokio::time::timeout(Duration::from_millis(1500), curator.0.lines.next_line()).await;
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

/// A Curator `LeaderLatch` and our campaign on one latch path: each waits while the other leads,
/// each sees the other's id as the leader, and our term is greater than the Curator leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_latch_and_our_campaign_exclude_each_other() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/elect", factory.base);
    let mut first = Curator::latch(&factory.connect, &path, "java-1");
    first.expect("STARTED").await;
    first.ask("await", "LEADER").await;

    let backend = std::sync::Arc::new(factory.backend().await);
    let name = fencelock::LockName::new("elect").unwrap();
    let seen = backend.leader(&name).await.unwrap().expect("Curator leads");
    assert_eq!(
        seen.value, b"java-1",
        "Curator's participant id is the leader's value"
    );
    assert!(matches!(
        backend.try_campaign("elect", "fencelock-1").await,
        Err(fencelock::Error::WouldBlock { .. })
    ));
    let waiting = {
        let backend = std::sync::Arc::clone(&backend);
        tokio::spawn(async move { backend.campaign("elect", "fencelock-1").await })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!waiting.is_finished(), "we must wait while Curator leads");
    first.ask("close", "CLOSED").await;
    let leader = tokio::time::timeout(BOUND, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(leader.term() > seen.term, "our term must exceed Curator's");
    let children = factory.admin.list_children(&path).await.unwrap();
    assert!(
        children.iter().all(|c| is_protected_node(c, "-latch-")),
        "our node must be named as LeaderLatch's: {children:?}"
    );

    let mut second = Curator::latch(&factory.connect, &path, "java-2");
    second.expect("STARTED").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        second.ask("has", "HAS").await,
        "HAS false",
        "Curator must not lead while we do"
    );
    assert_eq!(
        second.ask("leader", "LEADER_ID").await,
        "LEADER_ID fencelock-1"
    );
    assert_eq!(leader.resign().await.unwrap(), ReleaseOutcome::Released);
    second.ask("await", "LEADER").await;
    assert_eq!(second.ask("has", "HAS").await, "HAS true");
    let now = backend.leader(&name).await.unwrap().expect("Curator leads");
    assert_eq!(now.value, b"java-2");
    second.ask("close", "CLOSED").await;
}
