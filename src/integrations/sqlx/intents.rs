//! A durable [`IntentStore`] in a PostgreSQL table.

use std::fmt;
use std::time::{Duration, SystemTime};

use ::sqlx::postgres::{PgPool, PgRow};
use ::sqlx::Row;

use crate::reconcile::{
    check_len, Intent, IntentError, IntentRecord, IntentStore, Resolution, Resolved,
};
use crate::registry::BoxFuture;

/// The table [`PgIntentStore`] uses unless told otherwise, in schema `public`.
///
/// # Examples
///
/// ```
/// use cancel_scope::integrations::sqlx::DEFAULT_INTENT_TABLE;
/// assert_eq!(DEFAULT_INTENT_TABLE, "cancel_scope_intents");
/// ```
pub const DEFAULT_INTENT_TABLE: &str = "cancel_scope_intents";

/// The longest schema or table name (so that the index name, `{table}_pending`, fits
/// PostgreSQL's 63 bytes).
const MAX_IDENT_LEN: usize = 55;

/// An advisory lock key (`cancel-scope intents`, as bytes) held while the table is created,
/// so that processes starting together do not race their `CREATE`s.
const DDL_LOCK: i64 = 0x6373_696e_7465_6e74;

/// Intents in a PostgreSQL table, created if missing: durable, shared by every process that
/// uses the same table.
///
/// * **The table.** One row per effect id (the primary key): name, class, payload digest,
///   provider handle, operation id, attempts, `recorded_at` (the server's clock), and the
///   resolution with its time; a partial index on the pending rows by `recorded_at`.
///   [`open`](PgIntentStoreBuilder::open) creates the schema (if it is not `public`), the
///   table and the index where they are missing, under an advisory lock so that processes
///   starting together do not race.
/// * **At least once, idempotent by effect id.** `record` is one `INSERT … ON CONFLICT
///   (effect_id) DO UPDATE` (another attempt: pending again, one more attempt); `resolve` is
///   one `UPDATE … WHERE resolution IS NULL`, so of two racing resolves exactly one finds the
///   row pending.
/// * **`pg_catalog`-qualified.** Every function, operator and type the statements name is
///   written against `pg_catalog` (operators as `OPERATOR(pg_catalog.=)`, which all bind alike:
///   the statements parenthesize), and the table is always schema-qualified and quoted, so no
///   object on a user's `search_path` can stand in for them.
///
/// Each call is one statement on a connection of the pool (autocommit): durable when it
/// returns, under the server's `synchronous_commit`.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use cancel_scope::integrations::sqlx::PgIntentStore;
/// use cancel_scope::reconcile::{Journal, Reconciler};
///
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
/// let store = Arc::new(PgIntentStore::builder(pool).schema("ops").open().await?);
/// let journal = Journal::new(store.clone()); // around the dispatches
/// let reconciler = Reconciler::new(store); // in any process, after a crash
/// # let _ = (journal, reconciler); Ok(()) }
/// ```
pub struct PgIntentStore {
    pool: PgPool,
    /// `"schema"."table"`, quoted.
    table: String,
    sql: Statements,
}

/// The settings of a [`PgIntentStore`], then [`open`](Self::open).
///
/// # Examples
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), cancel_scope::reconcile::IntentError> {
/// use cancel_scope::integrations::sqlx::PgIntentStore;
/// let store = PgIntentStore::builder(pool).schema("ops").table("intents").open().await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `open` is called"]
pub struct PgIntentStoreBuilder {
    pool: PgPool,
    schema: String,
    table: String,
}

/// The statements, written once for the table.
struct Statements {
    record: String,
    note: String,
    resolve: String,
    resolution: String,
    pending: String,
    get: String,
}

const COLUMNS: &str = "effect_id, name, class, payload_digest, provider_handle, operation_id, \
     attempts, pg_catalog.date_part('epoch', recorded_at), resolution, \
     pg_catalog.date_part('epoch', resolved_at)";

impl Statements {
    fn new(t: &str) -> Statements {
        Statements {
            record: format!(
                "INSERT INTO {t} AS i (effect_id, name, class, payload_digest, provider_handle, operation_id) \
                 VALUES ($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, \
                         $4::pg_catalog.text, $5::pg_catalog.text, $6::pg_catalog.text) \
                 ON CONFLICT (effect_id) DO UPDATE SET \
                   name = EXCLUDED.name, class = EXCLUDED.class, \
                   payload_digest = COALESCE(EXCLUDED.payload_digest, i.payload_digest), \
                   provider_handle = COALESCE(EXCLUDED.provider_handle, i.provider_handle), \
                   operation_id = COALESCE(EXCLUDED.operation_id, i.operation_id), \
                   attempts = i.attempts OPERATOR(pg_catalog.+) 1, \
                   resolution = NULL, resolved_at = NULL"
            ),
            note: format!(
                "UPDATE {t} SET provider_handle = $2::pg_catalog.text \
                 WHERE effect_id OPERATOR(pg_catalog.=) $1::pg_catalog.text"
            ),
            resolve: format!(
                "UPDATE {t} SET resolution = $2::pg_catalog.text, \
                   resolved_at = pg_catalog.clock_timestamp(), \
                   provider_handle = COALESCE($3::pg_catalog.text, provider_handle) \
                 WHERE effect_id OPERATOR(pg_catalog.=) $1::pg_catalog.text AND resolution IS NULL \
                 RETURNING effect_id"
            ),
            resolution: format!(
                "SELECT resolution FROM {t} WHERE effect_id OPERATOR(pg_catalog.=) $1::pg_catalog.text"
            ),
            pending: format!(
                "SELECT {COLUMNS} FROM {t} \
                 WHERE resolution IS NULL AND recorded_at OPERATOR(pg_catalog.<=) \
                   (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) \
                    ($1::pg_catalog.float8 OPERATOR(pg_catalog.*) '1 millisecond'::pg_catalog.interval)) \
                 ORDER BY recorded_at, effect_id LIMIT $2::pg_catalog.int8"
            ),
            get: format!(
                "SELECT {COLUMNS} FROM {t} WHERE effect_id OPERATOR(pg_catalog.=) $1::pg_catalog.text"
            ),
        }
    }
}

/// `name` as a quoted identifier, if it is a plain one (letters, digits, `_`, not starting
/// with a digit, at most [`MAX_IDENT_LEN`] bytes): nothing else can reach the SQL.
fn identifier(name: &str) -> Result<String, IntentError> {
    let plain = !name.is_empty()
        && name.len() <= MAX_IDENT_LEN
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !plain {
        return Err(IntentError::invalid(
            "a schema or table name must be 1 to 55 letters, digits or underscores, not starting with a digit",
        ));
    }
    Ok(format!("\"{name}\""))
}

impl PgIntentStore {
    /// Starts opening a store on `pool`, in table [`DEFAULT_INTENT_TABLE`] of schema
    /// `public`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), cancel_scope::reconcile::IntentError> {
    /// use cancel_scope::integrations::sqlx::PgIntentStore;
    /// let store = PgIntentStore::builder(pool).open().await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn builder(pool: PgPool) -> PgIntentStoreBuilder {
        PgIntentStoreBuilder {
            pool,
            schema: "public".to_owned(),
            table: DEFAULT_INTENT_TABLE.to_owned(),
        }
    }

    /// The pool.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), cancel_scope::reconcile::IntentError> {
    /// use cancel_scope::integrations::sqlx::PgIntentStore;
    /// let store = PgIntentStore::builder(pool).open().await?;
    /// let _pool = store.pool();
    /// # Ok(()) }
    /// ```
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table, schema-qualified and quoted (`"public"."cancel_scope_intents"`), for
    /// queries of one's own.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), cancel_scope::reconcile::IntentError> {
    /// use cancel_scope::integrations::sqlx::PgIntentStore;
    /// let store = PgIntentStore::builder(pool).open().await?;
    /// assert_eq!(store.table(), r#""public"."cancel_scope_intents""#);
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        &self.table
    }

    async fn record_row(&self, intent: &Intent) -> Result<(), IntentError> {
        intent.validate()?;
        ::sqlx::query(&self.sql.record)
            .bind(intent.effect_id())
            .bind(intent.name())
            .bind(intent.class().as_str())
            .bind(intent.payload_digest_str())
            .bind(intent.provider_handle_str())
            .bind(intent.operation_id())
            .execute(&self.pool)
            .await
            .map_err(|e| self.fault(e))?;
        Ok(())
    }

    async fn note_row(&self, effect_id: &str, handle: &str) -> Result<(), IntentError> {
        check_len(effect_id)?;
        check_len(handle)?;
        ::sqlx::query(&self.sql.note)
            .bind(effect_id)
            .bind(handle)
            .execute(&self.pool)
            .await
            .map_err(|e| self.fault(e))?;
        Ok(())
    }

    async fn resolve_row(
        &self,
        effect_id: &str,
        resolution: Resolution,
        handle: Option<&str>,
    ) -> Result<Resolved, IntentError> {
        check_len(effect_id)?;
        if let Some(h) = handle {
            check_len(h)?;
        }
        // A record racing in between (the row pending again after the update missed it) is
        // tried once more; a third time would mean a livelock of retries, reported as such.
        for _ in 0..3 {
            let updated = ::sqlx::query(&self.sql.resolve)
                .bind(effect_id)
                .bind(resolution.as_str())
                .bind(handle)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.fault(e))?;
            if updated.is_some() {
                return Ok(Resolved::Now);
            }
            let earlier: Option<Option<String>> = ::sqlx::query_scalar(&self.sql.resolution)
                .bind(effect_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.fault(e))?;
            match earlier {
                None => return Ok(Resolved::Unknown),
                Some(Some(r)) => return Ok(Resolved::Already(r.parse()?)),
                Some(None) => continue,
            }
        }
        Err(IntentError::store(
            "the intent was recorded again at every try to resolve it",
        ))
    }

    async fn pending_rows(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<IntentRecord>, IntentError> {
        let rows = ::sqlx::query(&self.sql.pending)
            .bind(older_than.as_secs_f64() * 1000.0)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.fault(e))?;
        rows.iter().map(record_of).collect()
    }

    async fn get_row(&self, effect_id: &str) -> Result<Option<IntentRecord>, IntentError> {
        check_len(effect_id)?;
        let row = ::sqlx::query(&self.sql.get)
            .bind(effect_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.fault(e))?;
        row.as_ref().map(record_of).transpose()
    }

    fn fault(&self, e: ::sqlx::Error) -> IntentError {
        fault(e, self.pool.options().get_acquire_timeout())
    }
}

/// What a sqlx error means for the caller (`acquire`: the pool's acquire timeout).
fn fault(e: ::sqlx::Error, acquire: Duration) -> IntentError {
    match e {
        ::sqlx::Error::PoolTimedOut => IntentError::timeout(acquire),
        ::sqlx::Error::Io(_) | ::sqlx::Error::PoolClosed | ::sqlx::Error::Tls(_) => {
            IntentError::unreachable(e)
        }
        e => IntentError::store(e),
    }
}

/// A row of [`COLUMNS`] as a record.
fn record_of(row: &PgRow) -> Result<IntentRecord, IntentError> {
    let get = |e: ::sqlx::Error| IntentError::store(e);
    let class: String = row.try_get(2).map_err(get)?;
    let mut intent = Intent::new(
        row.try_get::<String, _>(0).map_err(get)?,
        row.try_get::<String, _>(1).map_err(get)?,
        class.parse()?,
    );
    if let Some(d) = row.try_get::<Option<String>, _>(3).map_err(get)? {
        intent = intent.payload_digest(d);
    }
    if let Some(h) = row.try_get::<Option<String>, _>(4).map_err(get)? {
        intent = intent.provider_handle(h);
    }
    if let Some(o) = row.try_get::<Option<String>, _>(5).map_err(get)? {
        intent = intent.operation(o);
    }
    let attempts: i32 = row.try_get(6).map_err(get)?;
    let recorded_at = wall_clock(row.try_get(7).map_err(get)?);
    let resolution = match (
        row.try_get::<Option<String>, _>(8).map_err(get)?,
        row.try_get::<Option<f64>, _>(9).map_err(get)?,
    ) {
        (Some(r), Some(at)) => Some((r.parse()?, wall_clock(at))),
        _ => None,
    };
    Ok(IntentRecord::new(
        intent,
        recorded_at,
        u32::try_from(attempts).unwrap_or(0),
        resolution,
    ))
}

/// Seconds since the Unix epoch (as `date_part('epoch', …)` gives them) on the wall clock.
fn wall_clock(epoch_secs: f64) -> SystemTime {
    Duration::try_from_secs_f64(epoch_secs)
        .ok()
        .and_then(|d| SystemTime::UNIX_EPOCH.checked_add(d))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

impl PgIntentStoreBuilder {
    /// The schema of the table (default `public`; created if missing).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), cancel_scope::reconcile::IntentError> {
    /// use cancel_scope::integrations::sqlx::PgIntentStore;
    /// let store = PgIntentStore::builder(pool).schema("ops").open().await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn schema(mut self, schema: impl Into<String>) -> PgIntentStoreBuilder {
        self.schema = schema.into();
        self
    }

    /// The table's name (default [`DEFAULT_INTENT_TABLE`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), cancel_scope::reconcile::IntentError> {
    /// use cancel_scope::integrations::sqlx::PgIntentStore;
    /// let store = PgIntentStore::builder(pool).table("payment_intents").open().await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn table(mut self, table: impl Into<String>) -> PgIntentStoreBuilder {
        self.table = table.into();
        self
    }

    /// Creates what is missing (schema, table, index) and returns the store.
    ///
    /// # Errors
    ///
    /// [`IntentError::is_invalid`] for a schema or table name that is not a plain identifier;
    /// a fault if the server cannot be reached or refuses the statements.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), cancel_scope::reconcile::IntentError> {
    /// use cancel_scope::integrations::sqlx::PgIntentStore;
    /// let store = PgIntentStore::builder(pool).open().await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn open(self) -> Result<PgIntentStore, IntentError> {
        let schema = identifier(&self.schema)?;
        let name = identifier(&self.table)?;
        let index = identifier(&format!("{}_pending", self.table))?;
        let table = format!("{schema}.{name}");
        let acquire = self.pool.options().get_acquire_timeout();
        let fault = |e| fault(e, acquire);
        let mut tx = self.pool.begin().await.map_err(fault)?;
        ::sqlx::query("SELECT pg_catalog.pg_advisory_xact_lock($1::pg_catalog.int8)")
            .bind(DDL_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(fault)?;
        let schema_exists: bool = ::sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace \
             WHERE nspname OPERATOR(pg_catalog.=) $1::pg_catalog.text)",
        )
        .bind(&self.schema)
        .fetch_one(&mut *tx)
        .await
        .map_err(fault)?;
        if !schema_exists {
            ::sqlx::query(&format!("CREATE SCHEMA {schema}"))
                .execute(&mut *tx)
                .await
                .map_err(fault)?;
        }
        ::sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {table} ( \
               effect_id pg_catalog.text PRIMARY KEY, \
               name pg_catalog.text NOT NULL, \
               class pg_catalog.text NOT NULL, \
               payload_digest pg_catalog.text, \
               provider_handle pg_catalog.text, \
               operation_id pg_catalog.text, \
               attempts pg_catalog.int4 NOT NULL DEFAULT 1, \
               recorded_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(), \
               resolution pg_catalog.text, \
               resolved_at pg_catalog.timestamptz)"
        ))
        .execute(&mut *tx)
        .await
        .map_err(fault)?;
        ::sqlx::query(&format!(
            "CREATE INDEX IF NOT EXISTS {index} ON {table} (recorded_at) WHERE resolution IS NULL"
        ))
        .execute(&mut *tx)
        .await
        .map_err(fault)?;
        tx.commit().await.map_err(fault)?;
        Ok(PgIntentStore {
            pool: self.pool,
            sql: Statements::new(&table),
            table,
        })
    }
}

impl IntentStore for PgIntentStore {
    fn record<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), IntentError>> {
        Box::pin(self.record_row(intent))
    }

    fn note_provider_handle<'a>(
        &'a self,
        effect_id: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<(), IntentError>> {
        Box::pin(self.note_row(effect_id, handle))
    }

    fn resolve<'a>(
        &'a self,
        effect_id: &'a str,
        resolution: Resolution,
        provider_handle: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Resolved, IntentError>> {
        Box::pin(self.resolve_row(effect_id, resolution, provider_handle))
    }

    fn pending<'a>(
        &'a self,
        older_than: Duration,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<IntentRecord>, IntentError>> {
        Box::pin(self.pending_rows(older_than, limit))
    }

    fn get<'a>(
        &'a self,
        effect_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<IntentRecord>, IntentError>> {
        Box::pin(self.get_row(effect_id))
    }
}

impl fmt::Debug for PgIntentStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgIntentStore")
            .field("table", &self.table)
            .finish()
    }
}
