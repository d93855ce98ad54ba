//! The PostgreSQL fence against a real PostgreSQL, with tokens from a real etcd.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, FencingToken, LockBackend, LockBackendExt};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_fence::postgres::{update_fenced, FencedUpdate, PgFence};
use fencelock_testsupport::{unique, EtcdCluster, PgServer};
use tokio_postgres::{Client, NoTls};

async fn connect(pg: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&pg.url(), NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}; log:\n{}", pg.url(), pg.logs()));
    tokio::spawn(connection);
    client
}

/// A server, the fence `table` created on it, and a client that has run `schema` (the test's
/// own tables, or settings of its session).
async fn fenced_server(table: &str, schema: &str) -> (Arc<PgServer>, PgFence, Client) {
    let pg = Arc::new(PgServer::start());
    let fence = PgFence::new(table).unwrap();
    let client = connect(&pg).await;
    fence.create_table(&client).await.unwrap();
    client.batch_execute(schema).await.unwrap();
    (pg, fence, client)
}

/// How the writers guard their transactions.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// No fence: the control.
    Plain,
    /// `admit`, then the statements.
    Admit,
    /// `admit_then`: the statements sent right behind the admission.
    Pipelined,
    /// `admit_then` of the admission prepared on the writer's connection.
    Prepared,
    /// The admission inside the statement (`PgFence::condition`).
    Condition,
}

#[derive(Default)]
struct Tally {
    committed: AtomicU64,
    refused: AtomicU64,
}

/// One writer: takes the lock, lets its lease go (from then on it is a holder that has not
/// noticed it lost the lock), and does a read-modify-write of the register some time later,
/// while newer holders do theirs.
async fn writer(
    backend: Arc<dyn LockBackend>,
    pg: Arc<PgServer>,
    fence: PgFence,
    mode: Mode,
    table: String,
    seed: u64,
    tally: Arc<Tally>,
) {
    let mut client = connect(&pg).await;
    let prepared = fence.prepare(&client).await.unwrap();
    let jitter = |i: u64| Duration::from_millis((seed * 7 + i * 13) % 17);
    for round in 0..10u64 {
        let guard = backend.lock("account").await.unwrap();
        let token = guard.token();
        let _ = guard.release().await.unwrap();
        tokio::time::sleep(jitter(round)).await;
        if mode == Mode::Condition {
            condition_round(&client, &fence, &table, token, jitter(round + 5), &tally).await;
            continue;
        }
        // The read is fenced too, so a newer holder's read raises the mark (see the README).
        let tx = client.transaction().await.unwrap();
        let sql = format!("SELECT value FROM {table} WHERE id = 1");
        let read = match mode {
            Mode::Plain => Ok(tx.query_one(&sql, &[]).await),
            Mode::Condition => unreachable!("in autocommit, above"),
            Mode::Admit => match fence.admit(&tx, "account", token).await {
                Ok(()) => Ok(tx.query_one(&sql, &[]).await),
                Err(e) => Err(e),
            },
            Mode::Pipelined => {
                fence
                    .admit_then(&tx, "account", token, tx.query_one(&sql, &[]))
                    .await
            }
            Mode::Prepared => {
                prepared
                    .admit_then(&tx, "account", token, tx.query_one(&sql, &[]))
                    .await
            }
        };
        let value: i64 = match read {
            Ok(row) => row.unwrap().get(0),
            Err(e) => {
                assert!(matches!(e, Error::StaleToken { .. }), "{e}");
                tally.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        tx.commit().await.unwrap();
        tokio::time::sleep(jitter(round + 5)).await;
        let tx = client.transaction().await.unwrap();
        let update = format!("UPDATE {table} SET value = $1 WHERE id = 1");
        let insert = format!("INSERT INTO {table}_history (token) VALUES ($1)");
        let token_value = i64::try_from(token.get()).unwrap();
        let written = {
            let write = async {
                tx.execute(&update, &[&(value + 1)]).await?;
                tx.execute(&insert, &[&token_value]).await
            };
            match mode {
                Mode::Plain => Ok(write.await),
                Mode::Admit => match fence.admit(&tx, "account", token).await {
                    Ok(()) => Ok(write.await),
                    Err(e) => Err(e),
                },
                Mode::Pipelined => fence.admit_then(&tx, "account", token, write).await,
                Mode::Prepared => prepared.admit_then(&tx, "account", token, write).await,
                Mode::Condition => unreachable!("in autocommit, above"),
            }
        };
        match written {
            Ok(inserted) => assert_eq!(inserted.unwrap(), 1),
            Err(e) => {
                assert!(matches!(e, Error::StaleToken { .. }), "{e}");
                tally.refused.fetch_add(1, Ordering::Relaxed);
                // Committed anyway, as a careless caller would: PostgreSQL rolls back an
                // aborted transaction, so the refusal must have aborted it.
                tx.commit().await.ok();
                continue;
            }
        }
        tx.commit().await.unwrap();
        tally.committed.fetch_add(1, Ordering::Relaxed);
    }
}

/// One round of `writer` in autocommit, each statement carrying its admission
/// (`PgFence::condition`): the read, then the write and its history row in one statement.
async fn condition_round(
    client: &Client,
    fence: &PgFence,
    table: &str,
    token: FencingToken,
    pause: Duration,
    tally: &Tally,
) {
    let read = format!(
        "SELECT value FROM {table} WHERE id = 1 AND {}",
        fence.condition(1).unwrap()
    );
    let value: i64 = match fence.query(client, &read, &[], "account", token).await {
        Ok(rows) => rows[0].get(0),
        Err(e) => {
            assert!(matches!(e, Error::StaleToken { .. }), "{e}");
            tally.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    tokio::time::sleep(pause).await;
    let write = format!(
        "WITH w AS (UPDATE {table} SET value = $1 WHERE id = 1 AND {} RETURNING 1) \
         INSERT INTO {table}_history (token) SELECT $2 FROM w",
        fence.condition(3).unwrap()
    );
    let token_value = i64::try_from(token.get()).unwrap();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&(value + 1), &token_value];
    match fence
        .execute(client, &write, &params, "account", token)
        .await
    {
        Ok(inserted) => {
            assert_eq!(inserted, 1);
            tally.committed.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            assert!(matches!(e, Error::StaleToken { .. }), "{e}");
            tally.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn run(pg: &Arc<PgServer>, etcd: &EtcdCluster, mode: Mode) -> (u64, u64, i64, Vec<i64>) {
    let client = connect(pg).await;
    let table = format!("{mode:?}").to_lowercase();
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, value bigint NOT NULL); \
             INSERT INTO {table} VALUES (1, 0); \
             CREATE TABLE {table}_history (seq bigserial PRIMARY KEY, token bigint NOT NULL)"
        ))
        .await
        .unwrap();
    let fence = PgFence::new("fencelock_fence").unwrap();
    fence.create_table(&client).await.unwrap();
    let config = EtcdConfig::new(etcd.endpoints())
        .prefix(format!("{}/", unique("/fence-test")))
        .ttl(Duration::from_secs(5));
    let backend: Arc<dyn LockBackend> = Arc::new(EtcdBackend::connect(config).await.unwrap());
    let tally = Arc::new(Tally::default());
    let writers: Vec<_> = (0..6)
        .map(|seed| {
            tokio::spawn(writer(
                Arc::clone(&backend),
                Arc::clone(pg),
                fence.clone(),
                mode,
                table.clone(),
                seed,
                Arc::clone(&tally),
            ))
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let _ = backend.close().await;
    let value: i64 = client
        .query_one(&format!("SELECT value FROM {table} WHERE id = 1"), &[])
        .await
        .unwrap()
        .get(0);
    let tokens: Vec<i64> = client
        .query(
            &format!("SELECT token FROM {table}_history ORDER BY seq"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    (
        tally.committed.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        value,
        tokens,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_holders_never_commit_and_plain_writes_lose_updates() {
    let pg = Arc::new(PgServer::start());
    let etcd = EtcdCluster::start(1);

    for mode in [
        Mode::Admit,
        Mode::Pipelined,
        Mode::Prepared,
        Mode::Condition,
    ] {
        let (committed, refused, value, tokens) = run(&pg, &etcd, mode).await;
        println!("{mode:?}: {committed} committed, {refused} refused, register = {value}");
        assert!(
            refused > 0,
            "{mode:?}: no stale token was presented: the test proves nothing"
        );
        assert_eq!(
            u64::try_from(value).unwrap(),
            committed,
            "{mode:?}: a committed write was lost"
        );
        assert_eq!(
            u64::try_from(tokens.len()).unwrap(),
            committed,
            "{mode:?}: a refused write landed"
        );
        assert!(
            tokens.windows(2).all(|w| w[0] <= w[1]),
            "{mode:?}: a stale token committed after a newer one: {tokens:?}"
        );
    }

    let (committed, _, value, _) = run(&pg, &etcd, Mode::Plain).await;
    println!("plain: {committed} committed, register = {value}");
    assert!(
        u64::try_from(value).unwrap() < committed,
        "the control lost no update: the interleaving does not exercise the fence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_survives_a_server_restart_and_refuses_lower_tokens() {
    let mut pg = PgServer::start();
    let fence = PgFence::new("public.fence").unwrap();
    let mut client = connect(&pg).await;
    fence.create_table(&client).await.unwrap();
    let tx = client.transaction().await.unwrap();
    fence
        .admit(&tx, "jobs", FencingToken::new(10))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Refused, and rolled back: its write never lands.
    let tx = client.transaction().await.unwrap();
    let err = fence
        .admit(&tx, "jobs", FencingToken::new(9))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("restored"), "{err}");
    drop(tx);
    drop(client);

    pg.restart();
    let mut client = connect(&pg).await;
    assert_eq!(
        fence.highest(&client, "jobs").await.unwrap(),
        Some(FencingToken::new(10))
    );
    let tx = client.transaction().await.unwrap();
    assert!(matches!(
        fence.admit(&tx, "jobs", FencingToken::new(9)).await,
        Err(Error::StaleToken { presented, highest, .. })
            if presented.get() == 9 && highest.get() == 10
    ));
    drop(tx);
    // The operator's recovery after a restored lock store: forget the mark.
    fence.reset(&client, "jobs").await.unwrap();
    let tx = client.transaction().await.unwrap();
    fence
        .admit(&tx, "jobs", FencingToken::new(3))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // The column pattern.
    client
        .batch_execute(
            "CREATE TABLE job (id int PRIMARY KEY, state text, fence_token bigint NOT NULL); \
             INSERT INTO job VALUES (1, 'new', 0)",
        )
        .await
        .unwrap();
    let update = FencedUpdate {
        table: "job",
        set: "state = $2",
        token_column: "fence_token",
        filter: "id = $3",
    };
    let n = update_fenced(&client, FencingToken::new(5), update, &[&"run", &1i32])
        .await
        .unwrap();
    assert_eq!(n, 1);
    let n = update_fenced(&client, FencingToken::new(4), update, &[&"stale", &1i32])
        .await
        .unwrap();
    assert_eq!(n, 0, "a lower token updated the row");
    let state: String = client
        .query_one("SELECT state FROM job WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "run");
    assert!(PgFence::new("bad; DROP TABLE job").is_err());
}

/// One holder's concurrent transactions share the fence row; a newer token waits for all of
/// them; two transactions raising to the same new token do not deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_token_transactions_run_side_by_side_and_raises_wait_for_them() {
    let pg = Arc::new(PgServer::start());
    // Bounded as a whole: every await below waits on PostgreSQL's row locks. A hang shows
    // the step it stopped at and what each backend was waiting for.
    let step = Arc::new(std::sync::Mutex::new("start"));
    let run = sharing_and_raising(Arc::clone(&pg), Arc::clone(&step));
    let mut run = std::pin::pin!(run);
    // Polled by reference: on a timeout the scenario's connections stay open while the
    // activity below is read.
    if tokio::time::timeout(Duration::from_secs(60), &mut run)
        .await
        .is_err()
    {
        let at = *step.lock().unwrap();
        panic!(
            "the row-lock scenario stopped at {at:?} for 60 s; port {}, activity:\n{}\nlog:\n{}",
            pg.port,
            activity(&pg).await,
            pg.logs()
        );
    }
}

/// Waits (up to 20 s) until backend `pid` waits for a lock, as `pg_stat_activity` shows it;
/// panics with `why` and every backend's activity otherwise.
async fn waits_for_a_lock(pg: &PgServer, c: &Client, pid: i32, why: &str) {
    for _ in 0..400 {
        let row = c
            .query_one(
                "SELECT coalesce(wait_event_type, '') FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap();
        if row.get::<_, String>(0) == "Lock" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{why}; activity:\n{}", activity(pg).await);
}

/// What every backend is running, waiting for and blocked by (`pg_blocking_pids`).
async fn activity(pg: &PgServer) -> String {
    let client = connect(pg).await;
    let rows = client
        .query(
            "SELECT a.pid::text, coalesce(a.state, ''), coalesce(a.wait_event_type, ''), \
             coalesce(a.wait_event, ''), coalesce(a.backend_xid::text, ''), \
             coalesce(pg_blocking_pids(a.pid)::text, ''), coalesce(a.query, '') \
             FROM pg_stat_activity a WHERE a.pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    let mut out = String::new();
    for r in rows {
        let cols: Vec<String> = (0..7).map(|i| r.get::<_, String>(i)).collect();
        out.push_str(&cols.join(" | "));
        out.push('\n');
    }
    out
}

async fn sharing_and_raising(pg: Arc<PgServer>, step: Arc<std::sync::Mutex<&'static str>>) {
    let at = |name: &'static str| *step.lock().unwrap() = name;
    let fence = PgFence::new("share_fence").unwrap();
    let (mut a, mut b) = (connect(&pg).await, connect(&pg).await);
    fence.create_table(&a).await.unwrap();
    let t = FencingToken::new;
    // The lock's first admission inserts its row, and a row being inserted makes the others
    // wait until it commits (PostgreSQL's insertion conflict); after that, sharing holds.
    at("first admission");
    let tx = a.transaction().await.unwrap();
    fence.admit(&tx, "jobs", t(4)).await.unwrap();
    tx.commit().await.unwrap();

    at("raise to 5 open");
    let tx_a = a.transaction().await.unwrap();
    fence.admit(&tx_a, "jobs", t(5)).await.unwrap();
    let tx = b.transaction().await.unwrap();
    {
        let mut waiting = std::pin::pin!(fence.admit(&tx, "jobs", t(5)));
        tokio::time::timeout(Duration::from_secs(1), &mut waiting)
            .await
            .expect_err("a token being raised was shared before its raise committed");
        at("commit the raise to 5");
        tx_a.commit().await.unwrap();
        // The waiting admission ends before a new sharer comes: woken by the raise's commit,
        // PostgreSQL locks the row's new version before it re-checks the UPDATE's condition,
        // so it would wait for a sharer that got in first (here tx_a below, which this task
        // commits only after tx_b: a wait PostgreSQL cannot see as a deadlock).
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the admission waiting for the raise did not end when it committed")
            .unwrap();
    }
    tx.rollback().await.unwrap();
    at("share 5 on a");
    let tx_a = a.transaction().await.unwrap();
    fence.admit(&tx_a, "jobs", t(5)).await.unwrap();
    at("begin on b");
    let tx_b = b.transaction().await.unwrap();
    at("share 5 on b");
    // The same token while tx_a is open: admitted at once (it would wait for tx_a if the
    // admission locked the row exclusively).
    tokio::time::timeout(Duration::from_secs(5), fence.admit(&tx_b, "jobs", t(5)))
        .await
        .expect("the same token waited for another transaction")
        .unwrap();

    let raise = |token: u64| {
        let (pg, fence) = (Arc::clone(&pg), fence.clone());
        tokio::spawn(async move {
            let mut client = connect(&pg).await;
            let tx = client.transaction().await.unwrap();
            let result = fence.admit(&tx, "jobs", t(token)).await;
            tx.commit().await.unwrap();
            result
        })
    };
    at("raise to 6");
    let newer = raise(6);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !newer.is_finished(),
        "a newer token was admitted while older ones wrote"
    );
    tx_a.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !newer.is_finished(),
        "admitted while an older transaction was open"
    );
    tx_b.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), newer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // Two raises to one new token at once: one raises, the other shares (a deadlock would be
    // an error here).
    at("raise to 7 on a");
    let tx_a = a.transaction().await.unwrap();
    fence.admit(&tx_a, "jobs", t(7)).await.unwrap();
    let second = raise(7);
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx_a.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(fence.highest(&a, "jobs").await.unwrap(), Some(t(7)));

    // The held token, presented while a raise is open: it waits for the raise (its snapshot
    // still shows the token it presents), then is refused, not admitted on the old row.
    at("raise to 8 on a");
    let tx_a = a.transaction().await.unwrap();
    fence.admit(&tx_a, "jobs", t(8)).await.unwrap();
    let old = raise(7);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !old.is_finished(),
        "the held token did not wait for a raise"
    );
    tx_a.commit().await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), old)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&refused, Err(Error::StaleToken { highest, .. }) if highest.get() == 8),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_pipelined_write_never_lands_even_when_the_caller_commits() {
    let (_pg, fence, mut client) = fenced_server(
        "fence",
        "CREATE TABLE acct (id int PRIMARY KEY, balance bigint NOT NULL); \
         INSERT INTO acct VALUES (1, 100)",
    )
    .await;
    let debit = client
        .prepare("UPDATE acct SET balance = balance - 10 WHERE id = 1")
        .await
        .unwrap();
    let t = FencingToken::new;
    let tx = client.transaction().await.unwrap();
    let admitted = fence
        .admit_then(&tx, "acct", t(5), tx.execute(&debit, &[]))
        .await;
    assert_eq!(admitted.unwrap().unwrap(), 1);
    tx.commit().await.unwrap();

    let tx = client.transaction().await.unwrap();
    let refused = fence
        .admit_then(&tx, "acct", t(4), tx.execute(&debit, &[]))
        .await;
    assert!(
        matches!(&refused, Err(Error::StaleToken { presented, highest, .. })
            if presented.get() == 4 && highest.get() == 5),
        "{refused:?}"
    );
    // The debit was sent before the refusal came back; committing must not apply it.
    tx.commit().await.ok();
    let balance: i64 = client
        .query_one("SELECT balance FROM acct WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 90, "the refused debit landed");
}

/// Under REPEATABLE READ a transaction reads one snapshot throughout, so an admission that
/// waited for a raise, or came after one committed, must not compare against the token its
/// snapshot shows: it is refused (stale), or fails as a serialization failure to retry. Under
/// READ COMMITTED the same sequence is refused as stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_never_compares_against_an_old_snapshot() {
    let pg = PgServer::start();
    let fence = PgFence::new("snapshot_fence").unwrap();
    let (mut a, b) = (connect(&pg).await, connect(&pg).await);
    fence.create_table(&a).await.unwrap();
    let t = FencingToken::new;
    fence.admit(&b, "jobs", t(5)).await.unwrap(); // autocommit: the mark is 5

    use tokio_postgres::IsolationLevel::{ReadCommitted, RepeatableRead, Serializable};
    for (isolation, name) in [
        (RepeatableRead, "repeatable read"),
        (Serializable, "serializable"),
        (ReadCommitted, "read committed"),
    ] {
        let tx = a
            .build_transaction()
            .isolation_level(isolation)
            .start()
            .await
            .unwrap();
        // The snapshot is taken here, while the mark is still the old one.
        let seen = fence.highest(&tx, "jobs").await.unwrap().unwrap();
        let newer = FencingToken::new(seen.get() + 1);
        fence.admit(&b, "jobs", newer).await.unwrap(); // another holder raises and commits
        let admitted = fence.admit(&tx, "jobs", seen).await;
        match &admitted {
            Err(Error::StaleToken { highest, .. }) => assert_eq!(*highest, newer),
            Err(e) if e.is_retryable() && name != "read committed" => {}
            other => panic!("{name}: {seen} admitted after {newer} committed: {other:?}"),
        }
        drop(tx);
    }
}

/// The prepared admission admits and refuses as the unprepared one; used on another
/// connection's transaction it fails, and that transaction's write does not land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_admission_refuses_stale_tokens_and_only_works_on_its_connection() {
    let (pg, fence, mut a) = fenced_server(
        "prepared_fence",
        "CREATE TABLE acct (id int PRIMARY KEY, balance bigint NOT NULL); \
         INSERT INTO acct VALUES (1, 100)",
    )
    .await;
    let mut b = connect(&pg).await;
    let t = FencingToken::new;
    let prepared = fence.prepare(&a).await.unwrap();
    let debit = "UPDATE acct SET balance = balance - 10 WHERE id = 1";

    let tx = a.transaction().await.unwrap();
    let admitted = prepared
        .admit_then(&tx, "acct", t(5), tx.execute(debit, &[]))
        .await;
    assert_eq!(admitted.unwrap().unwrap(), 1);
    tx.commit().await.unwrap();

    let tx = a.transaction().await.unwrap();
    let refused = prepared.admit(&tx, "acct", t(4)).await;
    assert!(
        matches!(&refused, Err(Error::StaleToken { presented, highest, .. })
            if presented.get() == 4 && highest.get() == 5),
        "{refused:?}"
    );
    drop(tx);

    // On another connection the statement does not exist: an error, never an admission.
    let tx = b.transaction().await.unwrap();
    let elsewhere = prepared
        .admit_then(&tx, "acct", t(6), tx.execute(debit, &[]))
        .await;
    assert!(
        matches!(&elsewhere, Err(e @ Error::Backend { .. }) if !e.is_retryable()),
        "{elsewhere:?}"
    );
    tx.commit().await.ok();
    let balance: i64 = a
        .query_one("SELECT balance FROM acct WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 90, "a write behind a failed admission landed");
    assert_eq!(fence.highest(&a, "acct").await.unwrap(), Some(t(5)));
}

/// The held token's admission is plain SQL: the PL/pgSQL function runs for the raise, a
/// refusal and the row's first admission, never when the row already holds the token (counted
/// by PostgreSQL itself, `track_functions`, in the current transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_token_is_admitted_without_the_function() {
    let (_pg, fence, mut client) = fenced_server("plain_fence", "SET track_functions = 'pl'").await;
    let prepared = fence.prepare(&client).await.unwrap();
    let t = FencingToken::new;
    let calls = "SELECT coalesce(pg_stat_get_xact_function_calls('plain_fence_admit'::regproc), 0)";
    let tx = client.transaction().await.unwrap();
    fence.admit(&tx, "jobs", t(3)).await.unwrap(); // the first admission inserts the row
    fence.admit(&tx, "jobs", t(4)).await.unwrap(); // a raise
    let after_raises: i64 = tx.query_one(calls, &[]).await.unwrap().get(0);
    // A statement's own admission, for the held token: no function either (the check a miss
    // calls always raises, which would have aborted this transaction).
    let fenced = format!("SELECT 1 WHERE {}", fence.condition(1).unwrap());
    for _ in 0..5 {
        fence.admit(&tx, "jobs", t(4)).await.unwrap();
        prepared.admit(&tx, "jobs", t(4)).await.unwrap();
        let rows = tx.query(&fenced, &[&"jobs", &4i64]).await.unwrap();
        assert_eq!(rows.len(), 1);
    }
    let after_held: i64 = tx.query_one(calls, &[]).await.unwrap().get(0);
    assert!(
        after_raises >= 2,
        "the raises ran the function {after_raises} times"
    );
    assert_eq!(
        after_held, after_raises,
        "fifteen admissions of the held token ran the function"
    );
    tx.commit().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let refused = fence.admit(&tx, "jobs", t(2)).await;
    assert!(
        matches!(&refused, Err(Error::StaleToken { highest, .. }) if highest.get() == 4),
        "{refused:?}"
    );
}

/// The admission inside the caller's statement (`PgFence::condition`): admitted, raised and
/// refused like `admit`, in autocommit; a refused statement changes nothing; and the statement
/// waits for a raise in flight without having locked the row it is about to change (the
/// admission runs before any row reaches the UPDATE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_with_the_condition_is_refused_before_it_changes_a_row() {
    let (pg, fence, mut a) = fenced_server(
        "stmt_fence",
        "CREATE TABLE acct (id int PRIMARY KEY, balance bigint NOT NULL); \
         INSERT INTO acct VALUES (1, 100); \
         CREATE TABLE audit (token bigint NOT NULL)",
    )
    .await;
    let t = FencingToken::new;
    let debit = format!(
        "UPDATE acct SET balance = balance - $1 WHERE id = 1 AND {}",
        fence.condition(2).unwrap()
    );
    let read = "SELECT balance FROM acct WHERE id = 1";

    // Autocommit: the first admission, the held token, a raise, a refusal.
    for (token, expect) in [(5, 90), (5, 80), (7, 70)] {
        let n = fence
            .execute(&a, &debit, &[&10i64], "acct", t(token))
            .await
            .unwrap();
        assert_eq!(n, 1);
        let now: i64 = a.query_one(read, &[]).await.unwrap().get(0);
        assert_eq!(now, expect);
    }
    let refused = fence.execute(&a, &debit, &[&10i64], "acct", t(5)).await;
    assert!(
        matches!(&refused, Err(Error::StaleToken { highest, .. }) if highest.get() == 7),
        "{refused:?}"
    );
    let now: i64 = a.query_one(read, &[]).await.unwrap().get(0);
    assert_eq!(now, 70, "a refused statement changed the row");
    assert_eq!(fence.highest(&a, "acct").await.unwrap(), Some(t(7)));

    // An INSERT takes it as INSERT ... SELECT ... WHERE.
    let audit = format!(
        "INSERT INTO audit (token) SELECT $1 WHERE {}",
        fence.condition(2).unwrap()
    );
    let n = fence
        .execute(&a, &audit, &[&7i64], "acct", t(7))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert!(matches!(
        fence.execute(&a, &audit, &[&6i64], "acct", t(6)).await,
        Err(Error::StaleToken { .. })
    ));
    let audited: i64 = a
        .query_one("SELECT count(*) FROM audit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(audited, 1);
    assert!(matches!(
        fence.condition(0),
        Err(Error::InvalidConfig { .. })
    ));

    // A raise to 9 in flight (its transaction open, the fence row locked): the statement
    // with 7 waits for it, and meanwhile has not locked the account's row.
    let raise = a.transaction().await.unwrap();
    fence.admit(&raise, "acct", t(9)).await.unwrap();
    let b = connect(&pg).await;
    let b_pid: i32 = b
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let stale = {
        let (fence, debit) = (fence.clone(), debit.clone());
        tokio::spawn(async move {
            fence
                .execute(&b, &debit, &[&10i64], "acct", FencingToken::new(7))
                .await
        })
    };
    let c = connect(&pg).await;
    waits_for_a_lock(&pg, &c, b_pid, "the statement did not wait for the raise").await;
    c.batch_execute("SET lock_timeout = '5s'").await.unwrap();
    c.execute("UPDATE acct SET balance = balance WHERE id = 1", &[])
        .await
        .unwrap_or_else(|e| panic!("the waiting statement had locked the row it updates: {e}"));
    raise.commit().await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(30), stale)
        .await
        .expect("the statement still waits after the raise committed")
        .unwrap();
    assert!(
        matches!(&refused, Err(Error::StaleToken { highest, .. }) if highest.get() == 9),
        "{refused:?}"
    );
    let now: i64 = c.query_one(read, &[]).await.unwrap().get(0);
    assert_eq!(now, 70, "the stale statement changed the row");
}

/// Review of the statement admission: a newer holder's fenced read, sent while an older
/// holder's admitted transaction is still open, must see what that transaction commits. The
/// admission waits for the older transaction; the read must not use a snapshot taken before
/// that wait (the statement's own, under READ COMMITTED). First on a new fence row (the older
/// holder's admission inserted it), then on one that exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_statement_that_waits_for_an_older_holder_sees_its_commit() {
    let (pg, fence, mut p) = fenced_server(
        "wait_fence",
        "CREATE TABLE reg (id int PRIMARY KEY, value bigint NOT NULL); \
         INSERT INTO reg VALUES (1, 0)",
    )
    .await;
    let c = connect(&pg).await;
    for (older, newer, expect) in [(7, 9, 1), (9, 11, 2)] {
        // The older holder: admitted, its increment written, not yet committed.
        let open = p.transaction().await.unwrap();
        let written = fence
            .admit_then(
                &open,
                "reg",
                FencingToken::new(older),
                open.execute("UPDATE reg SET value = value + 1 WHERE id = 1", &[]),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(written, 1);
        // The newer holder: a fenced read of the register.
        let a = connect(&pg).await;
        let a_pid: i32 = a
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let read = format!(
            "SELECT value FROM reg WHERE id = 1 AND {}",
            fence.condition(1).unwrap()
        );
        let reading = {
            let fence = fence.clone();
            tokio::spawn(async move {
                fence
                    .query(&a, &read, &[], "reg", FencingToken::new(newer))
                    .await
            })
        };
        let why = format!("{newer}'s admission did not wait for {older}'s open write");
        waits_for_a_lock(&pg, &c, a_pid, &why).await;
        open.commit().await.unwrap();
        let rows = tokio::time::timeout(Duration::from_secs(30), reading)
            .await
            .expect("the newer holder still waits after the older one committed")
            .unwrap()
            .unwrap();
        assert_eq!(
            rows[0].get::<_, i64>(0),
            expect,
            "{newer} read the register from before {older}'s commit"
        );
    }
}

/// Review: a first admission (no row yet, or a reset one) that raced another must not report
/// success unless the mark is at its token. The higher token's function finds no row to raise,
/// then, before it looks again, the lower token's first admission inserts the row: a test
/// trigger on the fence table holds the higher one there (a statement trigger fires even when
/// the UPDATE matched nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_admission_that_raced_a_lower_one_never_reports_a_raise_it_did_not_make() {
    let (pg, fence, c) = fenced_server(
        "race_fence",
        "CREATE FUNCTION race_pause() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF current_setting('fencelock.test_pause', true) = 'on' THEN \
             PERFORM pg_sleep(1); \
           END IF; \
           RETURN NULL; \
         END $$; \
         CREATE TRIGGER race_pause AFTER UPDATE ON race_fence \
           FOR EACH STATEMENT EXECUTE FUNCTION race_pause()",
    )
    .await;
    let (a, b) = (connect(&pg).await, connect(&pg).await);
    b.batch_execute("SET fencelock.test_pause = 'on'")
        .await
        .unwrap();
    let b_pid: i32 = b
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let higher = {
        let fence = fence.clone();
        tokio::spawn(async move { fence.admit(&b, "r", FencingToken::new(9)).await })
    };
    // The higher admission's UPDATE found no row and now pauses in the trigger.
    let mut paused = false;
    for _ in 0..400 {
        let row = c
            .query_one(
                "SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1",
                &[&b_pid],
            )
            .await
            .unwrap();
        if row.get::<_, String>(0) == "PgSleep" {
            paused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        paused,
        "the higher admission never paused; activity:\n{}",
        activity(&pg).await
    );
    fence.admit(&a, "r", FencingToken::new(5)).await.unwrap();
    match higher.await.unwrap() {
        Ok(()) => assert_eq!(
            fence.highest(&c, "r").await.unwrap(),
            Some(FencingToken::new(9)),
            "token 9 was reported admitted, and the mark is lower"
        ),
        Err(e) => assert!(e.is_retryable(), "{e}"),
    }
}
