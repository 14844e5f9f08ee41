//! One end-to-end time budget per request and one cancellation tree per operation, for async
//! services on tokio.
//!
//! A [`Scope`] is a node of a cancellation tree with a deadline. Every piece of work of a
//! request — spawned tasks, database queries, HTTP and gRPC calls, connection permits, retry
//! attempts — is tied to a scope, and the scope guarantees:
//!
//! * **Budgets only shrink.** A child's deadline is
//!   `min(parent - reserve, now + cap, operation deadline)`, and a child that would get less
//!   than its minimum useful budget is not started ([`budget`]).
//! * **Cancel flows down with a cause.** [`Cause`] says why: deadline, explicit cancel (with a
//!   reason), parent cancelled, client gone. The first cause wins.
//! * **No new work after cancel.** Cancelling closes the scope's registration watermark and
//!   bumps its generation in one atomic step; a child is registered first and then dispatched
//!   by a compare-and-swap that fails after the cancel, whatever the interleaving.
//! * **Stable quiescence.** [`Scope::quiesce`] resolves when every child has a terminal
//!   [`Receipt`] and every guard is released, and reports unknown side effects for
//!   reconciliation. After that nothing of the scope can start or commit.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::time::Duration;
//! use cancel_scope::{Lifecycle, Scope};
//!
//! // The edge gives the request 100 ms.
//! let request = Scope::with_timeout(Duration::from_millis(100));
//!
//! // A dependency call keeps 10 ms for the response and is not started below 20 ms.
//! let call = request
//!     .child()
//!     .reserve(Duration::from_millis(10))
//!     .min_useful(Duration::from_millis(20))
//!     .build()
//!     .unwrap();
//! let slow = call.spawn(async {
//!     tokio::time::sleep(Duration::from_millis(350)).await; // would take 350 ms
//! }).unwrap();
//!
//! // At 90 ms the call's budget runs out: the task is stopped at its next await.
//! assert!(slow.await.unwrap_err().is_deadline_exceeded());
//!
//! let report = request.quiesce().await;
//! assert_eq!(report.state(), Lifecycle::CancelledStable);
//! assert_eq!(report.cancelled(), 1);
//! # }
//! ```
//!
//! # Layers
//!
//! | module | job |
//! |---|---|
//! | [`budget`] | pure budget arithmetic |
//! | [`Scope`] | the tree, deadlines, cancel, the current scope ([`CarryScope`] carries it across a bare spawn) |
//! | [`Ticket`], [`Receipt`], [`Scope::spawn`], [`Scope::spawn_fallible`] | registered children and their receipts |
//! | [`Permit`], [`Tethered`] | resources counted against a scope |
//! | [`Report`], [`Lifecycle`] | stable quiescence |
//! | [`retry`] | retries and hedges within one budget, with a ledger per call |
//! | [`fanout`] | parallel required and optional branches sharing one budget |
//! | [`wire`] | `grpc-timeout`, `service-budget` and Envoy header codecs; admission and egress |
//! | `integrations` | database, tower and reqwest adapters (behind features) |
//!
//! # User code that panics
//!
//! The scope runs code of yours on behalf of others: the wakers of the tasks waiting on it
//! (in `cancelled()`, `quiesce()`, a `run`), `on_cancel` callbacks, and in the layers above,
//! a retry's operation and classifier or a fan-out branch's constructor. A panic there does
//! not leave the step that ran it half done: a cancel still reaches the whole subtree, a
//! close closes it, a scope that became quiet still gives its unit back to its parent and
//! wakes its other waiters, a quarantine records and releases every child it took, and a
//! hedge or fan-out cancels and collects its other attempts or branches, and a retry or hedge
//! call attaches its ledger to the scope's report (`Stop::Panicked`). The first panic then
//! comes out of the call that ran the step — which may be another task's call (a waker of
//! yours is woken by whoever cancels, closes or releases) — or is dropped if that thread is
//! already unwinding (a second panic from a destructor would abort the process).
//!
//! ```
//! use std::future::Future;
//! use std::sync::Arc;
//! use std::task::{Context, Wake, Waker};
//! use cancel_scope::Scope;
//!
//! struct Buggy;
//! impl Wake for Buggy {
//!     fn wake(self: Arc<Self>) {
//!         panic!("a buggy waker");
//!     }
//! }
//!
//! let root = Scope::new();
//! let child = root.child().build().unwrap();
//! let mut waiting = Box::pin(root.cancelled());
//! let waker = Waker::from(Arc::new(Buggy));
//! assert!(waiting.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
//!
//! let cancel = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| root.cancel()));
//! assert!(cancel.is_err()); // the waker's panic comes out of `cancel`...
//! assert!(child.is_cancelled()); // ...once the cancel has reached the whole tree
//! ```
//!
//! # Feature flags
//!
//! The default build depends only on tokio, `pin-project-lite`, `parking_lot`, `slab`, `once_cell`
//! and `sfv`.
//!
//! | feature | what |
//! |---|---|
//! | `sqlx-postgres` | `integrations::sqlx` for PostgreSQL: budget-derived `statement_timeout`, server-side cancel |
//! | `sqlx-sqlite` | `integrations::sqlx` for SQLite (bundled): statements interrupted on cancel |
//! | `sqlx` | both of the above |
//! | `tower` | `integrations::tower`: `Admit` (server) and `Propagate` (client) middleware for axum, tonic and hyper (adds `tower-layer`, `tower-service`, `http`, `http-body`) |
//! | `stream` | `futures_core::Stream` support: `Scope::run_stream` (a stream that ends with the cause at the cancel or the deadline, with an idle timeout beside), and [`Carried`] streams (adds `futures-core`) |
//! | `tokio-util` | `CancellationToken` interop, both ways: `Scope::cancellation_token` (cancelled with the scope, for libraries that take a token) and `ChildBuilder::cancelled_by` (a child that a token cancels); no task either way (adds `tokio-util` without default features) |
//! | `reqwest` | `integrations::reqwest`: reqwest calls in a child scope (adds `reqwest` without default features, `bytes`, `http`) |
//!
//! `__test-servers` is not public API: it pulls in axum and tonic's transport for this
//! crate's own loopback tests.

#![warn(unreachable_pub)]
#![forbid(unsafe_code)]
#![warn(clippy::disallowed_types)]

pub mod budget;
mod cause;
mod child;
mod error;
pub mod fanout;
mod guard;
#[cfg(any(
    feature = "sqlx-postgres",
    feature = "sqlx-sqlite",
    feature = "tower",
    feature = "reqwest"
))]
pub mod integrations;
mod quiesce;
pub mod retry;
mod scope;
mod sync;
mod tree;
pub mod wire;

pub use cause::Cause;
#[doc(hidden)]
pub use child::OwnTicket as __OwnTicket;
pub use child::{
    ChildSpec, Dispatched, Effect, EffectRecord, Failure, JoinHandle, Receipt, Ticket,
};
pub use error::Error;
pub use guard::{Permit, Tethered};
pub use quiesce::{Lifecycle, Quiesce, Report};
pub use scope::{
    Cancelled, Carried, CarryScope, ChildBuilder, OnCancel, Run, Scope, DEFAULT_CLEANUP_BUDGET,
    DEFAULT_GRACE,
};

#[cfg(feature = "stream")]
pub use scope::RunStream;

/// The README's example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
