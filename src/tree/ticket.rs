//! The shared cell of one registered child (its state and its identity), and the list of a
//! node's children in flight: registered tickets and spawned tasks without a receipt yet.

use std::task::Waker;

use slab::Slab;

use crate::sync::{arc_in_place, Arc, AtomicU8, Mutex, Ordering};

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

/// Shared between the ticket's owner and the node's in-flight list (for quarantine).
#[derive(Debug)]
pub(crate) struct TicketCell<R> {
    state: AtomicU8,
    key: usize,
    generation: u64,
    /// What the child is; its owner may add to it after dispatch (a provider handle), so
    /// that a quarantine reports what the owner knew.
    info: Mutex<R>,
}

impl<R> TicketCell<R> {
    pub(crate) fn new(key: usize, generation: u64, info: R) -> Self {
        TicketCell {
            state: AtomicU8::new(TicketState::Prepared as u8),
            key,
            generation,
            info: Mutex::new(info),
        }
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
/// thread ends them, seldom wait for the registering thread's lock.
const SHARDS: usize = 4;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
const SHARD_MASK: usize = SHARDS - 1;

/// Where a spawned task is listed in its node's in-flight list: its shard and slot, and a
/// sequence number, because a slot can be reused once a quarantine took the task out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TaskKey {
    key: usize,
    seq: u64,
}

/// One child in flight.
enum Entry<R> {
    /// A ticket: its state lives in the shared cell (the owner moves it without this lock).
    Ticket(Arc<TicketCell<R>>),
    /// A spawned task, kept inline (no allocation of its own): whoever takes the entry out of
    /// the list under the shard lock, the task's receipt or a quarantine, records the one
    /// receipt (invariant 5). Tasks all have the same spec, given to the quarantine, so the
    /// entry is three words (it is moved in and out of the list for every task).
    Task {
        seq: u64,
        /// The task's waker while it waits, for the node's cancel.
        waker: Option<Waker>,
    },
}

struct ShardCells<R> {
    slab: Slab<Entry<R>>,
    next_seq: u64,
}

/// One shard of a node's in-flight list, padded so that two shards' locks never share a
/// cache line.
struct InFlightShard<R> {
    cells: Mutex<ShardCells<R>>,
    _pad: [u8; 64],
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
                cells: Mutex::new(ShardCells {
                    slab: Slab::new(),
                    next_seq: 0,
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

/// The shard for the next child this thread registers (round robin). Always the first under
/// loom: a counter that lives on from one explored execution to the next would make the model
/// nondeterministic (and one shard is the case where everything contends).
fn next_shard() -> usize {
    use std::cell::Cell;
    if cfg!(loom) {
        return 0;
    }
    thread_local!(static NEXT: Cell<usize> = const { Cell::new(0) });
    NEXT.with(|n| {
        let v = n.get();
        n.set(v.wrapping_add(1));
        v & SHARD_MASK
    })
}

impl<R> InFlight<R> {
    /// Lists a ticket; `make` gets its key.
    pub(super) fn list_ticket(
        &self,
        make: impl FnOnce(usize) -> TicketCell<R>,
    ) -> Arc<TicketCell<R>> {
        let shard = next_shard();
        let mut cells = self.shards[shard].cells.lock();
        let entry = cells.slab.vacant_entry();
        let key = (entry.key() << SHARD_BITS) | shard;
        let cell = arc_in_place(|| make(key));
        entry.insert(Entry::Ticket(cell.clone()));
        cell
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

    /// Lists a task.
    pub(super) fn list_task(&self) -> TaskKey {
        let shard = next_shard();
        let mut cells = self.shards[shard].cells.lock();
        let seq = cells.next_seq;
        cells.next_seq = seq.wrapping_add(1);
        let key = cells.slab.insert(Entry::Task { seq, waker: None });
        TaskKey {
            key: (key << SHARD_BITS) | shard,
            seq,
        }
    }

    /// Takes a task out of the list for its receipt. `false`: a quarantine took it first.
    pub(super) fn unlist_task(&self, task: TaskKey) -> bool {
        let mut cells = self.shards[task.key & SHARD_MASK].cells.lock();
        let slot = task.key >> SHARD_BITS;
        if !matches!(cells.slab.get(slot), Some(Entry::Task { seq, .. }) if *seq == task.seq) {
            return false;
        }
        let removed = cells.slab.remove(slot);
        drop(cells);
        // The waker (a reference to a task) is dropped with no lock held.
        drop(removed);
        true
    }

    /// Keeps the waker of a listed task (replacing an older one). `false`: not listed any more.
    pub(super) fn set_task_waker(&self, task: TaskKey, waker: &Waker) -> bool {
        let mut cells = self.shards[task.key & SHARD_MASK].cells.lock();
        let Some(Entry::Task { seq, waker: slot }) = cells.slab.get_mut(task.key >> SHARD_BITS)
        else {
            return false;
        };
        if *seq != task.seq {
            return false;
        }
        if slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            return true;
        }
        let old = slot.replace(waker.clone());
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
                Entry::Task { waker, .. } => waker.clone(),
                Entry::Ticket(_) => None,
            }));
        }
    }

    /// For a quarantine: copies of the listed tickets' cells (each is decided by its CAS), and
    /// the number of listed tasks, which are taken out here (decided by this lock).
    pub(super) fn take_for_quarantine(&self) -> (Vec<Arc<TicketCell<R>>>, usize) {
        let mut tickets = Vec::new();
        let mut tasks = 0;
        let mut wakers = Vec::new();
        for shard in &self.shards {
            let mut cells = shard.cells.lock();
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
                    wakers.extend(waker);
                }
            }
        }
        // Woken (with no lock held), not just dropped: a quarantined task is no longer listed,
        // so no later cancel can find it. Woken, it polls, finds itself unlisted and stops
        // (`poll_cancel_task`). A quarantine can come before the cancel reached the task's node
        // (it may overtake a cancel walk, or run without a cancel at all).
        for w in wakers {
            w.wake();
        }
        (tickets, tasks)
    }
}
