//! Wakers with a behaviour of their own, as executors and users write them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{RawWaker, RawWakerVTable, Wake, Waker};

/// A waker that borrows its task from a place that is reused (a slot of an executor's task
/// table, a stack frame): its data address is the slot's, and a clone is an owned waker of the
/// task the slot holds at the time of the clone. Valid under the `RawWaker` contract (the
/// borrowed waker never outlives the slot); `will_wake` of two borrowed wakers of one slot is
/// true, of a borrowed waker and an owned clone false.
pub struct Slot {
    pub task: std::sync::Mutex<Arc<AtomicBool>>,
}

static BORROWED: RawWakerVTable = RawWakerVTable::new(
    borrowed_clone,
    borrowed_wake_by_ref,
    borrowed_wake_by_ref,
    |_| {},
);
static OWNED: RawWakerVTable =
    RawWakerVTable::new(owned_clone, owned_wake, owned_wake_by_ref, owned_drop);

fn slot_of<'a>(p: *const ()) -> &'a Slot {
    // SAFETY: a borrowed waker's data is a `Slot` that outlives it.
    unsafe { &*p.cast::<Slot>() }
}
fn borrowed_clone(p: *const ()) -> RawWaker {
    let task = slot_of(p).task.lock().unwrap().clone();
    RawWaker::new(Arc::into_raw(task).cast(), &OWNED)
}
fn borrowed_wake_by_ref(p: *const ()) {
    slot_of(p)
        .task
        .lock()
        .unwrap()
        .store(true, Ordering::SeqCst);
}
fn owned_clone(p: *const ()) -> RawWaker {
    // SAFETY: an owned waker's data is an `Arc<AtomicBool>` it holds one count of.
    unsafe { Arc::increment_strong_count(p.cast::<AtomicBool>()) };
    RawWaker::new(p, &OWNED)
}
fn owned_wake(p: *const ()) {
    owned_wake_by_ref(p);
    owned_drop(p);
}
fn owned_wake_by_ref(p: *const ()) {
    // SAFETY: as in `owned_clone`.
    unsafe { &*p.cast::<AtomicBool>() }.store(true, Ordering::SeqCst);
}
fn owned_drop(p: *const ()) {
    // SAFETY: as in `owned_clone`; this gives back the waker's count.
    drop(unsafe { Arc::from_raw(p.cast::<AtomicBool>()) });
}

/// A waker borrowing the task `slot` holds (see [`Slot`]).
pub fn borrowed_waker(slot: &Slot) -> Waker {
    let data = std::ptr::from_ref(slot).cast::<()>();
    // SAFETY: the vtable's functions follow the `RawWaker` contract for `data`.
    unsafe { Waker::from_raw(RawWaker::new(data, &BORROWED)) }
}

/// Counts its wake-ups and, on the first one, runs its hook if it has one (on the waking
/// thread, as any waker's `wake` runs).
#[derive(Default)]
pub struct Counts {
    woken: AtomicUsize,
    on_first_wake: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Counts {
    /// A counting waker that runs `hook` when it is first woken.
    pub fn with_hook(hook: impl FnOnce() + Send + 'static) -> Arc<Counts> {
        Arc::new(Counts {
            woken: AtomicUsize::new(0),
            on_first_wake: Mutex::new(Some(Box::new(hook))),
        })
    }

    /// How many times it was woken.
    pub fn woken(&self) -> usize {
        self.woken.load(Ordering::SeqCst)
    }
}

impl Wake for Counts {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.fetch_add(1, Ordering::SeqCst);
        let hook = self.on_first_wake.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
    }
}
