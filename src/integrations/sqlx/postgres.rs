//! PostgreSQL: `statement_timeout` from the budget, and the server-side cancel.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::pool::PoolConnection;
use ::sqlx::postgres::{PgConnectOptions, PgDatabaseError, PgQueryResult, PgRow, PgSeverity};
use ::sqlx::{Connection, Execute, Executor, PgConnection, Pool, Postgres, Row};

use super::{sealed, Backend, BoxFuture, CloseOnDrop, Release};

/// Sets `statement_timeout` for the next statement and reads the backend pid, in one round
/// trip. `$1` is the budget in whole milliseconds (NULL: unbounded). The session's own default
/// (`reset_val`: server, database, role or connect options) is kept when it is tighter, and
/// restored when the scope is unbounded: a budget never loosens a limit the DBA set.
const ARM: &str = "SELECT pg_backend_pid(), set_config('statement_timeout', \
    CASE WHEN $1::int8 IS NULL THEN reset_val \
         WHEN reset_val::int8 = 0 THEN $1::int8::text \
         ELSE least($1::int8, reset_val::int8)::text END, false) \
    FROM pg_settings WHERE name = 'statement_timeout'";

/// How often the clean-up repeats `pg_cancel_backend` while the backend has not answered: a
/// cancel that reaches the server before the statement started is ignored.
const RECANCEL_EVERY: Duration = Duration::from_millis(100);

/// The control connection that sends `pg_cancel_backend` / `pg_terminate_backend`.
pub struct PgPoolState {
    options: Arc<PgConnectOptions>,
    control: tokio::sync::Mutex<Option<PgConnection>>,
}

impl fmt::Debug for PgPoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgPoolState").finish_non_exhaustive()
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Cancel,
    Terminate,
}

impl PgPoolState {
    /// Sends `signal` to backend `pid` through the control connection, connecting (once more
    /// after a failure) as needed. Returns whether the server found the backend.
    async fn signal(&self, signal: Signal, pid: i32) -> Result<bool, ::sqlx::Error> {
        let sql = match signal {
            Signal::Cancel => "SELECT pg_cancel_backend($1)",
            Signal::Terminate => "SELECT pg_terminate_backend($1)",
        };
        let mut control = self.control.lock().await;
        let mut last = None;
        for _ in 0..2 {
            let conn = match control.as_mut() {
                Some(conn) => conn,
                None => match PgConnection::connect_with(&self.options).await {
                    Ok(conn) => control.insert(conn),
                    Err(e) => {
                        last = Some(e);
                        continue;
                    }
                },
            };
            // (Executor methods on the concrete connection: their boxed futures are `Send`
            // for the clean-up task, which the generic query builders' are not.)
            match conn
                .fetch_one(::sqlx::query(sql).bind(pid))
                .await
                .and_then(|row| row.try_get::<bool, _>(0))
            {
                Ok(found) => return Ok(found),
                Err(e) => {
                    // A broken control connection: open a new one.
                    *control = None;
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(::sqlx::Error::PoolClosed))
    }
}

/// The backend pid, once the first statement armed the connection.
#[derive(Debug)]
pub struct PgConnState {
    pid: Option<i32>,
    /// Whether `statement_timeout` was set in this session (then it is reset on release).
    armed: bool,
}

impl sealed::Sealed for Postgres {}

impl Backend for Postgres {
    type PoolState = PgPoolState;
    type ConnState = PgConnState;

    fn pool_state(pool: &Pool<Self>) -> PgPoolState {
        PgPoolState {
            options: pool.connect_options(),
            control: tokio::sync::Mutex::new(None),
        }
    }

    fn on_acquire(
        _conn: &mut PoolConnection<Self>,
    ) -> impl Future<Output = Result<PgConnState, ::sqlx::Error>> + Send + '_ {
        // The pid comes with the first arming; nothing to do before.
        std::future::ready(Ok(PgConnState {
            pid: None,
            armed: false,
        }))
    }

    async fn arm(
        conn: &mut PgConnection,
        state: &mut PgConnState,
        budget: Option<Duration>,
    ) -> Result<(), ::sqlx::Error> {
        let ms = budget.map(timeout_ms);
        state.armed = true;
        match conn.fetch_one(::sqlx::query(ARM).bind(ms)).await {
            Ok(row) => {
                state.pid = Some(row.try_get::<i32, _>(0)?);
                Ok(())
            }
            // A failed transaction block refuses every statement but its end (`ROLLBACK`,
            // `COMMIT`, `ROLLBACK TO SAVEPOINT`), which it runs at once: send the statement
            // unarmed, or the caller could never end the block.
            Err(e) if in_failed_block(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn interrupt(_state: &PgConnState) {
        // Asynchronous: the clean-up sends `pg_cancel_backend`.
    }

    fn provider_handle(state: &PgConnState) -> Option<String> {
        state.pid.map(|pid| format!("postgres backend pid {pid}"))
    }

    fn is_query_canceled(err: &::sqlx::Error) -> bool {
        // 57014 query_canceled: statement_timeout or a cancel request.
        err.as_database_error()
            .and_then(|e| e.code())
            .is_some_and(|code| code == "57014")
    }

    fn is_session_lost(err: &::sqlx::Error) -> bool {
        use ::sqlx::Error as E;
        match err {
            E::Io(_) | E::Tls(_) | E::Protocol(_) => true,
            // ERROR aborts the statement (and its transaction); FATAL and PANIC end the
            // session, possibly after a commit the client never heard of.
            E::Database(e) => e
                .try_downcast_ref::<PgDatabaseError>()
                .is_some_and(|e| matches!(e.severity(), PgSeverity::Fatal | PgSeverity::Panic)),
            _ => false,
        }
    }

    fn release(
        pool: &Arc<PgPoolState>,
        conn: PoolConnection<Self>,
        state: PgConnState,
        abandoned: bool,
    ) -> Release<Self> {
        if !abandoned && !state.armed {
            return Release::Return(conn);
        }
        let pool = pool.clone();
        let mut conn = CloseOnDrop::new(conn);
        Release::CleanUp(Box::pin(async move {
            let clean = if abandoned {
                stop_statement(&pool, conn.conn(), state.pid).await
            } else {
                true
            };
            if clean && reset(conn.conn()).await {
                conn.release();
                return;
            }
            // Not clean: make sure the server stops, then close (on drop of `conn`).
            if let Some(pid) = state.pid {
                let _ = pool.signal(Signal::Terminate, pid).await;
            }
        }))
    }

    fn execute<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut PgConnection,
        query: E,
    ) -> BoxFuture<'e, Result<PgQueryResult, ::sqlx::Error>> {
        conn.execute(query)
    }

    fn fetch_all<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut PgConnection,
        query: E,
    ) -> BoxFuture<'e, Result<Vec<PgRow>, ::sqlx::Error>> {
        conn.fetch_all(query)
    }

    fn fetch_one<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut PgConnection,
        query: E,
    ) -> BoxFuture<'e, Result<PgRow, ::sqlx::Error>> {
        conn.fetch_one(query)
    }

    fn fetch_optional<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut PgConnection,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, ::sqlx::Error>> {
        conn.fetch_optional(query)
    }
}

/// The largest `statement_timeout` the server accepts (`INT_MAX` ms, about 24.8 days).
const MAX_TIMEOUT_MS: i64 = i32::MAX as i64;

/// A budget as `statement_timeout` milliseconds: rounded up, at least 1 (0 would mean "no
/// timeout"), and at most [`MAX_TIMEOUT_MS`] (a longer budget would be refused by the server,
/// and with it every statement; the cap stays within the budget).
fn timeout_ms(budget: Duration) -> i64 {
    let ms = budget.as_nanos().div_ceil(1_000_000).max(1);
    i64::try_from(ms).map_or(MAX_TIMEOUT_MS, |ms| ms.min(MAX_TIMEOUT_MS))
}

/// Stops the statement that was cut off on `conn` and drains the connection to
/// `ReadyForQuery`. Returns whether the connection is clean.
async fn stop_statement(
    pool: &PgPoolState,
    conn: &mut PoolConnection<Postgres>,
    pid: Option<i32>,
) -> bool {
    let Some(pid) = pid else {
        // Cut off while arming (the pid is not known yet): the arming statement is short,
        // and the drain waits for it.
        return drain(conn).await;
    };
    let mut drained = pin!(drain(conn));
    loop {
        // If the statement already ended, the backend is idle and ignores the cancel.
        let _ = pool.signal(Signal::Cancel, pid).await;
        if let Ok(clean) = tokio::time::timeout(RECANCEL_EVERY, drained.as_mut()).await {
            return clean;
        }
    }
}

/// Reads until the server is ready for a query. The cut-off statement's own error (usually
/// 57014 query_canceled) comes first; each ping consumes what is queued up to the next
/// `ReadyForQuery`.
async fn drain(conn: &mut PgConnection) -> bool {
    for _ in 0..4 {
        match conn.ping().await {
            Ok(()) => return true,
            Err(::sqlx::Error::Database(_)) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// Puts the session default of `statement_timeout` back and rolls back a transaction block
/// that the scope's statements left open (a raw `BEGIN` whose `COMMIT` was refused after a
/// cancel, never sent, or cut off) or that the cancel left failed. Returns whether the
/// connection is clean.
///
/// An open block must not go back to the pool: the next user's statements would run inside it,
/// and their `COMMIT` would commit this scope's writes after its `quiesce` (invariant 6).
async fn reset(conn: &mut PgConnection) -> bool {
    // One round trip when no block is open. A simple-protocol query string has one statement
    // timestamp; outside a block, the transaction it starts began at that same timestamp
    // (PostgreSQL copies it), while a block began at an earlier statement. In a block the
    // rollback undoes the `RESET` too, so it is repeated after it.
    const RESET: &str = "SELECT statement_timestamp() <> transaction_timestamp(); \
                         RESET statement_timeout";
    const ROLLBACK: &str = "ROLLBACK; RESET statement_timeout";
    let in_block = match conn
        .fetch_one(::sqlx::raw_sql(RESET))
        .await
        .and_then(|row| row.try_get::<bool, _>(0))
    {
        Ok(in_block) => in_block,
        // The cancel (or an error) aborted a transaction block.
        Err(e) if in_failed_block(&e) => true,
        Err(_) => return false,
    };
    !in_block || conn.execute(::sqlx::raw_sql(ROLLBACK)).await.is_ok()
}

/// Whether `err` is 25P02 in_failed_sql_transaction: the statement was refused because the
/// transaction block had failed.
fn in_failed_block(err: &::sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "25P02")
}

#[cfg(test)]
mod tests {
    use super::timeout_ms;
    use std::time::Duration;

    #[test]
    fn timeout_rounds_up_is_never_zero_and_fits_the_server() {
        assert_eq!(timeout_ms(Duration::from_millis(200)), 200);
        assert_eq!(timeout_ms(Duration::from_micros(199_001)), 200);
        assert_eq!(timeout_ms(Duration::from_nanos(1)), 1);
        assert_eq!(timeout_ms(Duration::ZERO), 1);
        assert_eq!(
            timeout_ms(Duration::from_millis(2_147_483_647)),
            2_147_483_647
        );
        assert_eq!(
            timeout_ms(Duration::from_millis(2_147_483_648)),
            2_147_483_647
        );
        assert_eq!(timeout_ms(Duration::MAX), 2_147_483_647);
    }
}
