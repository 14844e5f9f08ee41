//! A waiter that stays registered because a later poll came with "the same" waker must be
//! woken: the identity kept for the registered waker must name the waker kept in the list.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, RawWaker, RawWakerVTable, Waker};

use cancel_scope::Scope;

// A waker that borrows its task from a place that is reused (a slot of an executor's task
// table, a stack frame): its data address is the slot's, and a clone is an owned waker of the
// task the slot holds at the time of the clone. Valid under the `RawWaker` contract (the
// borrowed waker never outlives the slot); `will_wake` of two borrowed wakers of one slot is
// true, of a borrowed waker and an owned clone false.

struct Slot {
    task: std::sync::Mutex<Arc<AtomicBool>>,
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

fn borrowed_waker(slot: &Slot) -> Waker {
    let data = std::ptr::from_ref(slot).cast::<()>();
    // SAFETY: the vtable's functions follow the `RawWaker` contract for `data`.
    unsafe { Waker::from_raw(RawWaker::new(data, &BORROWED)) }
}

/// A waiter kept registered because a later poll came with "the same" waker must really be
/// the same: here the slot that the first poll's waker borrowed from now holds another task,
/// which must be the one woken by the cancel (the first task no longer waits). Keeping only
/// the passed waker's addresses, not those of the clone in the list, takes the second waker
/// for the first (the address is reused, the first waker is gone): a lost wake-up.
#[test]
fn a_waiter_polled_by_another_task_through_a_reused_waker_address_is_woken() {
    let scope = Scope::new();
    let first = Arc::new(AtomicBool::new(false));
    let second = Arc::new(AtomicBool::new(false));
    let slot = Slot {
        task: std::sync::Mutex::new(first.clone()),
    };
    let mut cancelled = scope.cancelled();

    let w = borrowed_waker(&slot);
    assert!(Pin::new(&mut cancelled)
        .poll(&mut Context::from_waker(&w))
        .is_pending());
    drop(w);

    // The executor reuses the slot for the task that now owns the future.
    *slot.task.lock().unwrap() = second.clone();
    let w = borrowed_waker(&slot);
    assert!(Pin::new(&mut cancelled)
        .poll(&mut Context::from_waker(&w))
        .is_pending());
    drop(w);

    scope.cancel();
    assert!(
        second.load(Ordering::SeqCst),
        "the task waiting now was not woken (lost wake-up)"
    );
    drop(cancelled);
}

/// The same through the body of `Scope::run`, whose cancel waiter is the same list's.
#[test]
fn a_body_polled_by_another_task_through_a_reused_waker_address_is_woken() {
    let scope = Scope::new();
    let first = Arc::new(AtomicBool::new(false));
    let second = Arc::new(AtomicBool::new(false));
    let slot = Slot {
        task: std::sync::Mutex::new(first.clone()),
    };
    let mut run = pin!(scope.run(std::future::pending::<()>()));
    let w = borrowed_waker(&slot);
    assert!(run.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
    drop(w);
    *slot.task.lock().unwrap() = second.clone();
    let w = borrowed_waker(&slot);
    assert!(run.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
    drop(w);
    scope.cancel();
    assert!(
        second.load(Ordering::SeqCst),
        "the task waiting now was not woken (lost wake-up)"
    );
}
