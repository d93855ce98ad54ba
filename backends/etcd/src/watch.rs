//! The keys a session holds, watched on one stream, so that a guard's `lost` fires within about
//! one round trip when its key disappears behind its back (an operator's `etcdctl del`, a
//! revoked lease), instead of at its next fenced operation or never.
//!
//! One Watch stream per session, opened when the first lock is granted. A key's first grant adds
//! one watch on it from `create_revision + 1` (so a delete that came before the watch is still
//! reported), with a watch id of our own (etcd 3.4+), for delete events only. The watch outlives
//! the release: a session's key for a name is always the same (`P N / <lease hex>`), so the
//! name's next grant is watched by it with no message at all, and the watch covers the key from
//! the first moment of that grant. (A grant released before the watcher task sees it sends
//! nothing, as before, and ends its key's idle watch: a name held that briefly would gain
//! nothing from it but its release's delete event.) A delete is the holder's loss only if it is
//! newer than the grant's create revision (the previous grant's delete can arrive after the
//! next grant). Idle watches are kept up to [`IDLE_WATCHES`], then the longest idle is
//! cancelled; a permit's or an RW entry's key is unique to its attempt, so its watch ends with
//! its delete. A broken stream
//! is reopened with backoff and every held key watched again from its create revision (idle
//! ones are dropped); a watch that etcd cancels because that revision was compacted is
//! replaced by one read of the key, and watched from the read's revision on, also after a
//! later reopen.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use etcd_client::{Client, EventType, WatchFilterType, WatchOptions, WatchStream};
use fencelock::raw::{Backoff, SharedTurn};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Released keys whose watches a session keeps for their next grant: beyond it, the one idle
/// longest is cancelled. A server-side watcher on one key costs etcd a few hundred bytes and no
/// work until that key changes.
pub(crate) const IDLE_WATCHES: usize = 1024;

/// A held key to watch.
pub(crate) struct Held {
    pub(crate) key: Arc<str>,
    pub(crate) grant: KeyGrant,
}

/// A grant as its key's watch keeps it (the key is the map's).
pub(crate) struct KeyGrant {
    pub(crate) created: i64,
    /// The guard's `lost`.
    pub(crate) trigger: CancellationToken,
    /// The session's turn on the lock's name (shared with the guard), ended here once the key
    /// is known gone.
    pub(crate) turn: Option<SharedTurn>,
    /// Whether the session will put this key again (a lock's or a candidate's key), so its
    /// watch is worth keeping after the delete; a permit's or an RW entry's key is put once.
    pub(crate) reused: bool,
}

impl KeyGrant {
    /// The key is gone: the guard's `lost` fires (unless it was released) and the session's
    /// next task on the name may put the key again.
    fn gone(&self, key: &str) {
        if !self.trigger.is_cancelled() {
            tracing::warn!(%key, "etcd: our lock key was deleted behind our back; lock lost");
        }
        self.trigger.cancel();
        if let Some(turn) = &self.turn {
            turn.end();
        }
    }
}

/// One watch on the stream.
struct Watched {
    id: i64,
    state: State,
}

enum State {
    /// The grant the watch covers now, and where a reopened stream starts the watch: the
    /// grant's create revision + 1, or later once a read after a compaction confirmed the key.
    /// (No delete newer than the grant can have been seen while it is held: it would have
    /// ended it.)
    Held { grant: KeyGrant, from: i64 },
    /// No grant: its place among the idle ones (`Watches::idle`), and the newest delete of the
    /// key the watch has reported (a grant older than that is gone).
    Idle { place: u64, deleted: i64 },
}

/// Every watch of the stream, by key (a key has one watch at most: a reused key's next grant
/// takes its watch), and the idle ones by age. A held lock costs one entry, as before watches
/// were kept (`fencelock-bench scale`'s heap per held lock).
#[derive(Default)]
struct Watches {
    by_key: HashMap<Arc<str>, Watched>,
    /// Idle watches, oldest first (a sequence number to the key).
    idle: BTreeMap<u64, Arc<str>>,
    next_idle: u64,
    next_id: i64,
    /// Watches we cancelled, until etcd's answer: etcd 3.4 answers each cancel with a
    /// cancelled response, which needs no lookup in `by_key`.
    cancelling: HashSet<i64>,
}

impl Watches {
    /// A new watch for `key`'s grant, from revision `from`; its id.
    fn insert(&mut self, key: Arc<str>, grant: KeyGrant, from: i64) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        // Callers insert only a key without a watch (its next grant found none, or it was
        // removed first).
        let state = State::Held { grant, from };
        self.by_key.insert(key, Watched { id, state });
        id
    }

    /// Hands `held` to its key's watch, if the stream has one; gives it back otherwise.
    fn attach(&mut self, held: Held) -> Result<(), Held> {
        let Some(watched) = self.by_key.get_mut(&held.key) else {
            return Err(held);
        };
        let Held { key, grant } = held;
        let from = grant.created + 1;
        let idle = State::Idle {
            place: 0,
            deleted: 0,
        };
        match std::mem::replace(&mut watched.state, idle) {
            State::Idle { place, deleted } => {
                self.idle.remove(&place);
                if deleted > grant.created {
                    // Deleted since the grant, reported before the grant reached this task.
                    grant.gone(&key);
                    self.park(&key, deleted);
                    return Ok(());
                }
            }
            // The key was put again, so the earlier grant's key was deleted: released (its
            // delete event is still on its way) or behind its back.
            State::Held { grant: earlier, .. } => earlier.gone(&key),
        }
        watched.state = State::Held { grant, from };
        Ok(())
    }

    /// `key`'s watch `id` reported its delete at `revision` (`i64::MAX` when etcd did not say:
    /// the grant held now is gone): its grant, if older, is gone. The watch's id when it is
    /// over (a permit's): cancel it.
    fn deleted(&mut self, key: &str, id: i64, revision: i64) -> Option<i64> {
        let watched = self.by_key.get_mut(key).filter(|w| w.id == id)?;
        let grant = match &mut watched.state {
            State::Idle { deleted, .. } => {
                if revision < i64::MAX {
                    *deleted = (*deleted).max(revision);
                }
                return None;
            }
            State::Held { grant, .. } => grant,
        };
        if revision <= grant.created {
            return None; // the delete of a grant before the one held
        }
        grant.gone(key);
        // Unknown, it is at least past the grant, and every later grant is later than it.
        let deleted = if revision == i64::MAX {
            grant.created + 1
        } else {
            revision
        };
        if grant.reused {
            self.park(key, deleted);
            None
        } else {
            self.by_key.remove(key);
            Some(id)
        }
    }

    /// Removes `key`'s watch if it is idle; its id, to cancel.
    fn unkeep(&mut self, key: &str) -> Option<i64> {
        let Some(Watched {
            state: State::Idle { place, .. },
            ..
        }) = self.by_key.get(key)
        else {
            return None;
        };
        self.idle.remove(place);
        self.by_key.remove(key).map(|watched| watched.id)
    }

    /// `key`'s grant is over, deleted at `deleted`: its watch waits idle for the key's next
    /// grant.
    fn park(&mut self, key: &str, deleted: i64) {
        let Some((key, _)) = self.by_key.get_key_value(key) else {
            return;
        };
        let key = Arc::clone(key);
        self.next_idle += 1;
        let place = self.next_idle;
        if let Some(watched) = self.by_key.get_mut(&key) {
            watched.state = State::Idle { place, deleted };
        }
        self.idle.insert(place, key);
    }

    /// Removes the watch `id` (a scan: only for a cancel we did not send, a compacted start).
    fn remove(&mut self, id: i64) -> Option<(Arc<str>, Watched)> {
        let key = self
            .by_key
            .iter()
            .find(|(_, w)| w.id == id)
            .map(|(key, _)| Arc::clone(key))?;
        let watched = self.by_key.remove_entry(&key)?;
        if let State::Idle { place, .. } = watched.1.state {
            self.idle.remove(&place);
        }
        Some(watched)
    }

    /// The idle watches beyond [`IDLE_WATCHES`], oldest first, removed: cancel them.
    fn over_bound(&mut self) -> Vec<i64> {
        let mut over = Vec::new();
        while self.idle.len() > IDLE_WATCHES {
            let Some((_, key)) = self.idle.pop_first() else {
                break;
            };
            if let Some(watched) = self.by_key.remove(&key) {
                over.push(watched.id);
            }
        }
        over
    }

    /// What a reopened stream watches: each held key, its watch id, and from where.
    fn to_reopen(&self) -> impl Iterator<Item = (&Arc<str>, i64, i64)> {
        self.by_key
            .iter()
            .filter_map(|(key, watched)| match &watched.state {
                State::Held { from, .. } => Some((key, watched.id, *from)),
                State::Idle { .. } => None,
            })
    }

    /// A broken stream: idle watches are not reopened, and cancels sent on it get no answer.
    fn drop_idle(&mut self) {
        self.cancelling.clear();
        for (_, key) in std::mem::take(&mut self.idle) {
            self.by_key.remove(&key);
        }
    }
}

/// The session's side of the watcher task.
pub(crate) struct HeldKeys {
    tx: mpsc::UnboundedSender<Held>,
}

impl HeldKeys {
    /// Starts the watcher task; it ends when `session_over` fires.
    pub(crate) fn start(
        client: Client,
        session_over: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(client, rx, session_over));
        (HeldKeys { tx }, task)
    }

    /// Watches `held.key` until it is deleted (and then for its next grant); its deletion
    /// fires `held.grant.trigger`.
    pub(crate) fn watch(&self, held: Held) {
        let _ = self.tx.send(held);
    }
}

fn options(id: i64, from: i64) -> WatchOptions {
    WatchOptions::new()
        .with_start_revision(from)
        .with_watch_id(id)
        .with_filters([WatchFilterType::NoPut])
}

async fn run(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Held>,
    session_over: CancellationToken,
) {
    let mut watches = Watches::default();
    let mut backoff = Backoff::new();
    // Each pass opens one stream and serves it until it breaks; the session's end (at most one
    // TTL after etcd stops answering) or the session being dropped ends the loop.
    loop {
        if watches.by_key.is_empty() {
            let first = tokio::select! {
                () = session_over.cancelled() => return,
                first = rx.recv() => match first { Some(first) => first, None => return },
            };
            if first.grant.trigger.is_cancelled() {
                continue;
            }
            let Held { key, grant } = first;
            let from = grant.created + 1;
            watches.insert(key, grant, from);
        }
        let Some(mut stream) = open(&client, &watches).await else {
            tokio::select! {
                () = session_over.cancelled() => return,
                () = backoff.pause() => continue,
            }
        };
        backoff = Backoff::new();
        // One message per pass: a registration, or a response; a broken stream ends it.
        loop {
            tokio::select! {
                () = session_over.cancelled() => return,
                added = rx.recv() => {
                    let Some(added) = added else { return };
                    if added.grant.trigger.is_cancelled() {
                        // Released before it was watched: a name held that briefly gains
                        // nothing from a kept watch but its release's delete event.
                        if let Some(id) = watches.unkeep(&added.key) {
                            watches.cancelling.insert(id);
                            if stream.cancel(id).await.is_err() {
                                break;
                            }
                        }
                        continue;
                    }
                    let Err(added) = watches.attach(added) else {
                        continue;
                    };
                    let Held { key, grant } = added;
                    let from = grant.created + 1;
                    let id = watches.insert(Arc::clone(&key), grant, from);
                    let sent = stream.watch(key.as_bytes(), Some(options(id, from))).await;
                    if sent.is_err() {
                        break;
                    }
                }
                message = stream.message() => match message {
                    Ok(Some(resp)) => {
                        if !answer(&client, &mut stream, &mut watches, &resp).await {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => break,
                },
            }
        }
        tracing::debug!("etcd: the held-keys watch stream broke; reopening");
        watches.drop_idle();
        tokio::select! {
            () = session_over.cancelled() => return,
            () = backoff.pause() => {}
        }
    }
}

/// Opens a stream watching every held key of `watches` (there are no idle ones after a break)
/// from its revision (`None` if etcd cannot be reached).
async fn open(client: &Client, watches: &Watches) -> Option<WatchStream> {
    let mut entries = watches.to_reopen();
    let (key, id, from) = entries.next()?;
    let mut client = client.watch_client();
    let mut stream = client
        .watch(key.as_bytes(), Some(options(id, from)))
        .await
        .ok()?;
    for (key, id, from) in entries {
        stream
            .watch(key.as_bytes(), Some(options(id, from)))
            .await
            .ok()?;
    }
    Some(stream)
}

/// Acts on one watch response; false when the stream must be reopened.
async fn answer(
    client: &Client,
    stream: &mut WatchStream,
    watches: &mut Watches,
    resp: &etcd_client::WatchResponse,
) -> bool {
    let id = resp.watch_id();
    let mut cancel = Vec::new();
    for event in resp.events() {
        if event.event_type() != EventType::Delete {
            continue;
        }
        let Some(kv) = event.kv() else { continue };
        let Ok(key) = std::str::from_utf8(kv.key()) else {
            continue;
        };
        // A delete event's revision is the delete's (the header's is at least that).
        let revision = Some(kv.mod_revision())
            .filter(|r| *r > 0)
            .or_else(|| resp.header().map(etcd_client::ResponseHeader::revision))
            .unwrap_or(i64::MAX);
        cancel.extend(watches.deleted(key, id, revision));
    }
    cancel.extend(watches.over_bound());
    for id in cancel {
        watches.cancelling.insert(id);
        if stream.cancel(id).await.is_err() {
            return false;
        }
    }
    if resp.canceled() {
        if watches.cancelling.remove(&id) {
            return true; // cancelled by us
        }
        let Some((key, watched)) = watches.remove(id) else {
            return true;
        };
        let State::Held { grant, .. } = watched.state else {
            return true; // idle: the next grant of its key is watched anew
        };
        // Our start revision was compacted: read the key once instead of its history.
        let mut kv = client.kv_client();
        match kv.get(key.as_bytes(), None).await {
            Ok(now) => {
                let ours = now
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == grant.created);
                if !ours {
                    grant.gone(&key);
                    return true;
                }
                let from = now.header().map_or(grant.created + 1, |h| h.revision() + 1);
                let id = watches.insert(Arc::clone(&key), grant, from);
                let sent = stream.watch(key.as_bytes(), Some(options(id, from))).await;
                return sent.is_ok();
            }
            Err(_) => {
                // Watched again on reopen, from its create revision; cancelled again, then read.
                let from = grant.created + 1;
                watches.insert(key, grant, from);
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "fencelock/job/1";

    fn held(key: &str, created: i64, reused: bool) -> (Held, CancellationToken) {
        let trigger = CancellationToken::new();
        let grant = KeyGrant {
            created,
            trigger: trigger.clone(),
            turn: None,
            reused,
        };
        let held = Held {
            key: Arc::from(key),
            grant,
        };
        (held, trigger)
    }

    fn insert(watches: &mut Watches, held: Held) -> i64 {
        let from = held.grant.created + 1;
        watches.insert(held.key, held.grant, from)
    }

    #[test]
    fn an_earlier_grants_delete_arriving_late_does_not_end_the_next_grant() {
        let mut watches = Watches::default();
        let (first, first_lost) = held(KEY, 10, true);
        let id = insert(&mut watches, first);
        // Released at 11 and granted again at 12, the grant reaching the task first.
        let (second, second_lost) = held(KEY, 12, true);
        assert!(watches.attach(second).is_ok(), "the key's watch takes it");
        assert!(first_lost.is_cancelled(), "the earlier grant's key is gone");
        assert_eq!(
            watches.deleted(KEY, id, 11),
            None,
            "a kept watch is not cancelled"
        );
        assert!(
            !second_lost.is_cancelled(),
            "11 is the earlier grant's delete"
        );
        assert_eq!(watches.deleted(KEY, id, 13), None);
        assert!(second_lost.is_cancelled(), "13 is this grant's");
        assert_eq!(watches.idle.len(), 1, "idle, kept for the next grant");
    }

    #[test]
    fn a_grant_deleted_before_it_reaches_the_task_is_lost_at_once() {
        let mut watches = Watches::default();
        let (first, _) = held(KEY, 10, true);
        let id = insert(&mut watches, first);
        assert_eq!(watches.deleted(KEY, id, 11), None);
        // Granted at 12 and deleted at 13, both before the grant reaches the task.
        assert_eq!(watches.deleted(KEY, id, 13), None);
        let (second, lost) = held(KEY, 12, true);
        assert!(watches.attach(second).is_ok());
        assert!(lost.is_cancelled());
        let (third, lost) = held(KEY, 14, true);
        assert!(watches.attach(third).is_ok());
        assert!(!lost.is_cancelled(), "14 is newer than every delete seen");
        assert_eq!(
            watches.deleted(KEY, id + 1, 15),
            None,
            "another watch's event"
        );
        assert!(!lost.is_cancelled());
    }

    #[test]
    fn a_reopened_stream_watches_held_keys_from_where_they_were_confirmed() {
        let mut watches = Watches::default();
        let (held_key, _) = held(KEY, 10, true);
        let Held { key, grant } = held_key;
        // As after a compaction's read at revision 49.
        let id = watches.insert(key, grant, 50);
        let (idle, _) = held("fencelock/other/1", 20, true);
        let other = insert(&mut watches, idle);
        assert_eq!(watches.deleted("fencelock/other/1", other, 21), None);
        let reopen: Vec<_> = watches
            .to_reopen()
            .map(|(_, id, from)| (id, from))
            .collect();
        assert_eq!(reopen, vec![(id, 50)], "the idle one is not reopened");
        // The next grant of a key starts from its own create revision.
        assert_eq!(watches.deleted(KEY, id, 60), None);
        let (again, _) = held(KEY, 70, true);
        assert!(watches.attach(again).is_ok());
        let reopen: Vec<_> = watches
            .to_reopen()
            .map(|(_, id, from)| (id, from))
            .collect();
        assert_eq!(reopen, vec![(id, 71)]);
    }

    #[test]
    fn a_grant_released_before_the_task_sees_it_ends_its_keys_idle_watch() {
        let mut watches = Watches::default();
        let (first, _) = held(KEY, 10, true);
        let id = insert(&mut watches, first);
        assert_eq!(watches.unkeep(KEY), None, "held: kept");
        assert_eq!(watches.deleted(KEY, id, 11), None);
        assert_eq!(watches.unkeep(KEY), Some(id), "idle: cancel it");
        assert!(watches.by_key.is_empty() && watches.idle.is_empty());
        let (next, _) = held(KEY, 12, true);
        assert!(
            watches.attach(next).is_err(),
            "the next grant is watched anew"
        );
    }

    #[test]
    fn a_permits_watch_ends_with_its_delete() {
        let mut watches = Watches::default();
        let (permit, lost) = held(KEY, 10, false);
        let id = insert(&mut watches, permit);
        assert_eq!(watches.deleted(KEY, id, 11), Some(id), "cancel it");
        assert!(lost.is_cancelled());
        assert!(watches.by_key.is_empty() && watches.idle.is_empty());
        let (again, _) = held(KEY, 12, false);
        assert!(
            watches.attach(again).is_err(),
            "a permit's key is never watched again"
        );
    }

    #[test]
    fn idle_watches_beyond_the_bound_go_oldest_first() {
        let mut watches = Watches::default();
        let mut ids = Vec::new();
        for i in 0..=IDLE_WATCHES {
            let key = format!("fencelock/n{i}/1");
            let (h, _) = held(&key, 10, true);
            let id = insert(&mut watches, h);
            assert_eq!(watches.deleted(&key, id, 11), None);
            ids.push(id);
        }
        assert_eq!(watches.over_bound(), vec![ids[0]]);
        assert!(watches.over_bound().is_empty());
        let (h, _) = held("fencelock/n0/1", 12, true);
        assert!(watches.attach(h).is_err(), "n0's watch was cancelled");
        let (h, _) = held("fencelock/n1/1", 12, true);
        assert!(watches.attach(h).is_ok(), "n1's is kept");
        assert_eq!(watches.idle.len(), IDLE_WATCHES - 1);
        watches.drop_idle();
        assert_eq!(watches.by_key.len(), 1, "only n1's, held, is left");
    }
}
