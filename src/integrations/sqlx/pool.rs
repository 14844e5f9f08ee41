//! The guarded pool: acquisition within the budget.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::sqlx::{Execute, Pool};

use super::connection::GuardedConnection;
use super::{Backend, Error, StatementSpec, TypedQuery};
use crate::budget::{ChildBudget, Rules};
use crate::Scope;

/// How long the clean-up of a connection may take by default: the server cancel, draining the
/// connection and resetting it (see [`GuardedPool::cleanup_budget`]).
///
/// The crate's [`DEFAULT_CLEANUP_BUDGET`](crate::DEFAULT_CLEANUP_BUDGET), half of the default
/// grace period [`DEFAULT_GRACE`](crate::DEFAULT_GRACE): with the defaults, a clean-up that
/// runs out of budget (the connection is then closed) ends with the statement's own receipt
/// before the grace period ends and `quiesce` would quarantine it. On PostgreSQL that budget
/// holds the server cancel and its repeats every 100 ms once the control connection is open
/// (one round trip each: four repeats and the reset fit), and opening the control connection
/// on first use, twice at most, each within the
/// [control connect timeout](GuardedPool::control_connect_timeout) of 150 ms, with a repeat
/// still left. A pool whose control connection needs longer to open (a slow TLS handshake)
/// raises that timeout, and with it this budget and the scopes' grace period.
///
/// # Examples
///
/// ```
/// use cancel_scope::integrations::sqlx::DEFAULT_CLEANUP_BUDGET;
/// assert!(DEFAULT_CLEANUP_BUDGET < cancel_scope::DEFAULT_GRACE);
/// ```
pub const DEFAULT_CLEANUP_BUDGET: Duration = crate::DEFAULT_CLEANUP_BUDGET;

/// A sqlx [`Pool`] whose connections and statements are children of a [`Scope`].
///
/// Cheap to clone (an `Arc`); it wraps the pool, it does not replace it: the same pool can
/// still be used directly for work that needs no guard.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use std::time::Duration;
/// use cancel_scope::integrations::sqlx::GuardedPool;
/// use cancel_scope::{ChildSpec, Scope};
/// use sqlx::Row;
///
/// // One connection: every connection to `sqlite::memory:` opens a database of its own.
/// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1);
/// let pool = options.connect("sqlite::memory:").await.unwrap();
/// let db = GuardedPool::new(pool).min_useful(Duration::from_millis(5));
///
/// let scope = Scope::with_timeout(Duration::from_millis(300));
/// let row = db.fetch_one(&scope, ChildSpec::read_only("one"), sqlx::query("SELECT 1"))
///     .await
///     .unwrap();
/// assert_eq!(row.get::<i64, _>(0), 1);
/// # }
/// # }
/// ```
pub struct GuardedPool<DB: Backend> {
    pub(super) shared: Arc<Shared<DB>>,
}

pub(super) struct Shared<DB: Backend> {
    pub(super) pool: Pool<DB>,
    pub(super) state: Arc<DB::PoolState>,
    pub(super) min_useful: Duration,
    pub(super) cleanup_budget: Duration,
}

impl<DB: Backend> GuardedPool<DB> {
    /// Guards `pool` (minimum useful budget zero, clean-up budget
    /// [`DEFAULT_CLEANUP_BUDGET`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let pool = options.connect("sqlite::memory:").await.unwrap();
    /// let db = GuardedPool::new(pool.clone());
    /// assert_eq!(db.pool().size(), pool.size());
    /// # }
    /// # }
    /// ```
    pub fn new(pool: Pool<DB>) -> Self {
        let state = Arc::new(DB::pool_state(&pool));
        GuardedPool {
            shared: Arc::new(Shared {
                pool,
                state,
                min_useful: Duration::ZERO,
                cleanup_budget: DEFAULT_CLEANUP_BUDGET,
            }),
        }
    }

    /// The least budget worth spending on an acquisition or a statement: with less left,
    /// nothing is sent and the call fails with [`Error::is_budget_exhausted`]. A zero budget
    /// is never useful.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let pool = options.connect("sqlite::memory:").await.unwrap();
    /// let db = GuardedPool::new(pool).min_useful(Duration::from_millis(10));
    /// let scope = Scope::with_timeout(Duration::from_millis(5));
    /// assert!(db.acquire(&scope).await.unwrap_err().is_budget_exhausted());
    /// # }
    /// # }
    /// ```
    pub fn min_useful(self, min_useful: Duration) -> Self {
        self.with(|s| s.min_useful = min_useful)
    }

    /// The minimum useful budget of `rules`: the same as [`min_useful`](Self::min_useful).
    /// The rules' reserve and cap are ignored: a pool's calls run in the scope they are given,
    /// so a reserve or a cap goes on that scope (`scope.child().rules(rules)`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use std::time::Duration;
    /// use cancel_scope::{budget::Rules, integrations::sqlx::GuardedPool, Scope};
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let pool = options.connect("sqlite::memory:").await.unwrap();
    /// let db = GuardedPool::new(pool).rules(Rules::new().min_useful(Duration::from_millis(10)));
    /// let scope = Scope::with_timeout(Duration::from_millis(5));
    /// assert!(db.acquire(&scope).await.unwrap_err().is_budget_exhausted());
    /// # }
    /// # }
    /// ```
    pub fn rules(self, rules: Rules) -> Self {
        self.min_useful(rules.min_useful)
    }

    /// How long the clean-up after a cancel (or after a release that needs a reset) may take
    /// before the connection is closed instead of returned to the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let pool = options.connect("sqlite::memory:").await.unwrap();
    /// let db = GuardedPool::new(pool).cleanup_budget(Duration::from_millis(500));
    /// # drop(db);
    /// # }
    /// # }
    /// ```
    pub fn cleanup_budget(self, budget: Duration) -> Self {
        self.with(|s| s.cleanup_budget = budget)
    }

    pub(super) fn with(self, f: impl FnOnce(&mut Shared<DB>)) -> Self {
        let mut shared = Shared {
            pool: self.shared.pool.clone(),
            state: self.shared.state.clone(),
            min_useful: self.shared.min_useful,
            cleanup_budget: self.shared.cleanup_budget,
        };
        f(&mut shared);
        GuardedPool {
            shared: Arc::new(shared),
        }
    }

    /// The wrapped pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// assert!(!db.pool().is_closed());
    /// # }
    /// # }
    /// ```
    pub fn pool(&self) -> &Pool<DB> {
        &self.shared.pool
    }

    /// Acquires a connection for `scope` (`None`: the current scope, [`Scope::try_current`]),
    /// waiting at most the scope's remaining budget
    /// (queueing for a connection pays from the budget), and counts it as a guard of the scope
    /// until the [`GuardedConnection`] is dropped or [released](GuardedConnection::release).
    ///
    /// # Errors
    ///
    /// * [`Error::is_no_scope`]: `None` was passed and no scope is current;
    /// * [`Error::is_budget_exhausted`]: less than the minimum useful budget is left; nothing
    ///   was asked of the pool;
    /// * [`Error::is_cancelled`] / [`Error::is_deadline_exceeded`] / [`Error::is_closed`]: the
    ///   scope refused, or was cancelled or ran out of time while waiting;
    /// * [`Error::is_database`]: the pool failed (its own acquire timeout, closed pool,
    ///   connection error).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future gives back the place in the pool's queue, and a
    /// connection already taken goes back to the pool (no statement ran on it).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// use sqlx::sqlite::SqlitePoolOptions;
    ///
    /// let pool = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.unwrap();
    /// let db = GuardedPool::new(pool);
    /// let holder = db.acquire(&Scope::new()).await.unwrap(); // the only connection
    ///
    /// let scope = Scope::with_timeout(Duration::from_millis(50));
    /// let err = db.acquire(&scope).await.unwrap_err();
    /// assert!(err.is_deadline_exceeded()); // waited 50 ms, not the pool's 30 s
    /// # drop(holder);
    /// # }
    /// # }
    /// ```
    pub async fn acquire<'s>(
        &self,
        scope: impl Into<Option<&'s Scope>>,
    ) -> Result<GuardedConnection<DB>, Error> {
        let scope = &scope_or_current(scope.into())?;
        self.check_budget(scope)?;
        // The unit is taken before waiting, like `Scope::acquire`: after a cancel nothing is
        // asked of the pool, and a waiting acquisition keeps the scope from being quiet.
        let unit = scope.tether(())?;
        let mut conn = tokio::select! {
            biased;
            () = scope.cancelled() => return Err(cancelled(scope)),
            conn = self.shared.pool.acquire() => conn.map_err(Error::database)?,
        };
        let state = tokio::select! {
            biased;
            () = scope.cancelled() => return Err(cancelled(scope)),
            state = DB::on_acquire(&mut conn) => state.map_err(Error::database)?,
        };
        Ok(GuardedConnection::new(
            self.shared.clone(),
            scope.clone(),
            unit,
            conn,
            state,
        ))
    }

    /// Acquires a connection, runs one statement with [`GuardedConnection::execute`] and
    /// releases the connection. `scope`: `None` for the current scope.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) and [`GuardedConnection::execute`].
    ///
    /// # Cancel safety
    ///
    /// As [`GuardedConnection::execute`]: dropping the future stops the statement.
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
    /// let done = db.execute(&Scope::new(), ChildSpec::read_only("noop"), sqlx::query("SELECT 1"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(done.rows_affected(), 0);
    /// # }
    /// # }
    /// ```
    pub async fn execute<'s, 'q, E>(
        &self,
        scope: impl Into<Option<&'s Scope>>,
        spec: impl Into<StatementSpec>,
        query: E,
    ) -> Result<DB::QueryResult, Error>
    where
        E: 'q + Execute<'q, DB>,
    {
        let mut conn = self.acquire(scope).await?;
        let out = conn.execute(spec, query).await;
        conn.release().await;
        out
    }

    /// Acquires a connection, runs one query with [`GuardedConnection::fetch_all`] and
    /// releases the connection. `scope`: `None` for the current scope.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) and [`GuardedConnection::fetch_all`].
    ///
    /// # Cancel safety
    ///
    /// As [`GuardedConnection::fetch_all`].
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
    /// let rows = db
    ///     .fetch_all(&Scope::new(), ChildSpec::read_only("two"), sqlx::query("SELECT 1 UNION ALL SELECT 2"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(rows.len(), 2);
    /// # }
    /// # }
    /// ```
    pub async fn fetch_all<'s, 'q, E, T>(
        &self,
        scope: impl Into<Option<&'s Scope>>,
        spec: impl Into<StatementSpec>,
        query: E,
    ) -> Result<Vec<T>, Error>
    where
        E: 'q + TypedQuery<'q, DB, Row = T>,
    {
        let mut conn = self.acquire(scope).await?;
        let out = conn.fetch_all(spec, query).await;
        conn.release().await;
        out
    }

    /// Acquires a connection, runs one query with [`GuardedConnection::fetch_one`] and
    /// releases the connection. `scope`: `None` for the current scope.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) and [`GuardedConnection::fetch_one`].
    ///
    /// # Cancel safety
    ///
    /// As [`GuardedConnection::fetch_one`].
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
    /// let row = db.fetch_one(&Scope::new(), ChildSpec::read_only("one"), sqlx::query("SELECT 7"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(row.get::<i64, _>(0), 7);
    /// # }
    /// # }
    /// ```
    pub async fn fetch_one<'s, 'q, E, T>(
        &self,
        scope: impl Into<Option<&'s Scope>>,
        spec: impl Into<StatementSpec>,
        query: E,
    ) -> Result<T, Error>
    where
        E: 'q + TypedQuery<'q, DB, Row = T>,
    {
        let mut conn = self.acquire(scope).await?;
        let out = conn.fetch_one(spec, query).await;
        conn.release().await;
        out
    }

    /// Acquires a connection, runs one query with [`GuardedConnection::fetch_optional`] and
    /// releases the connection. `scope`: `None` for the current scope.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) and [`GuardedConnection::fetch_optional`].
    ///
    /// # Cancel safety
    ///
    /// As [`GuardedConnection::fetch_optional`].
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
    /// let row = db
    ///     .fetch_optional(&Scope::new(), ChildSpec::read_only("none"), sqlx::query("SELECT 1 WHERE 0"))
    ///     .await
    ///     .unwrap();
    /// assert!(row.is_none());
    /// # }
    /// # }
    /// ```
    pub async fn fetch_optional<'s, 'q, E, T>(
        &self,
        scope: impl Into<Option<&'s Scope>>,
        spec: impl Into<StatementSpec>,
        query: E,
    ) -> Result<Option<T>, Error>
    where
        E: 'q + TypedQuery<'q, DB, Row = T>,
    {
        let mut conn = self.acquire(scope).await?;
        let out = conn.fetch_optional(spec, query).await;
        conn.release().await;
        out
    }

    fn check_budget(&self, scope: &Scope) -> Result<Option<Duration>, Error> {
        check_budget(scope, self.shared.min_useful)
    }
}

/// The scope's remaining budget, unless it is below `min_useful` (or zero): then nothing may
/// be sent.
pub(super) fn check_budget(scope: &Scope, min_useful: Duration) -> Result<Option<Duration>, Error> {
    ChildBudget::new()
        .min_useful(min_useful)
        .compute(scope.remaining())
        .map_err(|e| Error::scope(crate::Error::exhausted(e)))
}

/// `scope`, or else the current scope.
pub(super) fn scope_or_current(scope: Option<&Scope>) -> Result<Scope, Error> {
    scope
        .cloned()
        .or_else(Scope::try_current)
        .ok_or_else(Error::no_scope)
}

/// The error for a scope observed cancelled.
pub(super) fn cancelled(scope: &Scope) -> Error {
    Error::scope(crate::Error::cancelled(scope.cause_or_cancelled()))
}

impl<DB: Backend> Clone for GuardedPool<DB> {
    fn clone(&self) -> Self {
        GuardedPool {
            shared: self.shared.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for GuardedPool<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedPool")
            .field("size", &self.shared.pool.size())
            .field("idle", &self.shared.pool.num_idle())
            .field("min_useful", &self.shared.min_useful)
            .field("cleanup_budget", &self.shared.cleanup_budget)
            .field("state", &self.shared.state)
            .finish()
    }
}
