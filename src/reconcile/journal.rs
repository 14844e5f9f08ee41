//! The helper around a dispatch: write the intent, then dispatch; resolve on the receipt.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::error::IntentError;
use super::intent::{EffectClass, Intent, Resolution};
use super::IntentStore;
use crate::child::{Dispatched, Receipt, Ticket};
use crate::error::Error;
use crate::registry::bounded;
use crate::spec::ChildSpec;
use crate::Scope;

/// How long a [`Journal`] waits for its store by default: 1 s.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::reconcile::DEFAULT_JOURNAL_TIMEOUT;
/// assert_eq!(DEFAULT_JOURNAL_TIMEOUT, Duration::from_secs(1));
/// ```
pub const DEFAULT_JOURNAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Durable intents around dispatches: for every call that may have an effect (of the classes
/// it is set to record), the intent is written to the store **before** the call is
/// dispatched, and resolved by the call's receipt.
///
/// So a process killed after sending a write leaves a pending intent in the store, which a
/// [`Reconciler`](super::Reconciler) in another process finds. The write is on the dispatch
/// path (one store round trip before the call, one after: see `BENCHMARKS.md`); which classes
/// pay for it is the journal's setting ([`record`](Self::record)): by default every call that
/// may have an effect, none that is read-only.
///
/// | the call | the intent |
/// |---|---|
/// | refused by its scope before the write, or the write failed | none written; nothing sent |
/// | the scope cancelled while the write was in flight, or refused the dispatch after it | resolved [`NotApplied`](Resolution::NotApplied) (if the store answers): nothing was sent |
/// | [`succeed`](Journaled::succeed) | resolved [`Applied`](Resolution::Applied) |
/// | [`fail`](Journaled::fail), or finished `Failed` / `Cancelled` | resolved [`NotApplied`](Resolution::NotApplied) |
/// | finished `EffectUnknown` or `Quarantined`, dropped, or the process died | **pending**, with the provider handle if one was set |
///
/// At least once: an intent may stay pending for a call that did not happen (a write whose
/// answer was lost, a resolve that failed); a reconciler asks the provider. Idempotent by
/// effect id: every attempt of one effect records the same intent again (counted in
/// [`IntentRecord::attempts`](super::IntentRecord::attempts)), and the first attempt that
/// succeeds resolves it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal, Resolution};
/// use cancel_scope::{ChildSpec, Scope};
///
/// let store = Arc::new(InMemoryIntents::new());
/// let journal = Journal::new(store.clone());
/// let scope = Scope::with_timeout(Duration::from_secs(1));
///
/// let ticket = scope.register(ChildSpec::side_effecting("charge", "pay-7"))?;
/// let mut call = journal.dispatch(ticket, Some("checkout-7")).await?; // intent written, then dispatched
/// // ... send the request; the provider answers with its handle ...
/// call.set_provider_handle("psp-42");
/// call.succeed().await?;
///
/// let rec = store.get("pay-7").await?.unwrap();
/// assert_eq!(rec.resolution(), Some(Resolution::Applied));
/// assert_eq!(rec.intent().provider_handle_str(), Some("psp-42"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Journal {
    store: Arc<dyn IntentStore>,
    idempotent: bool,
    side_effecting: bool,
    timeout: Duration,
}

impl Journal {
    /// A journal writing to `store`, recording both classes of effect, waiting at most
    /// [`DEFAULT_JOURNAL_TIMEOUT`] for the store.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// # let _ = journal;
    /// ```
    pub fn new(store: Arc<dyn IntentStore>) -> Journal {
        Journal {
            store,
            idempotent: true,
            side_effecting: true,
            timeout: DEFAULT_JOURNAL_TIMEOUT,
        }
    }

    /// Whether calls of `class` get a durable intent (default: yes for both). A class left
    /// out is dispatched as without a journal.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Journal};
    /// use cancel_scope::ChildSpec;
    /// // Idempotent calls are retried safely with their key: journal only the others.
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()))
    ///     .record(EffectClass::Idempotent, false);
    /// assert!(!journal.records(&ChildSpec::idempotent("put", "order-1")));
    /// assert!(journal.records(&ChildSpec::side_effecting("pay", "pay-1")));
    /// ```
    pub fn record(mut self, class: EffectClass, record: bool) -> Journal {
        match class {
            EffectClass::Idempotent => self.idempotent = record,
            EffectClass::SideEffecting => self.side_effecting = record,
        }
        self
    }

    /// Waits at most `timeout` for each store call (a write before a dispatch also not past
    /// the scope's cancel or deadline).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new())).timeout(Duration::from_millis(200));
    /// # let _ = journal;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Journal {
        self.timeout = timeout;
        self
    }

    /// The store.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let _store = journal.store();
    /// ```
    pub fn store(&self) -> &Arc<dyn IntentStore> {
        &self.store
    }

    /// Whether a child registered with `spec` gets a durable intent.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// use cancel_scope::ChildSpec;
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// assert!(!journal.records(&ChildSpec::read_only("get")));
    /// ```
    pub fn records(&self, spec: &ChildSpec) -> bool {
        match EffectClass::of(spec.effect()) {
            Some(EffectClass::Idempotent) => self.idempotent,
            Some(EffectClass::SideEffecting) => self.side_effecting,
            None => false,
        }
    }

    /// Writes the intent of `ticket`'s child (under `operation`, for the reconciler), then
    /// dispatches it. A child whose class the journal does not record is dispatched at once.
    ///
    /// The write waits at most the [timeout](Self::timeout), and not past the scope's cancel
    /// (its deadline included).
    ///
    /// # Errors
    ///
    /// [`IntentError::is_refused`] if the scope refused the dispatch (cancelled, closed, out of
    /// budget — also while the intent was being written); a fault or
    /// [`is_invalid`](IntentError::is_invalid) if the intent could not be written. In every
    /// case nothing was dispatched, and the ticket records [`Receipt::Cancelled`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves drops the ticket (nothing dispatched); an
    /// intent it wrote stays pending — a pending intent may be one of a call that was never
    /// sent, which the reconciler learns from the provider.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal};
    /// use cancel_scope::{ChildSpec, Scope};
    ///
    /// let store = Arc::new(InMemoryIntents::new());
    /// let journal = Journal::new(store.clone());
    /// let scope = Scope::new();
    /// let call = journal
    ///     .dispatch(scope.register(ChildSpec::side_effecting("pay", "pay-1")).unwrap(), None)
    ///     .await
    ///     .unwrap();
    /// // The intent is in the store before anything is sent.
    /// assert!(store.get("pay-1").await.unwrap().unwrap().is_pending());
    /// drop(call); // the process "dies" here: EffectUnknown, the intent stays pending
    /// assert_eq!(store.pending(Duration::ZERO, 10).await.unwrap().len(), 1);
    /// # }
    /// ```
    pub async fn dispatch(
        &self,
        ticket: Ticket,
        operation: Option<&str>,
    ) -> Result<Journaled, IntentError> {
        let intent = if self.records(ticket.spec()) {
            Intent::of(ticket.spec(), operation)
        } else {
            None
        };
        let Some(intent) = intent else {
            let dispatched = ticket.dispatch().map_err(IntentError::refused)?;
            return Ok(self.journaled(dispatched, None));
        };
        intent.validate()?;
        let scope = ticket.scope().clone();
        if let Some(cause) = scope.cause() {
            return Err(IntentError::refused(Error::cancelled(cause)));
        }
        let write = bounded(
            self.timeout,
            self.store.record(&intent),
            IntentError::timeout,
        );
        tokio::select! {
            biased;
            cause = scope.cancelled_cause() => {
                // The write may have landed: nothing was sent.
                self.resolve_unsent(intent.effect_id()).await;
                return Err(IntentError::refused(Error::cancelled(cause)));
            }
            written = write => written?,
        }
        match ticket.dispatch() {
            Ok(dispatched) => Ok(self.journaled(dispatched, Some(intent))),
            Err(e) => {
                self.resolve_unsent(intent.effect_id()).await;
                Err(IntentError::refused(e))
            }
        }
    }

    fn journaled(&self, dispatched: Dispatched, intent: Option<Intent>) -> Journaled {
        Journaled {
            dispatched,
            effect_id: intent.map(|i| Arc::from(i.effect_id())),
            handle: None,
            journal: self.clone(),
        }
    }

    /// Resolves the intent of a call that was not dispatched, if the store answers in time
    /// (otherwise it stays pending, for the reconciler).
    async fn resolve_unsent(&self, effect_id: &str) {
        let resolve = self.store.resolve(effect_id, Resolution::NotApplied, None);
        let _ = bounded(self.timeout, resolve, IntentError::timeout).await;
    }
}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal")
            .field("store", &self.store)
            .field("idempotent", &self.idempotent)
            .field("side_effecting", &self.side_effecting)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A dispatched child whose intent is in the store (or that needed none): give it its receipt
/// through [`succeed`](Self::succeed), [`fail`](Self::fail) or [`finish`](Self::finish),
/// which record the receipt and then resolve the intent.
///
/// Dropped without one, the child's receipt is the one a dropped [`Dispatched`] records
/// (`EffectUnknown` for work that may have had an effect) and its intent stays pending.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use cancel_scope::reconcile::{InMemoryIntents, Journal};
/// use cancel_scope::{ChildSpec, Scope};
/// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
/// let scope = Scope::new();
/// let call = journal.dispatch(scope.register(ChildSpec::read_only("get")).unwrap(), None).await.unwrap();
/// assert!(!call.is_journaled()); // read-only: no intent
/// call.succeed().await.unwrap();
/// # }
/// ```
#[must_use = "a journaled call that is dropped records EffectUnknown and leaves its intent pending"]
pub struct Journaled {
    dispatched: Dispatched,
    /// The intent's effect id, if one was written.
    effect_id: Option<Arc<str>>,
    /// The provider handle set since the dispatch.
    handle: Option<Arc<str>>,
    journal: Journal,
}

/// The intent of a journaled call whose receipt a client integration gives: resolved by
/// that receipt, off the call's path.
#[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
pub(crate) struct PendingIntent {
    effect_id: Arc<str>,
    journal: Journal,
}

#[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
impl PendingIntent {
    /// Resolves the intent as `resolution` says (`None`: the effect is unknown, and the
    /// intent stays pending for the [`Reconciler`](super::Reconciler)). The store is written
    /// on a task of its own, within the journal's timeout; a write that fails leaves the
    /// intent pending, which the reconciler then resolves (at least once).
    pub(crate) fn resolve(self, resolution: Option<Resolution>) {
        let Some(resolution) = resolution else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let PendingIntent { effect_id, journal } = self;
        rt.spawn(async move {
            let resolve = journal.store.resolve(&effect_id, resolution, None);
            let _ = bounded(journal.timeout, resolve, IntentError::timeout).await;
        });
    }
}

impl Journaled {
    /// The dispatched call, and its intent if one was written (for the client integrations,
    /// which give the receipt themselves).
    #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
    pub(crate) fn into_parts(self) -> (Dispatched, Option<PendingIntent>) {
        let Journaled {
            dispatched,
            effect_id,
            journal,
            ..
        } = self;
        let intent = effect_id.map(|effect_id| PendingIntent { effect_id, journal });
        (dispatched, intent)
    }

    /// The dispatched child.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// use cancel_scope::{ChildSpec, Scope};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let scope = Scope::new();
    /// let call = journal.dispatch(scope.register(ChildSpec::read_only("get")).unwrap(), None).await.unwrap();
    /// assert_eq!(call.dispatched().spec().name(), "get");
    /// # call.succeed().await.unwrap();
    /// # }
    /// ```
    pub fn dispatched(&self) -> &Dispatched {
        &self.dispatched
    }

    /// The scope the child belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// use cancel_scope::{ChildSpec, Scope};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let scope = Scope::new();
    /// let call = journal.dispatch(scope.register(ChildSpec::read_only("get")).unwrap(), None).await.unwrap();
    /// assert!(!call.scope().is_cancelled());
    /// # call.succeed().await.unwrap();
    /// # }
    /// ```
    pub fn scope(&self) -> &Scope {
        self.dispatched.scope()
    }

    /// Whether an intent was written for it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// use cancel_scope::{ChildSpec, Scope};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let scope = Scope::new();
    /// let spec = ChildSpec::side_effecting("pay", "pay-1");
    /// let call = journal.dispatch(scope.register(spec).unwrap(), None).await.unwrap();
    /// assert!(call.is_journaled());
    /// # call.succeed().await.unwrap();
    /// # }
    /// ```
    pub fn is_journaled(&self) -> bool {
        self.effect_id.is_some()
    }

    /// Records the provider's handle for the effect: in the child's effect record, and in the
    /// intent when it is resolved or its outcome turns out unknown.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, Journal};
    /// use cancel_scope::{ChildSpec, Scope};
    /// let journal = Journal::new(Arc::new(InMemoryIntents::new()));
    /// let scope = Scope::new();
    /// let spec = ChildSpec::side_effecting("pay", "pay-1");
    /// let mut call = journal.dispatch(scope.register(spec).unwrap(), None).await.unwrap();
    /// call.set_provider_handle("psp-1");
    /// # call.succeed().await.unwrap();
    /// # }
    /// ```
    pub fn set_provider_handle(&mut self, handle: impl Into<Arc<str>>) {
        let handle = handle.into();
        self.dispatched.set_provider_handle(handle.clone());
        self.handle = Some(handle);
    }

    /// Records [`Receipt::Succeeded`], then resolves the intent
    /// [`Applied`](Resolution::Applied).
    ///
    /// # Errors
    ///
    /// A fault of the store: the receipt is recorded, the intent stays pending.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal, Resolution};
    /// use cancel_scope::{ChildSpec, Scope};
    /// let store = Arc::new(InMemoryIntents::new());
    /// let journal = Journal::new(store.clone());
    /// let scope = Scope::new();
    /// let spec = ChildSpec::side_effecting("pay", "pay-1");
    /// journal.dispatch(scope.register(spec).unwrap(), None).await.unwrap().succeed().await.unwrap();
    /// assert_eq!(store.get("pay-1").await.unwrap().unwrap().resolution(), Some(Resolution::Applied));
    /// # }
    /// ```
    pub async fn succeed(self) -> Result<(), IntentError> {
        self.finish(Receipt::Succeeded).await
    }

    /// Records [`Receipt::Failed`] (the call was refused unprocessed), then resolves the
    /// intent [`NotApplied`](Resolution::NotApplied).
    ///
    /// # Errors
    ///
    /// As [`succeed`](Self::succeed).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal, Resolution};
    /// use cancel_scope::{ChildSpec, Scope};
    /// let store = Arc::new(InMemoryIntents::new());
    /// let journal = Journal::new(store.clone());
    /// let scope = Scope::new();
    /// let spec = ChildSpec::side_effecting("pay", "pay-1");
    /// journal.dispatch(scope.register(spec).unwrap(), None).await.unwrap().fail().await.unwrap();
    /// assert_eq!(store.get("pay-1").await.unwrap().unwrap().resolution(), Some(Resolution::NotApplied));
    /// # }
    /// ```
    pub async fn fail(self) -> Result<(), IntentError> {
        self.finish(Receipt::Failed).await
    }

    /// Records `receipt`, then resolves the intent as it says: `Succeeded` →
    /// [`Applied`](Resolution::Applied); `Failed`, `Cancelled` →
    /// [`NotApplied`](Resolution::NotApplied); `EffectUnknown` (its provider handle, if any,
    /// noted in the intent) and `Quarantined` → the intent stays pending.
    ///
    /// # Errors
    ///
    /// As [`succeed`](Self::succeed).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal};
    /// use cancel_scope::{ChildSpec, EffectRecord, Receipt, Scope};
    /// let store = Arc::new(InMemoryIntents::new());
    /// let journal = Journal::new(store.clone());
    /// let scope = Scope::new();
    /// let call = journal
    ///     .dispatch(scope.register(ChildSpec::side_effecting("pay", "pay-1")).unwrap(), None)
    ///     .await
    ///     .unwrap();
    /// // The response was lost: the provider's handle is all we have.
    /// let unknown = EffectRecord::new("pay-1").provider_handle("psp-7");
    /// call.finish(Receipt::EffectUnknown(unknown)).await.unwrap();
    /// let rec = store.get("pay-1").await.unwrap().unwrap();
    /// assert!(rec.is_pending());
    /// assert_eq!(rec.intent().provider_handle_str(), Some("psp-7"));
    /// # }
    /// ```
    pub async fn finish(self, receipt: Receipt) -> Result<(), IntentError> {
        let Journaled {
            dispatched,
            effect_id,
            handle,
            journal,
        } = self;
        let resolution = match &receipt {
            Receipt::Succeeded => Some(Resolution::Applied),
            Receipt::Failed | Receipt::Cancelled => Some(Resolution::NotApplied),
            Receipt::Quarantined | Receipt::EffectUnknown(_) => None,
        };
        let unknown_handle = match &receipt {
            Receipt::EffectUnknown(rec) => rec.provider_handle_str().map(Arc::<str>::from),
            _ => None,
        };
        dispatched.finish(receipt);
        let Some(effect_id) = effect_id else {
            return Ok(());
        };
        let handle = unknown_handle.or(handle);
        let store = &journal.store;
        match (resolution, handle) {
            (Some(r), handle) => {
                let resolve = store.resolve(&effect_id, r, handle.as_deref());
                bounded(journal.timeout, resolve, IntentError::timeout)
                    .await
                    .map(|_| ())
            }
            (None, Some(h)) => {
                let note = store.note_provider_handle(&effect_id, &h);
                bounded(journal.timeout, note, IntentError::timeout).await
            }
            (None, None) => Ok(()),
        }
    }
}

impl fmt::Debug for Journaled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journaled")
            .field("dispatched", &self.dispatched)
            .field("effect_id", &self.effect_id)
            .finish()
    }
}
