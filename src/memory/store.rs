//! The "server" side of the memory backend: sessions with TTLs, lock queues, fenced values.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Access, FencingToken, LockName, LockStatus, Owner, QueueEntry, StateKey};

/// A shared in-memory lock store: what an etcd cluster is to the etcd backend.
///
/// Make one per test, then one [`MemoryBackend`](super::MemoryBackend) per simulated process with
/// [`MemoryStore::backend`]. Each backend has its own session, so they contend like separate
/// clients. The store expires sessions on its own clock (Tokio's, so `tokio::time::pause()` makes
/// expiry deterministic), and offers fault injection for tests of code that uses locks.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    pub(super) inner: Arc<StoreInner>,
}

#[derive(Debug, Default)]
pub(super) struct StoreInner {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    revision: u64,
    next_session: u64,
    sessions: HashMap<u64, Instant>,
    /// Per lock: entries in grant order; the front one holds the lock.
    queues: HashMap<String, VecDeque<Entry>>,
    /// Per semaphore: its count of permits, while its queue is not empty (locks have none and
    /// take 1).
    permits: HashMap<String, u32>,
    values: HashMap<(String, String), Vec<u8>>,
    changes: Changes,
}

/// Counts every change of a queue (entries and their values), for elections' `observe`.
#[derive(Debug)]
struct Changes(tokio::sync::watch::Sender<u64>);

impl Default for Changes {
    fn default() -> Self {
        Changes(tokio::sync::watch::Sender::new(0))
    }
}

impl Changes {
    fn bump(&self) {
        self.0.send_modify(|n| *n += 1);
    }
}

#[derive(Debug, Clone)]
struct Entry {
    token: u64,
    session: u64,
    since: Instant,
    /// Woken when this entry becomes the holder or is removed.
    wake: Arc<Notify>,
    /// An election candidate's published value (empty for locks).
    value: Vec<u8>,
    owner: Owner,
    /// A reader-writer lock's entry: what it asked for (`None` for a lock's entry).
    access: Option<Access>,
}

/// Why [`MemoryStore::enqueue`] queued nothing.
pub(super) enum Refused {
    /// The session has expired.
    SessionGone,
    /// The semaphore holds another count.
    Permits(u32),
}

/// Where a queued entry stands.
pub(super) enum Position {
    Holder { checkpoint: Option<Vec<u8>> },
    Waiting { wake: Arc<Notify> },
    Gone,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The holder's token of `name`, if someone holds it.
    pub fn holder(&self, name: &LockName) -> Option<FencingToken> {
        self.state()
            .queues
            .get(name.as_str())
            .and_then(|q| q.front())
            .map(|e| FencingToken::new(e.token))
    }

    /// The queue in grant order, for `status`.
    pub(super) fn status(&self, name: &LockName) -> LockStatus {
        let state = self.state();
        let queue = state.queues.get(name.as_str()).map_or_else(Vec::new, |q| {
            q.iter()
                .map(|e| {
                    let (token, owner) = (FencingToken::new(e.token), Some(e.owner.clone()));
                    QueueEntry::new(token, owner, Some(e.since.elapsed())).with_access(e.access)
                })
                .collect()
        });
        LockStatus::from_queue(name.clone(), queue)
    }

    /// Names with a holder, starting with `prefix`, sorted.
    pub(super) fn names(&self, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .state()
            .queues
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// How many contenders are queued on `name`, the holder included.
    pub fn queue_len(&self, name: &LockName) -> usize {
        self.state()
            .queues
            .get(name.as_str())
            .map_or(0, VecDeque::len)
    }

    /// Fault injection: deletes the holder's grant of `name` behind its back, as an operator's
    /// `etcdctl del` would. The holder is not told; its next fenced operation is refused.
    /// Returns the removed holder's token.
    pub fn release_behind_back(&self, name: &LockName) -> Option<FencingToken> {
        let mut state = self.state();
        let token = state.queues.get(name.as_str())?.front()?.token;
        state.remove_entry(name.as_str(), token);
        Some(FencingToken::new(token))
    }

    /// Fault injection: expires session `id` now, as the server does when renewals stop.
    /// Its holder finds out on its next renewal.
    pub(super) fn expire_session(&self, id: u64) {
        self.state().expire(id);
    }

    pub(super) fn grant(&self, ttl: Duration) -> u64 {
        let id = {
            let mut state = self.state();
            state.next_session += 1;
            let id = state.next_session;
            state.sessions.insert(id, Instant::now() + ttl);
            id
        };
        tokio::spawn(reap(Arc::downgrade(&self.inner), id));
        id
    }

    /// Extends session `id` by `ttl` from now; false if it has expired.
    pub(super) fn keep_alive(&self, id: u64, ttl: Duration) -> bool {
        match self.state().sessions.get_mut(&id) {
            Some(expires) => {
                *expires = Instant::now() + ttl;
                true
            }
            None => false,
        }
    }

    pub(super) fn revoke(&self, id: u64) {
        self.state().expire(id);
    }

    /// Queues a new entry for `name` under session `id`: a lock's (`permits: None`) or a
    /// semaphore's, whose count must match the stored one.
    pub(super) fn enqueue(
        &self,
        name: &str,
        session: u64,
        value: &[u8],
        owner: &Owner,
        (permits, access): (Option<u32>, Option<Access>),
    ) -> Result<u64, Refused> {
        let mut state = self.state();
        if !state.sessions.contains_key(&session) {
            return Err(Refused::SessionGone);
        }
        if let Some(permits) = permits {
            match state.permits.get(name) {
                Some(&stored) if stored != permits => return Err(Refused::Permits(stored)),
                Some(_) => {}
                None => drop(state.permits.insert(name.to_owned(), permits)),
            }
        }
        state.revision += 1;
        let token = state.revision;
        state
            .queues
            .entry(name.to_owned())
            .or_default()
            .push_back(Entry {
                token,
                session,
                since: Instant::now(),
                wake: Arc::new(Notify::new()),
                value: value.to_vec(),
                owner: owner.clone(),
                access,
            });
        state.changes.bump();
        Ok(token)
    }

    pub(super) fn position(&self, name: &str, token: u64) -> Position {
        let state = self.state();
        let Some(queue) = state.queues.get(name) else {
            return Position::Gone;
        };
        match queue.iter().position(|e| e.token == token) {
            None => Position::Gone,
            Some(i) if state.holds(queue, name, i) => Position::Holder {
                checkpoint: state
                    .values
                    .get(&(name.to_owned(), StateKey::checkpoint().as_str().to_owned()))
                    .cloned(),
            },
            Some(i) => Position::Waiting {
                wake: Arc::clone(&queue[i].wake),
            },
        }
    }

    /// The semaphore `name`: its count, holders and waiters, for `permit_status`.
    pub(super) fn permit_status(&self, name: &LockName) -> LockStatus {
        let state = self.state();
        let permits = state.permits.get(name.as_str()).copied();
        let entries: Vec<QueueEntry> = state.queues.get(name.as_str()).map_or_else(Vec::new, |q| {
            q.iter()
                .map(|e| {
                    let (token, owner) = (FencingToken::new(e.token), Some(e.owner.clone()));
                    QueueEntry::new(token, owner, Some(e.since.elapsed()))
                })
                .collect()
        });
        let admits = state.admits(name.as_str()).min(entries.len());
        let (holders, waiters) = (entries[..admits].to_vec(), entries[admits..].to_vec());
        LockStatus::from_permits(name.clone(), permits, holders, waiters)
    }

    /// How many entries are queued ahead of entry `token` (0 when it holds or is gone).
    pub(super) fn ahead(&self, name: &str, token: u64) -> usize {
        let state = self.state();
        state
            .queues
            .get(name)
            .and_then(|q| q.iter().position(|e| e.token == token))
            .unwrap_or(0)
    }

    /// The first entry of `name`: (token, value).
    pub(super) fn leader(&self, name: &str) -> Option<(u64, Vec<u8>)> {
        let state = self.state();
        let first = state.queues.get(name)?.front()?;
        Some((first.token, first.value.clone()))
    }

    /// A receiver that sees every later change of any queue.
    pub(super) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.state().changes.0.subscribe()
    }

    /// Replaces the value of entry `token` if it is the holder; false if it is not.
    pub(super) fn set_value(&self, name: &str, token: u64, value: &[u8]) -> bool {
        let mut state = self.state();
        let Some(first) = state.queues.get_mut(name).and_then(|q| q.front_mut()) else {
            return false;
        };
        if first.token != token {
            return false;
        }
        first.value = value.to_vec();
        state.changes.bump();
        true
    }

    /// Removes the entry; true if it was there.
    pub(super) fn remove(&self, name: &str, token: u64) -> bool {
        self.state().remove_entry(name, token)
    }

    /// Runs `op` on the values of `name` if `token` holds it; `None` if it does not.
    pub(super) fn with_values<T>(
        &self,
        name: &str,
        token: u64,
        op: impl FnOnce(&mut HashMap<(String, String), Vec<u8>>) -> T,
    ) -> Option<T> {
        let mut state = self.state();
        let holds = state.queues.get(name).is_some_and(|q| {
            q.iter().enumerate().any(|(i, e)| {
                e.token == token
                    && state.sessions.contains_key(&e.session)
                    && state.holds(q, name, i)
            })
        });
        holds.then(|| op(&mut state.values))
    }
}

impl State {
    /// Whether entry `i` of `name`'s queue holds: one of a semaphore's first N, a reader with
    /// only readers ahead, or the front entry.
    fn holds(&self, queue: &VecDeque<Entry>, name: &str, i: usize) -> bool {
        if self.permits.contains_key(name) {
            return i < self.admits(name);
        }
        match queue.get(i).and_then(|e| e.access) {
            Some(Access::Read) => queue.iter().take(i).all(|e| e.access == Some(Access::Read)),
            _ => i == 0,
        }
    }

    /// How many entries at the front of `name`'s queue hold.
    fn admits(&self, name: &str) -> usize {
        self.permits
            .get(name)
            .map_or(1, |&n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn remove_entry(&mut self, name: &str, token: u64) -> bool {
        let Some(queue) = self.queues.get_mut(name) else {
            return false;
        };
        let Some(i) = queue.iter().position(|e| e.token == token) else {
            return false;
        };
        if let Some(removed) = queue.remove(i) {
            removed.wake.notify_one();
        }
        // Only one entry is woken, no herd: the first waiter when a holder left (it holds now),
        // else the successor of the waiter that left.
        let admits = self
            .permits
            .get(name)
            .map_or(1, |&n| usize::try_from(n).unwrap_or(usize::MAX));
        let woken = if i < admits { admits - 1 } else { i };
        if let Some(next) = queue.get(woken) {
            next.wake.notify_one();
        }
        // A reader-writer queue: a writer that left may let a whole run of readers in.
        for entry in queue.iter().take_while(|e| e.access == Some(Access::Read)) {
            entry.wake.notify_one();
        }
        if queue.is_empty() {
            self.queues.remove(name);
            // A semaphore no one holds or waits for takes its count anew.
            self.permits.remove(name);
        }
        self.changes.bump();
        true
    }

    fn expire(&mut self, session: u64) {
        if self.sessions.remove(&session).is_none() {
            return;
        }
        let doomed: Vec<(String, u64)> = self
            .queues
            .iter()
            .flat_map(|(name, q)| {
                q.iter()
                    .filter(|e| e.session == session)
                    .map(|e| (name.clone(), e.token))
            })
            .collect();
        for (name, token) in doomed {
            self.remove_entry(&name, token);
        }
    }
}

/// Expires session `id` when its TTL runs out without a keepalive.
async fn reap(store: std::sync::Weak<StoreInner>, id: u64) {
    // Each pass sleeps until the session's current expiry; a keepalive moves it later. Ends when
    // the session ends or the store is dropped.
    loop {
        let expires = {
            let Some(inner) = store.upgrade() else { return };
            let state = inner.state.lock().unwrap_or_else(PoisonError::into_inner);
            match state.sessions.get(&id) {
                Some(&at) => at,
                None => return,
            }
        };
        tokio::time::sleep_until(expires).await;
        let Some(inner) = store.upgrade() else { return };
        let mut state = inner.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state
            .sessions
            .get(&id)
            .is_some_and(|&at| at <= Instant::now())
        {
            tracing::debug!(session = id, "memory store: session expired");
            state.expire(id);
            return;
        }
    }
}
