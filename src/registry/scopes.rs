//! The local index: this process's live scopes per operation, and the operations it knows were
//! cancelled.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::error::JoinError;
use super::id::OperationId;
use crate::cause::Cause;
use crate::panic::Caught;
use crate::scope::Core;
use crate::sync::{downgrade, Mutex, Weak};
use crate::time::now_stamp;
use crate::tree;
use crate::Scope;

/// The reason of the cancel that an operation's cancel gives its scopes
/// ([`Cause::Cancelled`]).
///
/// # Examples
///
/// ```
/// use cancel_scope::registry::{LocalScopes, OperationId, OPERATION_CANCELLED};
/// use cancel_scope::Scope;
///
/// let scopes = LocalScopes::new();
/// let id = OperationId::new("op-1").unwrap();
/// let request = Scope::new();
/// scopes.attach(&id, &request).unwrap();
/// scopes.cancel(&id, None);
/// assert_eq!(request.cause().unwrap().reason(), Some(OPERATION_CANCELLED));
/// ```
pub const OPERATION_CANCELLED: &str = "operation cancelled";

/// How many cancelled operations an index remembers by default.
const DEFAULT_MAX_CLOSED: usize = 10_000;

/// How long an index remembers a cancelled operation whose deadline it does not know.
const DEFAULT_CLOSED_LIFE: Duration = Duration::from_secs(60);

/// An index of this process's scopes by operation, so that one cancel stops every scope of an
/// operation here, and a record of the operations known to be cancelled, so that admission can
/// refuse their requests without asking the store.
///
/// Every [`OperationRegistry`](super::OperationRegistry) keeps one
/// ([`scopes`](super::OperationRegistry::scopes)): its `cancel` goes through it, and so do the
/// cancels the Redis registry hears from other processes on pub/sub.
///
/// * **Weak.** An attached scope is held by a weak reference to its tree node: the index
///   never keeps a scope (nor its tree) alive. An entry goes once its scope is quiet (closed
///   with no work left, so a cancel would have nothing to stop: quiescence is final) or freed.
///   Entries are pruned as scopes are attached: those of an operation whenever its list has
///   doubled since its last pruning, all of them whenever the index has doubled since its
///   last sweep. So the index holds at most about twice the live scopes, plus 64.
/// * **Bounded.** At most [`max_closed`](Self::max_closed) cancelled operations are
///   remembered (default 10,000), each until its deadline (if known, else for
///   [`closed_life`](Self::closed_life), default 60 s). At the bound the one due to be
///   forgotten first goes: the index only spares a round trip, the store's generation check
///   still refuses that operation's requests.
/// * **Nothing runs under its lock.** The cancels (which run wakers and `on_cancel`
///   callbacks) happen after the lock is released.
///
/// Cloning is cheap: clones share one index.
///
/// # Examples
///
/// ```
/// use cancel_scope::registry::{LocalScopes, OperationId};
/// use cancel_scope::Scope;
///
/// let scopes = LocalScopes::new();
/// let id = OperationId::new("checkout-7").unwrap();
/// let first = Scope::new();
/// let second = Scope::new();
/// scopes.attach(&id, &first).unwrap();
/// scopes.attach(&id, &second).unwrap();
///
/// assert_eq!(scopes.cancel(&id, None), 2);
/// assert!(first.is_cancelled() && second.is_cancelled());
/// // Later requests of the operation are refused here without asking the store.
/// assert!(scopes.check(&id).unwrap_err().is_cancelled());
/// ```
#[derive(Clone)]
pub struct LocalScopes {
    index: Arc<Mutex<Index>>,
}

struct Index {
    ops: HashMap<OperationId, Attached>,
    /// Entries over all operations, live or not yet pruned.
    entries: usize,
    /// `entries` at which every operation's list is pruned next.
    sweep_at: usize,
    /// Cancelled operations and until when they are remembered.
    closed: HashMap<OperationId, Instant>,
    /// The same, by the time they are forgotten.
    closed_order: BTreeSet<(Instant, OperationId)>,
    max_closed: usize,
    closed_life: Duration,
}

/// The scopes attached under one operation.
struct Attached {
    scopes: Vec<Weak<Core>>,
    /// Length at which the list is pruned next.
    prune_at: usize,
}

/// Below this many entries the index is not swept, nor a list pruned.
const MIN_SWEEP: usize = 64;
const MIN_PRUNE: usize = 8;

/// The strong references to attached nodes taken while the index's lock is held, dropped
/// after it is released (declare it before the guard): the last reference to a node may be
/// one of them, and freeing a node drops whatever its `on_cancel` callbacks captured, which is
/// user code.
#[derive(Default)]
struct Held(Vec<crate::sync::Arc<Core>>);

impl Held {
    /// Whether an attached scope still has something a cancel could stop: not freed, not
    /// quiet (quiescence is final, invariant 6).
    fn live(&mut self, node: &Weak<Core>) -> bool {
        match node.upgrade() {
            Some(n) => {
                let quiet = n.state().is_quiet();
                self.0.push(n);
                !quiet
            }
            None => false,
        }
    }
}

impl LocalScopes {
    /// An empty index with the default bounds.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::LocalScopes;
    /// assert_eq!(LocalScopes::new().entries(), 0);
    /// ```
    pub fn new() -> LocalScopes {
        LocalScopes {
            index: Arc::new(Mutex::new(Index {
                ops: HashMap::new(),
                entries: 0,
                sweep_at: MIN_SWEEP,
                closed: HashMap::new(),
                closed_order: BTreeSet::new(),
                max_closed: DEFAULT_MAX_CLOSED,
                closed_life: DEFAULT_CLOSED_LIFE,
            })),
        }
    }

    /// Remembers at most `max` cancelled operations (at least 1; default 10,000).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// let scopes = LocalScopes::new().max_closed(1);
    /// scopes.cancel(&OperationId::new("a").unwrap(), None);
    /// scopes.cancel(&OperationId::new("b").unwrap(), None);
    /// assert_eq!(scopes.closed(), 1);
    /// ```
    pub fn max_closed(self, max: usize) -> LocalScopes {
        self.index.lock().max_closed = max.max(1);
        self
    }

    /// Remembers a cancelled operation whose deadline it does not know for `life` (default
    /// 60 s).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// let scopes = LocalScopes::new().closed_life(Duration::from_secs(5));
    /// let id = OperationId::new("a").unwrap();
    /// scopes.cancel(&id, None);
    /// tokio::time::advance(Duration::from_secs(5)).await;
    /// assert!(scopes.check(&id).is_ok());
    /// # }
    /// ```
    pub fn closed_life(self, life: Duration) -> LocalScopes {
        self.index.lock().closed_life = life;
        self
    }

    /// Attaches `scope` (normally a request's root) to operation `id`, so that cancelling the
    /// operation here cancels it and everything under it.
    ///
    /// # Errors
    ///
    /// [`JoinError::is_cancelled`] if this index knows the operation was cancelled: the scope
    /// is cancelled now (with the reason [`OPERATION_CANCELLED`]) and not attached. Checked
    /// under the same lock as a cancel records the operation, so a scope is either attached
    /// before the cancel (which then reaches it) or refused by it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// use cancel_scope::Scope;
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// let request = Scope::new();
    /// scopes.attach(&id, &request).unwrap();
    /// assert_eq!(scopes.live(&id), 1);
    /// ```
    pub fn attach(&self, id: &OperationId, scope: &Scope) -> Result<(), JoinError> {
        let now = Instant::now();
        {
            let mut held = Held::default();
            let mut guard = self.index.lock();
            let ix = &mut *guard;
            ix.forget_closed(now);
            if !ix.closed.contains_key(id.as_str()) {
                let attached = ix.ops.entry(id.clone()).or_insert_with(|| Attached {
                    scopes: Vec::new(),
                    prune_at: MIN_PRUNE,
                });
                if attached.scopes.len() >= attached.prune_at {
                    let before = attached.scopes.len();
                    attached.scopes.retain(|n| held.live(n));
                    ix.entries -= before - attached.scopes.len();
                    attached.prune_at = (attached.scopes.len() * 2).max(MIN_PRUNE);
                }
                attached.scopes.push(downgrade(&scope.node));
                ix.entries += 1;
                if ix.entries >= ix.sweep_at {
                    ix.sweep(&mut held);
                }
                return Ok(());
            }
        }
        scope.cancel_because(Cause::cancelled(OPERATION_CANCELLED));
        Err(JoinError::cancelled(None))
    }

    /// Cancels every live scope attached to `id` (with the reason [`OPERATION_CANCELLED`])
    /// and remembers that the operation was cancelled until `until` — its deadline, if the
    /// caller knows it (which replaces an earlier guess); otherwise the latest deadline of
    /// those scopes, or [`closed_life`](Self::closed_life) from now if none has one. Returns
    /// how many scopes it cancelled (or found cancelled already).
    ///
    /// # Panics
    ///
    /// A waker or `on_cancel` callback of those scopes that panics: its panic comes out once
    /// every scope is cancelled (as from [`Scope::cancel`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// use cancel_scope::Scope;
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// let request = Scope::new();
    /// let handler = request.child().build().unwrap();
    /// scopes.attach(&id, &request).unwrap();
    /// assert_eq!(scopes.cancel(&id, None), 1);
    /// assert!(handler.is_cancelled());
    /// ```
    pub fn cancel(&self, id: &OperationId, until: Option<Instant>) -> usize {
        let nodes = self.close(id, until);
        let mut caught = Caught::default();
        for node in &nodes {
            caught.run(|| tree::cancel(node, Cause::cancelled(OPERATION_CANCELLED), now_stamp()));
        }
        caught.resume();
        nodes.len()
    }

    /// [`cancel`](Self::cancel) for a task that nobody awaits (a pub/sub listener): a panic of
    /// a waker or callback is contained, and the other scopes are still cancelled.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn cancel_contained(&self, id: &OperationId, until: Option<Instant>) -> usize {
        let nodes = self.close(id, until);
        for node in &nodes {
            crate::panic::contain_panic(|| {
                tree::cancel(node, Cause::cancelled(OPERATION_CANCELLED), now_stamp());
            });
        }
        nodes.len()
    }

    /// Records `id` as cancelled and takes its live scopes out of the index (the caller
    /// cancels them, and drops them, after the lock).
    fn close(&self, id: &OperationId, until: Option<Instant>) -> Vec<crate::sync::Arc<Core>> {
        let now = Instant::now();
        let mut quiet = Held::default();
        let mut guard = self.index.lock();
        let ix = &mut *guard;
        ix.forget_closed(now);
        let mut nodes = Vec::new();
        if let Some(attached) = ix.ops.remove(id.as_str()) {
            ix.entries -= attached.scopes.len();
            for n in &attached.scopes {
                if let Some(node) = n.upgrade() {
                    if node.state().is_quiet() {
                        quiet.0.push(node);
                    } else {
                        nodes.push(node);
                    }
                }
            }
        }
        match until {
            Some(until) => ix.remember_closed(id, until, true, now),
            None => {
                let until = nodes
                    .iter()
                    .filter_map(|n| n.ext.deadline)
                    .max()
                    .unwrap_or_else(|| crate::time::deadline_after(now, ix.closed_life));
                ix.remember_closed(id, until, false, now);
            }
        }
        nodes
    }

    /// Whether requests of `id` may still be admitted, as far as this process knows: no
    /// round trip, one lock.
    ///
    /// # Errors
    ///
    /// [`JoinError::is_cancelled`] if the operation was cancelled here, or a cancel of it was
    /// heard.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// assert!(scopes.check(&id).is_ok());
    /// scopes.cancel(&id, None);
    /// assert!(scopes.check(&id).is_err());
    /// ```
    pub fn check(&self, id: &OperationId) -> Result<(), JoinError> {
        let mut ix = self.index.lock();
        ix.forget_closed(Instant::now());
        if ix.closed.contains_key(id.as_str()) {
            return Err(JoinError::cancelled(None));
        }
        Ok(())
    }

    /// How many live scopes are attached to `id`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// use cancel_scope::Scope;
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// let request = Scope::new();
    /// scopes.attach(&id, &request).unwrap();
    /// drop(request);
    /// assert_eq!(scopes.live(&id), 0); // weak: a dropped scope is not kept
    /// ```
    pub fn live(&self, id: &OperationId) -> usize {
        let mut held = Held::default();
        let ix = self.index.lock();
        ix.ops
            .get(id.as_str())
            .map_or(0, |a| a.scopes.iter().filter(|n| held.live(n)).count())
    }

    /// The operations with at least one live scope here (what a listener that may have missed
    /// cancels checks against the store when it reconnects).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// use cancel_scope::Scope;
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// let request = Scope::new();
    /// scopes.attach(&id, &request).unwrap();
    /// assert_eq!(scopes.operations(), vec![id]);
    /// ```
    pub fn operations(&self) -> Vec<OperationId> {
        let mut held = Held::default();
        let ix = self.index.lock();
        ix.ops
            .iter()
            .filter(|(_, a)| a.scopes.iter().any(|n| held.live(n)))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Entries held, live or not yet pruned (see the type's docs for the bound).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// use cancel_scope::Scope;
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// for _ in 0..1000 {
    ///     let request = Scope::new();
    ///     scopes.attach(&id, &request).unwrap();
    /// } // each dropped right away
    /// assert!(scopes.entries() <= 64);
    /// ```
    pub fn entries(&self) -> usize {
        self.index.lock().entries
    }

    /// Cancelled operations remembered (forgotten ones included until the next call that
    /// looks at the clock).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// let scopes = LocalScopes::new();
    /// scopes.cancel(&OperationId::new("op-1").unwrap(), None);
    /// assert_eq!(scopes.closed(), 1);
    /// ```
    pub fn closed(&self) -> usize {
        self.index.lock().closed.len()
    }

    /// Prunes every entry whose scope is quiet or freed, and forgets the cancelled operations
    /// that are due; returns the entries left. Attaching does this by itself as the index
    /// grows; call it to free memory right away.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{LocalScopes, OperationId};
    /// use cancel_scope::Scope;
    /// let scopes = LocalScopes::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// scopes.attach(&id, &Scope::new()).unwrap();
    /// assert_eq!(scopes.sweep(), 0);
    /// ```
    pub fn sweep(&self) -> usize {
        let mut held = Held::default();
        let mut ix = self.index.lock();
        ix.forget_closed(Instant::now());
        ix.sweep(&mut held);
        ix.entries
    }
}

impl Index {
    fn sweep(&mut self, held: &mut Held) {
        let mut entries = 0;
        self.ops.retain(|_, a| {
            a.scopes.retain(|n| held.live(n));
            a.prune_at = (a.scopes.len() * 2).max(MIN_PRUNE);
            entries += a.scopes.len();
            !a.scopes.is_empty()
        });
        self.entries = entries;
        self.sweep_at = (entries * 2).max(MIN_SWEEP);
    }

    fn forget_closed(&mut self, now: Instant) {
        while let Some((until, _)) = self.closed_order.first() {
            if *until > now {
                break;
            }
            if let Some((_, id)) = self.closed_order.pop_first() {
                self.closed.remove(id.as_str());
            }
        }
    }

    /// Remembers `id` as cancelled until `until`: the operation's deadline if `known` (which
    /// then replaces a guess made earlier), else a guess (which only ever lengthens the
    /// record).
    fn remember_closed(&mut self, id: &OperationId, until: Instant, known: bool, now: Instant) {
        if let Some(old) = self.closed.get_mut(id.as_str()) {
            if known || *old < until {
                self.closed_order.remove(&(*old, id.clone()));
                *old = until;
                self.closed_order.insert((until, id.clone()));
            }
            return;
        }
        if until <= now {
            return;
        }
        if self.closed.len() >= self.max_closed {
            if let Some((_, first)) = self.closed_order.pop_first() {
                self.closed.remove(first.as_str());
            }
        }
        self.closed.insert(id.clone(), until);
        self.closed_order.insert((until, id.clone()));
    }
}

impl Default for LocalScopes {
    fn default() -> Self {
        LocalScopes::new()
    }
}

impl fmt::Debug for LocalScopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ix = self.index.lock();
        f.debug_struct("LocalScopes")
            .field("operations", &ix.ops.len())
            .field("entries", &ix.entries)
            .field("closed", &ix.closed.len())
            .finish()
    }
}
