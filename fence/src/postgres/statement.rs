//! The admission inside the caller's own statement, in autocommit: one statement and one
//! round trip for a token the fence row already holds.
//!
//! Why the statement never raises the mark itself: under `READ COMMITTED` a statement reads
//! with a snapshot taken when it starts. A raise waits for the older holder's open
//! transactions, and a statement that raised and went on would read from before their commits
//! (a lost update of the older holder's last write). So the statement's admission only takes
//! the row that already holds its token, which the raise that put the token there committed
//! before the statement's snapshot (the row's version in that snapshot holds it), and that
//! raise came after every older holder's transaction had ended. Any other case fails the
//! statement before it changes anything: a stale token for good, a token not admitted yet
//! until [`PgFence::admit`] (in its own transaction) raises the mark, after which the
//! statement runs again with a new snapshot.

use fencelock::{Error, FencingToken, Result, StoreFailure};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, ToStatement};

use super::{admit_error, to_sql, PgFence, ADMIT_FIRST_SQLSTATE, BACKEND};

/// PostgreSQL takes at most 65,535 parameters.
const MAX_PARAMETER: usize = 65_535;

/// Statements sent before giving up: the first, and one more after each admission. A newer
/// holder's raise is refused at once (by the check or by the admission); the statement asks
/// for an admission again only when the fence row was reset between the two.
const ROUNDS: usize = 3;

impl PgFence {
    /// A condition to `AND` into a statement's `WHERE`, admitting the token for the lock taken
    /// from the statement's parameters `$first` (the lock, `text`) and `$first + 1` (the token,
    /// `bigint`). Run the statement with [`execute`](PgFence::execute) or
    /// [`query`](PgFence::query), which pass those two after the caller's parameters, in
    /// autocommit.
    ///
    /// The check and the write are then one statement: for a token the fence holds, nothing is
    /// sent besides it. PostgreSQL evaluates the condition once per statement (it is a
    /// sub-select that refers to no row), and a row reaches the statement's `UPDATE`, `DELETE`
    /// or result only once it has passed the whole `WHERE`, so a refused token fails the
    /// statement before it changes anything. The fence row stays share-locked until the
    /// statement commits, so a newer holder's raise waits for it.
    ///
    /// `AND` it at the top level of the `WHERE` (an `OR` around it would let rows through
    /// without it); an `INSERT` takes it as `INSERT INTO t (...) SELECT ... WHERE <condition>`.
    /// One condition per statement: `execute` admits the token for the lock it was given. A
    /// statement whose plan never runs its `WHERE` (a condition PostgreSQL finds false when
    /// planning, `LIMIT 0`) skips the admission and changes nothing, except in data-modifying
    /// `WITH` clauses: a write in a `WITH` must carry the condition in its own `WHERE` (then it
    /// is gated like any other). `BEFORE STATEMENT` triggers run before it. The role needs
    /// `EXECUTE` on `<table>_check` (and, for the admission `execute` sends, on `<table>_admit`).
    ///
    /// Inside a transaction of your own, use [`admit`](PgFence::admit) or
    /// [`admit_then`](PgFence::admit_then) instead: run bare, the condition fails a statement
    /// whose token the fence does not hold yet (SQLSTATE `FLADM`), which aborts the
    /// transaction.
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
    /// [`Error::InvalidConfig`] when `first` is 0 or `first + 1` is past PostgreSQL's last
    /// parameter ($65535).
    pub fn condition(&self, first: usize) -> Result<String> {
        if first == 0 || first >= MAX_PARAMETER {
            return Err(Error::config(
                "first",
                format!(
                    "${first} and the next: PostgreSQL's parameters are $1 to ${MAX_PARAMETER}"
                ),
            ));
        }
        let (lock, token) = (first, first + 1);
        // One InitPlan, run once. The held token's path is `admit_sql`'s plain read; on a
        // miss the check function refuses or asks for an admission first, and never waits
        // (see the module's docs).
        Ok(format!(
            "(SELECT coalesce((SELECT token FROM {t} WHERE lock = ${lock}::text \
             AND token = ${token}::bigint FOR SHARE), {c}(${lock}::text, ${token}::bigint))) \
             IS NOT NULL",
            t = self.table,
            c = self.check_function(),
        ))
    }

    /// Runs `statement`, which holds [`condition`](PgFence::condition) for its last two
    /// parameters, in autocommit, with `params` and then `lock` and `token`; returns the number
    /// of rows it changed.
    ///
    /// For a token the fence row holds, that is the statement alone. For a token it does not
    /// hold yet (a new holder's first write), the statement fails without changing anything,
    /// [`admit`](PgFence::admit) raises the mark in a statement of its own (waiting for older
    /// holders' transactions to end), and the statement runs again: two round trips more.
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a higher token was admitted: the statement changed nothing.
    /// [`Error::Backend`] when PostgreSQL fails the statement otherwise, its own errors
    /// included ([`Error::is_retryable`] for serialization failures, lost connections, and a
    /// fence row reset while this token was being admitted); [`Error::InvalidConfig`] for a
    /// token past `bigint`. A lost connection is retryable, but the statement may have
    /// committed before it was lost, as with any statement.
    ///
    /// # Cancel safety
    /// Each statement (the admission's and the caller's) is applied entirely or not at all,
    /// with its own admission; a cancelled call's statement may still commit on the server
    /// (dropping the future does not stop it), and a mark raised without the statement only
    /// refuses older tokens sooner.
    pub async fn execute<T>(
        &self,
        client: &Client,
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
        let all = all.as_slice();
        let send = move || client.execute(statement, all);
        self.rounds(client, lock, token, send, |n| *n > 0).await
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
        client: &Client,
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
        let all = all.as_slice();
        let send = move || client.query(statement, all);
        self.rounds(client, lock, token, send, |rows| !rows.is_empty())
            .await
    }

    /// Sends the statement (`send`), and while it asks for an admission first, admits the token
    /// in a statement of its own and sends it again, up to [`ROUNDS`] times.
    async fn rounds<R, F>(
        &self,
        client: &Client,
        lock: &str,
        token: FencingToken,
        send: impl Fn() -> F,
        ran: impl Fn(&R) -> bool,
    ) -> Result<R>
    where
        F: std::future::Future<Output = std::result::Result<R, tokio_postgres::Error>>,
    {
        for round in 1..=ROUNDS {
            match answered(lock, token, send().await, &ran)? {
                Some(done) => return Ok(done),
                None if round < ROUNDS => self.admit(client, lock, token).await?,
                None => {}
            }
        }
        Err(kept_moving(lock, token))
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

/// The statement's answer: `Some` when it ran, `None` when its token must be admitted first;
/// `ran` tells whether the admission is known to have passed (a row passed the condition),
/// for the admissions metric.
fn answered<R>(
    lock: &str,
    token: FencingToken,
    done: std::result::Result<R, tokio_postgres::Error>,
    ran: impl Fn(&R) -> bool,
) -> Result<Option<R>> {
    let e = match done {
        Ok(done) => {
            if ran(&done) {
                fencelock::telemetry::record_admission("postgres", true);
            }
            return Ok(Some(done));
        }
        Err(e) => e,
    };
    if e.code().map(tokio_postgres::error::SqlState::code) == Some(ADMIT_FIRST_SQLSTATE) {
        return Ok(None);
    }
    if e.code().is_none() && !e.is_closed() {
        // Not from the server (a parameter count or type the statement does not take): the
        // caller's mistake, which a retry repeats.
        return Err(Error::store(
            BACKEND,
            StoreFailure::Protocol,
            "fenced statement".to_owned(),
            Some(Box::new(e)),
        ));
    }
    Err(admit_error(lock, token, e, "fenced statement"))
}

fn kept_moving(lock: &str, token: FencingToken) -> Error {
    Error::store(
        BACKEND,
        StoreFailure::Unavailable,
        format!(
            "fenced statement: the fence of `{lock}` was reset each time token {token} was \
             admitted; retry"
        ),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_stay_within_postgres_range() {
        let fence = PgFence::new("f").unwrap_or_else(|e| panic!("{e}"));
        assert!(fence.condition(0).is_err());
        assert!(fence.condition(MAX_PARAMETER).is_err());
        assert!(fence.condition(usize::MAX).is_err());
        let last = fence
            .condition(MAX_PARAMETER - 1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(last.contains("$65534::text") && last.contains("$65535::bigint"));
    }
}
