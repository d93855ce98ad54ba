//! The conformance checks of elections. Each takes a [`BackendFactory`] and panics on a broken
//! property; [`conformance_tests!`](crate::conformance_tests) runs them with the lock checks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;

use super::checks::ok;
use super::{bounded, BackendFactory};
use crate::{
    Error, Fence, FencingToken, Leader, Leadership, LockBackend, LockBackendExt, LockName,
    ReleaseOutcome, Result, Wait,
};

async fn campaign<B: LockBackend + ?Sized>(
    what: &str,
    backend: &B,
    name: &LockName,
    value: &str,
) -> Leadership {
    ok(
        what,
        bounded(
            what,
            backend.acquire_leadership(name, value.as_bytes(), Wait::Forever),
        )
        .await,
    )
}

async fn resign(what: &str, leader: Leadership) {
    let outcome = ok(what, bounded(what, leader.resign()).await);
    assert_eq!(outcome, ReleaseOutcome::Released, "{what}");
}

/// The next item of an observation, within the bound.
async fn next_change(
    what: &str,
    changes: &mut (impl futures::Stream<Item = Result<Option<Leader>>> + Unpin),
) -> Option<Leader> {
    match bounded(what, changes.next()).await {
        Some(item) => ok(what, item),
        None => panic!("{what}: the observation ended"),
    }
}

/// Candidates on several instances lead in turn: never two at once (a counter kept in fenced
/// state loses no increment), terms increase from one leadership to the next, and `leader`
/// shows the leader's own value and term while it leads.
pub async fn election_one_leader_at_a_time<F: BackendFactory>(factory: &F) {
    const INSTANCES: usize = 3;
    const TASKS: usize = 2;
    const ROUNDS: usize = 3;
    let name = factory.name("elect");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let fence = Arc::new(Fence::new());
    let terms = Arc::new(Mutex::new(Vec::<FencingToken>::new()));
    let mut tasks = Vec::new();
    for i in 0..INSTANCES {
        let backend = Arc::new(factory.connect().await);
        for t in 0..TASKS {
            let (backend, name, inside, overlaps, fence, terms) = (
                Arc::clone(&backend),
                name.clone(),
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&fence),
                Arc::clone(&terms),
            );
            tasks.push(tokio::spawn(async move {
                let value = format!("candidate-{i}-{t}");
                for _ in 0..ROUNDS {
                    let leader = campaign("elect: campaign", &*backend, &name, &value).await;
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    ok(
                        "elect: the term was refused by the fence",
                        fence.admit(name.as_str(), leader.term()).await.map(drop),
                    );
                    terms
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(leader.term());
                    let seen = ok("elect: leader", backend.leader(&name).await);
                    assert_eq!(
                        seen,
                        Some(Leader::new(value.clone().into_bytes(), leader.term())),
                        "leader() must show the leader's value and term while it leads"
                    );
                    let n: usize = ok("elect: fenced_get", leader.fenced_get("count").await)
                        .and_then(|b| String::from_utf8(b).ok())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    ok(
                        "elect: fenced_put",
                        leader.fenced_put("count", (n + 1).to_string()).await,
                    );
                    inside.fetch_sub(1, Ordering::SeqCst);
                    resign("elect: resign", leader).await;
                }
            }));
        }
    }
    for task in tasks {
        if let Err(e) = bounded("elect: candidates", task).await {
            panic!("a candidate failed: {e}");
        }
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two leaders at once");
    let terms = terms.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms must increase from one leadership to the next: {terms:?}"
    );
    let reader = factory.connect().await;
    let last = campaign("elect: count", &reader, &name, "reader").await;
    let count = ok("elect: count", last.fenced_get("count").await);
    assert_eq!(
        count,
        Some((INSTANCES * TASKS * ROUNDS).to_string().into_bytes()),
        "an increment was lost: two leaders overlapped"
    );
    resign("elect: count", last).await;
}

/// `observe` yields the leader now, then every change: a leader, its new value, the next
/// leader after a resignation, and `None` when no one leads.
pub async fn election_observe_sees_every_change<F: BackendFactory>(factory: &F) {
    let name = factory.name("observe");
    let (a, b, watcher) = (
        factory.connect().await,
        Arc::new(factory.connect().await),
        factory.connect().await,
    );
    assert_eq!(ok("observe: leader", watcher.leader(&name).await), None);
    let mut changes = watcher.observe(&name);
    assert_eq!(next_change("observe: no leader", &mut changes).await, None);

    let mut first = campaign("observe: a", &a, &name, "a").await;
    let term = first.term();
    assert_eq!(
        next_change("observe: a leads", &mut changes).await,
        Some(Leader::new(b"a".to_vec(), term))
    );
    ok(
        "observe: proclaim",
        bounded("proclaim", first.proclaim("a2")).await,
    );
    assert_eq!(first.value(), b"a2");
    assert_eq!(
        next_change("observe: a's new value", &mut changes).await,
        Some(Leader::new(b"a2".to_vec(), term)),
        "a proclaim changes the value, not the term"
    );
    // Our own write to our entry is no loss (ZooKeeper tells the node's watcher of it too).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.is_held(), "a proclaim must not end the leadership");
    ok(
        "observe: fenced put after proclaim",
        first.fenced_put("k", "v").await,
    );
    let second = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { b.acquire_leadership(&name, b"b", Wait::Forever).await })
    };
    // A waiting candidate is not a change of leader; the next item must be b's election
    // (b is queued before a resigns, or no one would lead for a moment).
    super::until_queued("observe: b queues", &watcher, &name, 1).await;
    resign("observe: a resigns", first).await;
    let next = match bounded("observe: b elected", second).await {
        Ok(next) => ok("observe: b", next),
        Err(e) => panic!("observe: b's campaign failed: {e}"),
    };
    let seen = next_change("observe: b leads", &mut changes).await;
    assert_eq!(seen, Some(Leader::new(b"b".to_vec(), next.term())));
    assert!(next.term() > term, "b's term must be greater than a's");
    resign("observe: b resigns", next).await;
    assert_eq!(
        next_change("observe: no leader again", &mut changes).await,
        None
    );
    assert_eq!(ok("observe: leader", watcher.leader(&name).await), None);
}

/// A resignation hands over at once: the waiting candidate is elected while the resigned
/// leader's session lives on (so nothing but the resignation can have let it in).
pub async fn election_resign_hands_over_at_once<F: BackendFactory>(factory: &F) {
    let name = factory.name("resign");
    let (a, b) = (factory.connect().await, Arc::new(factory.connect().await));
    let leader = campaign("resign: a", &a, &name, "a").await;
    let waiting = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { b.acquire_leadership(&name, b"b", Wait::Forever).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "b must wait while a leads");
    let term = leader.term();
    resign("resign: a", leader).await;
    let next = match bounded("resign: b elected", waiting).await {
        Ok(next) => ok("resign: b", next),
        Err(e) => panic!("resign: b's campaign failed: {e}"),
    };
    assert!(next.term() > term);
    // `a` lives on: its session did not end, it resigned.
    let again = a.try_campaign(name.as_str(), "a").await;
    assert!(
        matches!(again, Err(Error::WouldBlock { .. })),
        "while b leads: {again:?}"
    );
    resign("resign: b", next).await;
}

/// A leader whose session ends stops leading: its `lost` fires and its fenced writes and
/// proclaims are refused; a candidate waiting when its own
/// session ends gets [`Error::LockLost`].
pub async fn election_session_loss_ends_leadership<F: BackendFactory>(factory: &F) {
    let name = factory.name("elect-loss");
    let (a, b, c) = (
        factory.connect().await,
        Arc::new(factory.connect().await),
        factory.connect().await,
    );
    let mut leader = campaign("loss: a", &a, &name, "a").await;
    let waiting = {
        let (b, name) = (Arc::clone(&b), name.clone());
        tokio::spawn(async move { b.acquire_leadership(&name, b"b", Wait::Forever).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    factory.break_session(&a).await;
    let next = match bounded("loss: b elected", waiting).await {
        Ok(next) => ok("loss: b", next),
        Err(e) => panic!("loss: b's campaign failed: {e}"),
    };
    // A revoke is immediate at the store, so `lost` may trail b's election by a moment here;
    // that it fires before a lease can *expire* is the faults suite's to show.
    bounded("loss: a's lost fires", leader.lost()).await;
    assert!(!leader.is_held());
    assert!(next.term() > leader.term());
    let refused = leader.fenced_put("stale", "a").await;
    assert!(matches!(&refused, Err(e) if e.is_lost()), "{refused:?}");
    let refused = leader.proclaim("a-again").await;
    assert!(matches!(&refused, Err(e) if e.is_lost()), "{refused:?}");
    assert_eq!(
        ok("loss: leader", c.leader(&name).await),
        Some(Leader::new(b"b".to_vec(), next.term()))
    );

    // A candidate whose session ends while it waits.
    if let Ok(alone) = c.status(&name).await {
        assert_eq!(alone.waiting, 0, "only b campaigns yet: {alone:?}");
    }
    let doomed = {
        let (b2, name) = (factory.connect().await, name.clone());
        let b2 = Arc::new(b2);
        let task = {
            let (b2, name) = (Arc::clone(&b2), name.clone());
            tokio::spawn(async move { b2.acquire_leadership(&name, b"c", Wait::Forever).await })
        };
        // Broken once its candidacy is in the store: broken before, it would campaign again
        // on a new session and wait behind b for good.
        super::until_queued("loss: the candidate queues", &c, &name, 1).await;
        factory.break_session(&b2).await;
        task
    };
    match bounded("loss: the waiting candidate ends", doomed).await {
        Ok(Err(Error::LockLost { .. })) => {}
        other => panic!("a campaign whose session ended: {other:?}"),
    }
    resign("loss: b", next).await;
}

/// A timed-out or dropped campaign leaves no candidate behind.
pub async fn election_cancelled_campaign_leaves_nothing<F: BackendFactory>(factory: &F) {
    let name = factory.name("elect-cancel");
    let (a, b, c) = (
        factory.connect().await,
        factory.connect().await,
        factory.connect().await,
    );
    let leader = campaign("cancel: a", &a, &name, "a").await;
    let timed = b
        .acquire_leadership(&name, b"b", Wait::Timeout(Duration::from_millis(300)))
        .await;
    assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
    let dropped =
        tokio::time::timeout(Duration::from_millis(300), b.campaign(name.as_str(), "b")).await;
    assert!(
        dropped.is_err(),
        "the dropped campaign should still have been waiting"
    );
    resign("cancel: a", leader).await;
    // `b` keeps its session: a candidate entry left behind would block `c` until the bound,
    // and be reported as the leader. `c` waits, as in `cancelled_acquire_leaves_nothing`: the
    // dropped campaign is withdrawn in the background (a try here failed under CPU load).
    let next = ok(
        "cancel: c",
        bounded("cancel: c", c.campaign(name.as_str(), "c")).await,
    );
    assert_eq!(
        ok("cancel: leader", a.leader(&name).await).map(|l| l.value),
        Some(b"c".to_vec())
    );
    resign("cancel: c", next).await;
}
