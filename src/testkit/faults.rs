//! Fault scenarios for backends' own fault tests (not conformance checks: they need a way to
//! cut a client off, which only the backend's tests have).

use std::sync::Arc;
use std::time::Duration;

use super::bounded;
use super::checks::{ok, release};
use crate::{Error, LockBackend, LockBackendExt, LockGuard, ReleaseOutcome};

/// The cut-off scenario, for backends' fault tests: the caller has just cut `cut` (the backend
/// holding `stale` on `name`) off from the store, and `heal` restores the link (or does nothing
/// if the caller heals it on a timer). Checks that `stale` fires `lost` before `other` is
/// granted the lock with a greater token, that the stale guard's writes are refused, and, once
/// `cut` talks to the store again, that its stale release deletes nothing of the successor's.
/// Returns how long after the call `lost` fired and the successor was granted.
pub async fn cut_off_holder<A, B>(
    stale: LockGuard,
    cut: &A,
    other: Arc<B>,
    name: &str,
    heal: impl FnOnce(),
) -> (Duration, Duration)
where
    A: LockBackend + ?Sized,
    B: LockBackend + ?Sized + 'static,
{
    let cut_at = tokio::time::Instant::now();
    let waiting = {
        let (other, name) = (Arc::clone(&other), name.to_owned());
        tokio::spawn(async move {
            let guard = other.lock(&name).await;
            (guard, tokio::time::Instant::now())
        })
    };
    bounded("cut_off: lost after the cut", stale.lost()).await;
    let lost_at = tokio::time::Instant::now();
    let (next, granted_at) = match bounded("cut_off: successor granted", waiting).await {
        Ok((next, at)) => (ok("cut_off: successor", next), at),
        Err(e) => panic!("cut_off: the successor failed: {e}"),
    };
    assert!(
        lost_at < granted_at,
        "lost must fire before the store can hand the lock on"
    );
    assert!(next.token() > stale.token());
    let refused = stale.fenced_put("owner", "stale-late").await;
    assert!(matches!(&refused, Err(e) if e.is_lost()), "{refused:?}");
    ok(
        "cut_off: successor write",
        next.fenced_put("owner", "next").await,
    );

    heal();
    // Bounded by BOUND: the cut client opens a new session once the link is back.
    let reconnected = bounded("cut_off: the cut client reconnects", async {
        loop {
            match cut
                .lock_timeout(&format!("{name}-after"), Duration::from_secs(5))
                .await
            {
                Ok(guard) => break guard,
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    })
    .await;
    let outcome = ok("cut_off: stale release", stale.release().await);
    assert_eq!(
        outcome,
        ReleaseOutcome::NotOwned,
        "a stale release must delete nothing"
    );
    let tried = other.try_lock(name).await;
    assert!(
        matches!(tried, Err(Error::WouldBlock { .. })),
        "the successor must keep the lock: {tried:?}"
    );
    let seen = ok("cut_off: successor read", next.fenced_get("owner").await);
    assert_eq!(seen.as_deref(), Some(&b"next"[..]));
    release("cut_off: reconnected", reconnected).await;
    release("cut_off: successor", next).await;
    (lost_at - cut_at, granted_at - cut_at)
}

/// The observer-gap scenario, for backends' fault tests: `observer` follows election `name`;
/// `cut` cuts it off from the store (`heal`, called `gap` later, restores the link; it may do
/// nothing if the caller heals on a timer). Meanwhile the leader changes (`a` resigns, `b` is
/// elected and proclaims). Once healed, the observer's next item must be the leader *now*
/// (etcd#18163 reported an old one after a gap), with nothing stale in between.
///
/// # Panics
/// When the observation yields a stale leader, an error, or nothing within [`BOUND`](super::BOUND).
pub async fn observe_across_a_gap<O, A, B>(
    observer: &O,
    (a, b): (&A, &B),
    name: &crate::LockName,
    (cut, heal): (impl FnOnce(), impl FnOnce()),
    gap: Duration,
) where
    O: LockBackend + ?Sized,
    A: LockBackend + ?Sized,
    B: LockBackend + ?Sized,
{
    use futures::StreamExt;
    let mut changes = observer.observe(name);
    let mut next = async || match bounded("observe: next change", changes.next()).await {
        Some(item) => ok("observe", item),
        None => panic!("observe: the stream ended"),
    };
    assert_eq!(next().await, None, "observe: no leader yet");
    let first = ok(
        "gap: a",
        bounded("gap: a", a.campaign(name.as_str(), "a")).await,
    );
    let seen = next().await.map(|l| l.value);
    assert_eq!(seen, Some(b"a".to_vec()));
    cut();
    let _ = ok(
        "gap: a resigns",
        bounded("gap: resign", first.resign()).await,
    );
    let mut second = ok(
        "gap: b",
        bounded("gap: b", b.campaign(name.as_str(), "b")).await,
    );
    ok(
        "gap: proclaim",
        bounded("gap: proclaim", second.proclaim("b2")).await,
    );
    tokio::time::sleep(gap).await;
    heal();
    let after = next().await;
    assert_eq!(
        after,
        Some(crate::Leader::new(b"b2".to_vec(), second.term())),
        "after the gap the observer must report the leader now"
    );
    let _ = ok(
        "gap: b resigns",
        bounded("gap: resign", second.resign()).await,
    );
    assert_eq!(next().await, None, "observe: no leader after b resigned");
}
