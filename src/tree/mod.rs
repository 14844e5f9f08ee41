//! The cancellation tree: node state, generation, watermark, children, work units, receipts and
//! waiter lists. No tokio types: every atomic and lock comes from [`crate::sync`], so the loom
//! models in `loom-tests/` see all of it.
//!
//! A [`Node`] is the shared core behind a [`Scope`](crate::Scope) handle. The public handle only
//! calls the functions of this module.
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
//! and never changes after ([`roll_up`]); a child that went idle while the parent was open
//! does not.
//!
//! # Lock order (deadlock safety)
//!
//! Locks of two nodes are held at once in one place only: [`cancel`] holds a registry shard of
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

use std::task::Waker;

use slab::Slab;

use crate::cause::Cause;
use crate::error::Error;
use crate::panic::Caught;
use crate::sync::{arc_in_place, Arc, AtomicU64, AtomicU8, AtomicUsize, LazyBox, Mutex, Ordering};
use crate::sync::{downgrade, Shared, Weak};

mod ticket;

pub(crate) use ticket::{keep_waker, InFlight, TaskKey, TicketCell, TicketState};

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

/// Receipt kinds, in the order of [`Counts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Succeeded = 0,
    Failed = 1,
    Cancelled = 2,
    Quarantined = 3,
    EffectUnknown = 4,
}

/// Per-kind receipt counters of a subtree (rolled up to every ancestor when recorded).
///
/// Sharded by the recording thread, like the registry: tasks finishing on different worker
/// threads add to different cache lines, and a read sums the shards. Receipts are counted
/// before their unit is released, so a reader who observed quiet sees every shard's final
/// value (invariant 6).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    by_kind: [CountShard; SHARDS],
    /// Sum over receipts recorded after this node was cancelled of (receipt stamp - cancel stamp).
    orphan_nanos: AtomicU64,
    /// Stamp of the last receipt or guard release, for "time from cancel to quiet".
    last_stamp: AtomicU64,
}

/// The receipt counters of one shard, padded to a cache line of their own.
#[derive(Debug, Default)]
struct CountShard {
    kinds: [AtomicU64; 5],
    _pad: [u64; 3],
}

impl Counts {
    pub(crate) fn get(&self, kind: Kind) -> u64 {
        self.by_kind
            .iter()
            .map(|s| s.kinds[kind as usize].load(Ordering::Acquire))
            .fold(0, u64::wrapping_add)
    }
    pub(crate) fn orphan_nanos(&self) -> u64 {
        self.orphan_nanos.load(Ordering::Acquire)
    }
    pub(crate) fn last_stamp(&self) -> u64 {
        self.last_stamp.load(Ordering::Acquire)
    }
}

/// Lists that receipts add to (rare: unknown effects and quarantined children).
#[derive(Debug)]
pub(crate) struct Records<R> {
    pub(crate) effects: Vec<R>,
    pub(crate) quarantined: Vec<R>,
    /// Boundary children rolled up into this node (see [`roll_up`]), and how many of them
    /// had been cancelled by this node's cancel.
    pub(crate) rolled_up: u64,
    pub(crate) rolled_up_cancelled: u64,
}

impl<R> Default for Records<R> {
    fn default() -> Self {
        Records {
            effects: Vec::new(),
            quarantined: Vec::new(),
            rolled_up: 0,
            rolled_up_cancelled: 0,
        }
    }
}

type Callback = Box<dyn FnOnce(&Cause) + Send>;

struct Inner<X, R> {
    /// Set once, together with `CANCELLED` (invariant 1).
    cause: Option<Cause>,
    /// Stamp of the cancel (caller-supplied clock, nanoseconds); 0 while not cancelled.
    cancelled_at: u64,
    /// The first task waiting in `cancelled()`, kept inline: most scopes that are waited on
    /// at all have one waiter (the `run` around their work), which then costs no allocation.
    first_waiter: Option<Waker>,
    /// Waiters and callbacks, allocated by the first one that does not fit inline (most nodes
    /// never have any).
    lists: Option<Box<Lists<X, R>>>,
    /// Bit `i`: registry shard `i` has had a child. Set (under this lock) before the first
    /// child of a shard reads the state word, read by cancel and close under this lock, so
    /// that they visit only shards in use (see `new_child`).
    shards_in_use: u8,
}

struct Lists<X, R> {
    /// Tasks waiting in `cancelled()`.
    cancel_waiters: Slab<Waker>,
    /// Tasks waiting in `quiesce()`.
    quiet_waiters: Slab<QuietWaiter<X, R>>,
    /// `on_cancel` callbacks.
    callbacks: Slab<Callback>,
}

impl<X, R> Default for Lists<X, R> {
    fn default() -> Self {
        Lists {
            cancel_waiters: Slab::new(),
            quiet_waiters: Slab::new(),
            callbacks: Slab::new(),
        }
    }
}

/// A task waiting in `quiesce()`, with the scopes cancelled while busy (its own, or below it)
/// that it has not been handed yet (see [`hand_over`] and [`poll_quiet`]). Weak: a handed
/// scope that finishes and goes is freed at once (invariant 7), not when it is taken.
pub(crate) struct QuietWaiter<X, R> {
    waker: Waker,
    cancelled: Vec<Weak<Node<X, R>>>,
    /// The length of `cancelled` at which the gone scopes are dropped from it (a waiter not
    /// polled for a long time does not collect them without bound).
    prune_at: usize,
}

impl<X, R> QuietWaiter<X, R> {
    /// The fewest handed scopes at which gone ones are dropped.
    const PRUNE_MIN: usize = 32;

    /// Hands `node` over and returns the waker to wake once no lock is held.
    fn hand(&mut self, node: &Arc<Node<X, R>>) -> Waker {
        if self.cancelled.len() >= self.prune_at {
            // Amortized: at least as many pushes as this keeps come before the next one.
            self.cancelled.retain(|n| n.strong_count() > 0);
            self.prune_at = (2 * self.cancelled.len()).max(Self::PRUNE_MIN);
        }
        self.cancelled.push(downgrade(node));
        self.waker.clone()
    }
}

impl<X, R> Inner<X, R> {
    /// A fresh node's `inner`. A constant, so that a new node copies it from one place
    /// instead of assembling it field by field on the stack (which costs a store-forwarding
    /// stall per node when the pieces are copied on into the node).
    const EMPTY: Inner<X, R> = Inner {
        cause: None,
        cancelled_at: 0,
        first_waiter: None,
        lists: None,
        shards_in_use: 0,
    };

    /// A fresh node's locked `inner`, copied from a constant (see [`Inner::EMPTY`]).
    #[cfg(not(loom))]
    #[allow(clippy::declare_interior_mutable_const)] // copied, never shared
    const LOCK: Mutex<Inner<X, R>> = Mutex::new(Inner::EMPTY);

    #[cfg(not(loom))]
    fn new_lock() -> Mutex<Inner<X, R>> {
        Self::LOCK
    }

    #[cfg(loom)]
    fn new_lock() -> Mutex<Inner<X, R>> {
        Mutex::new(Inner::EMPTY)
    }

    fn lists(&mut self) -> &mut Lists<X, R> {
        self.lists.get_or_insert_with(Box::default)
    }

    /// Takes every `quiesce()` waiter (the node became quiet; cancel drains its own lists in
    /// `mark_cancelled`). The caller drops them with no lock held (they hold nodes).
    fn take_quiet_waiters(&mut self) -> Vec<QuietWaiter<X, R>> {
        self.lists
            .as_mut()
            .map_or_else(Vec::new, |l| l.quiet_waiters.drain().collect())
    }
}

/// One shard of a node's children registry, allocated by its first child. Padded so that the
/// hot start (lock, slab header, link) of two shards never shares a cache line, without an
/// over-aligned allocation.
struct Shard<X, R> {
    data: Mutex<ShardData<X, R>>,
    _pad: [u8; 64],
}

struct ShardData<X, R> {
    children: Slab<Arc<Node<X, R>>>,
    /// The link that children of this shard hold to reach the parent, made by the first of them
    /// and kept while the parent has handles (invariant 8).
    link: Option<Arc<Link<X, R>>>,
}

impl<X, R> Default for Shard<X, R> {
    fn default() -> Self {
        Shard {
            data: Mutex::new(ShardData {
                children: Slab::new(),
                link: None,
            }),
            _pad: [0; 64],
        }
    }
}

/// How a child reaches its parent: one per (parent, registry shard), shared by the children
/// linked in that shard, so that creating one does not write the parent (invariant 8).
struct Link<X, R> {
    parent: Arc<Node<X, R>>,
    shard: usize,
}

/// `Node::retire`: the node has a public handle (or is being dropped by its last one).
const LIVE: u8 = 0;
/// The last handle is gone but children are still linked: the last of them to unlink retires
/// the node.
const ORPHANED: u8 = 1;
/// Unlinked from its parent by a child's unlink (invariant 7).
const RETIRED: u8 = 2;
/// The bits of `Node::retire` that hold `LIVE`, `ORPHANED` or `RETIRED`.
const STATE_BITS: u8 = 3;
/// Flag in `Node::retire`: a registry shard exists (set by the first child of each shard).
const HAS_SHARDS: u8 = 4;

/// `Node::own`: the node is not a ticket of its parent (most nodes).
const OWN_NONE: u8 = 0;
/// `Node::own`: the node is a dispatched child of its parent, holding its own first unit (and
/// so one of the parent's), without a receipt yet (see [`new_child_dispatched`]).
const OWN_DISPATCHED: u8 = 1;
/// `Node::own`: its receipt was recorded by its owner.
const OWN_DONE: u8 = 2;
/// `Node::own`: a quarantine of an ancestor recorded its receipt.
const OWN_QUARANTINED: u8 = 3;
/// Flag in `Node::own`, beside `OWN_DONE` or `OWN_QUARANTINED`: the receipt's records are
/// written (set by the winner of the CAS once it counted the receipt, before it releases the
/// unit). Until then the receipt is in progress (see [`quarantine_subtree_noting`]).
const OWN_RECORDED: u8 = 4;

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
    /// as it becomes quiet ([`roll_up`], made where `R: Clone` is known: the release paths do
    /// not require it). Never changed.
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

    /// Whether this is a boundary child (see the module docs).
    pub(crate) fn is_boundary(&self) -> bool {
        self.boundary.is_some()
    }

    /// Number of live children (for tests of invariant 7).
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

/// Creates a child of `parent` and links it into the parent's registry.
///
/// Fails if the parent's watermark is closed: no live child ever sits under a cancelled or
/// closed parent. The check happens under the registry shard lock that `cancel` also takes
/// after setting `CANCELLED`, so either the child is linked before the cancel walks that shard
/// (and gets cancelled by it) or the creation sees the bit (invariant 1, 3).
pub(crate) fn new_child<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    link_child(parent, None, None, ext)
}

/// Creates a boundary child of `parent` (see the module docs: a request's scope under a
/// server's), linked as [`new_child`] links any child.
pub(crate) fn new_boundary_child<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    link_child(parent, None, Some(roll_up::<X, R>), ext)
}

/// Creates a child of `parent` that is also a registered and dispatched child (a ticket) of
/// `parent`, described by `info`: one node instead of a node and a ticket (a retry attempt).
///
/// The ticket is the child's first work unit, which, as every first unit of a node, holds a
/// unit of `parent`: the child is born with it (`STARTED`, one unit), so it is not quiet, and
/// a cancel of `parent` reaches it, until the ticket has its receipt — its work (the attempt
/// itself) is part of it, as the body of a Trio cancel scope is.
///
/// The unit of `parent` is taken by the CAS that requires an open watermark in the generation
/// the state word has, which is the dispatch CAS's condition (invariant 2, as for
/// [`register_task`]). The child is then linked only if the watermark is still open under the
/// registry shard lock (otherwise the unit is given back and the creation refused): a
/// quarantine, which walks the registry under the same locks after the watermark closed,
/// either finds the child linked, or took the lock first, and then the creation sees the
/// close and is refused. Its receipt is [`record_own_receipt`]'s or a quarantine's, decided
/// by one CAS of `Node::own` (invariant 5); it is counted in `parent` and its ancestors (the
/// ticket is `parent`'s child), and releases the child's unit, and so `parent`'s once the
/// child has no other.
///
/// The owner keeps a handle of the child until the receipt: a node with handles stays linked,
/// so that the parent's quarantine finds it (invariant 7).
pub(crate) fn new_child_dispatched<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    info: &R,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    link_child(parent, Some(info), None, ext)
}

// Always inlined: `own` is then a constant at each call site, and a plain child is built
// exactly as before (the node's parts written straight into its allocation).
#[inline(always)]
fn link_child<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    // Cloned into the node as it is built in its allocation (not moved in: a moved value
    // would make the node be assembled on the stack and copied).
    own: Option<&R>,
    boundary: Option<RollUp<X, R>>,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    if own.is_some() {
        // The ticket's unit, dispatched by its CAS (see `new_child_dispatched`). Taken before
        // the registry lock (a failed CAS may give back a unit of an ancestor and wake its
        // waiters, which happens under no lock).
        take_unit(parent)?;
    }
    let shard = shard_for_this_thread();
    let mut data = parent.registry[shard].get_or_init().data.lock();
    // The caller holds a handle of `parent`, so the parent has not dropped its links: no link
    // means the first child of this shard.
    let link = match &data.link {
        Some(link) => link.clone(),
        None => {
            // Announce the shard under `inner` before reading the state word: a cancel or
            // close that marks the parent under `inner` after this sees the shard and walks
            // it; one before it is seen by the state read below. (Without the lock,
            // "announce, load state" against "write state, load announcements" is the
            // store-buffering pattern, which acquire/release alone allows to miss both ways.)
            // Lock order: this node's shard, then its own `inner`; nothing takes them the
            // other way round.
            parent.inner.lock().shards_in_use |= 1 << shard;
            // Relaxed: read by the drop of the parent's last handle, which synchronizes with
            // this thread through the handle count.
            parent.retire.fetch_or(HAS_SHARDS, Ordering::Relaxed);
            let link = Arc::new(Link {
                parent: parent.clone(),
                shard,
            });
            data.link = Some(link.clone());
            link
        }
    };
    let state = parent.state();
    if state.is_closed() {
        drop(data);
        if own.is_some() {
            // Taken, but nothing was linked: nothing can have started.
            release_unit(parent);
        }
        return Err(refusal(parent, state));
    }
    let entry = data.children.vacant_entry();
    // A child starts at its parent's generation (so a ticket that recorded the parent's
    // generation compares equal), with its own flags clear.
    let key = entry.key();
    // A child that is a ticket is born with that ticket's unit (see `new_child_dispatched`).
    let units = if own.is_some() { 1 | STARTED } else { 0 };
    let child = arc_in_place(|| {
        Node::new(
            Some(link),
            key,
            state.generation() << GEN_SHIFT | units,
            ext(state),
            own.cloned(),
            boundary,
        )
    });
    entry.insert(child.clone());
    Ok(child)
}

fn refusal<X, R>(node: &Node<X, R>, state: State) -> Refused {
    if state.is_cancelled() {
        Refused::Cancelled(node.cause().unwrap_or(Cause::Cancelled { reason: None }))
    } else {
        Refused::Closed
    }
}

/// Another public handle to `node`.
pub(crate) fn add_handle<X, R>(node: &Node<X, R>) {
    // Relaxed: a new handle can only be made from an existing one, which keeps the count > 0.
    node.handles.fetch_add(1, Ordering::Relaxed);
}

/// Drops a public handle. When the last one goes, the node retires (`gone` is called with it
/// and it is unlinked from its parent) if it has no linked child; otherwise it is marked
/// orphaned and the last child to unlink retires it (invariant 7). A retiring child may so
/// retire its orphaned parent, and so on up.
///
/// A node whose handles are all dropped stays linked while it has a linked child: otherwise a
/// cancel of an ancestor could not reach that child any more (invariant 1).
pub(crate) fn drop_handle<X, R>(node: &Node<X, R>, mut gone: impl FnMut(&Node<X, R>)) {
    // Acquire: sees every write made through the other handles, whose drops (Release) made
    // the count 1. With the count at 1 the caller's handle is the only one, and a handle is
    // only made from a handle, so nobody can raise it again: no read-modify-write is needed.
    if node.handles.load(Ordering::Acquire) == 1 {
        node.handles.store(0, Ordering::Relaxed);
    } else if node.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    if !orphan_if_parent(node) {
        retire(node, &mut gone);
    }
}

/// For a node that just lost its last handle (so no child can be added any more): drops its
/// links, and marks it orphaned if it still has children. Decided under all of its shard locks
/// at once, so that no child unlinks in between: either no child is left (the caller retires
/// the node), or the node is marked orphaned before any of them can look.
fn orphan_if_parent<X, R>(node: &Node<X, R>) -> bool {
    if node.retire.load(Ordering::Relaxed) & HAS_SHARDS == 0 {
        // Never had a child (most nodes). Relaxed: the bit was set through a handle, whose
        // drop (Release) the caller's handle count (Acquire) synchronized with.
        return false;
    }
    let mut links: [Option<Arc<Link<X, R>>>; SHARDS] = Default::default();
    let orphaned = {
        // Every shard that exists: none can be created any more (that takes a handle).
        let mut shards: [_; SHARDS] =
            std::array::from_fn(|i| node.registry[i].get().map(|s| s.data.lock()));
        for (shard, link) in shards.iter_mut().zip(links.iter_mut()) {
            if let Some(shard) = shard {
                // Break the parent-link cycle (invariant 8): links now live as long as the
                // children that hold them.
                *link = shard.link.take();
            }
        }
        let orphaned = shards.iter().flatten().any(|s| !s.children.is_empty());
        if orphaned {
            // Relaxed: read only under one of these locks, or by the CAS in `retire`.
            node.retire.fetch_or(ORPHANED, Ordering::Relaxed);
        }
        orphaned
    };
    // Dropped with no lock held. The last link may hold the last reference the node has on
    // itself through them; the caller still holds `node`.
    drop(links);
    orphaned
}

/// Unlinks a retired node from its parent; if that was the last child of an orphaned parent,
/// retires the parent too, and so on up.
fn retire<X, R>(node: &Node<X, R>, gone: &mut impl FnMut(&Node<X, R>)) {
    let mut n = node;
    // Every ancestor stays alive while `node` does (each node holds a link, which holds its
    // parent), and the caller holds `node`.
    loop {
        gone(n);
        let Some(link) = &n.up else { return };
        let parent = &*link.parent;
        // The parent has this shard: `n` is in it.
        let Some(shard) = parent.registry[link.shard].get() else {
            return;
        };
        let (removed, last) = {
            let mut data = shard.data.lock();
            let removed = data.children.try_remove(n.key);
            let last = data.children.is_empty()
                && parent.retire.load(Ordering::Relaxed) & STATE_BITS == ORPHANED;
            (removed, last)
        };
        // The slab's `Arc` of `n` is dropped with no lock held.
        drop(removed);
        if !last || !all_shards_empty(parent) {
            return;
        }
        // Orphaned and childless: of the children that found it so, one retires it. AcqRel:
        // the winner sees the other unlinks (also ordered by the shard locks).
        let retired = parent
            .retire
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
                (r & STATE_BITS == ORPHANED).then_some((r & !STATE_BITS) | RETIRED)
            });
        if retired.is_err() {
            return;
        }
        n = parent;
    }
}

/// Whether no shard has a child, looking at one shard at a time (used once the node has no
/// handle, when children can only leave).
fn all_shards_empty<X, R>(node: &Node<X, R>) -> bool {
    node.shards().all(|s| s.data.lock().children.is_empty())
}

/// Cancels `node` and every descendant that is not quiet yet. Returns whether this call did
/// it (first cause wins; a node that already completed — quiet without a cancel — is left as
/// it is, with its subtree, and so is a quiet closed descendant: invariants 1 and 6).
///
/// Every call returns only once every such descendant is cancelled, also one that lost the race
/// for the first cause: a node found already cancelled is still walked, with its own cause,
/// because whoever cancelled it may not have reached its children yet (invariants 1 and 2:
/// otherwise work could be dispatched below after this call returned). A repeated cancel of a
/// large subtree therefore costs a walk of it.
///
/// `stamp` is the caller's clock reading, recorded as the cancel time of every node reached.
pub(crate) fn cancel<X, R>(node: &Arc<Node<X, R>>, cause: Cause, stamp: u64) -> bool {
    cancel_then(node, cause, stamp, || ()).0
}

/// [`cancel`], and `then` once the whole subtree is cancelled, before the `on_cancel`
/// callbacks run (a panicking callback, resumed after all of them ran, cannot skip `then`).
///
/// A waker that panics when woken does not stop the walk either: its panic is kept (see
/// [`Caught`]) and resumed at the very end. If several wakers or callbacks panic, the first
/// panic comes out.
fn cancel_then<X, R, T>(
    node: &Arc<Node<X, R>>,
    cause: Cause,
    stamp: u64,
    then: impl FnOnce() -> T,
) -> (bool, T) {
    let mut due = Due::default();
    let mut first = None;
    let marked = mark_cancelled(node, &cause, stamp, &mut due, &mut first);
    due.wake();
    if marked.in_use == 0 {
        // A leaf (or a completed node): nothing to walk.
        due.hand_over(node, marked.busy);
        let out = then();
        due.finish();
        return (marked.did, out);
    }
    // The cause of everything below: the same `ParentCancelled` for the whole walk, except
    // under a node that someone else had cancelled first (its own cause wins below it).
    let below = first.take().as_ref().unwrap_or(&cause).for_child();
    let mut walk = CancelWalk {
        stamp,
        due,
        first,
        work: vec![Walk {
            node: node.clone(),
            own: None,
            in_use: usize::from(marked.in_use),
        }],
    };
    while let Some(Walk {
        node: n,
        own,
        in_use,
    }) = walk.work.pop()
    {
        walk.children(&below, &n, &own, in_use as u8, 0);
        // Wakers run with no lock held.
        walk.due.wake();
    }
    walk.due.hand_over(node, marked.busy);
    let out = then();
    // Callbacks run once the whole subtree is cancelled, so a panicking one cannot leave part
    // of it running (invariants 1, 2); the first panic (of a waker or a callback) is resumed
    // after all of them ran.
    walk.due.finish();
    (marked.did, out)
}

/// `node` was just cancelled while it had work, and the cancel has reached its whole subtree:
/// its grace period now counts, also for a `quiesce()` waiting on an ancestor (which
/// quarantines the work below a cancelled scope once its grace period ends, or that of a
/// cancelled scope between, whichever ends first). Hands `node` to each of those waits
/// ([`QuietWaiter::hand`]; the node's own waits, and those of every busy scope the walk
/// cancelled, get theirs from [`Due::hand_over`]), which look through its subtree once (for
/// scopes below with a shorter grace period) instead of through theirs again, and collects
/// their wakers (they stay registered). One ancestor's `inner` at a time, with no other lock
/// held.
///
/// Nothing is missed: a waiting `quiesce()` registers under its node's `inner` before it
/// first looks through its subtree, and is handed every later cancel. If this takes that
/// lock before the registration, the cancel walk (done before) happens-before the look,
/// which finds it all; otherwise this hands it over, and the look of `node`'s subtree comes
/// after the walk as well. A `quiesce()` of a scope that a walk still under way has marked
/// (its own cancel, or an ancestor's) is handed nothing if it registered after the mark: its
/// look meets scopes that walk has not reached yet (neither cancelled nor quiet, below a
/// cancelled one) and registers on each, so that each is handed to it (as a busy scope with
/// a waiter, by [`Due::hand_over`]) once the walk is done. (loom models in `loom_handover`.)
fn hand_over<X, R>(node: &Arc<Node<X, R>>, wakers: &mut Vec<Waker>) {
    let mut n = node.parent_node();
    while let Some(p) = n {
        hand_to_waiters_of(p, node, wakers);
        n = p.parent_node();
    }
}

/// Hands `node` to every `quiesce()` waiting on `waited` (`node` itself or an ancestor) and
/// collects their wakers, under `waited`'s `inner`.
fn hand_to_waiters_of<X, R>(waited: &Node<X, R>, node: &Arc<Node<X, R>>, wakers: &mut Vec<Waker>) {
    if let Some(lists) = waited.inner.lock().lists.as_mut() {
        wakers.extend(lists.quiet_waiters.iter_mut().map(|(_, w)| w.hand(node)));
    }
}

/// Clones the children of `node` onto `work`, one registry shard lock at a time.
pub(crate) fn push_children<X, R>(node: &Node<X, R>, work: &mut Vec<Arc<Node<X, R>>>) {
    for shard in node.shards() {
        let data = shard.data.lock();
        work.extend(data.children.iter().map(|(_, c)| c.clone()));
    }
}

/// How deep the cancel walk descends while holding the registry locks of the way down: a node
/// met within this depth is walked at once, with no reference count taken on it; deeper ones
/// go on the work list (so a deep tree costs no deep stack).
#[cfg(not(loom))]
const HELD_DEPTH: usize = 32;

/// Under loom: 1, so that the models' shallow trees (a root, a child, a grandchild) take both
/// ways of walking — a child walked holding its parent's shard, a grandchild's parent taken
/// from the work list with the cause it passes on (`Walk::own`).
#[cfg(loom)]
const HELD_DEPTH: usize = 1;

/// A node the cancel walk has still to visit. Every field is a word (no byte fields, no
/// `Cause` by value): items are moved in and out of a vector, and mixed-width copies cost
/// store-forwarding stalls.
struct Walk<X, R> {
    node: Arc<Node<X, R>>,
    /// The origin of its children's cause, if not the one of `below`.
    own: Option<Shared<Cause>>,
    in_use: usize,
}

/// The state of one cancel's walk below the cancelled node.
struct CancelWalk<X, R> {
    stamp: u64,
    due: Due<X, R>,
    /// Out-parameter of [`mark_cancelled`].
    first: Option<Cause>,
    work: Vec<Walk<X, R>>,
}

impl<X, R> CancelWalk<X, R> {
    /// Marks the children of `n` (its shards `in_use`) with `below` (or `own`'s cause, see
    /// [`Walk`]) and, within [`HELD_DEPTH`], their subtrees, holding the registry lock of each
    /// node on the way. Lock order: a node's shard, then a child's `inner`, then the child's
    /// shards — always downwards, as everything else that takes two of them (`new_child`
    /// takes one node's shard, then its own `inner`). Wakers and callbacks are only
    /// collected: they run once no lock is held.
    fn children(
        &mut self,
        below: &Cause,
        n: &Node<X, R>,
        own: &Option<Shared<Cause>>,
        in_use: u8,
        depth: usize,
    ) {
        let own_cause;
        let child_cause = match own {
            Some(origin) => {
                own_cause = Cause::ParentCancelled(origin.clone());
                &own_cause
            }
            None => below,
        };
        for shard in n.shards_in(in_use) {
            let data = shard.data.lock();
            for (_, child) in data.children.iter() {
                let marked = mark_cancelled(
                    child,
                    child_cause,
                    self.stamp,
                    &mut self.due,
                    &mut self.first,
                );
                let first = self.first.take();
                if marked.in_use == 0 {
                    // Only nodes that ever had children are walked.
                    continue;
                }
                // Below a node someone else cancelled first, its cause holds at every depth
                // (invariant 1): a child this walk marked passes on the cause it got.
                let own = match first {
                    Some(existing) => Some(existing.origin_shared()),
                    None => own.clone(),
                };
                if depth < HELD_DEPTH {
                    self.children(below, child, &own, marked.in_use, depth + 1);
                } else {
                    self.work.push(Walk {
                        node: child.clone(),
                        own,
                        in_use: usize::from(marked.in_use),
                    });
                }
            }
        }
    }
}

/// Wakers and callbacks collected under locks, run after they are released.
struct Due<X, R> {
    wakers: Vec<Waker>,
    /// Scopes this cancel cancelled while busy that have waiting `quiesce()`s: they are
    /// handed to those once the whole walk is done ([`Due::hand_over`]).
    quiet: Vec<Arc<Node<X, R>>>,
    callbacks: Vec<(Callback, Cause)>,
    /// The first panic of a waker or callback, resumed by [`Due::finish`].
    caught: Caught,
}

impl<X, R> Default for Due<X, R> {
    fn default() -> Self {
        Due {
            wakers: Vec::new(),
            quiet: Vec::new(),
            callbacks: Vec::new(),
            caught: Caught::default(),
        }
    }
}

impl<X, R> Due<X, R> {
    /// Wakes the wakers collected so far; a panic is kept for [`Due::finish`], so that the
    /// walk goes on.
    fn wake(&mut self) {
        for w in self.wakers.drain(..) {
            self.caught.wake(w);
        }
    }

    /// Once the cancel walk from `top` is done: hands each scope in `quiet` to its own
    /// waiting `quiesce()`s, and `top`, if `busy`, to those of its ancestors (see
    /// [`hand_over`]), then wakes them all. After the walk, so that a `quiesce()` that looks
    /// through a handed scope's subtree finds it all cancelled, with the grace periods of its
    /// scopes (also when it is polled during the walk for another reason: it is handed
    /// nothing before). One that registered after its scope's mark is not handed it, and
    /// waits on the scopes below that the walk has not reached yet (see [`hand_over`]).
    fn hand_over(&mut self, top: &Arc<Node<X, R>>, busy: bool) {
        for n in self.quiet.drain(..) {
            hand_to_waiters_of(&n, &n, &mut self.wakers);
        }
        if busy {
            hand_over(top, &mut self.wakers);
        }
        self.wake();
    }

    /// Runs the callbacks, once the whole walk is done, then resumes the first panic of a
    /// waker or callback (each of them ran).
    fn finish(&mut self) {
        for (cb, cause) in self.callbacks.drain(..) {
            self.caught.run(move || cb(&cause));
        }
        std::mem::take(&mut self.caught).resume();
    }
}

/// What [`mark_cancelled`] did (returned in registers).
#[derive(Clone, Copy)]
struct Marked {
    /// This call cancelled the node.
    did: bool,
    /// This call cancelled it while it had work (it is not quiet: its grace period counts).
    busy: bool,
    /// The registry shards to walk (read under `inner`, see `new_child`).
    in_use: u8,
}

/// Cancels one node (not its children) unless it already is. If someone else cancelled it
/// first, their cause is put in `first` (it holds for the node's children).
fn mark_cancelled<X, R>(
    n: &Arc<Node<X, R>>,
    cause: &Cause,
    stamp: u64,
    due: &mut Due<X, R>,
    first: &mut Option<Cause>,
) -> Marked {
    let mut inner = n.inner.lock();
    let walk = inner.shards_in_use;
    if let Some(existing) = &inner.cause {
        // Invariant 1: someone else cancelled it; its cause wins here and below. It may still
        // be walking below, so the caller walks too; its wakers and callbacks are its own.
        *first = Some(existing.clone());
        return Marked {
            did: false,
            busy: false,
            in_use: walk,
        };
    }
    // Invariant 2: one RMW sets CANCELLED|CLOSED and bumps the generation. AcqRel: Release
    // publishes the cause (written below, before the lock is released; readers take the lock)
    // to `is_cancelled` readers; Acquire orders this after every dispatch CAS that came before
    // it. Invariant 6: a node already quiet without a cancel has completed; the update is
    // refused and neither it nor its (quiet) subtree changes.
    let Ok(prev) = n
        .state
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            (!State(s).is_quiet()).then_some((s | CLOSED | CANCELLED).wrapping_add(GEN_ONE))
        })
    else {
        return Marked {
            did: false,
            busy: false,
            in_use: 0,
        };
    };
    let prev = State(prev);
    inner.cause = Some(cause.clone());
    inner.cancelled_at = stamp;
    due.wakers.extend(inner.first_waiter.take());
    if let Some(in_flight) = n.in_flight.get() {
        // Spawned tasks waiting in this node (see `poll_cancel_task`). Lock order: `inner`,
        // then an in-flight shard, a leaf lock.
        in_flight.cancel(&mut due.wakers);
    }
    let mut gone = Vec::new();
    if let Some(lists) = inner.lists.as_mut() {
        due.wakers.extend(lists.cancel_waiters.drain());
        due.callbacks
            .extend(lists.callbacks.drain().map(|cb| (cb, cause.clone())));
        if prev.active() == 0 {
            for w in lists.quiet_waiters.drain() {
                due.wakers.push(w.waker);
                // The scopes it was handed (weak) are dropped once this node's lock is released.
                gone.push(w.cancelled);
            }
        } else if !lists.quiet_waiters.is_empty() {
            // Not quiet yet, but a waiting `quiesce()` must learn of the cancel to start its
            // grace period: it is handed the node (it stays registered) once the whole
            // cancel walk is done.
            due.quiet.push(n.clone());
        }
    }
    drop(inner);
    drop(gone);
    Marked {
        did: true,
        busy: prev.active() != 0,
        in_use: walk,
    }
}

/// Closes the registration watermark of `node` and its descendants without cancelling.
pub(crate) fn close<X, R>(node: &Arc<Node<X, R>>) {
    // The panic of a `quiesce()`'s waker comes out once the whole subtree is closed.
    let mut caught = Caught::default();
    let mut work = vec![node.clone()];
    while let Some(n) = work.pop() {
        // AcqRel: pairs with `take_unit`'s CAS (which fails once this is visible) and with
        // `release_unit`'s decrement (one of the two sees the other and wakes quiesce waiters).
        let prev = State(n.state.fetch_or(CLOSED, Ordering::AcqRel));
        if !prev.is_closed() && prev.active() == 0 {
            wake_quiet(&n, &mut caught);
        }
        // Walked even if it was closed already: whoever closed it may not have reached its
        // descendants yet, and a `close()` that returns leaves the whole subtree closed
        // (invariant 3; loom model 22).
        // Under `inner`: pairs with the announcement of a shard in `new_child`.
        let in_use = n.inner.lock().shards_in_use;
        for shard in n.shards_in(in_use) {
            let data = shard.data.lock();
            work.extend(data.children.iter().map(|(_, c)| c.clone()));
        }
    }
    caught.resume();
}

/// Closes the registration watermark of `node` alone, not its descendants' (a server that stops
/// admitting, see the module docs): returns the state before. Its children keep theirs; one
/// with no unit can take none any more (its first needs one of `node`'s, invariant 3), so
/// `node` is quiet, for good, once its children's units are gone (invariant 6).
pub(crate) fn close_own<X, R>(node: &Node<X, R>) -> State {
    let mut caught = Caught::default();
    // AcqRel: as `close`.
    let prev = State(node.state.fetch_or(CLOSED, Ordering::AcqRel));
    if !prev.is_closed() && prev.active() == 0 {
        wake_quiet(node, &mut caught);
    }
    caught.resume();
    prev
}

/// Wakes the `quiesce()`s of `node`, which became quiet (a panic is kept in `caught`).
fn wake_quiet<X, R>(node: &Node<X, R>, caught: &mut Caught) {
    let waiters = node.inner.lock().take_quiet_waiters();
    for w in waiters {
        caught.wake(w.waker);
    }
}

/// Takes one work unit in `node` (a ticket, a guard). Fails once the watermark is closed
/// (invariant 3). A node going from 0 to 1 units first takes a unit of its parent.
///
/// Returns the generation the unit was taken in: the one of the state word the successful
/// CAS replaced (a cancel right after it bumps the generation, and must not be attributed to
/// this registration).
pub(crate) fn take_unit<X, R>(node: &Node<X, R>) -> Result<u64, Refused> {
    loop {
        let s = node.state();
        if s.is_closed() {
            return Err(refusal(node, s));
        }
        if s.active() == ACTIVE_MASK {
            // Four billion live units in one scope: refuse rather than overflow into CLOSED.
            return Err(Refused::Closed);
        }
        let need_parent = s.active() == 0;
        if need_parent {
            if let Some(p) = node.parent_node() {
                take_unit(p)?;
            }
        }
        // AcqRel: Acquire pairs with close/cancel (we fail if they came first); Release makes
        // the registration visible to a quiesce that reads the count afterwards.
        match node.state.compare_exchange(
            s.0,
            (s.0 + 1) | STARTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Ok(s.generation()),
            Err(_) => {
                if need_parent {
                    if let Some(p) = node.parent_node() {
                        release_unit(p);
                    }
                }
            }
        }
    }
}

/// Gives back a unit taken with [`take_unit`]; wakes quiesce waiters when the node becomes quiet
/// and passes the release up when the node becomes idle.
///
/// Inlined, with the rest out of line: most releases leave other units in the node, and a
/// bigger body here (the panic bookkeeping of the rest) made the compiler stop inlining the
/// callers' own hot paths.
#[inline]
pub(crate) fn release_unit<X, R>(node: &Node<X, R>) {
    let prev = give_back(node);
    if prev.active() == 1 {
        went_idle_then_resume(node, prev);
    }
}

/// [`release_unit`], keeping the panic of a `quiesce()`'s waker in `caught` (for a step that
/// releases several units, a quarantine, and must go on to its end).
fn release_unit_caught<X, R>(node: &Node<X, R>, caught: &mut Caught) {
    let prev = give_back(node);
    if prev.active() == 1 {
        went_idle(node, prev, caught);
    }
}

/// Takes one unit off `n`'s count; returns the state before.
#[inline]
fn give_back<X, R>(n: &Node<X, R>) -> State {
    // AcqRel: Release publishes the receipt counted before this release to whoever observes
    // quiet (invariant 6); Acquire sees a concurrent close so exactly one side wakes.
    let prev = State(n.state.fetch_sub(1, Ordering::AcqRel));
    debug_assert!(prev.active() > 0, "unit released twice");
    prev
}

/// [`went_idle`], then the panic of a `quiesce()`'s waker comes out, once every release up
/// the tree is done.
#[inline(never)]
fn went_idle_then_resume<X, R>(node: &Node<X, R>, prev: State) {
    let mut caught = Caught::default();
    went_idle(node, prev, &mut caught);
    caught.resume();
}

/// `node` just gave back its last unit (`prev`: its state before): wakes its `quiesce()`s if
/// it is closed (now quiet), and gives back its unit in its parent, and so on up while each
/// node becomes idle. A waker's panic is kept in `caught`.
fn went_idle<X, R>(node: &Node<X, R>, prev: State, caught: &mut Caught) {
    let (mut n, mut prev) = (node, prev);
    loop {
        if prev.is_closed() {
            wake_quiet(n, caught);
        }
        let Some(p) = n.parent_node() else {
            return;
        };
        if let Some(roll_up) = n.boundary {
            if p.state().is_closed() {
                // Idle while its parent is closed, so for good: its report goes into the
                // parent's before the parent's unit does (see the module docs).
                roll_up(n, p);
            }
        }
        prev = give_back(p);
        if prev.active() != 1 {
            return;
        }
        n = p;
    }
}

/// Adds the counts and records of `node`, a boundary child that just gave back its last unit
/// (so for good), to those of its parent `p`, which is closed, and counts it there (see the
/// module docs). Called before
/// `node` gives back its unit of `p`, so before `p` can be quiet: `p`'s report has it
/// (invariant 6). The parent's counts and records are its own from then on (a cancel of the
/// parent stamps them as any other's).
fn roll_up<X, R: Clone>(node: &Node<X, R>, p: &Node<X, R>) {
    if let Some(c) = node.counts.get() {
        let into = p.counts.get_or_init();
        let shard = shard_for_this_thread();
        for kind in [
            Kind::Succeeded,
            Kind::Failed,
            Kind::Cancelled,
            Kind::Quarantined,
            Kind::EffectUnknown,
        ] {
            let n = c.get(kind);
            if n != 0 {
                into.by_kind[shard].kinds[kind as usize].fetch_add(n, Ordering::AcqRel);
            }
        }
        into.orphan_nanos
            .fetch_add(c.orphan_nanos(), Ordering::AcqRel);
        into.last_stamp.fetch_max(c.last_stamp(), Ordering::AcqRel);
    }
    // Copied out first: one node's lock at a time.
    let (effects, quarantined) = node.with_records(|r| (r.effects.clone(), r.quarantined.clone()));
    let by_parent =
        p.state().is_cancelled() && matches!(node.cause(), Some(Cause::ParentCancelled(_)));
    let mut into = p.records.get_or_init().lock();
    into.effects.extend(effects);
    into.quarantined.extend(quarantined);
    into.rolled_up += 1;
    into.rolled_up_cancelled += u64::from(by_parent);
}

/// The dispatch compare-and-swap (invariant 2): succeeds only if `node`'s generation is still
/// `seen` and its watermark is open. A successful CAS writes the same value back, which puts it
/// in the modification order of the state word relative to every cancel.
pub(crate) fn dispatch<X, R>(node: &Node<X, R>, seen: u64) -> Result<(), Refused> {
    let mut s = node.state();
    loop {
        if s.is_cancelled() || s.is_closed() {
            return Err(refusal(node, s));
        }
        if s.generation() != seen {
            return Err(Refused::StaleGeneration);
        }
        // AcqRel: Release so a later cancel (which Acquires) happens-after this dispatch and
        // reaches whatever the dispatcher set up before it.
        match node
            .state
            .compare_exchange_weak(s.0, s.0, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Ok(()),
            Err(actual) => s = State(actual),
        }
    }
}

/// Registers a ticket: takes a unit and lists the ticket as in flight.
pub(crate) fn register<X, R>(
    node: &Node<X, R>,
    make: impl FnOnce(usize, u64) -> TicketCell<R>,
) -> Result<Arc<TicketCell<R>>, Refused> {
    let generation = take_unit(node)?;
    list_in_flight(node, generation, make)
}

/// Lists a ticket whose unit was just taken, in `generation`, as in flight. `make` gets the
/// ticket's key (its in-flight shard and slot).
///
/// Refused if a quarantine took the node's in-flight list since the unit was taken (see
/// `InFlight::list_ticket`): the unit is given back with no receipt (no one saw the ticket),
/// which may make the node quiet.
fn list_in_flight<X, R>(
    node: &Node<X, R>,
    generation: u64,
    make: impl FnOnce(usize, u64) -> TicketCell<R>,
) -> Result<Arc<TicketCell<R>>, Refused> {
    match node
        .in_flight
        .get_or_init()
        .list_ticket(|key| make(key, generation))
    {
        Some(cell) => Ok(cell),
        None => {
            // Built before the unit goes back (a quiet node's state is what the caller sees
            // from then on anyway); no tree lock is held here.
            let refused = refusal(node, node.state());
            release_unit(node);
            Err(refused)
        }
    }
}

/// Registers a spawned task: takes a unit and counts the task as in flight, unlisted (it is
/// listed, with its waker, when it first returns `Pending`: see [`poll_cancel_task`]; most
/// tasks end at their first poll and never take an in-flight lock).
///
/// The unit CAS requires an open watermark in the generation the state word has, which is the
/// dispatch CAS's condition (invariant 2): a task registered here is dispatched by the same
/// CAS, with no second RMW of the state word. In the word's modification order that CAS comes
/// before any cancel of this node (whose RMW sets `CLOSED`), and the cancel, which walks down
/// to this node through its linked ancestors, then marks its in-flight list, which the task
/// reads before each poll of its work ([`task_cancelled`]) and after it lists itself (see
/// [`poll_cancel_task`]).
///
/// The in-flight list exists before the unit CAS: a cancel whose RMW comes after that CAS in
/// the word's modification order synchronizes with it, so it finds the list, marks it and
/// wakes whatever task is waiting in it (see [`poll_cancel_task`]).
///
/// The task is counted after its unit is taken (a quarantine that takes the count releases
/// the units of the tasks in it, see `InFlight::take_for_quarantine`), so that a task that is
/// refused never appears in the count.
pub(crate) fn register_task<X, R>(node: &Node<X, R>) -> Result<TaskKey, Refused> {
    // Keep this order: the list must exist before the unit CAS (see above). loom cannot check
    // it (`LazyBox` is eager under loom).
    let in_flight = node.in_flight.get_or_init();
    take_unit(node)?;
    Ok(in_flight.add_task())
}

/// Records the receipt of a task of `node`, unless a quarantine took it first (then returns
/// `false`): counted in `node` and every ancestor before the unit is released (invariants 5, 6).
pub(crate) fn record_task_receipt<X, R: Clone>(
    node: &Node<X, R>,
    task: TaskKey,
    kind: Kind,
    ran: bool,
    clock: impl Fn() -> u64,
) -> bool {
    record_task_receipt_and(node, task, kind, ran, clock, || ())
}

/// [`record_task_receipt`], running `won` once the receipt is the task's (a quarantine did not
/// take the task first) and before it is counted and its unit released: what the scope layer
/// attaches to the report with the receipt (a failure's error) then makes it into the report,
/// and never into one made after quiet (invariant 6). `won` must not take a tree lock.
pub(crate) fn record_task_receipt_and<X, R: Clone>(
    node: &Node<X, R>,
    task: TaskKey,
    kind: Kind,
    ran: bool,
    clock: impl Fn() -> u64,
    won: impl FnOnce(),
) -> bool {
    let listed = node.in_flight.get().is_some_and(|f| f.unlist_task(task));
    if listed {
        won();
        count_receipt(node, kind, &[], ran.then_some(0), &clock);
        release_unit(node);
    }
    listed
}

/// Whether the cancel of `node` has reached its tasks: what a task listed in flight in `node`
/// checks before each poll of its work (invariant 2).
///
/// Not the state word, which every spawn and receipt of the node writes (from a worker
/// thread, reading it is a cache miss per poll), but the in-flight list's mark, which only a
/// cancel writes. It is as good: the task's registration CAS came before any cancel that
/// marks the state word after it, and the list existed before that CAS, so that cancel finds
/// the list and marks it ([`mark_cancelled`]); a poll that comes after the cancel sees the
/// mark (Release/Acquire).
pub(crate) fn task_cancelled<X, R>(node: &Node<X, R>) -> bool {
    node.in_flight.get().is_some_and(InFlight::is_cancelled)
}

/// Polls for the cancel of `node` on behalf of `task`, in flight in `node`, whose work just
/// returned `Pending`: returns `true` if the cancel has reached the task's list, or a
/// quarantine took the task; otherwise keeps `waker` in the task's entry, where the cancel
/// finds it, and returns `false`. On the task's first `Pending` this lists it (one lock for
/// the entry and the waker) and updates `task` to its entry.
///
/// No lock of the node itself is taken, nor its state word read (every spawn and receipt of
/// the node writes that word, so from a worker thread reading it is a cache miss): the node's
/// cancel ([`mark_cancelled`], after its RMW of the state word) marks the in-flight list
/// cancelled and then wakes the waker of every listed task. No wake-up is lost: the entry's
/// shard lock orders this poll against that walk. If the walk took the lock first, the mark
/// was set before it, and the load below sees it; otherwise the walk finds the waker. This
/// holds for the first `Pending` too, which lists the task under that lock: until then the
/// task was not waiting (it was in its first poll, or about to be polled, and then sees the
/// mark in [`task_cancelled`]), so the walk had nothing to wake. A quarantine takes the task
/// out of the list (or out of the unlisted count) and wakes it if listed; this then returns
/// `true`.
pub(crate) fn poll_cancel_task<X, R>(node: &Node<X, R>, task: &mut TaskKey, waker: &Waker) -> bool {
    let Some(in_flight) = node.in_flight.get() else {
        unreachable!("a task is in flight");
    };
    if !in_flight.set_task_waker(task, waker) {
        // Quarantined (usually after a cancel, but it may overtake the cancel walk): it stops.
        return true;
    }
    in_flight.is_cancelled()
}

/// Registers a shielded cleanup: like [`register`], but allowed after the watermark closed as
/// long as the node is not quiet (it has units). Taking a unit where there are units already
/// needs no parent unit and cannot break a quiescence that has not been reached (invariant 6).
pub(crate) fn register_shielded<X, R>(
    node: &Node<X, R>,
    make: impl FnOnce(usize, u64) -> TicketCell<R>,
) -> Result<Arc<TicketCell<R>>, Refused> {
    let generation = take_unit_while_busy(node, false)?;
    list_in_flight(node, generation, make)
}

/// Takes a unit of `node` as [`take_unit`] does while its watermark is open; once it is closed,
/// only while the node is not quiet (it has units: work it already has is still running, and
/// the new unit is part of that work), and not at all once it is cancelled if
/// `refuse_cancelled`. Taking a unit where there are units already needs no parent unit and
/// cannot break a quiescence that has not been reached (invariant 6). Returns the generation
/// the unit was taken in.
pub(crate) fn take_unit_while_busy<X, R>(
    node: &Node<X, R>,
    refuse_cancelled: bool,
) -> Result<u64, Refused> {
    loop {
        let s = node.state();
        if !s.is_closed() {
            match take_unit(node) {
                // Closed (or cancelled) since the read: decide again, as a closed node.
                Err(_) if node.state().is_closed() => continue,
                taken => return taken,
            }
        }
        if (refuse_cancelled && s.is_cancelled()) || s.active() == 0 || s.active() == ACTIVE_MASK {
            return Err(refusal(node, s));
        }
        if node
            .state
            .compare_exchange(s.0, s.0 + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Ok(s.generation());
        }
    }
}

/// Records the receipt of a ticket of `node` (only the winner of the ticket's state CAS calls
/// this), counting it in `node` and every ancestor before releasing the unit (invariant 5, 6).
/// `records`: what the receipt lists (an unknown effect; the unknown effects of a shielded
/// cleanup's own scope).
pub(crate) fn record_receipt<X, R: Clone>(
    node: &Node<X, R>,
    cell: &TicketCell<R>,
    kind: Kind,
    records: &[R],
    ran: bool,
    clock: impl Fn() -> u64,
) {
    let ran = ran.then(|| cell.started());
    count_receipt(node, kind, records, ran, &clock);
    if let Some(in_flight) = node.in_flight.get() {
        in_flight.unlist_ticket(cell.key());
    }
    release_unit(node);
}

/// Records the receipt of `node`'s own ticket (a child made by [`new_child_dispatched`]),
/// unless a quarantine recorded one first (see [`end_own`]). `record`: what the receipt lists
/// (an unknown effect).
pub(crate) fn record_own_receipt<X, R: Clone>(
    node: &Node<X, R>,
    kind: Kind,
    record: Option<&R>,
    clock: impl Fn() -> u64,
) {
    end_own(node, OWN_DONE, kind, record, &clock, None);
}

/// Ends `node`'s own ticket (see [`new_child_dispatched`]) as `to` (`OWN_DONE`: its owner's
/// receipt; `OWN_QUARANTINED`: a quarantine's), unless the other got there first: one CAS
/// decides (invariant 5). The receipt is counted in the parent and every ancestor, and noted
/// in `node` itself if it was cancelled (its quiet may come with this end, and its "time from
/// cancel to quiet" runs to it); then the ticket's unit of `node` is released, and so the
/// parent's if it was `node`'s last (invariant 6). Returns whether this call ended it.
///
/// `caught`: where a quarantine keeps the panic of a `quiesce()` waker that the release
/// wakes; `None` (the owner's receipt) resumes it at once, once the release is done (and
/// keeps the owner's path what it was: an inlined [`release_unit`]).
fn end_own<X, R: Clone>(
    node: &Node<X, R>,
    to: u8,
    kind: Kind,
    record: Option<&R>,
    clock: &dyn Fn() -> u64,
    caught: Option<&mut Caught>,
) -> bool {
    // AcqRel: the winner of this CAS (the owner's or the quarantine's) is the one receipt.
    if node
        .own
        .compare_exchange(OWN_DISPATCHED, to, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    let Some(parent) = node.parent_node() else {
        unreachable!("a node that is a ticket has a parent");
    };
    let records = record.map_or(&[][..], std::slice::from_ref);
    count_receipt(parent, kind, records, Some(0), clock);
    if node.state().is_cancelled() {
        node.counts
            .get_or_init()
            .last_stamp
            .fetch_max(clock(), Ordering::AcqRel);
    }
    // Release: a quarantine that reads the flag (Acquire) then finds the records written
    // (see `own_in_progress`). Only the CAS's winner writes `own` from here on.
    node.own.store(to | OWN_RECORDED, Ordering::Release);
    match caught {
        Some(caught) => release_unit_caught(node, caught),
        None => release_unit(node),
    }
    true
}

/// Whether `node`'s own ticket (see [`new_child_dispatched`]) was quarantined.
pub(crate) fn own_quarantined<X, R>(node: &Node<X, R>) -> bool {
    node.own.load(Ordering::Acquire) & !OWN_RECORDED == OWN_QUARANTINED
}

/// What `node` is as a ticket of its parent (see [`new_child_dispatched`]).
pub(crate) fn own_info<X, R>(node: &Node<X, R>) -> Option<&R> {
    node.own_info.as_ref()
}

/// Counts a receipt in `node` and its ancestors. The clock is read only if one of them is
/// cancelled: the stamps serve "time from cancel to quiet" and orphan work, which only
/// receipts after a cancel contribute to. `ran`: `None` if the child never ran (it was not
/// dispatched), else the stamp it started at if that may be after a cancel (a shielded
/// cleanup), 0 if not: its orphan work in a cancelled node runs from the later of that and
/// the node's cancel to the receipt.
fn count_receipt<X, R: Clone>(
    node: &Node<X, R>,
    kind: Kind,
    records: &[R],
    ran: Option<u64>,
    clock: &dyn Fn() -> u64,
) {
    let mut stamp = None;
    let shard = shard_for_this_thread();
    let mut n = Some(node);
    while let Some(cur) = n {
        let counts = cur.counts.get_or_init();
        counts.by_kind[shard].kinds[kind as usize].fetch_add(1, Ordering::AcqRel);
        if cur.state().is_cancelled() {
            let stamp = *stamp.get_or_insert_with(clock);
            counts.last_stamp.fetch_max(stamp, Ordering::AcqRel);
            if let Some(started) = ran {
                // Orphan work: only a child that was dispatched can have run on, and only from
                // the cancel or its start, whichever came later.
                let at = cur.cancelled_at().max(started);
                counts
                    .orphan_nanos
                    .fetch_add(stamp.saturating_sub(at), Ordering::AcqRel);
            }
        }
        if !records.is_empty() {
            cur.add_records(kind, records);
        }
        n = cur.report_parent();
    }
}

/// Adds `records` to the unknown effects of `node` and of every ancestor, with no receipt of
/// their own: the effects left open in a quarantined shield's own scope, a separate tree, by
/// a child of `node` whose receipt is `Quarantined`. The caller does it before that child's
/// unit is released, so before `node` can be quiet (invariant 6: nothing in the report
/// changes after quiet).
pub(crate) fn note_effects<X, R: Clone>(node: &Node<X, R>, records: &[R]) {
    let mut n = Some(node);
    while let Some(cur) = n {
        cur.add_records(Kind::EffectUnknown, records);
        n = cur.report_parent();
    }
}

/// Notes the release of a guard (for "time to quiet"), then releases its unit.
pub(crate) fn release_guard<X, R>(node: &Node<X, R>, clock: impl Fn() -> u64) {
    let mut stamp = None;
    let mut n = Some(node);
    while let Some(cur) = n {
        if cur.state().is_cancelled() {
            let stamp = *stamp.get_or_insert_with(&clock);
            cur.counts
                .get_or_init()
                .last_stamp
                .fetch_max(stamp, Ordering::AcqRel);
        }
        n = cur.report_parent();
    }
    release_unit(node);
}

/// Quarantines every ticket of `node`'s subtree that has no receipt yet: each gets a
/// `Quarantined` receipt (its record lists it) and gives back its unit; the late real outcome is
/// then ignored (invariant 5). Spawned tasks are recorded with `task_info`. A ticket never
/// dispatched gets a `Cancelled` receipt instead (it cannot be dispatched any more, so it
/// ran nothing and no effect of it is unknown). Returns how many were quarantined.
///
/// If `node` is cancelled, its cancel first reaches the whole subtree (a walk of its own, as
/// a repeated `cancel` makes): the cancel that preceded this quarantine may still be walking
/// down (a zero grace period, or a walk that stalled). Quarantining the own ticket of a
/// closed child before that walk reached it would give back the child's last unit and make
/// it quiet, and a quiet node is never cancelled afterwards (invariant 6): its body (a retry
/// attempt's run) would wait on for a cancel that never comes (loom model 38). That walk may
/// be the first to reach a child, and so run its `on_cancel` callbacks: they run after the
/// quarantine, so that one that panics (the panic comes out of this call) cannot skip it
/// (loom model 41).
pub(crate) fn quarantine_subtree<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
) -> usize {
    quarantine_subtree_then(node, task_info, stamp, None)
}

/// [`quarantine_subtree`], putting into `in_progress` what each child of the subtree is
/// whose receipt someone else won (its owner, or another quarantine: the subtree's own
/// `quiesce()`) and may not have recorded yet: what a caller that reads the subtree's records
/// right after (a quarantined shield's stop, noting the effects its cleanup left open) must
/// take as possibly unknown, since that record may land after its read.
///
/// Found during the walk: a ticket still listed in flight though decided (its owner unlists it
/// under the shard lock after it has counted the receipt and written its records), a node
/// whose own ticket ended without `OWN_RECORDED` (set, Release, after the records). One that
/// is neither has its records written before the walk passed it (through that shard lock, or
/// that flag read with Acquire), so a read of the records after this call finds them. A
/// receipt that was in fact recorded, or that lists no effect, is put in too: the caller
/// filters, and a false alarm is the price of never missing one (loom models 43–45).
pub(crate) fn quarantine_subtree_noting<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
    in_progress: &mut Vec<R>,
) -> usize {
    quarantine_subtree_then(node, task_info, stamp, Some(in_progress))
}

fn quarantine_subtree_then<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
    in_progress: Option<&mut Vec<R>>,
) -> usize {
    let quarantine = || {
        let mut caught = Caught::default();
        let n = quarantine_walk(node, task_info, stamp, &mut caught, in_progress);
        (n, caught)
    };
    // A waker's panic comes out once the whole quarantine is done (after the cancel walk's
    // callbacks, if one of those panics first).
    let (n, caught) = match node.cause() {
        Some(cause) => cancel_then(node, cause, stamp, quarantine).1,
        None => quarantine(),
    };
    caught.resume();
    n
}

/// The walk of [`quarantine_subtree`], once the subtree is cancelled.
fn quarantine_walk<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
    caught: &mut Caught,
    mut in_progress: Option<&mut Vec<R>>,
) -> usize {
    let mut work = vec![node.clone()];
    let mut n_quarantined = 0;
    while let Some(n) = work.pop() {
        // Made if it does not exist yet: a ticket whose unit was taken before the cancel may
        // be about to make it and list itself, and must find it marked quarantined (see
        // `InFlight::list_ticket`). Only a quarantine pays for it.
        let in_flight = n.in_flight.get_or_init();
        n_quarantined += quarantine_in_flight(
            &n,
            in_flight,
            task_info,
            stamp,
            caught,
            in_progress.as_deref_mut(),
        );
        let first_child = work.len();
        push_children(&n, &mut work);
        // Children that are tickets of `n` (see `new_child_dispatched`), with no lock held.
        for child in &work[first_child..] {
            if quarantine_own(child, stamp, caught) {
                n_quarantined += 1;
            } else if let Some(in_progress) = in_progress.as_deref_mut() {
                in_progress.extend(own_in_progress(child).cloned());
            }
        }
    }
    n_quarantined
}

/// Quarantines `child`'s own ticket in its parent if it has no receipt yet.
fn quarantine_own<X, R: Clone>(child: &Node<X, R>, stamp: u64, caught: &mut Caught) -> bool {
    let Some(info) = &child.own_info else {
        return false;
    };
    // The ticket's unit of `child`: its parent's goes with the child's last (the quarantine
    // gives back the other units of the subtree as it walks it; guards are waited for).
    end_own(
        child,
        OWN_QUARANTINED,
        Kind::Quarantined,
        Some(info),
        &|| stamp,
        Some(caught),
    )
}

/// What `child` is as its parent's ticket, if that ticket's receipt was won and is not
/// recorded yet (see [`quarantine_subtree_noting`]).
fn own_in_progress<X, R>(child: &Node<X, R>) -> Option<&R> {
    // Acquire: pairs with the Release store of `OWN_RECORDED` in `end_own`.
    let own = child.own.load(Ordering::Acquire);
    let decided = own != OWN_NONE && own != OWN_DISPATCHED;
    (decided && own & OWN_RECORDED == 0)
        .then_some(child.own_info.as_ref())
        .flatten()
}

/// Quarantines the children in flight in `n` (see [`quarantine_subtree`]); returns how many.
/// Tickets found listed but decided by someone else go into `in_progress`, if given (see
/// [`quarantine_subtree_noting`]).
fn quarantine_in_flight<X, R: Clone>(
    n: &Node<X, R>,
    in_flight: &InFlight<R>,
    task_info: &R,
    stamp: u64,
    caught: &mut Caught,
    mut in_progress: Option<&mut Vec<R>>,
) -> usize {
    let mut count = 0;
    let (cells, tasks) = in_flight.take_for_quarantine(caught);
    for cell in cells {
        let Some(was) = cell.finish_as(TicketState::Quarantined) else {
            // Decided, and still listed: its receipt may not be recorded yet.
            if let Some(in_progress) = in_progress.as_deref_mut() {
                in_progress.push(cell.info());
            }
            continue;
        };
        if was == TicketState::Dispatched {
            let info = [cell.info()];
            count_receipt(n, Kind::Quarantined, &info, Some(cell.started()), &|| stamp);
            count += 1;
        } else {
            // Never dispatched, and now it never can be: it sent nothing and holds
            // nothing of the scope's, so it is not listed as quarantined work, and a
            // side-effecting one is no unknown effect (that was a false alarm).
            count_receipt(n, Kind::Cancelled, &[], None, &|| stamp);
        }
        // An owner that waits for it is told (with no lock held) before its unit goes
        // back, which may make the node quiet: a shield's waker cancels the shield's own
        // scope right here, so that nothing it started is still open once `quiesce()`
        // resolves (invariant 6).
        cell.wake_quarantined(caught);
        in_flight.unlist_ticket(cell.key());
        // A `quiesce()` waker's panic (the release may make `n` quiet) is kept: the
        // quarantine goes on to its end.
        release_unit_caught(n, caught);
    }
    // Tasks taken out of the list or the unlisted count are decided: their late receipts (and
    // listings) find nothing (invariant 5).
    for _ in 0..tasks {
        let info = std::slice::from_ref(task_info);
        count_receipt(n, Kind::Quarantined, info, Some(0), &|| stamp);
        release_unit_caught(n, caught);
        count += 1;
    }
    count
}

/// A registered waiter: its key in one of the node's waiter slabs.
#[derive(Debug, Default)]
pub(crate) struct WaiterKey {
    slot: Option<usize>,
    /// What identifies the waker in `slot` (see [`WakerId`]): a poll with a waker that is
    /// the same needs no lock (the registered one is still in the list until the waking side
    /// drains it).
    waker: Option<WakerId>,
}

/// A waker's data and vtable addresses: equal for two wakers exactly when `will_wake` is
/// true. Kept instead of a clone of the registered waker (no reference count taken and
/// dropped per registration). It cannot name a reused address: it is taken from the clone
/// in the node's list (not from the waker it was cloned from, which may be gone, its address
/// reused by another waker, when its clone is a new object), which stays alive there until
/// the waking side drains the list, which it does only once the condition holds for good,
/// and a poll checks the condition first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WakerId(usize, usize);

impl WakerId {
    fn of(waker: &Waker) -> WakerId {
        WakerId(
            waker.data().addr(),
            std::ptr::from_ref(waker.vtable()).addr(),
        )
    }
}

/// Which waiter list.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    Cancel,
    Quiet,
}

/// Polls for cancel: returns `true` if reached; otherwise registers `waker` (once, updated on
/// later polls) under the same lock that cancel takes to wake, so no wake-up is lost.
pub(crate) fn poll_cancelled<X, R>(node: &Node<X, R>, key: &mut WaiterKey, waker: &Waker) -> bool {
    if node.state().is_cancelled() {
        forget_waiter(node, Wait::Cancel, key);
        return true;
    }
    if key.slot.is_some() && key.waker == Some(WakerId::of(waker)) {
        // Registered with an equivalent waker: the waking side will wake it.
        return false;
    }
    let mut inner = node.inner.lock();
    // Re-check under the lock: the waking side changes the state before it takes this lock.
    if node.state().is_cancelled() {
        let removed = key.slot.take().and_then(|k| take_waiter(&mut inner, k));
        drop(inner);
        // Wakers are dropped with no lock held (dropping one may drop a task's output).
        drop(removed);
        key.waker = None;
        return true;
    }
    // The identity of the clone that goes into the list, not of `waker`: only the clone is
    // kept alive there (a waker whose clone is a new object, e.g. one borrowed from a slot
    // that is reused, would otherwise be named by an address that another waker can take).
    let kept = waker.clone();
    let id = WakerId::of(&kept);
    let replaced = match key.slot {
        Some(INLINE) => inner.first_waiter.replace(kept),
        Some(k) => inner
            .lists()
            .cancel_waiters
            .get_mut(k)
            .map(|w| std::mem::replace(w, kept)),
        None if inner.first_waiter.is_none() => {
            inner.first_waiter = Some(kept);
            key.slot = Some(INLINE);
            None
        }
        None => {
            key.slot = Some(inner.lists().cancel_waiters.insert(kept));
            None
        }
    };
    drop(inner);
    drop(replaced);
    key.waker = Some(id);
    false
}

/// Polls for quiet, for a `quiesce()`: returns `true` if reached; otherwise registers `waker`
/// (once, updated on later polls) under the same lock that close, release and cancel take to
/// wake, so no wake-up is lost, and moves onto `cancelled` the scopes (its own, or below it)
/// handed to this waiter since its last poll (see [`hand_over`]). Always takes the lock (a
/// `quiesce()` is polled rarely: at its start, at a cancel below, at a grace end).
pub(crate) fn poll_quiet<X, R>(
    node: &Node<X, R>,
    key: &mut WaiterKey,
    waker: &Waker,
    cancelled: &mut Vec<Weak<Node<X, R>>>,
) -> bool {
    if node.state().is_quiet() {
        forget_waiter(node, Wait::Quiet, key);
        return true;
    }
    let mut inner = node.inner.lock();
    // Re-check under the lock: the waking side changes the state before it takes this lock.
    if node.state().is_quiet() {
        let removed = key
            .slot
            .take()
            .and_then(|k| inner.lists.as_mut()?.quiet_waiters.try_remove(k));
        drop(inner);
        // Dropped with no lock held (a waker may drop a task's output, a node its data).
        drop(removed);
        key.waker = None;
        return true;
    }
    let lists = inner.lists();
    let mut replaced = None;
    match key.slot.and_then(|k| lists.quiet_waiters.get_mut(k)) {
        Some(w) => {
            cancelled.append(&mut w.cancelled);
            if key.waker != Some(WakerId::of(waker)) {
                // The identity of the clone kept in the list (see `poll_cancelled`).
                let kept = waker.clone();
                key.waker = Some(WakerId::of(&kept));
                replaced = Some(std::mem::replace(&mut w.waker, kept));
            }
        }
        None => {
            let kept = waker.clone();
            key.waker = Some(WakerId::of(&kept));
            key.slot = Some(lists.quiet_waiters.insert(QuietWaiter {
                waker: kept,
                cancelled: Vec::new(),
                prune_at: QuietWaiter::<X, R>::PRUNE_MIN,
            }));
        }
    }
    drop(inner);
    drop(replaced);
    false
}

/// The key of the inline cancel waiter (`Inner::first_waiter`); slab keys never reach it.
const INLINE: usize = usize::MAX;

/// Takes the cancel waiter registered under `key` (inline or in its list), if still there.
fn take_waiter<X, R>(inner: &mut Inner<X, R>, key: usize) -> Option<Waker> {
    if key == INLINE {
        inner.first_waiter.take()
    } else {
        inner.lists.as_mut()?.cancel_waiters.try_remove(key)
    }
}

/// Removes a registered waiter (future dropped before completion). Cancel safety of the public
/// futures rests on this: dropping one leaves nothing behind.
pub(crate) fn forget_waiter<X, R>(node: &Node<X, R>, which: Wait, key: &mut WaiterKey) {
    key.waker = None;
    if let Some(k) = key.slot.take() {
        let mut inner = node.inner.lock();
        // If the waking side drained the list, the key is stale, but its slot cannot have been
        // reused: lists are drained only when their condition (cancelled / quiet) has become
        // permanent, and a poll never registers once it holds. So removing is safe.
        let (waker, quiet, lists) = match which {
            Wait::Cancel => (take_waiter(&mut inner, k), None, None),
            Wait::Quiet => {
                let quiet = inner
                    .lists
                    .as_mut()
                    .and_then(|l| l.quiet_waiters.try_remove(k));
                // The last waiter of any kind gone: the lists go too (a `quiesce()` that
                // watched many scopes for a while leaves nothing on them). A stale key of a
                // drained list cannot meet a new entry in lists made again: they are drained
                // only once their condition holds for good, and nothing registers after.
                let empty = inner.lists.as_ref().is_some_and(|l| {
                    l.quiet_waiters.is_empty()
                        && l.cancel_waiters.is_empty()
                        && l.callbacks.is_empty()
                });
                (None, quiet, if empty { inner.lists.take() } else { None })
            }
        };
        drop(inner);
        // Dropped with no lock held (a waker may drop a task's output, a node its data).
        drop(waker);
        drop(quiet);
        drop(lists);
    }
}

/// Registers an `on_cancel` callback; runs it at once (returning `None`) if already cancelled.
pub(crate) fn on_cancel<X, R>(node: &Node<X, R>, f: Callback) -> Option<usize> {
    let cause = {
        let mut inner = node.inner.lock();
        match &inner.cause {
            None => return Some(inner.lists().callbacks.insert(f)),
            Some(c) => c.clone(),
        }
    };
    f(&cause);
    None
}

/// Unregisters an `on_cancel` callback. Returns `true` if it was still registered (so it will
/// never run).
pub(crate) fn stop_callback<X, R>(node: &Node<X, R>, key: usize) -> bool {
    // The closure is dropped after the lock is released: it may own tickets, guards or scopes
    // of this node whose drop takes the lock again.
    let removed = node.inner.lock().lists().callbacks.try_remove(key);
    removed.is_some()
}

#[cfg(test)]
mod tests;

#[cfg(all(test, loom))]
mod loom_handover;
