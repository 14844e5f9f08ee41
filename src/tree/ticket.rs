//! The shared cell of one registered child (its state and its identity), and the list of a
//! node's children in flight: registered tickets and spawned tasks without a receipt yet.

use std::task::Waker;

use slab::Slab;

use crate::panic::Caught;
use crate::sync::{arc_in_place, thread_index, Arc, AtomicU64, AtomicU8, Mutex, Ordering};

/// Where a ticket is in its life. Moves forward only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum TicketState {
    /// Registered, nothing sent yet.
    Prepared = 0,
    /// Passed the dispatch CAS: the work may have started.
    Dispatched = 1,
    /// Has its receipt.
    Done = 2,
    /// Did not stop within the grace period; its late outcome is ignored.
    Quarantined = 3,
}

impl TicketState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => TicketState::Prepared,
            1 => TicketState::Dispatched,
            2 => TicketState::Done,
            _ => TicketState::Quarantined,
        }
    }
}

/// Keeps `waker` in `kept` unless the one there wakes the same task; returns the one it
/// replaced, for the caller to drop once its lock is released (dropping a waker may drop a
/// task).
pub(crate) fn keep_waker(kept: &mut Option<Waker>, waker: &Waker) -> Option<Waker> {
    if kept.as_ref().is_some_and(|w| w.will_wake(waker)) {
        return None;
    }
    kept.replace(waker.clone())
}

/// Shared between the ticket's owner and the node's in-flight list (for quarantine).
#[derive(Debug)]
pub(crate) struct TicketCell<R> {
    state: AtomicU8,
    key: usize,
    generation: u64,
    /// Stamp of when the child started, if that may be after a cancel of its node (a shielded
    /// cleanup; see [`started_at`](Self::started_at)); 0 otherwise. Orphan work counts from
    /// the later of this and the cancel.
    started: u64,
    /// What the child is; its owner may add to it after dispatch (a provider handle), so
    /// that a quarantine reports what the owner knew.
    info: Mutex<R>,
    /// An owner waiting to hear of a quarantine (see [`poll_quarantined`](Self::poll_quarantined)).
    quarantine_waker: Mutex<Option<Waker>>,
}

impl<R> TicketCell<R> {
    pub(crate) fn new(key: usize, generation: u64, info: R) -> Self {
        TicketCell {
            state: AtomicU8::new(TicketState::Prepared as u8),
            key,
            generation,
            started: 0,
            info: Mutex::new(info),
            quarantine_waker: Mutex::new(None),
        }
    }

    /// Notes that the child starts at `stamp`, which may be after a cancel of its node (a
    /// shielded cleanup): its orphan work is counted from then, not from the cancel.
    pub(crate) fn started_at(mut self, stamp: u64) -> Self {
        self.started = stamp;
        self
    }

    /// See [`started_at`](Self::started_at).
    pub(crate) fn started(&self) -> u64 {
        self.started
    }

    pub(crate) fn key(&self) -> usize {
        self.key
    }

    /// The generation of its node when it was registered.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// A copy of what the child is.
    pub(crate) fn info(&self) -> R
    where
        R: Clone,
    {
        self.info.lock().clone()
    }

    /// Updates what the child is (the owner learned more after dispatch).
    pub(crate) fn update_info(&self, f: impl FnOnce(&mut R)) {
        f(&mut self.info.lock());
    }

    pub(crate) fn state(&self) -> TicketState {
        // Acquire: pairs with the AcqRel CAS of whoever moved it.
        TicketState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// `Prepared -> Dispatched`; fails if it was quarantined meanwhile.
    pub(crate) fn mark_dispatched(&self) -> bool {
        self.state
            .compare_exchange(
                TicketState::Prepared as u8,
                TicketState::Dispatched as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Whether a quarantine took this ticket; if not, keeps `waker` (replacing the one kept
    /// before), which the quarantine wakes ([`wake_quarantined`](Self::wake_quarantined)).
    ///
    /// No wake-up is lost: the quarantine moves the state before it takes this lock to take the
    /// waker, and this reads the state under that lock. If the quarantine's lock comes first,
    /// its state CAS happens-before this load; otherwise it finds the waker.
    pub(crate) fn poll_quarantined(&self, waker: &Waker) -> bool {
        let mut kept = self.quarantine_waker.lock();
        if self.state() == TicketState::Quarantined {
            return true;
        }
        let old = keep_waker(&mut kept, waker);
        drop(kept);
        drop(old);
        false
    }

    /// For the quarantine that moved this ticket to `Quarantined`: wakes the owner waiting in
    /// [`poll_quarantined`](Self::poll_quarantined), if any (with no lock held; a panic is
    /// kept in `caught`, for the end of the quarantine).
    pub(crate) fn wake_quarantined(&self, caught: &mut Caught) {
        let waker = self.quarantine_waker.lock().take();
        if let Some(w) = waker {
            caught.wake(w);
        }
    }

    /// Moves a ticket without receipt to `target` (`Done` or `Quarantined`). Exactly one caller
    /// ever gets `Some` (invariant 5), with the state it moved from (did it run?).
    pub(crate) fn finish_as(&self, target: TicketState) -> Option<TicketState> {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if cur >= TicketState::Done as u8 {
                return None;
            }
            match self.state.compare_exchange(
                cur,
                target as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(TicketState::from_u8(cur)),
                Err(actual) => cur = actual,
            }
        }
    }
}

/// Number of in-flight shards per node (a power of two). Children registered one after
/// another by one thread go to different shards, so that their receipts, recorded on whichever
/// thread ends them, seldom wait for the registering thread's lock. A spawned task that waits
/// is listed in the shard of the thread that polls it instead ([`InFlight::set_task_waker`]).
const SHARDS: usize = 4;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
const SHARD_MASK: usize = SHARDS - 1;

/// The slot part of the key of a task that is counted in its shard's unlisted word, not
/// listed in its slab (a slab slot never comes near it: see [`TaskKey::listed`]). The largest
/// slot a key can hold.
const UNLISTED: u32 = (u32::MAX >> SHARD_BITS) - 1;

/// `InFlightShard::unlisted`: the count is the low 32 bits, the epoch the high 32.
const COUNT_MASK: u64 = (1 << 32) - 1;
const EPOCH_SHIFT: u32 = 32;

/// Where a spawned task is in its node's in-flight list: its shard, and either its slot and a
/// sequence number (listed: the sequence number, because a slot can be reused once a
/// quarantine took the task out), or `UNLISTED` and the epoch of the shard's unlisted word in
/// which it was counted (a task that has not returned `Pending` yet).
///
/// Eight bytes, never zero: every task's future holds an `Option<TaskKey>`, which so costs
/// 8 bytes of the task's allocation instead of 24. 32 bits suffice: the epoch is 32 bits
/// already, and a listed task's sequence number only has to differ from those of the tasks
/// listed in its slot after a quarantine took it out, and after a quarantine (which closes
/// the node) only tasks registered just before it can still be listed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TaskKey {
    /// `(slot << SHARD_BITS | shard) + 1`.
    key: std::num::NonZeroU32,
    seq: u32,
}

impl TaskKey {
    fn new(slot: u32, shard: usize, seq: u32) -> TaskKey {
        debug_assert!(slot <= UNLISTED && shard < SHARDS);
        // At most `(UNLISTED << SHARD_BITS | SHARD_MASK) + 1 < u32::MAX`: never 0, no overflow.
        let raw = ((slot << SHARD_BITS) | shard as u32) + 1;
        let Some(key) = std::num::NonZeroU32::new(raw) else {
            unreachable!("a key plus one is never zero");
        };
        TaskKey { key, seq }
    }

    /// The key of a task listed in slab slot `slot` of `shard`.
    ///
    /// # Panics
    ///
    /// If the slot is past the largest a key holds (a billion tasks waiting in one shard of
    /// one scope: more memory than a machine has).
    fn listed(slot: usize, shard: usize, seq: u32) -> TaskKey {
        match u32::try_from(slot) {
            Ok(slot) if slot < UNLISTED => TaskKey::new(slot, shard, seq),
            _ => panic!("over a billion tasks waiting in one in-flight shard"),
        }
    }

    fn shard(self) -> usize {
        (self.key.get() - 1) as usize & SHARD_MASK
    }

    fn slot(self) -> u32 {
        (self.key.get() - 1) >> SHARD_BITS
    }
}

/// One child in flight.
enum Entry<R> {
    /// A ticket: its state lives in the shared cell (the owner moves it without this lock).
    Ticket(Arc<TicketCell<R>>),
    /// A spawned task that has returned `Pending` (one that has not is only counted, see
    /// [`InFlightShard::unlisted`]), kept inline (no allocation of its own): whoever takes the
    /// entry out of the list under the shard lock, the task's receipt or a quarantine, records
    /// the one receipt (invariant 5). Tasks all have the same spec, given to the quarantine, so
    /// the entry is three words (it is moved in and out of the list for every task).
    Task {
        seq: u32,
        /// The task's waker, for the node's cancel (the task is listed when it first waits).
        waker: Waker,
    },
}

struct ShardCells<R> {
    slab: Slab<Entry<R>>,
    next_seq: u32,
    /// Set by a quarantine as it takes this shard's entries: a ticket that comes to be listed
    /// here afterwards is refused (see [`InFlight::list_ticket`]).
    quarantined: bool,
}

/// One shard of a node's in-flight list, padded so that two shards' locks never share a
/// cache line.
struct InFlightShard<R> {
    /// Spawned tasks counted in this shard that hold a unit of the node but are not listed
    /// in any shard's `cells` (registered, and not yet returned `Pending`: most tasks end at
    /// their first poll, and then never take a lock): the low 32 bits count them, the high 32
    /// bits are an epoch, which a quarantine bumps as it takes the whole count
    /// ([`InFlightShard::quarantine_unlisted`]).
    /// A task remembers the epoch it was counted in; it leaves the count by a compare-and-swap
    /// that requires that epoch ([`InFlightShard::take_unlisted`]): so exactly one of its
    /// receipt (or its listing) and a quarantine takes it (invariant 5). The count cannot
    /// overflow into the epoch: each task counted holds a unit, and a node has fewer than
    /// 2^32 units. A task's first `Pending` takes it out of this count and lists it in the
    /// shard of the thread that polls it ([`InFlight::set_task_waker`]).
    unlisted: AtomicU64,
    cells: Mutex<ShardCells<R>>,
    _pad: [u8; 64],
}

impl<R> InFlightShard<R> {
    /// Takes a task counted in `epoch` out of the unlisted count. `false`: a quarantine took it
    /// (the epoch moved on).
    #[inline]
    fn take_unlisted(&self, epoch: u32) -> bool {
        let epoch = u64::from(epoch);
        // Acquire/AcqRel: pairs with the other RMWs of the word (the spawn's increment, a
        // quarantine's bump); a task that wins here is decided before any later bump reads the
        // count.
        let mut cur = self.unlisted.load(Ordering::Acquire);
        while cur >> EPOCH_SHIFT == epoch {
            debug_assert!(cur & COUNT_MASK != 0, "an unlisted task not counted");
            match self.unlisted.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
        false
    }

    /// For a quarantine: takes every unlisted task of this shard (they are quarantined), by
    /// bumping the epoch and zeroing the count in one step; returns how many.
    ///
    /// An empty count is left as it is (no unlisted task holds its epoch), and the argument of
    /// [`InFlight::set_task_waker`] holds for the load that reads it as for a bump: a load
    /// that reads 0 reads either from before a task's increment (that task is registered
    /// while this quarantine runs, which may then miss it: the cancel that precedes a
    /// quarantine stops such a task at its first poll, unlike a ticket, whose owner may hold
    /// it, see [`InFlight::list_ticket`]),
    /// or from the task's decrement or later, and then this quarantine's lock of the shard the
    /// task listed itself in comes after the task's (a load cannot read from a write that
    /// happens after it).
    ///
    /// The epoch wraps after 2^32 bumps; each bump takes at least one task, so a task would
    /// have to stay in its first poll while 2^32 later tasks of its shard were quarantined
    /// (after a cancel, which closes the node, no task is registered any more).
    fn quarantine_unlisted(&self) -> usize {
        // AcqRel: Acquire so that the unit CAS of every task counted (before its increment,
        // Release) happens-before the quarantine releases that unit.
        let mut cur = self.unlisted.load(Ordering::Acquire);
        loop {
            let count = cur & COUNT_MASK;
            if count == 0 {
                return 0;
            }
            let next = (cur & !COUNT_MASK).wrapping_add(1 << EPOCH_SHIFT);
            match self.unlisted.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // At most 32 bits.
                Ok(_) => return count as usize,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// The children of a node that have no receipt yet. The node's cancel marks it and wakes the
/// waiting tasks among them (see `poll_cancel_task`).
pub(crate) struct InFlight<R> {
    shards: [InFlightShard<R>; SHARDS],
    /// 1 once the node's cancel reached this list: set before it wakes the tasks, so that a
    /// task that stores its waker and then reads this (not the node's busy state word) loses
    /// no wake-up.
    cancelled: AtomicU8,
}

impl<R> Default for InFlight<R> {
    fn default() -> Self {
        InFlight {
            shards: std::array::from_fn(|_| InFlightShard {
                unlisted: AtomicU64::new(0),
                cells: Mutex::new(ShardCells {
                    slab: Slab::new(),
                    next_seq: 0,
                    quarantined: false,
                }),
                _pad: [0; 64],
            }),
            cancelled: AtomicU8::new(0),
        }
    }
}

impl<R> std::fmt::Debug for InFlight<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}

/// The shard for the next child this thread registers (round robin). Always the last under
/// loom: a counter that lives on from one explored execution to the next would make the model
/// nondeterministic (and one shard is the case where everything contends). The last, so that
/// a task polled by a model thread other than the fourth is listed in a shard that comes
/// before the one it was counted in (see [`thread_shard`]): the order in which a quarantine
/// could miss it (loom model 34).
fn next_shard() -> usize {
    use std::cell::Cell;
    if cfg!(loom) {
        return SHARD_MASK;
    }
    thread_local!(static NEXT: Cell<usize> = const { Cell::new(0) });
    NEXT.with(|n| {
        let v = n.get();
        n.set(v.wrapping_add(1));
        v & SHARD_MASK
    })
}

/// The shard in which this thread lists the tasks it polls (see
/// [`InFlight::set_task_waker`]): fixed per thread, and threads started one after the other
/// take different shards, so that the workers of a runtime list and unlist their tasks each in
/// a shard of its own, whose lock and slab stay in that worker's cache. Under loom the model
/// thread's number: a task counted in the last shard (see [`next_shard`]) and polled on the
/// main thread or the first spawned one moves from that shard's count into an earlier
/// shard's list.
#[inline]
fn thread_shard() -> usize {
    thread_index() & SHARD_MASK
}

impl<R> InFlight<R> {
    /// Lists a ticket; `make` gets its key. `None`: a quarantine has taken this list's
    /// entries already, so the ticket is not listed (the caller refuses it).
    ///
    /// A ticket's unit is taken before it is listed, and a cancel and then a quarantine can
    /// both come in between: the quarantine would not find the ticket, and `quiesce()` would
    /// wait for its owner to drop it (a ticket that is only held wakes nothing that would
    /// quarantine again). The shard lock decides instead: the ticket is listed before the
    /// quarantine takes the shard (and is ended with it: `Cancelled`, never dispatched), or it
    /// finds the shard quarantined (loom model 40). A quarantine only ever runs on a cancelled
    /// subtree (see `tree::quarantine_subtree`), which no ticket can be registered in any
    /// more, except in that gap or as a shielded cleanup, which once the grace period is over
    /// comes too late.
    pub(super) fn list_ticket(
        &self,
        make: impl FnOnce(usize) -> TicketCell<R>,
    ) -> Option<Arc<TicketCell<R>>> {
        let shard = next_shard();
        let mut cells = self.shards[shard].cells.lock();
        if cells.quarantined {
            return None;
        }
        let entry = cells.slab.vacant_entry();
        let key = (entry.key() << SHARD_BITS) | shard;
        let cell = arc_in_place(|| make(key));
        entry.insert(Entry::Ticket(cell.clone()));
        Some(cell)
    }

    /// Unlists a ticket (its receipt is recorded: the owner or a quarantine won its CAS).
    pub(super) fn unlist_ticket(&self, key: usize) {
        let removed = self.shards[key & SHARD_MASK]
            .cells
            .lock()
            .slab
            .try_remove(key >> SHARD_BITS);
        // Dropped after the lock.
        drop(removed);
    }

    /// Registers a task, unlisted: counts it in a shard's unlisted word (no lock). Its unit
    /// is taken already (see `tree::register_task`).
    pub(super) fn add_task(&self) -> TaskKey {
        let shard = next_shard();
        // AcqRel: Release so that a quarantine that takes this count (Acquire) comes after the
        // task's unit CAS, before it releases that unit.
        let prev = self.shards[shard].unlisted.fetch_add(1, Ordering::AcqRel);
        // The epoch: the high 32 bits.
        TaskKey::new(UNLISTED, shard, (prev >> EPOCH_SHIFT) as u32)
    }

    /// Takes a task out, unlisted or listed, for its receipt. `false`: a quarantine took it
    /// first.
    // Inlined: most tasks end unlisted, and that path is one CAS (a call and the listed
    // path's frame were a third of it).
    #[inline]
    pub(super) fn unlist_task(&self, task: TaskKey) -> bool {
        let shard = &self.shards[task.shard()];
        if task.slot() == UNLISTED {
            // No lock: the count's epoch decides between this and a quarantine.
            return shard.take_unlisted(task.seq);
        }
        self.unlist_listed(task)
    }

    /// [`unlist_task`](Self::unlist_task) for a task that was listed.
    #[inline(never)]
    fn unlist_listed(&self, task: TaskKey) -> bool {
        let slot = task.slot() as usize;
        let mut cells = self.shards[task.shard()].cells.lock();
        if !matches!(cells.slab.get(slot), Some(Entry::Task { seq, .. }) if *seq == task.seq) {
            return false;
        }
        let removed = cells.slab.remove(slot);
        drop(cells);
        // The waker (a reference to a task) is dropped with no lock held.
        drop(removed);
        true
    }

    /// Keeps the waker of a task that returned `Pending`, for the node's cancel: on its first
    /// `Pending` the task is listed, with the waker, in the shard of the polling thread
    /// ([`thread_shard`]; `task` becomes its listed key); later, the waker replaces an older
    /// one. `false`: quarantined (not counted or listed any more).
    ///
    /// Listing moves the task from its shard's unlisted count into the polling thread's shard's
    /// slab, under that shard's lock, and a quarantine takes every shard's count before it takes
    /// any shard's lock to walk its slab ([`take_for_quarantine`](Self::take_for_quarantine)):
    /// so the quarantine meets the task exactly once. If the task's decrement comes first in
    /// the count word's modification order, the quarantine does not count it, and takes the
    /// slab's lock after the task released it (had the quarantine taken that lock before, its
    /// bump of the count, sequenced before that lock, would happen-before the task's decrement
    /// and so come first in that order): it finds the entry. Otherwise the decrement finds the
    /// epoch bumped and fails: counted by the quarantine, the task is not listed (loom model
    /// 34, where the count and the slab are in different shards).
    pub(super) fn set_task_waker(&self, task: &mut TaskKey, waker: &Waker) -> bool {
        let slot = task.slot();
        if slot == UNLISTED {
            let home = thread_shard();
            let mut cells = self.shards[home].cells.lock();
            // Under the lock (see above).
            if !self.shards[task.shard()].take_unlisted(task.seq) {
                return false;
            }
            let seq = cells.next_seq;
            cells.next_seq = seq.wrapping_add(1);
            let key = cells.slab.insert(Entry::Task {
                seq,
                waker: waker.clone(),
            });
            *task = TaskKey::listed(key, home, seq);
            return true;
        }
        let mut cells = self.shards[task.shard()].cells.lock();
        let Some(Entry::Task { seq, waker: kept }) = cells.slab.get_mut(slot as usize) else {
            return false;
        };
        if *seq != task.seq {
            return false;
        }
        if kept.will_wake(waker) {
            return true;
        }
        let old = std::mem::replace(kept, waker.clone());
        drop(cells);
        drop(old);
        true
    }

    /// Whether the node's cancel has reached this list (see [`cancel`](Self::cancel)).
    pub(super) fn is_cancelled(&self) -> bool {
        // Acquire: pairs with the Release store in `cancel`.
        self.cancelled.load(Ordering::Acquire) != 0
    }

    /// The node was cancelled: marks the list cancelled, then takes each shard's lock to copy
    /// the waiting tasks' wakers into `wakers` (woken by the caller with no lock held).
    pub(super) fn cancel(&self, wakers: &mut Vec<Waker>) {
        // Release: a task whose shard lock comes after this one's sees it (the lock orders
        // them too); one whose lock comes before has left its waker for the walk below.
        self.cancelled.store(1, Ordering::Release);
        for shard in &self.shards {
            let cells = shard.cells.lock();
            wakers.extend(cells.slab.iter().filter_map(|(_, e)| match e {
                Entry::Task { waker, .. } => Some(waker.clone()),
                Entry::Ticket(_) => None,
            }));
        }
    }

    /// For a quarantine: copies of the listed tickets' cells (each is decided by its CAS), and
    /// the number of tasks, listed or not, which are taken out here (decided by the unlisted
    /// words' epochs and the shard locks).
    ///
    /// Every shard's unlisted count is taken first, then each shard's lock, in that order: a
    /// task that lists itself moves from a count to a slab (maybe another shard's) under that
    /// slab's lock, so it is met by exactly one of the two steps (see
    /// [`set_task_waker`](Self::set_task_waker)). Taking one shard's count and then its slab
    /// before the next shard's count would miss a task that moves from a shard whose count is
    /// not taken yet into a slab already walked.
    ///
    /// A waker that panics does not keep the others asleep: its panic is kept in `caught`.
    pub(super) fn take_for_quarantine(
        &self,
        caught: &mut Caught,
    ) -> (Vec<Arc<TicketCell<R>>>, usize) {
        let mut tickets = Vec::new();
        // Unlisted tasks are in their first poll or about to be polled: they need no waking,
        // they find the epoch bumped when they return `Pending` or finish.
        let mut tasks: usize = self.shards.iter().map(|s| s.quarantine_unlisted()).sum();
        let mut wakers = Vec::new();
        for shard in &self.shards {
            let mut cells = shard.cells.lock();
            cells.quarantined = true;
            let task_slots: Vec<usize> = cells
                .slab
                .iter()
                .filter_map(|(k, e)| match e {
                    Entry::Ticket(c) => {
                        tickets.push(c.clone());
                        None
                    }
                    Entry::Task { .. } => Some(k),
                })
                .collect();
            for k in task_slots {
                if let Entry::Task { waker, .. } = cells.slab.remove(k) {
                    tasks += 1;
                    wakers.push(waker);
                }
            }
        }
        // Woken (with no lock held), not just dropped: a quarantined task is no longer listed,
        // so no later cancel can find it. Woken, it polls, finds itself unlisted and stops
        // (`poll_cancel_task`). A quarantine can come before the cancel reached the task's node
        // (it may overtake a cancel walk, or run without a cancel at all).
        for w in wakers {
            caught.wake(w);
        }
        (tickets, tasks)
    }
}
