//! Interoperability with Curator's InterProcessReadWriteLock (Java, Debian's
//! libcurator-recipes-java): readers of both share the lock, a writer of either waits for a
//! reader of the other, and no reader of either jumps a waiting writer of the other.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fencelock::{Access, Error, LockBackend, LockName, ReleaseOutcome, Wait};
use fencelock_testsupport::{compile_java, JavaProgram};

const BOUND: Duration = Duration::from_secs(60);
/// What Curator's writers are named (`InterProcessReadWriteLock.WRITE_LOCK_NAME` is
/// `__WRIT__`, as long as `__READ__`); its readers look for it (`contains`) to find a writer
/// ahead, and its sort strips it (or `__READ__`) to order the nodes.
const CURATOR_WRITER: &str = "-__WRIT__";
const CURATOR_READER: &str = "-__READ__";
/// How long a contender that must wait is watched for not getting in.
const PATIENCE: Duration = Duration::from_millis(1500);

fn compiled() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let java = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java");
        compile_java(&[java.join("CuratorRwLock.java")])
    })
}

/// A Curator contender for `access` (`read` or `write`) on the lock path `path`.
async fn curator(connect: &str, path: &str, access: &str) -> JavaProgram {
    let mut program = JavaProgram::start(compiled(), &["CuratorRwLock", connect, path, access]);
    program.expect("WAITING", BOUND).await;
    program
}

/// The czxid and node name of Curator's `ACQUIRED <czxid> <node>` line.
fn acquired(line: &str) -> (i64, String) {
    let mut words = line.split_whitespace().skip(1);
    let czxid = words.next().and_then(|w| w.parse().ok());
    let node = words.next().map(str::to_owned);
    match (czxid, node) {
        (Some(czxid), Some(node)) => (czxid, node),
        _ => panic!("expected ACQUIRED <czxid> <node>, got {line}"),
    }
}

/// Waits for Curator to hold, returning the czxid and name of its node.
async fn holds(java: &mut JavaProgram) -> (i64, String) {
    acquired(&java.expect("ACQUIRED", BOUND).await)
}

/// Curator prints nothing (it does not get in) for a while.
async fn still_waits(java: &mut JavaProgram) -> bool {
    tokio::time::timeout(PATIENCE, java.lines.next_line())
        .await
        .is_err()
}

async fn releases(mut java: JavaProgram) {
    java.send("release").await;
    java.expect("RELEASED", BOUND).await;
}

async fn bounded<T>(work: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, work)
        .await
        .expect("fencelock answers within the bound")
}

/// The children of the lock path in the order of their sequence numbers (for the messages).
async fn listing(factory: &common::ZkFactory, path: &str) -> Vec<String> {
    let mut children = factory.admin.list_children(path).await.unwrap();
    children.sort_by_key(|c| c[c.len().saturating_sub(10)..].to_owned());
    children
}

fn would_block<T: std::fmt::Debug>(result: &fencelock::Result<T>) -> bool {
    matches!(result, Err(Error::WouldBlock { .. }))
}

/// A Curator reader holds and a fencelock reader gets in at once; then the other way round.
/// Our nodes are named as Curator's readers, and our token is above Curator's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_fencelock_readers_share_the_lock() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/shared", factory.base);
    let name = LockName::new("shared").unwrap();
    let backend = factory.backend().await;

    let mut java = curator(&factory.connect, &path, "read").await;
    let (their_czxid, their_node) = holds(&mut java).await;
    assert!(
        common::is_protected(&their_node, CURATOR_READER),
        "Curator's reader: {their_node}"
    );
    let ours = bounded(backend.acquire_rw(&name, Access::Read, Wait::Try))
        .await
        .unwrap();
    assert!(ours.token().get() > their_czxid.unsigned_abs());
    let children = listing(&factory, &path).await;
    assert!(
        children.len() == 2
            && children
                .iter()
                .all(|c| common::is_protected(c, CURATOR_READER)),
        "our reader must be named as Curator's: {children:?}"
    );
    releases(java).await;

    // Curator's reader joins ours.
    let mut java = curator(&factory.connect, &path, "read").await;
    let (czxid, _) = holds(&mut java).await;
    assert!(czxid.unsigned_abs() > ours.token().get());
    releases(java).await;
    assert_eq!(
        bounded(ours.release()).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A fencelock writer is refused while a Curator reader holds, waits for it, and gets a token
/// above the reader's czxid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencelock_writer_waits_for_a_curator_reader() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/w-after-r", factory.base);
    let name = LockName::new("w-after-r").unwrap();
    let (a, b) = (
        Arc::new(factory.backend().await),
        Arc::new(factory.backend().await),
    );

    let mut java = curator(&factory.connect, &path, "read").await;
    let (their_czxid, _) = holds(&mut java).await;
    let tried = bounded(a.acquire_rw(&name, Access::Write, Wait::Try)).await;
    assert!(
        would_block(&tried),
        "{tried:?}; {:?}",
        listing(&factory, &path).await
    );

    let waiting = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { b.acquire_rw(&name, Access::Write, Wait::Forever).await })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let children = listing(&factory, &path).await;
    assert!(
        !waiting.is_finished(),
        "fencelock's writer must wait while Curator reads: {children:?}"
    );
    releases(java).await;
    let writer = bounded(waiting).await.unwrap().unwrap();
    assert!(writer.token().get() > their_czxid.unsigned_abs());
    assert_eq!(
        bounded(writer.release()).await.unwrap(),
        ReleaseOutcome::Released
    );
    // Checked last, so that the waiting above is tested whatever the name.
    assert!(
        children.len() == 2 && common::is_protected(&children[1], CURATOR_WRITER),
        "our writer must be named as Curator's (`{CURATOR_WRITER}`): {children:?}"
    );
}

/// A Curator writer waits for a fencelock reader; while it then holds, a fencelock reader is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_writer_waits_for_a_fencelock_reader() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/r-then-w", factory.base);
    let name = LockName::new("r-then-w").unwrap();
    let backend = factory.backend().await;

    let reader = bounded(backend.acquire_rw(&name, Access::Read, Wait::Try))
        .await
        .unwrap();
    let read_token = reader.token().get();
    let mut java = curator(&factory.connect, &path, "write").await;
    assert!(
        still_waits(&mut java).await,
        "Curator's writer must wait while fencelock reads: {:?}",
        listing(&factory, &path).await
    );
    assert_eq!(
        bounded(reader.release()).await.unwrap(),
        ReleaseOutcome::Released
    );
    let (czxid, node) = holds(&mut java).await;
    assert!(czxid.unsigned_abs() > read_token);

    let tried = bounded(backend.acquire_rw(&name, Access::Read, Wait::Try)).await;
    let children = listing(&factory, &path).await;
    assert!(
        would_block(&tried),
        "a fencelock reader must be refused while Curator's writer {node} holds: got {tried:?}; \
         children by sequence: {children:?}"
    );
    releases(java).await;
}

/// A Curator reader waits for a fencelock writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_reader_waits_for_a_fencelock_writer() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/w-then-r", factory.base);
    let name = LockName::new("w-then-r").unwrap();
    let backend = factory.backend().await;

    let writer = bounded(backend.acquire_rw(&name, Access::Write, Wait::Try))
        .await
        .unwrap();
    let mut java = curator(&factory.connect, &path, "read").await;
    let waited = still_waits(&mut java).await;
    let children = listing(&factory, &path).await;
    assert!(
        waited,
        "Curator's reader must wait while fencelock writes (token {}): children by sequence: \
         {children:?}",
        writer.token().get()
    );
    assert_eq!(
        bounded(writer.release()).await.unwrap(),
        ReleaseOutcome::Released
    );
    holds(&mut java).await;
    releases(java).await;
}

/// Fairness, one way: a fencelock reader holds, a Curator writer waits behind it, and a later
/// fencelock reader may not jump the waiting writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencelock_reader_may_not_jump_a_waiting_curator_writer() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/fair-ours", factory.base);
    let name = LockName::new("fair-ours").unwrap();
    let (a, b) = (factory.backend().await, factory.backend().await);

    let first = bounded(a.acquire_rw(&name, Access::Read, Wait::Try))
        .await
        .unwrap();
    let mut java = curator(&factory.connect, &path, "write").await;
    assert!(
        still_waits(&mut java).await,
        "Curator's writer must wait while fencelock reads: {:?}",
        listing(&factory, &path).await
    );
    let later = bounded(b.acquire_rw(&name, Access::Read, Wait::Try)).await;
    let children = listing(&factory, &path).await;
    assert!(
        would_block(&later),
        "a later fencelock reader must not jump Curator's waiting writer: got {later:?}; \
         children by sequence: {children:?}"
    );
    assert_eq!(
        bounded(first.release()).await.unwrap(),
        ReleaseOutcome::Released
    );
    holds(&mut java).await;
    releases(java).await;
}

/// Fairness, the other way: a Curator reader holds, a fencelock writer waits behind it, and a
/// later Curator reader may not jump the waiting writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_reader_may_not_jump_a_waiting_fencelock_writer() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/fair-theirs", factory.base);
    let name = LockName::new("fair-theirs").unwrap();
    let backend = Arc::new(factory.backend().await);

    let mut first = curator(&factory.connect, &path, "read").await;
    holds(&mut first).await;
    let waiting = {
        let (backend, name) = (Arc::clone(&backend), name.clone());
        tokio::spawn(async move {
            backend
                .acquire_rw(&name, Access::Write, Wait::Forever)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !waiting.is_finished(),
        "fencelock's writer must wait while Curator reads: {:?}",
        listing(&factory, &path).await
    );
    let mut later = curator(&factory.connect, &path, "read").await;
    let waited = still_waits(&mut later).await;
    let children = listing(&factory, &path).await;
    assert!(
        waited,
        "a later Curator reader must not jump fencelock's waiting writer: children by \
         sequence: {children:?}"
    );
    releases(first).await;
    let writer = bounded(waiting).await.unwrap().unwrap();
    assert!(
        still_waits(&mut later).await,
        "Curator's reader must wait while fencelock writes"
    );
    assert_eq!(
        bounded(writer.release()).await.unwrap(),
        ReleaseOutcome::Released
    );
    holds(&mut later).await;
    releases(later).await;
}

/// Writers of both exclude each other: a fencelock writer is refused while a Curator writer
/// holds, and a Curator writer waits while a fencelock writer holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_fencelock_writers_exclude_each_other() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/writers", factory.base);
    let name = LockName::new("writers").unwrap();
    let backend = factory.backend().await;

    let mut java = curator(&factory.connect, &path, "write").await;
    let (_, node) = holds(&mut java).await;
    let tried = bounded(backend.acquire_rw(&name, Access::Write, Wait::Try)).await;
    let children = listing(&factory, &path).await;
    assert!(
        would_block(&tried),
        "a fencelock writer must be refused while Curator's writer {node} holds: got \
         {tried:?}; children by sequence: {children:?}"
    );
    releases(java).await;

    let writer = bounded(backend.acquire_rw(&name, Access::Write, Wait::Try))
        .await
        .unwrap();
    let mut java = curator(&factory.connect, &path, "write").await;
    let waited = still_waits(&mut java).await;
    let children = listing(&factory, &path).await;
    assert!(
        waited,
        "Curator's writer must wait while fencelock writes: children by sequence: {children:?}"
    );
    assert_eq!(
        bounded(writer.release()).await.unwrap(),
        ReleaseOutcome::Released
    );
    holds(&mut java).await;
    releases(java).await;
}
