//! Reading and following a lock's queue: the contenders' nodes in sequence order, the holder
//! first (as Curator's `InterProcessMutex` grants them).

use std::sync::Arc;
use std::time::Duration;

use fencelock::raw::Watched;
use fencelock::{Error, FencingToken, LockName, LockStatus, Owner, QueueEntry, Result};
use zookeeper_client::MultiReadResult;

use crate::election::{list_watching, sync, timed, Elections, Seen};
use crate::paths::{access_of, check_name, sort_children};
use crate::{zk_error, KIND};

/// A ZooKeeper ensemble as a lock's [`Watched`] queue; it waits as an election does.
pub(crate) struct Queues<'a>(pub(crate) Elections<'a>);

impl Queues<'_> {
    /// The queue now; with `watch`, also a watch on the lock's children set by the same read
    /// (after a sync, so that a follower never reports a queue older than one already seen).
    pub(crate) async fn read_queue(
        &self,
        name: &LockName,
        watch: bool,
    ) -> Result<(LockStatus, Option<Seen>)> {
        check_name(name)?;
        let backend = self.0.backend;
        let session = backend.session().await?;
        let client = &session.client;
        let limit = backend.config().request_timeout;
        let dir = backend.paths().lock_dir(name);
        if watch {
            sync(client, &dir, limit).await?;
        }
        // Two reads; a holder that leaves between them costs another pass, a few at most.
        for _ in 0..5 {
            let (children, watcher) = if watch {
                match list_watching(client, &dir, limit).await? {
                    Some((children, watcher)) => (children, Some(watcher)),
                    None => continue,
                }
            } else {
                let mut children = match timed("list", limit, client.list_children(&dir)).await? {
                    Ok(children) => children,
                    Err(zookeeper_client::Error::NoNode) => Vec::new(),
                    Err(e) => return Err(zk_error("list contenders", e)),
                };
                sort_children(&mut children);
                (children, None)
            };
            let seen = watcher.map(|w| Seen::new(vec![w], Arc::clone(&session)));
            if children.is_empty() {
                return Ok((LockStatus::new(name.clone(), None, 0, None), seen));
            }
            // Every contender's node in one multi-read: its data (who) and stat (token, age).
            let mut reader = client.new_multi_reader();
            for child in &children {
                reader
                    .add_get_data(&format!("{dir}/{child}"))
                    .map_err(|e| zk_error("read the contenders' nodes", e))?;
            }
            let read = timed("read the contenders' nodes", limit, reader.commit())
                .await?
                .map_err(|e| zk_error("read the contenders' nodes", e))?;
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let mut queue = Vec::with_capacity(read.len());
            for (i, result) in read.into_iter().enumerate() {
                match result {
                    MultiReadResult::Data { data, stat } => {
                        let ms = now_ms.saturating_sub(stat.ctime).unsigned_abs();
                        let token = FencingToken::new(stat.czxid.unsigned_abs());
                        let age = Some(Duration::from_millis(ms));
                        let access = children.get(i).and_then(|c| access_of(c));
                        let entry = QueueEntry::new(token, Owner::decode(&data), age);
                        queue.push(entry.with_access(access));
                    }
                    // A waiter that left between the reads is no longer queued.
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    } if i > 0 => {}
                    // The holder left between the reads: read again.
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    } => {
                        queue.clear();
                        break;
                    }
                    MultiReadResult::Error { err } => {
                        return Err(zk_error("read the contenders' nodes", err))
                    }
                    other => {
                        return Err(Error::protocol(
                            KIND,
                            format!("read the contenders' nodes: unexpected reply {other:?}"),
                        ))
                    }
                }
            }
            if queue.is_empty() {
                continue;
            }
            return Ok((LockStatus::from_queue(name.clone(), queue), seen));
        }
        Err(Error::unavailable(
            KIND,
            format!("status of `{name}`: the holder kept changing between two reads; try again"),
            None,
        ))
    }
}

impl Queues<'_> {
    /// The semaphore `name` now: its leases in sequence order (the first `permits` hold; one
    /// more is the gate's holder, waiting) and the gate's queue; the count from the data of
    /// the leases' parent.
    pub(crate) async fn permits(&self, name: &LockName) -> Result<LockStatus> {
        let backend = self.0.backend;
        let session = backend.session().await?;
        let client = &session.client;
        let limit = backend.config().request_timeout;
        let (leases_dir, gate_dir) = (
            backend.paths().leases_dir(name),
            backend.paths().gate_dir(name),
        );
        let mut reader = client.new_multi_reader();
        for add in [
            reader.add_get_data(&leases_dir),
            reader.add_get_children(&leases_dir),
            reader.add_get_children(&gate_dir),
        ] {
            add.map_err(|e| zk_error("read the semaphore", e))?;
        }
        let read = timed("read the semaphore", limit, reader.commit())
            .await?
            .map_err(|e| zk_error("read the semaphore", e))?;
        let mut read = read.into_iter();
        let count = match read.next() {
            Some(MultiReadResult::Data { data, .. }) => crate::semaphore::stored_permits(&data),
            _ => None,
        };
        let mut listing = |what| match read.next() {
            Some(MultiReadResult::Children { mut children }) => {
                sort_children(&mut children);
                Ok(children)
            }
            Some(MultiReadResult::Error {
                err: zookeeper_client::Error::NoNode,
            }) => Ok(Vec::new()),
            other => Err(Error::protocol(
                KIND,
                format!("{what}: unexpected reply {other:?}"),
            )),
        };
        let (leases, gated) = (listing("list the leases")?, listing("list the gate")?);
        let mut reader = client.new_multi_reader();
        for path in leases
            .iter()
            .map(|c| format!("{leases_dir}/{c}"))
            .chain(gated.iter().map(|c| format!("{gate_dir}/{c}")))
        {
            reader
                .add_get_data(&path)
                .map_err(|e| zk_error("read the semaphore's nodes", e))?;
        }
        let nodes = if leases.is_empty() && gated.is_empty() {
            Vec::new()
        } else {
            timed("read the semaphore's nodes", limit, reader.commit())
                .await?
                .map_err(|e| zk_error("read the semaphore's nodes", e))?
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // A node that left between the reads is no longer there: skip it.
        let entries: Vec<Option<QueueEntry>> = nodes
            .into_iter()
            .map(|result| match result {
                MultiReadResult::Data { data, stat } => {
                    let ms = now_ms.saturating_sub(stat.ctime).unsigned_abs();
                    let token = FencingToken::new(stat.czxid.unsigned_abs());
                    Some(QueueEntry::new(
                        token,
                        Owner::decode(&data),
                        Some(Duration::from_millis(ms)),
                    ))
                }
                _ => None,
            })
            .collect();
        let tag = |child: &str| child.split('-').take(5).collect::<Vec<_>>().join("-");
        let leased: Vec<String> = leases.iter().map(|c| tag(c)).collect();
        let (lease_entries, gate_entries) = entries.split_at(leases.len().min(entries.len()));
        let lease_entries: Vec<QueueEntry> = lease_entries.iter().flatten().cloned().collect();
        let holding = count.map_or(lease_entries.len(), |n| {
            lease_entries
                .len()
                .min(usize::try_from(n).unwrap_or(usize::MAX))
        });
        // A gate node whose uuid a lease has is that lease's contender, counted there.
        let waiters = lease_entries[holding..]
            .iter()
            .cloned()
            .chain(
                gated
                    .iter()
                    .zip(gate_entries)
                    .filter(|(child, _)| !leased.contains(&tag(child)))
                    .filter_map(|(_, entry)| entry.clone()),
            )
            .collect();
        let holders = lease_entries[..holding].to_vec();
        let count = count.filter(|_| !lease_entries.is_empty());
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
        match self.read_queue(name, true).await? {
            (status, Some(seen)) => Ok((status, seen)),
            (_, None) => Err(Error::protocol(KIND, "read the queue: no watch was set")),
        }
    }

    async fn changed(&self, name: &LockName, seen: Seen) -> Result<()> {
        self.0.changed(name, seen).await
    }
}
