//! The durable fence in PostgreSQL.

use fencelock::{Error, FencingToken, Result, StoreFailure};
use std::future::Future;
use std::task::Poll;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Statement, Transaction};

const BACKEND: &str = "postgres fence";
const ADMIT_SUFFIX: &str = "_admit";
/// The function a statement's admission ([`PgFence::condition`]) calls when the fence row
/// does not hold its token: it refuses or asks for an admission first, and never waits.
const CHECK_SUFFIX: &str = "_check";
// `PgFence::new` leaves room in 63 bytes for the admission function's suffix.
const _: () = assert!(CHECK_SUFFIX.len() == ADMIT_SUFFIX.len());
/// The SQLSTATE the admission function raises for a stale token; the highest admitted token
/// is the error's DETAIL.
const STALE_SQLSTATE: &str = "FLSTL";
/// The SQLSTATE of a statement's admission for a token that is not admitted yet (nothing
/// changed: admit it, then run the statement again).
const ADMIT_FIRST_SQLSTATE: &str = "FLADM";

mod statement;
mod store;
pub use store::PgFenceStore;

/// A fence table in PostgreSQL: one row per lock holding the highest token admitted.
///
/// [`admit`](PgFence::admit) runs inside the caller's transaction: one statement that locks
/// the lock's fence row until that transaction ends (shared for the token already admitted, so
/// one holder's concurrent writes run side by side; exclusively when it raises the mark to a
/// newer token), or refuses the token with [`Error::StaleToken`]. The caller's own statements
/// then run in the same transaction, so the check and the write commit together or not at all:
/// a newer holder's admission waits for this transaction, and a stale one that comes after it
/// is refused. Refused: drop (roll back) the transaction. Under `REPEATABLE READ` or
/// `SERIALIZABLE`, a raise by another transaction since this one's snapshot makes `admit` fail
/// with a serialization failure ([`Error::is_retryable`]): retry the transaction. The role that
/// admits needs `SELECT` and `UPDATE` on the table (the shared lock is a row lock) and
/// `EXECUTE` on its function.
///
/// One exception to running side by side: an admission of the new token sent while its raise
/// is still open waits for the raise, and then (PostgreSQL locks the raised row before it
/// re-checks it) for the same-token transactions that got in after the raise committed. Do not
/// make one of those wait for it in your code: PostgreSQL cannot see that as a deadlock.
///
/// A write that is one statement can carry the admission in its own `WHERE` instead, in
/// autocommit ([`condition`](PgFence::condition), [`execute`](PgFence::execute)): nothing
/// besides it for a token the fence holds; a new token is admitted first in a statement of its
/// own. The role then needs `EXECUTE` on `<table>_check` too.
///
/// After upgrading this crate, run [`create_table`](PgFence::create_table) again: it replaces
/// the functions with this version's.
///
/// ```no_run
/// # async fn f(client: &mut tokio_postgres::Client, token: fencelock::FencingToken)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// use fencelock_fence::postgres::PgFence;
///
/// let fence = PgFence::new("fencelock_fence")?;
/// fence.create_table(&*client).await?; // once; idempotent
/// let tx = client.transaction().await?;
/// fence.admit(&tx, "payouts", token).await?; // Err(StaleToken): tx is dropped, rolled back
/// tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PgFence {
    table: String,
}

impl PgFence {
    /// A fence kept in `table` (`name` or `schema.name`: letters, digits, `_`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `table` is not such a name.
    pub fn new(table: &str) -> Result<Self> {
        let valid = |part: &str| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && part.len() <= 63
        };
        let parts: Vec<&str> = table.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| valid(p)) {
            return Err(Error::config(
                "table",
                format!("{table:?} is not `name` or `schema.name` of letters, digits and `_`"),
            ));
        }
        if parts
            .last()
            .is_some_and(|name| name.len() + ADMIT_SUFFIX.len() > 63)
        {
            return Err(Error::config(
                "table",
                format!("{table:?}: the name must leave room for `{ADMIT_SUFFIX}` in 63 bytes"),
            ));
        }
        Ok(PgFence {
            table: table.to_owned(),
        })
    }

    /// The admission function created next to the table.
    fn admit_function(&self) -> String {
        format!("{}{ADMIT_SUFFIX}", self.table)
    }

    /// The check a statement's admission calls when the row does not hold its token.
    fn check_function(&self) -> String {
        format!("{}{CHECK_SUFFIX}", self.table)
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the fence table, and the admission functions next to it (`<table>_admit`, and
    /// `<table>_check` for [`condition`](PgFence::condition)), if they do not exist.
    ///
    /// # Errors
    /// [`Error::Backend`] when PostgreSQL refuses or cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: the statement is idempotent.
    pub async fn create_table(&self, client: &impl GenericClient) -> Result<()> {
        // The function makes admission one round trip that writes only when it raises the
        // mark. The held token, the common case, takes one lookup (the admission's statement
        // does it before calling the function, `admit_sql`; the function does it again for a
        // token raised to meanwhile): the SELECT locks the row FOR SHARE only if it holds this
        // very token, so writes with the held token share the row and run side by side.
        // Otherwise the UPDATE locks the row only when the token is newer (a row it does not
        // match is not locked), and a newer token's UPDATE waits for all the sharers. Taking
        // FOR SHARE first and upgrading would deadlock two writers raising to the same new
        // token; the first SELECT never leads to that: a row it found with this token but saw
        // updated when it locked it now holds a higher token, which the loop refuses without
        // writing. A row that appeared (another first admission's INSERT) between the UPDATE
        // and the SELECT holds a lower token the UPDATE never saw: raising it now would upgrade
        // our share lock (the deadlock above), so the transaction is failed as a serialization
        // failure, which the caller retries. Refusing with an error, not a value, aborts the
        // caller's transaction on the server, which is what makes `admit_then`'s pipelined
        // write safe: PostgreSQL runs nothing after it but a rollback. The check function, for
        // a statement's own admission (`condition`), only reads: a statement whose admission
        // waited would go on with its snapshot from before the wait (see `statement.rs`).
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {t} (lock text PRIMARY KEY, token bigint NOT NULL, \
             admitted_at timestamptz NOT NULL DEFAULT now()); \
             CREATE OR REPLACE FUNCTION {f}(p_lock text, p_token bigint) RETURNS bigint \
             LANGUAGE plpgsql AS $fencelock$ \
             DECLARE held bigint; \
             BEGIN \
               SELECT token INTO held FROM {t} WHERE lock = p_lock AND token = p_token \
                 FOR SHARE; \
               IF FOUND THEN RETURN held; END IF; \
               FOR attempt IN 1..3 LOOP \
                 UPDATE {t} SET token = p_token, admitted_at = now() \
                   WHERE lock = p_lock AND token < p_token; \
                 SELECT token INTO held FROM {t} WHERE lock = p_lock FOR SHARE; \
                 IF FOUND AND held > p_token THEN \
                   RAISE EXCEPTION USING ERRCODE = '{stale}', DETAIL = held::text, \
                     MESSAGE = format('stale fencing token %s for %s: %s was admitted', \
                                      p_token, p_lock, held); \
                 END IF; \
                 IF FOUND AND held = p_token THEN RETURN held; END IF; \
                 IF FOUND THEN \
                   RAISE EXCEPTION USING ERRCODE = '40001', \
                     MESSAGE = format('the fence row of %s appeared with token %s while %s \
                                       was being admitted; retry', p_lock, held, p_token); \
                 END IF; \
                 INSERT INTO {t} (lock, token) VALUES (p_lock, p_token) \
                   ON CONFLICT (lock) DO NOTHING; \
               END LOOP; \
               RAISE EXCEPTION 'the fence row of % keeps disappearing', p_lock; \
             END $fencelock$; \
             CREATE OR REPLACE FUNCTION {c}(p_lock text, p_token bigint) RETURNS bigint \
             LANGUAGE plpgsql AS $fencelock$ \
             DECLARE held bigint; \
             BEGIN \
               SELECT token INTO held FROM {t} WHERE lock = p_lock; \
               IF FOUND AND held > p_token THEN \
                 RAISE EXCEPTION USING ERRCODE = '{stale}', DETAIL = held::text, \
                   MESSAGE = format('stale fencing token %s for %s: %s was admitted', \
                                    p_token, p_lock, held); \
               END IF; \
               RAISE EXCEPTION USING ERRCODE = '{first}', \
                 MESSAGE = format('fencing token %s for %s is not admitted yet', p_token, p_lock); \
             END $fencelock$",
            t = self.table,
            f = self.admit_function(),
            c = self.check_function(),
            stale = STALE_SQLSTATE,
            first = ADMIT_FIRST_SQLSTATE,
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| pg_error("create the fence table", e))
    }

    /// Admits `token` for `lock` in the caller's transaction `tx`: raises the mark to it, or
    /// refuses it when a higher token was admitted. The fence row stays locked until `tx` ends.
    ///
    /// The statement is sent unprepared (parsed and planned on every call). On a connection
    /// that writes often, [`prepare`](PgFence::prepare) it once instead.
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a higher token was admitted (or the lock store was restored
    /// and issues lower tokens: see [`reset`](PgFence::reset)); [`Error::Backend`] when
    /// PostgreSQL fails ([`Error::is_retryable`] for serialization failures and lost
    /// connections). After an error, roll `tx` back.
    ///
    /// # Cancel safety
    /// Cancel safe as long as `tx` is then rolled back (dropping it does).
    pub async fn admit(
        &self,
        tx: &impl GenericClient,
        lock: &str,
        token: FencingToken,
    ) -> Result<()> {
        let value = to_sql(token)?;
        // Typed parameters: one round trip, no prepare.
        let row = tx
            .query_typed_one(
                &self.admit_sql(),
                &[(&lock, Type::TEXT), (&value, Type::INT8)],
            )
            .await;
        admitted(lock, token, row)
    }

    /// Admits `token` for `lock` and runs `write` in the same transaction `tx`, sending both
    /// at once: the write's statements go to PostgreSQL right behind the admission instead of
    /// a round trip later. A refused admission aborts `tx` on the server before any of the
    /// write's statements run, so they fail and nothing the write did can commit.
    ///
    /// `write` must run its statements on `tx` (the same connection); a statement on another
    /// connection is not ordered behind the admission and is not fenced.
    ///
    /// Returns the write's own result once admitted; commit `tx` after an `Ok(Ok(_))`.
    ///
    /// ```no_run
    /// # async fn f(client: &mut tokio_postgres::Client, token: fencelock::FencingToken)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use fencelock_fence::postgres::PgFence;
    ///
    /// let fence = PgFence::new("fencelock_fence")?;
    /// let debit = client.prepare("UPDATE accounts SET balance = balance - 10 WHERE id = 1").await?;
    /// let tx = client.transaction().await?;
    /// let updated = fence.admit_then(&tx, "payouts", token, tx.execute(&debit, &[])).await??;
    /// assert_eq!(updated, 1);
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The outer error as for [`admit`](PgFence::admit) ([`Error::StaleToken`] when refused):
    /// roll `tx` back. The inner one is the write's.
    ///
    /// # Cancel safety
    /// Cancel safe as long as `tx` is then rolled back (dropping it does).
    pub async fn admit_then<T, E, W>(
        &self,
        tx: &Transaction<'_>,
        lock: &str,
        token: FencingToken,
        write: W,
    ) -> Result<std::result::Result<T, E>>
    where
        W: Future<Output = std::result::Result<T, E>>,
    {
        pipelined(self.admit(tx, lock, token), write).await
    }

    /// Prepares the admission on `client`'s connection, for [`PgPreparedFence::admit`] and
    /// [`PgPreparedFence::admit_then`] to run without parsing and planning it on every call:
    /// do it once per connection, as a statement cache does.
    ///
    /// # Errors
    /// [`Error::Backend`] when PostgreSQL fails (the fence table and its admission function do
    /// not exist before [`create_table`](PgFence::create_table)).
    ///
    /// # Cancel safety
    /// Cancel safe: a statement prepared and dropped unused is closed.
    pub async fn prepare(&self, client: &impl GenericClient) -> Result<PgPreparedFence> {
        let statement = client
            .prepare_typed(&self.admit_sql(), &[Type::TEXT, Type::INT8])
            .await
            .map_err(|e| pg_error("prepare the admission", e))?;
        Ok(PgPreparedFence { statement })
    }

    fn admit_sql(&self) -> String {
        // The row lock taken (FOR SHARE, or the raise's) makes the comparison against the
        // latest committed token, and holds it until the transaction ends. The held token, the
        // common case, is the subquery alone: it locks the row only when it holds this very
        // token, and COALESCE calls the function only when it found nothing, so that path
        // skips PL/pgSQL. A miss locked nothing, or, under READ COMMITTED after waiting for a
        // raise, a row that now holds a higher token (re-read, it no longer matches), which the
        // function then refuses without writing: either way the function starts from where it
        // would have on its own, whose first SELECT does the same. The statement reads the
        // table itself, so the caller's role needs SELECT and UPDATE on it (FOR SHARE), as the
        // function (SECURITY INVOKER) always did. (Measured against the function alone in the
        // README's fence tables.)
        format!(
            "SELECT coalesce((SELECT token FROM {t} WHERE lock = $1 AND token = $2 FOR SHARE), \
             {f}($1, $2))",
            t = self.table,
            f = self.admit_function()
        )
    }

    /// The highest token admitted for `lock`.
    ///
    /// # Errors
    /// [`Error::Backend`] when PostgreSQL fails.
    ///
    /// # Cancel safety
    /// Cancel safe: a read.
    pub async fn highest(
        &self,
        client: &impl GenericClient,
        lock: &str,
    ) -> Result<Option<FencingToken>> {
        let sql = format!("SELECT token FROM {} WHERE lock = $1", self.table);
        let row = client
            .query_opt(&sql, &[&lock])
            .await
            .map_err(|e| pg_error("read the fence", e))?;
        row.map(|r| from_sql(r.get::<_, i64>(0))).transpose()
    }

    /// Forgets `lock`'s mark, so that its next token is admitted whatever it is: the operator's
    /// recovery after the lock store was restored from a snapshot or replaced. Run it only once
    /// no holder from before can still write.
    ///
    /// # Errors
    /// [`Error::Backend`] when PostgreSQL fails.
    ///
    /// # Cancel safety
    /// Cancel safe: one statement.
    pub async fn reset(&self, client: &impl GenericClient, lock: &str) -> Result<()> {
        let sql = format!("DELETE FROM {} WHERE lock = $1", self.table);
        client
            .execute(&sql, &[&lock])
            .await
            .map(drop)
            .map_err(|e| pg_error("reset the fence", e))
    }
}

/// A [`PgFence`]'s admission prepared on one connection ([`PgFence::prepare`]): the same
/// admission as [`PgFence::admit`], without parsing and planning it on every call.
///
/// Use it only on transactions of the connection it was prepared on; on another, PostgreSQL
/// answers that the statement does not exist ([`Error::Backend`]), and nothing is admitted.
///
/// ```no_run
/// # async fn f(client: &mut tokio_postgres::Client, token: fencelock::FencingToken)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// use fencelock_fence::postgres::PgFence;
///
/// let fence = PgFence::new("fencelock_fence")?.prepare(&*client).await?; // once per connection
/// let debit = client.prepare("UPDATE accounts SET balance = balance - 10 WHERE id = 1").await?;
/// let tx = client.transaction().await?;
/// let updated = fence.admit_then(&tx, "payouts", token, tx.execute(&debit, &[])).await??;
/// assert_eq!(updated, 1);
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PgPreparedFence {
    statement: Statement,
}

impl PgPreparedFence {
    /// As [`PgFence::admit`], with the prepared statement.
    ///
    /// # Errors
    /// As [`PgFence::admit`]; [`Error::Backend`] also when `tx` is not on the connection this
    /// was prepared on.
    ///
    /// # Cancel safety
    /// Cancel safe as long as `tx` is then rolled back (dropping it does).
    pub async fn admit(
        &self,
        tx: &impl GenericClient,
        lock: &str,
        token: FencingToken,
    ) -> Result<()> {
        let value = to_sql(token)?;
        let row = tx.query_one(&self.statement, &[&lock, &value]).await;
        admitted(lock, token, row)
    }

    /// As [`PgFence::admit_then`], with the prepared statement.
    ///
    /// # Errors
    /// As [`PgFence::admit_then`]; [`Error::Backend`] also when `tx` is not on the connection
    /// this was prepared on.
    ///
    /// # Cancel safety
    /// Cancel safe as long as `tx` is then rolled back (dropping it does).
    pub async fn admit_then<T, E, W>(
        &self,
        tx: &Transaction<'_>,
        lock: &str,
        token: FencingToken,
        write: W,
    ) -> Result<std::result::Result<T, E>>
    where
        W: Future<Output = std::result::Result<T, E>>,
    {
        pipelined(self.admit(tx, lock, token), write).await
    }
}

/// The admission's answer: its row, or the error the function raised.
fn admitted(
    lock: &str,
    token: FencingToken,
    row: std::result::Result<tokio_postgres::Row, tokio_postgres::Error>,
) -> Result<()> {
    let row = row.map_err(|e| admit_error(lock, token, e, "admit a fencing token"))?;
    // The function raises for a stale token; the comparison here is a second check, and
    // fails closed on anything but this token (the row holds it, locked, when admitted).
    let highest = from_sql(row.get::<_, i64>(0))?;
    fencelock::telemetry::record_admission("postgres", highest == token);
    if highest > token {
        return Err(Error::StaleToken {
            lock: lock.to_owned(),
            presented: token,
            highest,
        });
    }
    if highest < token {
        return Err(Error::protocol(
            BACKEND,
            format!("admitting {token} for `{lock}`: the fence answered {highest}"),
        ));
    }
    Ok(())
}

/// Runs `write` behind `admit` on one connection, both sent at once.
async fn pipelined<T, E, W>(
    admit: impl Future<Output = Result<()>>,
    write: W,
) -> Result<std::result::Result<T, E>>
where
    W: Future<Output = std::result::Result<T, E>>,
{
    // A transaction, not any client: in autocommit, a refused admission would not stop the
    // write. The admission's first poll sends it, before the write is polled at all, so every
    // message of the write queues behind it on the connection.
    let mut admit = std::pin::pin!(admit);
    let first = std::future::poll_fn(|cx| Poll::Ready(admit.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(admitted) => {
            admitted?;
            Ok(write.await)
        }
        Poll::Pending => {
            let (admitted, written) = tokio::join!(admit, write);
            admitted.map(|()| written)
        }
    }
}

/// The column pattern, for data that carries its own token: runs `UPDATE <table> SET <set>,
/// <token_column> = $1 WHERE <where> AND <token_column> <= $1` with `$1` the token and the
/// caller's parameters from `$2` on. Returns the number of rows updated; 0 means a newer holder
/// wrote these rows (or none matched `where`), so stop.
///
/// `table`, `set`, `token_column` and `filter` are SQL text from the caller's code, never from
/// user input.
///
/// # Errors
/// [`Error::Backend`] when PostgreSQL fails.
///
/// # Cancel safety
/// Cancel safe: one statement, applied entirely or not at all.
pub async fn update_fenced(
    client: &impl GenericClient,
    token: FencingToken,
    statement: FencedUpdate<'_>,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<u64> {
    let value = to_sql(token)?;
    let FencedUpdate {
        table,
        set,
        token_column,
        filter,
    } = statement;
    let sql = format!(
        "UPDATE {table} SET {set}, {token_column} = $1 WHERE ({filter}) AND {token_column} <= $1"
    );
    let mut all: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&value];
    all.extend_from_slice(params);
    client
        .execute(&sql, &all)
        .await
        .map_err(|e| pg_error("fenced update", e))
}

/// The parts of an [`update_fenced`] statement.
#[derive(Clone, Copy, Debug)]
pub struct FencedUpdate<'a> {
    /// The table.
    pub table: &'a str,
    /// The assignments, e.g. `state = $2`.
    pub set: &'a str,
    /// The column holding the token of the last write.
    pub token_column: &'a str,
    /// Which rows, e.g. `id = $3`.
    pub filter: &'a str,
}

fn to_sql(token: FencingToken) -> Result<i64> {
    i64::try_from(token.get())
        .map_err(|_| Error::config("token", format!("{token} does not fit PostgreSQL's bigint")))
}

fn from_sql(value: i64) -> Result<FencingToken> {
    u64::try_from(value).map(FencingToken::new).map_err(|_| {
        Error::protocol(
            BACKEND,
            format!("negative token {value} in the fence table"),
        )
    })
}

/// The stale-token refusal the admission raised (counted as a refused admission), or `what`
/// failing.
fn admit_error(lock: &str, presented: FencingToken, e: tokio_postgres::Error, what: &str) -> Error {
    let highest = e
        .as_db_error()
        .filter(|db| db.code().code() == STALE_SQLSTATE)
        .and_then(|db| db.detail())
        .and_then(|detail| detail.parse::<u64>().ok());
    match highest {
        Some(highest) => {
            fencelock::telemetry::record_admission("postgres", false);
            Error::StaleToken {
                lock: lock.to_owned(),
                presented,
                highest: FencingToken::new(highest),
            }
        }
        None => pg_error(what, e),
    }
}

fn pg_error(what: &str, e: tokio_postgres::Error) -> Error {
    let retryable = e.is_closed()
        || e.code().is_some_and(|c| {
            *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        })
        || e.code().is_none();
    let refused = e.code().is_some_and(|c| {
        *c == SqlState::INSUFFICIENT_PRIVILEGE || *c == SqlState::INVALID_PASSWORD
    });
    let kind = if refused {
        StoreFailure::Unauthorized
    } else if retryable {
        StoreFailure::Unavailable
    } else {
        StoreFailure::Protocol
    };
    Error::store(BACKEND, kind, what.to_owned(), Some(Box::new(e)))
}
