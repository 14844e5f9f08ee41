//! axum conveniences (feature `axum`, which depends on `axum-core` only): the request's
//! [`Scope`] and [`Admission`] as extractors, and the crate's errors as responses.
//!
//! * `Scope` and `Admission` implement `FromRequestParts`: a handler behind
//!   [`AdmitLayer`](crate::integrations::tower::AdmitLayer) takes them as arguments. Without
//!   the layer the extraction fails with [`NotAdmitted`] (500, and a text that says the layer
//!   is missing): a handler that needs a budget never runs without one.
//! * [`Error`](crate::Error), [`CallError`](crate::integrations::CallError),
//!   [`AdmissionError`], [`RetryError`](crate::retry::RetryError),
//!   [`FanOutError`](crate::fanout::FanOutError) and the sqlx integration's
//!   `Error` implement `IntoResponse` by the server layer's table (504 for a deadline, 503 for
//!   a cancel, 502 for a dependency that failed, ... with fixed texts and `service-effect`:
//!   see the table below).
//!
//! | error says | HTTP | text |
//! |---|---|---|
//! | a deadline passed (also a stream's idle timeout, a retry out of time) | 504 | `deadline exceeded` |
//! | too little budget left to start | 504 | `budget exhausted` |
//! | a budget header is malformed or over a rejecting maximum | 400 | the header's fixed text |
//! | cancelled, closed, a shutdown, a server that admits no one | 503 (500 after a possibly effectful dispatch in the request) | `service unavailable` |
//! | the client went away | 499 | `client gone` |
//! | a dependency failed (transport, a retry that gave up, a required fan-out branch) | 502 (500 after a possibly effectful dispatch) | `bad gateway` |
//! | an effect whose outcome is unknown (a retry stopped so, a cut-off `COMMIT`) | 500 | `effect unknown` |
//! | a panic, a call made outside any scope, a database error | 500 | `internal error` |
//!
//! # Examples
//!
//! ```
//! use axum_core::response::IntoResponse;
//! use cancel_scope::wire::Admission;
//! use cancel_scope::{Error, Scope};
//!
//! // `async fn quote(scope: Scope, admission: Admission) -> Result<String, Error>` in a
//! // router behind `AdmitLayer`: the budget and the caller's operation, without a lookup.
//! async fn quote(scope: Scope, admission: Admission) -> Result<String, Error> {
//!     let db = scope.child().min_useful(std::time::Duration::from_millis(20)).build()?;
//!     Ok(format!("{} left for {}", db.remaining().unwrap().as_millis(), admission.operation_id()))
//! }
//! # let _ = quote;
//!
//! let s = Scope::new();
//! s.cancel();
//! let err = s.child().build().unwrap_err();
//! assert_eq!(err.into_response().status(), 503);
//! ```

use std::fmt;

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::request::Parts;

use super::status::{self, Said};
use crate::wire::{Admission, AdmissionError};
use crate::Scope;

/// The rejection of a [`Scope`] or [`Admission`] extractor: the request did not come through
/// [`AdmitLayer`](crate::integrations::tower::AdmitLayer). Answers 500 with a text that says
/// so (a server's configuration error, not the caller's).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use axum_core::extract::FromRequestParts;
/// use axum_core::response::IntoResponse;
/// use cancel_scope::Scope;
/// let (mut parts, ()) = http::Request::new(()).into_parts();
/// let rejected = Scope::from_request_parts(&mut parts, &()).await.unwrap_err();
/// assert_eq!(rejected.into_response().status(), 500);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotAdmitted {
    what: &'static str,
}

impl fmt::Display for NotAdmitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no {} for this request: the router has no AdmitLayer in front of this handler",
            self.what
        )
    }
}

impl std::error::Error for NotAdmitted {}

impl IntoResponse for NotAdmitted {
    fn into_response(self) -> Response {
        text(http::StatusCode::INTERNAL_SERVER_ERROR, self.to_string())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Scope {
    type Rejection = NotAdmitted;

    /// The request's scope, which [`AdmitLayer`](crate::integrations::tower::AdmitLayer) put
    /// in the request's extensions (also [`Scope::current`] in the handler).
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, NotAdmitted> {
        parts
            .extensions
            .get::<Scope>()
            .cloned()
            .ok_or(NotAdmitted { what: "scope" })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Admission {
    type Rejection = NotAdmitted;

    /// The request's admission record (what its budget headers said and what was decided).
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, NotAdmitted> {
        parts
            .extensions
            .get::<Admission>()
            .cloned()
            .ok_or(NotAdmitted {
                what: "admission record",
            })
    }
}

/// A `text/plain` response.
fn text(status: http::StatusCode, body: String) -> Response {
    let mut res = Response::new(axum_core::body::Body::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

/// The response for what an error says (see the [module docs](self)).
fn respond(said: Said) -> Response {
    let (status, _, message, effect) = said.resolve();
    let mut res = text(status, message.to_owned());
    if let Some(effect) = effect {
        res.headers_mut().insert(
            crate::wire::service_effect::HEADER,
            HeaderValue::from_static(effect.as_str()),
        );
    }
    res
}

impl IntoResponse for crate::Error {
    fn into_response(self) -> Response {
        respond(Said::of_error(&self))
    }
}

impl IntoResponse for crate::integrations::CallError {
    fn into_response(self) -> Response {
        respond(status::of_call(&self))
    }
}

impl IntoResponse for AdmissionError {
    fn into_response(self) -> Response {
        respond(status::of_admission(&self))
    }
}

impl<E> IntoResponse for crate::retry::RetryError<E> {
    fn into_response(self) -> Response {
        respond(status::of_retry(&self))
    }
}

impl IntoResponse for crate::fanout::FanOutError {
    fn into_response(self) -> Response {
        respond(status::of_fanout(&self))
    }
}

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
impl IntoResponse for crate::integrations::sqlx::Error {
    fn into_response(self) -> Response {
        respond(status::of_sqlx(&self))
    }
}
