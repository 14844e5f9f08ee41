//! Durable reconciliation: an intent written before a possibly-effectful call is dispatched,
//! resolved by its receipt, so that a process killed after sending a write leaves a record.
//!
//! # Why
//!
//! A [`Report`](crate::Report) lists the unknown effects of a request
//! ([`pending_effects`](crate::Report::pending_effects)), but only in memory: when the process
//! dies after sending a payment, the report dies with it, and nobody knows the payment may
//! have gone through. Here the same facts — effect id, payload digest, provider handle,
//! operation id, when — are written to a store *before* the call is dispatched:
//!
//! | step | where | store |
//! |---|---|---|
//! | register the child | [`Scope::register`](crate::Scope::register) | — |
//! | write the intent, then dispatch | [`Journal::dispatch`] | pending |
//! | the receipt | [`Journaled::succeed`], [`fail`](Journaled::fail), [`finish`](Journaled::finish) | resolved, or still pending if the outcome is unknown |
//! | after a crash, in any process | [`Reconciler::pending`], [`Reconciler::resolve`] | resolved once |
//!
//! **At least once, idempotent by effect id.** An intent is written before every dispatch,
//! so every call that was sent has one; some intents belong to calls that were never sent
//! (the write landed, the process died before the dispatch) — a reconciler asks the
//! provider. Writing the same effect id again (another attempt of an idempotent effect)
//! updates the one record. Resolving is once: a second resolve is a no-op that says so.
//!
//! **Opt-in per effect class.** The write is on the dispatch path (see `BENCHMARKS.md`):
//! a [`Journal`] records the classes it is set to ([`Journal::record`]); read-only work never.
//!
//! # Stores
//!
//! | type | where |
//! |---|---|
//! | [`InMemoryIntents`] | this process's memory (tests; one process that accepts losing it) |
//! | `integrations::sqlx::PgIntentStore` (feature `sqlx-postgres`) | a PostgreSQL table, created if missing |
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cancel_scope::reconcile::{InMemoryIntents, Journal, Reconciler, Resolution, Resolved};
//! use cancel_scope::{ChildSpec, Scope};
//!
//! let store = Arc::new(InMemoryIntents::new());
//! let journal = Journal::new(store.clone());
//! let scope = Scope::with_timeout(Duration::from_secs(2));
//!
//! let spec = ChildSpec::side_effecting("charge-card", "payment-7").payload_digest("sha256:ab12");
//! let call = journal.dispatch(scope.register(spec)?, Some("checkout-7f3a")).await?;
//! drop(call); // sent, and then the answer never came
//!
//! let reconciler = Reconciler::new(store);
//! let pending = reconciler.pending(Duration::ZERO, 100).await?;
//! assert_eq!(pending[0].intent().operation_id(), Some("checkout-7f3a"));
//! assert_eq!(reconciler.resolve("payment-7", Resolution::Applied).await?, Resolved::Now);
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use crate::registry::BoxFuture;

mod error;
mod intent;
mod journal;
mod memory;
mod reconciler;

pub use error::IntentError;
#[cfg(feature = "sqlx-postgres")]
pub(crate) use intent::check_len;
pub use intent::{EffectClass, Intent, IntentRecord, Resolution, Resolved, MAX_FIELD_LEN};
#[cfg(any(feature = "reqwest", feature = "tower"))]
pub(crate) use journal::PendingIntent;
pub use journal::{Journal, Journaled, DEFAULT_JOURNAL_TIMEOUT};
pub use memory::InMemoryIntents;
pub use reconciler::{Reconciled, Reconciler};

/// Where intents are kept.
///
/// Every method is one atomic step of the store, and may be called by several processes at
/// once: `record` is an upsert by effect id, `resolve` changes a pending intent only.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Intent, IntentStore};
/// let store: Arc<dyn IntentStore> = Arc::new(InMemoryIntents::new());
/// store.record(&Intent::new("e", "n", EffectClass::Idempotent)).await.unwrap();
/// assert_eq!(store.get("e").await.unwrap().unwrap().attempts(), 1);
/// # }
/// ```
pub trait IntentStore: fmt::Debug + Send + Sync {
    /// Records `intent` as pending. If the effect id is recorded already, that record is
    /// pending again (a resolved one too: another attempt of the effect was dispatched),
    /// counts one more attempt, keeps when it was first recorded, and takes the new intent's
    /// fields over nothing (a digest or handle is never erased).
    ///
    /// # Errors
    ///
    /// [`IntentError::is_invalid`] for a field the store cannot hold (see
    /// [`Intent::validate`]); a fault when the store did not answer or is full.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Intent, IntentStore};
    /// let store = InMemoryIntents::new();
    /// let intent = Intent::new("order-1", "put", EffectClass::Idempotent);
    /// store.record(&intent).await.unwrap();
    /// store.record(&intent).await.unwrap(); // a retry of the same effect
    /// assert_eq!(store.get("order-1").await.unwrap().unwrap().attempts(), 2);
    /// # }
    /// ```
    fn record<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), IntentError>>;

    /// Sets the provider's handle of the intent of `effect_id` (a no-op if there is none).
    ///
    /// # Errors
    ///
    /// A fault of the store.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Intent, IntentStore};
    /// let store = InMemoryIntents::new();
    /// store.record(&Intent::new("e", "n", EffectClass::SideEffecting)).await.unwrap();
    /// store.note_provider_handle("e", "psp-1").await.unwrap();
    /// let rec = store.get("e").await.unwrap().unwrap();
    /// assert_eq!(rec.intent().provider_handle_str(), Some("psp-1"));
    /// # }
    /// ```
    fn note_provider_handle<'a>(
        &'a self,
        effect_id: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<(), IntentError>>;

    /// Resolves the intent of `effect_id` as `resolution` (noting `provider_handle` if given)
    /// if it is pending: [`Resolved::Now`]. One that is resolved already stays as it was:
    /// [`Resolved::Already`]; none: [`Resolved::Unknown`]. Two resolves racing: exactly one
    /// gets `Now`.
    ///
    /// # Errors
    ///
    /// A fault of the store.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Intent, IntentStore, Resolution, Resolved};
    /// let store = InMemoryIntents::new();
    /// store.record(&Intent::new("e", "n", EffectClass::SideEffecting)).await.unwrap();
    /// assert_eq!(store.resolve("e", Resolution::NotApplied, None).await.unwrap(), Resolved::Now);
    /// # }
    /// ```
    fn resolve<'a>(
        &'a self,
        effect_id: &'a str,
        resolution: Resolution,
        provider_handle: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Resolved, IntentError>>;

    /// Up to `limit` pending intents first recorded at least `older_than` ago by the store's
    /// clock, oldest first.
    ///
    /// # Errors
    ///
    /// A fault of the store.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::reconcile::{InMemoryIntents, IntentStore};
    /// assert!(InMemoryIntents::new().pending(Duration::ZERO, 10).await.unwrap().is_empty());
    /// # }
    /// ```
    fn pending<'a>(
        &'a self,
        older_than: Duration,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<IntentRecord>, IntentError>>;

    /// The intent of `effect_id`, pending or resolved.
    ///
    /// # Errors
    ///
    /// A fault of the store.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use cancel_scope::reconcile::{InMemoryIntents, IntentStore};
    /// assert!(InMemoryIntents::new().get("e").await.unwrap().is_none());
    /// # }
    /// ```
    fn get<'a>(
        &'a self,
        effect_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<IntentRecord>, IntentError>>;
}
