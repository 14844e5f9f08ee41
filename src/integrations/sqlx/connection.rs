//! A guarded connection: statements registered, dispatched and stopped through the scope.

use std::fmt;
use std::sync::Arc;

use ::sqlx::pool::PoolConnection;
use ::sqlx::Execute;

use super::pool::{cancelled, check_budget, Shared};
use super::statement::is_commit;
use super::transaction::rollback_to_savepoint;
use super::{effect_unknown, Backend, BoxFuture, Cut, Error, Release, StatementSpec, TypedQuery};
use crate::ChildSpec;
use crate::{Dispatched, Receipt, Scope, Tethered};

/// A pooled connection held for a [`Scope`]: counted as a guard of the scope until dropped
/// or [released](GuardedConnection::release), and every statement on it is a registered
/// child of the scope.
///
/// Made by [`GuardedPool::acquire`](super::GuardedPool::acquire). Each statement method takes
/// the [`ChildSpec`] the statement is registered with: [`ChildSpec::read_only`] for reads,
/// [`ChildSpec::side_effecting`] or [`ChildSpec::idempotent`] for writes (so that a write cut
/// off by a cancel is reported as an unknown effect, never as "no effect").
///
/// Dropping it returns the connection to the pool — after statements, once a transaction
/// block they left open (a raw `BEGIN` whose `COMMIT` never ran) is rolled back and, on
/// PostgreSQL, `RESET statement_timeout` ran, done by a short clean-up child of the scope.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use cancel_scope::integrations::sqlx::GuardedPool;
/// use cancel_scope::{ChildSpec, Lifecycle, Scope};
///
/// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
/// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
/// let scope = Scope::new();
/// let mut conn = db.acquire(&scope).await.unwrap();
/// conn.fetch_all(ChildSpec::read_only("tables"), sqlx::query("SELECT name FROM sqlite_master"))
///     .await
///     .unwrap();
/// assert_eq!(scope.lifecycle(), Lifecycle::Running); // the connection is a guard
/// drop(conn);
/// scope.close();
/// assert_eq!(scope.quiesce().await.succeeded(), 1);
/// # }
/// # }
/// ```
#[must_use = "the connection is returned to the pool when dropped"]
pub struct GuardedConnection<DB: Backend> {
    shared: Arc<Shared<DB>>,
    scope: Scope,
    /// `Some` until the connection leaves the guard (release, drop, or an abandoned statement).
    held: Option<Held<DB>>,
    /// A [`GuardedTransaction`](super::GuardedTransaction) on it was dropped open: the next
    /// statement first rolls it back (the release does, if none comes). Its depth: 0 for the
    /// transaction block, `n` for the savepoint of a transaction nested `n` deep.
    rollback_due: Option<usize>,
}

struct Held<DB: Backend> {
    conn: PoolConnection<DB>,
    state: DB::ConnState,
    /// The scope's count of this guard; released after the connection is handed on.
    unit: Tethered<()>,
}

/// One statement kind: how to run it on a connection.
trait Op<DB: Backend> {
    type Output;
    fn call<'e, 'q: 'e, E: 'q + Execute<'q, DB>>(
        conn: &'e mut DB::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Self::Output, ::sqlx::Error>>;
}

struct ExecuteOp;
struct FetchAll;
struct FetchOne;
struct FetchOptional;

impl<DB: Backend> Op<DB> for ExecuteOp {
    type Output = DB::QueryResult;
    fn call<'e, 'q: 'e, E: 'q + Execute<'q, DB>>(
        conn: &'e mut DB::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Self::Output, ::sqlx::Error>> {
        DB::execute(conn, query)
    }
}

impl<DB: Backend> Op<DB> for FetchAll {
    type Output = Vec<DB::Row>;
    fn call<'e, 'q: 'e, E: 'q + Execute<'q, DB>>(
        conn: &'e mut DB::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Self::Output, ::sqlx::Error>> {
        DB::fetch_all(conn, query)
    }
}

impl<DB: Backend> Op<DB> for FetchOne {
    type Output = DB::Row;
    fn call<'e, 'q: 'e, E: 'q + Execute<'q, DB>>(
        conn: &'e mut DB::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Self::Output, ::sqlx::Error>> {
        DB::fetch_one(conn, query)
    }
}

impl<DB: Backend> Op<DB> for FetchOptional {
    type Output = Option<DB::Row>;
    fn call<'e, 'q: 'e, E: 'q + Execute<'q, DB>>(
        conn: &'e mut DB::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Self::Output, ::sqlx::Error>> {
        DB::fetch_optional(conn, query)
    }
}

/// A statement on the wire. If it is dropped before [`InFlight::land`] — the scope was
/// cancelled, or the caller dropped the call's future — the statement is interrupted and the
/// connection goes to clean-up, with the statement's receipt.
pub(super) struct InFlight<'a, DB: Backend> {
    pub(super) conn: &'a mut GuardedConnection<DB>,
    /// `None` once landed.
    pub(super) dispatched: Option<Dispatched>,
    /// Whether the statement itself may have been sent (not just the arming before it).
    pub(super) sent: bool,
}

impl<DB: Backend> InFlight<'_, DB> {
    /// The error of a statement cut off by its scope's cancel: the cause, and whether the
    /// statement may have taken effect (sent, and not read-only: its receipt is then
    /// `EffectUnknown`, see [`Cut::finish`]).
    pub(super) fn cut_off(&self, scope: &Scope) -> Error {
        let unknown = self.sent
            && self
                .dispatched
                .as_ref()
                .is_some_and(|d| effect_unknown(d.spec()).is_some());
        cancelled(scope).effect_unknown(unknown)
    }

    /// The statement ended on the connection: its receipt is the caller's to record.
    pub(super) fn land(mut self) -> Dispatched {
        self.dispatched
            .take()
            .expect("a statement lands once, while in flight")
    }
}

impl<DB: Backend> Drop for InFlight<'_, DB> {
    fn drop(&mut self) {
        if let Some(dispatched) = self.dispatched.take() {
            self.conn.hand_off(Some(Cut::new(dispatched, self.sent)));
        }
    }
}

enum Outcome<T> {
    Done(Result<T, ::sqlx::Error>),
    Cancelled,
}

impl<DB: Backend> GuardedConnection<DB> {
    pub(super) fn new(
        shared: Arc<Shared<DB>>,
        scope: Scope,
        unit: Tethered<()>,
        conn: PoolConnection<DB>,
        state: DB::ConnState,
    ) -> Self {
        GuardedConnection {
            shared,
            scope,
            held: Some(Held { conn, state, unit }),
            rollback_due: None,
        }
    }

    /// The scope the connection is held for.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let scope = Scope::new();
    /// let conn = db.acquire(&scope).await.unwrap();
    /// assert_eq!(conn.scope().generation(), scope.generation());
    /// # }
    /// # }
    /// ```
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Runs a statement that returns no rows (or whose rows are not needed), registered with
    /// `spec`. See [`fetch_all`](Self::fetch_all) for what happens on cancel.
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all).
    ///
    /// # Cancel safety
    ///
    /// As [`fetch_all`](Self::fetch_all).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::{ChildSpec, Scope};
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let mut conn = db.acquire(&Scope::new()).await.unwrap();
    /// conn.execute(ChildSpec::read_only("ddl"), sqlx::query("CREATE TABLE t (v)")).await.unwrap();
    /// let done = conn
    ///     .execute(ChildSpec::side_effecting("insert", "t-1"), sqlx::query("INSERT INTO t VALUES (1)"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(done.rows_affected(), 1);
    /// # }
    /// # }
    /// ```
    pub async fn execute<'q, E>(
        &mut self,
        spec: impl Into<StatementSpec>,
        query: E,
    ) -> Result<DB::QueryResult, Error>
    where
        E: 'q + Execute<'q, DB>,
    {
        self.guarded::<E, ExecuteOp>(spec.into(), query).await
    }

    /// Runs a query and returns all its rows, as a child of the scope registered with `spec`.
    ///
    /// In order: if less than the minimum useful budget is left nothing happens; the statement
    /// is registered and dispatched (refused after a cancel: nothing is sent); on PostgreSQL
    /// `statement_timeout` is set to the remaining budget; then the statement runs. If the
    /// scope is cancelled (or runs out of time) meanwhile, the call returns at once with the
    /// cause and the statement is stopped on the server by a clean-up child of the scope; the
    /// connection then leaves this guard (later calls fail with [`Error::is_abandoned`]).
    ///
    /// Receipts: `Succeeded`; `Failed` for a database error; `Cancelled` when the statement was
    /// refused, or stopped while read-only, or stopped by the server's timeout;
    /// `EffectUnknown` when a statement that may have an effect was sent and then cut off by
    /// the cancel (cut off while the guard was still arming it, it is `Cancelled`), or lost
    /// with its session or connection (I/O error, PostgreSQL FATAL): it may have committed.
    ///
    /// # Errors
    ///
    /// * [`Error::is_budget_exhausted`], [`Error::is_cancelled`] (and
    ///   [`Error::is_deadline_exceeded`]), [`Error::is_closed`]: the scope refused or stopped
    ///   the statement;
    /// * [`Error::is_database`]: the database answered with an error;
    /// * [`Error::is_rolled_back`]: the statement is a `COMMIT` (or `END`) that PostgreSQL
    ///   answered by rolling back, since a statement of the block had failed (its receipt is
    ///   `Failed`: nothing was committed);
    /// * [`Error::is_abandoned`]: an earlier call on this connection was cut off.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the statement like a cancel does: the statement is
    /// interrupted on the server (its receipt is `Cancelled`, or `EffectUnknown` for a write)
    /// and the connection goes to clean-up.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::{ChildSpec, Scope};
    /// use sqlx::Row;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let mut conn = db.acquire(&Scope::new()).await.unwrap();
    /// let rows = conn
    ///     .fetch_all(ChildSpec::read_only("series"), sqlx::query("SELECT 1 UNION ALL SELECT 2"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(rows.iter().map(|r| r.get::<i64, _>(0)).sum::<i64>(), 3);
    /// # }
    /// # }
    /// ```
    pub async fn fetch_all<'q, Q, T>(
        &mut self,
        spec: impl Into<StatementSpec>,
        query: Q,
    ) -> Result<Vec<T>, Error>
    where
        Q: 'q + TypedQuery<'q, DB, Row = T>,
    {
        let rows = self.guarded::<Q, FetchAll>(spec.into(), query).await?;
        rows.into_iter().map(decode::<DB, Q>).collect()
    }

    /// Runs a query and returns its first row (an error if there is none). See
    /// [`fetch_all`](Self::fetch_all).
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all); no row is a database error (`RowNotFound`).
    ///
    /// # Cancel safety
    ///
    /// As [`fetch_all`](Self::fetch_all).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::{ChildSpec, Scope};
    /// use sqlx::Row;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let mut conn = db.acquire(&Scope::new()).await.unwrap();
    /// let row = conn.fetch_one(ChildSpec::read_only("one"), sqlx::query("SELECT 1")).await.unwrap();
    /// assert_eq!(row.get::<i64, _>(0), 1);
    /// # }
    /// # }
    /// ```
    pub async fn fetch_one<'q, Q, T>(
        &mut self,
        spec: impl Into<StatementSpec>,
        query: Q,
    ) -> Result<T, Error>
    where
        Q: 'q + TypedQuery<'q, DB, Row = T>,
    {
        decode::<DB, Q>(self.guarded::<Q, FetchOne>(spec.into(), query).await?)
    }

    /// Runs a query and returns its first row, if any. See [`fetch_all`](Self::fetch_all).
    ///
    /// # Errors
    ///
    /// As [`fetch_all`](Self::fetch_all).
    ///
    /// # Cancel safety
    ///
    /// As [`fetch_all`](Self::fetch_all).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::{ChildSpec, Scope};
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let mut conn = db.acquire(&Scope::new()).await.unwrap();
    /// let row = conn
    ///     .fetch_optional(ChildSpec::read_only("none"), sqlx::query("SELECT 1 WHERE 0"))
    ///     .await
    ///     .unwrap();
    /// assert!(row.is_none());
    /// # }
    /// # }
    /// ```
    pub async fn fetch_optional<'q, Q, T>(
        &mut self,
        spec: impl Into<StatementSpec>,
        query: Q,
    ) -> Result<Option<T>, Error>
    where
        Q: 'q + TypedQuery<'q, DB, Row = T>,
    {
        let row = self.guarded::<Q, FetchOptional>(spec.into(), query).await?;
        row.map(decode::<DB, Q>).transpose()
    }

    /// Releases the connection now, waiting for its reset (`ROLLBACK` of a transaction block
    /// left open; PostgreSQL: `RESET statement_timeout`), and gives back the scope's guard.
    /// Dropping the connection does the same in a background clean-up child of the scope.
    /// Either waits at most the pool's [`cleanup_budget`](super::GuardedPool::cleanup_budget):
    /// a reset not done by then closes the connection instead of returning it to the pool.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes closes the connection instead of returning it
    /// to the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::{Lifecycle, Scope};
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let scope = Scope::new();
    /// let conn = db.acquire(&scope).await.unwrap();
    /// conn.release().await;
    /// scope.close();
    /// assert_eq!(scope.lifecycle(), Lifecycle::Completed);
    /// # }
    /// # }
    /// ```
    pub async fn release(mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let Held { conn, state, unit } = held;
        match DB::release(&self.shared.state, conn, state, None) {
            Release::Return(conn) => drop(conn),
            // Bounded like the clean-up child of a drop: a server that stops answering costs
            // the caller (and the scope's `quiesce`, for this guard) the clean-up budget, not
            // forever. Cut short, the clean-up closes the connection.
            Release::CleanUp(fut) => {
                let _ = tokio::time::timeout(self.shared.cleanup_budget, fut).await;
            }
        }
        drop(unit);
    }

    /// The scope's part of every statement: budget check, registration, dispatch, arming, and
    /// the race against the cancel.
    async fn guarded<'q, E, O>(&mut self, spec: StatementSpec, query: E) -> Result<O::Output, Error>
    where
        E: 'q + Execute<'q, DB>,
        O: Op<DB>,
    {
        self.roll_back_if_due().await?;
        self.run_guarded::<E, O>(spec, query).await
    }

    /// A transaction dropped open on this connection (`depth` 0: the block; `n`: nested `n`
    /// deep, in a savepoint) is rolled back later: before its next statement, or by its
    /// release. Of several, the outermost decides (it undoes the inner ones too).
    pub(super) fn roll_back_later(&mut self, depth: usize) {
        self.rollback_due = Some(self.rollback_due.map_or(depth, |due| due.min(depth)));
    }

    /// A rollback due at `depth` or deeper is undone by the transaction at `depth` ending
    /// now: it need not be sent.
    pub(super) fn forget_rollbacks_from(&mut self, depth: usize) {
        if self.rollback_due.is_some_and(|due| due >= depth) {
            self.rollback_due = None;
        }
    }

    /// Rolls back a transaction dropped open on this connection (see
    /// [`roll_back_later`](Self::roll_back_later)), as a read-only child of the scope. If that
    /// fails, the statement that was to follow is not sent. A savepoint's rollback that
    /// failed stays due: nothing more of its outer transaction runs (the outer one's drop
    /// rolls the block back); a failed rollback of the block is left to the release.
    pub(super) async fn roll_back_if_due(&mut self) -> Result<(), Error> {
        match self.rollback_due.take() {
            None => Ok(()),
            Some(0) => {
                let spec = ChildSpec::read_only("rollback of a dropped transaction");
                self.run_guarded::<_, ExecuteOp>(spec.into(), ::sqlx::raw_sql(DB::ROLLBACK))
                    .await
                    .map(drop)
            }
            Some(depth) => {
                let spec = ChildSpec::read_only("rollback of a dropped nested transaction");
                let sql = rollback_to_savepoint(depth);
                let out = self
                    .run_guarded::<_, ExecuteOp>(spec.into(), ::sqlx::raw_sql(&sql))
                    .await;
                if out.is_err() {
                    self.roll_back_later(depth);
                }
                out.map(drop)
            }
        }
    }

    /// [`guarded`](Self::guarded), without the rollback that may be due before.
    async fn run_guarded<'q, E, O>(
        &mut self,
        spec: StatementSpec,
        query: E,
    ) -> Result<O::Output, Error>
    where
        E: 'q + Execute<'q, DB>,
        O: Op<DB>,
    {
        let dispatched = self.start(spec, query.sql())?;
        let commit = is_commit(query.sql());
        let scope = self.scope.clone();
        let mut flight = InFlight {
            conn: self,
            dispatched: Some(dispatched),
            sent: false,
        };
        let outcome = {
            let InFlight {
                conn,
                dispatched,
                sent,
                ..
            } = &mut flight;
            let (Some(Held { conn, state, .. }), Some(dispatched)) =
                (conn.held.as_mut(), dispatched.as_mut())
            else {
                // (Checked above, and nothing awaited since.)
                return Err(Error::abandoned());
            };
            let work = async {
                arm::<DB>(conn, state, dispatched, sent, &scope, query.sql()).await?;
                O::call(&mut **conn, query).await
            };
            tokio::select! {
                biased;
                () = scope.cancelled() => Outcome::Cancelled,
                out = work => Outcome::Done(out),
            }
        };
        match outcome {
            // PostgreSQL ends an aborted block's `COMMIT` with the tag `ROLLBACK`, not an
            // error: nothing was committed, and the caller must hear it.
            Outcome::Done(Ok(_)) if commit && flight.conn.block_aborted() => {
                flight.land().fail();
                Err(Error::rolled_back())
            }
            Outcome::Done(Ok(out)) => {
                flight.land().succeed();
                Ok(out)
            }
            Outcome::Done(Err(e)) => {
                let sent = flight.sent;
                Err(settle::<DB>(flight.land(), sent, e, &scope))
            }
            Outcome::Cancelled => {
                // Interrupt and hand the connection to clean-up with the statement, whose
                // receipt is recorded there (while it still holds the scope open) once the
                // clean-up knows whether the statement stopped.
                let err = flight.cut_off(&scope);
                drop(flight);
                Err(err)
            }
        }
    }

    /// The scope's part before a statement: nothing is sent (or registered) below the
    /// minimum useful budget or on an abandoned connection; then the statement is registered
    /// with its spec and dispatched (refused after a cancel: nothing is sent).
    pub(super) fn start(&mut self, spec: StatementSpec, sql: &str) -> Result<Dispatched, Error> {
        if self.held.is_none() {
            return Err(Error::abandoned());
        }
        check_budget(&self.scope, self.shared.min_useful)?;
        let ticket = self.scope.register(spec.resolve(sql))?;
        // Invariant 2 of the crate: after this CAS succeeds a cancel reaches us through the
        // scope; if the scope was cancelled first it fails and nothing is sent.
        Ok(ticket.dispatch()?)
    }

    /// Whether the last statement's arming found the transaction block aborted.
    fn block_aborted(&self) -> bool {
        self.held
            .as_ref()
            .is_some_and(|h| DB::block_aborted(&h.state))
    }

    /// The connection and its per-acquisition state, while held.
    pub(super) fn held(&mut self) -> Option<(&mut PoolConnection<DB>, &mut DB::ConnState)> {
        self.held.as_mut().map(|h| (&mut h.conn, &mut h.state))
    }

    /// Hands the connection on: to the pool as it is, or to a clean-up child of the scope.
    /// `cut`: a statement was cut off, so it is interrupted first.
    fn hand_off(&mut self, cut: Option<Cut>) {
        let Some(Held { conn, state, unit }) = self.held.take() else {
            return;
        };
        if cut.is_some() {
            DB::interrupt(&state);
        }
        match DB::release(&self.shared.state, conn, state, cut) {
            Release::Return(conn) => drop(conn),
            Release::CleanUp(fut) => {
                // The clean-up is a shielded child: it runs although the scope is cancelled,
                // bounded by its own budget, and `quiesce` waits for it. It is started while
                // `unit` still holds the scope open, so the shield cannot be refused for a
                // quiet scope. Without a runtime (dropped at shutdown) the future is dropped,
                // which closes the connection (and records the cut statement's receipt).
                if tokio::runtime::Handle::try_current().is_ok() {
                    let _ = self.scope.shield(self.shared.cleanup_budget, fut);
                }
            }
        }
        drop(unit);
    }
}

impl<DB: Backend> Drop for GuardedConnection<DB> {
    fn drop(&mut self) {
        self.hand_off(None);
    }
}

impl<DB: Backend> fmt::Debug for GuardedConnection<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedConnection")
            .field("scope", &self.scope)
            .field("state", &self.held.as_ref().map(|h| &h.state))
            .finish_non_exhaustive()
    }
}

/// Records the receipt of a statement that the database answered with `e`, and returns the
/// call's error. `sent`: the statement itself may have reached the database.
pub(super) fn settle<DB: Backend>(
    dispatched: Dispatched,
    sent: bool,
    e: ::sqlx::Error,
    scope: &Scope,
) -> Error {
    if DB::is_query_canceled(&e) && out_of_budget(scope) {
        // The server stopped it at the budget-derived timeout (it raced our own timer):
        // confirmed stopped, nothing committed.
        dispatched.finish(Receipt::Cancelled);
        deadline(scope)
    } else if let Some(unknown) =
        effect_unknown(dispatched.spec()).filter(|_| sent && DB::is_session_lost(&e))
    {
        // A write sent, and then its session or connection failed under it: it may have
        // committed before that.
        dispatched.finish(unknown);
        Error::database(e).effect_unknown(true)
    } else {
        dispatched.fail();
        Error::database(e)
    }
}

/// Arms the connection for a dispatched statement with the budget as of now, after queueing
/// (what the server may still spend), and notes the statement; from the end of this on,
/// `sent`: the statement may reach the database.
pub(super) async fn arm<DB: Backend>(
    conn: &mut PoolConnection<DB>,
    state: &mut DB::ConnState,
    dispatched: &mut Dispatched,
    sent: &mut bool,
    scope: &Scope,
    sql: &str,
) -> Result<(), ::sqlx::Error> {
    DB::arm(&mut **conn, state, scope.remaining()).await?;
    if let Some(handle) = DB::provider_handle(state) {
        dispatched.set_provider_handle(handle);
    }
    DB::note_statement(state, sql);
    *sent = true;
    Ok(())
}

/// A row as the query's type.
pub(super) fn decode<'q, DB: Backend, Q: TypedQuery<'q, DB>>(
    row: DB::Row,
) -> Result<Q::Row, Error> {
    Q::decode(row).map_err(Error::database)
}

/// Whether the scope is cancelled or its deadline has passed (its timer may not have fired).
fn out_of_budget(scope: &Scope) -> bool {
    scope.is_cancelled()
        || scope
            .deadline()
            .is_some_and(|d| d <= tokio::time::Instant::now())
}

/// The error for a statement the server stopped at the budget: the scope's cause, or the
/// deadline if the scope's timer has not fired yet.
fn deadline(scope: &Scope) -> Error {
    match scope.cause() {
        Some(_) => cancelled(scope),
        None => Error::scope(crate::Error::cancelled(crate::Cause::DeadlineExceeded)),
    }
}
