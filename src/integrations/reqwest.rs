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
//!    on the request — a `RequestBuilder::timeout`, a budget header set on it — bound the
//!    child too, so a shorter one is kept (on the wire and as the call's deadline) and a
//!    longer one gives nothing more; a malformed budget header is replaced, and Envoy's
//!    `x-envoy-expected-rq-timeout-ms` is removed (Envoy sets it per hop);
//! 4. the call — and reading the body of the [`ScopedResponse`] — stops when the child's
//!    deadline passes or its scope is cancelled, with a [`CallError`].
//!
//! The budget headers are written once, when the call is sent. A redirect that reqwest
//! follows (or a request it re-sends on a refused HTTP/2 stream) carries them as they were,
//! so the next hop is told up to that much more than is left; the call itself still stops at
//! its deadline. A client used for calls between services is best built with
//! `reqwest::redirect::Policy::none()`, so that a redirect is the caller's to follow, as a
//! new call.
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
//! let client = reqwest::Client::new();
//! let request = Scope::with_timeout(Duration::from_millis(500));
//! let body = request
//!     .run(async {
//!         let res = client
//!             .get("http://127.0.0.1:8080/inventory")
//!             .scoped()
//!             .egress(EgressPolicy::new().reserve(Duration::from_millis(50)))
//!             .send()
//!             .await?;
//!         res.text().await
//!     })
//!     .await??;
//! # let _ = body; Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use reqwest::header::HeaderMap;
use reqwest::{RequestBuilder, Response, ResponseBuilderExt as _, StatusCode};
use tokio::time::{Instant, Sleep};

use super::{call, CallError};
use crate::scope::deadline_after;
use crate::wire::EgressPolicy;
use crate::{Cause, ChildSpec, Dispatched, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
        ScopedRequest {
            builder: self,
            parent: Scope::try_current(),
            egress: None,
            spec: None,
        }
    }

    fn scoped_in(self, scope: &Scope) -> ScopedRequest {
        ScopedRequest {
            builder: self,
            parent: Some(scope.clone()),
            egress: None,
            spec: None,
        }
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
///     .egress(EgressPolicy::new().cap(Duration::from_secs(2)))
///     .spec(ChildSpec::idempotent("pay", "payment-42"));
/// # let _ = request;
/// ```
#[must_use = "a scoped request does nothing until sent"]
pub struct ScopedRequest {
    builder: RequestBuilder,
    parent: Option<Scope>,
    egress: Option<EgressPolicy>,
    spec: Option<ChildSpec>,
}

impl ScopedRequest {
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
    ///     .egress(EgressPolicy::new().transport_pad(Duration::from_millis(5)));
    /// # let _ = req;
    /// ```
    pub fn egress(mut self, egress: EgressPolicy) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Registers the call as `spec` (default: read-only, named `"call"`).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::{ChildSpec, Scope};
    /// let req = reqwest::Client::new().get("http://127.0.0.1:1/").scoped_in(&Scope::new())
    ///     .spec(ChildSpec::read_only("inventory"));
    /// # let _ = req;
    /// ```
    pub fn spec(mut self, spec: ChildSpec) -> Self {
        self.spec = Some(spec);
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
    ///     .egress(EgressPolicy::new().min_useful(Duration::from_millis(50)))
    ///     .send()
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_budget_exhausted()); // failed fast: nothing was sent
    /// # }
    /// ```
    pub async fn send(self) -> Result<ScopedResponse, CallError> {
        let parent = self.parent.ok_or_else(CallError::no_scope)?;
        let spec = self.spec.unwrap_or_else(|| ChildSpec::read_only("call"));
        // Built before the call is prepared: a request that cannot be built is never
        // registered, and `prepare` sees the budget headers the caller set on the builder.
        let (client, req) = self.builder.build_split();
        let mut req = req.map_err(CallError::transport)?;
        // The caller's own timeout on the request bounds the call's scope too: the callee is
        // told no more, and the call stops at it as at any deadline.
        let within = req.timeout().map(|t| deadline_after(Instant::now(), *t));
        let prepared = call::prepare(&parent, within, self.egress, spec, req.headers_mut())?;
        // Dispatched: from here on the request may be sent (and nothing below can fail).
        // The scope's cancel below stops the call at its deadline. A timeout the request has
        // is only shortened to it; none is set otherwise, because reqwest applies a request's
        // own timeout in place of the client's (`ClientBuilder::timeout`), which would then
        // be lost.
        if let (Some(left), Some(timeout)) = (prepared.call.remaining(), req.timeout_mut()) {
            *timeout = (*timeout).min(left);
        }
        let mut call_state = Call {
            scope: prepared.call,
            dispatched: Some(prepared.dispatched),
            announced: prepared.announced,
        };
        let sent = client.execute(req);
        let res = tokio::select! {
            biased;
            () = call_state.scope.cancelled() => return Err(call_state.stopped()),
            res = sent => res,
        };
        match res {
            Ok(inner) => Ok(ScopedResponse {
                inner,
                call: call_state,
            }),
            Err(e) => Err(call_state.failed(e)),
        }
    }
}

impl fmt::Debug for ScopedRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedRequest")
            .field("builder", &self.builder)
            .field("parent", &self.parent)
            .field("egress", &self.egress)
            .field("spec", &self.spec)
            .finish()
    }
}

/// One call in flight.
struct Call {
    scope: Scope,
    dispatched: Option<Dispatched>,
    announced: Option<Instant>,
}

impl Call {
    /// The scope stopped the call; the receipt is left to `Dispatched`'s drop (`Cancelled`,
    /// or `EffectUnknown` for effectful calls).
    fn stopped(&mut self) -> CallError {
        self.dispatched = None;
        CallError::cancelled(self.scope.cause_or_cancelled())
    }

    /// The transport failed, or a timer fired: reqwest's own timeout on the request (no later
    /// than the call's deadline, and never set later than it) or a timer of the client's.
    ///
    /// Only the time itself says whether it was the call's deadline: a client's timer
    /// (`ClientBuilder::timeout`, `read_timeout`, `connect_timeout`) that fires while the call
    /// still has budget left is a transport failure (`e.is_timeout()` says "some timer").
    fn failed(&mut self, e: reqwest::Error) -> CallError {
        if self.scope.is_cancelled() {
            return self.stopped();
        }
        let now = Instant::now();
        let expired = self.announced.is_some_and(|a| now >= a)
            || self.scope.deadline().is_some_and(|d| now >= d);
        if expired {
            // Stopped by the deadline, not failed: the receipt is left to `Dispatched`'s
            // drop (`Cancelled`, or `EffectUnknown` for effectful calls).
            self.dispatched = None;
            return CallError::transport_after_deadline(e);
        }
        if let Some(d) = self.dispatched.take() {
            // Effectful work may have had its effect: `EffectUnknown`, by the drop.
            if !d.spec().effect().may_have_effect() {
                d.fail();
            }
        }
        CallError::transport(e)
    }

    fn succeed(&mut self) {
        if let Some(d) = self.dispatched.take() {
            d.succeed();
        }
    }

    fn finish<T>(&mut self, res: reqwest::Result<T>) -> Result<T, CallError> {
        match res {
            Ok(v) => {
                self.succeed();
                Ok(v)
            }
            Err(e) => Err(self.failed(e)),
        }
    }
}

/// The response of a [`ScopedRequest`]: reading its body is bounded by the call's deadline
/// and stopped by a cancel of its scope.
///
/// The call's receipt is recorded when the body has been read (`Succeeded`), when reading it
/// fails, or when the response is dropped unread (`Cancelled`, or `EffectUnknown` for an
/// effectful call).
///
/// # Examples
///
/// ```no_run
/// # async fn f(res: cancel_scope::integrations::reqwest::ScopedResponse)
/// # -> Result<(), cancel_scope::integrations::CallError> {
/// if res.status().is_success() {
///     let body = res.text().await?;
///     # let _ = body;
/// }
/// # Ok(()) }
/// ```
pub struct ScopedResponse {
    inner: Response,
    call: Call,
}

impl ScopedResponse {
    /// The status code.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// assert!(res.status().is_success());
    /// # }
    /// ```
    pub fn status(&self) -> StatusCode {
        self.inner.status()
    }

    /// The response headers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// let kind = res.headers().get("content-type");
    /// # let _ = kind;
    /// # }
    /// ```
    pub fn headers(&self) -> &HeaderMap {
        self.inner.headers()
    }

    /// The call's scope (a child of the scope the request was sent in).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// let left = res.scope().remaining();
    /// # let _ = left;
    /// # }
    /// ```
    pub fn scope(&self) -> &Scope {
        &self.call.scope
    }

    /// What is left of the call's budget for reading the body.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// assert!(res.remaining().unwrap() > std::time::Duration::ZERO);
    /// # }
    /// ```
    pub fn remaining(&self) -> Option<Duration> {
        self.call.scope.remaining()
    }

    /// Reads the whole body.
    ///
    /// # Errors
    ///
    /// A [`CallError`] when the deadline passes or the scope is cancelled first, or when
    /// reading fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(res: cancel_scope::integrations::reqwest::ScopedResponse)
    /// # -> Result<(), cancel_scope::integrations::CallError> {
    /// let body = res.bytes().await?;
    /// # let _ = body; Ok(()) }
    /// ```
    pub async fn bytes(mut self) -> Result<Bytes, CallError> {
        let read = self.inner.bytes();
        let res = tokio::select! {
            biased;
            () = self.call.scope.cancelled() => return Err(self.call.stopped()),
            res = read => res,
        };
        self.call.finish(res)
    }

    /// Reads the whole body as text (see `reqwest::Response::text`).
    ///
    /// # Errors
    ///
    /// As [`bytes`](Self::bytes).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(res: cancel_scope::integrations::reqwest::ScopedResponse)
    /// # -> Result<(), cancel_scope::integrations::CallError> {
    /// let text = res.text().await?;
    /// # let _ = text; Ok(()) }
    /// ```
    pub async fn text(mut self) -> Result<String, CallError> {
        let read = self.inner.text();
        let res = tokio::select! {
            biased;
            () = self.call.scope.cancelled() => return Err(self.call.stopped()),
            res = read => res,
        };
        self.call.finish(res)
    }

    /// Reads the next chunk of the body (`None` at its end).
    ///
    /// When the call's deadline passes or its scope is cancelled, the body is let go at once
    /// (its connection closed, or its HTTP/2 stream reset), although the response itself is
    /// still held: its status and headers stay readable, and every later read fails.
    ///
    /// # Errors
    ///
    /// As [`bytes`](Self::bytes).
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `reqwest::Response::chunk`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(mut res: cancel_scope::integrations::reqwest::ScopedResponse)
    /// # -> Result<(), cancel_scope::integrations::CallError> {
    /// while let Some(chunk) = res.chunk().await? {
    ///     println!("{} bytes", chunk.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, CallError> {
        let res = tokio::select! {
            biased;
            () = self.call.scope.cancelled() => {
                // The body goes first, then the receipt: once the scope is quiet, nothing of
                // the call is left open (invariant 6), even while the caller holds `self`.
                self.drop_body();
                return Err(self.call.stopped());
            }
            res = self.inner.chunk() => res,
        };
        match res {
            Ok(None) => {
                self.call.succeed();
                Ok(None)
            }
            Ok(Some(chunk)) => Ok(Some(chunk)),
            Err(e) => Err(self.call.failed(e)),
        }
    }

    /// Lets go of the body, and so of the connection (HTTP/1) or stream (HTTP/2) it is read
    /// from; the head (status, headers, URL, extensions) stays readable.
    fn drop_body(&mut self) {
        let empty = || reqwest::Body::from(Bytes::new());
        let placeholder = Response::from(http::Response::new(empty()));
        let res = std::mem::replace(&mut self.inner, placeholder);
        self.inner = map_body(res, |_| empty());
    }

    /// The plain reqwest response, for reading it some other way. The call's receipt is
    /// recorded as `Succeeded` now; the body is still cut at the call's deadline (reading it
    /// then fails with an error whose `is_timeout()` is true), but no longer by a cancel of
    /// the scope.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// let res: reqwest::Response = res.into_inner();
    /// # let _ = res;
    /// # }
    /// ```
    pub fn into_inner(mut self) -> Response {
        self.call.succeed();
        match self.call.scope.deadline() {
            // Not the request's reqwest timeout: `send` leaves a request without one as it is
            // (the client's own timeout applies then), so only this bounds the body.
            Some(deadline) => map_body(self.inner, |body| {
                reqwest::Body::wrap(UntilDeadline {
                    body: Some(body),
                    deadline: Box::pin(tokio::time::sleep_until(deadline)),
                })
            }),
            None => self.inner,
        }
    }
}

/// A response body handed over by [`ScopedResponse::into_inner`]: ends with a timeout error
/// at the call's deadline.
struct UntilDeadline {
    body: Option<reqwest::Body>,
    deadline: Pin<Box<Sleep>>,
}

impl http_body::Body for UntilDeadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        if body.is_end_stream() {
            return Poll::Ready(None);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            // Let go of the connection now; the reader sees a timeout, as from reqwest's own.
            this.body = None;
            let passed = CallError::cancelled(Cause::DeadlineExceeded);
            let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, passed);
            return Poll::Ready(Some(Err(timed_out.into())));
        }
        Pin::new(body).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), http_body::Body::size_hint)
    }
}

/// `res` with its body replaced by `f(body)`: status, headers, URL and extensions kept.
fn map_body(res: Response, f: impl FnOnce(reqwest::Body) -> reqwest::Body) -> Response {
    let url = res.url().clone();
    let (mut parts, body) = http::Response::<reqwest::Body>::from(res).into_parts();
    // The URL is kept in an extension only reqwest's builder extension can write, and its
    // conversion to `http::Response` leaves it out.
    if let Ok(tagged) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(tagged.into_parts().0.extensions);
    }
    Response::from(http::Response::from_parts(parts, f(body)))
}

impl fmt::Debug for ScopedResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedResponse")
            .field("status", &self.inner.status())
            .field("scope", &self.call.scope)
            .finish_non_exhaustive()
    }
}
