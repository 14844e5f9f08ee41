//! A server's scope: every admitted request is its child, and its shutdown drains them.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Cause, EffectRecord, Report, Scope, DEFAULT_GRACE};

/// The scope of a server: the parent of the scope of every request admitted under it
/// ([`EndpointPolicy::admit_in`](super::EndpointPolicy::admit_in), or an
/// `integrations::tower::AdmitLayer` given it with `server`, feature `tower`), and the
/// handle of its graceful shutdown.
///
/// A request's scope is a child of the server's for cancel and quiescence: the server's
/// shutdown cancels the requests still running at its end, and waits until every request is
/// quiet. For its report it is a root: its receipts stay in it (the server pays nothing per
/// receipt, and keeps no record of the requests that are done) — except for the requests
/// still running when the shutdown begins, whose reports add up to the shutdown's.
///
/// [`shutdown(grace)`](Self::shutdown):
///
/// 1. stops admitting: a request that arrives from then on is refused with 503 /
///    `UNAVAILABLE`, `Retry-After` and `service-effect: none` (nothing was done for it), and
///    [`draining`](Self::draining) resolves (hand it to axum's `with_graceful_shutdown` or
///    tonic's `serve_with_shutdown`, which then stop accepting connections);
/// 2. waits up to `grace` for the requests in flight to be quiet (the handler answered, its
///    body was sent, the work it spawned ended);
/// 3. then cancels the rest with [`Cause::Shutdown`]: each answers as a request the server
///    stopped does — 503 / `UNAVAILABLE` with `Retry-After`, or, if it had dispatched a call
///    that may have had an effect, 500 / `UNKNOWN` with `service-effect: unknown` — and what
///    has not stopped after the server's [stop grace](Self::stop_grace) is quarantined;
/// 4. returns a [`ShutdownReport`]: the requests in flight, how many were cancelled, and the
///    sum of their reports (quarantined children, pending effects).
///
/// # Examples
///
/// With axum (`axum::serve(listener, app).with_graceful_shutdown(server.draining())`; the
/// whole program is `examples/graceful_shutdown.rs`, which CI runs):
///
/// ```ignore
/// # async fn run(app: axum::Router, listener: tokio::net::TcpListener) {
/// use std::time::Duration;
/// use cancel_scope::integrations::tower::AdmitLayer;
/// use cancel_scope::wire::{EndpointPolicy, ServerScope};
///
/// let server = ServerScope::new();
/// let policy = EndpointPolicy::builder(Duration::from_secs(10))
///     .default_budget(Duration::from_secs(2))
///     .build();
/// let app = app.layer(AdmitLayer::new(policy).server(&server));
/// let serving = tokio::spawn(
///     axum::serve(listener, app).with_graceful_shutdown(server.draining()).into_future(),
/// );
/// tokio::signal::ctrl_c().await.unwrap();
/// let report = server.shutdown(Duration::from_secs(10)).await;
/// eprintln!("{report}");
/// serving.await.unwrap().unwrap();
/// # }
/// ```
///
/// With tonic (`Server::builder().layer(..).add_service(..).serve_with_shutdown(addr,
/// server.draining())`), the same: the layer is given the server, `serve_with_shutdown` the
/// future, and `shutdown` is called on the signal (`examples/tonic/`).
///
/// Without a server framework, on virtual time:
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use cancel_scope::wire::{EndpointPolicy, Incoming, ServerScope};
/// use cancel_scope::Cause;
///
/// let server = ServerScope::new();
/// let policy = EndpointPolicy::builder(Duration::from_secs(60)).build();
/// let (request, _) = policy.admit_in(&server, Incoming::new(), Instant::now()).unwrap();
/// // A handler that would run for ever.
/// let handler = tokio::spawn(request.run(std::future::pending::<()>()));
///
/// let report = server.shutdown(Duration::from_secs(5)).await;
/// assert_eq!((report.in_flight(), report.cancelled()), (1, 1));
/// assert!(handler.await.unwrap().unwrap_err().cause().unwrap().is_shutdown());
/// # }
/// ```
#[derive(Clone)]
pub struct ServerScope {
    inner: Arc<Inner>,
}

struct Inner {
    scope: Scope,
    grace: Duration,
    retry_after: Duration,
    draining: AtomicBool,
    drained: Notify,
}

impl ServerScope {
    /// A server's scope, named `server`, with the default stop grace
    /// ([`DEFAULT_GRACE`]) and a `Retry-After` of one second.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::ServerScope;
    /// let server = ServerScope::new();
    /// assert!(!server.is_draining());
    /// assert_eq!(server.scope().name(), Some("server"));
    /// ```
    pub fn new() -> Self {
        ServerScope::build(DEFAULT_GRACE, Duration::from_secs(1))
    }

    fn build(grace: Duration, retry_after: Duration) -> Self {
        ServerScope {
            inner: Arc::new(Inner {
                scope: Scope::server_root("server".into(), grace),
                grace,
                retry_after,
                draining: AtomicBool::new(false),
                drained: Notify::new(),
            }),
        }
    }

    /// With `grace` as the time the requests get to stop after the shutdown's cancel (their
    /// grace period, see [`Scope::quiesce`]): what has not stopped then is quarantined.
    ///
    /// Set it before the server admits anything (it makes a new server scope).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::ServerScope;
    /// let server = ServerScope::new().stop_grace(Duration::from_millis(200));
    /// # let _ = server;
    /// ```
    pub fn stop_grace(self, grace: Duration) -> Self {
        ServerScope::build(grace, self.inner.retry_after)
    }

    /// With `retry_after` in the answers to the requests the shutdown refuses or cancels
    /// (when nothing possibly effectful was dispatched): HTTP `Retry-After` (whole seconds,
    /// rounded up) and gRPC `grpc-retry-pushback-ms`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::ServerScope;
    /// let server = ServerScope::new().retry_after(Duration::from_secs(5));
    /// assert_eq!(server.retry_after_hint(), Duration::from_secs(5));
    /// ```
    pub fn retry_after(self, retry_after: Duration) -> Self {
        ServerScope::build(self.inner.grace, retry_after)
    }

    /// The `Retry-After` of the answers the shutdown gives.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::ServerScope;
    /// assert_eq!(ServerScope::new().retry_after_hint(), Duration::from_secs(1));
    /// ```
    pub fn retry_after_hint(&self) -> Duration {
        self.inner.retry_after
    }

    /// The server's scope: the parent of every request's. Work spawned here (a background
    /// task) is cancelled by the shutdown with the requests, and waited for.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::ServerScope;
    /// let server = ServerScope::new();
    /// assert!(server.scope().deadline().is_none());
    /// ```
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// Whether the shutdown has begun (nothing is admitted any more).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::ServerScope;
    /// let server = ServerScope::new();
    /// server.shutdown(Duration::ZERO).await;
    /// assert!(server.is_draining());
    /// # }
    /// ```
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// A future that resolves when the shutdown begins: what axum's
    /// `with_graceful_shutdown` and tonic's `serve_with_shutdown` take, so that they stop
    /// accepting connections as the server stops admitting requests (and then wait for the
    /// connections in flight, whose requests the shutdown finishes or cancels).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a new call observes the same shutdown.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::ServerScope;
    /// let server = ServerScope::new();
    /// let signal = tokio::spawn(server.draining());
    /// server.shutdown(Duration::ZERO).await;
    /// signal.await.unwrap();
    /// # }
    /// ```
    pub fn draining(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let inner = self.inner.clone();
        async move {
            loop {
                let notified = inner.drained.notified();
                if inner.draining.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        }
    }

    /// Shuts the server down gracefully (see the [type's docs](Self)): stops admitting, waits
    /// up to `grace` for the requests in flight to be quiet, cancels the rest with
    /// [`Cause::Shutdown`], waits until they are quiet (quarantining what has not stopped
    /// within the stop grace), and reports.
    ///
    /// Calling it again (or from several tasks) waits for the same end and gives the same
    /// report; a later call's `grace` counts from that call.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the server draining (nothing is admitted), and the requests
    /// in flight running; a new call goes on from there.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, ServerScope};
    ///
    /// let server = ServerScope::new();
    /// let policy = EndpointPolicy::builder(Duration::from_secs(60)).build();
    /// let (request, _) = policy.admit_in(&server, Incoming::new(), Instant::now()).unwrap();
    /// // A handler that needs 2 s to finish.
    /// let handler = tokio::spawn(request.run(tokio::time::sleep(Duration::from_secs(2))));
    ///
    /// let report = server.shutdown(Duration::from_secs(5)).await;
    /// assert_eq!((report.in_flight(), report.finished(), report.cancelled()), (1, 1, 0));
    /// assert!(handler.await.unwrap().is_ok());
    /// # }
    /// ```
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        let started = Instant::now();
        let inner = &self.inner;
        inner.scope.close_own();
        inner.draining.store(true, Ordering::Release);
        inner.drained.notify_waiters();
        let quiet = tokio::time::timeout(grace, inner.scope.quiesce()).await;
        let report = match quiet {
            Ok(report) => report,
            Err(_) => {
                inner.scope.cancel_uncounted(Cause::Shutdown);
                inner.scope.quiesce().await
            }
        };
        let (in_flight, cancelled) = inner.scope.rolled_up();
        ShutdownReport {
            in_flight,
            cancelled,
            report,
            took: started.elapsed(),
        }
    }
}

impl Default for ServerScope {
    fn default() -> Self {
        ServerScope::new()
    }
}

impl fmt::Debug for ServerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerScope")
            .field("scope", &self.inner.scope)
            .field("draining", &self.is_draining())
            .field("retry_after", &self.inner.retry_after)
            .finish()
    }
}

/// What a [`ServerScope::shutdown`] did: the requests that were in flight when it began (they
/// became quiet while the server drained), how many of them it cancelled at the end of its
/// grace period, and the sum of their reports.
///
/// A request that became quiet at the very moment the shutdown began may be counted in
/// neither (its own report, given to `on_report`, has it all the same).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::ServerScope;
/// let report = ServerScope::new().shutdown(Duration::from_secs(1)).await;
/// assert_eq!(report.in_flight(), 0);
/// assert!(report.pending_effects().is_empty());
/// println!("{report}");
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    in_flight: u64,
    cancelled: u64,
    report: Report,
    took: Duration,
}

impl ShutdownReport {
    /// The requests in flight when the shutdown began (and other work of the server's scope).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// let report = cancel_scope::wire::ServerScope::new().shutdown(Duration::ZERO).await;
    /// assert_eq!(report.in_flight(), 0);
    /// # }
    /// ```
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// How many of them were cancelled with [`Cause::Shutdown`] at the end of the grace period.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// let report = cancel_scope::wire::ServerScope::new().shutdown(Duration::ZERO).await;
    /// assert_eq!(report.cancelled(), 0);
    /// # }
    /// ```
    pub fn cancelled(&self) -> u64 {
        self.cancelled
    }

    /// How many of them finished within the grace period (or were stopped otherwise: their
    /// deadline, their client gone).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// let report = cancel_scope::wire::ServerScope::new().shutdown(Duration::ZERO).await;
    /// assert_eq!(report.finished(), 0);
    /// # }
    /// ```
    pub fn finished(&self) -> u64 {
        self.in_flight.saturating_sub(self.cancelled)
    }

    /// The children of those requests that did not stop within the stop grace after the
    /// cancel, quarantined (also listed in [`report`](Self::report)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// let report = cancel_scope::wire::ServerScope::new().shutdown(Duration::ZERO).await;
    /// assert_eq!(report.quarantined(), 0);
    /// # }
    /// ```
    pub fn quarantined(&self) -> u64 {
        self.report.quarantined()
    }

    /// The effects of those requests whose outcome is unknown, for reconciliation.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// let report = cancel_scope::wire::ServerScope::new().shutdown(Duration::ZERO).await;
    /// assert!(report.pending_effects().is_empty());
    /// # }
    /// ```
    pub fn pending_effects(&self) -> &[EffectRecord] {
        self.report.pending_effects()
    }

    /// The sum of those requests' reports (every receipt, the handlers' own included), as the
    /// server's scope's [`Report`]: its state is `Completed` if nothing was cancelled,
    /// `CancelledStable` if the shutdown cancelled, `NeedsReconciliation` with pending effects.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// use cancel_scope::Lifecycle;
    /// let report = cancel_scope::wire::ServerScope::new().shutdown(Duration::ZERO).await;
    /// assert_eq!(report.report().state(), Lifecycle::Completed);
    /// # }
    /// ```
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// How long the shutdown took.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::time::Duration;
    /// let report = cancel_scope::wire::ServerScope::new().shutdown(Duration::ZERO).await;
    /// assert!(report.took() < Duration::from_secs(1));
    /// # }
    /// ```
    pub fn took(&self) -> Duration {
        self.took
    }
}

impl fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shutdown in {:?}: {} in flight, {} finished, {} cancelled, {} quarantined, {} pending effects ({})",
            self.took,
            self.in_flight,
            self.finished(),
            self.cancelled,
            self.quarantined(),
            self.pending_effects().len(),
            self.report,
        )
    }
}
