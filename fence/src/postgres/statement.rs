//! The admission inside the caller's own statement: one statement, no extra round trip.

use fencelock::{Error, FencingToken, Result};
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row, ToStatement};

use super::{admit_error, to_sql, PgFence};

impl PgFence {
    /// A condition to `AND` into a statement's `WHERE`: it admits the token for the lock, taken
    /// from the statement's parameters `$first` (the lock, `text`) and `$first + 1` (the token,
    /// `bigint`), as [`admit`](PgFence::admit) does, or fails the statement with the stale
    /// token. Run such a statement with [`execute`](PgFence::execute) or
    /// [`query`](PgFence::query), which pass those two parameters after the caller's.
    ///
    /// The check and the write are then one statement: nothing is sent besides it, and in
    /// autocommit it commits (or fails) on its own. PostgreSQL evaluates the condition once per
    /// statement (it is a sub-select that refers to no row), and a row reaches the statement's
    /// `UPDATE`, `DELETE` or result only once it has passed the whole `WHERE`, so only after
    /// the admission: a refused token fails the statement before it changes anything. The
    /// fence row stays locked until the statement's transaction ends, as with `admit`, so
    /// further statements in that transaction are fenced too.
    ///
    /// `AND` it at the top level of the `WHERE` (an `OR` around it would let rows through
    /// without it). An `INSERT` takes it as `INSERT INTO t (...) SELECT ... WHERE <condition>`.
    /// When the rest of the `WHERE` matches no row, PostgreSQL may skip the condition: the
    /// statement changes nothing and is not refused.
    ///
    /// ```no_run
    /// # async fn f(client: &tokio_postgres::Client, token: fencelock::FencingToken)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use fencelock_fence::postgres::PgFence;
    ///
    /// let fence = PgFence::new("fencelock_fence")?;
    /// let debit = format!(
    ///     "UPDATE accounts SET balance = balance - 10 WHERE id = $1 AND {}",
    ///     fence.condition(2)?, // the lock is $2, the token $3
    /// );
    /// let debit = client.prepare(&debit).await?; // or send the text each time
    /// let updated = fence.execute(client, &debit, &[&1i32], "payouts", token).await?;
    /// assert_eq!(updated, 1); // Err(StaleToken) when a newer token was admitted
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `first` is 0 (parameters count from `$1`).
    pub fn condition(&self, first: usize) -> Result<String> {
        if first == 0 {
            return Err(Error::config(
                "first",
                "PostgreSQL's parameters count from $1, not $0",
            ));
        }
        let (lock, token) = (first, first + 1);
        // The outer sub-select makes it one InitPlan, run once; inside it, the held token's
        // path is the plain read that `admit_sql` starts with, and the function runs only on a
        // miss (a raise, a refusal, the row's first admission).
        Ok(format!(
            "(SELECT coalesce((SELECT token FROM {t} WHERE lock = ${lock}::text \
             AND token = ${token}::bigint FOR SHARE), {f}(${lock}::text, ${token}::bigint))) \
             IS NOT NULL",
            t = self.table,
            f = self.admit_function(),
        ))
    }

    /// Runs `statement`, which holds [`condition`](PgFence::condition) for its last two
    /// parameters, with `params` and then `lock` and `token`; returns the number of rows it
    /// changed.
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a higher token was admitted: the statement changed nothing
    /// (inside a transaction, roll it back). [`Error::Backend`] when PostgreSQL fails the
    /// statement otherwise (its own errors included; [`Error::is_retryable`] for
    /// serialization failures and lost connections).
    ///
    /// # Cancel safety
    /// In autocommit, the statement is applied entirely or not at all, with its admission;
    /// inside a transaction, roll it back after a cancel, as after an error.
    pub async fn execute<T>(
        &self,
        client: &impl GenericClient,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
        lock: &str,
        token: FencingToken,
    ) -> Result<u64>
    where
        T: ?Sized + ToStatement + Sync + Send,
    {
        let value = to_sql(token)?;
        let all = with_admission(params, &lock, &value);
        let done = client.execute(statement, &all).await;
        answered(lock, token, done, |n| *n > 0)
    }

    /// As [`execute`](PgFence::execute), for a statement that returns rows (a fenced read, or
    /// `RETURNING`); returns them.
    ///
    /// # Errors
    /// As [`execute`](PgFence::execute).
    ///
    /// # Cancel safety
    /// As [`execute`](PgFence::execute).
    pub async fn query<T>(
        &self,
        client: &impl GenericClient,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
        lock: &str,
        token: FencingToken,
    ) -> Result<Vec<Row>>
    where
        T: ?Sized + ToStatement + Sync + Send,
    {
        let value = to_sql(token)?;
        let all = with_admission(params, &lock, &value);
        let rows = client.query(statement, &all).await;
        answered(lock, token, rows, |rows| !rows.is_empty())
    }
}

fn with_admission<'a>(
    params: &[&'a (dyn ToSql + Sync)],
    lock: &'a &str,
    token: &'a i64,
) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut all = Vec::with_capacity(params.len() + 2);
    all.extend_from_slice(params);
    all.push(lock);
    all.push(token);
    all
}

/// The statement's answer; `ran` tells whether the admission is known to have run (a row
/// passed the condition), for the admissions metric.
fn answered<R>(
    lock: &str,
    token: FencingToken,
    done: std::result::Result<R, tokio_postgres::Error>,
    ran: impl Fn(&R) -> bool,
) -> Result<R> {
    match done {
        Ok(done) => {
            if ran(&done) {
                fencelock::telemetry::record_admission("postgres", true);
            }
            Ok(done)
        }
        Err(e) => {
            let e: Error = admit_error(lock, token, e, "fenced statement");
            if matches!(e, Error::StaleToken { .. }) {
                fencelock::telemetry::record_admission("postgres", false);
            }
            Err(e)
        }
    }
}
