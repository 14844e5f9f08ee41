//! Deadline timers: one heap and one driver task per thread and runtime, shared by every tree
//! of scopes made there.
//!
//! A scope only needs a timer when it *tightens* the deadline it inherits; a child that keeps
//! its parent's deadline is cancelled by the parent's. All timers of one tree share a heap and
//! one tokio task that sleeps until the earliest deadline and cancels whatever is due, so
//! creating a child with a deadline costs a heap push under a lock, not a task or a timer-wheel
//! entry, and deadlines fire whether or not anyone polls the scope.
//!
//! # One heap per thread and runtime
//!
//! A tree takes its heap when its first deadline is set (a root with a deadline, or the first
//! child that tightens one): the heap of the calling thread for the current runtime
//! ([`Timers::for_this_thread`]). So the trees that a server's worker makes one after another,
//! one per request, share one heap and one driver task, and a request's root with a deadline
//! costs a push, not a task spawned, polled and ended (that was most of its cost). Each worker
//! has a heap of its own: their locks are not shared. A runtime has its own heaps (its clock
//! may be paused, its driver tasks run on it), told apart by [`tokio::runtime::Id`]. A child
//! that tightens a deadline in another runtime than its tree's takes the heap of its own thread
//! and runtime ([`Timers::for_child_of`]): its deadline was read on that runtime's clock.
//!
//! The driver exits [`LINGER`] after no entry of its heap is live. The scope whose entry was
//! the last live one does not wake it (a task woken and polled at the end of every request
//! that has the worker to itself was a fifth of a request root's cost): it stamps the time
//! ([`Timers::count_gone`]), and the driver, which never sleeps longer than [`LINGER`] at a
//! time, reads the live count under the lock when it wakes: with none live it drops every
//! entry, whether or not their nodes are freed yet, and lingers until [`LINGER`] after that
//! stamp, the heap armed at that instant. A push meanwhile keeps it (one of an earlier
//! deadline notifies it; a later one is found when the sleep ends, without waking it per
//! push); at the end of the linger, with the heap still empty, it exits (a push that comes
//! after starts a new driver). So a program whose scopes have all gone has no timer task left
//! 100 ms later, a server's worker whose requests come and go one at a time — none live
//! between two — keeps one driver instead of spawning one per request, and a driver with live
//! deadlines also wakes every 100 ms between them (at least that often).
//!
//! # Disarming without the lock
//!
//! An entry holds a weak reference to its scope's node. A scope whose last handle goes does
//! not take the lock to take its entry out: the entry is dead once the node is freed (its
//! weak reference no longer upgrades), and dead entries are dropped lazily, when they reach
//! the top of the heap or by a compaction. The scope only counts itself gone
//! ([`Timers::count_gone`]), and a compaction runs once the gone scopes since the last one
//! reach half the entries that one left (at least [`MIN_COMPACTION`]): its cost, linear in
//! the heap, is at most three times the number of gone scopes that paid for it, and the dead
//! entries are at most half the live ones plus that minimum. Counts can be lost: scopes that
//! go at once on several threads may each store the same count, and a thread stalled between
//! its load and its store can take the count back by every increment made meanwhile. So an
//! insert also compacts once the heap has doubled since the last compaction (plus the
//! minimum): whatever the counts, the heap holds at most about twice the live deadlines
//! (invariant 7), at the same amortized cost. The node's allocation (not its contents, which
//! go with its last strong reference) lives until its entry is dropped. The heap's own room
//! is given back as it empties (`Heap::trim`): a thread's heap lives as long as its runtime,
//! and must not keep the peak of a burst of deadlines long gone.

use tokio::time::Instant;

use super::Core;
use crate::cause::Cause;
use crate::panic::contain_panic;
use crate::sync::{downgrade, Arc, AtomicU64, AtomicUsize, Mutex, Ordering, Weak};
use crate::time::{deadline_after, instant_of, now_stamp, stamp_of, FAR};

/// The fewest gone scopes that start a compaction: the compaction frees their nodes'
/// allocations at once, and up to this many fit the allocator's per-thread cache (glibc's
/// tcache holds 7 chunks of a size), from which the next nodes are allocated.
const MIN_COMPACTION: usize = 7;

/// How long a driver with no live entry stays for the next one before it exits (see the module
/// docs): a task spawned, polled and ended per request costs about as much as the rest of the
/// request's root.
pub(crate) const LINGER: std::time::Duration = std::time::Duration::from_millis(100);

/// The most scopes the driver cancels in one poll before it lets the worker run other tasks.
const FIRED_PER_POLL: usize = 32;

/// The deadline timers of the trees one thread makes in one runtime (see the module docs).
#[derive(Debug)]
pub(crate) struct Timers {
    state: Mutex<TimerState>,
    wake: tokio::sync::Notify,
    /// Scopes with an entry that have gone, counted without a read-modify-write: counts can
    /// be lost under races, which only delays a compaction (see the module docs).
    gone: AtomicUsize,
    /// The value of `gone` that starts the next compaction.
    compact_at: AtomicUsize,
    /// Entries whose scope has not counted itself gone (counted under the lock, before the
    /// push): the driver that reads 0 drops every entry and exits [`LINGER`] after `last_gone`.
    live: AtomicUsize,
    /// When the last live entry's scope went ([`crate::time::stamp_of`] of this runtime's
    /// clock; `0`: it went elsewhere and woke the driver), stored without a lock. A stale one
    /// only shortens the linger (the next deadline starts a new driver): no missed deadline.
    last_gone: AtomicU64,
    /// The runtime whose thread made these timers (`None`: made outside a runtime): its clock
    /// is the one the driver reads, and the driver is its task. (Under loom a tree keeps one
    /// heap: not read.)
    #[cfg_attr(loom, allow(dead_code))]
    runtime: Option<tokio::runtime::Id>,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            runtime: None,
            state: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            gone: AtomicUsize::new(0),
            compact_at: AtomicUsize::new(MIN_COMPACTION),
            live: AtomicUsize::new(0),
            last_gone: AtomicU64::new(0),
        }
    }
}

/// A deadline and the scope it cancels.
#[derive(Debug)]
struct Entry {
    deadline: Instant,
    node: Weak<Core>,
}

impl Entry {
    /// Whether the scope has gone and its node was freed: nothing is left to cancel.
    fn is_dead(&self) -> bool {
        self.node.strong_count() == 0
    }
}

/// A binary min-heap of entries by deadline.
///
/// Not `std`'s `BinaryHeap`: its push writes the entry and at once reads it back whole for
/// the sift (a store-forwarding stall on every push). Here the new deadline stays in a
/// register, and the usual push (deadlines that come later than their parent's: most
/// scopes are made with the same timeout) compares one parent and moves nothing.
#[derive(Debug, Default)]
struct Heap(Vec<Entry>);

impl Heap {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn peek(&self) -> Option<&Entry> {
        self.0.first()
    }

    /// Always inlined: an entry passed through memory is read back right after it was
    /// written (a store-forwarding stall).
    #[inline(always)]
    fn push(&mut self, entry: Entry) {
        let deadline = entry.deadline;
        let mut i = self.0.len();
        self.0.push(entry);
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.0[parent].deadline <= deadline {
                break;
            }
            self.0.swap(i, parent);
            i = parent;
        }
    }

    fn pop(&mut self) -> Option<Entry> {
        if self.0.is_empty() {
            return None;
        }
        let top = self.0.swap_remove(0);
        self.sift_down(0);
        Some(top)
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.0.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if l < n && self.0[l].deadline < self.0[least].deadline {
                least = l;
            }
            if r < n && self.0[r].deadline < self.0[least].deadline {
                least = r;
            }
            if least == i {
                return;
            }
            self.0.swap(i, least);
            i = least;
        }
    }

    /// Keeps the entries `keep` says, and restores the heap order (linear).
    fn retain(&mut self, keep: impl FnMut(&Entry) -> bool) {
        self.0.retain(keep);
        for i in (0..self.0.len() / 2).rev() {
            self.sift_down(i);
        }
        self.trim();
    }

    /// Gives back the room of entries that have gone: a thread's heap lives as long as its
    /// runtime, so a burst of deadlines must not keep its peak once it has fired or gone
    /// (invariant 7). Shrinks to twice the entries once the room is four times that (above a
    /// floor): each shrink, linear, follows at least as many removals.
    fn trim(&mut self) {
        let floor = 4 * MIN_COMPACTION;
        if self.0.capacity() > 4 * self.0.len().max(floor) {
            self.0.shrink_to((2 * self.0.len()).max(floor));
        }
    }
}

#[derive(Debug, Default)]
struct TimerState {
    /// Earliest first; may hold dead entries (see the module docs).
    heap: Heap,
    /// The deadline the driver sleeps until, if it runs.
    armed: Option<Instant>,
    running: bool,
    /// The heap size at which an insert compacts (see the module docs); 0 until the first
    /// compaction sets it.
    limit: usize,
}

impl Timers {
    /// The timers of the calling thread for the current runtime (see the module docs); new
    /// ones outside a runtime (whose first [`insert`](Self::insert) then panics, as
    /// `tokio::time::sleep` would).
    #[cfg(not(loom))]
    pub(crate) fn for_this_thread() -> Arc<Timers> {
        use std::cell::RefCell;
        thread_local! {
            static TIMERS: RefCell<Option<(tokio::runtime::Id, Arc<Timers>)>> =
                const { RefCell::new(None) };
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Arc::new(Timers::default());
        };
        let id = handle.id();
        drop(handle);
        TIMERS
            .try_with(|kept| {
                let mut kept = kept.borrow_mut();
                match &*kept {
                    Some((of, timers)) if *of == id => timers.clone(),
                    _ => {
                        // A runtime this thread has not made deadlines in (or not since it
                        // made them in another): the old one's heap goes with its scopes.
                        let timers = Timers::of(id);
                        *kept = Some((id, timers.clone()));
                        timers
                    }
                }
            })
            // The thread is exiting (its thread-locals are being destroyed).
            .unwrap_or_else(|_| Timers::of(id))
    }

    /// New timers of the runtime `id`.
    #[cfg(not(loom))]
    fn of(id: tokio::runtime::Id) -> Arc<Timers> {
        Arc::new(Timers {
            runtime: Some(id),
            ..Timers::default()
        })
    }

    /// The timers for a child that tightens its deadline, if not `tree`'s (the timers of its
    /// tree, if any): those of the calling thread when the tree has none, or when the tree's
    /// belong to another runtime than the current one. A scope made in one runtime may be used
    /// in another, whose clock may differ (a paused one runs ahead of the real clock once
    /// advanced) and which may be idle or gone while this one runs: a deadline read on this
    /// runtime's clock is watched by this runtime's clock, on this runtime. Outside a runtime,
    /// the tree's (they may still have a driver).
    #[cfg(not(loom))]
    pub(crate) fn for_child_of(tree: Option<&Arc<Timers>>) -> Option<Arc<Timers>> {
        let Some(timers) = tree else {
            return Some(Timers::for_this_thread());
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if timers.runtime != Some(handle.id()) => {
                drop(handle);
                Some(Timers::for_this_thread())
            }
            _ => None,
        }
    }

    /// Under loom a tree keeps one heap.
    #[cfg(loom)]
    pub(crate) fn for_child_of(tree: Option<&Arc<Timers>>) -> Option<Arc<Timers>> {
        tree.is_none().then(Timers::for_this_thread)
    }

    /// Under loom no timer is ever armed (there is no runtime): a heap per tree.
    #[cfg(loom)]
    pub(crate) fn for_this_thread() -> Arc<Timers> {
        Arc::new(Timers::default())
    }

    /// Arms a deadline for `node`, which counts itself gone ([`count_gone`](Self::count_gone))
    /// when its last handle goes.
    ///
    /// An associated function rather than a `self: &Arc<Self>` method: under `cfg(loom)` the
    /// shim's `Arc` is loom's, which cannot be a method receiver on stable Rust.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (the driver is a tokio task), or in one without a timer, like
    /// `tokio::time::sleep`.
    #[track_caller]
    pub(crate) fn insert(this: &Arc<Self>, deadline: Instant, node: &Arc<Core>) {
        let entry = Entry {
            deadline,
            node: downgrade(node),
        };
        let mut st = this.state.lock();
        if !st.running {
            drop(st);
            // Before any state changes: outside a runtime this panics and leaves nothing
            // behind. Only a tree without a running driver needs the runtime's handle.
            let handle = tokio::runtime::Handle::try_current()
                .expect("a scope with a deadline must be created inside a tokio runtime");
            // The driver's sleep, made here: in a runtime without a timer (no `enable_time`)
            // this panics in the caller, as `tokio::time::sleep` would, not in a driver task
            // nobody sees, leaving a deadline that never fires. Reset before it is polled.
            let sleep = tokio::time::sleep_until(deadline);
            st = this.state.lock();
            if !st.running {
                st.running = true;
                st.armed = Some(deadline);
                this.count_live();
                st.heap.push(entry);
                drop(st);
                // The guard goes into the task's future, not made in its first poll: a runtime
                // dropped before the task ran (a current-thread runtime runs spawned tasks
                // only while it blocks) drops the future unpolled, and the guard with it.
                let running = Running {
                    timers: this.clone(),
                    stopped: false,
                };
                handle.spawn(drive(running, sleep));
                return;
            }
        }
        this.count_live();
        st.heap.push(entry);
        if st.heap.len() >= st.limit.max(4 * MIN_COMPACTION) {
            this.compact_locked(&mut st);
        }
        if st.armed.is_none_or(|a| deadline < a) {
            st.armed = Some(deadline);
            drop(st);
            this.wake.notify_one();
        }
    }

    /// Counts an entry live, under the lock, right before it is pushed (so never for an insert
    /// that panics): a driver that reads no entry live under the lock knows that the scope of
    /// every entry it holds has counted itself gone ([`due`](Self::due)).
    fn count_live(&self) {
        // Relaxed: the lock orders this before any load that sees the entry.
        self.live.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a scope with an entry whose last handle went (see the module docs); compacts
    /// the heap when enough have gone since the last compaction, and stamps the time when no
    /// entry is live any more (the driver finds it at its next wake-up, at most [`LINGER`]
    /// later, lingers until [`LINGER`] after the stamp, and exits if no deadline comes).
    pub(crate) fn count_gone(&self) {
        if self.live.fetch_sub(1, Ordering::Relaxed) == 1 {
            // The driver, reading no entry live, drops them all, even if it runs before this
            // scope's node is freed (see `due`).
            self.gone_here();
        }
        // Relaxed, and not a read-modify-write: the count only decides when to compact.
        let gone = self.gone.load(Ordering::Relaxed).saturating_add(1);
        self.gone.store(gone, Ordering::Relaxed);
        if gone >= self.compact_at.load(Ordering::Relaxed) {
            self.compact();
        }
    }

    /// Stamps when the last live scope went, on these timers' runtime's clock; one that goes
    /// outside it (another thread or runtime, a thread-local destructor, where tokio's clock
    /// would panic) wakes the driver instead, which reads its own clock (see `notified`).
    fn gone_here(&self) {
        #[cfg(not(loom))]
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            if Some(handle.id()) == self.runtime {
                self.last_gone.store(now_stamp(), Ordering::Relaxed);
                return;
            }
        }
        self.last_gone.store(0, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Drops the dead entries. The calling scope's own entry is not dead yet (the caller still
    /// holds its node): the next compaction drops it.
    fn compact(&self) {
        self.compact_locked(&mut self.state.lock());
    }

    fn compact_locked(&self, st: &mut TimerState) {
        st.heap.retain(|e| !e.is_dead());
        let left = st.heap.len();
        let next = self
            .gone
            .load(Ordering::Relaxed)
            .saturating_add((left / 2).max(MIN_COMPACTION));
        self.compact_at.store(next, Ordering::Relaxed);
        st.limit = left.saturating_mul(2).saturating_add(2 * MIN_COMPACTION);
    }

    /// Number of entries, live and dead (for memory tests).
    #[cfg(any(test, feature = "__test-hooks"))]
    pub(crate) fn entries(&self) -> usize {
        self.state.lock().heap.len()
    }

    /// Pops every due entry; returns the scopes to cancel and what the driver does next: sleep
    /// until the next deadline (at most [`LINGER`] from now), or with the heap empty, linger
    /// until `idle_until` (or [`LINGER`] from now, if it was not idle; [`LINGER`] after the
    /// last live scope went, if none is live) or, once that has passed, stop (marked stopped
    /// under the lock).
    ///
    /// With no entry live, every entry is dropped, whether or not the nodes are freed yet: the
    /// last scope to go counts itself gone before its last reference to its node goes (on
    /// another thread the driver can look in between), and the scope of every entry held has
    /// gone (an entry is counted live under the lock before it is pushed, and a scope counts
    /// itself gone after its insert): with no handle and no child left, its cancel reaches
    /// nobody.
    fn due(&self, now: Instant, idle_until: Option<Instant>) -> (Vec<Arc<Core>>, Next) {
        let mut st = self.state.lock();
        let mut fired = Vec::new();
        // Relaxed: an entry's count comes before its push, which the lock orders before this.
        let none_live = self.live.load(Ordering::Relaxed) == 0;
        let idle_until = if none_live {
            // Dropped in place, under the lock (a node's allocation may be freed here): the
            // heap keeps its room for the next deadlines, within `trim`'s bound.
            st.heap.0.clear();
            match self.last_gone.load(Ordering::Relaxed) {
                // Gone outside the runtime (see `gone_here`): the linger `notified` began, or
                // one from now.
                0 => Some(idle_until.unwrap_or_else(|| deadline_after(now, LINGER))),
                stamp => Some(deadline_after(instant_of(stamp).min(now), LINGER)),
            }
        } else {
            idle_until
        };
        while let Some(top) = st.heap.peek() {
            if top.deadline > now && !top.is_dead() {
                break;
            }
            let Some(entry) = st.heap.pop() else { break };
            if entry.deadline <= now {
                fired.extend(entry.node.upgrade());
            }
        }
        st.heap.trim();
        let next = match st.heap.peek().map(|e| e.deadline) {
            Some(at) => {
                // No longer than the linger: the driver finds the heap with none live then.
                let at = at.min(deadline_after(now, LINGER));
                st.armed = Some(at);
                Next::At(at)
            }
            None => match idle_until {
                Some(until) if now >= until => {
                    st.armed = None;
                    st.running = false;
                    Next::Stop
                }
                until => {
                    let until = until.unwrap_or_else(|| deadline_after(now, LINGER));
                    // Armed at the linger's end: only an earlier deadline notifies the driver.
                    st.armed = Some(until);
                    Next::Idle(until)
                }
            },
        };
        (fired, next)
    }

    /// For a driver that was notified (an earlier deadline was pushed, or the last live scope
    /// went outside its runtime) while it sleeps until
    /// `sleeping_until`: pops the dead entries on top, without reading the clock (what is due
    /// is handled when the sleep ends). Returns when to wake: the earlier of `sleeping_until`
    /// and the first live deadline (a sleep that ends before it), or if no entry is left,
    /// [`LINGER`] from now (the one read of the clock here): the driver lingers until then, the
    /// heap armed at that instant so that only a push of an earlier deadline notifies it (see
    /// the module docs).
    fn notified(&self, sleeping_until: Instant) -> Next {
        let mut st = self.state.lock();
        // Relaxed, and every entry dropped with none live, as in `due` (see `gone_here`).
        if self.live.load(Ordering::Relaxed) == 0 {
            st.heap.0.clear();
        } else {
            while st.heap.peek().is_some_and(Entry::is_dead) {
                st.heap.pop();
            }
        }
        st.heap.trim();
        let Some(first) = st.heap.peek().map(|e| e.deadline) else {
            let until = deadline_after(Instant::now(), LINGER);
            st.armed = Some(until);
            return Next::Idle(until);
        };
        let wake = first.min(sleeping_until);
        st.armed = Some(wake);
        Next::At(wake)
    }
}

/// What the driver does after a round of due deadlines ([`Timers::due`]).
enum Next {
    /// Sleeps until this instant: the earliest deadline in its heap, or [`LINGER`] from now if
    /// that is earlier (to find a heap with no entry live).
    At(Instant),
    /// Lingers with an empty heap until then, for the next deadline pushed (see the module
    /// docs).
    Idle(Instant),
    /// Stops: marked stopped under the lock, a new driver may start from now on.
    Stop,
}

/// Marks the driver stopped if its task ends abnormally (a panic, its runtime shutting down,
/// also before the task was ever polled), so that the next deadline starts a new one. A
/// normal exit is marked by `Timers::due`, under the lock, and must not
/// be touched afterwards: a new driver may already run.
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

/// The driver of `running`'s timers; `sleep`: its sleep, made by the insert that started it
/// (see `Timers::insert`), set before it is polled.
async fn drive(mut running: Running, sleep: tokio::time::Sleep) {
    let timers = running.timers.clone();
    // One sleep for the driver's life, moved only to an earlier deadline when notified (an
    // insert of an earlier deadline), so that a wake-up that changes nothing does not
    // re-register it in the runtime's timer wheel.
    tokio::pin!(sleep);
    // Set while the heap is empty: when the driver stops if no deadline comes.
    let mut idle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let (fired, next) = timers.due(now, idle_until);
        if matches!(next, Next::Stop) {
            // `due` marked the driver stopped, under the lock: a new driver may start while
            // this one still cancels (it yields below), and its state must not be touched.
            running.stopped = true;
        }
        let stamp = stamp_of(now);
        for (i, node) in fired.into_iter().enumerate() {
            // One driver serves every tree of its thread: a burst of deadlines (and their
            // `on_cancel` callbacks) lets the worker run other tasks every so often.
            if i > 0 && i % FIRED_PER_POLL == 0 {
                tokio::task::yield_now().await;
            }
            // A panicking `on_cancel` callback is the user's bug, but it must not stop the
            // other deadlines of this tree: the cancel itself has completed (callbacks run
            // after the walk), so the panic is contained here and dropped. Its payload may
            // panic as it is dropped (`panic_any` of such a value): that is contained too, and
            // the second payload leaked, not dropped, or the driver would end with the scopes
            // still in `fired`, and the rest of its heap, never cancelled.
            contain_panic(|| {
                super::deadline::cancel_node(&node, Cause::DeadlineExceeded, stamp);
            });
        }
        let next = match next {
            Next::Stop => return,
            Next::At(at) => {
                idle_until = None;
                at
            }
            Next::Idle(until) => *idle_until.insert(until),
        };
        // Not past `FAR` from now: tokio rounds a sleep's deadline up to its next millisecond,
        // which overflows for a deadline a caller put at the end of what an `Instant` holds.
        // The driver wakes then, finds nothing due, and sleeps on.
        sleep.as_mut().reset(next.min(deadline_after(now, FAR)));
        loop {
            tokio::select! {
                biased;
                () = timers.wake.notified() => {
                    let wake = match timers.notified(sleep.deadline()) {
                        Next::At(wake) => {
                            idle_until = None;
                            wake
                        }
                        Next::Idle(until) => *idle_until.insert(until),
                        Next::Stop => unreachable!("a notified driver lingers first"),
                    };
                    if wake < sleep.deadline() {
                        sleep.as_mut().reset(wake);
                    }
                }
                () = &mut sleep => break,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn entry(base: Instant, ms: u64) -> Entry {
        Entry {
            deadline: base + Duration::from_millis(ms),
            node: Weak::new(),
        }
    }

    /// A thread's heap lives as long as the thread's runtime (it is cached for the trees the
    /// thread makes next), so once a burst of deadlines has gone, fired or dropped, it must not
    /// keep the room the burst took (invariant 7: memory follows the live deadlines).
    #[tokio::test(start_paused = true)]
    async fn a_thread_heap_gives_back_the_room_of_a_burst() {
        let timers = Timers::for_this_thread();
        let capacity = || timers.state.lock().heap.0.capacity();
        let room = 4 * 4 * MIN_COMPACTION;

        // Dropped before their deadlines.
        let burst: Vec<_> = (0..10_000)
            .map(|_| crate::Scope::with_timeout(Duration::from_secs(30)))
            .collect();
        assert!(capacity() >= 10_000, "one heap for the burst");
        drop(burst);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(capacity() <= room, "dropped burst: capacity {}", capacity());

        // Fired at their deadlines.
        let burst: Vec<_> = (0..10_000)
            .map(|_| crate::Scope::with_timeout(Duration::from_millis(10)))
            .collect();
        assert!(capacity() >= 10_000, "one heap for the burst");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(burst.iter().all(crate::Scope::is_cancelled));
        drop(burst);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(capacity() <= room, "fired burst: capacity {}", capacity());
    }

    proptest! {
        /// Pushes, pops and a retain in any order give the deadlines back earliest first.
        #[test]
        fn the_heap_yields_deadlines_in_order(
            first in proptest::collection::vec(0u64..50, 0..64),
            then in proptest::collection::vec(0u64..50, 0..64),
            pops in 0usize..32,
            keep_odd in any::<bool>(),
        ) {
            let base = Instant::now();
            let mut heap = Heap::default();
            let mut model: Vec<u64> = Vec::new();
            for &ms in &first {
                heap.push(entry(base, ms));
                model.push(ms);
            }
            model.sort_unstable();
            for _ in 0..pops {
                let got = heap.pop().map(|e| e.deadline);
                let want = (!model.is_empty()).then(|| model.remove(0));
                prop_assert_eq!(got, want.map(|ms| base + Duration::from_millis(ms)));
            }
            if keep_odd {
                heap.retain(|e| (e.deadline - base).as_millis() % 2 == 1);
                model.retain(|ms| ms % 2 == 1);
            }
            for &ms in &then {
                heap.push(entry(base, ms));
                model.push(ms);
            }
            model.sort_unstable();
            prop_assert_eq!(heap.len(), model.len());
            let mut out = Vec::new();
            while let Some(e) = heap.pop() {
                out.push((e.deadline - base).as_millis() as u64);
            }
            prop_assert_eq!(out, model);
        }
    }
}
