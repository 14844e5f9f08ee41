//! Deadline timers: one driver task per tree of scopes that has deadlines.
//!
//! A scope only needs a timer when it *tightens* the deadline it inherits; a child that keeps
//! its parent's deadline is cancelled by the parent's. All timers of one tree share a heap and
//! one tokio task that sleeps until the earliest deadline and cancels whatever is due, so
//! creating a child with a deadline costs a heap push under a lock, not a task or a timer-wheel
//! entry, and deadlines fire whether or not anyone polls the scope.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use slab::Slab;
use tokio::time::Instant;

use super::{stamp_of, Core};
use crate::cause::Cause;
use crate::sync::{Arc, Mutex};
use crate::tree;

/// The timers of one tree of scopes.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    state: Mutex<TimerState>,
    wake: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct TimerState {
    /// Live entries: deadline, sequence number, node.
    entries: Slab<(Instant, u64, Arc<Core>)>,
    /// Earliest first; may hold stale items whose slab slot was removed or reused (checked
    /// against the sequence number and dropped lazily, compacted when they dominate).
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    seq: u64,
    /// The deadline the driver sleeps until, if it runs.
    armed: Option<Instant>,
    running: bool,
}

impl TimerState {
    /// Adds an entry; returns its key.
    fn push(&mut self, deadline: Instant, node: Arc<Core>) -> usize {
        self.seq += 1;
        let seq = self.seq;
        let key = self.entries.insert((deadline, seq, node));
        self.heap.push(Reverse((deadline, seq, key)));
        key
    }
}

impl Timers {
    /// Arms a deadline for `node`; returns the key for [`Timers::remove`].
    ///
    /// An associated function rather than a `self: &Arc<Self>` method: under `cfg(loom)` the
    /// shim's `Arc` is loom's, which cannot be a method receiver on stable Rust.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (the driver is a tokio task), like `tokio::time::sleep`.
    #[track_caller]
    pub(crate) fn insert(this: &Arc<Self>, deadline: Instant, node: Arc<Core>) -> usize {
        let mut st = this.state.lock();
        if !st.running {
            drop(st);
            // Before any state changes: outside a runtime this panics and leaves nothing
            // behind. Only a tree without a running driver needs the runtime's handle.
            let handle = tokio::runtime::Handle::try_current()
                .expect("a scope with a deadline must be created inside a tokio runtime");
            st = this.state.lock();
            if !st.running {
                st.running = true;
                st.armed = Some(deadline);
                let key = st.push(deadline, node);
                drop(st);
                handle.spawn(drive(this.clone()));
                return key;
            }
        }
        let key = st.push(deadline, node);
        if st.armed.is_none_or(|a| deadline < a) {
            st.armed = Some(deadline);
            drop(st);
            this.wake.notify_one();
        }
        key
    }

    /// Disarms the deadline of a scope whose last handle was dropped.
    ///
    /// `key` may be stale: if the deadline already fired, its slot was freed and may now hold
    /// another scope's entry, which must stay armed. So the entry is removed only if it is
    /// `node`'s (a node arms at most one timer).
    pub(crate) fn remove(&self, key: usize, node: &Core) {
        let mut st = self.state.lock();
        if st
            .entries
            .get(key)
            .is_some_and(|(_, _, n)| std::ptr::eq::<Core>(&**n, node))
        {
            st.entries.remove(key);
        }
        let stale = st.heap.len() - st.entries.len();
        if stale > 64 && stale > st.entries.len() {
            // Keep memory proportional to live deadlines (invariant 7).
            let live: Vec<_> = st
                .entries
                .iter()
                .map(|(k, (d, s, _))| Reverse((*d, *s, k)))
                .collect();
            st.heap = BinaryHeap::from(live);
        }
        if st.entries.is_empty() && st.running {
            drop(st);
            // Let the driver notice that nothing is left and exit.
            self.wake.notify_one();
        }
    }

    /// Pops every due entry; returns them and the next deadline (`None`: the driver stops).
    fn due(&self, now: Instant) -> (Vec<Arc<Core>>, Option<Instant>) {
        let mut st = self.state.lock();
        let mut fired = Vec::new();
        while let Some(Reverse((deadline, seq, key))) = st.heap.peek().copied() {
            let live = st.entries.get(key).is_some_and(|e| e.1 == seq);
            if !live {
                st.heap.pop();
                continue;
            }
            if deadline > now {
                break;
            }
            st.heap.pop();
            fired.push(st.entries.remove(key).2);
        }
        let next = st.heap.peek().map(|Reverse((d, _, _))| *d);
        st.armed = next;
        if next.is_none() {
            st.running = false;
            st.heap.clear();
        }
        (fired, next)
    }
}

/// Marks the driver stopped if its task ends abnormally (a panic, its runtime shutting down),
/// so that the next deadline starts a new one. A normal exit is marked by `Timers::due`, under
/// the lock, and must not be touched afterwards: a new driver may already run.
struct Running {
    timers: Arc<Timers>,
    stopped: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.stopped {
            let mut st = self.timers.state.lock();
            st.running = false;
            st.armed = None;
        }
    }
}

async fn drive(timers: Arc<Timers>) {
    let mut running = Running {
        timers: timers.clone(),
        stopped: false,
    };
    loop {
        let now = Instant::now();
        let (fired, next) = timers.due(now);
        let stamp = stamp_of(now);
        for node in fired {
            // A panicking `on_cancel` callback is the user's bug, but it must not stop the
            // other deadlines of this tree: the cancel itself has completed (callbacks run
            // after the walk), so the panic is contained here and dropped.
            let cancel = std::panic::AssertUnwindSafe(|| {
                tree::cancel(&node, Cause::DeadlineExceeded, stamp);
            });
            let _ = std::panic::catch_unwind(cancel);
        }
        let Some(next) = next else {
            // `due` already marked the driver stopped, under the lock.
            running.stopped = true;
            return;
        };
        tokio::select! {
            biased;
            _ = timers.wake.notified() => {}
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}
