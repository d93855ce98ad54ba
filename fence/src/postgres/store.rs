//! [`FenceStore`] in PostgreSQL: admissions held as row locks, so they hold across replicas.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use fencelock::{Error, FencingToken, Result};
use tokio_postgres::types::Type;

use super::{from_sql, pg_error, to_sql, PgFence};
use crate::store::{Admission, FenceStore};

/// How often an admission re-reads when a `reset` removed the row between its steps.
const ATTEMPTS: usize = 5;

/// A [`FenceStore`] in a PostgreSQL [`PgFence`] table: durable, and shared by every replica
/// that uses the database.
///
/// An [`Admission`] holds a transaction with the fence row locked `FOR SHARE`: admissions of
/// the same token share it, and a newer token's raise of the mark (an `UPDATE`) waits until
/// every older admission, in any replica, has ended. Each held admission therefore holds one
/// pooled connection: size the pool for the requests you let run at once. Dropping the
/// admission rolls its transaction back (inside a Tokio runtime; elsewhere the connection is
/// closed, which ends the transaction on the server).
///
/// For a write into the *same* database, [`PgFence::admit`] in your own transaction is
/// simpler and commits the check with the write; this store is for checks that guard
/// something else (an HTTP handler, a file, another service).
#[derive(Clone)]
pub struct PgFenceStore {
    pool: Pool,
    fence: PgFence,
}

impl std::fmt::Debug for PgFenceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The pool's configuration holds the password; show only what is safe.
        f.debug_struct("PgFenceStore")
            .field("table", &self.fence.table())
            .field("pool_size", &self.pool.status().max_size)
            .finish_non_exhaustive()
    }
}

impl PgFenceStore {
    /// A store on `pool`'s database, in `fence`'s table (created if missing).
    ///
    /// # Errors
    /// [`Error::Backend`] when no connection can be had or the table cannot be created.
    ///
    /// # Cancel safety
    /// Cancel safe: creating the table is idempotent.
    pub async fn new(pool: Pool, fence: PgFence) -> Result<Self> {
        let client = get(&pool).await?;
        fence.create_table(&**client).await?;
        Ok(PgFenceStore { pool, fence })
    }

    /// A store with a pool of at most `max_connections` connections to `url`
    /// (`postgres://user@host:port/db` or `host=... user=...`; no TLS), so at most that many
    /// admissions can be held at once.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad URL; otherwise as [`new`](PgFenceStore::new).
    ///
    /// # Cancel safety
    /// As [`new`](PgFenceStore::new).
    pub async fn connect(url: &str, table: &str, max_connections: usize) -> Result<Self> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| Error::config("url", format!("not a PostgreSQL URL: {e}")))?;
        let manager = Manager::from_config(
            config,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(max_connections.max(1))
            .wait_timeout(Some(Duration::from_secs(30)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::config("url", format!("cannot build the pool: {e}")))?;
        Self::new(pool, PgFence::new(table)?).await
    }

    /// The fence table.
    pub fn fence(&self) -> &PgFence {
        &self.fence
    }

    /// The lock's mark, its row locked `FOR SHARE` (until the transaction ends).
    async fn read_shared(&self, client: &Object, lock: &str) -> Result<Option<FencingToken>> {
        let sql = format!(
            "SELECT token FROM {} WHERE lock = $1 FOR SHARE",
            self.fence.table()
        );
        // Typed parameters: one round trip, no prepare.
        let row = client
            .query_typed_opt(&sql, &[(&lock, Type::TEXT)])
            .await
            .map_err(|e| pg_error("read the fence", e))?;
        row.map(|r| from_sql(r.get::<_, i64>(0))).transpose()
    }

    async fn raise(&self, client: &Object, lock: &str, token: FencingToken) -> Result<()> {
        // Autocommit: the raise waits for the FOR SHARE locks of older admissions, then commits
        // at once, so newer-token admissions do not queue behind each other's requests.
        self.fence.admit(&***client, lock, token).await
    }
}

fn stale(lock: &str, presented: FencingToken, highest: FencingToken) -> Error {
    Error::StaleToken {
        lock: lock.to_owned(),
        presented,
        highest,
    }
}

async fn get(pool: &Pool) -> Result<Object> {
    pool.get().await.map_err(|e| {
        Error::store(
            super::BACKEND,
            fencelock::StoreFailure::Unavailable,
            "get a connection".to_owned(),
            Some(Box::new(e)),
        )
    })
}

#[async_trait]
impl FenceStore for PgFenceStore {
    async fn admit(&self, lock: &str, token: FencingToken) -> Result<Admission> {
        to_sql(token)?;
        let client = get(&self.pool).await?;
        // The connection is closed, not returned, unless the held transaction ends cleanly.
        let mut hold = Hold {
            client: Some(client),
            open: false,
        };
        for _ in 0..ATTEMPTS {
            // BEGIN and the locking read sent together, one round trip: the held token, the
            // common case, is admitted by it. (Were BEGIN refused, the read would run alone
            // and its lock end with it; the error returns, and the connection is rolled back
            // or closed.)
            hold.open = true;
            let client = hold.client()?;
            let (begun, held) = tokio::join!(
                client.batch_execute("BEGIN"),
                self.read_shared(client, lock)
            );
            begun.map_err(|e| pg_error("begin the admission", e))?;
            match held? {
                Some(held) if held == token => return Ok(Admission::new(lock, token, hold)),
                // Rolled back when `hold` drops.
                Some(held) if held > token => return Err(stale(lock, token, held)),
                // A newer token (or the row's first): raise outside the transaction, then
                // read again. The share lock just taken is released first, so the raise never
                // waits for this request.
                _ => {
                    client
                        .batch_execute("ROLLBACK")
                        .await
                        .map_err(|e| pg_error("roll back the admission", e))?;
                    hold.open = false;
                    self.raise(hold.client()?, lock, token).await?;
                }
            }
        }
        Err(Error::protocol(
            super::BACKEND,
            format!("the fence row of {lock:?} kept disappearing (reset in a loop?)"),
        ))
    }

    async fn highest(&self, lock: &str) -> Result<Option<FencingToken>> {
        let client = get(&self.pool).await?;
        self.fence.highest(&**client, lock).await
    }

    async fn reset(&self, lock: &str) -> Result<()> {
        let client = get(&self.pool).await?;
        self.fence.reset(&**client, lock).await
    }
}

/// A pooled connection, maybe inside the admission's transaction.
struct Hold {
    client: Option<Object>,
    open: bool,
}

impl Hold {
    fn client(&self) -> Result<&Object> {
        self.client
            .as_ref()
            .ok_or_else(|| Error::protocol(super::BACKEND, "the admission's connection is gone"))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if !self.open {
            return; // back to the pool, outside any transaction
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        // Not known to be outside the transaction: never reuse it.
                        drop(Object::take(client));
                    }
                });
            }
            // No runtime to roll back on: closing the connection ends the transaction.
            Err(_) => drop(Object::take(client)),
        }
    }
}
