//! Tower middleware: admit incoming requests into scopes, propagate budgets on outgoing calls.
//!
//! Works with anything built on `tower` and `http` 1: axum, tonic servers and channels, hyper
//! clients.
//!
//! * [`Admit`] / [`AdmitLayer`] (server): admits every request under an
//!   [`EndpointPolicy`](crate::wire::EndpointPolicy), takes the raw budget headers off the
//!   request, runs the handler with the request's root scope as
//!   [`Scope::current`](crate::Scope::current) (also in the request extensions, with the
//!   [`Admission`](crate::wire::Admission) record, which holds what the headers said), and
//!   answers for the scope:
//!
//!   | what happened | HTTP | gRPC (`content-type: application/grpc*`) | text, without the detail |
//!   |---|---|---|---|
//!   | a budget header is malformed or repeated | 400 | `INVALID_ARGUMENT` (3) | `invalid budget header` |
//!   | the budget is over a rejecting maximum | 400 | `INVALID_ARGUMENT` (3) | `budget exceeds the endpoint's maximum` |
//!   | too little budget left on arrival | 504 | `DEADLINE_EXCEEDED` (4) | `budget exhausted` |
//!   | the deadline passed before the handler answered | 504 | `DEADLINE_EXCEEDED` (4), not `CANCELLED` | `deadline exceeded` |
//!   | the scope was cancelled by the server, nothing possibly effectful dispatched | 503 | `UNAVAILABLE` (14) | `service unavailable` |
//!   | the scope was cancelled by the server after a possibly effectful call was dispatched | 500 | `UNKNOWN` (2) | `service unavailable` |
//!   | the handler panicked | 500 | `INTERNAL` (13) | `internal error` |
//!   | refused: the [server](crate::wire::ServerScope)'s shutdown has begun | 503 with `Retry-After` | `UNAVAILABLE` (14) with `grpc-retry-pushback-ms` | `service unavailable` |
//!   | refused: the request's operation was cancelled, or it is of an older generation (a layer with a [registry](AdmitLayer::operations)), `service-effect: none` | 409 | `ABORTED` (10) | `operation cancelled` |
//!
//!   A request the shutdown cancels at the end of its grace period
//!   ([`Cause::Shutdown`](crate::Cause::Shutdown)) is answered as any request the server
//!   stopped, with `Retry-After` (or `grpc-retry-pushback-ms`) when nothing possibly
//!   effectful was dispatched.
//!
//!   Every answer for a request the layer stopped (the last three rows, and the trailers of
//!   a gRPC body it cut) also says, in `service-effect`, whether a child that may have had an
//!   effect was dispatched in the request (`unknown`) or not (`none`; see
//!   [`wire::service_effect`](crate::wire::service_effect)): a request stopped after it sent a
//!   payment is not "unavailable, try again". What a caller sees, and does:
//!
//!   | caller | `503` / `UNAVAILABLE` + `none` | `500` / `UNKNOWN` + `unknown` | `504` / `DEADLINE_EXCEEDED` |
//!   |---|---|---|---|
//!   | this crate's `Propagate` and reqwest integration | receipt by the status as always (`Failed` for a read-only call, `EffectUnknown` for an effectful one) | `EffectUnknown`, also for a read-only call | as always; with `unknown`, `EffectUnknown` also for a read-only call |
//!   | a retry classifier using [`is_effect_unknown`](crate::integrations::is_effect_unknown) | its own rule for the status (a backoff) | `Decision::EffectUnknown`: side-effecting work never retries, idempotent work only with its key | `Decision::EffectUnknown` with `unknown` |
//!   | grpc-go, grpc-java (gRFC A6 retry policy) | retried where the method's `retryableStatusCodes` lists `UNAVAILABLE` (the usual setting) | not retried unless `UNKNOWN` is listed (it rarely is) | retried only if listed; the client's own deadline has usually passed |
//!   | browsers (`fetch`, forms) | shown to the page; never retried by the browser for a `POST` | shown to the page | shown to the page |
//!   | Envoy | retried by `retry_on: 5xx`, `gateway-error` or `retriable-status-codes: 503` | retried by `5xx` (which includes 500): use `gateway-error`, or `retriable-headers` matching `service-effect: none`, so that it is not | retried by `gateway-error` and `5xx` |
//!   | tower-http, hyper, plain reqwest | no retry of their own (a `tower::retry` policy decides: read the header there) | same | same |
//!
//!   The text is the HTTP body (`text/plain`) or the `grpc-message`; a caller the policy shows
//!   the detail ([`error_detail`](crate::wire::EndpointPolicyBuilder::error_detail)) gets the detail
//!   instead, and [`on_refusal`](AdmitLayer::on_refusal) gets it in any case. gRPC answers are
//!   trailers-only responses (HTTP 200 with `grpc-status` in the headers). When the response
//!   future is dropped (client disconnect, HTTP/2 reset) the scope is cancelled with
//!   [`Cause::ClientGone`](crate::Cause::ClientGone) — or, on an endpoint with a
//!   [`DetachLayer`] outside the layer, runs on for a bounded time first. Afterwards the scope is closed, and once
//!   it is quiet its [`Report`](crate::Report) goes to the optional
//!   [`on_report`](AdmitLayer::on_report) callback. The response body is bounded by the same
//!   deadline; at it the handler's body is dropped, also if the client stopped reading.
//!   Behind a tonic server, which enforces `grpc-timeout` itself (and says `CANCELLED`), give
//!   the policy a [`reserve`](crate::wire::EndpointPolicyBuilder::reserve) that covers the answer's
//!   trip, so that the layer's `DEADLINE_EXCEEDED` comes first.
//!
//! * [`Propagate`] / [`PropagateLayer`] (client): every call gets a child of the current scope
//!   (outside any scope: of a [`Scope`](crate::Scope) in the request's extensions) cut by an
//!   [`EgressPolicy`](crate::wire::EgressPolicy), is registered and dispatched as a child of
//!   it (so that nothing is sent after a cancel), carries `grpc-timeout` and `service-budget`,
//!   and is stopped — response body included — when the child's budget ends. A handler that
//!   forwards the request `Admit` gave it (whose extensions hold the request's root scope)
//!   from inside a tighter child scope sends the child's budget, not the root's: a call never
//!   gets a longer budget than the current scope or the request's scope allows. The layer owns
//!   the budget headers and the receipts:
//!
//!   | what | how |
//!   |---|---|
//!   | budget headers already on the request | read as a bound that may shorten the call, then replaced by the call's own (none without a deadline): a copied header's priority, operation id and generation never go on |
//!   | a call outside any scope | refused, nothing sent: [`CallError::is_no_scope`](crate::integrations::CallError::is_no_scope), for gRPC `FAILED_PRECONDITION`; [`allow_unscoped`](PropagateLayer::allow_unscoped) lets it through with a capped `grpc-timeout` and no `service-budget` |
//!   | the effect class of a call | HTTP `GET`/`HEAD`/`OPTIONS`/`TRACE` read-only, `PUT`/`DELETE` idempotent, `POST`/`PATCH` side-effecting (idempotent with an `Idempotency-Key`); gRPC side-effecting unless a method is declared read-only or idempotent; a `ChildSpec` wins |
//!   | the receipt | by the response's status (for gRPC, in the trailers) and the effect class: a read-only call's error is `Failed`; an effectful call is `Failed` on a refusal (4xx, `NOT_FOUND`...), otherwise `EffectUnknown`, as when it is cut off after it was sent |
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use cancel_scope::integrations::tower::{AdmitLayer, PropagateLayer};
//! use cancel_scope::wire::{EgressPolicy, EndpointPolicy};
//!
//! let ms = Duration::from_millis;
//! let server = AdmitLayer::new(EndpointPolicy::builder(ms(2000))
//!     .default_budget(ms(1000))
//!     .reserve(ms(20))
//!     .build())
//!     .on_report(|admission, report| {
//!         println!("{}: {report}", admission.operation_id());
//!     });
//! let client = PropagateLayer::new().egress(EgressPolicy::builder().transport_pad(ms(5)).build());
//! # let _ = (server, client);
//! ```

pub mod admit;
pub mod detach;
mod headers;
pub mod propagate;

pub use admit::{Admit, AdmitLayer, Ingress};
pub use detach::{Detach, DetachLayer, Detached};
pub use propagate::{Propagate, PropagateLayer};
