//! The in-memory intent store: the default, for tests and for one process.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::error::IntentError;
use super::intent::{check_len, Intent, IntentRecord, Resolution, Resolved};
use super::IntentStore;
use crate::registry::BoxFuture;
use crate::sync::Mutex;

/// How many intents an [`InMemoryIntents`] holds by default.
const DEFAULT_MAX: usize = 100_000;

/// Intents in this process's memory.
///
/// It does not survive the process — that takes a durable store (the PostgreSQL one of the
/// `sqlx-postgres` feature) — but it has the same contract, so a reconciler can be written and
/// tested against it.
///
/// **Bounded.** At most [`max`](Self::max) intents (default 100,000). At the bound, a new
/// intent first makes room by forgetting the resolved intent resolved longest ago (a later
/// resolve of it then says [`Resolved::Unknown`] rather than
/// [`Resolved::Already`]); a *pending* intent is never dropped, so when every intent held is
/// pending, recording one more fails with [`IntentError::is_full`] and the journal does not
/// dispatch that call.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), cancel_scope::reconcile::IntentError> {
/// use std::time::Duration;
/// use cancel_scope::reconcile::{EffectClass, InMemoryIntents, Intent, IntentStore, Resolution, Resolved};
///
/// let store = InMemoryIntents::new();
/// store.record(&Intent::new("pay-1", "charge", EffectClass::SideEffecting)).await?;
/// assert_eq!(store.pending(Duration::ZERO, 10).await?.len(), 1);
/// assert_eq!(store.resolve("pay-1", Resolution::Applied, None).await?, Resolved::Now);
/// assert_eq!(
///     store.resolve("pay-1", Resolution::Applied, None).await?,
///     Resolved::Already(Resolution::Applied),
/// );
/// # Ok(()) }
/// ```
pub struct InMemoryIntents {
    table: Mutex<Table>,
}

struct Table {
    records: HashMap<Arc<str>, IntentRecord>,
    /// Effect ids in the order they were resolved (some since recorded again: skipped).
    resolved: VecDeque<Arc<str>>,
    max: usize,
}

impl Table {
    /// Forgets the intent resolved longest ago; `false` if none is resolved.
    fn forget_one_resolved(&mut self) -> bool {
        while let Some(id) = self.resolved.pop_front() {
            if self.records.get(&id).is_some_and(|r| !r.is_pending()) {
                self.records.remove(&id);
                return true;
            }
        }
        false
    }
}

impl InMemoryIntents {
    /// An empty store holding at most 100,000 intents.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::InMemoryIntents;
    /// assert!(InMemoryIntents::new().is_empty());
    /// ```
    pub fn new() -> InMemoryIntents {
        InMemoryIntents {
            table: Mutex::new(Table {
                records: HashMap::new(),
                resolved: VecDeque::new(),
                max: DEFAULT_MAX,
            }),
        }
    }

    /// Holds at most `max` intents (at least 1); see the type's docs for the bound.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::InMemoryIntents;
    /// let store = InMemoryIntents::new().max(10);
    /// # let _ = store;
    /// ```
    pub fn max(self, max: usize) -> InMemoryIntents {
        self.table.lock().max = max.max(1);
        self
    }

    /// Intents held, pending or resolved.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::InMemoryIntents;
    /// assert_eq!(InMemoryIntents::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.table.lock().records.len()
    }

    /// Whether it holds no intent.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::InMemoryIntents;
    /// assert!(InMemoryIntents::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn record_now(&self, intent: &Intent) -> Result<(), IntentError> {
        intent.validate()?;
        let mut table = self.table.lock();
        if let Some(rec) = table.records.get_mut(intent.effect_id()) {
            // Recorded again (another attempt of the same effect): pending again, and what the
            // new record knows is kept over nothing.
            let mut merged = intent.clone();
            let old = rec.intent();
            if merged.payload_digest_str().is_none() {
                if let Some(d) = old.payload_digest_str() {
                    merged = merged.payload_digest(d);
                }
            }
            if merged.provider_handle_str().is_none() {
                if let Some(h) = old.provider_handle_str() {
                    merged = merged.provider_handle(h);
                }
            }
            if merged.operation_id().is_none() {
                if let Some(o) = old.operation_id() {
                    merged = merged.operation(o);
                }
            }
            *rec = IntentRecord::new(
                merged,
                rec.recorded_at(),
                rec.attempts().saturating_add(1),
                None,
            );
            return Ok(());
        }
        if table.records.len() >= table.max && !table.forget_one_resolved() {
            return Err(IntentError::full(table.max));
        }
        table.records.insert(
            Arc::from(intent.effect_id()),
            IntentRecord::new(intent.clone(), SystemTime::now(), 1, None),
        );
        Ok(())
    }

    fn note_now(&self, effect_id: &str, handle: &str) -> Result<(), IntentError> {
        check_len(handle)?;
        let mut table = self.table.lock();
        if let Some(rec) = table.records.get_mut(effect_id) {
            *rec = IntentRecord::new(
                rec.intent().clone().provider_handle(handle),
                rec.recorded_at(),
                rec.attempts(),
                rec.resolution().zip(rec.resolved_at()),
            );
        }
        Ok(())
    }

    fn resolve_now(
        &self,
        effect_id: &str,
        resolution: Resolution,
        handle: Option<&str>,
    ) -> Result<Resolved, IntentError> {
        if let Some(h) = handle {
            check_len(h)?;
        }
        let mut table = self.table.lock();
        let Some(rec) = table.records.get_mut(effect_id) else {
            return Ok(Resolved::Unknown);
        };
        if let Some(earlier) = rec.resolution() {
            return Ok(Resolved::Already(earlier));
        }
        let mut intent = rec.intent().clone();
        if let Some(h) = handle {
            intent = intent.provider_handle(h);
        }
        *rec = IntentRecord::new(
            intent,
            rec.recorded_at(),
            rec.attempts(),
            Some((resolution, SystemTime::now())),
        );
        table.resolved.push_back(Arc::from(effect_id));
        Ok(Resolved::Now)
    }

    fn pending_now(&self, older_than: Duration, limit: usize) -> Vec<IntentRecord> {
        let cutoff = SystemTime::now()
            .checked_sub(older_than)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let table = self.table.lock();
        let mut out: Vec<IntentRecord> = table
            .records
            .values()
            .filter(|r| r.is_pending() && r.recorded_at() <= cutoff)
            .cloned()
            .collect();
        out.sort_by(|a, b| {
            a.recorded_at()
                .cmp(&b.recorded_at())
                .then_with(|| a.intent().effect_id().cmp(b.intent().effect_id()))
        });
        out.truncate(limit);
        out
    }
}

impl IntentStore for InMemoryIntents {
    fn record<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), IntentError>> {
        Box::pin(std::future::ready(self.record_now(intent)))
    }

    fn note_provider_handle<'a>(
        &'a self,
        effect_id: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<(), IntentError>> {
        Box::pin(std::future::ready(self.note_now(effect_id, handle)))
    }

    fn resolve<'a>(
        &'a self,
        effect_id: &'a str,
        resolution: Resolution,
        provider_handle: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Resolved, IntentError>> {
        Box::pin(std::future::ready(self.resolve_now(
            effect_id,
            resolution,
            provider_handle,
        )))
    }

    fn pending<'a>(
        &'a self,
        older_than: Duration,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<IntentRecord>, IntentError>> {
        Box::pin(std::future::ready(Ok(self.pending_now(older_than, limit))))
    }

    fn get<'a>(
        &'a self,
        effect_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<IntentRecord>, IntentError>> {
        let rec = self.table.lock().records.get(effect_id).cloned();
        Box::pin(std::future::ready(Ok(rec)))
    }
}

impl Default for InMemoryIntents {
    fn default() -> Self {
        InMemoryIntents::new()
    }
}

impl fmt::Debug for InMemoryIntents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.table.lock();
        f.debug_struct("InMemoryIntents")
            .field("intents", &table.records.len())
            .field("max", &table.max)
            .finish()
    }
}
