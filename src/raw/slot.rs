//! [`SessionSlot`]: at most one live session per backend instance.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Mutex as AsyncMutex;

use crate::Result;

/// A session that can tell whether it still lives.
pub trait Live: Send + Sync {
    /// False once the session is lost for good (its lease ended, it expired, it was closed).
    fn is_live(&self) -> bool;
}

/// Where a backend keeps its session: opened on first use, replaced once it is lost, and never
/// two live ones at a time (callers that find it empty wait for the one that is opening it).
#[derive(Debug)]
pub struct SessionSlot<S> {
    slot: AsyncMutex<Option<Arc<S>>>,
}

impl<S> Default for SessionSlot<S> {
    fn default() -> Self {
        SessionSlot {
            slot: AsyncMutex::new(None),
        }
    }
}

impl<S: Live> SessionSlot<S> {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// The live session, opening one with `open` if there is none (the first use, or after a
    /// loss). Concurrent callers wait for the one that opens it; `open`'s state is boxed, so
    /// it does not enlarge the caller's future.
    ///
    /// # Errors
    /// What `open` returns; the slot stays empty and the next call tries again.
    ///
    /// # Cancel safety
    /// Cancel-safe if `open` is: a dropped call leaves the slot as it was.
    pub async fn get_or_open<F, Fut>(&self, open: F) -> Result<Arc<S>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<S>>>,
    {
        let mut slot = self.slot.lock().await;
        if let Some(live) = slot.as_ref().filter(|s| s.is_live()) {
            return Ok(Arc::clone(live));
        }
        let session = Box::pin(open()).await?;
        // A slot that held a session held one that was lost: this open replaces it.
        crate::telemetry::record_session_open(slot.is_some());
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    /// Passes on an acquire's `outcome`; when it was refused or timed out, first waits for the
    /// live session's withdrawals of `name`, as
    /// [`Withdrawals::settle_refusal`](crate::raw::Withdrawals::settle_refusal) (with no live
    /// session, its entries end with the session that is gone).
    ///
    /// # Cancel safety
    /// Cancel-safe: it only waits.
    pub async fn settle_refusal<T>(
        &self,
        withdrawals: impl FnOnce(&S) -> &crate::raw::Withdrawals,
        name: &crate::LockName,
        limit: std::time::Duration,
        outcome: Result<T>,
    ) -> Result<T> {
        match self.live().await {
            Some(session) => {
                withdrawals(&session)
                    .settle_refusal(name, limit, outcome)
                    .await
            }
            None => outcome,
        }
    }

    /// The session if one is live now; never opens one.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn live(&self) -> Option<Arc<S>> {
        self.slot
            .lock()
            .await
            .as_ref()
            .filter(|s| s.is_live())
            .map(Arc::clone)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    struct Fake(AtomicBool);
    impl Live for Fake {
        fn is_live(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_once_for_concurrent_callers_and_again_after_a_loss() {
        let slot = Arc::new(SessionSlot::<Fake>::new());
        let opened = Arc::new(AtomicUsize::new(0));
        let open = |opened: Arc<AtomicUsize>| async move {
            tokio::time::sleep(Duration::from_millis(100)).await; // a slow connect
            opened.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(Fake(AtomicBool::new(true))))
        };
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (slot, opened) = (Arc::clone(&slot), Arc::clone(&opened));
                tokio::spawn(async move { slot.get_or_open(|| open(opened)).await.unwrap() })
            })
            .collect();
        let mut sessions = Vec::new();
        for task in tasks {
            sessions.push(task.await.unwrap());
        }
        assert_eq!(opened.load(Ordering::SeqCst), 1, "never two live sessions");
        assert!(sessions.iter().all(|s| Arc::ptr_eq(s, &sessions[0])));
        assert!(slot.live().await.is_some());

        sessions[0].0.store(false, Ordering::SeqCst); // the session is lost
        assert!(
            slot.live().await.is_none(),
            "a lost session is not handed out"
        );
        let next = slot
            .get_or_open(|| open(Arc::clone(&opened)))
            .await
            .unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 2);
        assert!(!Arc::ptr_eq(&next, &sessions[0]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_open_leaves_the_slot_empty() {
        let slot = SessionSlot::<Fake>::new();
        let failed = slot
            .get_or_open(|| async { Err(crate::Error::config("x", "no")) })
            .await;
        assert!(failed.is_err());
        assert!(slot.live().await.is_none());
        let opened = slot
            .get_or_open(|| async { Ok(Arc::new(Fake(AtomicBool::new(true)))) })
            .await;
        assert!(opened.is_ok());
    }
}
