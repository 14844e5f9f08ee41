//! `integrations::sqlx` on a real PostgreSQL server: each test starts its own throwaway cluster
//! (see `support/postgres.rs`). Without PostgreSQL binaries the tests print SKIPPED; under
//! `CI=true` they fail instead.
//!
//! Real sockets force real time here. The figures (return by the deadline, backend idle
//! within 100 ms) are measured and printed; the assertions allow for a loaded 2-core machine
//! (deadline + 500 ms, idle within 2 s polling every 10 ms) and check order and causes.

use std::time::Duration;

use cancel_scope::integrations::sqlx::GuardedPool;
use cancel_scope::{ChildSpec, Lifecycle, Scope};
use sqlx::postgres::PgPoolOptions;
use sqlx::Row;
use tokio::time::Instant;

use crate::support::postgres::*;
use crate::support::sqlx::leave_a_block_open;

/// Issue figure: `SELECT pg_sleep(10)` under a 200 ms budget returns by the deadline, and the
/// backend is idle within 100 ms after; the pool still serves the next query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_sleep_under_200ms_budget_returns_by_deadline_and_backend_idle_within_100ms() {
    let Some(pg) = PgCluster::start("pg_sleep_under_200ms_budget") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    let mut obs = observer(&pg).await;

    let scope = Scope::with_timeout(Duration::from_millis(200));
    let deadline = scope.deadline().unwrap();
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;

    let err = conn
        .fetch_one(
            ChildSpec::read_only("sleep"),
            sqlx::query("SELECT pg_sleep(10)"),
        )
        .await
        .unwrap_err();
    let returned = Instant::now();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert!(
        returned <= deadline + SLACK,
        "returned {:?} after the deadline",
        returned - deadline
    );
    let (idle_after, state) = wait_not_active(&mut obs, pid, IDLE_WITHIN).await;
    eprintln!(
        "pg_sleep(10) under 200 ms: returned {:?} after the deadline; backend {pid} {state} \
         {idle_after:?} after the return (issue: by the deadline / within 100 ms)",
        returned.saturating_duration_since(deadline)
    );
    drop(conn);

    // The pool still serves, on the same backend: the connection was cleaned, not closed.
    let next = Scope::with_timeout(Duration::from_secs(5));
    let row = db
        .fetch_one(
            &next,
            ChildSpec::read_only("next"),
            sqlx::query("SELECT pg_backend_pid()"),
        )
        .await
        .unwrap();
    assert_eq!(row.get::<i32, _>(0), pid);

    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(report.cancelled(), 1, "{report}");
    assert!(report.cause().unwrap().is_deadline_exceeded());
}

/// Issue figure: the same with an explicit cancel at 50 ms and no deadline at all, so only the
/// server-side cancel (`pg_cancel_backend`) can stop the statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_cancel_at_50ms_stops_the_server_statement() {
    let Some(pg) = PgCluster::start("explicit_cancel_at_50ms") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    let mut obs = observer(&pg).await;

    let scope = Scope::new();
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;

    let canceller = tokio::spawn({
        let scope = scope.clone();
        let mut watch = observer(&pg).await;
        async move {
            // The 50 ms, and at least until the statement runs on the server (so that
            // only the server-side cancel can stop it, whatever the machine's speed).
            let at = Instant::now() + Duration::from_millis(50);
            wait_active(&mut watch, pid, "pg_sleep(10)").await;
            tokio::time::sleep_until(at).await;
            scope.cancel_with("user pressed stop");
            Instant::now()
        }
    });
    let err = conn
        .fetch_one(
            ChildSpec::read_only("sleep"),
            sqlx::query("SELECT pg_sleep(10)"),
        )
        .await
        .unwrap_err();
    let returned = Instant::now();
    let cancelled_at = canceller.await.unwrap();
    assert!(err.is_cancelled() && !err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(
        err.scope_error().unwrap().cause().unwrap().reason(),
        Some("user pressed stop")
    );
    assert!(returned <= cancelled_at + SLACK);
    let (idle_after, state) = wait_not_active(&mut obs, pid, IDLE_WITHIN).await;
    eprintln!(
        "cancel at 50 ms: returned {:?} after the cancel; backend {pid} {state} {idle_after:?} \
         after the return (issue: within 100 ms)",
        returned.saturating_duration_since(cancelled_at)
    );
    assert_eq!(state, "idle", "the connection was cleaned, not closed");
    drop(conn);

    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(report.cancelled(), 1, "{report}");

    let row = db
        .fetch_one(
            &Scope::with_timeout(Duration::from_secs(5)),
            ChildSpec::read_only("next"),
            sqlx::query("SELECT pg_backend_pid()"),
        )
        .await
        .unwrap();
    assert_eq!(row.get::<i32, _>(0), pid, "same backend: back in the pool");
}

/// Issue: a cancel before dispatch sends nothing. Checked in the server's statement log: the
/// refused statement never appears, while the same statement sent afterwards (the positive
/// control) does, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_dispatch_sends_nothing() {
    let Some(pg) = PgCluster::start("cancel_before_dispatch_sends_nothing") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;
    const MARKER: &str = "INSERT INTO orders VALUES ('marker-7f3a')";

    let scope = Scope::new();
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;
    let prefix = format!("[{pid}] ");
    let lines_before = pg.log().lines().filter(|l| l.contains(&prefix)).count();

    scope.cancel();
    let err = conn
        .execute(
            ChildSpec::side_effecting("insert", "marker-7f3a"),
            sqlx::query(MARKER),
        )
        .await
        .unwrap_err();
    assert!(err.is_cancelled(), "{err:?}");
    drop(conn);
    let report = scope.quiesce().await;
    assert_eq!(
        report.effect_unknown(),
        0,
        "nothing was dispatched: {report}"
    );

    // Everything that backend logged since the cancel (quiesce waited for the release): only
    // the release's restore of statement_timeout (which also asks whether a transaction
    // block is open, to roll it back).
    let log = pg.log();
    let after: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&prefix))
        .skip(lines_before)
        .collect();
    assert_eq!(after.len(), 1, "{after:#?}");
    assert!(
        after[0].contains(
            "statement: SELECT pg_catalog.statement_timestamp() OPERATOR(pg_catalog.<>) \
             pg_catalog.transaction_timestamp(); \
             SELECT pg_catalog.set_config('statement_timeout', '0', false)"
        ),
        "{after:#?}"
    );

    // Positive control: the same statement through a live scope is logged.
    db.execute(
        &Scope::with_timeout(Duration::from_secs(5)),
        ChildSpec::side_effecting("insert", "marker-7f3a"),
        sqlx::query(MARKER),
    )
    .await
    .unwrap();
    let log = pg.log();
    assert_eq!(
        log.matches("marker-7f3a").count(),
        1,
        "only the control reached the server:\n{log}"
    );
    assert_eq!(count_orders(&db).await, 1);
}

/// Issue: an `INSERT` cancelled after dispatch produces `EffectUnknown` in the report, with
/// the effect id, payload digest and the backend pid as provider handle. (The server cancel
/// really stopped it: the table is empty.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_cancelled_after_dispatch_is_effect_unknown_in_report() {
    let Some(pg) = PgCluster::start("insert_cancelled_after_dispatch") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    let mut obs = observer(&pg).await;
    create_orders(&db).await;

    let scope = Scope::new();
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;
    let canceller = tokio::spawn({
        let scope = scope.clone();
        let mut obs = observer(&pg).await;
        async move {
            wait_active(&mut obs, pid, "INSERT").await; // the INSERT is running on the server
            scope.cancel();
        }
    });
    let err = conn
        .execute(
            ChildSpec::side_effecting("insert-order", "order-1").payload_digest("sha256:0f1e"),
            sqlx::query("INSERT INTO orders SELECT 'order-1' FROM pg_sleep(10)"),
        )
        .await
        .unwrap_err();
    canceller.await.unwrap();
    assert!(err.is_cancelled(), "{err:?}");
    drop(conn);

    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{report}");
    assert_eq!(report.effect_unknown(), 1);
    let effect = &report.pending_effects()[0];
    assert_eq!(effect.effect_id(), "order-1");
    assert_eq!(effect.payload_digest_str(), Some("sha256:0f1e"));
    assert_eq!(
        effect.provider_handle_str(),
        Some(format!("postgres backend pid {pid}").as_str())
    );

    wait_not_active(&mut obs, pid, IDLE_WITHIN).await;
    assert_eq!(
        count_orders(&db).await,
        0,
        "the server cancel stopped the INSERT"
    );
}

/// `statement_timeout` is the remaining budget for each statement, never looser than the
/// session's own default, and the default is back once the connection is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_is_the_remaining_budget_and_reset_on_release() {
    let Some(pg) = PgCluster::start("statement_timeout_is_the_remaining_budget") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    const SHOW: &str = "SELECT setting::int8 FROM pg_settings WHERE name = 'statement_timeout'";

    let scope = Scope::with_timeout(Duration::from_secs(5));
    let mut conn = db.acquire(&scope).await.unwrap();
    let ms: i64 = conn
        .fetch_one(ChildSpec::read_only("show"), sqlx::query(SHOW))
        .await
        .unwrap()
        .get(0);
    assert!((4000..=5000).contains(&ms), "statement_timeout = {ms} ms");
    conn.release().await;

    let default: i64 = sqlx::query_scalar(SHOW).fetch_one(db.pool()).await.unwrap();
    assert_eq!(default, 0, "reset to the session default on release");

    // A session default tighter than the budget wins: budgets never loosen a DBA's limit.
    let tight = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(pg.options().options([("statement_timeout", "1500")]))
        .await
        .unwrap();
    let tight = GuardedPool::new(tight);
    let ms: i64 = tight
        .fetch_one(&scope, ChildSpec::read_only("show"), sqlx::query(SHOW))
        .await
        .unwrap()
        .get(0);
    assert_eq!(ms, 1500);
    // An unbounded scope keeps the session default.
    let ms: i64 = tight
        .fetch_one(
            &Scope::new(),
            ChildSpec::read_only("show"),
            sqlx::query(SHOW),
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ms, 1500);
}

/// The server stops on its own at the budget even when the client neither cancels nor reads
/// (as if this process hung or died): the guard's `statement_timeout` does it.
///
/// What is checked is what each side knows on its own clock. The server records why it stopped
/// the statement (its statement timeout, not a cancel request) and with which timeout it ran;
/// the test checks that timeout covered all of the budget still left when the statement was
/// seen running. Comparing the moment the server stopped with the scope's deadline directly
/// would compare two clocks: PostgreSQL times `statement_timeout` on the wall clock from the
/// statement's start, a fraction of a millisecond after the guard read the remaining budget
/// on the monotonic clock, and the two clocks of a freshly booted machine disagree by more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stops_on_its_own_when_the_client_forgets_the_statement() {
    let Some(pg) = PgCluster::start("server_stops_on_its_own") else {
        return;
    };
    let db = guarded(&pg, 2).await;
    let mut obs = observer(&pg).await;

    // Real time on a real server: the budget leaves room for a loaded machine to get the
    // statement running before it ends (it failed once at 400 ms with a build running).
    let budget = Duration::from_secs(2);
    let scope = Scope::with_timeout(budget);
    let deadline = scope.deadline().unwrap();
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;
    let mut call = Box::pin(async move {
        conn.fetch_one(
            ChildSpec::read_only("sleep"),
            sqlx::query("SELECT pg_sleep(30)"),
        )
        .await
    });
    tokio::select! {
        _ = &mut call => panic!("pg_sleep(30) finished early"),
        () = wait_active(&mut obs, pid, "pg_sleep(30)") => {}
    }
    // At most this much of the budget was left when the guard armed the statement.
    let left_when_running = deadline.saturating_duration_since(Instant::now());
    // Nobody will ever poll, drop or cancel this call again: no client-side cancel happens.
    std::mem::forget(call);

    let (_, state) = wait_not_active(&mut obs, pid, Duration::from_secs(10)).await;
    let stopped = Instant::now();
    assert_eq!(state, "idle");

    let log = pg.log();
    let timeout = statement_timeout_before(&log, pid, "SELECT pg_sleep(30)");
    assert!(
        timeout >= left_when_running && timeout <= budget,
        "pg_sleep ran with statement_timeout {timeout:?}: not the rest of the budget \
         (between {left_when_running:?} and {budget:?})"
    );
    let own = format!("[{pid}] ERROR:  canceling statement due to statement timeout");
    assert!(
        log.contains(&own),
        "the server did not stop the statement with its own timeout:\n{log}"
    );
    assert!(
        !log.contains(&format!(
            "[{pid}] ERROR:  canceling statement due to user request"
        )),
        "a cancel request reached the server: the client was to stay silent"
    );
    eprintln!(
        "forgotten statement ran with statement_timeout {timeout:?}, stopped by the server \
         {:?} after the deadline (monotonic clock)",
        stopped.saturating_duration_since(deadline)
    );
}

/// The `statement_timeout` the guard set on backend `pid` for the statement `sql`: the first
/// parameter of the last arming statement the server logged before it executed `sql`.
fn statement_timeout_before(log: &str, pid: i32, sql: &str) -> Duration {
    let prefix = format!("[{pid}] ");
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&prefix)).collect();
    let run = lines
        .iter()
        .position(|l| l.contains("LOG:  execute") && l.ends_with(sql))
        .unwrap_or_else(|| panic!("the server never logged {sql}:\n{log}"));
    let arm = lines[..run]
        .iter()
        .rposition(|l| l.contains("set_config('statement_timeout'"))
        .unwrap_or_else(|| panic!("no statement armed {sql}:\n{log}"));
    let ms: u64 = lines[arm + 1]
        .split_once("parameters: $1 = '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or_else(|| panic!("no timeout in {:?}", lines[arm + 1]));
    Duration::from_millis(ms)
}

/// A transaction block the scope opened and never committed (here: the scope was cancelled
/// before its `COMMIT`, which was refused) is rolled back when the connection is released. Not
/// returned to the pool open, where the next user's statements would run inside it and their
/// `COMMIT` would commit the cancelled scope's write after `quiesce` reported it stable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_transaction_is_rolled_back_on_release_not_committed_by_the_next_user() {
    let Some(pg) = PgCluster::start("open_transaction_rolled_back_on_release") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;

    let report = leave_a_block_open(&db).await;
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");

    // The next user of the pool's only connection runs a transaction of its own.
    let next = Scope::with_timeout(Duration::from_secs(5));
    let mut conn = db.acquire(&next).await.unwrap();
    for (name, sql) in [
        ("begin", "BEGIN"),
        ("insert", "INSERT INTO orders VALUES ('o-2')"),
        ("commit", "COMMIT"),
    ] {
        conn.execute(ChildSpec::idempotent(name, "o-2"), sqlx::query(sql))
            .await
            .unwrap();
    }
    conn.release().await;

    let mut obs = observer(&pg).await;
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM orders ORDER BY id")
        .fetch_all(&mut obs)
        .await
        .unwrap();
    assert_eq!(
        ids,
        ["o-2"],
        "the cancelled scope's uncommitted INSERT was committed by the next user"
    );
}

/// After a statement fails inside a transaction block, the block is in the failed state and
/// the server accepts only its end: the `ROLLBACK` sent through the guard reaches the server
/// and succeeds (the guard's `statement_timeout` arming, refused in that state, does not stop
/// it), and the connection goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_after_an_error_in_a_transaction_block_reaches_the_server() {
    let Some(pg) = PgCluster::start("rollback_after_an_error_in_a_block") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;

    let scope = Scope::with_timeout(Duration::from_secs(5));
    let mut conn = db.acquire(&scope).await.unwrap();
    conn.execute(ChildSpec::read_only("begin"), sqlx::query("BEGIN"))
        .await
        .unwrap();
    conn.execute(
        ChildSpec::idempotent("insert", "o-1"),
        sqlx::query("INSERT INTO orders VALUES ('o-1')"),
    )
    .await
    .unwrap();
    let err = conn
        .execute(
            ChildSpec::idempotent("insert-bad", "o-2"),
            sqlx::query("INSERT INTO no_such_table VALUES ('o-2')"),
        )
        .await
        .unwrap_err();
    assert!(err.is_database(), "{err:?}");
    conn.execute(ChildSpec::read_only("rollback"), sqlx::query("ROLLBACK"))
        .await
        .expect("ROLLBACK of a failed block");
    let one: i32 = conn
        .fetch_one(ChildSpec::read_only("after"), sqlx::query("SELECT 1"))
        .await
        .expect("the connection serves after the rollback")
        .get(0);
    assert_eq!(one, 1);
    conn.release().await;
    assert_eq!(count_orders(&db).await, 0, "rolled back");

    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!((report.succeeded(), report.failed()), (4, 1), "{report}");
}

/// A budget longer than PostgreSQL's largest `statement_timeout` (`INT_MAX` ms, about 24.8
/// days) is capped there, not sent as is: statements under a long-lived scope run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_beyond_the_largest_statement_timeout_is_capped() {
    let Some(pg) = PgCluster::start("budget_beyond_the_largest_statement_timeout") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    let scope = Scope::with_timeout(Duration::from_secs(40 * 24 * 3600));
    let ms: i64 = db
        .fetch_one(
            &scope,
            ChildSpec::read_only("show"),
            sqlx::query("SELECT setting::int8 FROM pg_settings WHERE name = 'statement_timeout'"),
        )
        .await
        .expect("a statement under a 40-day budget")
        .get(0);
    assert_eq!(ms, i64::from(i32::MAX));
}

/// `release` waits at most the clean-up budget for the connection's reset: a server that
/// stops answering (here its backend is stopped with SIGSTOP) costs the caller that budget,
/// and the connection is closed instead of returned to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_waits_at_most_the_cleanup_budget() {
    let Some(pg) = PgCluster::start("release_waits_at_most_the_cleanup_budget") else {
        return;
    };
    const BUDGET: Duration = Duration::from_millis(300);
    let db = guarded(&pg, 1).await.cleanup_budget(BUDGET);

    let scope = Scope::with_timeout(Duration::from_secs(30));
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;
    let stopped = Stopped::stop(pid);
    let start = Instant::now();
    let released = tokio::time::timeout(Duration::from_secs(5), conn.release()).await;
    let took = start.elapsed();
    drop(stopped);
    assert!(released.is_ok(), "release still waiting after 5 s");
    assert!(took <= BUDGET + SLACK, "release took {took:?}");
    assert_eq!(db.pool().size(), 0, "closed, not returned to the pool");

    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
}

/// A write whose scope is cancelled while the guard is still arming `statement_timeout` (here
/// the arming statement waits for a lock on `pg_settings`) was never sent: its receipt is
/// `Cancelled`, not `EffectUnknown`, and the report asks for no reconciliation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_cancelled_while_arming_was_never_sent_and_is_cancelled() {
    let Some(pg) = PgCluster::start("write_cancelled_while_arming") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;

    let scope = Scope::new();
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;

    let mut locker = observer(&pg).await;
    sqlx::raw_sql("BEGIN; LOCK TABLE pg_catalog.pg_settings IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let canceller = tokio::spawn({
        let scope = scope.clone();
        let mut obs = observer(&pg).await;
        async move {
            wait_active(&mut obs, pid, "set_config").await; // arming, blocked by the lock
            scope.cancel();
        }
    });
    let err = conn
        .execute(
            ChildSpec::side_effecting("insert", "o-1"),
            sqlx::query("INSERT INTO orders VALUES ('o-1')"),
        )
        .await
        .unwrap_err();
    canceller.await.unwrap();
    assert!(err.is_cancelled(), "{err:?}");
    drop(conn);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut locker)
        .await
        .unwrap();

    let report = scope.quiesce().await;
    assert_eq!(report.effect_unknown(), 0, "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!(count_orders(&db).await, 0);
}

/// A write whose session dies mid-flight (here an administrator terminates its backend after
/// the first statement of the string has committed) ends `EffectUnknown`, not `Failed`: the
/// client cannot know what the server did before the connection went, and here it did commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_whose_session_dies_mid_flight_is_effect_unknown() {
    let Some(pg) = PgCluster::start("write_whose_session_dies_mid_flight") else {
        return;
    };
    let db = guarded(&pg, 1).await;
    create_orders(&db).await;

    let scope = Scope::with_timeout(Duration::from_secs(30));
    let mut conn = db.acquire(&scope).await.unwrap();
    let pid = pid_of(&mut conn).await;
    let terminator = tokio::spawn({
        let mut obs = observer(&pg).await;
        async move {
            wait_active(&mut obs, pid, "pg_sleep(10)").await;
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&mut obs)
                .await
                .unwrap();
        }
    });
    let err = conn
        .execute(
            ChildSpec::side_effecting("insert", "o-1"),
            sqlx::raw_sql("BEGIN; INSERT INTO orders VALUES ('o-1'); COMMIT; SELECT pg_sleep(10)"),
        )
        .await
        .unwrap_err();
    terminator.await.unwrap();
    assert!(err.is_database(), "{err:?}");
    drop(conn);

    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(count_orders(&db).await, 1, "the INSERT committed");
    assert_eq!(report.failed(), 0, "{report}");
    assert_eq!(report.effect_unknown(), 1, "{report}");
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{report}");
}

/// The default clean-up budget ends before the default grace period (a clean-up cut at its
/// budget ends with its own receipt, not quarantined), and holds a cancel's worst case on a
/// control connection not open yet: two connect attempts, then a repeated cancel.
#[test]
fn the_default_cleanup_fits_the_control_connection_and_ends_within_the_grace() {
    use cancel_scope::integrations::sqlx::{
        DEFAULT_CLEANUP_BUDGET, DEFAULT_CONTROL_CONNECT_TIMEOUT,
    };
    assert!(DEFAULT_CLEANUP_BUDGET < cancel_scope::DEFAULT_GRACE);
    let recancel_every = Duration::from_millis(100);
    assert!(2 * DEFAULT_CONTROL_CONNECT_TIMEOUT + recancel_every < DEFAULT_CLEANUP_BUDGET);
}
