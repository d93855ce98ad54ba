//! Reading and following a lock's queue: every key under the lock's prefix, in create order,
//! the holder first (as Go's `Mutex` grants them).

use std::time::Duration;

use etcd_client::{GetOptions, SortOrder, SortTarget};
use fencelock::raw::Watched;
use fencelock::{FencingToken, LockName, LockStatus, Owner, QueueEntry, Result};

use crate::election::{Elections, Seen};
use crate::{call, mutex};

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
                QueueEntry::new(token, Owner::decode(kv.value()), age)
            })
            .collect();
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((LockStatus::from_queue(name.clone(), queue), revision))
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
