//! reqwest calls made in a child scope: budget headers injected, response body bounded.
//!
//! ```text
//! let res = client.get(url).scoped().send().await?;   // a child of Scope::current()
//! let body = res.text().await?;                        // bounded by the same deadline
//! ```
//!
//! [`RequestBuilderExt::scoped`] turns a `reqwest::RequestBuilder` into a [`ScopedRequest`].
//! Sending it does what the tower client layer
//! (`integrations::tower::Propagate`, feature `tower`) does for tower clients:
//!
//! 1. a child of the scope is cut by the [`EgressPolicy`] (explicit, or that of the scope's
//!    [`Operation`](crate::wire::Operation)); too little budget fails fast and nothing is sent;
//! 2. the call is registered as a child of it and dispatched right before it is sent, so that
//!    it is never sent after a cancel;
//! 3. `grpc-timeout` and `service-budget` carry the budget minus the transport pad, and a
//!    timeout the request has (reqwest's own) is shortened to the child's budget (none is
//!    set otherwise: the client's `ClientBuilder::timeout` applies). The caller's own bounds
//!    on the request — a `RequestBuilder::timeout`, a budget header set on it
//!    (`grpc-timeout`, `service-budget`, Envoy's `x-envoy-expected-rq-timeout-ms`) — bound
//!    the child too, so a shorter one is kept (on the wire and as the call's deadline) and a
//!    longer one gives nothing more; then every budget header on the request is replaced by
//!    the call's own (a malformed one is not trusted; Envoy's is not forwarded: Envoy sets it
//!    per hop);
//! 4. the call — and reading the body of the [`ScopedResponse`] — stops when the child's
//!    deadline passes or its scope is cancelled, with a [`CallError`];
//! 5. its receipt follows the response's status and what the call may have done: a `GET`
//!    answered 500 is `Failed`; a `POST` answered 503, or cut off after it was sent, is
//!    `EffectUnknown`, its status kept in the record.
//!
//! The budget headers already on the request are the caller's own bound for this call (see
//! step 3) and are replaced by the call's, also when its scope has no deadline: a handler that
//! copies its incoming headers onto a call does not pass a caller's `service-budget` (its
//! priority, operation id or generation) on. A call with no deadline at all carries no budget
//! header, and only a `grpc-timeout` the caller set gives it one.
//!
//! # The effect class of a call
//!
//! [`ScopedRequest::spec`] says what a call may do; without it the request's method does:
//!
//! | request | registered as | effect id / key |
//! |---|---|---|
//! | `GET`, `HEAD`, `OPTIONS`, `TRACE` | read-only | – |
//! | with an `Idempotency-Key` header (not read-only) | idempotent | the header's value |
//! | `PUT`, `DELETE` | idempotent | `"PUT http://host/path?query"`: method and target |
//! | `POST`, `PATCH`, other methods | side-effecting | `"POST http://host/path (call N)"`, N unique in the process |
//!
//! Idempotent means safe to retry, not "no effect": cut off after it was sent, a `PUT` ends
//! `EffectUnknown` as a `POST` does, and its scope's report says `NeedsReconciliation`.
//!
//! # Receipts
//!
//! | the call... | read-only | may have had an effect |
//! |---|---|---|
//! | answered 1xx–3xx, body read | `Succeeded` | `Succeeded` |
//! | answered 4xx | `Failed` | `Failed` (refused unprocessed), `EffectUnknown` if it was redirected |
//! | answered 5xx | `Failed` | `EffectUnknown` |
//! | transport failed | `Failed` | `EffectUnknown` |
//! | stopped by its scope or dropped before the body's end | `Cancelled` (`Failed` after an error status) | `EffectUnknown` (`Failed` after a 4xx) |
//!
//! # Redirects
//!
//! The budget headers are written once, when the call is sent, and reqwest copies a request's
//! headers onto every redirect it follows (it strips only `Authorization`, `Cookie` and
//! `Proxy-Authorization` when the host changes). A redirect to another origin (scheme, host,
//! port) would so carry the call's budget, operation id, generation and priority to a service
//! the caller never chose, so a client that makes scoped calls is to be built with
//! [`redirect_policy`]: it follows redirects within the origin of the request (up to 10, as
//! reqwest's default does) and stops at one to another origin, whose 3xx answer the caller
//! then gets (to follow as a new call, if it trusts that origin). `Policy::none()` leaves every
//! redirect to the caller. Within the origin, each hop is told the budget of the first; the
//! transport pad covers the trip.
//!
//! A call that was redirected (its response's URL is not the request's) is receipted as such:
//! its effect may have happened at the first address or at the last, so a refusal (4xx) is not
//! taken as "nothing happened", and an `EffectUnknown` record names the last address
//! ([`EffectRecord::redirected_to_str`](crate::EffectRecord::redirected_to_str)).
//!
//! # Durable intents
//!
//! A call given a [`Journal`] ([`ScopedRequest::journal`]) whose effect class the journal
//! records (idempotent and side-effecting calls, by default) has its intent written to the
//! journal's store before it is dispatched, so that a process killed after sending it leaves
//! the intent behind; the receipt resolves it (`Succeeded`: applied; `Failed`, stopped
//! unsent: not applied; `EffectUnknown`: left pending for the
//! [`Reconciler`](crate::reconcile::Reconciler)). A store fault refuses the call before
//! anything is sent ([`CallError::is_intent_not_recorded`]). The write costs one store round
//! trip on the call's path, paid from the call's budget.
//!
//! # Examples
//!
//! ```no_run
//! # async fn f() -> Result<(), cancel_scope::integrations::CallError> {
//! use std::time::Duration;
//! use cancel_scope::integrations::reqwest::RequestBuilderExt;
//! use cancel_scope::wire::EgressPolicy;
//! use cancel_scope::Scope;
//!
//! let client = reqwest::Client::builder()
//!     .redirect(cancel_scope::integrations::reqwest::redirect_policy())
//!     .build()
//!     .unwrap();
//! let request = Scope::with_timeout(Duration::from_millis(500));
//! let body = request
//!     .run(async {
//!         let res = client
//!             .get("http://127.0.0.1:8080/inventory")
//!             .scoped()
//!             .egress(EgressPolicy::builder().reserve(Duration::from_millis(50)).build())
//!             .send()
//!             .await?;
//!         res.text().await
//!     })
//!     .await??;
//! # let _ = body; Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use reqwest::{RequestBuilder, Url};

use super::CallError;
use crate::reconcile::Journal;
use crate::wire::EgressPolicy;
use crate::{ChildSpec, Scope};

mod body;
mod exchange;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
mod redirect;
mod response;

#[cfg(feature = "reqwest-middleware")]
pub use middleware::{CallName, ScopedMiddleware};
pub use redirect::redirect_policy;
pub use response::ScopedResponse;

/// A URL as the target of an effect: no user info, no fragment.
fn target(url: &Url) -> Url {
    let mut url = url.clone();
    // Only fails for URLs that cannot have user info: then there is none to remove.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_fragment(None);
    url
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for reqwest::RequestBuilder {}
}

/// Sends reqwest requests in a child scope. Implemented for `reqwest::RequestBuilder`.
///
/// # Examples
///
/// ```
/// use cancel_scope::integrations::reqwest::RequestBuilderExt;
/// use cancel_scope::Scope;
///
/// let scope = Scope::new();
/// let request = reqwest::Client::new().get("http://127.0.0.1:1/").scoped_in(&scope);
/// # let _ = request;
/// ```
pub trait RequestBuilderExt: sealed::Sealed + Sized {
    /// The request as a call in a child of [`Scope::current`] (sending fails with
    /// [`CallError::is_no_scope`] if there is none).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// let req = reqwest::Client::new().get("http://127.0.0.1:1/").scoped();
    /// assert!(req.send().await.unwrap_err().is_no_scope()); // not inside a scope
    /// # }
    /// ```
    fn scoped(self) -> ScopedRequest;

    /// The request as a call in a child of `scope`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::Scope;
    /// let scope = Scope::new();
    /// scope.cancel();
    /// let req = reqwest::Client::new().get("http://127.0.0.1:1/").scoped_in(&scope);
    /// assert!(req.send().await.unwrap_err().is_cancelled()); // nothing was sent
    /// # }
    /// ```
    fn scoped_in(self, scope: &Scope) -> ScopedRequest;

    /// Shorthand for `self.scoped().send()`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::Scope;
    /// let scope = Scope::with_timeout(Duration::ZERO); // already out of time
    /// let err = scope
    ///     .run(async { reqwest::Client::new().get("http://127.0.0.1:1/").send_scoped().await })
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_deadline_exceeded());
    /// # }
    /// ```
    fn send_scoped(self) -> impl Future<Output = Result<ScopedResponse, CallError>> + Send {
        self.scoped().send()
    }
}

impl RequestBuilderExt for RequestBuilder {
    fn scoped(self) -> ScopedRequest {
        ScopedRequest::new(self, Scope::try_current())
    }

    fn scoped_in(self, scope: &Scope) -> ScopedRequest {
        ScopedRequest::new(self, Some(scope.clone()))
    }
}

/// A reqwest request about to be sent as a call in a child scope. Made by
/// [`RequestBuilderExt::scoped`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::integrations::reqwest::RequestBuilderExt;
/// use cancel_scope::wire::EgressPolicy;
/// use cancel_scope::{ChildSpec, Scope};
///
/// let scope = Scope::new();
/// let request = reqwest::Client::new()
///     .post("http://127.0.0.1:1/payments")
///     .scoped_in(&scope)
///     .egress(EgressPolicy::builder().cap(Duration::from_secs(2)).build())
///     .spec(ChildSpec::idempotent("pay", "payment-42"));
/// # let _ = request;
/// ```
#[must_use = "a scoped request does nothing until sent"]
pub struct ScopedRequest {
    builder: RequestBuilder,
    parent: Option<Scope>,
    egress: Option<EgressPolicy>,
    spec: Option<ChildSpec>,
    name: Option<Arc<str>>,
    journal: Option<Journal>,
    dependency: &'static str,
}

impl ScopedRequest {
    fn new(builder: RequestBuilder, parent: Option<Scope>) -> Self {
        ScopedRequest {
            builder,
            parent,
            egress: None,
            spec: None,
            name: None,
            journal: None,
            dependency: crate::telemetry::UNNAMED_DEPENDENCY,
        }
    }

    /// Writes the call's intent to `journal` before it is dispatched, when the journal
    /// records the call's effect class ([`Journal::records`]: idempotent and side-effecting
    /// calls by default; read-only ones never), and resolves it by the call's receipt:
    /// `Applied` when it succeeded, `NotApplied` when it failed or was stopped unsent, and
    /// left pending — for the [`Reconciler`](crate::reconcile::Reconciler) — when its effect
    /// is unknown (a process killed after sending it leaves the intent behind too). The
    /// operation id of the call's scope goes into the intent.
    ///
    /// A store that fails, is slower than the journal's timeout or is full refuses the call
    /// before anything is sent ([`CallError::is_intent_not_recorded`]): a write without its
    /// intent is what the journal exists to prevent. The write is on the call's path: it
    /// costs one store round trip per journaled call.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use std::time::Duration;
    /// use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal};
    /// use cancel_scope::Scope;
    ///
    /// // A store that holds one intent at most.
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new().max(1)));
    /// let scope = Scope::with_timeout(Duration::from_secs(5));
    /// let client = reqwest::Client::new();
    /// let order = || client.post("http://127.0.0.1:1/orders").scoped_in(&scope).journal(&journal);
    ///
    /// // Nothing listens on port 1, but for all the client knows the POST may have reached a
    /// // server: its effect is unknown, and its intent stays pending for reconciliation.
    /// assert!(order().send().await.unwrap_err().is_transport());
    /// let pending = journal.store().pending(Duration::ZERO, 10).await.unwrap();
    /// assert_eq!(pending.len(), 1);
    ///
    /// // The store is full now: the next write is refused before anything is sent.
    /// let err = order().send().await.unwrap_err();
    /// assert!(err.is_intent_not_recorded());
    /// assert!(err.intent_error().unwrap().is_full());
    /// # }
    /// ```
    pub fn journal(mut self, journal: &Journal) -> Self {
        self.journal = Some(journal.clone());
        self
    }

    /// Uses `egress` instead of the scope's operation's egress policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::wire::EgressPolicy;
    /// use cancel_scope::Scope;
    /// let req = reqwest::Client::new().get("http://127.0.0.1:1/").scoped_in(&Scope::new())
    ///     .egress(EgressPolicy::builder().transport_pad(Duration::from_millis(5)).build());
    /// # let _ = req;
    /// ```
    pub fn egress(mut self, egress: EgressPolicy) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Registers the call as `spec` (default: named `"call"`, with the effect class of the
    /// request, see [the module docs](self#the-effect-class-of-a-call)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::{ChildSpec, Scope};
    /// let req = reqwest::Client::new().post("http://127.0.0.1:1/search").scoped_in(&Scope::new())
    ///     .spec(ChildSpec::read_only("search")); // a POST that changes nothing
    /// # let _ = req;
    /// ```
    pub fn spec(mut self, spec: ChildSpec) -> Self {
        self.spec = Some(spec);
        self
    }

    /// Names the call's child `name` (default `"call"`), keeping the effect class of the
    /// request. A [`spec`](Self::spec) has its own name.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::Scope;
    /// let req = reqwest::Client::new().get("http://127.0.0.1:1/").scoped_in(&Scope::new())
    ///     .name("inventory");
    /// # let _ = req;
    /// ```
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Names the service this call goes to in telemetry: the `dependency` label of the call
    /// metrics and the `cancel_scope.dependency` field of the call span (default
    /// [`UNNAMED_DEPENDENCY`](crate::telemetry::UNNAMED_DEPENDENCY)). A static name, as a
    /// label must be one of a bounded set: never a host or an address.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::Scope;
    /// let req = reqwest::Client::new().get("http://127.0.0.1:1/").scoped_in(&Scope::new())
    ///     .dependency("prices");
    /// # let _ = req;
    /// ```
    pub fn dependency(mut self, name: &'static str) -> Self {
        self.dependency = name;
        self
    }

    /// Sends the request and waits for the response head, within the call's budget.
    ///
    /// # Errors
    ///
    /// A [`CallError`]: no scope, too little budget (nothing sent), the scope was cancelled
    /// (nothing sent, or the call stopped), the deadline passed, or the transport failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the call; its receipt is `Cancelled` (or `EffectUnknown`
    /// for an effectful call that was dispatched).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::wire::EgressPolicy;
    /// use cancel_scope::Scope;
    ///
    /// let scope = Scope::with_timeout(Duration::from_millis(30));
    /// let err = reqwest::Client::new()
    ///     .get("http://127.0.0.1:1/")
    ///     .scoped_in(&scope)
    ///     .egress(EgressPolicy::builder().min_useful(Duration::from_millis(50)).build())
    ///     .send()
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_budget_exhausted()); // failed fast: nothing was sent
    /// # }
    /// ```
    pub async fn send(self) -> Result<ScopedResponse, CallError> {
        let Some(parent) = self.parent else {
            crate::telemetry::call_refused(self.dependency, crate::telemetry::Refused::NoScope);
            return Err(CallError::no_scope());
        };
        // Built before the call is prepared: a request that cannot be built is never
        // registered, and `prepare` sees the budget headers the caller set on the builder.
        let (client, req) = self.builder.build_split();
        let req = req.map_err(CallError::transport)?;
        let how = exchange::How {
            egress: self.egress,
            spec: self.spec,
            name: self.name,
            journal: self.journal,
            dependency: self.dependency,
        };
        exchange::call(&parent, how, req, |req| client.execute(req)).await
    }
}

impl fmt::Debug for ScopedRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedRequest")
            .field("builder", &self.builder)
            .field("parent", &self.parent)
            .field("egress", &self.egress)
            .field("spec", &self.spec)
            .field("name", &self.name)
            .field("journal", &self.journal)
            .finish()
    }
}
