//! The system allocator, counting what each thread allocates: a binary whose tests count
//! declares it as its allocator,
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: support::alloc::Counting = support::alloc::Counting;
//! ```
//!
//! and its tests read the counts of their own thread (`cargo test` runs the tests of a binary
//! on threads of one process; a test that counts keeps its work on its thread, on a
//! current-thread runtime).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts the bytes allocated and not freed, the allocations and the reallocations made, by
/// each thread.
pub struct Counting;

// Thread-local `Cell`s without destructors: counting allocates nothing.
thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
    static REALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count(delta: isize, counter: Option<&'static std::thread::LocalKey<Cell<usize>>>) {
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
    if let Some(counter) = counter {
        let _ = counter.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: every call is passed on to `System` as it is; only the sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize, Some(&ALLOCS));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize, Some(&ALLOCS));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize), None);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize, Some(&REALLOCS));
        }
        p
    }
}

/// Bytes allocated and not freed by this thread.
pub fn live_bytes() -> isize {
    LIVE.with(Cell::get)
}

/// Allocations made by this thread, reallocations not counted (each cancel walk and each
/// quarantine walk allocates its work list: a count of walks, give or take a constant factor).
pub fn allocs() -> usize {
    ALLOCS.with(Cell::get)
}

/// Reallocations made by this thread.
pub fn reallocs() -> usize {
    REALLOCS.with(Cell::get)
}
