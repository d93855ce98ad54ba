//! The etcd backend of [fencelock]: a lease shared by the session, keys compatible with Go's
//! `concurrency.Mutex`, and the lock key's create revision as the fencing token.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::LockBackendExt;
//! use fencelock_etcd::{EtcdBackend, EtcdConfig};
//!
//! let config = EtcdConfig::new(["http://127.0.0.1:2379"]).ttl(Duration::from_secs(10));
//! let locks = EtcdBackend::connect(config).await?;
//! let guard = locks.lock("nightly-report").await?; // key fencelock/nightly-report/<lease hex>
//! guard.run(async { /* work; pass guard.token() to what you write */ }).await?;
//! let _ = guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Interoperability
//! The lock `N` under prefix `P` (default `fencelock/`) uses the keys `P N / <lease hex>`, the
//! same compare-and-put and the same ordering as Go's `concurrency.NewMutex(session, "P N")`, so Go services,
//! `etcdctl lock P N` and fencelock exclude each other on one lock. The token is the revision of
//! the grant: what `etcdctl lock` exports to its child as `ETCD_LOCK_REV`.
//!
//! The election `N` uses the same keys with the candidate's value, as Go's
//! `concurrency.NewElection(session, "P N")` writes them, so `etcdctl elect P N VALUE` and
//! fencelock candidates lead in turn, and `etcdctl elect -l P N` and
//! [`observe`](fencelock::LockBackend::observe) see each other's leaders. A leader's term is its
//! key's create revision (what every observer sees); a proclaim is a put of the leader's own key
//! compared on that revision, as Go's `Proclaim`.
//!
//! # The protocol
//! This is the one description of it; the requests are built in `src/mutex.rs` (whose comments
//! say why each step is as it is), and `tests/round_trips.rs` asserts the counts below against
//! the server's own request metrics.
//! - **acquire**: one Txn `If create_revision(P N / lease) == 0 Then Put(P N / lease, now,
//!   lease), Range(P N /, newest two by create revision), Get(checkpoint) Else Get(P N /
//!   lease)`. The token is the Txn's revision (our key's create revision). Ours is the newest
//!   key: we hold the lock if no other key comes back, and otherwise the other is the one
//!   created just before ours. With two keys or more ahead, that one is a waiter, and the wait
//!   starts by watching it (Go's Range asks for the first created key, and a waiter then looks
//!   for its predecessor with a second request; etcd reads the whole prefix for either Range).
//!   With one, it is the holder, who may have left already: the wait starts with a look. The Else branch finds a key of this session from an earlier acquisition (a release
//!   that failed): it is deleted, owner-checked, and the Txn sent again, because its old
//!   revision would repeat a token;
//! - **wait**: a look is one Txn that confirms our key (`create_revision == token`, Go's
//!   post-Jepsen check), finds the key created just before ours (`max_create_revision = token -
//!   1`, newest first) and reads the checkpoint. With a predecessor (found by a look, or named
//!   by the enqueue), one Watch stream on that key only (from "now", registered twice) and one
//!   Get of it, which catches a delete before the watch; then the next look. The look that
//!   finds no older key is the grant: a handoff costs the new holder one request after the
//!   delete event, and a release wakes one waiter (no herd);
//! - **cancelled, timed-out or failed acquire**: our key is withdrawn after the enqueue Txn has
//!   finished, by a Txn comparing its create revision (only this attempt's key; the lease when
//!   the enqueue's reply never came), retried with backoff while the session lives, holding
//!   this session's turn on the name until etcd answers;
//! - **release**: one Txn `If create_revision(key) == token Then Delete(key)`, retried within the
//!   request timeout, then in the background while the session lives;
//! - **fenced state**: at `P .state/ N / <key>`, outside every lock's range, by Txns with the
//!   same compare;
//! - **held keys**: one Watch stream per session watches each granted key (delete events
//!   only) from its create revision + 1, so a key deleted behind the holder's back (an
//!   operator's `etcdctl del`, a revoked lease) fires the guard's `lost` within about a round
//!   trip. The watch is sent by a task of the session after the grant, not on the request path,
//!   and outlives the release: the session's key for a name is always the same, so the name's
//!   next grant is watched by it without a message (a delete counts against a grant only if it
//!   is newer than the grant's create revision). Up to 1,024 released keys keep their watch;
//!   beyond that the longest idle is cancelled. A permit's and an RW entry's key is unique to
//!   its attempt: its delete ends its watch with one cancel.
//!
//! | operation | requests |
//! |---|---|
//! | first acquire of a session | 1 LeaseGrant + 1 Txn |
//! | uncontended acquire | 1 Txn |
//! | contended acquire | 1 Txn; 1 Txn more with one key ahead; per predecessor 1 Watch stream (2 registrations) + 1 Range + 1 Txn (the last one is the grant) |
//! | release, fenced put/get/delete | 1 Txn |
//! | held-key watch (whole session) | 1 Watch stream; 1 message per key's first grant (a permit's or RW entry's: 1 per grant, 1 per release) |
//! | renewal (whole session) | 1 LeaseKeepAlive message per TTL/3 |
//!
//! # Semaphores
//! etcd has no standard semaphore; this one is built in the spirit of Go's Mutex, from two of
//! its pieces, and this is its one description (requests in `src/semaphore.rs`). Semaphore `N`
//! with `k` permits under prefix `P`:
//! - **gate**: a Go Mutex at `P N /locks/` (keys `P N /locks/ <lease hex>`), taken exactly as a
//!   lock is, above. Its holder is the one contender being admitted; the others wait in the
//!   gate's queue, each on its predecessor, in arrival order.
//! - **permit keys** `P N /leases/ <lease hex> - <gate key's create revision, hex>`, unique to
//!   the attempt, with the session's lease and the value `permits=<k> <millis>-<nonce> <owner>`.
//!   The gate's holder sends one Txn `If create_revision(gate key) == its own, create_revision(
//!   permit key) == 0 Then Put(permit key), Range(P N /leases/)`: at most `k` keys, ours
//!   included, admits us (Curator's rule); a key whose value carries another count refuses us
//!   with `PermitsMismatch` (both our keys withdrawn before the error returns). Otherwise the
//!   gate's holder watches `P N /leases/` for deletes (from "now"), counts again once the watch
//!   exists, and again after each delete, each count a Txn that holds only while the gate key
//!   and the permit key are still ours. Admitted, it deletes its gate key before the grant returns
//!   (as Curator does), so a try right after a grant finds the gate free; the next contender in
//!   the gate goes on. Only the gate's holder watches the permits, so a release wakes one
//!   process: a handoff costs the release's delete, one count, one gate delete and the next
//!   gate holder's grant, whatever the number of permits or contenders.
//! - **token**: the revision of the count that admitted us: admissions are one at a time, so
//!   tokens grow with each grant, and each permit's is its own.
//! - **held**: the permit key, with a lock's release, fenced state and held-key watch. The count
//!   is stored in every permit key and so lives exactly as long as some permit does: once no one
//!   holds or waits, the next contender sets it anew.
//! - A semaphore and a lock of the same name overlap (`P N /` covers both): give them different
//!   names.
//!
//! | operation | requests |
//! |---|---|
//! | uncontended permit | the gate's acquire (1 Txn) + 1 Txn (put and count) + 1 Txn (gate delete) |
//! | waiting for a permit (gate holder) | per release: 1 Watch + 1 Txn count |
//! | release | 1 Txn |
//!
//! # Reader-writer locks
//! Reader-writer lock `N` under prefix `P` is the lock's protocol above on two kinds of keys,
//! laid out as etcd's `recipes.RWMutex` lays them out (not tested against it):
//! - **keys**: a reader's `P N /read/ <lease hex> - <nonce hex>`, a writer's
//!   `P N /write/ <lease hex> - <nonce hex>`, unique to the attempt, so several guards of one
//!   session coexist (no turn per name is taken), and a withdrawal can only touch its own key.
//! - **acquire**: the lock's enqueue Txn, whose Range is `P N /write/` for a reader and all of
//!   `P N /` for a writer: a writer holds if its key is the first created, a reader if no
//!   writer key exists (ours is the newest key, so any writer there is ahead of us).
//! - **wait**: the lock's passes, each finding the newest key older than ours in that same
//!   range (a reader: the nearest writer ahead; a writer: whoever is just ahead) and watching
//!   only it. A writer's release wakes the readers just behind it, who are all granted; readers
//!   behind a later writer watch that writer and sleep on.
//! - **token**: the revision at which the grant was seen, as for a lock: a writer's exceeds every
//!   earlier holder's (it is seen after their deletes); a reader's exceeds every earlier writer's
//!   and is below every later writer's. Readers granted together may share one.
//!
//! | operation | requests |
//! |---|---|
//! | uncontended read or write | 1 Txn (no LeaseGrant after the session's first) |
//! | waiting | 1 Txn with one blocker ahead; per blocker that leaves: 1 Watch stream (2 registrations) + 1 Range + 1 Txn |
//! | release, fenced put/get/delete | 1 Txn |
//!
//! # Loss
//! The session's lease is renewed every TTL/3 by the backend itself (etcd-client has no timer
//! and no reconnect). Each renewal moves the local deadline to *send time + TTL - margin*; when
//! it passes without a renewal, or the server says the lease is gone, every guard of the session
//! fires `lost`, and the next acquire grants a new lease.
#![forbid(unsafe_code)]

mod backend;
mod config;
mod connect;
mod election;
mod held;
mod keys;
mod mutex;
mod queue;
mod semaphore;
mod session;
mod watch;

use std::future::Future;
use std::time::Duration;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, EtcdTls, MIN_TTL};

pub(crate) const KIND: &str = "etcd";

/// Runs one etcd request with a time limit, turning failures into [`fencelock::Error::Backend`]
/// of the right [`StoreFailure`](fencelock::StoreFailure).
pub(crate) async fn call<T>(
    what: &str,
    limit: Duration,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> fencelock::Result<T> {
    match tokio::time::timeout(limit, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(etcd_error(what, e)),
        Err(_) => Err(fencelock::Error::timed_out(KIND, what, limit)),
    }
}

/// True when etcd refused a request because our session's lease no longer exists (revoked
/// behind our back, or expired before the keepalive noticed).
pub(crate) fn lease_gone(e: &fencelock::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.to_string().contains("lease not found"))
}

/// Classifies an etcd-client error by what the caller can do about it.
pub(crate) fn etcd_error(what: &str, e: etcd_client::Error) -> fencelock::Error {
    use fencelock::StoreFailure::{Protocol, Unauthorized, Unavailable};
    use tonic::Code;
    let kind = match &e {
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            Code::Unauthenticated | Code::PermissionDenied => Unauthorized,
            // etcd answers a wrong password, or none where auth is on, with InvalidArgument.
            Code::InvalidArgument
                if ["authentication failed", "user name is empty"]
                    .iter()
                    .any(|m| status.message().contains(m)) =>
            {
                Unauthorized
            }
            Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented => Protocol,
            _ => Unavailable,
        },
        etcd_client::Error::IoError(_)
        | etcd_client::Error::TransportError(_)
        | etcd_client::Error::WatchError(_)
        | etcd_client::Error::LeaseKeepAliveError(_) => Unavailable,
        _ => Protocol,
    };
    fencelock::Error::store(KIND, kind, what, Some(Box::new(e)))
}
