//! Interoperability with Curator's InterProcessSemaphoreV2 (Java, Debian's
//! libcurator-recipes-java): one pool of permits shared by both, each waiting for the other.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fencelock::{Error, LockBackend, LockName, ReleaseOutcome, Wait};
use fencelock_testsupport::{compile_java, JavaProgram};

const BOUND: Duration = Duration::from_secs(60);

fn compiled() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let java = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java");
        compile_java(&[java.join("CuratorSemaphore.java")])
    })
}

/// A Curator contender for one lease of `path` with `max` leases.
async fn curator(connect: &str, path: &str, max: u32) -> JavaProgram {
    let max = max.to_string();
    let mut program = JavaProgram::start(compiled(), &["CuratorSemaphore", connect, path, &max]);
    program.expect("WAITING", BOUND).await;
    program
}

/// Two permits: Curator holds one, fencelock the other, and a third contender of either kind
/// waits until one of them is returned. Our nodes are named as Curator's, and our token is
/// above the czxid of Curator's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_fencelock_share_one_pool_of_permits() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let path = format!("{}/pool", factory.base);
    let leases = format!("{path}/leases");
    let name = LockName::new("pool").unwrap();
    let mut java = curator(&factory.connect, &path, 2).await;
    java.expect("ACQUIRED", BOUND).await;
    let theirs = factory.admin.list_children(&leases).await.unwrap();
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    let their_czxid = factory
        .admin
        .check_stat(&format!("{leases}/{}", theirs[0]))
        .await
        .unwrap()
        .unwrap()
        .czxid;

    let (a, b) = (
        Arc::new(factory.backend().await),
        Arc::new(factory.backend().await),
    );
    let ours = a.acquire_permit(&name, 2, Wait::Try).await.unwrap();
    assert!(ours.token().get() > their_czxid.unsigned_abs());
    let children = factory.admin.list_children(&leases).await.unwrap();
    assert!(
        children.len() == 2 && children.iter().all(|c| common::is_protected(c, "-lease-")),
        "our lease must be named as Curator's: {children:?}"
    );
    assert!(matches!(
        b.acquire_permit(&name, 2, Wait::Try).await,
        Err(Error::WouldBlock { .. })
    ));
    let status = a.permit_status(&name).await.unwrap();
    assert_eq!((status.holders, status.waiting), (2, 0), "{status:?}");

    // fencelock waits for Curator's lease.
    let waiting = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { b.acquire_permit(&name, 2, Wait::Forever).await })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !waiting.is_finished(),
        "fencelock must wait while both permits are held"
    );
    java.send("release").await;
    java.expect("RELEASED", BOUND).await;
    let second = tokio::time::timeout(BOUND, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // Curator waits for ours.
    let mut java = curator(&factory.connect, &path, 2).await;
    let early = tokio::time::timeout(Duration::from_millis(1500), java.lines.next_line()).await;
    assert!(
        early.is_err(),
        "Curator must wait while fencelock holds both permits: {early:?}"
    );
    // The JVM may still be on its way to the gate (it printed its first line before).
    let mut gate = Vec::new();
    let looked = Instant::now();
    while gate.is_empty() && looked.elapsed() < BOUND {
        gate = factory
            .admin
            .list_children(&format!("{path}/locks"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        gate.len() == 1 && common::is_protected(&gate[0], "-lock-"),
        "Curator waits holding the gate, an InterProcessMutex: {gate:?}"
    );
    assert_eq!(ours.release().await.unwrap(), ReleaseOutcome::Released);
    java.expect("ACQUIRED", BOUND).await;
    assert!(matches!(
        a.acquire_permit(&name, 2, Wait::Try).await,
        Err(Error::WouldBlock { .. })
    ));
    java.send("release").await;
    java.expect("RELEASED", BOUND).await;
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
}
