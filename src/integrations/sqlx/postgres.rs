//! PostgreSQL: `statement_timeout` from the budget, and the server-side cancel.
//!
//! Every statement of the guard's own is written against `pg_catalog` by name — functions,
//! views, types and operators (`OPERATOR(pg_catalog.=)`) — so that no object of a user's
//! `search_path` (a schema listed before `pg_catalog`, a shadowing `pg_cancel_backend`) can
//! stand in for it.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::pool::PoolConnection;
use ::sqlx::postgres::{PgConnectOptions, PgDatabaseError, PgQueryResult, PgRow, PgSeverity};
use ::sqlx::{Connection, Execute, Executor, PgConnection, Pool, Postgres, Row};

use super::{sealed, Backend, BoxFuture, CloseOnDrop, Cut, GuardedPool, Release};
use crate::scope::Note;

mod undelivered;
pub use undelivered::UndeliveredCancel;

/// When a backend started, as whole microseconds since the epoch: with its pid, what names
/// one server session (a pid can be reused by a later session; its start cannot). The same
/// expression is read when the connection is armed and checked when a signal is sent.
macro_rules! backend_start {
    ($table:literal) => {
        concat!(
            "(EXTRACT(EPOCH FROM ",
            $table,
            ".backend_start) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8"
        )
    };
}

/// Sets `statement_timeout` for the next statement and reads the backend pid, in one round
/// trip. `$1` is the budget in whole milliseconds (NULL: unbounded); `$2` the ceiling found by
/// the acquisition's first statement (NULL on that first statement: then the session's
/// current setting is the ceiling, and the backend's start time is read too). The ceiling —
/// whatever the session had before the guard touched it: server, database, role, connect
/// options or a `SET` in the pool's `after_connect` — stays the limit: a budget only lowers
/// it, and an unbounded scope keeps it. Returns the pid, the ceiling, the start time (first
/// statement only) and the timeout set.
const ARM: &str = concat!(
    "SELECT pg_catalog.pg_backend_pid(), c.ceiling, \
       CASE WHEN $2::pg_catalog.int8 IS NULL THEN (SELECT ",
    backend_start!("a"),
    " FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a) END, \
       t.ms, pg_catalog.set_config('statement_timeout', t.ms::pg_catalog.text, false) \
     FROM (SELECT COALESCE($2::pg_catalog.int8, s.setting::pg_catalog.int8) AS ceiling \
           FROM pg_catalog.pg_settings s \
           WHERE s.name OPERATOR(pg_catalog.=) 'statement_timeout') c, \
     LATERAL (SELECT CASE WHEN $1::pg_catalog.int8 IS NULL THEN c.ceiling \
                          WHEN c.ceiling OPERATOR(pg_catalog.=) 0 THEN $1::pg_catalog.int8 \
                          ELSE LEAST($1::pg_catalog.int8, c.ceiling) END AS ms) t"
);

/// `pg_cancel_backend` for exactly one session: the backend with pid `$1` that started at
/// `$2`. No row: that session is gone (its pid may now belong to another one, which is left
/// alone).
const CANCEL: &str = concat!(
    "SELECT pg_catalog.pg_cancel_backend(a.pid) FROM pg_catalog.pg_stat_activity a \
     WHERE a.pid OPERATOR(pg_catalog.=) $1 AND ",
    backend_start!("a"),
    " OPERATOR(pg_catalog.=) $2"
);

/// `pg_terminate_backend` for exactly one session, as [`CANCEL`].
const TERMINATE: &str = concat!(
    "SELECT pg_catalog.pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a \
     WHERE a.pid OPERATOR(pg_catalog.=) $1 AND ",
    backend_start!("a"),
    " OPERATOR(pg_catalog.=) $2"
);

/// How often the clean-up repeats the cancel while the backend has not answered: a cancel
/// that reaches the server before the statement started is ignored.
const RECANCEL_EVERY: Duration = Duration::from_millis(100);

/// How long opening the control connection may take by default (see
/// [`GuardedPool::control_connect_timeout`]): two attempts and a repeated cancel fit in the
/// default clean-up budget ([`DEFAULT_CLEANUP_BUDGET`](super::DEFAULT_CLEANUP_BUDGET)).
pub const DEFAULT_CONTROL_CONNECT_TIMEOUT: Duration = Duration::from_millis(150);

/// The `application_name` of the control connection.
const CONTROL_APPLICATION_NAME: &str = "cancel-scope control";

/// The control connection that sends `pg_cancel_backend` / `pg_terminate_backend`.
pub struct PgPoolState {
    options: Arc<PgConnectOptions>,
    connect_timeout: Duration,
    control: tokio::sync::Mutex<Option<PgConnection>>,
}

impl fmt::Debug for PgPoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgPoolState")
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Cancel,
    Terminate,
}

/// One server session: its backend pid and when it started.
#[derive(Clone, Copy, Debug)]
struct Session {
    pid: i32,
    start: i64,
}

impl PgPoolState {
    fn new(options: Arc<PgConnectOptions>, connect_timeout: Duration) -> Self {
        // Named for whoever reads `pg_stat_activity`: an idle session of the pool's role
        // that is not in the pool.
        let options = Arc::new(
            (*options)
                .clone()
                .application_name(CONTROL_APPLICATION_NAME),
        );
        PgPoolState {
            options,
            connect_timeout,
            control: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends `signal` to `session` through the control connection, connecting (once more
    /// after a failure) as needed, each connect bounded by the connect timeout. Returns
    /// whether the session was found (and signalled), or why the signal could not be sent.
    async fn signal(&self, signal: Signal, session: Session) -> Result<bool, String> {
        let sql = match signal {
            Signal::Cancel => CANCEL,
            Signal::Terminate => TERMINATE,
        };
        let mut control = self.control.lock().await;
        let mut last = String::new();
        for _ in 0..2 {
            let conn = match control.as_mut() {
                Some(conn) => conn,
                None => {
                    let connect = PgConnection::connect_with(&self.options);
                    match tokio::time::timeout(self.connect_timeout, connect).await {
                        Ok(Ok(conn)) => control.insert(conn),
                        Ok(Err(e)) => {
                            last = format!("control connection: {e}");
                            continue;
                        }
                        Err(_) => {
                            last = format!(
                                "control connection: no connection within {:?}",
                                self.connect_timeout
                            );
                            continue;
                        }
                    }
                }
            };
            // (Executor methods on the concrete connection: their boxed futures are `Send`
            // for the clean-up task, which the generic query builders' are not.)
            match conn
                .fetch_optional(::sqlx::query(sql).bind(session.pid).bind(session.start))
                .await
                .and_then(|row| row.map(|row| row.try_get::<bool, _>(0)).transpose())
            {
                // `false`: the server could not signal it (a warning, not an error).
                Ok(Some(false)) => {
                    return Err(format!("the server did not signal backend {}", session.pid))
                }
                Ok(found) => return Ok(found.is_some()),
                // Refused (e.g. not allowed to signal that role): a new connection would be
                // refused too.
                Err(::sqlx::Error::Database(e)) => return Err(format!("{e}")),
                Err(e) => {
                    // A broken control connection: open a new one.
                    *control = None;
                    last = format!("control connection: {e}");
                }
            }
        }
        Err(last)
    }
}

/// What the guard learned of the session from its first statement.
#[derive(Debug)]
pub struct PgConnState {
    pid: Option<i32>,
    /// When the backend started (with `pid`, the session a cancel may reach).
    start: Option<i64>,
    /// The session's `statement_timeout` before the guard set it (ms; 0: none): the
    /// ceiling of every budget-derived timeout, and what the release puts back.
    ceiling: Option<i64>,
    /// The `statement_timeout` the last arming set (ms; 0: none).
    timeout_ms: Option<i64>,
    /// Whether `statement_timeout` was set in this session (then it is restored on release).
    armed: bool,
    /// The last arming was refused because the transaction block is aborted.
    aborted: bool,
}

impl PgConnState {
    fn session(&self) -> Option<Session> {
        Some(Session {
            pid: self.pid?,
            start: self.start?,
        })
    }
}

impl GuardedPool<Postgres> {
    /// How long opening the control connection that sends server-side cancels may take
    /// (default [`DEFAULT_CONTROL_CONNECT_TIMEOUT`]); a cancel that could not be sent in time
    /// is tried again every 100 ms within the clean-up budget, and reported if it never got
    /// through ([`UndeliveredCancel`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// let pool = sqlx::PgPool::connect_lazy("postgres://localhost/app").unwrap();
    /// let db = GuardedPool::new(pool).control_connect_timeout(Duration::from_millis(200));
    /// # drop(db);
    /// # }
    /// ```
    pub fn control_connect_timeout(self, timeout: Duration) -> Self {
        self.with(|s| {
            s.state = Arc::new(PgPoolState::new(s.pool.connect_options(), timeout));
        })
    }
}

/// What the clean-up learned of a cut-off statement; records the statement's receipt (and
/// an undelivered cancel) when dropped, also when the clean-up budget cuts it short.
struct Verdict {
    cut: Option<Cut>,
    /// A cancel or terminate reached the exact session, or the session was found gone.
    reached: bool,
    /// The connection answered (`ReadyForQuery`): the statement ended.
    drained: bool,
    /// Why the last signal could not be sent.
    error: Option<String>,
    pid: Option<i32>,
    timeout_ms: Option<i64>,
}

impl Verdict {
    fn note(&mut self, sent: Result<bool, String>) {
        match sent {
            Ok(_) => self.reached = true,
            Err(e) => self.error = Some(e),
        }
    }
}

impl Drop for Verdict {
    fn drop(&mut self) {
        let Some(cut) = self.cut.take() else {
            return;
        };
        if !self.reached && (self.error.is_some() || !self.drained) {
            let error = self.error.take().unwrap_or_else(|| match self.pid {
                None => "the statement was cut off before the session's pid was known".into(),
                Some(_) => "the clean-up budget ran out before a cancel was sent".into(),
            });
            let undelivered = UndeliveredCancel {
                statement: cut.name(),
                backend_pid: self.pid,
                statement_timeout: self
                    .timeout_ms
                    .filter(|ms| *ms > 0)
                    .map(|ms| Duration::from_millis(ms.unsigned_abs())),
                error,
            };
            cut.scope().add_note(Note::new(Arc::new(undelivered)));
        }
        if self.drained || self.reached {
            cut.finish();
        } else {
            cut.finish_unstopped();
        }
    }
}

impl sealed::Sealed for Postgres {}

impl Backend for Postgres {
    type PoolState = PgPoolState;
    type ConnState = PgConnState;

    fn pool_state(pool: &Pool<Self>) -> PgPoolState {
        PgPoolState::new(pool.connect_options(), DEFAULT_CONTROL_CONNECT_TIMEOUT)
    }

    fn on_acquire(
        _conn: &mut PoolConnection<Self>,
    ) -> impl Future<Output = Result<PgConnState, ::sqlx::Error>> + Send + '_ {
        // The session comes with the first arming; nothing to do before.
        std::future::ready(Ok(PgConnState {
            pid: None,
            start: None,
            ceiling: None,
            timeout_ms: None,
            armed: false,
            aborted: false,
        }))
    }

    async fn arm(
        conn: &mut PgConnection,
        state: &mut PgConnState,
        budget: Option<Duration>,
    ) -> Result<(), ::sqlx::Error> {
        let ms = budget.map(timeout_ms);
        state.armed = true;
        state.aborted = false;
        match conn
            .fetch_one(::sqlx::query(ARM).bind(ms).bind(state.ceiling))
            .await
        {
            Ok(row) => {
                state.pid = Some(row.try_get::<i32, _>(0)?);
                state.ceiling = Some(row.try_get::<i64, _>(1)?);
                if let Some(start) = row.try_get::<Option<i64>, _>(2)? {
                    state.start = Some(start);
                }
                state.timeout_ms = Some(row.try_get::<i64, _>(3)?);
                Ok(())
            }
            // A failed transaction block refuses every statement but its end (`ROLLBACK`,
            // `COMMIT`, `ROLLBACK TO SAVEPOINT`), which it runs at once: send the statement
            // unarmed, or the caller could never end the block.
            Err(e) if in_failed_block(&e) => {
                state.aborted = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn block_aborted(state: &PgConnState) -> bool {
        // Nothing runs between the arming and the statement it armed.
        state.aborted
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
        cut: Option<Cut>,
    ) -> Release<Self> {
        if cut.is_none() && !state.armed {
            return Release::Return(conn);
        }
        let pool = pool.clone();
        let mut conn = CloseOnDrop::new(conn);
        Release::CleanUp(Box::pin(async move {
            let session = state.session();
            // The connection stays here, out of the pool, until every signal sent for it has
            // answered: a cancel still on its way when the connection was handed on could
            // stop the next user's statement.
            let mut verdict = cut.map(|cut| Verdict {
                cut: Some(cut),
                reached: false,
                drained: false,
                error: None,
                pid: state.pid,
                timeout_ms: state.timeout_ms,
            });
            let clean = match verdict.as_mut() {
                Some(verdict) => stop_statement(&pool, conn.conn(), session, verdict).await,
                None => true,
            };
            if clean && reset(conn.conn(), state.ceiling).await {
                drop(verdict);
                conn.release();
                return;
            }
            // Not clean: make sure the server stops, then close (on drop of `conn`).
            if let Some(session) = session {
                let sent = pool.signal(Signal::Terminate, session).await;
                if let Some(verdict) = verdict.as_mut() {
                    verdict.note(sent);
                }
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

    fn fetch<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut PgConnection,
        query: E,
    ) -> futures_core::stream::BoxStream<'e, Result<PgRow, ::sqlx::Error>> {
        conn.fetch(query)
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
/// `ReadyForQuery`, noting in `verdict` what it learned. Returns whether the connection is
/// clean.
///
/// Each cancel is awaited before the connection is read again, so when this returns no
/// cancel for the session is still on its way.
async fn stop_statement(
    pool: &PgPoolState,
    conn: &mut PoolConnection<Postgres>,
    session: Option<Session>,
    verdict: &mut Verdict,
) -> bool {
    let Some(session) = session else {
        // Cut off while arming the first statement (the session is not known yet): the
        // arming statement is short, and the drain waits for it.
        verdict.drained = drain(conn).await;
        return verdict.drained;
    };
    let mut drained = pin!(drain(conn));
    loop {
        // If the statement already ended, the backend is idle and ignores the cancel.
        let sent = pool.signal(Signal::Cancel, session).await;
        verdict.note(sent);
        if let Ok(clean) = tokio::time::timeout(RECANCEL_EVERY, drained.as_mut()).await {
            verdict.drained = clean;
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

/// Puts the session's own `statement_timeout` (`ceiling`, as it was before the guard set it)
/// back and rolls back a transaction block that the scope's statements left open (a raw
/// `BEGIN` whose `COMMIT` was refused after a cancel, never sent, or cut off) or that the
/// cancel left failed. Returns whether the connection is clean.
///
/// An open block must not go back to the pool: the next user's statements would run inside it,
/// and their `COMMIT` would commit this scope's writes after its `quiesce` (invariant 6).
async fn reset(conn: &mut PgConnection, ceiling: Option<i64>) -> bool {
    // One round trip when no block is open. A simple-protocol query string has one statement
    // timestamp; outside a block, the transaction it starts began at that same timestamp
    // (PostgreSQL copies it), while a block began at an earlier statement. In a block the
    // rollback undoes the restore too, so it is repeated after it. (`ceiling` is a number the
    // server gave: the simple protocol takes no parameters.)
    let restore = match ceiling {
        Some(ms) => format!("SELECT pg_catalog.set_config('statement_timeout', '{ms}', false)"),
        // Never armed successfully (a failed block): the session's setting is its own.
        None => "SELECT NULL".to_owned(),
    };
    let check = format!(
        "SELECT pg_catalog.statement_timestamp() OPERATOR(pg_catalog.<>) \
         pg_catalog.transaction_timestamp(); {restore}"
    );
    let in_block = match conn
        .fetch_one(::sqlx::raw_sql(&check))
        .await
        .and_then(|row| row.try_get::<bool, _>(0))
    {
        Ok(in_block) => in_block,
        // The cancel (or an error) aborted a transaction block.
        Err(e) if in_failed_block(&e) => true,
        Err(_) => return false,
    };
    let rollback = format!("ROLLBACK; {restore}");
    !in_block || conn.execute(::sqlx::raw_sql(&rollback)).await.is_ok()
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
