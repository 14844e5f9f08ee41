//! Client middleware: every outgoing call in a child scope, its budget on the wire.
//!
//! # Why a layer and not a timeout
//!
//! A fixed client timeout restarts the clock at every hop and keeps running after the caller
//! gave up. Here each call takes what is *left* of the caller's budget:
//!
//! 1. a child of the current scope (or of a [`Scope`](crate::Scope) found in the request's
//!    extensions, see below) is cut by the [`EgressPolicy`] — explicit, or that of the
//!    request's [`Operation`](crate::wire::Operation) — and fails fast when the callee would
//!    get less than the minimum useful budget;
//! 2. the call is registered as a child ([`ChildSpec`](crate::ChildSpec) from the request's
//!    extensions, or the layer's, or the effect class of the request: see below) and
//!    dispatched right before it is sent: after a cancel it is never sent;
//! 3. `grpc-timeout` and `service-budget` carry the budget minus the transport pad. Egress
//!    owns these headers: any budget header already on the request (`grpc-timeout`,
//!    `service-budget`, Envoy's `x-envoy-expected-rq-timeout-ms`) is read only as the
//!    caller's own bound for this call (tonic's `Request::set_timeout` writes
//!    `grpc-timeout`): the shortest valid one caps the child (its deadline and what the
//!    callee is told shrink together, never grow), and then all of them are replaced by the
//!    call's own, so a malformed one is not trusted and a copied one's priority, operation id
//!    and generation do not go on. A call whose scope has no deadline carries no budget
//!    header (the callee applies its own default), and only a `grpc-timeout` the caller set
//!    gives it one: a `service-budget` or Envoy header there was copied from elsewhere and
//!    would give the callee more than its default;
//! 4. the call — and its response body — is stopped when the child's deadline passes or its
//!    scope is cancelled;
//! 5. its receipt follows the response's status and the effect class (the table below), with
//!    the status kept in an `EffectUnknown` record.
//!
//! For gRPC requests a stop is answered as gRPC does: a trailers-only response (or final
//! trailers, mid-body) with `DEADLINE_EXCEEDED` for a deadline and `CANCELLED` otherwise, so a
//! tonic client reports `Code::DeadlineExceeded`. A `CANCELLED` status that arrives after
//! the budget the callee was told had run out is reported as `DEADLINE_EXCEEDED` too (tonic
//! servers and channels time out on `grpc-timeout` themselves and call that CANCELLED). Other
//! requests fail with a [`CallError`].
//!
//! The parent scope is taken when the service is *called*: `scope.run(client.call(req))`
//! calls it before `run` makes the scope current, so write
//! `scope.run(async { client.call(req).await })` (tonic's generated clients and
//! `tower::ServiceExt::oneshot` inside the scope do this naturally), or put the `Scope` in
//! the request's extensions.
//!
//! # Outside any scope
//!
//! A call made with no scope current and none in the request's extensions (from a bare
//! `tokio::spawn` task, a background thread) is refused and nothing is sent: a plain request
//! fails with [`CallError::is_no_scope`](crate::integrations::CallError::is_no_scope), a gRPC
//! request gets a trailers-only `FAILED_PRECONDITION` (a tonic client reads it as that
//! status; tonic's `Status::from_error` can only find its own and hyper's error types in an
//! error's source chain, and would make this one `UNKNOWN`). Such a call would otherwise go
//! out with whatever budget headers its code copied onto it, unbounded and unreported.
//! [`PropagateLayer::allow_unscoped`] lets such calls through, explicitly: not registered
//! anywhere, without `service-budget` and Envoy headers, with a `grpc-timeout` of at most the
//! cap it is given.
//!
//! # Redirects
//!
//! The layer writes the budget headers of each request it is given and does not follow
//! redirects itself (gRPC has none). A tower-http `FollowRedirect` placed *inside* it repeats
//! the first request's headers on every hop, to whatever origin the hop goes, as reqwest does
//! (see `integrations::reqwest::redirect_policy`); placed *outside* it, every hop is a call of
//! its own, registered and told the budget left then, and its policy decides which origins
//! get the call (and so its operation id and priority): give it one that stays within the
//! origin of the request.
//!
//! # The effect class of a call
//!
//! Without a [`ChildSpec`](crate::ChildSpec) (in the request's extensions, or the layer's
//! [`spec`](PropagateLayer::spec)), a call is registered by what its request shows
//! ([`PropagateLayer::spec_for`]): HTTP `GET`, `HEAD`, `OPTIONS` and `TRACE` read-only; `PUT`
//! and `DELETE` idempotent (safe to retry, still an effect); `POST`, `PATCH` and other methods
//! side-effecting, or idempotent with an `Idempotency-Key` header (its value is the key); gRPC
//! calls side-effecting unless the layer declares the method (or its service)
//! [read-only](PropagateLayer::read_only_method) or
//! [idempotent](PropagateLayer::idempotent_method).
//!
//! # Durable intents
//!
//! A layer given a [`Journal`](crate::reconcile::Journal) ([`PropagateLayer::journal`])
//! writes the intent of every call whose effect class the journal records (effect id and key,
//! the operation of its scope) to the journal's store after the call's headers are written
//! and before it is dispatched and sent, so that a process killed after sending a write leaves
//! a record for the [`Reconciler`](crate::reconcile::Reconciler). The receipt resolves it:
//! `Succeeded` applied, `Failed` not applied, `EffectUnknown` left pending. A store fault
//! (an error, the journal's timeout, a full store) refuses the call before anything is sent
//! ([`CallError::is_intent_not_recorded`](crate::integrations::CallError::is_intent_not_recorded);
//! over gRPC a trailers-only `UNAVAILABLE`). Such a layer's services need a `Clone` inner
//! service: the call waits for the store before the inner service is called.
//!
//! # Receipts
//!
//! | the call... | read-only | may have had an effect |
//! |---|---|---|
//! | answered HTTP 1xx–3xx or gRPC `OK`, read to its end | `Succeeded` | `Succeeded` |
//! | answered HTTP 4xx, or gRPC `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | `Failed` | `Failed`: refused unprocessed |
//! | answered any other error (HTTP 5xx; gRPC `UNKNOWN`, `INTERNAL`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`, …), or a gRPC body without a status | `Failed` | `EffectUnknown` |
//! | the transport failed | `Failed` | `EffectUnknown` |
//! | stopped by its scope (or the budget it told ran out), or dropped before the body's end | `Cancelled` | `EffectUnknown` |
//!
//! A gRPC call's status is in its trailers: its receipt is decided at the end of the body,
//! not from the head (which says 200), except for a trailers-only response, whose head
//! carries the status. An HTTP error status decides at the head: a call answered 404 whose
//! body is then cut is still `Failed`.
//!
//! # The current scope and the request's scope
//!
//! Budgets only shrink, so when a request carries a `Scope` in its extensions *and* a scope
//! is current, the call is bounded by both, and its parent is the more specific of the two:
//!
//! * the current scope, when it is the request's scope or inside it. This is the usual case:
//!   [`Admit`](super::Admit) puts the request's *root* scope into the extensions, and a
//!   handler that forwards that request (a proxy) from inside a tighter child scope must
//!   send the child's budget, and be cut at the child's deadline, not the root's;
//! * the request's scope, when it is inside the current one (it was put there for this call:
//!   its cancel stops the call);
//! * for two scopes of different trees, the current scope, with the request's scope's
//!   deadline as a further cap (a cancel of the request's scope does not reach the call).
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::time::Duration;
//! use http::{Request, Response};
//! use tower_layer::Layer;
//! use tower_service::Service;
//! use cancel_scope::integrations::tower::PropagateLayer;
//! use cancel_scope::wire::EgressPolicy;
//! use cancel_scope::Scope;
//!
//! // A "transport" that answers with the budget headers it was given.
//! let transport = service_fn(|req: Request<()>| async move {
//!     let mut res = Response::new(String::new());
//!     for name in ["grpc-timeout", "service-budget"] {
//!         res.headers_mut().insert(name, req.headers()[name].clone());
//!     }
//!     Ok::<_, std::convert::Infallible>(res)
//! });
//! let egress = EgressPolicy::builder().transport_pad(Duration::from_millis(10)).build();
//! let mut client = PropagateLayer::new().egress(egress).layer(transport);
//!
//! let request = Scope::with_timeout(Duration::from_millis(300));
//! // `call` takes the current scope, so it must run inside the request's scope.
//! let res = request
//!     .run(async move { client.call(Request::new(())).await })
//!     .await
//!     .unwrap()
//!     .unwrap();
//! assert_eq!(res.headers()["grpc-timeout"], "290000u");
//! assert!(res.headers()["service-budget"].to_str().unwrap().starts_with("v=1, rem=290, gen=0"));
//! # }
//! # fn service_fn<F>(f: F) -> Fn_<F> { Fn_(f) }
//! # struct Fn_<F>(F);
//! # impl<F: FnMut(R) -> Fut, R, Fut: std::future::Future<Output = Result<T, E>>, T, E>
//! #     tower_service::Service<R> for Fn_<F> {
//! #     type Response = T; type Error = E; type Future = Fut;
//! #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>)
//! #         -> std::task::Poll<Result<(), E>> { std::task::Poll::Ready(Ok(())) }
//! #     fn call(&mut self, r: R) -> Fut { (self.0)(r) }
//! # }
//! ```
//!
//! [`EgressPolicy`]: crate::wire::EgressPolicy
//! [`CallError`]: crate::integrations::CallError

mod body;
pub mod future;
mod layer;
mod service;

pub use body::ResponseBody;
pub use layer::PropagateLayer;
pub use service::Propagate;
