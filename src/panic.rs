//! Containing the panics of user code that the crate runs on behalf of others (wakers,
//! `on_cancel` callbacks, a retry's operation), so that the step that ran it goes on to its
//! end: used by the tree core and by every layer above that runs such code.

use std::task::Waker;

/// The first panic of the wakers (and callbacks) that a step of the tree runs for others — a
/// cancel walk, a close, a release that makes nodes quiet, a quarantine — kept while the
/// step goes on to its end, and resumed by its caller after that. A waker that panics (a
/// user's own `Wake` implementation) so cannot leave part of a subtree uncancelled or
/// unclosed (invariants 1, 3), other waiters asleep, or units and receipts of a quarantine
/// unrecorded (invariants 5, 6).
#[derive(Default)]
#[must_use = "the panic is resumed by `resume`"]
pub(crate) struct Caught(Option<Box<dyn std::any::Any + Send>>);

impl Caught {
    /// Wakes `waker`, keeping its panic.
    pub(crate) fn wake(&mut self, waker: Waker) {
        self.run(move || waker.wake());
    }

    /// Runs `f` and returns what it returned; if it panics, keeps its panic (the first one
    /// kept wins) and returns `None`.
    pub(crate) fn run<T>(&mut self, f: impl FnOnce() -> T) -> Option<T> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(out) => Some(out),
            Err(panic) => {
                self.0.get_or_insert(panic);
                None
            }
        }
    }

    /// Resumes the first panic kept, if any, unless this thread is unwinding already: a step
    /// run by a `Drop` during an unwind (a ticket, guard or task dropped by a body that
    /// panicked gives its unit back, which may make a scope quiet and wake its `quiesce()`s)
    /// would abort the process by unwinding out of that `Drop`. The kept panic is dropped
    /// then (the panic hook reported it when it was raised), and the first panic goes on.
    #[inline]
    pub(crate) fn resume(self) {
        if let Some(panic) = self.0 {
            resume_kept(panic);
        }
    }
}

/// Runs `f` and contains its panic, if any, whole: the payload is dropped here, and a panic of
/// that drop (`panic_any` of a value that panics as it is dropped) is contained too, its own
/// payload leaked rather than dropped. For steps that must go on after a user's callback
/// panicked (the deadline timer, a shield's quarantine), where nobody could receive the panic.
pub(crate) fn contain_panic(f: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let dropped = std::panic::AssertUnwindSafe(move || drop(payload));
        if let Err(again) = std::panic::catch_unwind(dropped) {
            std::mem::forget(again);
        }
    }
}

/// [`Caught::resume`] with a panic kept: out of line, as it is rare.
#[cold]
#[inline(never)]
fn resume_kept(panic: Box<dyn std::any::Any + Send>) {
    if !std::thread::panicking() {
        std::panic::resume_unwind(panic);
    }
}
