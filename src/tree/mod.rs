//! The cancellation tree: node state, generation, watermark, children, work units, receipts and
//! waiter lists. No tokio types: every atomic and lock comes from [`crate::sync`], so the loom
//! models in `loom-tests/` see all of it.
//!
//! A [`Node`] is the shared core behind a [`Scope`](crate::Scope) handle. The public handle only
//! calls the functions of this module, which are in files by concern:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the state word, [`Node`] and its accessors, the walk up the tree ([`ancestors`]) |
//! | `units.rs` | taking and giving back work units, dispatch, going idle (invariants 2, 3, 6) |
//! | `registry.rs` | children, links, handles, retirement (invariants 7, 8) |
//! | `cancel.rs` | the cancel walk, its hand-over to `quiesce()` waiters, close (invariants 1, 2) |
//! | `receipts.rs` | registration, in-flight lists, receipts and effect records (invariant 5) |
//! | `quarantine.rs` | quarantining the children of a subtree that did not stop |
//! | `waiters.rs` | `cancelled()` and `quiesce()` waiters, `on_cancel` callbacks |
//! | `ticket.rs` | a ticket's cell and the in-flight shards |
//!
//! # The state word
//!
//! `Node::state` packs everything a hot path must decide in one atomic read:
//!
//! | bits   | meaning |
//! |--------|---------|
//! | 0..32  | active work units: live tickets, live guards, and one per child node that has units |
//! | 32     | `CLOSED`: the registration watermark is closed (by `close` or `cancel`) |
//! | 33     | `CANCELLED` |
//! | 34     | `STARTED`: a unit was ever taken in this subtree (lifecycle `Accepted -> Running`) |
//! | 35..64 | generation: bumped by cancel, in the same atomic step that sets `CANCELLED` |
//!
//! # Invariants
//!
//! 1. **Cancel is idempotent, first cause wins, cancel flows down only.** `Inner::cause` is
//!    written once, under `inner`, in the same critical section that sets `CANCELLED`; a second
//!    canceller finds the cause set and returns. Cancelling walks children only, never parents,
//!    and reaches every descendant that is not quiet yet. A closed child that is already quiet
//!    (it completed: invariant 6) is out of a later cancel's reach: `mark_cancelled` leaves it
//!    and its subtree (quiet too) as they are, neither cancelled nor with a cause, and its
//!    report stays `Completed`. A closed child that still has work is cancelled like any other.
//! 2. **No dispatch after cancel.** Dispatch is a compare-and-swap on the node's state word
//!    that requires the generation the ticket saw and an open watermark; cancel sets `CANCELLED`
//!    and bumps the generation with one read-modify-write on the same word. The modification
//!    order of that word puts every dispatch either before the cancel (whose propagation then
//!    reaches the dispatched work through this node) or after it (and the CAS fails).
//!    A spawned task is registered and dispatched by one CAS ([`register_task`]): taking a unit
//!    is a CAS from a word without `CLOSED`, in the generation it holds, which is the dispatch
//!    CAS's condition, so the same modification-order argument holds for it (loom models 15, 16).
//!    So does a child that is itself a ticket of its parent ([`new_child_dispatched`]: a retry
//!    attempt), whose parent unit is taken by that CAS before it is linked (loom model 11).
//! 3. **No registration after the watermark closes.** Taking a unit is a CAS that fails when
//!    `CLOSED` is set. A node going from 0 to 1 units first takes a unit in its parent (so the
//!    parent's `CLOSED` bit is checked too) and gives it back if it loses the race.
//! 4. (Budgets never grow: enforced by `budget` and the scope builder, not here.)
//! 5. **Exactly one receipt per ticket.** A ticket's [`TicketCell`] moves out of
//!    `PREPARED`/`DISPATCHED` by one CAS, made either by its owner (receipt, drop) or by
//!    quarantine; only the winner records a receipt and releases the unit. A spawned task has
//!    no cell. Until its first `Pending` it is only counted in an in-flight shard's unlisted
//!    word, whose epoch a quarantine bumps as it takes the whole count: exactly one of the
//!    task's epoch-checked decrement (its receipt, or its listing) and the quarantine's bump
//!    takes it. Once listed, its entry is taken out under the shard lock by exactly one of its
//!    receipt and a quarantine (a sequence number tells a reused slot apart). A task moves
//!    from the count into the list of its polling thread's shard under that shard's lock,
//!    and the quarantine takes every shard's lock only after it bumped every count, so it
//!    meets the task in one of the two places, never both (see `InFlight::set_task_waker`). A child
//!    node that is itself a ticket of its parent ([`new_child_dispatched`]: a retry attempt)
//!    has no cell either: its `own` state moves out of `OWN_DISPATCHED` by one CAS, its
//!    owner's or a quarantine's, which finds it through the parent's registry.
//! 6. **Stable quiescence.** A node is quiet when `CLOSED` is set and it has no units. Units
//!    can then only be taken through the node itself (closed) or through a child going from 0 to
//!    1, which needs a unit of this node (closed) — a child born with a unit (its own ticket,
//!    [`new_child_dispatched`]) takes that unit of this node by the same CAS before it exists:
//!    so quiet is forever, and since receipts are counted before their unit is released, no
//!    counter changes after quiet is observed. A cancel that finds a node quiet without a
//!    cancel leaves it (and its quiet subtree) as it is: `Completed` is final.
//! 7. **Finished children are unlinked.** A child is linked into one slot of its parent's
//!    sharded registry at creation. A node *retires* once it has no public handle and no linked
//!    child (a node whose handles are gone stays linked, and reachable by its ancestors'
//!    cancel, while a descendant lives); retiring removes it from its parent's registry. Both
//!    conditions only ever go one way (new handles and children are made through a handle), and
//!    exactly one thread retires a node: the one that drops its last handle finding no child
//!    (checked under all of its registry shards' locks at once), or else the one whose removal
//!    of the last child finds it *orphaned* (a flag set under those same locks) and wins the
//!    `ORPHANED -> RETIRED` compare-and-swap. So a long-lived parent with millions of
//!    short-lived children keeps flat memory (slab slots are reused).
//! 8. **Children do not write their parent.** A child reaches its parent through a [`Link`]
//!    per (parent, registry shard), which the parent keeps in that shard while it has handles;
//!    creating and dropping a child touches that shard (its lock, the link's count) but never
//!    the parent's own counters, so threads creating children of one parent on different shards
//!    do not contend. The parent drops its links (breaking the parent-link cycle) when it loses
//!    its last handle; a link then lives as long as the children that hold it.
//!
//! # Boundaries (a server's requests)
//!
//! A *boundary* child ([`new_boundary_child`]: a request's scope under a server's) is a child
//! for cancel and for quiet — its parent's cancel reaches it, and while it has units it holds
//! one of its parent's — but a root for its report: receipts, records and guard stamps below it
//! are counted up to it and no further (the walks up stop there), so a long-lived parent
//! neither pays for every receipt of every request nor keeps their records (invariant 7's flat
//! memory). A parent can close its own watermark only ([`close_own`]: a server that stops
//! admitting), leaving its children open: a child with units goes on, one without can take
//! none (its first unit needs one of the parent's, invariant 3), and the parent is quiet once
//! every child's units are gone (invariant 6 as for any node). While the parent is closed, a
//! boundary child that gives back its last unit can take none again (its report is final,
//! closed or not) and adds its counts and records to the parent's *before* it gives back its
//! unit of the parent, so the parent's report, made once it is quiet, has every such child,
//! and never changes after ([`roll_up`](receipts::roll_up)); a child that went idle while the parent was open
//! does not.
//!
//! # Lock order (deadlock safety)
//!
//! Locks of two nodes are held at once in one place only: [`cancel()`] holds a registry shard of
//! a parent while it takes each child's `inner` in turn, and (down to a bounded depth) while it
//! goes on to that child's shards, one at a time, and so on down. Every such chain of locks
//! goes strictly downwards, one shard per node (parent shard, child `inner` — released — then
//! a child shard, ...); nothing takes a shard of a node while holding a lock of one of its
//! descendants, and nothing takes a shard while holding an `inner` (`inner` critical sections
//! take no other tree lock), so no cycle can form. Within one node: the first child of a shard
//! takes the node's `inner` while holding that shard (never the reverse), and a node losing
//! its last handle takes all of its own shards in index order and nothing else.
//! [`quarantine_subtree`] and `close` hold a shard only while cloning `Arc`s out of it;
//! unlinking holds one shard of the parent and nothing else; a child made as its parent's
//! ticket ([`new_child_dispatched`]) takes its parent's unit before the shard lock, and gives it
//! back (refused) after releasing it. An in-flight shard is a leaf lock: nothing is taken
//! while one is held. Callbacks and wakers are always invoked after every lock is released, so
//! user code never runs under a tree lock.

use crate::cause::Cause;
use crate::error::Error;
use crate::sync::{arc_in_place, Arc, AtomicU64, AtomicU8, AtomicUsize, LazyBox, Mutex, Ordering};

mod cancel;
mod quarantine;
mod receipts;
mod registry;
mod ticket;
mod units;
mod waiters;

pub(crate) use cancel::{cancel, close, close_own};
pub(crate) use quarantine::{quarantine_subtree, quarantine_subtree_noting};
pub(crate) use receipts::{
    note_effects, own_info, own_quarantined, poll_cancel_task, record_own_receipt, record_receipt,
    record_task_receipt, record_task_receipt_and, register, register_shielded, register_task,
    release_guard, task_cancelled, Counts, Kind, Records,
};
pub(crate) use registry::{
    add_handle, drop_handle, new_boundary_child, new_child, new_child_dispatched, push_children,
};
pub(crate) use ticket::{keep_waker, InFlight, TaskKey, TicketCell, TicketState};
pub(crate) use units::{dispatch, take_unit, take_unit_while_busy};
pub(crate) use waiters::{
    forget_waiter, on_cancel, poll_cancelled, poll_quiet, stop_callback, Wait, WaiterKey,
};

use receipts::{OWN_DISPATCHED, OWN_NONE};
use registry::{Link, Shard, LIVE};
use waiters::Inner;

const ACTIVE_MASK: u64 = (1 << 32) - 1;
const CLOSED: u64 = 1 << 32;
const CANCELLED: u64 = 1 << 33;
const STARTED: u64 = 1 << 34;
const GEN_SHIFT: u32 = 35;
const GEN_ONE: u64 = 1 << GEN_SHIFT;

/// Number of registry shards per node: children of one parent created on different threads
/// mostly take different locks.
const SHARDS: usize = 4;

/// A snapshot of a node's state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State(u64);

impl State {
    pub(crate) fn active(self) -> u64 {
        self.0 & ACTIVE_MASK
    }
    pub(crate) fn is_closed(self) -> bool {
        self.0 & CLOSED != 0
    }
    pub(crate) fn is_cancelled(self) -> bool {
        self.0 & CANCELLED != 0
    }
    pub(crate) fn is_started(self) -> bool {
        self.0 & STARTED != 0
    }
    pub(crate) fn generation(self) -> u64 {
        self.0 >> GEN_SHIFT
    }
    pub(crate) fn is_quiet(self) -> bool {
        self.is_closed() && self.active() == 0
    }
}

/// Why a unit could not be taken or a ticket could not be dispatched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The node (or an ancestor on the way up) was cancelled.
    Cancelled(Cause),
    /// The watermark was closed without a cancel (normal completion).
    Closed,
    /// The generation moved on since the ticket was registered.
    StaleGeneration,
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Cancelled(c) => Error::cancelled(c),
            Refused::Closed => Error::closed(),
            Refused::StaleGeneration => Error::stale(),
        }
    }
}

/// A node of the cancellation tree. `X` is the scope layer's per-node data, `R` its record type
/// for unknown effects and quarantined children.
pub(crate) struct Node<X, R> {
    /// See the module docs for the bit layout.
    state: AtomicU64,
    /// Live public handles. Pairs: `AcqRel` decrement so the drop that takes it to zero sees
    /// every other handle's writes before retiring the node (invariant 7).
    handles: AtomicUsize,
    /// Low two bits: `LIVE`, `ORPHANED` or `RETIRED` (invariant 7), changed only with the
    /// node's handles gone; plus `HAS_SHARDS`, set through a handle by a shard's first child.
    retire: AtomicU8,
    /// Whether this node is itself a ticket of its parent, and where that ticket is:
    /// `OWN_NONE`, or `OWN_DISPATCHED` until one CAS moves it to `OWN_DONE` (its owner's
    /// receipt) or `OWN_QUARANTINED` (a quarantine's): invariant 5 (see
    /// [`new_child_dispatched`]); with `OWN_RECORDED` once that receipt is recorded.
    own: AtomicU8,
    /// The way to the parent (`None` for a root); `key` is this node's slot in the parent's
    /// registry shard `up.shard`.
    up: Option<Arc<Link<X, R>>>,
    key: usize,
    inner: Mutex<Inner<X, R>>,
    /// Children, sharded by creating thread; allocated with the first child.
    registry: [LazyBox<Shard<X, R>>; SHARDS],
    /// Tickets registered here that have no receipt yet (for quarantine, and for waking the
    /// tasks among them on cancel); allocated with the first ticket.
    in_flight: LazyBox<InFlight<R>>,
    /// Receipt counters of this subtree; allocated with the first receipt below.
    counts: LazyBox<Counts>,
    /// Unknown effects and quarantined children of this subtree (rare).
    records: LazyBox<Mutex<Records<R>>>,
    /// What this node is as a ticket of its parent (a quarantine records it); `None` unless it
    /// was created by [`new_child_dispatched`]. Never changed.
    own_info: Option<R>,
    /// `Some` for a boundary child ([`new_boundary_child`]): the walks that count receipts,
    /// records and stamps stop here, and this adds the node's report to its closed parent's
    /// as it becomes quiet ([`roll_up`](receipts::roll_up), made where `R: Clone` is known: the
    /// release paths do not require it). Never changed.
    boundary: Option<RollUp<X, R>>,
    pub(crate) ext: X,
}

/// See `Node::boundary`.
type RollUp<X, R> = fn(&Node<X, R>, &Node<X, R>);

impl<X, R> std::fmt::Debug for Node<X, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

fn shard_for_this_thread() -> usize {
    crate::sync::thread_index() % SHARDS
}

impl<X, R> Node<X, R> {
    // Always inlined: built in its allocation by `arc_in_place`, which a call would defeat
    // (the node would be assembled on the stack and copied, a store-forwarding stall).
    #[inline(always)]
    fn new(
        up: Option<Arc<Link<X, R>>>,
        key: usize,
        state: u64,
        ext: X,
        own: Option<R>,
        boundary: Option<RollUp<X, R>>,
    ) -> Self {
        Node {
            state: AtomicU64::new(state),
            handles: AtomicUsize::new(1),
            retire: AtomicU8::new(LIVE),
            own: AtomicU8::new(if own.is_some() {
                OWN_DISPATCHED
            } else {
                OWN_NONE
            }),
            up,
            key,
            inner: Inner::new_lock(),
            registry: std::array::from_fn(|_| LazyBox::new()),
            in_flight: LazyBox::new(),
            counts: LazyBox::new(),
            records: LazyBox::new(),
            own_info: own,
            boundary,
            ext,
        }
    }

    /// The state word. `Acquire` pairs with the `AcqRel` RMWs of cancel/close/release so that a
    /// reader who sees `CANCELLED` also sees the cause, and one who sees quiet sees all receipts.
    pub(crate) fn state(&self) -> State {
        State(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn cause(&self) -> Option<Cause> {
        if !self.state().is_cancelled() {
            return None;
        }
        self.inner.lock().cause.clone()
    }

    pub(crate) fn cancelled_at(&self) -> u64 {
        self.inner.lock().cancelled_at
    }

    /// Receipts of `kind` recorded in this subtree.
    pub(crate) fn count(&self, kind: Kind) -> u64 {
        self.counts.get().map_or(0, |c| c.get(kind))
    }

    /// Sum of (receipt stamp - cancel stamp) over receipts recorded after the cancel.
    pub(crate) fn orphan_nanos(&self) -> u64 {
        self.counts.get().map_or(0, Counts::orphan_nanos)
    }

    /// Stamp of the last receipt or guard release in this subtree (0: none).
    pub(crate) fn last_stamp(&self) -> u64 {
        self.counts.get().map_or(0, Counts::last_stamp)
    }

    /// Runs `f` over the effect and quarantine records of this subtree.
    pub(crate) fn with_records<T>(&self, f: impl FnOnce(&Records<R>) -> T) -> T {
        match self.records.get() {
            Some(r) => f(&r.lock()),
            None => f(&Records::default()),
        }
    }

    /// Files `records` of a receipt of `kind` in this node: unknown effects, or quarantined
    /// children (the other kinds list nothing).
    fn add_records(&self, kind: Kind, records: &[R])
    where
        R: Clone,
    {
        let mut recs = self.records.get_or_init().lock();
        match kind {
            Kind::EffectUnknown => recs.effects.extend_from_slice(records),
            Kind::Quarantined => recs.quarantined.extend_from_slice(records),
            _ => {}
        }
    }

    /// The parent node (`None` for a root).
    pub(crate) fn parent(&self) -> Option<&Arc<Node<X, R>>> {
        self.up.as_ref().map(|l| &l.parent)
    }

    /// The parent node, borrowed for a walk up.
    fn parent_node(&self) -> Option<&Node<X, R>> {
        self.up.as_deref().map(|l| &*l.parent)
    }

    /// The next node up for the walks that count receipts, records and stamps: the parent,
    /// unless this is a boundary (see the module docs).
    #[inline]
    fn report_parent(&self) -> Option<&Node<X, R>> {
        if self.boundary.is_some() {
            None
        } else {
            self.parent_node()
        }
    }

    /// Number of live children (for tests of invariant 7).
    #[cfg(any(test, feature = "__test-hooks"))]
    pub(crate) fn child_count(&self) -> usize {
        self.shards().map(|s| s.data.lock().children.len()).sum()
    }

    /// The registry shards whose bits are set in `in_use` (read under `inner`, which also
    /// makes their creation visible).
    fn shards_in(&self, in_use: u8) -> impl Iterator<Item = &Shard<X, R>> {
        self.registry
            .iter()
            .enumerate()
            .filter(move |(i, _)| in_use & (1 << i) != 0)
            .filter_map(|(_, s)| s.get())
    }

    /// The registry shards that exist (that have had a child).
    fn shards(&self) -> impl Iterator<Item = &Shard<X, R>> {
        self.registry.iter().filter_map(LazyBox::get)
    }
}

/// Creates a root node.
pub(crate) fn new_root<X, R>(ext: X) -> Arc<Node<X, R>> {
    arc_in_place(|| Node::new(None, 0, 0, ext, None, None))
}

/// `node`, then its parent, and so on up to the root: the one walk up the tree (receipts
/// counted in every ancestor, a cancel handed to the waiters above, the scope layer's marks,
/// notes and deadlines). Its strict ancestors are `ancestors(node).skip(1)`.
///
/// Given a `&Node`, yields `&Node`s; given an `&Arc<Node>`, yields `&Arc<Node>`s (for a
/// caller that cancels what it meets). No lock is taken: a node holds its parent (through its
/// link), so the whole way up lives as long as `node`.
pub(crate) fn ancestors<N: Up>(node: N) -> impl Iterator<Item = N> {
    std::iter::successors(Some(node), |n| n.up())
}

/// `node`, then its parent, and so on up to the first boundary (see the module docs) or the
/// root: the walk of what a report counts (receipts, records, guard stamps, notes).
pub(crate) fn report_ancestors<X, R>(node: &Node<X, R>) -> impl Iterator<Item = &Node<X, R>> {
    std::iter::successors(Some(node), |n| n.report_parent())
}

/// A node on a walk up (see [`ancestors`]).
pub(crate) trait Up: Sized {
    /// Its parent (`None` for a root).
    fn up(&self) -> Option<Self>;
}

impl<X, R> Up for &Node<X, R> {
    fn up(&self) -> Option<Self> {
        self.parent_node()
    }
}

impl<X, R> Up for &Arc<Node<X, R>> {
    fn up(&self) -> Option<Self> {
        self.parent()
    }
}

fn refusal<X, R>(node: &Node<X, R>, state: State) -> Refused {
    if state.is_cancelled() {
        Refused::Cancelled(node.cause().unwrap_or(Cause::Cancelled { reason: None }))
    } else {
        Refused::Closed
    }
}

#[cfg(test)]
mod tests;

#[cfg(all(test, loom))]
mod loom_handover;
