//! Reading and following a lock's queue: every key under the lock's prefix, in create order,
//! the holder first (as Go's `Mutex` grants them).

use std::time::Duration;

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use fencelock::raw::Watched;
use fencelock::{FencingToken, LockName, LockStatus, Owner, QueueEntry, Result};

use crate::election::{Elections, Seen};
use crate::{call, mutex, semaphore};

/// An etcd cluster as a lock's [`Watched`] queue; it waits as an election does, on the whole
/// prefix.
pub(crate) struct Queues<'a>(pub(crate) Elections<'a>);

impl Queues<'_> {
    /// The queue now and the revision it was read at.
    pub(crate) async fn read_at(&self, name: &LockName) -> Result<(LockStatus, i64)> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut kv = self.0.client.kv_client();
        let prefix = self.0.keys.lock_prefix(name);
        let prefix_bytes = prefix.clone().into_bytes();
        let resp = call("read the lock's queue", self.0.limit, async move {
            kv.get(prefix, Some(all)).await
        })
        .await?;
        let now = mutex::unix_millis();
        let queue = resp
            .kvs()
            .iter()
            .map(|kv| {
                let age = mutex::queued_at(kv.value()).map(|since| {
                    let ms = now.saturating_sub(since);
                    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
                });
                let token = FencingToken::new(kv.create_revision().unsigned_abs());
                let access = kv
                    .key()
                    .strip_prefix(prefix_bytes.as_slice())
                    .and_then(crate::keys::Keys::access_of);
                QueueEntry::new(token, Owner::decode(kv.value()), age).with_access(access)
            })
            .collect();
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((LockStatus::from_queue(name.clone(), queue), revision))
    }
}

impl Queues<'_> {
    /// The semaphore `name` now: permit keys (the first `permits` hold; one more is the gate's
    /// holder, waiting) and the gate's queue, in one read.
    pub(crate) async fn permits_at(&self, name: &LockName) -> Result<LockStatus> {
        let all = || {
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
        };
        let (permits, gate) = (
            self.0.keys.permits_prefix(name),
            self.0.keys.gate_queue(name, 0).prefix,
        );
        let txn = Txn::new().and_then([
            TxnOp::get(permits.as_str(), Some(all())),
            TxnOp::get(gate.as_str(), Some(all())),
        ]);
        let resp =
            crate::mutex::txn_call("read the semaphore", self.0.client, txn, self.0.limit).await?;
        let ranges: Vec<Vec<(String, i64, Vec<u8>)>> = resp
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(range) => range
                    .kvs()
                    .iter()
                    .map(|kv| {
                        let key = String::from_utf8_lossy(kv.key()).into_owned();
                        (key, kv.create_revision(), kv.value().to_vec())
                    })
                    .collect(),
                _ => Vec::new(),
            })
            .collect();
        let (leases, gated) = match ranges.as_slice() {
            [leases, gated] => (leases, gated),
            _ => {
                return Err(fencelock::Error::protocol(
                    crate::KIND,
                    "read the semaphore: the reply has no Ranges",
                ))
            }
        };
        let now = mutex::unix_millis();
        let entry = |created: i64, value: &[u8], since: Option<u128>| {
            let age = since.map(|since| {
                let ms = now.saturating_sub(since);
                Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
            });
            QueueEntry::new(
                FencingToken::new(created.unsigned_abs()),
                Owner::decode(value),
                age,
            )
        };
        let count = leases
            .iter()
            .find_map(|(_, _, v)| semaphore::stored_permits(v));
        let holding = count.map_or(leases.len(), |n| {
            leases.len().min(usize::try_from(n).unwrap_or(usize::MAX))
        });
        // A gate key whose create revision a permit key names is already counted there.
        let admitted: Vec<i64> = leases
            .iter()
            .filter_map(|(key, _, _)| {
                let suffix = key.rsplit('-').next()?;
                i64::from_str_radix(suffix, 16).ok()
            })
            .collect();
        let holders = leases[..holding]
            .iter()
            .map(|(_, created, v)| entry(*created, v, semaphore::queued_at(v)))
            .collect();
        let waiters = leases[holding..]
            .iter()
            .map(|(_, created, v)| entry(*created, v, semaphore::queued_at(v)))
            .chain(
                gated
                    .iter()
                    .filter(|(_, created, _)| !admitted.contains(created))
                    .map(|(_, created, v)| entry(*created, v, mutex::queued_at(v))),
            )
            .collect();
        Ok(LockStatus::from_permits(
            name.clone(),
            count,
            holders,
            waiters,
        ))
    }
}

impl Watched for Queues<'_> {
    type Item = LockStatus;
    type Seen = Seen;

    async fn read(&self, name: &LockName) -> Result<(LockStatus, Seen)> {
        let (status, revision) = self.read_at(name).await?;
        Ok((status, Seen::whole_prefix(revision)))
    }

    async fn changed(&self, name: &LockName, seen: Seen) -> Result<()> {
        self.0.changed(name, seen).await
    }
}
