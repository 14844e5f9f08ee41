//! Registration, in-flight lists and receipts: each receipt recorded once and counted in its
//! node and every ancestor before its unit goes back, and the effect records of a subtree
//! (invariants 5, 6).

use std::task::Waker;

use super::units::{release_unit, release_unit_caught, take_unit, take_unit_while_busy};
use super::{
    refusal, report_ancestors, shard_for_this_thread, InFlight, Node, Refused, TaskKey, TicketCell,
    SHARDS,
};
use crate::cause::Cause;
use crate::panic::Caught;
use crate::sync::{Arc, AtomicU64, Ordering};

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
    /// Boundary children rolled up into this node (see [`roll_up`]),
    /// and how many of them had been cancelled by this node's cancel.
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

/// `Node::own`: the node is not a ticket of its parent (most nodes).
pub(super) const OWN_NONE: u8 = 0;
/// `Node::own`: the node is a dispatched child of its parent, holding its own first unit (and so
/// one of the parent's), without a receipt yet (see
/// [`new_child_dispatched`](super::new_child_dispatched)).
pub(super) const OWN_DISPATCHED: u8 = 1;
/// `Node::own`: its receipt was recorded by its owner.
const OWN_DONE: u8 = 2;
/// `Node::own`: a quarantine of an ancestor recorded its receipt.
pub(super) const OWN_QUARANTINED: u8 = 3;
/// Flag in `Node::own`, beside `OWN_DONE` or `OWN_QUARANTINED`: the receipt's records are written
/// (set by the winner of the CAS once it counted the receipt, before it releases the unit). Until
/// then the receipt is in progress (see
/// [`quarantine_subtree_noting`](super::quarantine_subtree_noting)).
pub(super) const OWN_RECORDED: u8 = 4;

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
/// Not the state word, which every spawn and receipt of the node writes (from a worker thread,
/// reading it is a cache miss per poll), but the in-flight list's mark, which only a cancel writes.
/// It is as good: the task's registration CAS came before any cancel that marks the state word
/// after it, and the list existed before that CAS, so that cancel finds the list and marks it
/// (`cancel::mark_cancelled`); a poll that comes after the cancel sees the mark (Release/Acquire).
pub(crate) fn task_cancelled<X, R>(node: &Node<X, R>) -> bool {
    node.in_flight.get().is_some_and(InFlight::is_cancelled)
}

/// Polls for the cancel of `node` on behalf of `task`, in flight in `node`, whose work just
/// returned `Pending`: returns `true` if the cancel has reached the task's list, or a
/// quarantine took the task; otherwise keeps `waker` in the task's entry, where the cancel
/// finds it, and returns `false`. On the task's first `Pending` this lists it (one lock for
/// the entry and the waker) and updates `task` to its entry.
///
/// No lock of the node itself is taken, nor its state word read (every spawn and receipt of the
/// node writes that word, so from a worker thread reading it is a cache miss): the node's cancel
/// (`cancel::mark_cancelled`, after its RMW of the state word) marks the in-flight list cancelled
/// and then wakes the waker of every listed task. No wake-up is lost: the entry's shard lock orders
/// this poll against that walk. If the walk took the lock first, the mark was set before it, and
/// the load below sees it; otherwise the walk finds the waker. This holds for the first `Pending`
/// too, which lists the task under that lock: until then the task was not waiting (it was in its
/// first poll, or about to be polled, and then sees the mark in [`task_cancelled`]), so the walk
/// had nothing to wake. A quarantine takes the task out of the list (or out of the unlisted count)
/// and wakes it if listed; this then returns `true`.
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

/// Records the receipt of `node`'s own ticket (a child made by
/// [`new_child_dispatched`](super::new_child_dispatched)), unless a quarantine recorded one first
/// (see [`end_own`]). `record`: what the receipt lists (an unknown effect).
pub(crate) fn record_own_receipt<X, R: Clone>(
    node: &Node<X, R>,
    kind: Kind,
    record: Option<&R>,
    clock: impl Fn() -> u64,
) {
    end_own(node, OWN_DONE, kind, record, &clock, None);
}

/// Ends `node`'s own ticket (see [`new_child_dispatched`](super::new_child_dispatched)) as `to`
/// (`OWN_DONE`: its owner's receipt; `OWN_QUARANTINED`: a quarantine's), unless the other got there
/// first: one CAS decides (invariant 5). The receipt is counted in the parent and every ancestor,
/// and noted in `node` itself if it was cancelled (its quiet may come with this end, and its "time
/// from cancel to quiet" runs to it); then the ticket's unit of `node` is released, and so the
/// parent's if it was `node`'s last (invariant 6). Returns whether this call ended it.
///
/// `caught`: where a quarantine keeps the panic of a `quiesce()` waker that the release
/// wakes; `None` (the owner's receipt) resumes it at once, once the release is done (and
/// keeps the owner's path what it was: an inlined [`release_unit`]).
pub(super) fn end_own<X, R: Clone>(
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

/// Whether `node`'s own ticket (see [`new_child_dispatched`](super::new_child_dispatched)) was
/// quarantined.
pub(crate) fn own_quarantined<X, R>(node: &Node<X, R>) -> bool {
    node.own.load(Ordering::Acquire) & !OWN_RECORDED == OWN_QUARANTINED
}

/// What `node` is as a ticket of its parent (see
/// [`new_child_dispatched`](super::new_child_dispatched)).
pub(crate) fn own_info<X, R>(node: &Node<X, R>) -> Option<&R> {
    node.own_info.as_ref()
}

/// Counts a receipt in `node` and its ancestors. The clock is read only if one of them is
/// cancelled: the stamps serve "time from cancel to quiet" and orphan work, which only
/// receipts after a cancel contribute to. `ran`: `None` if the child never ran (it was not
/// dispatched), else the stamp it started at if that may be after a cancel (a shielded
/// cleanup), 0 if not: its orphan work in a cancelled node runs from the later of that and
/// the node's cancel to the receipt.
pub(super) fn count_receipt<X, R: Clone>(
    node: &Node<X, R>,
    kind: Kind,
    records: &[R],
    ran: Option<u64>,
    clock: &dyn Fn() -> u64,
) {
    let mut stamp = None;
    let shard = shard_for_this_thread();
    for cur in report_ancestors(node) {
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
    }
}

/// Adds `records` to the unknown effects of `node` and of every ancestor, with no receipt of
/// their own: the effects left open in a quarantined shield's own scope, a separate tree, by
/// a child of `node` whose receipt is `Quarantined`. The caller does it before that child's
/// unit is released, so before `node` can be quiet (invariant 6: nothing in the report
/// changes after quiet).
pub(crate) fn note_effects<X, R: Clone>(node: &Node<X, R>, records: &[R]) {
    for cur in report_ancestors(node) {
        cur.add_records(Kind::EffectUnknown, records);
    }
}

/// Notes the release of a guard (for "time to quiet"), then releases its unit.
pub(crate) fn release_guard<X, R>(node: &Node<X, R>, clock: impl Fn() -> u64) {
    let mut stamp = None;
    for cur in report_ancestors(node) {
        if cur.state().is_cancelled() {
            let stamp = *stamp.get_or_insert_with(&clock);
            cur.counts
                .get_or_init()
                .last_stamp
                .fetch_max(stamp, Ordering::AcqRel);
        }
    }
    release_unit(node);
}

/// Adds the counts and records of `node`, a boundary child that just gave back its last unit
/// (so for good), to those of its parent `p`, which is closed, and counts it there (see the
/// module docs). Called before
/// `node` gives back its unit of `p`, so before `p` can be quiet: `p`'s report has it
/// (invariant 6). The parent's counts and records are its own from then on (a cancel of the
/// parent stamps them as any other's).
pub(super) fn roll_up<X, R: Clone>(node: &Node<X, R>, p: &Node<X, R>) {
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
