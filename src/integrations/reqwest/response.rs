//! The response of a scoped call, and the call's state until its receipt.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Response, ResponseBuilderExt as _, StatusCode, Url};
use tokio::time::Instant;

use super::body::CallBody;
use super::target;
use crate::integrations::outcome::{self, Answer, End};
use crate::integrations::CallError;
use crate::reconcile::PendingIntent;
use crate::{Dispatched, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One call in flight. Dropped before its exchange ended, it gives the call its receipt as
/// stopped (see `integrations::outcome`).
pub(super) struct Call {
    pub(super) scope: Scope,
    dispatched: Option<Dispatched>,
    announced: Option<Instant>,
    /// The response's status, once its head came.
    head: Option<Answer>,
    /// Where a redirect took the call (the response's URL), if it was redirected.
    redirected_to: Option<Arc<str>>,
    /// What the callee said of its effects (`service-effect`).
    server: Option<crate::wire::ServiceEffect>,
    /// The call's intent, if it was journaled: resolved by its receipt.
    intent: Option<PendingIntent>,
    /// The call's span and metrics.
    telemetry: crate::telemetry::Call,
}

impl Call {
    pub(super) fn new(
        scope: Scope,
        dispatched: Dispatched,
        announced: Option<Instant>,
        intent: Option<PendingIntent>,
        telemetry: crate::telemetry::Call,
    ) -> Self {
        Call {
            telemetry,
            scope,
            dispatched: Some(dispatched),
            announced,
            head: None,
            redirected_to: None,
            server: None,
            intent,
        }
    }

    /// The scope stopped the call.
    pub(super) fn stopped(&mut self) -> CallError {
        self.end(End::Stopped);
        CallError::cancelled(self.scope.cause_or_cancelled())
    }

    /// The transport failed, or a timer fired: reqwest's own timeout on the request (no later
    /// than the call's deadline, and never set later than it) or a timer of the client's.
    ///
    /// Only the time itself says whether it was the call's deadline: a client's timer
    /// (`ClientBuilder::timeout`, `read_timeout`, `connect_timeout`) that fires while the call
    /// still has budget left is a transport failure (`e.is_timeout()` says "some timer").
    pub(super) fn failed(&mut self, e: impl Into<BoxError>) -> CallError {
        if self.scope.is_cancelled() {
            return self.stopped();
        }
        let now = Instant::now();
        let expired = self.announced.is_some_and(|a| now >= a)
            || self.scope.deadline().is_some_and(|d| now >= d);
        if expired {
            // Stopped by the deadline, not failed.
            self.end(End::Stopped);
            return CallError::transport_after_deadline(e);
        }
        self.end(End::Failed);
        CallError::transport(e)
    }

    /// The exchange completed: the receipt by the response's status.
    pub(super) fn complete(&mut self) {
        let end = self.head.map_or(End::Stopped, End::Answered);
        self.end(end);
    }

    fn end(&mut self, end: End) {
        if let Some(d) = self.dispatched.take() {
            let to = self.redirected_to.as_deref();
            let resolution = outcome::receipt(d, end, self.head, to, self.server);
            if let Some(intent) = self.intent.take() {
                intent.resolve(resolution);
            }
            self.telemetry.ended(self.scope.cause().as_ref());
        }
    }

    fn finish<T>(&mut self, res: reqwest::Result<T>) -> Result<T, CallError> {
        match res {
            Ok(v) => {
                self.complete();
                Ok(v)
            }
            Err(e) => Err(self.failed(e)),
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.end(End::Stopped);
    }
}

/// The response of a [`ScopedRequest`](super::ScopedRequest): reading its body is bounded by the call's deadline
/// and stopped by a cancel of its scope.
///
/// The call's receipt is recorded when the body has been read (by the status, see
/// [the module docs](super#receipts)), when reading it fails, or when the response is dropped
/// unread (`Cancelled`, or `EffectUnknown` for an effectful call; `Failed` after an error
/// status that decides it).
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
    /// The response `inner` of `call`, a request sent to `url`.
    pub(super) fn new(inner: Response, mut call: Call, url: &Url) -> Self {
        call.head = Some(Answer::Http(inner.status()));
        call.telemetry.answered(inner.status().as_u16(), None);
        call.server = outcome::service_effect_in(inner.headers());
        if inner.url() != url {
            call.redirected_to = Some(target(inner.url()).as_str().into());
        }
        ScopedResponse { inner, call }
    }

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

    /// The response, or a [`CallError`] if the callee answered a client or server error
    /// status (4xx, 5xx): as `reqwest::Response::error_for_status`, but the error keeps the
    /// answer's headers ([`CallError::response_headers`], where the retry classifiers find
    /// `Retry-After`) and the call is receipted at once by the status, as the
    /// [table](super#receipts) says (a read-only call `Failed`; a call that may have had an
    /// effect `Failed` for a 4xx, `EffectUnknown` for a 5xx). The body is not read.
    ///
    /// Reading a body does not look at the status: without this, a callee that gave up and
    /// answered an empty `504` reads as an empty success.
    ///
    /// # Errors
    ///
    /// [`CallError::is_status`], with [`CallError::status`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), cancel_scope::integrations::CallError> {
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// let stock = reqwest::Client::new()
    ///     .get("http://127.0.0.1:8080/stock/42")
    ///     .send_scoped()
    ///     .await?
    ///     .error_for_status()?
    ///     .text()
    ///     .await?;
    /// # let _ = stock; Ok(()) }
    /// ```
    pub fn error_for_status(mut self) -> Result<Self, CallError> {
        let status = self.inner.status();
        if !(status.is_client_error() || status.is_server_error()) {
            return Ok(self);
        }
        self.call.complete();
        let url = target(self.inner.url());
        let headers = std::mem::take(self.inner.headers_mut());
        Err(CallError::answered(status, headers, Some(url.as_str())))
    }

    /// Reads the whole body and decodes it as JSON (feature `json`).
    ///
    /// As `reqwest::Response::json`, it does not look at the status: use
    /// [`error_for_status`](Self::error_for_status) first. The call's receipt is the body's
    /// ([`bytes`](Self::bytes)): a body that came whole but is not the JSON asked for is still
    /// an answer read.
    ///
    /// # Errors
    ///
    /// As [`bytes`](Self::bytes), or [`CallError::is_decode`] (with the answer's
    /// [`status`](CallError::status)) if the body is not that JSON.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), cancel_scope::integrations::CallError> {
    /// use std::collections::HashMap;
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// let stock: HashMap<String, u32> = reqwest::Client::new()
    ///     .get("http://127.0.0.1:8080/stock")
    ///     .send_scoped()
    ///     .await?
    ///     .error_for_status()?
    ///     .json()
    ///     .await?;
    /// # let _ = stock; Ok(()) }
    /// ```
    #[cfg(feature = "json")]
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub async fn json<T: serde::de::DeserializeOwned>(mut self) -> Result<T, CallError> {
        let status = self.inner.status();
        // Kept for a decode error; reading the body needs no headers.
        let headers = std::mem::take(self.inner.headers_mut());
        let url = target(self.inner.url());
        let body = self.bytes().await?;
        serde_json::from_slice(&body)
            .map_err(|e| CallError::decode(status, headers, Some(url.as_str()), e))
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
                self.call.complete();
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
    /// recorded now, by the status, as if the body had been read; the body is still cut at the
    /// call's deadline (reading it then fails with an error whose `is_timeout()` is true) and
    /// at a cancel of the call's scope.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// let res: reqwest::Response = res.into_inner();
    /// # let _ = res;
    /// # }
    /// ```
    pub fn into_inner(self) -> Response {
        self.into_plain(false)
    }

    /// The plain reqwest response whose body is bounded by the call ([`CallBody`]); the
    /// call's receipt waits for the body's end if `receipt`, else it is given now.
    pub(super) fn into_plain(self, receipt: bool) -> Response {
        let call = self.call;
        map_body(self.inner, |body| {
            reqwest::Body::wrap(CallBody::new(body, call, receipt))
        })
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
