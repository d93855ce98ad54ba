//! Reading and following an election's leader, as Go's `Election.Leader`/`Observe` do: the
//! leader is the key under the election's prefix with the lowest create revision.

use std::time::Duration;

use etcd_client::{Client, GetOptions, SortOrder, SortTarget, WatchOptions};
use fencelock::raw::Watched;
use fencelock::{FencingToken, Leader, LockName, Result};

use crate::keys::Keys;
use crate::{call, etcd_error};

/// An etcd cluster as an election's [`Watched`].
pub(crate) struct Elections<'a> {
    pub(crate) client: &'a Client,
    pub(crate) keys: &'a Keys,
    pub(crate) limit: Duration,
    /// The longest a wait lasts before the loop reads again anyway (a watch that went quiet
    /// on a half-open connection must not hide a change for long).
    pub(crate) idle: Duration,
}

/// Where a read stood: its revision, and the leader's key (a wait then watches that key only,
/// as Go's `Observe` does; with no leader, the whole prefix).
pub(crate) struct Seen {
    revision: i64,
    leader_key: Option<Vec<u8>>,
}

impl Seen {
    /// A wait on the whole prefix, from the revision after `revision`.
    pub(crate) fn whole_prefix(revision: i64) -> Self {
        Seen {
            revision,
            leader_key: None,
        }
    }
}

impl Watched for Elections<'_> {
    type Item = Option<Leader>;
    type Seen = Seen;

    async fn read(&self, name: &LockName) -> Result<(Option<Leader>, Seen)> {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut kv = self.client.kv_client();
        let prefix = self.keys.lock_prefix(name);
        let resp = call("read the election's leader", self.limit, async move {
            kv.get(prefix, Some(first)).await
        })
        .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let leader = resp.kvs().first();
        Ok((
            leader.map(|kv| {
                Leader::new(
                    kv.value().to_vec(),
                    FencingToken::new(kv.create_revision().unsigned_abs()),
                )
            }),
            Seen {
                revision,
                leader_key: leader.map(|kv| kv.key().to_vec()),
            },
        ))
    }

    async fn changed(&self, name: &LockName, seen: Seen) -> Result<()> {
        let from = WatchOptions::new().with_start_revision(seen.revision + 1);
        let (key, options) = match seen.leader_key {
            Some(key) => (key, from),
            None => (self.keys.lock_prefix(name).into_bytes(), from.with_prefix()),
        };
        let mut watches = self.client.watch_client();
        let wait = async move {
            let mut stream = watches.watch(key, Some(options)).await?;
            // Ends on the first event, or when the watch is cancelled (compacted past our
            // revision: the next read starts afresh).
            while let Some(resp) = stream.message().await? {
                if resp.canceled() || !resp.events().is_empty() {
                    return Ok(());
                }
            }
            Err(etcd_client::Error::WatchError("watch stream ended".into()))
        };
        match tokio::time::timeout(self.idle, wait).await {
            Ok(Ok(())) | Err(_) => Ok(()),
            Ok(Err(e)) => Err(etcd_error("watch the entries", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use etcd_client::CompactionOptions;
    use fencelock_testsupport::{unique, EtcdCluster};

    use super::*;

    /// A wait that starts from a revision etcd has compacted away must end (the watch is
    /// cancelled) so that the loop reads again: etcd#7815, where `Observe` went silent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_from_a_compacted_revision_ends() {
        let cluster = EtcdCluster::start(1);
        let mut client = Client::connect(cluster.endpoints(), None).await.unwrap();
        let keys = Keys::new(&format!("{}/", unique("obs")));
        let name = LockName::new("leader").unwrap();
        let elections = Elections {
            client: &client.clone(),
            keys: &keys,
            limit: Duration::from_secs(5),
            idle: Duration::from_secs(60),
        };
        let (_, seen) = elections.read(&name).await.unwrap();
        for i in 0..3 {
            client
                .put(format!("{}-other-{i}", unique("x")), "", None)
                .await
                .unwrap();
        }
        let now = client
            .get("x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        client
            .compact(now, Some(CompactionOptions::new().with_physical()))
            .await
            .unwrap();
        let waited =
            tokio::time::timeout(Duration::from_secs(10), elections.changed(&name, seen)).await;
        assert!(
            matches!(waited, Ok(Ok(()))),
            "the wait must end when its revision is compacted: {waited:?}"
        );
    }
}
