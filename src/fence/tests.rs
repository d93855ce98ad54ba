use std::time::Duration;

use super::*;

fn t(n: u64) -> FencingToken {
    FencingToken::new(n)
}

#[tokio::test]
async fn equal_tokens_pass_lower_fail_per_lock() {
    let fence = Fence::new();
    drop(fence.admit("a", t(5)).await.unwrap());
    drop(fence.admit("a", t(5)).await.unwrap());
    drop(fence.admit("b", t(1)).await.unwrap());
    let err = fence.admit("a", t(4)).await.unwrap_err();
    assert!(matches!(err, Error::StaleToken { presented, highest, .. }
        if presented.get() == 4 && highest.get() == 5));
    assert_eq!(fence.highest("a"), Some(t(5)));
}

#[test]
fn the_permit_is_send_and_static() {
    fn send_static<T: Send + 'static>(_: &T) {}
    let fence = Fence::new();
    let permit = fence.try_admit("a", t(1)).unwrap();
    send_static(&permit);
}

#[tokio::test(start_paused = true)]
async fn a_newer_token_waits_for_older_permits_and_same_tokens_share() {
    let fence = Arc::new(Fence::new());
    let old = fence.admit("a", t(5)).await.unwrap();
    // The same token is admitted next to the held permit.
    let same = fence.admit("a", t(5)).await.unwrap();
    let newer = tokio::spawn({
        let fence = Arc::clone(&fence);
        async move { fence.admit("a", t(6)).await.map(|p| p.token()) }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !newer.is_finished(),
        "token 6 was admitted while 5's writes were in flight"
    );
    // Another lock is not held up by this one.
    drop(fence.admit("b", t(1)).await.unwrap());
    assert!(matches!(
        fence.try_admit("a", t(7)),
        Err(Error::WouldBlock { .. })
    ));
    drop(old);
    drop(same);
    assert_eq!(newer.await.unwrap().unwrap(), t(6));
    assert!(fence.admit("a", t(5)).await.is_err());
}

#[tokio::test]
async fn compare_and_set_admits_only_the_claimed_token() {
    let fence = Fence::with_mode(FenceMode::CompareAndSet);
    assert!(matches!(
        fence.admit("a", t(3)).await,
        Err(Error::TokenNotClaimed { current: None, .. })
    ));
    fence.claim("a", t(3)).await.unwrap();
    drop(fence.admit("a", t(3)).await.unwrap());
    assert!(matches!(
        fence.admit("a", t(4)).await,
        Err(Error::TokenNotClaimed { current: Some(c), .. }) if c == t(3)
    ));
    fence.claim("a", t(4)).await.unwrap();
    assert!(matches!(
        fence.admit("a", t(3)).await,
        Err(Error::StaleToken { .. })
    ));
    assert!(matches!(
        fence.claim("a", t(3)).await,
        Err(Error::StaleToken { .. })
    ));
}

#[tokio::test]
async fn reset_admits_a_lower_token_again() {
    let fence = Fence::new();
    drop(fence.admit("a", t(90)).await.unwrap());
    assert!(fence.admit("a", t(12)).await.is_err());
    fence.reset("a").await;
    drop(fence.admit("a", t(12)).await.unwrap());
    assert_eq!(fence.highest("a"), Some(t(12)));
}

#[test]
fn header_round_trips() {
    let v = format_header("payouts", t(9));
    assert_eq!(parse_header(&v).unwrap(), ("payouts".into(), t(9)));
    assert!(parse_header("payouts").is_err());
    assert!(parse_header("=9").is_err());
    assert!(parse_header("a=x").is_err());
}
