//! Database calls that are well-behaved children of a [`Scope`]: they wait at most the budget,
//! send nothing after a cancel, and *really stop* when the scope is cancelled.
//!
//! # Why
//!
//! Dropping a sqlx future stops the client, not the database. On PostgreSQL the backend goes
//! on running the statement (and holding its locks) until it finishes; the dropped connection
//! goes back to the pool mid-statement, where the pool's release check waits for that
//! statement before anyone can use the connection again. On SQLite the connection's worker
//! thread goes on stepping the statement, and every later command on that connection queues
//! behind it. A request that gave up after 200 ms can keep a database busy for minutes.
//!
//! Here a database call is a child of its scope like any other, written as with sqlx itself:
//! `sqlx::query_as` and `sqlx::query_scalar` give typed rows ([`TypedQuery`]), `fetch`
//! streams them ([`RowStream`]), `begin` starts a transaction ([`GuardedTransaction`]:
//! `commit`, `rollback`, rolled back on drop; `begin` on it nests one in a savepoint), the current scope ([`Scope::try_current`]) is
//! used when none is passed, and a statement given only a name gets its effect class from its
//! SQL ([`StatementSpec`]).
//!
//! * **Acquiring** a pooled connection ([`GuardedPool::acquire`]) waits at most the scope's
//!   remaining budget — queueing for a connection pays from the same budget — and the
//!   connection is counted as a guard of the scope until it is released, so
//!   [`Scope::quiesce`] waits for it.
//! * **Every statement is registered and dispatched** through the scope
//!   ([`Scope::register`], [`Ticket::dispatch`](crate::Ticket::dispatch)) with the
//!   [`ChildSpec`] you give: nothing is sent after a cancel, nothing is sent when less than
//!   the [minimum useful budget](GuardedPool::min_useful) is left, and every statement ends
//!   with exactly one [`Receipt`].
//! * **Writes report unknown outcomes.** A statement registered as
//!   [`ChildSpec::side_effecting`] or [`ChildSpec::idempotent`] that is cancelled after it was
//!   dispatched ends with [`Receipt::EffectUnknown`] (its
//!   effect id, payload digest and, on PostgreSQL, the backend pid as provider handle), so the
//!   [`Report`](crate::Report) lists it in
//!   [`pending_effects`](crate::Report::pending_effects) for reconciliation. The call returns
//!   at the cancel without waiting to learn whether the statement committed; read-only
//!   statements end `Cancelled`, and so does a write cut off while the guard was still
//!   arming it (on PostgreSQL, setting `statement_timeout`): it was never sent. A write whose
//!   session or connection fails under it (an I/O error, a PostgreSQL FATAL) is
//!   `EffectUnknown` too, not `Failed`: it may have committed first.
//! * **The server stops too.** When the scope is cancelled while a statement runs, the call
//!   returns at once and a clean-up child ([`Scope::shield`], counted in the scope, bounded by
//!   [`GuardedPool::cleanup_budget`]) stops the statement and then returns the connection to
//!   the pool *only if it is clean*, otherwise closes it. Never is a connection returned
//!   mid-statement. The same happens when the call's future is dropped.
//!
//! # PostgreSQL
//!
//! * **`statement_timeout` from the budget.** Right before each statement the connection runs
//!   one small statement that sets the session's `statement_timeout` to the scope's remaining
//!   budget (rounded up to a whole millisecond, never above the server's largest, about 24.8
//!   days) and reads the backend pid. So the *server* stops the statement at the deadline on
//!   its own, even if this process dies or hangs. The session's own `statement_timeout` as the
//!   guard found it — from the server, database, role, connect options or a `SET` in the
//!   pool's `after_connect` — stays the ceiling: a budget only lowers it, an unbounded scope
//!   keeps it, and the release puts it back. (In a failed transaction block, which refuses
//!   it and runs nothing but the block's end, the statement goes unarmed.) A transaction block
//!   that the scope's statements left open (a raw `BEGIN` whose `COMMIT` never ran) is rolled
//!   back on release: the pool's next user must not commit it.
//!
//!   A `COMMIT` (or `END`) of a block in which a statement failed is answered by PostgreSQL
//!   with the command tag `ROLLBACK`, not an error; sqlx passes that on as a success. Here
//!   the call fails with [`Error::is_rolled_back`] and the `COMMIT`'s receipt is `Failed`:
//!   nothing was committed, and nothing is listed for reconciliation. (The guard knows the
//!   block is aborted from the arming right before the `COMMIT`, which the block refuses.)
//!
//!   Why a session-level setting per statement, and not `SET LOCAL` in a transaction?
//!   `SET LOCAL` only lasts inside a transaction block, so every statement would have to be
//!   wrapped in `BEGIN … COMMIT` (three round trips instead of two), statements that cannot
//!   run in a transaction block (`VACUUM`, `CREATE INDEX CONCURRENTLY`) would fail, and a
//!   caller's own `BEGIN` would change meaning. A per-statement session setting costs one
//!   round trip, is right whatever the transaction state, and is undone on release.
//! * **Server-side cancel of exactly one session.** On cancel the clean-up child calls
//!   `pg_catalog.pg_cancel_backend(pid)` for the row of `pg_catalog.pg_stat_activity` with the
//!   backend's pid *and its `backend_start`*, both read by the first statement of the
//!   acquisition: a session that has ended and whose pid the server gave to a new one is left
//!   alone. The cancel is repeated every 100 ms until the backend answers (a cancel that
//!   arrives before the statement started is ignored by the server), then the clean-up drains
//!   the connection to `ReadyForQuery`, rolls back a failed transaction, restores the timeout
//!   and returns the connection to the pool. The connection stays out of the pool until every
//!   cancel sent for it has answered, so a late cancel cannot stop the next user's statement.
//!   If the drain or the restore fails, it terminates that same session
//!   (`pg_terminate_backend`, with the same check) and closes the connection.
//!
//!   A cancel that cannot be delivered — the control connection cannot be opened within its
//!   [connect timeout](GuardedPool::control_connect_timeout), breaks, or the server refuses
//!   the signal — is not dropped silently: the report of the statement's scope lists it
//!   ([`Report::undelivered_cancels`](crate::Report::undelivered_cancels), with the reason and
//!   the `statement_timeout` that still bounds the statement on the server), and the
//!   statement's receipt says it was not confirmed stopped (`Quarantined` for a read, unless
//!   the connection answered within the clean-up budget after all; `EffectUnknown` for a
//!   write). If the backend has not answered when the clean-up budget runs out, the
//!   connection is closed without a terminate.
//!
//!   Every statement of the guard's own names `pg_catalog` — functions, views, types and
//!   operators — so that nothing on a user's `search_path` can stand in for it.
//!
//!   The pid and the session's `statement_timeout` belong to the server connection the guard
//!   talks to, so the guard needs session pooling: behind a proxy that pools by transaction
//!   or by statement (PgBouncer's `transaction` or `statement` mode) a cancel could reach
//!   another client's statement. Connect it to the server directly or through session
//!   pooling.
//!
//!   The cancel goes through one dedicated control connection per [`GuardedPool`]
//!   (`application_name` `cancel-scope control`), opened with the pool's connect options on
//!   first use and kept: not through the pool, because a pool that is exhausted by runaway
//!   statements is exactly when a cancel must still get through. (sqlx 0.8 does not expose
//!   the secret key needed for the wire-protocol cancel request, so the backend is named by
//!   its pid and start time.) The database role must be allowed to signal the backend: the
//!   same role, a superuser or `pg_signal_backend`.
//!
//! # Durable intents
//!
//! `PgIntentStore` (feature `sqlx-postgres`) keeps the intents of
//! [`reconcile`](crate::reconcile) in a PostgreSQL table created if missing, so that a process
//! killed after sending a write leaves a record another process reconciles.
//!
//! # SQLite
//!
//! Acquiring a connection installs a progress handler on it (through
//! `SqliteConnection::lock_handle`) that SQLite calls every 1000 virtual-machine
//! instructions; when the scope is cancelled the handler tells SQLite to stop, the statement
//! fails with `SQLITE_INTERRUPT` (rolling back its changes) and the connection stays usable.
//! A commit hook installed with it turns every commit after the cancel into a rollback, for
//! the statements the handler cannot reach (a short write sleeping in SQLite's busy handler
//! for another connection's lock): nothing of the scope commits after its cancel. (They
//! replace a progress handler or commit hook the pool's connections had of their own.)
//! Installing them costs one round trip to the connection's worker thread per acquisition,
//! the same as sqlx's own test-before-acquire ping: pools used only through [`GuardedPool`]
//! can turn that ping off with `SqlitePoolOptions::test_before_acquire(false)`.
//!
//! The handler and hook are removed by the clean-up child once the interrupted statement has
//! ended; on a normal release they stay installed, inert. A release after a statement that
//! may have opened a transaction block (its text has `BEGIN` or `SAVEPOINT`, in any case)
//! rolls back a block left open (a raw `BEGIN` whose `COMMIT` never ran; an interrupted read
//! does not end its block), one more round trip to the worker thread, so that the pool's
//! next user cannot commit it.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! # #[cfg(feature = "sqlx-sqlite")] {
//! use std::time::Duration;
//! use cancel_scope::integrations::sqlx::GuardedPool;
//! use cancel_scope::{ChildSpec, Lifecycle, Scope};
//! use sqlx::Row;
//!
//! // One connection: every connection to `sqlite::memory:` opens a database of its own.
//! let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1);
//! let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
//! let request = Scope::with_timeout(Duration::from_secs(2));
//!
//! let mut conn = db.acquire(&request).await.unwrap();
//! conn.execute(ChildSpec::read_only("ddl"), sqlx::query("CREATE TABLE t (v INTEGER)"))
//!     .await
//!     .unwrap();
//! conn.execute(
//!     ChildSpec::idempotent("insert-v", "t-v-1"),
//!     sqlx::query("INSERT INTO t VALUES (?)").bind(1_i64),
//! )
//! .await
//! .unwrap();
//! let row = conn.fetch_one(ChildSpec::read_only("count"), sqlx::query("SELECT count(*) FROM t"))
//!     .await
//!     .unwrap();
//! assert_eq!(row.get::<i64, _>(0), 1);
//!
//! // A statement that would run for minutes stops when the scope is cancelled.
//! let stop = request.clone();
//! tokio::spawn(async move {
//!     tokio::time::sleep(Duration::from_millis(50)).await;
//!     stop.cancel_with("user pressed stop");
//! });
//! let long = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
//!             SELECT count(*) FROM c";
//! let err = conn.fetch_one(ChildSpec::read_only("long"), sqlx::query(long)).await.err().unwrap();
//! assert!(err.is_cancelled());
//! drop(conn);
//!
//! let report = request.quiesce().await;
//! assert_eq!(report.state(), Lifecycle::CancelledStable);
//! assert_eq!((report.succeeded(), report.cancelled()), (3 + 1, 1)); // + the clean-up child
//! # }
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ::sqlx::pool::PoolConnection;
use ::sqlx::{Database, Execute, Pool};

use crate::{ChildSpec, Dispatched, Receipt, Scope};

mod connection;
mod error;
#[cfg(feature = "sqlx-postgres")]
mod intents;
mod pool;
#[cfg(feature = "sqlx-postgres")]
mod postgres;
#[cfg(feature = "sqlx-sqlite")]
mod sqlite;
mod statement;
mod stream;
mod transaction;

pub use connection::GuardedConnection;
pub use error::Error;
#[cfg(feature = "sqlx-postgres")]
pub use intents::{PgIntentStore, PgIntentStoreBuilder, DEFAULT_INTENT_TABLE};
pub use pool::{GuardedPool, DEFAULT_CLEANUP_BUDGET};
#[cfg(feature = "sqlx-postgres")]
pub use postgres::{UndeliveredCancel, DEFAULT_CONTROL_CONNECT_TIMEOUT};
pub use statement::{StatementSpec, TypedQuery};
pub use stream::RowStream;
pub use transaction::GuardedTransaction;

/// A boxed future, as sqlx's executors return them.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

mod sealed {
    pub trait Sealed {}
}

/// A database whose calls [`GuardedPool`] can guard: `sqlx::Postgres`
/// (feature `sqlx-postgres`) and `sqlx::Sqlite` (feature `sqlx-sqlite`).
///
/// Sealed: its methods are the per-database halves of the guard and not meant to be called.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use cancel_scope::integrations::sqlx::Backend;
/// fn guardable<DB: Backend>() {}
/// guardable::<sqlx::Sqlite>();
/// # }
/// ```
pub trait Backend: Database + sealed::Sealed {
    /// Per-pool state (PostgreSQL: the control connection that sends cancels).
    #[doc(hidden)]
    type PoolState: std::fmt::Debug + Send + Sync + 'static;

    /// Per-acquisition state (PostgreSQL: backend pid; SQLite: the interrupt flag).
    #[doc(hidden)]
    type ConnState: std::fmt::Debug + Send + Sync + 'static;

    #[doc(hidden)]
    fn pool_state(pool: &Pool<Self>) -> Self::PoolState;

    /// Prepares a freshly acquired connection (SQLite: installs the progress handler).
    #[doc(hidden)]
    fn on_acquire(
        conn: &mut PoolConnection<Self>,
    ) -> impl Future<Output = Result<Self::ConnState, ::sqlx::Error>> + Send + '_;

    /// Runs right before each statement, after its dispatch (PostgreSQL: sets
    /// `statement_timeout` to `budget` and learns the backend pid). `budget` is `None` for an
    /// unbounded scope.
    #[doc(hidden)]
    fn arm<'a>(
        conn: &'a mut Self::Connection,
        state: &'a mut Self::ConnState,
        budget: Option<Duration>,
    ) -> impl Future<Output = Result<(), ::sqlx::Error>> + Send + 'a;

    /// Sees the text of each statement right before it is sent (SQLite: notes whether it may
    /// open a transaction block, which the release then rolls back).
    #[doc(hidden)]
    fn note_statement(_state: &mut Self::ConnState, _sql: &str) {}

    /// Rolls back the transaction block of the session if one is open, and is harmless if
    /// none is (SQLite refuses a bare `ROLLBACK` outside one: a `SAVEPOINT` first opens one).
    #[doc(hidden)]
    const ROLLBACK: &'static str = "ROLLBACK";

    /// Whether the last arming found the session's transaction block aborted (PostgreSQL: a
    /// statement in it failed; the block then runs nothing but its end, and answers a
    /// `COMMIT` by rolling back, with no error).
    #[doc(hidden)]
    fn block_aborted(_state: &Self::ConnState) -> bool {
        false
    }

    /// Asks a running statement to stop, synchronously (SQLite: sets the interrupt flag).
    #[doc(hidden)]
    fn interrupt(state: &Self::ConnState);

    /// The provider handle of an unknown effect (PostgreSQL: the backend pid).
    #[doc(hidden)]
    fn provider_handle(state: &Self::ConnState) -> Option<String>;

    /// Whether `err` says the server stopped the statement because of its timeout or a cancel.
    #[doc(hidden)]
    fn is_query_canceled(err: &::sqlx::Error) -> bool;

    /// Whether `err` says the session or the connection failed under a statement (after which
    /// a write's outcome is unknown), rather than that the statement failed or was refused.
    #[doc(hidden)]
    fn is_session_lost(err: &::sqlx::Error) -> bool;

    /// What to do with the connection when it leaves the guard: `None` to drop it into the
    /// pool as it is; otherwise a clean-up that returns it to the pool only when clean.
    /// `cut`: a statement was cut off mid-flight (it was interrupted first); its receipt is
    /// for the backend to record, once it knows whether the statement stopped.
    #[doc(hidden)]
    fn release(
        pool: &std::sync::Arc<Self::PoolState>,
        conn: PoolConnection<Self>,
        state: Self::ConnState,
        cut: Option<Cut>,
    ) -> Release<Self>;

    #[doc(hidden)]
    fn execute<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut Self::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Self::QueryResult, ::sqlx::Error>>;

    #[doc(hidden)]
    fn fetch_all<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut Self::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Vec<Self::Row>, ::sqlx::Error>>;

    #[doc(hidden)]
    fn fetch_one<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut Self::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Self::Row, ::sqlx::Error>>;

    #[doc(hidden)]
    fn fetch<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut Self::Connection,
        query: E,
    ) -> futures_core::stream::BoxStream<'e, Result<Self::Row, ::sqlx::Error>>;

    #[doc(hidden)]
    fn fetch_optional<'e, 'q: 'e, E: 'q + Execute<'q, Self>>(
        conn: &'e mut Self::Connection,
        query: E,
    ) -> BoxFuture<'e, Result<Option<Self::Row>, ::sqlx::Error>>;
}

/// A statement cut off after its dispatch, handed to the clean-up with the connection: its
/// receipt waits for what the clean-up learns.
#[doc(hidden)]
#[derive(Debug)]
pub struct Cut {
    dispatched: Dispatched,
    /// The statement itself may have reached the database (it was not cut off while the
    /// guard was still arming it).
    sent: bool,
}

impl Cut {
    pub(crate) fn new(dispatched: Dispatched, sent: bool) -> Self {
        Cut { dispatched, sent }
    }

    /// The statement's scope.
    pub(crate) fn scope(&self) -> &Scope {
        self.dispatched.scope()
    }

    /// The statement's name.
    pub(crate) fn name(&self) -> std::sync::Arc<str> {
        self.dispatched.spec().name().into()
    }

    /// The statement stopped: a read (or a write cut off while arming: never sent) is
    /// `Cancelled`; a sent write's outcome is unknown, since it may have committed before
    /// the cancel reached the server.
    pub(crate) fn finish(self) {
        let receipt = match effect_unknown(self.dispatched.spec()) {
            Some(unknown) if self.sent => unknown,
            _ => Receipt::Cancelled,
        };
        self.dispatched.finish(receipt);
    }

    /// The statement may still run on the server (its cancel was not delivered): a read is
    /// `Quarantined` (isolated, listed, not confirmed stopped); a write `EffectUnknown`.
    /// (Cut off while arming, the statement itself was never sent: `Cancelled`.)
    pub(crate) fn finish_unstopped(self) {
        let receipt = match effect_unknown(self.dispatched.spec()) {
            _ if !self.sent => Receipt::Cancelled,
            Some(unknown) => unknown,
            None => Receipt::Quarantined,
        };
        self.dispatched.finish(receipt);
    }
}

/// `EffectUnknown` for a statement that may have an effect, `None` for a read.
pub(crate) fn effect_unknown(spec: &ChildSpec) -> Option<Receipt> {
    match spec.effect_record() {
        Some(rec) if spec.effect().may_have_effect() => Some(Receipt::EffectUnknown(rec.clone())),
        _ => None,
    }
}

/// What [`Backend::release`] decided.
#[doc(hidden)]
#[allow(missing_debug_implementations)]
pub enum Release<DB: Database> {
    /// Clean as it is: drop it into the pool.
    Return(PoolConnection<DB>),
    /// Needs this clean-up first (it returns or closes the connection itself).
    CleanUp(BoxFuture<'static, ()>),
}

/// A pooled connection that is closed (not returned to the pool) if dropped before
/// [`release`](CloseOnDrop::release): what clean-up futures hold, so that a clean-up cut
/// short by its budget never leaves a connection mid-statement in the pool.
pub(crate) struct CloseOnDrop<DB: Database>(Option<PoolConnection<DB>>);

impl<DB: Database> CloseOnDrop<DB> {
    pub(crate) fn new(conn: PoolConnection<DB>) -> Self {
        CloseOnDrop(Some(conn))
    }

    pub(crate) fn conn(&mut self) -> &mut PoolConnection<DB> {
        self.0
            .as_mut()
            .expect("CloseOnDrop holds its connection until release or drop")
    }

    /// The connection is clean: back to the pool.
    pub(crate) fn release(mut self) {
        drop(self.0.take());
    }
}

impl<DB: Database> Drop for CloseOnDrop<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            // Detach lets the pool open a replacement; dropping the raw connection closes its
            // socket (PostgreSQL) or stops its worker after the current statement (SQLite).
            drop(conn.detach());
        }
    }
}
