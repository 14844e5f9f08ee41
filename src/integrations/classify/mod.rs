//! Built-in retry classifiers for HTTP and gRPC calls: what a failed attempt's answer means
//! for the next attempt ([`Decision`]), for [`Retry`](crate::retry::Retry) and
//! [`Hedge`](crate::retry::Hedge).
//!
//! A classifier judges the answer only; the retry applies the effect class of the work it was
//! given ([`ChildSpec`](crate::ChildSpec)). So an answer after which the request may have had
//! its effect is classified [`Decision::EffectUnknown`] (or
//! [`EffectUnknownAfter`](Decision::EffectUnknownAfter) with the server's delay): read-only
//! work retries, idempotent work retries with its key (its attempt kept `EffectUnknown` until
//! a later attempt succeeds), and a side-effecting write stops there with `EffectUnknown` —
//! a write is never repeated after an answer that may have had its effect unless it is
//! idempotent. Side-effecting work makes one attempt in any case.
//!
//! # HTTP ([`HttpClassifier`])
//!
//! | the attempt's error | decision |
//! |---|---|
//! | `408 Request Timeout`, `429 Too Many Requests` (refused unprocessed) | `RetryAfter(Retry-After)`, else `Backoff` |
//! | any other 4xx | `Never` |
//! | `501`, `505`, `511` (retrying cannot help) | `Never` |
//! | any other 5xx (`500`, `502`, `503`, `504`, ...) | `EffectUnknownAfter(Retry-After)`, else `EffectUnknown` |
//! | the connection could not be made ([`CallError::is_connect`]): nothing sent | `SwitchEndpoint` |
//! | too little budget to send it ([`CallError::is_budget_exhausted`]): nothing sent | `RetryNow` (a later attempt may get a larger share) |
//! | the call's deadline passed, or the transport failed after sending | `EffectUnknown` |
//! | the scope was cancelled, no scope, a body that is not the JSON asked for | `Never` |
//!
//! # gRPC ([`GrpcClassifier`])
//!
//! | status | decision |
//! |---|---|
//! | `UNAVAILABLE`, `RESOURCE_EXHAUSTED` | `EffectUnknownAfter(grpc-retry-pushback-ms)`, else `EffectUnknown`; a negative or unreadable pushback: `Never` |
//! | `DEADLINE_EXCEEDED`, `CANCELLED` (not our own cancel) | `EffectUnknown` |
//! | any other (`UNKNOWN`, `INTERNAL`, `INVALID_ARGUMENT`, `NOT_FOUND`, `ABORTED`, ...) | `Never` |
//! | no status: the connection could not be made, or the call was stopped | as HTTP |
//! | an answer refused with an HTTP status (a proxy's `503`, a `CallError` of `error_for_status`) | its `grpc-status` header, else gRPC's mapping of the HTTP status (`429`, `502`–`504`: `UNAVAILABLE`; `400`: `INTERNAL`; `404`: `UNIMPLEMENTED`; ...), then as above |
//!
//! `Retry-After` is read as delay-seconds or an HTTP date (which takes the wall clock to turn
//! into a delay); a value too large, like a pushback too large, is later than the last moment
//! an attempt may start and ends the call at once (`Stop::RetryAfterTooLong`). A value that
//! is not one is ignored.
//!
//! # A server that stopped after dispatching an effect
//!
//! A server of this crate that stops a request (a cancel, a shutdown, its deadline) after it
//! had dispatched a child that may have had an effect says so beside the status:
//! `service-effect: unknown` (see [`wire::service_effect`](crate::wire::service_effect)), and
//! answers HTTP `500` or gRPC `UNKNOWN`. Both classifiers read it through
//! [`is_effect_unknown`](crate::integrations::is_effect_unknown): whatever the status, such an
//! answer is `EffectUnknown` (or `EffectUnknownAfter`), never retried for side-effecting work,
//! retried with its key for idempotent work. Other servers do not send it; their 5xx answers
//! are `EffectUnknown` all the same.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, StatusCode};
//! use cancel_scope::integrations::classify::HttpClassifier;
//! use cancel_scope::retry::Decision;
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("retry-after", "2".parse().unwrap());
//! let http = HttpClassifier::new();
//! assert_eq!(
//!     http.answer(StatusCode::TOO_MANY_REQUESTS, &headers),
//!     Decision::RetryAfter(Duration::from_secs(2)),
//! );
//! assert_eq!(
//!     http.answer(StatusCode::SERVICE_UNAVAILABLE, &headers),
//!     Decision::EffectUnknownAfter(Duration::from_secs(2)),
//! );
//! assert_eq!(http.answer(StatusCode::NOT_FOUND, &headers), Decision::Never);
//! ```

mod grpc;
mod hint;
mod http;

pub use self::grpc::GrpcClassifier;
pub use self::http::HttpClassifier;

use crate::integrations::CallError;
use crate::retry::Decision;

/// The decision for a call that got no answer, or whose answer is not what made it fail
/// (`None`: the call's error is an answer; the caller's table decides).
fn unanswered(e: &CallError) -> Option<Decision> {
    if e.is_status() {
        return None;
    }
    Some(if e.is_deadline_exceeded() {
        // May have been sent: retried only for safe work.
        Decision::EffectUnknown
    } else if e.is_budget_exhausted() {
        Decision::RetryNow
    } else if e.is_cancelled() || e.is_no_scope() || e.is_decode() {
        Decision::Never
    } else if e.is_connect() {
        Decision::SwitchEndpoint
    } else {
        // The transport failed, perhaps after the request was written.
        Decision::EffectUnknown
    })
}
