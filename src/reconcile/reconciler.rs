//! The reconciler's side: list what is pending, mark it resolved.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::error::IntentError;
use super::intent::{check_len, IntentRecord, Resolution, Resolved};
use super::IntentStore;

/// Lists the intents that wait for reconciliation and marks them resolved, once.
///
/// Run it in any process (a new one after a crash, a periodic job): it reads the same store
/// the journals write. What to do with an intent — ask the provider by its handle, compare
/// the payload digest, look up the effect id in one's own database — is the caller's; this
/// type makes the bookkeeping safe: a resolve happens once, and a second one (another
/// reconciler, a late receipt) changes nothing and says so ([`Resolved::Already`]).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), cancel_scope::reconcile::IntentError> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::reconcile::{
///     EffectClass, InMemoryIntents, Intent, IntentStore, Reconciler, Resolution, Resolved,
/// };
///
/// let store = Arc::new(InMemoryIntents::new());
/// store.record(&Intent::new("pay-7", "charge", EffectClass::SideEffecting)).await?;
///
/// let reconciler = Reconciler::new(store);
/// let pending = reconciler.pending(Duration::ZERO, 100).await?;
/// assert_eq!(pending[0].intent().effect_id(), "pay-7");
/// // ... the provider says pay-7 went through ...
/// assert_eq!(reconciler.resolve("pay-7", Resolution::Applied).await?, Resolved::Now);
/// assert_eq!(
///     reconciler.resolve("pay-7", Resolution::Applied).await?,
///     Resolved::Already(Resolution::Applied),
/// );
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reconciler {
    store: Arc<dyn IntentStore>,
}

/// What one [`Reconciler::run`] did.
///
/// # Examples
///
/// ```
/// use cancel_scope::reconcile::Reconciled;
/// assert_eq!(Reconciled::default().resolved(), 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    resolved: usize,
    already: usize,
    undecided: usize,
}

impl Reconciled {
    /// Intents this run resolved.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::Reconciled;
    /// assert_eq!(Reconciled::default().resolved(), 0);
    /// ```
    pub fn resolved(&self) -> usize {
        self.resolved
    }

    /// Intents someone else resolved between the listing and this run's resolve.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::Reconciled;
    /// assert_eq!(Reconciled::default().already(), 0);
    /// ```
    pub fn already(&self) -> usize {
        self.already
    }

    /// Intents the decision left pending.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::Reconciled;
    /// assert_eq!(Reconciled::default().undecided(), 0);
    /// ```
    pub fn undecided(&self) -> usize {
        self.undecided
    }
}

impl Reconciler {
    /// A reconciler over `store`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Reconciler};
    /// let reconciler = Reconciler::new(Arc::new(InMemoryIntents::new()));
    /// # let _ = reconciler;
    /// ```
    pub fn new(store: Arc<dyn IntentStore>) -> Reconciler {
        Reconciler { store }
    }

    /// Up to `limit` pending intents recorded at least `older_than` ago (by the store's
    /// clock), oldest first. A grace of a few times the longest call's budget leaves out the
    /// calls still in flight.
    ///
    /// # Errors
    ///
    /// A fault of the store.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Intent, IntentStore, Reconciler};
    /// let store = Arc::new(InMemoryIntents::new());
    /// store.record(&Intent::new("e", "n", EffectClass::SideEffecting)).await.unwrap();
    /// let reconciler = Reconciler::new(store);
    /// // Just recorded: not yet a minute old.
    /// assert!(reconciler.pending(Duration::from_secs(60), 10).await.unwrap().is_empty());
    /// # }
    /// ```
    pub async fn pending(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<IntentRecord>, IntentError> {
        self.store.pending(older_than, limit).await
    }

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
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Reconciler};
    /// let reconciler = Reconciler::new(Arc::new(InMemoryIntents::new()));
    /// assert!(reconciler.get("nope").await.unwrap().is_none());
    /// # }
    /// ```
    pub async fn get(&self, effect_id: &str) -> Result<Option<IntentRecord>, IntentError> {
        check_len(effect_id)?;
        self.store.get(effect_id).await
    }

    /// Marks the intent of `effect_id` resolved, once: [`Resolved::Now`] for the call that
    /// did it, [`Resolved::Already`] (with the earlier resolution) for any later one.
    ///
    /// # Errors
    ///
    /// A fault of the store (the intent stays as it was).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Reconciler, Resolution, Resolved};
    /// let reconciler = Reconciler::new(Arc::new(InMemoryIntents::new()));
    /// assert_eq!(reconciler.resolve("nope", Resolution::Applied).await.unwrap(), Resolved::Unknown);
    /// # }
    /// ```
    pub async fn resolve(
        &self,
        effect_id: &str,
        resolution: Resolution,
    ) -> Result<Resolved, IntentError> {
        check_len(effect_id)?;
        self.store.resolve(effect_id, resolution, None).await
    }

    /// One pass: lists up to `limit` pending intents older than `older_than` and resolves
    /// each as `decide` says (`None`: still unknown, left pending).
    ///
    /// # Errors
    ///
    /// The first fault of the store; the intents resolved before it stay resolved.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Intent, IntentStore, Reconciler, Resolution};
    /// let store = Arc::new(InMemoryIntents::new());
    /// store.record(&Intent::new("pay-1", "charge", EffectClass::SideEffecting)).await.unwrap();
    /// store.record(&Intent::new("pay-2", "charge", EffectClass::SideEffecting)).await.unwrap();
    ///
    /// let reconciler = Reconciler::new(store);
    /// let done = reconciler
    ///     .run(Duration::ZERO, 100, |rec| {
    ///         let applied = rec.intent().effect_id() == "pay-1"; // ask the provider here
    ///         async move { applied.then_some(Resolution::Applied) }
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert_eq!((done.resolved(), done.undecided()), (1, 1));
    /// # }
    /// ```
    pub async fn run<F, Fut>(
        &self,
        older_than: Duration,
        limit: usize,
        mut decide: F,
    ) -> Result<Reconciled, IntentError>
    where
        F: FnMut(&IntentRecord) -> Fut,
        Fut: Future<Output = Option<Resolution>>,
    {
        let mut out = Reconciled::default();
        for rec in self.pending(older_than, limit).await? {
            let Some(resolution) = decide(&rec).await else {
                out.undecided += 1;
                continue;
            };
            match self.resolve(rec.intent().effect_id(), resolution).await? {
                Resolved::Now => out.resolved += 1,
                Resolved::Already(_) | Resolved::Unknown => out.already += 1,
            }
        }
        Ok(out)
    }
}

impl fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("store", &self.store)
            .finish()
    }
}
