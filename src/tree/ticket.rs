//! The shared cell of one registered child: its state and its identity.

use std::task::Waker;

use crate::sync::{AtomicU8, Mutex, Ordering};

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
    /// The waker of the task that runs this child, while it waits (tasks only): the node's
    /// cancel wakes it (see `poll_cancel_ticket`).
    waker: Mutex<Option<Waker>>,
}

impl<R> TicketCell<R> {
    pub(crate) fn new(key: usize, generation: u64, info: R) -> Self {
        TicketCell {
            state: AtomicU8::new(TicketState::Prepared as u8),
            key,
            generation,
            info: Mutex::new(info),
            waker: Mutex::new(None),
        }
    }

    /// Keeps `waker` for the node's cancel (replacing an older one).
    pub(crate) fn set_waker(&self, waker: &Waker) {
        let mut slot = self.waker.lock();
        let old = match &mut *slot {
            Some(w) if w.will_wake(waker) => None,
            other => other.replace(waker.clone()),
        };
        drop(slot);
        // Dropped with no lock held.
        drop(old);
    }

    /// A copy of the waker kept by [`set_waker`](Self::set_waker).
    pub(crate) fn waker(&self) -> Option<Waker> {
        self.waker.lock().clone()
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
