//! Guarded transactions: `BEGIN` … `COMMIT` as children of the scope, rolled back on drop.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use ::sqlx::Execute;

use super::{Backend, Error, GuardedConnection, GuardedPool, RowStream, StatementSpec, TypedQuery};
use crate::{ChildSpec, Scope};

/// A transaction on a guarded connection, in the style of sqlx's `Transaction`: begun with
/// [`GuardedConnection::begin`] (or [`GuardedPool::begin`], which owns its connection), ended
/// with [`commit`](Self::commit) or [`rollback`](Self::rollback), rolled back if dropped open.
///
/// Every statement — `BEGIN`, those run through it, `COMMIT`, `ROLLBACK` — is a child of the
/// connection's scope as any guarded statement is: nothing is sent after the scope's cancel
/// or below the minimum useful budget, and a statement under way when the scope is cancelled
/// is stopped on the server, the connection then going to the clean-up, which rolls the
/// transaction back before the connection can serve anyone else.
///
/// Receipts follow from that: nothing of a transaction takes effect before its `COMMIT`, so a
/// statement run through it with only a name is registered read-only (cut off, it is
/// `Cancelled`: it is rolled back with the transaction); give it a [`ChildSpec`] if its
/// effect does not wait for the commit (a call out of the database). The `COMMIT` carries the
/// transaction's effect, registered with the spec given to `begin`: cut off after it was
/// sent it is `EffectUnknown` — listed for reconciliation, never `Cancelled`, since it may
/// have committed — and the call's error says so ([`Error::is_effect_unknown`]). A `COMMIT`
/// refused before it was sent leaves the transaction to be rolled back.
///
/// Dropped open (not committed or rolled back: an error returned with `?`, a cancel, the
/// handler's future dropped), the transaction is rolled back: a transaction that owns its
/// connection by that connection's release, one on a borrowed connection before that
/// connection's next statement (or by its release, if none comes).
///
/// Nested transactions are savepoints ([`begin`](Self::begin) on a transaction): rolled back
/// to their savepoint when dropped open, and committed only by the outermost `COMMIT`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use cancel_scope::integrations::sqlx::GuardedPool;
/// use cancel_scope::{ChildSpec, Scope};
///
/// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
/// let scope = Scope::new();
/// let mut conn = db.acquire(&scope).await.unwrap();
/// conn.execute("ddl", sqlx::query("CREATE TABLE orders (id TEXT)")).await.unwrap();
///
/// let mut tx = conn.begin(ChildSpec::idempotent("place-order", "order-42")).await.unwrap();
/// tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-42')")).await.unwrap();
/// tx.commit().await.unwrap();
///
/// // Dropped open: rolled back before the connection's next statement.
/// let mut tx = conn.begin("discarded").await.unwrap();
/// tx.execute("insert", sqlx::query("INSERT INTO orders VALUES ('o-43')")).await.unwrap();
/// drop(tx);
/// let n: i64 = conn.fetch_one("count", sqlx::query_scalar("SELECT count(*) FROM orders"))
///     .await
///     .unwrap();
/// assert_eq!(n, 1);
/// # }
/// # }
/// ```
#[must_use = "a transaction is rolled back when dropped"]
pub struct GuardedTransaction<'c, DB: Backend> {
    /// `None` once handed back (an owned connection released after the end).
    conn: Option<Conn<'c, DB>>,
    /// The spec `COMMIT` is registered with (the transaction's name and effect).
    commit: ChildSpec,
    /// Begun and not ended (by `commit` or `rollback`) yet.
    open: bool,
    /// 0: the transaction block (`BEGIN` … `COMMIT`); `n`: nested `n` deep, a savepoint.
    depth: usize,
}

enum Conn<'c, DB: Backend> {
    Owned(GuardedConnection<DB>),
    Borrowed(&'c mut GuardedConnection<DB>),
}

impl<DB: Backend> Conn<'_, DB> {
    fn get(&mut self) -> &mut GuardedConnection<DB> {
        match self {
            Conn::Owned(conn) => conn,
            Conn::Borrowed(conn) => conn,
        }
    }
}

impl<DB: Backend> GuardedConnection<DB> {
    /// Begins a transaction on this connection (`BEGIN`, a read-only child of the scope).
    /// `commit` is the spec its `COMMIT` is registered with: a name (registered as a write,
    /// with the name as its effect id) or a [`ChildSpec`] (for the effect id and idempotency
    /// key that reconciliation needs). See [`GuardedTransaction`].
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute) for the `BEGIN`.
    ///
    /// # Cancel safety
    ///
    /// As [`execute`](Self::execute): dropping the future stops the `BEGIN`, and the
    /// connection goes to clean-up.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
    /// let mut conn = db.acquire(&Scope::new()).await.unwrap();
    /// let tx = conn.begin("nothing-yet").await.unwrap();
    /// tx.rollback().await.unwrap();
    /// # }
    /// # }
    /// ```
    pub async fn begin(
        &mut self,
        commit: impl Into<StatementSpec>,
    ) -> Result<GuardedTransaction<'_, DB>, Error> {
        GuardedTransaction::open_on(Conn::Borrowed(self), commit.into()).await
    }
}

impl<DB: Backend> GuardedPool<DB> {
    /// Acquires a connection for `scope` (`None`: the current scope) and begins a transaction
    /// that owns it ([`GuardedConnection::begin`]); its end (commit, rollback, drop) releases
    /// the connection.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) and [`GuardedConnection::begin`].
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire) and [`GuardedConnection::begin`].
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
    /// let mut tx = db.begin(&scope, "create").await.unwrap();
    /// tx.execute("ddl", sqlx::query("CREATE TABLE t (v INTEGER)")).await.unwrap();
    /// tx.commit().await.unwrap();
    /// scope.close();
    /// assert_eq!(scope.quiesce().await.succeeded(), 3); // BEGIN, CREATE, COMMIT
    /// # }
    /// # }
    /// ```
    pub async fn begin<'s>(
        &self,
        scope: impl Into<Option<&'s Scope>>,
        commit: impl Into<StatementSpec>,
    ) -> Result<GuardedTransaction<'static, DB>, Error> {
        let conn = self.acquire(scope).await?;
        GuardedTransaction::open_on(Conn::Owned(conn), commit.into()).await
    }
}

impl<'c, DB: Backend> GuardedTransaction<'c, DB> {
    async fn open_on(mut conn: Conn<'c, DB>, commit: StatementSpec) -> Result<Self, Error> {
        let commit = commit.resolve("COMMIT");
        let begin = ChildSpec::read_only(format!("{}: BEGIN", commit.name()));
        conn.get().execute(begin, ::sqlx::raw_sql("BEGIN")).await?;
        Ok(GuardedTransaction {
            conn: Some(conn),
            commit,
            open: true,
            depth: 0,
        })
    }

    /// Begins a transaction nested in this one, as sqlx's own nested `begin`: `SAVEPOINT`,
    /// ended by [`commit`](Self::commit) (`RELEASE SAVEPOINT`) or
    /// [`rollback`](Self::rollback) (`ROLLBACK TO SAVEPOINT`), rolled back to its savepoint
    /// if dropped open — so that this transaction goes on without what the nested one did
    /// (on PostgreSQL, also after a statement of the nested one failed: the rollback to the
    /// savepoint ends the aborted state). `name` names its statements' children.
    ///
    /// Its statements are children of the scope as this transaction's are. A nested commit
    /// commits nothing: only the outermost transaction's `COMMIT` does, and only it carries
    /// an effect, so `SAVEPOINT`, `RELEASE` and `ROLLBACK TO` are read-only children (cut off,
    /// `Cancelled`: the connection's clean-up then rolls the whole block back). After the
    /// scope's cancel nothing more is sent, and the whole transaction is rolled back.
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute) for the `SAVEPOINT`.
    ///
    /// # Cancel safety
    ///
    /// As [`execute`](Self::execute).
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
    /// let mut tx = db.begin(&scope, "order").await.unwrap();
    /// tx.execute("ddl", sqlx::query("CREATE TABLE lines (v)")).await.unwrap();
    /// tx.execute("line", sqlx::query("INSERT INTO lines VALUES (1)")).await.unwrap();
    ///
    /// let mut coupon = tx.begin("coupon").await.unwrap();
    /// coupon.execute("line", sqlx::query("INSERT INTO lines VALUES (-1)")).await.unwrap();
    /// drop(coupon); // rolled back to its savepoint
    ///
    /// let n: i64 = tx.fetch_one("count", sqlx::query_scalar("SELECT count(*) FROM lines"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(n, 1);
    /// tx.commit().await.unwrap();
    /// # }
    /// # }
    /// ```
    pub async fn begin(
        &mut self,
        name: impl Into<Arc<str>>,
    ) -> Result<GuardedTransaction<'_, DB>, Error> {
        let name = name.into();
        let depth = self.depth + 1;
        let spec = ChildSpec::read_only(format!("{name}: SAVEPOINT"));
        let sql = format!("SAVEPOINT {}", savepoint(depth));
        self.conn().execute(spec, ::sqlx::raw_sql(&sql)).await?;
        Ok(GuardedTransaction {
            conn: Some(Conn::Borrowed(self.conn())),
            commit: ChildSpec::read_only(name),
            open: true,
            depth,
        })
    }

    fn conn(&mut self) -> &mut GuardedConnection<DB> {
        match self.conn.as_mut() {
            Some(conn) => conn.get(),
            None => unreachable!("the connection is handed back only when the transaction ends"),
        }
    }

    /// Runs a statement in the transaction, as [`GuardedConnection::execute`] (see the type's
    /// docs for its receipt).
    ///
    /// # Errors
    ///
    /// As [`GuardedConnection::execute`].
    ///
    /// # Cancel safety
    ///
    /// As [`GuardedConnection::execute`].
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
    /// let done = tx.execute("insert", sqlx::query("INSERT INTO t VALUES (1)")).await.unwrap();
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
        let spec = spec.into().in_transaction(query.sql());
        self.conn().execute(spec, query).await
    }

    /// Runs a query in the transaction and returns all its rows, as
    /// [`GuardedConnection::fetch_all`].
    ///
    /// # Errors
    ///
    /// As [`GuardedConnection::fetch_all`].
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
    /// use cancel_scope::Scope;
    /// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
    /// let mut tx = db.begin(&Scope::new(), "read").await.unwrap();
    /// let v: Vec<i64> = tx.fetch_all("two", sqlx::query_scalar("SELECT 1 UNION ALL SELECT 2"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(v, [1, 2]);
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
        let spec = spec.into().in_transaction(query.sql());
        self.conn().fetch_all(spec, query).await
    }

    /// Runs a query in the transaction and returns its first row, as
    /// [`GuardedConnection::fetch_one`].
    ///
    /// # Errors
    ///
    /// As [`GuardedConnection::fetch_one`].
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
    /// use cancel_scope::Scope;
    /// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
    /// let mut tx = db.begin(&Scope::new(), "read").await.unwrap();
    /// let v: i64 = tx.fetch_one("one", sqlx::query_scalar("SELECT 1")).await.unwrap();
    /// assert_eq!(v, 1);
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
        let spec = spec.into().in_transaction(query.sql());
        self.conn().fetch_one(spec, query).await
    }

    /// Runs a query in the transaction and returns its first row, if any, as
    /// [`GuardedConnection::fetch_optional`].
    ///
    /// # Errors
    ///
    /// As [`GuardedConnection::fetch_optional`].
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
    /// use cancel_scope::Scope;
    /// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
    /// let mut tx = db.begin(&Scope::new(), "read").await.unwrap();
    /// let v: Option<i64> = tx.fetch_optional("none", sqlx::query_scalar("SELECT 1 WHERE 0"))
    ///     .await
    ///     .unwrap();
    /// assert_eq!(v, None);
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
        let spec = spec.into().in_transaction(query.sql());
        self.conn().fetch_optional(spec, query).await
    }

    /// Streams a query's rows in the transaction, as [`GuardedConnection::fetch`].
    ///
    /// # Errors
    ///
    /// As items: those of [`GuardedConnection::fetch`].
    ///
    /// # Cancel safety
    ///
    /// As [`GuardedConnection::fetch`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use futures::TryStreamExt;
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// let db = GuardedPool::new(sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap());
    /// let mut tx = db.begin(&Scope::new(), "read").await.unwrap();
    /// let v: Vec<i64> = tx
    ///     .fetch("two", sqlx::query_scalar::<_, i64>("SELECT 1 UNION ALL SELECT 2"))
    ///     .try_collect()
    ///     .await
    ///     .unwrap();
    /// assert_eq!(v, [1, 2]);
    /// # }
    /// # }
    /// ```
    pub fn fetch<'t, 'q: 't, Q, T>(
        &'t mut self,
        spec: impl Into<StatementSpec>,
        query: Q,
    ) -> RowStream<'t, T>
    where
        Q: 'q + TypedQuery<'q, DB, Row = T>,
        T: Send + 'q,
    {
        let spec = spec.into().in_transaction(query.sql());
        self.conn().fetch(spec, query)
    }

    /// Commits the transaction: `COMMIT`, registered with the spec given to `begin`. A
    /// transaction that owns its connection then releases it
    /// ([`GuardedConnection::release`]). A nested transaction ([`begin`](Self::begin) on a
    /// transaction) is released into its outer one instead (`RELEASE SAVEPOINT`, a
    /// read-only child): nothing is committed before the outermost `COMMIT`.
    ///
    /// # Errors
    ///
    /// As [`GuardedConnection::execute`]. [`Error::is_effect_unknown`]: the `COMMIT` was cut
    /// off (by the scope's cancel, or with its session) after it was sent, and may have
    /// committed (its receipt is `EffectUnknown`); [`Error::is_rolled_back`]: the database
    /// rolled the transaction back instead (PostgreSQL, after a statement of the
    /// transaction failed: its receipt is `Failed`); otherwise nothing was committed, and
    /// the transaction is rolled back as if dropped.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the `COMMIT` like a cancel does: it is `EffectUnknown`, and
    /// the connection goes to clean-up.
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
    /// let mut tx = db.begin(&scope, "ddl").await.unwrap();
    /// tx.execute("create", sqlx::query("CREATE TABLE t (v)")).await.unwrap();
    /// scope.cancel();
    /// let err = tx.commit().await.unwrap_err();
    /// assert!(err.is_cancelled() && !err.is_effect_unknown()); // refused: nothing committed
    /// # }
    /// # }
    /// ```
    pub async fn commit(mut self) -> Result<(), Error> {
        let spec = self.commit.clone();
        let sql = match self.depth {
            0 => "COMMIT".to_owned(),
            depth => format!("RELEASE SAVEPOINT {}", savepoint(depth)),
        };
        match self.conn().execute(spec, ::sqlx::raw_sql(&sql)).await {
            Ok(_) => {}
            // The block ended all the same, by the server's rollback.
            Err(e) if e.is_rolled_back() => {
                self.open = false;
                self.hand_back().await;
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        self.open = false;
        self.hand_back().await;
        Ok(())
    }

    /// Rolls the transaction back (`ROLLBACK`, a read-only child of the scope). A transaction
    /// that owns its connection then releases it. A nested transaction is rolled back to its
    /// savepoint (`ROLLBACK TO SAVEPOINT`), and its outer one goes on.
    ///
    /// After the scope's cancel (or whenever the scope refuses the `ROLLBACK`, or cuts it
    /// off) nothing more can be sent through it, and none is needed: the transaction can
    /// never commit, and the connection's release rolls it back before the connection goes
    /// back to the pool (a transaction that owns its connection has released it, clean, when
    /// this returns). That is `Ok` too.
    ///
    /// # Errors
    ///
    /// [`Error::is_database`]: the database refused the `ROLLBACK` (the connection's release
    /// still rolls back a block left open).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the transaction to be rolled back as if dropped.
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
    /// let mut tx = db.begin(&scope, "ddl").await.unwrap();
    /// tx.execute("create", sqlx::query("CREATE TABLE t (v)")).await.unwrap();
    /// scope.cancel();
    /// tx.rollback().await.unwrap(); // nothing sent: the release rolled it back
    /// # }
    /// # }
    /// ```
    pub async fn rollback(mut self) -> Result<(), Error> {
        let depth = self.depth;
        // It undoes what nested transactions dropped open did: their rollbacks need not run.
        self.conn().forget_rollbacks_from(depth);
        let (what, sql) = match depth {
            0 => ("ROLLBACK", DB::ROLLBACK.to_owned()),
            depth => ("ROLLBACK TO SAVEPOINT", rollback_to_savepoint(depth)),
        };
        let spec = ChildSpec::read_only(format!("{}: {what}", self.commit.name()));
        let out = self.conn().execute(spec, ::sqlx::raw_sql(&sql)).await;
        match out {
            Ok(_) => self.open = false,
            // Still open, perhaps: rolled back later, as if dropped.
            Err(e) if e.is_database() => return Err(e),
            Err(_) => {}
        }
        self.hand_back().await;
        Ok(())
    }

    /// The transaction ended: an owned connection is released now (rolling back a block left
    /// open, if the transaction is still open).
    async fn hand_back(&mut self) {
        if self.open {
            let depth = self.depth;
            self.conn().roll_back_later(depth);
            self.open = false;
        }
        if let Some(Conn::Owned(conn)) = self.conn.take() {
            conn.release().await;
        }
    }
}

impl<DB: Backend> Deref for GuardedTransaction<'_, DB> {
    type Target = GuardedConnection<DB>;

    /// The connection the transaction runs on (its [`scope`](GuardedConnection::scope)).
    fn deref(&self) -> &GuardedConnection<DB> {
        match &self.conn {
            Some(Conn::Owned(conn)) => conn,
            Some(Conn::Borrowed(conn)) => conn,
            None => unreachable!("the connection is handed back only when the transaction ends"),
        }
    }
}

impl<DB: Backend> Drop for GuardedTransaction<'_, DB> {
    fn drop(&mut self) {
        if self.open {
            // Rolled back before the connection's next statement; an owned connection,
            // dropped now, by its release.
            if let Some(conn) = self.conn.as_mut() {
                conn.get().roll_back_later(self.depth);
            }
        }
    }
}

impl<DB: Backend> fmt::Debug for GuardedTransaction<'_, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedTransaction")
            .field("commit", &self.commit)
            .field("open", &self.open)
            .field("depth", &self.depth)
            .field(
                "owns_connection",
                &matches!(self.conn, Some(Conn::Owned(_))),
            )
            .finish_non_exhaustive()
    }
}

/// The savepoint of a transaction nested `depth` deep.
fn savepoint(depth: usize) -> String {
    format!("cancel_scope_savepoint_{depth}")
}

/// Rolls back to the savepoint of a transaction nested `depth` deep and ends it, as if it had
/// never been (`ROLLBACK TO` alone keeps the savepoint).
pub(super) fn rollback_to_savepoint(depth: usize) -> String {
    let name = savepoint(depth);
    format!("ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
}
