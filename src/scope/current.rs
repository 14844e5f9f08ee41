//! The thread-local current scope: [`Scope::current`] inside [`Scope::run`], a spawned task
//! and the server layers.

use std::mem::ManuallyDrop;

use super::Scope;

#[cfg(not(loom))]
thread_local! {
    /// The scope of the running task, like a tokio task-local: the future that runs the
    /// task's work ([`Run`], a spawned task) moves its handle in for the length of each poll
    /// (and of the work's drop) and back out after, so a poll costs no reference count.
    /// `ManuallyDrop`: the slot is empty whenever no such call runs, so it needs no destructor,
    /// and a thread-local without one costs one plain access (no registration, no state
    /// check).
    static CURRENT: std::cell::Cell<ManuallyDrop<Option<Scope>>> =
        const { std::cell::Cell::new(ManuallyDrop::new(None)) };
}

// Under loom, one slot per model thread (all of them run on one OS thread, switching at each
// loom operation, also while a task's work is polled with its scope in the slot).
#[cfg(loom)]
crate::sync::loom_thread_local! {
    static CURRENT: std::cell::Cell<ManuallyDrop<Option<Scope>>> =
        std::cell::Cell::new(ManuallyDrop::new(None));
}

/// Puts `value` in the current-scope slot and returns what was there.
#[inline]
pub(super) fn swap_current(value: Option<Scope>) -> Option<Scope> {
    CURRENT.with(|c| ManuallyDrop::into_inner(c.replace(ManuallyDrop::new(value))))
}

/// Runs `f` with the scope in `slot` current: moved into the thread's slot, and back out
/// after, also when `f` panics. Nested calls stack: the inner call's `slot` holds the outer
/// scope meanwhile.
#[inline(always)]
pub(crate) fn with_current<R>(slot: &mut Option<Scope>, f: impl FnOnce() -> R) -> R {
    struct Back<'a>(&'a mut Option<Scope>);
    impl Drop for Back<'_> {
        #[inline]
        fn drop(&mut self) {
            *self.0 = swap_current(self.0.take());
        }
    }
    *slot = swap_current(slot.take());
    let _back = Back(slot);
    f()
}
