//! Guarded row streams: `fetch`, as sqlx's, bounded by the scope.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

use super::connection::{arm, decode, settle, GuardedConnection, InFlight};
use super::{Backend, Error, GuardedPool, StatementSpec, TypedQuery};
use crate::Scope;

/// The rows of a guarded [`fetch`](GuardedConnection::fetch), as they come: a
/// [`Stream`] of `Result<T, Error>`, like sqlx's own.
///
/// The statement is one child of the scope for the whole stream: it is dispatched at the
/// first poll, `Succeeded` once the last row has been read, and, when the scope is
/// cancelled (or runs out of time) or the stream is dropped before its end, stopped on the
/// server like any cut-off statement (`Cancelled`, or `EffectUnknown` for a write), its last
/// item then being the cause.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # #[cfg(feature = "sqlx-sqlite")] {
/// use futures::TryStreamExt;
/// use cancel_scope::integrations::sqlx::GuardedPool;
/// use cancel_scope::Scope;
///
/// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
/// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
/// let scope = Scope::new();
/// let mut conn = db.acquire(&scope).await.unwrap();
/// let mut rows = conn.fetch("series", sqlx::query_scalar::<_, i64>("SELECT 1 UNION ALL SELECT 2"));
/// let mut sum = 0;
/// while let Some(v) = rows.try_next().await.unwrap() {
///     sum += v;
/// }
/// assert_eq!(sum, 3);
/// # }
/// # }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct RowStream<'c, T> {
    inner: Pin<Box<dyn Stream<Item = Result<T, Error>> + Send + 'c>>,
}

impl<T> Stream for RowStream<'_, T> {
    type Item = Result<T, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl<T> fmt::Debug for RowStream<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowStream").finish_non_exhaustive()
    }
}

impl<DB: Backend> GuardedConnection<DB> {
    /// Runs a query and streams its rows (typed as [`fetch_all`](Self::fetch_all)'s), as a
    /// child of the scope registered with `spec`: see [`RowStream`].
    ///
    /// # Errors
    ///
    /// As items: those of [`fetch_all`](Self::fetch_all); a row that does not decode is an
    /// [`Error::is_database`] item, and the stream goes on.
    ///
    /// # Cancel safety
    ///
    /// Dropping the stream before its end stops the statement on the server.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # #[cfg(feature = "sqlx-sqlite")] {
    /// use futures::TryStreamExt;
    /// use cancel_scope::integrations::sqlx::GuardedPool;
    /// use cancel_scope::Scope;
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let mut conn = db.acquire(&Scope::new()).await.unwrap();
    /// let names: Vec<String> = conn
    ///     .fetch("names", sqlx::query_scalar("SELECT 'a' UNION ALL SELECT 'b'"))
    ///     .try_collect()
    ///     .await
    ///     .unwrap();
    /// assert_eq!(names, ["a", "b"]);
    /// # }
    /// # }
    /// ```
    pub fn fetch<'c, 'q: 'c, Q, T>(
        &'c mut self,
        spec: impl Into<StatementSpec>,
        query: Q,
    ) -> RowStream<'c, T>
    where
        Q: 'q + TypedQuery<'q, DB, Row = T>,
        T: Send + 'q,
    {
        let spec = spec.into();
        let inner = async_stream::stream! {
            if let Err(e) = self.roll_back_if_due().await {
                yield Err(e);
                return;
            }
            let dispatched = match self.start(spec, query.sql()) {
                Ok(d) => d,
                Err(e) => {
                    yield Err(e);
                    return;
                }
            };
            let scope = self.scope().clone();
            let mut flight = InFlight {
                conn: self,
                dispatched: Some(dispatched),
                sent: false,
            };
            let InFlight { conn, dispatched, sent } = &mut flight;
            let (Some((conn, state)), Some(dispatched)) = (conn.held(), dispatched.as_mut()) else {
                unreachable!("a statement in flight holds its connection");
            };
            let armed = tokio::select! {
                biased;
                () = scope.cancelled() => None,
                armed = arm::<DB>(conn, state, dispatched, sent, &scope, query.sql()) => Some(armed),
            };
            match armed {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    let sent = flight.sent;
                    yield Err(settle::<DB>(flight.land(), sent, e, &scope));
                    return;
                }
                None => {
                    let err = flight.cut_off(&scope);
                    drop(flight);
                    yield Err(err);
                    return;
                }
            }
            // (Dropped before `flight`, whose drop hands a cut-off statement to clean-up.)
            let mut rows = DB::fetch(&mut **conn, query);
            loop {
                let next = tokio::select! {
                    biased;
                    () = scope.cancelled() => None,
                    next = std::future::poll_fn(|cx| rows.as_mut().poll_next(cx)) => Some(next),
                };
                match next {
                    Some(Some(Ok(row))) => yield decode::<DB, Q>(row),
                    Some(None) => {
                        drop(rows);
                        flight.land().succeed();
                        return;
                    }
                    Some(Some(Err(e))) => {
                        drop(rows);
                        let sent = flight.sent;
                        yield Err(settle::<DB>(flight.land(), sent, e, &scope));
                        return;
                    }
                    None => {
                        drop(rows);
                        let err = flight.cut_off(&scope);
                        drop(flight);
                        yield Err(err);
                        return;
                    }
                }
            }
        };
        RowStream {
            inner: Box::pin(inner),
        }
    }
}

impl<DB: Backend> GuardedPool<DB> {
    /// Acquires a connection, streams one query's rows with [`GuardedConnection::fetch`]
    /// and releases the connection after the last row.
    ///
    /// `scope`: `None` for the current scope ([`Scope::try_current`]).
    ///
    /// # Errors
    ///
    /// As items: those of [`acquire`](Self::acquire) and [`GuardedConnection::fetch`].
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
    /// let options = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1); // one database
    /// let db = GuardedPool::new(options.connect("sqlite::memory:").await.unwrap());
    /// let n = db
    ///     .fetch(&Scope::new(), "three", sqlx::query("SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3"))
    ///     .try_fold(0, |n, _| async move { Ok(n + 1) })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(n, 3);
    /// # }
    /// # }
    /// ```
    pub fn fetch<'s, 'q, Q, T>(
        &self,
        scope: impl Into<Option<&'s Scope>>,
        spec: impl Into<StatementSpec>,
        query: Q,
    ) -> RowStream<'q, T>
    where
        Q: 'q + TypedQuery<'q, DB, Row = T>,
        T: Send + 'q,
    {
        let db = self.clone();
        let scope = scope.into().cloned();
        let spec = spec.into();
        let inner = async_stream::stream! {
            let mut conn = match db.acquire(scope.as_ref()).await {
                Ok(conn) => conn,
                Err(e) => {
                    yield Err(e);
                    return;
                }
            };
            {
                let mut rows = conn.fetch(spec, query);
                while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut rows).poll_next(cx)).await {
                    yield item;
                }
            }
            conn.release().await;
        };
        RowStream {
            inner: Box::pin(inner),
        }
    }
}
