//! The error of a guarded database call.

use std::fmt;

/// Why a guarded database call did not run or did not finish.
///
/// Either the scope refused or stopped the call ([`scope_error`](Error::scope_error): cancelled,
/// out of budget, closed), or the database answered with an error
/// ([`database_error`](Error::database_error)). Match on the predicates; the `Display` text is
/// for people and is not part of the API.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use cancel_scope::integrations::sqlx::GuardedPool;
/// use cancel_scope::{ChildSpec, Scope};
///
/// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
/// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
/// let scope = Scope::new();
///
/// let err = db.execute(&scope, ChildSpec::read_only("typo"), sqlx::query("SELEC 1"))
///     .await
///     .unwrap_err();
/// assert!(err.is_database());
///
/// scope.cancel();
/// let err = db.execute(&scope, ChildSpec::read_only("late"), sqlx::query("SELECT 1"))
///     .await
///     .unwrap_err();
/// assert!(err.is_cancelled());
/// # }
/// # }
/// ```
pub struct Error {
    kind: Kind,
    /// The statement may have taken effect (see [`Error::is_effect_unknown`]).
    effect_unknown: bool,
}

enum Kind {
    Scope(crate::Error),
    Database(::sqlx::Error),
    Abandoned,
    NoScope,
    RolledBack,
}

impl Error {
    pub(super) fn scope(e: crate::Error) -> Self {
        Error {
            kind: Kind::Scope(e),
            effect_unknown: false,
        }
    }

    pub(super) fn database(e: ::sqlx::Error) -> Self {
        Error {
            kind: Kind::Database(e),
            effect_unknown: false,
        }
    }

    pub(super) fn abandoned() -> Self {
        Error {
            kind: Kind::Abandoned,
            effect_unknown: false,
        }
    }

    pub(super) fn rolled_back() -> Self {
        Error {
            kind: Kind::RolledBack,
            effect_unknown: false,
        }
    }

    pub(super) fn no_scope() -> Self {
        Error {
            kind: Kind::NoScope,
            effect_unknown: false,
        }
    }

    /// The statement was cut off after it was sent, or lost with its session, and may have
    /// taken effect: its receipt is [`EffectUnknown`](crate::Receipt::EffectUnknown), listed
    /// in the report's pending effects. Only for statements that may have an effect (a
    /// write, a `COMMIT`); with [`is_cancelled`](Self::is_cancelled) or
    /// [`is_database`](Self::is_database) as the cause. Refused statements, never sent, are
    /// not.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
    /// let scope = Scope::new();
    /// scope.cancel();
    /// let err = db.execute(&scope, "insert", sqlx::query("INSERT INTO t VALUES (1)")).await.unwrap_err();
    /// assert!(err.is_cancelled() && !err.is_effect_unknown()); // refused: never sent
    /// # }
    /// # }
    /// ```
    pub fn is_effect_unknown(&self) -> bool {
        self.effect_unknown
    }

    /// This error, saying that the statement may have taken effect.
    pub(super) fn effect_unknown(mut self, unknown: bool) -> Self {
        self.effect_unknown = unknown;
        self
    }

    /// No scope was given and none is current ([`Scope::try_current`](crate::Scope::try_current)):
    /// nothing was asked of the pool.
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
    /// assert!(db.acquire(None).await.unwrap_err().is_no_scope());
    /// // Inside a scope's work, that scope is used.
    /// let scope = Scope::new();
    /// let conn = scope.run(async { db.acquire(None).await }).await.unwrap().unwrap();
    /// assert_eq!(conn.scope().generation(), scope.generation());
    /// # }
    /// # }
    /// ```
    pub fn is_no_scope(&self) -> bool {
        matches!(self.kind, Kind::NoScope)
    }

    /// The scope was cancelled (for any cause, including its deadline) before or while the
    /// call ran. If it was already running, the statement was stopped on the server side.
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
    /// scope.cancel();
    /// assert!(db.acquire(&scope).await.unwrap_err().is_cancelled());
    /// # }
    /// # }
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_cancelled())
    }

    /// The scope (or an ancestor) ran out of time.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::{Cause, Scope};
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let scope = Scope::new();
    /// scope.cancel_because(Cause::DeadlineExceeded);
    /// assert!(db.acquire(&scope).await.unwrap_err().is_deadline_exceeded());
    /// # }
    /// # }
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_deadline_exceeded())
    }

    /// Too little budget was left for the call to be useful: nothing was sent.
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
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap())
    ///     .min_useful(Duration::from_millis(50));
    /// let scope = Scope::with_timeout(Duration::from_millis(20));
    /// assert!(db.acquire(&scope).await.unwrap_err().is_budget_exhausted());
    /// # }
    /// # }
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_budget_exhausted())
    }

    /// The scope's watermark was closed ([`Scope::close`](crate::Scope::close)): no new work.
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
    /// scope.close();
    /// assert!(db.acquire(&scope).await.unwrap_err().is_closed());
    /// # }
    /// # }
    /// ```
    pub fn is_closed(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_closed())
    }

    /// The database (or the pool) answered with an error; see
    /// [`database_error`](Error::database_error).
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
    /// let err = db
    ///     .execute(&Scope::new(), ChildSpec::read_only("bad"), sqlx::query("SELECT * FROM nope"))
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_database());
    /// # }
    /// # }
    /// ```
    pub fn is_database(&self) -> bool {
        matches!(self.kind, Kind::Database(_))
    }

    /// An earlier call on this [`GuardedConnection`](super::GuardedConnection) was dropped
    /// while its statement ran: the connection went to clean-up (server cancel, then back to
    /// the pool or closed) and cannot be used any more. Acquire a new one.
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
    /// let ok = conn.fetch_one(ChildSpec::read_only("one"), sqlx::query("SELECT 1")).await;
    /// assert!(ok.is_ok());
    /// // (a dropped in-flight call would make the next one fail with `is_abandoned`)
    /// # }
    /// # }
    /// ```
    pub fn is_abandoned(&self) -> bool {
        matches!(self.kind, Kind::Abandoned)
    }

    /// The database rolled the transaction back instead of committing it: PostgreSQL answers
    /// the `COMMIT` of a transaction block in which a statement failed (an aborted block)
    /// with `ROLLBACK`, not with an error. Nothing of the transaction took effect; the
    /// `COMMIT`'s receipt is [`Failed`](crate::Receipt::Failed), with nothing to reconcile.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
    /// let mut tx = db.begin(&Scope::new(), "t").await.unwrap();
    /// tx.execute("ddl", sqlx::query("CREATE TABLE t (v)")).await.unwrap();
    /// match tx.commit().await {
    ///     Err(e) if e.is_rolled_back() => eprintln!("nothing was committed; retry the transaction"),
    ///     other => other.unwrap(),
    /// }
    /// # }
    /// # }
    /// ```
    pub fn is_rolled_back(&self) -> bool {
        matches!(self.kind, Kind::RolledBack)
    }

    /// The scope's error, if the scope refused or stopped the call.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::{Cause, Scope};
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let scope = Scope::new();
    /// scope.cancel_because(Cause::ClientGone);
    /// let err = db.acquire(&scope).await.unwrap_err();
    /// assert_eq!(err.scope_error().unwrap().cause(), Some(&Cause::ClientGone));
    /// # }
    /// # }
    /// ```
    pub fn scope_error(&self) -> Option<&crate::Error> {
        match &self.kind {
            Kind::Scope(e) => Some(e),
            _ => None,
        }
    }

    /// The database's error, if the database or the pool answered with one.
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
    /// let err = db
    ///     .execute(&Scope::new(), ChildSpec::read_only("bad"), sqlx::query("SELECT * FROM nope"))
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.database_error().unwrap().as_database_error().is_some());
    /// # }
    /// # }
    /// ```
    pub fn database_error(&self) -> Option<&::sqlx::Error> {
        match &self.kind {
            Kind::Database(e) => Some(e),
            _ => None,
        }
    }
}

impl From<crate::Error> for Error {
    fn from(e: crate::Error) -> Self {
        Error::scope(e)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Scope(e) => f.debug_tuple("Scope").field(e).finish(),
            Kind::Database(e) => f.debug_tuple("Database").field(e).finish(),
            Kind::Abandoned => f.write_str("Abandoned"),
            Kind::NoScope => f.write_str("NoScope"),
            Kind::RolledBack => f.write_str("RolledBack"),
        }?;
        if self.effect_unknown {
            f.write_str(" (effect unknown)")?;
        }
        Ok(())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Scope(e) => fmt::Display::fmt(e, f),
            Kind::Database(e) => write!(f, "database error: {e}"),
            Kind::Abandoned => f.write_str(
                "connection abandoned: an earlier call was dropped mid-statement and the \
                 connection went to clean-up",
            ),
            Kind::NoScope => f.write_str("no scope given and none is current"),
            Kind::RolledBack => f.write_str(
                "the transaction was rolled back, not committed: a statement in it had failed",
            ),
        }?;
        if self.effect_unknown {
            f.write_str("; the statement may have taken effect")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Scope(e) => Some(e),
            Kind::Database(e) => Some(e),
            Kind::Abandoned | Kind::NoScope | Kind::RolledBack => None,
        }
    }
}
