//! What a statement is: its typed rows ([`TypedQuery`]) and its effect class
//! ([`StatementSpec`], read from its SQL when the caller does not say).

use std::sync::Arc;

use ::sqlx::query::{Query, QueryAs, QueryScalar};
use ::sqlx::{Database, Execute, FromRow, IntoArguments, RawSql};

use crate::ChildSpec;

/// A sqlx query whose rows the guard can hand back typed, as sqlx itself would:
/// `sqlx::query` and `sqlx::raw_sql` give the database's rows, `sqlx::query_as` a
/// [`FromRow`] type, `sqlx::query_scalar` the first column.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use cancel_scope::integrations::sqlx::GuardedPool;
/// use cancel_scope::Scope;
///
/// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
/// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
/// let scope = Scope::new();
/// // Any `FromRow` type: a tuple here, or a `#[derive(sqlx::FromRow)]` struct.
/// let (id, name): (i64, String) = db
///     .fetch_one(&scope, "item", sqlx::query_as("SELECT 7, 'pen'"))
///     .await
///     .unwrap();
/// assert_eq!((id, name.as_str()), (7, "pen"));
/// let n: i64 = db.fetch_one(&scope, "count", sqlx::query_scalar("SELECT 3")).await.unwrap();
/// assert_eq!(n, 3);
/// # }
/// # }
/// ```
pub trait TypedQuery<'q, DB: Database>: Execute<'q, DB> {
    /// What each row becomes.
    type Row: Send + Unpin;

    /// Decodes one row.
    ///
    /// # Errors
    ///
    /// The row does not decode into [`Row`](TypedQuery::Row) (sqlx's `ColumnDecode`,
    /// `ColumnNotFound`, …).
    fn decode(row: DB::Row) -> Result<Self::Row, ::sqlx::Error>;
}

impl<'q, DB, A> TypedQuery<'q, DB> for Query<'q, DB, A>
where
    DB: Database,
    A: 'q + Send + IntoArguments<'q, DB>,
{
    type Row = DB::Row;
    fn decode(row: DB::Row) -> Result<DB::Row, ::sqlx::Error> {
        Ok(row)
    }
}

impl<'q, DB, O, A> TypedQuery<'q, DB> for QueryAs<'q, DB, O, A>
where
    DB: Database,
    A: 'q + Send + IntoArguments<'q, DB>,
    O: Send + Unpin + for<'r> FromRow<'r, DB::Row>,
{
    type Row = O;
    fn decode(row: DB::Row) -> Result<O, ::sqlx::Error> {
        O::from_row(&row)
    }
}

impl<'q, DB, O, A> TypedQuery<'q, DB> for QueryScalar<'q, DB, O, A>
where
    DB: Database,
    A: 'q + Send + IntoArguments<'q, DB>,
    O: Send + Unpin,
    (O,): for<'r> FromRow<'r, DB::Row>,
{
    type Row = O;
    fn decode(row: DB::Row) -> Result<O, ::sqlx::Error> {
        <(O,)>::from_row(&row).map(|(o,)| o)
    }
}

impl<'q, DB: Database> TypedQuery<'q, DB> for RawSql<'q> {
    type Row = DB::Row;
    fn decode(row: DB::Row) -> Result<DB::Row, ::sqlx::Error> {
        Ok(row)
    }
}

impl<'q, DB: Database> TypedQuery<'q, DB> for &'q str {
    type Row = DB::Row;
    fn decode(row: DB::Row) -> Result<DB::Row, ::sqlx::Error> {
        Ok(row)
    }
}

/// How a statement is registered as a child of its scope: a [`ChildSpec`] you give, or just
/// a name, and then its effect class is read from the SQL.
///
/// From a name, a statement is read-only when every statement in its text is a `SELECT`
/// (without `INTO`), a `WITH … SELECT` whose parts change nothing, `VALUES`, `TABLE`, `SHOW`,
/// an `EXPLAIN` that does not `ANALYZE` (which runs the statement), or a transaction or
/// session statement that commits nothing (`BEGIN`, `START`, `ROLLBACK`, `SAVEPOINT`,
/// `RELEASE`, `SET`, `RESET`). Anything else — `INSERT`, `UPDATE`, `DELETE`, `MERGE`,
/// `COMMIT`, DDL, `CALL`, `PRAGMA`, whatever is not recognised — may have an effect: it is
/// registered [`ChildSpec::side_effecting`] with the name as its effect id, so that a write
/// cut off after it was sent is `EffectUnknown`, never `Cancelled`. (A `SELECT` of a
/// function that writes is not seen: give a [`ChildSpec`] for it.)
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use cancel_scope::integrations::sqlx::StatementSpec;
/// use cancel_scope::ChildSpec;
///
/// let read = StatementSpec::from("list-users").resolve("SELECT id FROM users");
/// assert!(!read.effect().may_have_effect());
/// let write = StatementSpec::from("archive").resolve(
///     "WITH gone AS (DELETE FROM users WHERE old RETURNING id) SELECT count(*) FROM gone",
/// );
/// assert!(write.effect().may_have_effect());
/// // A spec you give is kept as it is.
/// let given = StatementSpec::from(ChildSpec::idempotent("put", "order-7")).resolve("SELECT 1");
/// assert_eq!(given.effect().key(), Some("order-7"));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatementSpec(Inner);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Inner {
    Given(ChildSpec),
    Named(Arc<str>),
}

impl StatementSpec {
    /// The child spec for a statement with text `sql`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use cancel_scope::integrations::sqlx::StatementSpec;
    /// let spec = StatementSpec::from("add").resolve("INSERT INTO t VALUES (1)");
    /// assert_eq!(spec.effect_record().unwrap().effect_id(), "add");
    /// # }
    /// ```
    pub fn resolve(self, sql: &str) -> ChildSpec {
        match self.0 {
            Inner::Given(spec) => spec,
            Inner::Named(name) if read_only(sql) => ChildSpec::read_only(name),
            Inner::Named(name) => ChildSpec::side_effecting(name.clone(), name),
        }
    }
}

impl StatementSpec {
    /// The spec of a statement inside a transaction block: a statement given only a name has
    /// no effect of its own there (nothing takes effect before the block's `COMMIT`, and a
    /// block cut off is rolled back), so it is read-only — unless its text may end the block
    /// (`COMMIT`, `END`, `PREPARE`), when it is resolved as outside one. A [`ChildSpec`] given
    /// is kept as it is (a statement whose effect does not wait for the commit).
    pub(super) fn in_transaction(self, sql: &str) -> ChildSpec {
        match self.0 {
            Inner::Named(name)
                if !words(sql)
                    .iter()
                    .any(|w| matches!(w.as_str(), "COMMIT" | "END" | "PREPARE")) =>
            {
                ChildSpec::read_only(name)
            }
            inner => StatementSpec(inner).resolve(sql),
        }
    }
}

impl From<ChildSpec> for StatementSpec {
    fn from(spec: ChildSpec) -> Self {
        StatementSpec(Inner::Given(spec))
    }
}

impl From<&str> for StatementSpec {
    fn from(name: &str) -> Self {
        StatementSpec(Inner::Named(name.into()))
    }
}

impl From<String> for StatementSpec {
    fn from(name: String) -> Self {
        StatementSpec(Inner::Named(name.into()))
    }
}

impl From<Arc<str>> for StatementSpec {
    fn from(name: Arc<str>) -> Self {
        StatementSpec(Inner::Named(name))
    }
}

/// Whether `sql` is one statement that ends a transaction block by committing it (`COMMIT`,
/// `END`; not `COMMIT PREPARED`, which ends no block of the session's).
pub(super) fn is_commit(sql: &str) -> bool {
    let words = words(sql);
    let mut statements = words.split(|w| w == ";").filter(|s| !s.is_empty());
    match (statements.next(), statements.next()) {
        (Some([first, rest @ ..]), None) => {
            matches!(first.as_str(), "COMMIT" | "END") && !rest.iter().any(|w| w == "PREPARED")
        }
        _ => false,
    }
}

/// Whether every statement of `sql` is known to change nothing (see [`StatementSpec`]).
fn read_only(sql: &str) -> bool {
    let words = words(sql);
    let mut statements = words.split(|w| w == ";").filter(|s| !s.is_empty());
    statements.all(statement_reads_only) && !words.is_empty()
}

/// One statement's words (upper-cased keywords and identifiers, `(`, `)`; no strings,
/// quoted names or comments).
fn statement_reads_only(words: &[String]) -> bool {
    let at_top = |word: &str| top_level(words).any(|w| w == word);
    let anywhere = |word: &str| words.iter().any(|w| w == word);
    let Some(first) = words.iter().find(|w| *w != "(") else {
        return true;
    };
    match first.as_str() {
        "SELECT" | "VALUES" | "TABLE" => !at_top("INTO"),
        // A data-modifying part makes the whole statement a write.
        "WITH" => !["INSERT", "UPDATE", "DELETE", "MERGE"]
            .iter()
            .any(|w| anywhere(w)),
        "EXPLAIN" => !anywhere("ANALYZE") && !anywhere("ANALYSE"),
        "SHOW" | "BEGIN" | "START" | "SAVEPOINT" | "RELEASE" | "SET" | "RESET" => true,
        // `ROLLBACK`, `ROLLBACK TO`; a prepared transaction's end is left to the caller.
        "ROLLBACK" => !anywhere("PREPARED"),
        _ => false,
    }
}

/// The words of a statement outside parentheses.
fn top_level(words: &[String]) -> impl Iterator<Item = &String> {
    let mut depth = 0_i32;
    words.iter().filter(move |w| match w.as_str() {
        "(" => {
            depth += 1;
            false
        }
        ")" => {
            depth -= 1;
            false
        }
        _ => depth == 0,
    })
}

/// Splits SQL into upper-cased words, `(`, `)` and `;`, skipping string literals, quoted
/// identifiers (`"…"`, `` `…` ``, `[…]`), PostgreSQL dollar-quoted strings and comments.
fn words(sql: &str) -> Vec<String> {
    let b = sql.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    let skip_to = |from: usize, end: &[u8]| {
        b[from..]
            .windows(end.len())
            .position(|w| w == end)
            .map_or(b.len(), |p| from + p + end.len())
    };
    while i < b.len() {
        let c = b[i];
        i = match c {
            b'-' if b.get(i + 1) == Some(&b'-') => skip_to(i + 2, b"\n"),
            b'/' if b.get(i + 1) == Some(&b'*') => skip_to(i + 2, b"*/"),
            b'\'' => skip_to(i + 1, b"'"),
            b'"' => skip_to(i + 1, b"\""),
            b'`' => skip_to(i + 1, b"`"),
            b'[' => skip_to(i + 1, b"]"),
            b'$' => {
                // `$tag$ … $tag$` (a `$1` parameter has no closing `$`).
                let tag_end = b[i + 1..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
                    .map(|p| i + 1 + p);
                match tag_end {
                    Some(e) if b[e] == b'$' && !b[i + 1..e].iter().all(u8::is_ascii_digit) => {
                        skip_to(e + 1, &b[i..=e])
                    }
                    Some(e) if b[e] == b'$' && i + 1 == e => skip_to(e + 1, b"$$"),
                    _ => i + 1,
                }
            }
            b'(' | b')' | b';' => {
                out.push((c as char).to_string());
                i + 1
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let end = b[i..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
                    .map_or(b.len(), |p| i + p);
                out.push(sql[i..end].to_ascii_uppercase());
                end
            }
            _ => i + 1,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{is_commit, read_only};

    #[test]
    fn a_commit_is_one_statement_that_commits_the_block() {
        for sql in [
            "COMMIT",
            " commit work; ",
            "END TRANSACTION",
            "COMMIT AND CHAIN",
        ] {
            assert!(is_commit(sql), "{sql}");
        }
        for sql in [
            "ROLLBACK",
            "COMMIT PREPARED 'x'",
            "SELECT 1; COMMIT",
            "",
            "-- COMMIT",
        ] {
            assert!(!is_commit(sql), "{sql}");
        }
    }

    #[test]
    fn reads_are_recognised_and_everything_else_may_have_an_effect() {
        for sql in [
            "SELECT 1",
            "  select * from t where note = 'DELETE me' -- UPDATE\n",
            "/* INSERT */ SELECT 1",
            "(SELECT 1) UNION (SELECT 2)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
            "SHOW statement_timeout",
            "EXPLAIN SELECT 1",
            "VALUES (1), (2)",
            "SELECT $1, $$ DELETE $$, $q$ INSERT $q$",
            "SELECT \"delete\" FROM t",
            "BEGIN; SELECT 1; ROLLBACK",
            "SELECT 1 FOR UPDATE",
        ] {
            assert!(read_only(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "update t set v = 2",
            "DELETE FROM t",
            "MERGE INTO t USING s ON true WHEN MATCHED THEN DELETE",
            "WITH gone AS (DELETE FROM t RETURNING id) SELECT count(*) FROM gone",
            "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
            "EXPLAIN (ANALYZE, BUFFERS) SELECT 1",
            "SELECT 1 INTO new_table",
            "CREATE TABLE t (v int)",
            "DROP TABLE t",
            "COMMIT",
            "SELECT 1; DELETE FROM t",
            "PRAGMA user_version = 3",
            "CALL p()",
            "VACUUM",
            "",
            "-- only a comment",
            "ROLLBACK PREPARED 'x'",
        ] {
            assert!(!read_only(sql), "{sql}");
        }
    }
}
