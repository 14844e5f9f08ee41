//! The in-process registry: the embedded default, for one process.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::error::RegistryError;
use super::id::OperationId;
use super::scopes::LocalScopes;
use super::{
    Begun, BoxFuture, CancelOutcome, OperationRegistry, OperationState, MAX_LIFETIME, MIN_BUDGET,
};
use crate::sync::Mutex;
use crate::time::deadline_after;

/// How many operations an [`InProcessRegistry`] holds by default.
const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// The operation registry of one process: operations in a bounded table, on tokio's monotonic
/// clock.
///
/// * **Entries expire with their deadline.** An operation read after its deadline is gone
///   (removed by that read), and every [`begin`](OperationRegistry::begin) first sweeps out
///   all operations whose deadline has passed (kept in deadline order, so a sweep costs what
///   it removes). A cancelled operation stays, cancelled, until its deadline, so that its
///   late requests are refused.
/// * **Bounded memory.** At most [`max_entries`](Self::max_entries) operations (default
///   100,000). At the bound, once the expired ones are swept, `begin` of a *new* operation
///   fails with [`RegistryError::is_full`] — a fault, so admission goes on with the
///   endpoint's own cap, never with an unbounded budget — while the operations it holds are
///   still read and cancelled. It never evicts a live operation: a forgotten one would come
///   back with a fresh budget, a forgotten cancel would admit its old generation again.
///
/// Every call answers at once (one lock, no await).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry};
///
/// let registry = InProcessRegistry::new().max_entries(1);
/// let a = OperationId::new("a").unwrap();
/// let b = OperationId::new("b").unwrap();
/// registry.begin(&a, Duration::from_millis(100)).await.unwrap();
/// assert!(registry.begin(&b, Duration::from_millis(100)).await.unwrap_err().is_full());
///
/// tokio::time::advance(Duration::from_millis(100)).await; // `a` expires
/// assert!(registry.begin(&b, Duration::from_millis(100)).await.unwrap().created());
/// assert!(registry.get(&a).await.unwrap().is_none());
/// # }
/// ```
pub struct InProcessRegistry {
    table: Mutex<Table>,
    scopes: LocalScopes,
}

struct Table {
    entries: HashMap<OperationId, Entry>,
    /// The same operations by deadline, for the sweep.
    by_deadline: BTreeSet<(Instant, OperationId)>,
    max: usize,
}

#[derive(Clone, Copy)]
struct Entry {
    deadline: Instant,
    generation: u64,
    cancelled: bool,
}

impl Entry {
    fn state(&self, now: Instant) -> OperationState {
        OperationState::new(
            self.deadline.saturating_duration_since(now),
            self.generation,
            self.cancelled,
        )
    }
}

impl Table {
    /// Removes every operation whose deadline is at or before `now`; returns how many.
    fn sweep(&mut self, now: Instant) -> usize {
        let mut removed = 0;
        while let Some((deadline, _)) = self.by_deadline.first() {
            if *deadline > now {
                break;
            }
            if let Some((_, id)) = self.by_deadline.pop_first() {
                self.entries.remove(id.as_str());
                removed += 1;
            }
        }
        removed
    }

    /// The live entry of `id`, removing it if its deadline has passed (lazy expiry).
    fn live(&mut self, id: &OperationId, now: Instant) -> Option<&mut Entry> {
        let deadline = self.entries.get(id.as_str())?.deadline;
        if deadline <= now {
            self.entries.remove(id.as_str());
            self.by_deadline.remove(&(deadline, id.clone()));
            return None;
        }
        self.entries.get_mut(id.as_str())
    }
}

impl InProcessRegistry {
    /// An empty registry holding at most 100,000 operations, with its own [`LocalScopes`].
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::InProcessRegistry;
    /// assert!(InProcessRegistry::new().is_empty());
    /// ```
    pub fn new() -> InProcessRegistry {
        InProcessRegistry {
            table: Mutex::new(Table {
                entries: HashMap::new(),
                by_deadline: BTreeSet::new(),
                max: DEFAULT_MAX_ENTRIES,
            }),
            scopes: LocalScopes::new(),
        }
    }

    /// Holds at most `max` operations (at least 1). See the type's docs for what happens at
    /// the bound.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::InProcessRegistry;
    /// let registry = InProcessRegistry::new().max_entries(1000);
    /// # let _ = registry;
    /// ```
    pub fn max_entries(self, max: usize) -> InProcessRegistry {
        self.table.lock().max = max.max(1);
        self
    }

    /// Uses `scopes` as its index of local scopes (to set its bounds, or to share it).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{InProcessRegistry, LocalScopes};
    /// let registry = InProcessRegistry::new().with_scopes(LocalScopes::new().max_closed(100));
    /// # let _ = registry;
    /// ```
    pub fn with_scopes(mut self, scopes: LocalScopes) -> InProcessRegistry {
        self.scopes = scopes;
        self
    }

    /// Operations held, expired ones included until they are swept or read.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry};
    /// let registry = InProcessRegistry::new();
    /// registry.begin(&OperationId::new("a").unwrap(), Duration::from_secs(1)).await.unwrap();
    /// assert_eq!(registry.len(), 1);
    /// # }
    /// ```
    pub fn len(&self) -> usize {
        self.table.lock().entries.len()
    }

    /// Whether it holds no operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::InProcessRegistry;
    /// assert!(InProcessRegistry::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every operation whose deadline has passed now; returns how many. `begin` does
    /// this by itself; call it (on a timer, say) to free the memory of a registry that
    /// begins nothing for a while.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry};
    /// let registry = InProcessRegistry::new();
    /// registry.begin(&OperationId::new("a").unwrap(), Duration::from_secs(1)).await.unwrap();
    /// tokio::time::advance(Duration::from_secs(1)).await;
    /// assert_eq!(registry.sweep(), 1);
    /// assert!(registry.is_empty());
    /// # }
    /// ```
    pub fn sweep(&self) -> usize {
        self.table.lock().sweep(Instant::now())
    }

    fn begin_now(&self, id: &OperationId, budget: Duration) -> Result<Begun, RegistryError> {
        if budget < MIN_BUDGET {
            return Err(RegistryError::invalid(
                "an operation cannot begin with less than 1 ms",
            ));
        }
        let now = Instant::now();
        let mut table = self.table.lock();
        table.sweep(now);
        if let Some(entry) = table.entries.get(id.as_str()) {
            return Ok(Begun::new(entry.state(now), false));
        }
        if table.entries.len() >= table.max {
            return Err(RegistryError::full(table.max));
        }
        let entry = Entry {
            deadline: deadline_after(now, budget.min(MAX_LIFETIME)),
            generation: 0,
            cancelled: false,
        };
        table.entries.insert(id.clone(), entry);
        table.by_deadline.insert((entry.deadline, id.clone()));
        Ok(Begun::new(entry.state(now), true))
    }

    fn get_now(&self, id: &OperationId) -> Option<OperationState> {
        let now = Instant::now();
        let mut table = self.table.lock();
        table.live(id, now).map(|e| e.state(now))
    }

    fn cancel_now(&self, id: &OperationId) -> CancelOutcome {
        let now = Instant::now();
        let (outcome, deadline) = {
            let mut table = self.table.lock();
            match table.live(id, now) {
                None => (CancelOutcome::Unknown, None),
                Some(entry) if entry.cancelled => (
                    CancelOutcome::AlreadyCancelled(entry.state(now)),
                    Some(entry.deadline),
                ),
                Some(entry) => {
                    entry.generation += 1;
                    entry.cancelled = true;
                    (
                        CancelOutcome::Cancelled(entry.state(now)),
                        Some(entry.deadline),
                    )
                }
            }
        };
        self.scopes.cancel(id, deadline);
        outcome
    }
}

impl OperationRegistry for InProcessRegistry {
    fn begin<'a>(
        &'a self,
        id: &'a OperationId,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Begun, RegistryError>> {
        let out = self.begin_now(id, budget);
        Box::pin(std::future::ready(out))
    }

    fn get<'a>(
        &'a self,
        id: &'a OperationId,
    ) -> BoxFuture<'a, Result<Option<OperationState>, RegistryError>> {
        let out = self.get_now(id);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn cancel<'a>(
        &'a self,
        id: &'a OperationId,
    ) -> BoxFuture<'a, Result<CancelOutcome, RegistryError>> {
        // At the call, not at the first poll: the local scopes stop even if the future is
        // dropped unpolled.
        let out = self.cancel_now(id);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn scopes(&self) -> &LocalScopes {
        &self.scopes
    }
}

impl Default for InProcessRegistry {
    fn default() -> Self {
        InProcessRegistry::new()
    }
}

impl fmt::Debug for InProcessRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.table.lock();
        f.debug_struct("InProcessRegistry")
            .field("entries", &table.entries.len())
            .field("max_entries", &table.max)
            .field("scopes", &self.scopes)
            .finish()
    }
}
