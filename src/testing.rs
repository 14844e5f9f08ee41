//! Helpers for your own tests of handlers written for this crate (feature `testing`): a
//! request's scope as admission makes it, and a request as
//! [`AdmitLayer`](crate::integrations::tower::AdmitLayer) hands it to the handler.
//!
//! Run such tests on tokio's paused clock (`#[tokio::test(start_paused = true)]`, tokio's
//! `test-util` feature): the request's deadline is then virtual time, and a test of what a
//! handler does at its deadline takes no real time and does not depend on the machine.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::time::Duration;
//! use cancel_scope::{testing, Scope};
//!
//! // The handler under test: it gives up on a slow dependency at its budget.
//! async fn handler(req: http::Request<()>) -> Result<&'static str, cancel_scope::Error> {
//!     let scope = req.extensions().get::<Scope>().unwrap().clone();
//!     let dependency = scope.child().build()?;
//!     dependency.run(tokio::time::sleep(Duration::from_secs(5))).await?;
//!     Ok("done")
//! }
//!
//! let req = testing::admitted_request(Duration::from_millis(300), ());
//! let start = tokio::time::Instant::now();
//! let err = handler(req).await.unwrap_err();
//! assert!(err.is_deadline_exceeded());
//! assert_eq!(start.elapsed(), Duration::from_millis(300)); // virtual time
//! # }
//! ```

use std::time::Duration;

use tokio::time::Instant;

use crate::wire::{Admission, EndpointPolicy, Incoming};
use crate::Scope;

/// A request's scope and admission record, as admission makes them for a request that
/// declared no budget, under a policy whose default and maximum budget is `budget`: a root
/// scope with `budget` from now, a fresh operation id, and the request-wide data the client
/// layers read (its operation, for `service-budget`). Also its effect flag (what a stopped
/// request's answer says).
///
/// # Panics
///
/// Outside a tokio runtime (the scope's deadline needs tokio's timer), or if `budget` is zero.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// let (scope, admission) = cancel_scope::testing::request_scope(Duration::from_millis(250));
/// assert_eq!(scope.remaining(), Some(Duration::from_millis(250)));
/// assert_eq!(admission.initial_remaining(), Duration::from_millis(250));
/// assert_eq!(scope.operation().unwrap().id(), admission.operation_id());
/// # }
/// ```
#[track_caller]
pub fn request_scope(budget: Duration) -> (Scope, Admission) {
    let policy = EndpointPolicy::builder(budget).build();
    match policy.admit(Incoming::new(), Instant::now()) {
        Ok(admitted) => admitted,
        Err(e) => panic!("no request scope with a budget of {budget:?}: {e}"),
    }
}

/// A request carrying `body` as a handler behind
/// [`AdmitLayer`](crate::integrations::tower::AdmitLayer) gets it: its [`Scope`] and
/// [`Admission`] (from [`request_scope`]) in its extensions, no budget headers. Extractors
/// (feature `axum`) find them there; run the handler in the scope ([`Scope::run`]) for
/// [`Scope::current`].
///
/// # Panics
///
/// As [`request_scope`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{testing, wire::Admission};
/// let req = testing::admitted_request(Duration::from_secs(1), "payload");
/// assert!(req.extensions().get::<Admission>().is_some());
/// assert_eq!(testing::scope_of(&req).remaining(), Some(Duration::from_secs(1)));
/// # }
/// ```
#[track_caller]
pub fn admitted_request<B>(budget: Duration, body: B) -> http::Request<B> {
    let (scope, admission) = request_scope(budget);
    let mut req = http::Request::new(body);
    req.extensions_mut().insert(scope);
    req.extensions_mut().insert(admission);
    req
}

/// The scope of a request made by [`admitted_request`] (or admitted by the layer).
///
/// # Panics
///
/// If the request has no scope in its extensions.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// let req = cancel_scope::testing::admitted_request(Duration::from_secs(1), ());
/// assert!(!cancel_scope::testing::scope_of(&req).is_cancelled());
/// # }
/// ```
#[track_caller]
pub fn scope_of<B>(req: &http::Request<B>) -> Scope {
    match req.extensions().get::<Scope>() {
        Some(s) => s.clone(),
        None => panic!("the request has no scope: make it with `admitted_request`"),
    }
}
