//! Server middleware: admit every request into its own root scope.
//!
//! # Why a layer and not a timeout
//!
//! A server-side timeout (tonic's `grpc-timeout` handling, `tower::timeout`) stops the handler
//! but tells the handler nothing: it cannot see how much time is left, cannot pass the rest on
//! to its own dependencies, and work it spawned runs on. Here the handler runs with the
//! request's [`Scope`](crate::Scope) as [`Scope::current`](crate::Scope::current): every
//! child, task and outgoing call made under it shares the one deadline and is cancelled with
//! it, and the layer waits for all of it to be quiet before it reports.
//!
//! See [the module docs](super) for the status mapping.
//!
//! # What the handler sees, and what a refused caller is told
//!
//! The handler gets the request without its raw budget headers (`grpc-timeout`,
//! `service-budget`, `x-envoy-expected-rq-timeout-ms`): they are decoded into the
//! [`Admission`](crate::wire::Admission) in the request's extensions, and a handler that
//! copies its incoming headers onto a call of its own cannot pass a caller's budget,
//! priority, operation id or generation on (see
//! [header ownership](crate::wire#header-ownership-and-trust)).
//!
//! A request that is refused (a bad budget header, a budget over a rejecting maximum, too
//! little left) never reaches the handler. Unless the policy shows the caller the detail
//! ([`EndpointPolicyBuilder::error_detail`](crate::wire::EndpointPolicyBuilder::error_detail); the
//! [`Trusted`](crate::wire::Trust::Trusted) preset does), the answer says its kind in one
//! fixed text, in the HTTP body (`text/plain`) or in `grpc-message`: `invalid budget header`,
//! `budget exceeds the endpoint's maximum` or `budget exhausted`; and the answers for a
//! request stopped later say `deadline exceeded` or `service unavailable`, never a cancel's
//! reason. The detail goes to [`on_refusal`](AdmitLayer::on_refusal) and to the
//! [`Report`](crate::Report) of [`on_report`](AdmitLayer::on_report).
//!
//! # When the request's scope ends
//!
//! A handler that answers only at or after the deadline (it held the thread past it, before
//! the deadline's timer ran) gets the deadline's answer, as one still running then does: its
//! late response is dropped.
//!
//! The handler is one child of the request's scope, from its admission until it answers: its
//! receipt is in the report (`Succeeded`; `Failed` for a 5xx or a gRPC server error of its
//! own, or a panic; `Cancelled` if the request was stopped first), so a completed request
//! reads "1 succeeded".
//!
//! The scope is *closed* (no new work) once the handler's response is complete: at once for a
//! response without a body to send, at the end of the body ([`ResponseBody`]) otherwise. So
//! a streaming response (a server-streaming gRPC method, a chunked download) can start work
//! for each message while it streams — the body's own code, or a task the handler left
//! producing it, calls downstream in the request's scope — bounded by the request's
//! deadline, and quiescence keeps its meaning: the request is quiet once its body ended and
//! the work started for it has its receipts. Work the handler spawned runs on until it
//! finishes or the deadline passes, and the report waits for it. The body is bounded by the
//! same deadline (a gRPC body then ends with `DEADLINE_EXCEEDED` trailers, any other body
//! with an error), and a client that goes away while it streams cancels the scope with
//! [`ClientGone`](crate::Cause::ClientGone). A client that goes away before the answer
//! cancels the request the same way, unless the endpoint has a
//! [`DetachLayer`](super::DetachLayer) outside this layer: then the request runs on for at
//! most that layer's bound. At the scope's cancel the handler's body is
//! dropped at once — what it holds (a pool's connection, a permit) goes back — and the report
//! stops waiting for it, also when the server does not poll it (a client that stopped
//! reading): see [`ResponseBody`].
//!
//! A handler that panics (in the service's `call`, or while its future is polled) is
//! answered HTTP 500 / gRPC `INTERNAL` with the fixed text `internal error` (the panic does
//! not reach the server, which would reset the connection), receipted `Failed` with the
//! panic's message in the report, and its request is cancelled with `Cancelled` and the
//! reason "the handler panicked" (not `ClientGone`), so that what it left running stops. A
//! panic while its response body is polled (after the head was sent, when no status can be
//! given any more) cancels the request the same way and ends the response as the server
//! ends a failed body.
//!
//! Put a response reserve in the policy when a server in front of the layer also enforces
//! `grpc-timeout` (tonic's server reads it before any layer, and answers its own expiry with
//! `CANCELLED`; so does a tonic client, on its side): with a reserve the layer's deadline
//! comes first and the caller gets `DEADLINE_EXCEEDED`. The reserve must cover the answer's
//! trip back to the client, whose own timer fires at the full `grpc-timeout`.
//!
//! # Operations across requests and processes
//!
//! A layer given an operation registry ([`operations`](AdmitLayer::operations)) admits with
//! the operation's remaining time as a third term, `min(header, cap, operation remaining)`
//! ([`EndpointPolicy::admit_joined`](crate::wire::EndpointPolicy::admit_joined)): a
//! client's retry under the operation id the edge issued, at this server or another one
//! sharing the registry, gets what the operation has left. Every answer to an admitted
//! request names its operation in a `service-operation` header
//! ([`wire::service_operation`](crate::wire::service_operation)): the id issued here, or one
//! the policy trusts or the registry holds, never a claim that was not believed. Only a caller the policy trusts
//! with its operation id creates an operation; an untrusted caller's id only continues one
//! the registry holds, and an unknown one is replaced by a fresh edge-issued id. The request's
//! scope is attached to its operation, so the operation's cancel — also one made in another
//! process — stops it; a request of a cancelled operation, or of an older generation, is
//! answered 409 / `ABORTED` (`operation cancelled`, `service-effect: none`). A registry that
//! fails or is slow (bounded by [`Operations::timeout`](crate::registry::Operations::timeout)
//! and the request's budget) admits the request on the endpoint's own terms, counted
//! ([`JoinCounts::faults`](crate::registry::JoinCounts::faults)) and noted in its report
//! ([`Report::registry_faults`](crate::Report::registry_faults)).
//!
//! # Graceful shutdown
//!
//! A layer given a [`ServerScope`](crate::wire::ServerScope)
//! ([`server`](AdmitLayer::server)) admits every request as its child: the server's
//! [`shutdown`](crate::wire::ServerScope::shutdown) stops admitting (503 / `UNAVAILABLE` with
//! `Retry-After` or `grpc-retry-pushback-ms`, and `service-effect: none`: nothing was done),
//! waits for the requests in flight, then cancels the stragglers with
//! [`Cause::Shutdown`](crate::Cause::Shutdown) (answered 503 / `UNAVAILABLE` with
//! `Retry-After`, or 500 / `UNKNOWN` with `service-effect: unknown` after a possibly
//! effectful call) and reports. Give axum's `with_graceful_shutdown` (or tonic's
//! `serve_with_shutdown`) the server's [`draining`](crate::wire::ServerScope::draining)
//! future, so that the server stops accepting connections at the same moment
//! (`examples/graceful_shutdown.rs`).
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::time::Duration;
//! use http::{Request, Response};
//! use tower_layer::Layer;
//! use tower_service::Service;
//! use cancel_scope::integrations::tower::AdmitLayer;
//! use cancel_scope::wire::EndpointPolicy;
//! use cancel_scope::Scope;
//!
//! let policy = EndpointPolicy::builder(Duration::from_secs(2))
//!     .default_budget(Duration::from_secs(1))
//!     .build();
//! let handler = tower_service_fn(|_req: Request<()>| async {
//!     // The handler sees what is left of the caller's 250 ms.
//!     let left = Scope::current().remaining().unwrap();
//!     Ok::<_, std::convert::Infallible>(Response::new(format!("{}", left.as_millis())))
//! });
//! let mut svc = AdmitLayer::new(policy).layer(handler);
//!
//! let req = Request::builder().header("grpc-timeout", "250m").body(()).unwrap();
//! let res = svc.call(req).await.unwrap();
//! assert_eq!(res.into_body().into_inner().unwrap(), "250");
//!
//! let bad = Request::builder().header("grpc-timeout", "1 hour").body(()).unwrap();
//! assert_eq!(svc.call(bad).await.unwrap().status(), 400);
//! # }
//! # // A minimal `service_fn` (tower's lives in the `tower` crate).
//! # fn tower_service_fn<F>(f: F) -> Fn_<F> { Fn_(f) }
//! # #[derive(Clone)] struct Fn_<F>(F);
//! # impl<F: FnMut(R) -> Fut, R, Fut: std::future::Future<Output = Result<T, E>>, T, E>
//! #     tower_service::Service<R> for Fn_<F> {
//! #     type Response = T; type Error = E; type Future = Fut;
//! #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>)
//! #         -> std::task::Poll<Result<(), E>> { std::task::Poll::Ready(Ok(())) }
//! #     fn call(&mut self, r: R) -> Fut { (self.0)(r) }
//! # }
//! ```

mod answer;
mod body;
mod finish;
pub mod future;
mod layer;
mod service;

pub use body::ResponseBody;
pub use layer::AdmitLayer;
pub use service::{Admit, Ingress};
