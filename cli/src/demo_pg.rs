//! The demo's resource in a real PostgreSQL (`fencelock demo --resource postgres://...`): the
//! balance in a table, and with fencing, each write behind `PgFence::admit` in its transaction.

use fencelock::FencingToken;
use fencelock_fence::postgres::PgFence;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

/// The balance of one demo run, in a row of `fencelock_demo_balance`.
pub struct PgResource {
    client: Mutex<Client>,
    fence: PgFence,
    lock: String,
}

/// Why a write did not land.
pub enum Refused {
    /// The fence refused the token (the demo's point).
    Stale(fencelock::Error),
    /// PostgreSQL failed.
    Failed(String),
}

impl PgResource {
    /// Connects, creates the tables if missing, and sets this run's balance to `initial`.
    pub async fn connect(url: &str, lock: &str, initial: &str) -> Result<Self, String> {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .map_err(|e| format!("cannot connect to the resource: {e}"))?;
        tokio::spawn(connection);
        let fence = PgFence::new("fencelock_demo_fence").map_err(|e| e.to_string())?;
        fence
            .create_table(&client)
            .await
            .map_err(|e| e.to_string())?;
        let setup = "CREATE TABLE IF NOT EXISTS fencelock_demo_balance \
                     (lock text PRIMARY KEY, balance text NOT NULL)";
        client
            .batch_execute(setup)
            .await
            .map_err(|e| e.to_string())?;
        client
            .execute(
                "INSERT INTO fencelock_demo_balance VALUES ($1, $2) \
                 ON CONFLICT (lock) DO UPDATE SET balance = EXCLUDED.balance",
                &[&lock, &initial],
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(PgResource {
            client: Mutex::new(client),
            fence,
            lock: lock.to_owned(),
        })
    }

    /// Writes `value`, behind the fence when `fenced`: the check and the write commit together.
    pub async fn write(
        &self,
        token: FencingToken,
        value: &str,
        fenced: bool,
    ) -> Result<(), Refused> {
        let failed = |e: tokio_postgres::Error| Refused::Failed(e.to_string());
        let mut client = self.client.lock().await;
        let tx = client.transaction().await.map_err(failed)?;
        if fenced {
            if let Err(e) = self.fence.admit(&tx, &self.lock, token).await {
                return Err(match e {
                    fencelock::Error::StaleToken { .. } => Refused::Stale(e),
                    other => Refused::Failed(other.to_string()),
                });
            }
        }
        tx.execute(
            "UPDATE fencelock_demo_balance SET balance = $2 WHERE lock = $1",
            &[&self.lock, &value],
        )
        .await
        .map_err(failed)?;
        tx.commit().await.map_err(failed)
    }

    /// The balance as committed.
    pub async fn balance(&self) -> Result<String, String> {
        let client = self.client.lock().await;
        let row = client
            .query_one(
                "SELECT balance FROM fencelock_demo_balance WHERE lock = $1",
                &[&self.lock],
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(row.get(0))
    }

    /// Removes this run's rows.
    pub async fn clean_up(&self) {
        let client = self.client.lock().await;
        let _ = client
            .execute(
                "DELETE FROM fencelock_demo_balance WHERE lock = $1",
                &[&self.lock],
            )
            .await;
        let _ = self.fence.reset(&*client, &self.lock).await;
    }
}
