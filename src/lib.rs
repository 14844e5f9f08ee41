//! One end-to-end time budget per request and one cancellation tree per operation, for async
//! services on tokio.
//!
//! # Quick start
//!
//! A server layer admits every request into a scope with the budget its caller sent, the
//! handler finds that scope as the current one, and an outgoing call made in it carries what
//! is left (features `tower` and `reqwest`):
//!
#![cfg_attr(all(feature = "tower", feature = "reqwest"), doc = "```no_run")]
#![cfg_attr(not(all(feature = "tower", feature = "reqwest")), doc = "```ignore")]
//! use std::time::Duration;
//! use cancel_scope::integrations::reqwest::{redirect_policy, RequestBuilderExt as _};
//! use cancel_scope::integrations::{tower::AdmitLayer, CallError};
//! use cancel_scope::{wire::EndpointPolicy, Scope};
//!
//! // Every request runs in a scope of its own: the caller's `grpc-timeout` or
//! // `service-budget`, at most 2 s; 1 s if it sent none. With axum:
//! // `Router::new().route("/order", post(order)).layer(admit)`; tonic: `.layer(admit)`.
//! let policy = EndpointPolicy::builder(Duration::from_secs(2))
//!     .default_budget(Duration::from_secs(1))
//!     .build();
//! let admit = AdmitLayer::new(policy);
//! let http = reqwest::Client::builder().redirect(redirect_policy()).build().unwrap();
//!
//! async fn order(http: &reqwest::Client) -> Result<String, CallError> {
//!     let left = Scope::current().remaining(); // the request's scope, not passed by hand
//!     // A child of the current scope, told what is left: not sent if too little is, stopped
//!     // at the deadline, its receipt in the request's report.
//!     let stock = http.get("http://inventory/stock/42").send_scoped().await?;
//!     Ok(format!("{left:?} left; stock: {}", stock.text().await?))
//! }
//! ```
//!
//! # Scopes
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
//! Without a server, scopes are made and used directly:
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
//! # Public API
//!
//! Every public item, by module. The guarantees behind them are in `docs/design.md` and
//! the wire formats in `docs/wire.md` (both in the crate's package and repository).
//!
//! | module | item | what |
//! |---|---|---|
//! | crate root | [`Scope`] | a node of the cancellation tree: deadline, cause, children, tasks, guards; the current scope |
//! | | [`ChildBuilder`] | builds a child scope: reserve, cap, deadline, minimum useful budget, name, grace period |
//! | | [`Cause`] | why a scope was cancelled: deadline, explicit cancel, parent cancelled, client gone |
//! | | [`Run`] | a future run as the scope's body, with the scope current, stopped at its cancel ([`Scope::run`]) |
//! | | [`CarryScope`] | `in_current_scope()` / `with_scope(&s)`: the scope made current in a future moved into a bare `tokio::spawn` (not registered, not stopped) |
//! | | [`Carried`] | the future (or stream) `CarryScope` makes |
//! | | [`Cancelled`] | completes when the scope is cancelled ([`Scope::cancelled`]) |
//! | | [`OnCancel`] | a callback that runs once at the cancel ([`Scope::on_cancel`]); dropping it unregisters it |
//! | | [`ChildSpec`] | a child before it is registered: its name and its [`Effect`] |
//! | | [`Effect`] | what a child may do outside the process: read-only, idempotent (with a key), side-effecting |
//! | | [`Ticket`] | a registered child, not yet dispatched ([`Scope::register`]) |
//! | | [`Dispatched`] | a dispatched child, which ends with a receipt (given, or recorded when dropped) |
//! | | [`Receipt`] | how a registered child ended; exactly one per child |
//! | | [`EffectRecord`] | an effect whose outcome is unknown: id, payload digest, provider handle, status |
//! | | [`JoinHandle`] | waits for a task of [`Scope::spawn`], [`Scope::spawn_fallible`], [`Scope::spawn_blocking`] or [`Scope::shield`] |
//! | | [`Failure`] | a child that ended with an error, as the report lists it |
//! | | [`Tethered`] | any resource counted against a scope while it lives ([`Scope::tether`]; a semaphore permit: [`Scope::acquire`]) |
//! | | [`Quiesce`] | resolves to the scope's [`Report`] once it is quiet ([`Scope::quiesce`]) |
//! | | [`Report`] | what a scope did, as of the moment it became quiet: state, receipts, pending effects |
//! | | [`Lifecycle`] | where a scope is in its life, and its final state |
//! | | [`Error`] | why an operation of the crate did not run or did not finish, with predicates |
//! | | [`DEFAULT_GRACE`] | how long `quiesce` waits after a cancel before it quarantines (1 s) |
//! | | [`DEFAULT_CLEANUP_BUDGET`] | a budget for a shielded cleanup that ends within the default grace period (500 ms) |
//! | [`budget`] | [`ChildBudget`](budget::ChildBudget) | a child's budget: `min(parent − reserve, cap, operation)`, refused below a minimum |
//! | | [`BudgetExhausted`](budget::BudgetExhausted) | too little budget left for the work to be useful; nothing was started |
//! | | [`Split`](budget::Split) | how a retry shares what is left among its attempts: even or greedy |
//! | | [`EndpointBudget`](budget::EndpointBudget) | an endpoint's rules for a declared budget: maximum, default, reserve |
//! | | [`EndpointBudgetBuilder`](budget::EndpointBudgetBuilder) | builds an `EndpointBudget` from its maximum (`EndpointBudget::builder`) |
//! | | [`Rules`](budget::Rules) | a reserve, a cap and a minimum useful budget as one value, for `.rules(…)` on the child, retry, fan-out, egress and pool builders |
//! | | [`grant`](budget::grant) | the greedy grant: `max(0, min(cap, remaining − reserve))` |
//! | | [`hop_timeout`](budget::hop_timeout) | a per-hop timeout: `min(cap, max(floor, remaining − pad))`, never more than remaining |
//! | [`retry`] | [`Retry`](retry::Retry) | a retry policy: attempts, budget split, reserve, backoff, retry budget |
//! | | [`Run`](retry::Run) | the future of `Retry::run`: a call in flight, a type a struct field can name |
//! | | [`RunWithLedger`](retry::RunWithLedger) | the future of `Retry::run_with_ledger`: the call's outcome with its ledger |
//! | | [`Hedge`](retry::Hedge) | hedged calls: another attempt when the one before has not answered |
//! | | [`HedgeDelay`](retry::HedgeDelay) | when a hedge starts: a fixed delay or a latency percentile |
//! | | [`HedgeRun`](retry::HedgeRun), [`HedgeRunWithLedger`](retry::HedgeRunWithLedger) | the futures of `Hedge::run` and `Hedge::run_with_ledger`: a hedged call in progress, a type a struct field can name |
//! | | [`Latencies`](retry::Latencies) | a dependency's recent latencies, for percentile hedge delays |
//! | | [`Decision`](retry::Decision) | what to do after a failed attempt: the caller's classification of its error |
//! | | [`Classify`](retry::Classify) | classifies an operation's errors; implemented for every `Fn(&E) -> Decision` |
//! | | [`Attempt`](retry::Attempt) | what an attempt knows about itself: number, budget, endpoint, scope |
//! | | [`AttemptEnd`](retry::AttemptEnd) | how one attempt ended |
//! | | [`AttemptRecord`](retry::AttemptRecord) | one attempt in a ledger |
//! | | [`Ledger`](retry::Ledger) | every attempt of one call, what they cost and why the call stopped |
//! | | [`Stop`](retry::Stop) | why a call stopped starting attempts |
//! | | [`RetryError`](retry::RetryError) | a retry or hedge call that did not succeed: why, the last error, the ledger |
//! | | [`RetryBudget`](retry::RetryBudget) | a token bucket that caps retries and hedges to a ratio of requests |
//! | | [`Exponential`](retry::Exponential) | exponential backoff with jitter |
//! | | [`ExponentialIter`](retry::ExponentialIter) | the delays of an `Exponential` schedule |
//! | | [`Jitter`](retry::Jitter) | how much randomness spreads the delays of callers that failed together |
//! | | [`BackoffFn`](retry::BackoffFn) | a schedule made by a function (see `backoff_fn`) |
//! | | [`backoff_fn`](retry::backoff_fn) | a backoff schedule made afresh for every call, for schedules that are not `Clone` |
//! | | [`BoxClassify`](retry::BoxClassify) | any classifier behind one nameable, cloneable type |
//! | | [`BoxRetry`](retry::BoxRetry) | a retry policy with a boxed classifier: a type a struct field can name (`Retry::boxed`) |
//! | [`fanout`] | [`FanOut`](fanout::FanOut) | parallel required and optional branches sharing one budget |
//! | | [`Required`](fanout::Required) | the handle of a required branch |
//! | | [`Optional`](fanout::Optional) | the handle of an optional branch, whose value may be absent |
//! | | [`Join`](fanout::Join) | the future of `FanOut::join`: a fan-out in progress, a type a struct field can name |
//! | | [`Joined`](fanout::Joined) | the results of a fan-out whose required branches all succeeded |
//! | | [`FanOutError`](fanout::FanOutError) | a fan-out that failed: which branch, and why |
//! | | [`BoxError`](fanout::BoxError) | a branch's own error, boxed |
//! | [`registry`] | [`OperationRegistry`](registry::OperationRegistry) | an operation's deadline and cancel generation, shared by requests and processes |
//! | | [`InProcessRegistry`](registry::InProcessRegistry) | the embedded default: bounded, entries expire with their deadline |
//! | | [`Operations`](registry::Operations) | what admission calls: join an operation, attach a scope, check, cancel, count faults |
//! | | [`Join`](registry::Join), [`Joined`](registry::Joined), [`JoinCounts`](registry::JoinCounts) | a request joining its operation, the result, the running counts |
//! | | [`OperationId`](registry::OperationId) | a validated operation id; `random()` gives 128 unguessable bits |
//! | | [`OperationState`](registry::OperationState), [`Begun`](registry::Begun), [`CancelOutcome`](registry::CancelOutcome) | what the registry answers |
//! | | [`LocalScopes`](registry::LocalScopes) | this process's scopes per operation, by weak reference, cancelled together |
//! | | [`RegistryError`](registry::RegistryError), [`JoinError`](registry::JoinError) | a registry fault (admission falls back to the endpoint cap) or a refusal |
//! | | [`RegistryFault`](registry::RegistryFault) | a request admitted on its endpoint's terms because the registry failed: a note in its report ([`Report::registry_faults`]) |
//! | | [`MAX_ID_LEN`](registry::MAX_ID_LEN), [`MAX_LIFETIME`](registry::MAX_LIFETIME), [`MIN_BUDGET`](registry::MIN_BUDGET), [`DEFAULT_TIMEOUT`](registry::DEFAULT_TIMEOUT), [`OPERATION_CANCELLED`](registry::OPERATION_CANCELLED) | the registry's bounds and defaults |
//! | [`reconcile`] | [`IntentStore`](reconcile::IntentStore) | where durable intents live; [`InMemoryIntents`](reconcile::InMemoryIntents) is the default |
//! | | [`Journal`](reconcile::Journal), [`Journaled`](reconcile::Journaled) | writes an intent before a possibly-effectful dispatch and resolves it by the receipt |
//! | | [`Reconciler`](reconcile::Reconciler), [`Reconciled`](reconcile::Reconciled) | lists pending intents and resolves each once |
//! | | [`Intent`](reconcile::Intent), [`IntentRecord`](reconcile::IntentRecord), [`EffectClass`](reconcile::EffectClass), [`Resolution`](reconcile::Resolution), [`Resolved`](reconcile::Resolved) | an intent, as written and as stored, and how it ended |
//! | | [`IntentError`](reconcile::IntentError), [`MAX_FIELD_LEN`](reconcile::MAX_FIELD_LEN), [`DEFAULT_JOURNAL_TIMEOUT`](reconcile::DEFAULT_JOURNAL_TIMEOUT) | a store fault; the bounds and defaults |
//! | [`telemetry`] | [`ADMISSION_BUDGET`](telemetry::ADMISSION_BUDGET) … [`RETRY_BUDGET_EXHAUSTED`](telemetry::RETRY_BUDGET_EXHAUSTED) | the names of the crate's metrics (features `metrics`), listed with their labels in the module |
//! | | [`REQUEST_SPAN`](telemetry::REQUEST_SPAN), [`CALL_SPAN`](telemetry::CALL_SPAN), [`UNNAMED_DEPENDENCY`](telemetry::UNNAMED_DEPENDENCY) | the names of the spans of a request and of a call (feature `tracing`); the `dependency` of a call given no name |
//! | [`wire`] | [`EndpointPolicy`](wire::EndpointPolicy) | an endpoint's budget rules and trust settings; [`admit`](wire::EndpointPolicy::admit), [`admit_in`](wire::EndpointPolicy::admit_in) under a `ServerScope`, and [`admit_joined`](wire::EndpointPolicy::admit_joined) with the operation registry's term |
//! | | [`EndpointPolicyBuilder`](wire::EndpointPolicyBuilder) | builds an `EndpointPolicy` from its maximum (`EndpointPolicy::builder`), or from a policy (`to_builder`) |
//! | | [`Trust`](wire::Trust) | presets for all the trust settings at once: untrusted, trusted |
//! | | [`OnBadInput`](wire::OnBadInput) | what admission does with a budget header it cannot decode: refuse, or fall back |
//! | | [`OverCap`](wire::OverCap) | what admission does with a budget over the maximum: clamp, or refuse |
//! | | [`Incoming`](wire::Incoming) | the budget headers of an incoming request, decoded line by line |
//! | | [`Admission`](wire::Admission) | the audit record of one admitted request: what it asked for, what it got, and from whom |
//! | | [`AdmissionError`](wire::AdmissionError) | why a request was not admitted: invalid, exhausted, a server shutting down, a cancelled operation |
//! | | [`BudgetSource`](wire::BudgetSource) | where an admitted request's budget came from |
//! | | [`PrioritySource`](wire::PrioritySource) | where an admitted request's priority came from |
//! | | [`OperationSource`](wire::OperationSource) | where an admitted request's operation id and generation came from |
//! | | [`RegistryTerm`](wire::RegistryTerm) | whether the operation registry's remaining time bounded an admitted request, or the registry failed |
//! | | [`Operation`](wire::Operation) | request-wide facts on the root scope: operation id, priority, generation, egress defaults |
//! | | [`EgressPolicy`](wire::EgressPolicy) | how outgoing calls take their budget: reserve, cap, transport pad, minimum |
//! | | [`EgressPolicyBuilder`](wire::EgressPolicyBuilder) | builds an `EgressPolicy` (`EgressPolicy::builder`, `to_builder`) |
//! | | [`Outgoing`](wire::Outgoing) | the budget of one outgoing call, as `grpc-timeout` and `service-budget` values |
//! | | [`PolicyError`](wire::PolicyError), [`MAX_CAP`](wire::MAX_CAP) | why a policy version was refused (it would remove the deadline, its number is stale) or a rollback could not be made; the longest hard cap a version may have |
//! | | [`Mode`](wire::Mode), [`WouldBe`](wire::WouldBe) | enforce or shadow an endpoint's decisions; a decision shadow mode computed and did not enforce ([`Report::would_be`]) |
//! | | [`Stage`](wire::Stage), [`RequestClass`](wire::RequestClass), [`fraction_bucket`](wire::fraction_bucket) | staged enforcement: by the class of a request, by a fraction of operations (a fixed hash of the id) |
//! | crate root | [`Report::policy_version`] | the version of the endpoint policy that admitted the request a report is of |
//! | | (also here) | `GrpcTimeoutError`, `ServiceBudget`, `ServiceBudgetError`, `ServiceBudgetErrorKind`, `EnvoyTimeoutError`, re-exported from the modules below |
//! | | [`ServerScope`](wire::ServerScope) | a server's scope, the parent of every admitted request: [`shutdown`](wire::ServerScope::shutdown) stops admitting, drains, cancels the rest with `Cause::Shutdown`; [`draining`](wire::ServerScope::draining) for axum's and tonic's graceful shutdown |
//! | | [`ShutdownReport`](wire::ShutdownReport) | what a shutdown found: in flight, finished, cancelled, quarantined, pending effects |
//! | [`wire::service_effect`] | [`ServiceEffect`](wire::service_effect::ServiceEffect), [`HEADER`](wire::service_effect::HEADER) | the `service-effect` header of a stopped request's answer: `none`, or `unknown` after a possibly-effectful dispatch |
//! | [`wire::service_operation`] | [`encode`](wire::service_operation::encode), [`parse`](wire::service_operation::parse), [`HEADER`](wire::service_operation::HEADER) | the `service-operation` header of an admitted request's answer: the operation id, for a retry under the same operation |
//! | [`wire::grpc_timeout`] | [`encode`](wire::grpc_timeout::encode) | a remaining budget as a `grpc-timeout` value: the finest unit that fits, truncated |
//! | | [`encode_into`](wire::grpc_timeout::encode_into) | the same, written into a `fmt::Write` without allocating |
//! | | [`decode`](wire::grpc_timeout::decode) | a `grpc-timeout` value, decoded strictly |
//! | | [`decode_bytes`](wire::grpc_timeout::decode_bytes) | the same from raw header bytes |
//! | | [`GrpcTimeoutError`](wire::grpc_timeout::GrpcTimeoutError) | why a `grpc-timeout` value was rejected |
//! | | [`HEADER`](wire::grpc_timeout::HEADER) | `grpc-timeout` |
//! | | [`MAX_TIMEOUT`](wire::grpc_timeout::MAX_TIMEOUT) | the largest budget the header can express, `99999999H` |
//! | [`wire::service_budget`] | [`ServiceBudget`](wire::service_budget::ServiceBudget) | a `service-budget` header, version 1: remaining budget, operation, generation, priority, audit deadline |
//! | | [`ServiceBudgetError`](wire::service_budget::ServiceBudgetError) | why a `service-budget` value was rejected or a `ServiceBudget` could not be built |
//! | | [`ServiceBudgetErrorKind`](wire::service_budget::ServiceBudgetErrorKind) | the kinds of `ServiceBudgetError` |
//! | | [`HEADER`](wire::service_budget::HEADER) | `service-budget` |
//! | | [`VERSION`](wire::service_budget::VERSION) | the format version read and written, `1` |
//! | | [`MAX_HEADER_LEN`](wire::service_budget::MAX_HEADER_LEN) | the longest value parsed, 1024 bytes |
//! | | [`MAX_REMAINING`](wire::service_budget::MAX_REMAINING) | the largest `rem`, 24 hours |
//! | | [`MAX_OPERATION_ID_LEN`](wire::service_budget::MAX_OPERATION_ID_LEN) | the longest `op`, 128 characters |
//! | | [`MAX_PRIORITY`](wire::service_budget::MAX_PRIORITY) | the largest `prio`, 7 (the least urgent) |
//! | | [`MAX_INTEGER`](wire::service_budget::MAX_INTEGER) | the largest `gen` and `dl`: the largest RFC 8941 Integer |
//! | [`wire::envoy`] | [`decode_expected_timeout`](wire::envoy::decode_expected_timeout) | an `x-envoy-expected-rq-timeout-ms` value: whole milliseconds |
//! | | [`decode_expected_timeout_bytes`](wire::envoy::decode_expected_timeout_bytes) | the same from raw header bytes |
//! | | [`EnvoyTimeoutError`](wire::envoy::EnvoyTimeoutError) | why an Envoy timeout value was rejected |
//! | | [`EXPECTED_RQ_TIMEOUT_MS`](wire::envoy::EXPECTED_RQ_TIMEOUT_MS) | `x-envoy-expected-rq-timeout-ms` |
#![cfg_attr(
    any(feature = "tower", feature = "reqwest"),
    doc = "| `integrations` | [`CallError`](integrations::CallError) | why an outgoing call through `Propagate` or the reqwest extension did not run or finish |
| | [`is_effect_unknown`](integrations::is_effect_unknown), [`service_effect_in`](integrations::service_effect_in) | whether an answer's headers say its effect is unknown (for retry classifiers) |
| [`integrations::classify`] | [`HttpClassifier`](integrations::classify::HttpClassifier) | the retry classifier for HTTP answers: 429/503 and `Retry-After`, 5xx as unknown effect, connection failures |
| | [`GrpcClassifier`](integrations::classify::GrpcClassifier) | the retry classifier for gRPC statuses: `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `grpc-retry-pushback-ms` |"
)]
#![cfg_attr(
    feature = "tower",
    doc = "| [`integrations::tower`] | (re-exports) | `Admit`, `AdmitLayer`, `Ingress`, `Detach`, `DetachLayer`, `Detached`, `Propagate`, `PropagateLayer` from the modules below |
| [`integrations::tower::detach`] | [`DetachLayer`](integrations::tower::detach::DetachLayer) | outside `AdmitLayer`: a request whose client goes away runs on for at most a bound, its answer read and discarded |
| | [`Detach`](integrations::tower::detach::Detach), [`Detached`](integrations::tower::detach::Detached) | its middleware and response future |
| [`integrations::tower::admit`] | [`AdmitLayer`](integrations::tower::admit::AdmitLayer) | the server layer: every request admitted into a root scope under an `EndpointPolicy` (with [`server`](integrations::tower::admit::AdmitLayer::server), a child of a `ServerScope`; with [`operations`](integrations::tower::admit::AdmitLayer::operations), the operation registry's term); the handler is one child of it |
| | [`Admit`](integrations::tower::admit::Admit) | the server middleware `AdmitLayer` makes |
| | [`Ingress`](integrations::tower::admit::Ingress) | when a request arrived, if an outer layer knows better (a request extension) |
| | [`ResponseBody`](integrations::tower::admit::ResponseBody) | the handler's response body, bounded by the request's deadline |
| `integrations::tower::admit::future` | [`ResponseFuture`](integrations::tower::admit::future::ResponseFuture) | the response future of `Admit`: the handler run in the request's scope |
| [`integrations::tower::propagate`] | [`PropagateLayer`](integrations::tower::propagate::PropagateLayer) | the client layer: every call in a child scope, its budget on the wire, its receipt by status |
| | [`Propagate`](integrations::tower::propagate::Propagate) | the client middleware `PropagateLayer` makes |
| | [`ResponseBody`](integrations::tower::propagate::ResponseBody) | a call's response body, bounded by the call's deadline |
| `integrations::tower::propagate::future` | [`ResponseFuture`](integrations::tower::propagate::future::ResponseFuture) | the response future of `Propagate`: the call, stopped when its budget ends |"
)]
#![cfg_attr(
    feature = "reqwest",
    doc = "| [`integrations::reqwest`] | [`RequestBuilderExt`](integrations::reqwest::RequestBuilderExt) | `scoped()`, `scoped_in(&scope)`, `send_scoped()` on a `reqwest::RequestBuilder` |
| | [`ScopedRequest`](integrations::reqwest::ScopedRequest) | a request about to be sent as a call in a child scope, its intent journaled first if given a `Journal` (`journal`) |
| | [`ScopedResponse`](integrations::reqwest::ScopedResponse) | its response, whose body is read within the call's deadline |
| | [`redirect_policy`](integrations::reqwest::redirect_policy) | a redirect policy that keeps a call's budget headers within its origin |"
)]
#![cfg_attr(
    feature = "reqwest-middleware",
    doc = "| `integrations::reqwest` (feature `reqwest-middleware`) | [`ScopedMiddleware`](integrations::reqwest::ScopedMiddleware) | a `reqwest_middleware::Middleware`: every call of a `ClientWithMiddleware` a scoped call |
| | [`CallName`](integrations::reqwest::CallName) | the name of a call made through it, as a request extension |"
)]
#![cfg_attr(
    any(feature = "sqlx-postgres", feature = "sqlx-sqlite"),
    doc = "| [`integrations::sqlx`] | [`GuardedPool`](integrations::sqlx::GuardedPool) | a sqlx pool whose connections and statements are children of a scope |
| | [`GuardedConnection`](integrations::sqlx::GuardedConnection) | a pooled connection held for a scope, counted as its guard |
| | [`RowStream`](integrations::sqlx::RowStream) | the rows of a guarded `fetch`, as they come |
| | [`GuardedTransaction`](integrations::sqlx::GuardedTransaction) | a transaction whose statements are children of a scope: `commit`, `rollback`, rolled back on drop |
| | [`StatementSpec`](integrations::sqlx::StatementSpec) | how a statement is registered: a `ChildSpec`, or a name and the effect read from its SQL |
| | [`TypedQuery`](integrations::sqlx::TypedQuery) | a sqlx query whose rows come back typed (`query_as`, `query_scalar`) |
| | [`Backend`](integrations::sqlx::Backend) | a database the guards support: PostgreSQL, SQLite |
| | [`Error`](integrations::sqlx::Error) | why a guarded database call did not run or did not finish |
| | [`DEFAULT_CLEANUP_BUDGET`](integrations::sqlx::DEFAULT_CLEANUP_BUDGET) | how long a connection's clean-up may take by default |"
)]
#![cfg_attr(
    feature = "sqlx-postgres",
    doc = "| `integrations::sqlx` (PostgreSQL) | [`UndeliveredCancel`](integrations::sqlx::UndeliveredCancel) | a server-side cancel that could not be delivered, as the report lists it |
| | [`DEFAULT_CONTROL_CONNECT_TIMEOUT`](integrations::sqlx::DEFAULT_CONTROL_CONNECT_TIMEOUT) | how long opening the control connection may take by default |
| | [`PgIntentStore`](integrations::sqlx::PgIntentStore), [`PgIntentStoreBuilder`](integrations::sqlx::PgIntentStoreBuilder), [`DEFAULT_INTENT_TABLE`](integrations::sqlx::DEFAULT_INTENT_TABLE) | durable intents in a PostgreSQL table |"
)]
#![cfg_attr(
    feature = "redis",
    doc = "| [`integrations::redis`] | [`RedisRegistry`](integrations::redis::RedisRegistry), [`RedisRegistryBuilder`](integrations::redis::RedisRegistryBuilder) | the operation registry on Redis: a key per operation, cancels on pub/sub |
| | [`ListenerStatus`](integrations::redis::ListenerStatus), [`DEFAULT_PREFIX`](integrations::redis::DEFAULT_PREFIX) | the pub/sub listener's state; the default key prefix |"
)]
#![cfg_attr(
    feature = "axum",
    doc = "| [`integrations::axum`] | [`NotAdmitted`](integrations::axum::NotAdmitted) | the rejection of the `Scope` and `Admission` extractors behind no `AdmitLayer`; the crate's errors are axum responses |"
)]
#![cfg_attr(
    feature = "tonic",
    doc = "| [`integrations::tonic`] | (conversions) | the crate's errors as `tonic::Status`, by the server layer's status table |"
)]
#![cfg_attr(
    feature = "testing",
    doc = "| [`testing`] | [`request_scope`](testing::request_scope), [`admitted_request`](testing::admitted_request), [`scope_of`](testing::scope_of) | a request's scope and an admitted request, for tests of your own handlers |"
)]
#![cfg_attr(
    feature = "metrics",
    doc = "| `telemetry` (feature `metrics`) | [`describe`](telemetry::describe) | describes every metric (unit, description) to the installed recorder |"
)]
#![cfg_attr(
    all(feature = "tracing", feature = "tower"),
    doc = "| `telemetry` (features `tracing`, `tower`) | [`RequestSpan`](telemetry::RequestSpan) | a server request span that declares the request's fields: tower-http's `MakeSpan` (feature `tower-http`), tonic's `trace_fn` |"
)]
#![cfg_attr(
    feature = "rollout",
    doc = "| `wire` (feature `rollout`) | [`PolicyHandle`](wire::PolicyHandle) | an endpoint's policy versions swapped at run time: `set`, `rollback` (never to a larger cap), read per request by `AdmitLayer::versioned` (feature `tower`) |"
)]
#![cfg_attr(
    feature = "serde",
    doc = "| `wire` (feature `serde`) | [`PolicyConfig`](wire::PolicyConfig), [`TrustConfig`](wire::TrustConfig), [`OverCapConfig`](wire::OverCapConfig), [`ModeConfig`](wire::ModeConfig), [`StageConfig`](wire::StageConfig), [`RejectionCapConfig`](wire::RejectionCapConfig) | an `EndpointPolicy` as configuration (`EndpointPolicy` deserializes from it) |"
)]
#![cfg_attr(
    feature = "stream",
    doc = "| crate root (feature `stream`) | [`RunStream`] | a stream bounded by its scope ([`Scope::run_stream`]): ends with the cause at cancel, with an idle timeout |"
)]
#![cfg_attr(
    feature = "tokio-util",
    doc = "| crate root (feature `tokio-util`) | [`Scope::cancellation_token`], [`ChildBuilder::cancelled_by`] | tokio-util `CancellationToken` interop, both ways |"
)]
#![cfg_attr(
    not(any(
        feature = "sqlx-postgres",
        feature = "sqlx-sqlite",
        feature = "tower",
        feature = "reqwest"
    )),
    doc = "| `integrations` | | adapters behind the features below; documented when they are enabled (docs.rs enables them all) |"
)]
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
//! The default build depends only on tokio, `pin-project-lite`, `parking_lot`, `slab`,
//! `once_cell`, `sfv` and `getrandom`.
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
//! | `redis` | `integrations::redis`: the operation registry on Redis, cancels announced on pub/sub (adds `redis` with its tokio connection manager, `futures-core`) |
//! | `axum` | `integrations::axum`: the request's `Scope` and `Admission` as extractors, the crate's errors as responses (`tower`, and `axum-core`; not axum itself) |
//! | `tonic` | `integrations::tonic`: the crate's errors as `tonic::Status` (adds `tonic` without its transport) |
//! | `tracing` | `telemetry`: a DEBUG span per admitted request and per outgoing call, events at report time and for refused requests (adds `tracing` without default features) |
//! | `metrics` | `telemetry`: admission, call, cancel, receipt and retry counters and histograms through the `metrics` facade, any recorder (adds `metrics` without default features) |
//! | `tower-http` | `telemetry::RequestSpan` as tower-http's `MakeSpan`, for `TraceLayer` (`tracing`, `tower`, and `tower-http` with its `trace` module only) |
//! | `rollout` | `wire::PolicyHandle`: policy versions swapped at run time, `set` and `rollback`, read per request by `AdmitLayer::versioned` (adds `arc-swap`, which has no dependencies) |
//! | `serde` | `EndpointPolicy` and `wire::PolicyConfig` from configuration in any `serde` format (adds `serde` with its derive) |
//! | `testing` | `testing`: a request's scope and an admitted request for your own handler tests (`tower`) |
//!
//! `__test-servers` and `__test-hooks` are not public API: the first pulls in axum and tonic's
//! transport for this crate's own loopback tests, the second makes the `__` hooks its tests,
//! benches and loom models use.

#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs link to items of other features (the rejection cap's to the tower layer and the
// policy versions): the docs of a build without them keep the text, and CI checks every link
// in the docs of the full build (docs.rs's).
#![cfg_attr(
    not(all(feature = "tower", feature = "rollout", feature = "serde")),
    allow(rustdoc::broken_intra_doc_links)
)]
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
    feature = "reqwest",
    feature = "redis",
    feature = "tonic"
))]
pub mod integrations;
mod panic;
mod quiesce;
pub mod reconcile;
pub mod registry;
pub mod retry;
mod scope;
mod spec;
mod sync;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
mod time;
mod tree;
pub mod wire;

pub use cause::Cause;
#[cfg(feature = "__test-hooks")]
#[doc(hidden)]
pub use child::OwnTicket as __OwnTicket;
pub use child::{Dispatched, Failure, JoinHandle, Receipt, Ticket};
pub use error::Error;
#[allow(deprecated)]
pub use guard::Permit;
pub use guard::Tethered;
pub use quiesce::{Lifecycle, Quiesce, Report};
pub use scope::{
    Cancelled, Carried, CarryScope, ChildBuilder, OnCancel, Run, Scope, DEFAULT_CLEANUP_BUDGET,
    DEFAULT_GRACE,
};
pub use spec::{ChildSpec, Effect, EffectRecord};

#[cfg(feature = "stream")]
pub use scope::RunStream;

/// The README's example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
