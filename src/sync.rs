//! The one place that chooses between `std`/`parking_lot` primitives and `loom`'s.
//!
//! Everything in the tree core (`crate::tree`) takes its atomics, `Arc` and locks from here, so
//! that `RUSTFLAGS="--cfg loom"` swaps all of them for loom's model-checked versions at once.
//! No other file names `std::sync` or `loom` (see `clippy.toml`).

#![allow(clippy::disallowed_types)]

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering},
    Arc,
};

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering},
    Arc,
};

/// Immutable shared data (a cancel cause passed down a walk): `std`'s `Arc`, also under loom.
/// Not modelled: it is never mutated once shared, so no interleaving of its users can matter.
pub(crate) type Shared<T> = std::sync::Arc<T>;

/// A weak reference (the timers' entries, see `scope::timer`; the scopes handed to a waiting
/// `quiesce()`, see `tree::QuietWaiter`). loom's `Arc` has none, so a strong reference stands
/// in: under loom no timer is ever armed (there is no tokio runtime), and a quiet waiter's
/// handed scopes go with the waiter (the models never see one fail to upgrade).
#[cfg(not(loom))]
pub(crate) use std::sync::Weak;

/// `Arc::downgrade`.
#[cfg(not(loom))]
pub(crate) fn downgrade<T>(this: &Arc<T>) -> Weak<T> {
    Arc::downgrade(this)
}

#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct Weak<T>(Arc<T>);

#[cfg(loom)]
impl<T> Weak<T> {
    pub(crate) fn upgrade(&self) -> Option<Arc<T>> {
        Some(self.0.clone())
    }

    pub(crate) fn strong_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

#[cfg(loom)]
pub(crate) fn downgrade<T>(this: &Arc<T>) -> Weak<T> {
    Weak(this.clone())
}

/// loom's thread-locals, one per model thread: loom runs every model thread on the one OS
/// thread that calls `loom::model`, so a `std` thread-local would be shared by all of them.
#[cfg(loom)]
pub(crate) use loom::thread_local as loom_thread_local;

/// `Arc::new(make())`, but with the value built in its final place where the compiler can:
/// the allocation comes first and the value is written into it, instead of being assembled
/// on the stack and then copied (a tree node is about 250 bytes, and copying it right after
/// building it costs store-forwarding stalls that were a fifth of a child's create+drop).
#[cfg(not(loom))]
#[inline]
pub(crate) fn arc_in_place<T>(make: impl FnOnce() -> T) -> Arc<T> {
    Arc::new_cyclic(|_| make())
}

/// `Arc::new(make())` (loom's `Arc` has no `new_cyclic`).
#[cfg(loom)]
pub(crate) fn arc_in_place<T>(make: impl FnOnce() -> T) -> Arc<T> {
    Arc::new(make())
}

/// A mutex whose `lock()` cannot fail (poisoning is not part of our contract: the tree never
/// runs user code while holding a lock).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(loom))]
    inner: parking_lot::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

/// The guard returned by [`Mutex::lock`].
#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    #[cfg(not(loom))]
    pub(crate) const fn new(value: T) -> Self {
        Self {
            inner: parking_lot::const_mutex(value),
        }
    }

    #[cfg(loom)]
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: loom::sync::Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(not(loom))]
        {
            self.inner.lock()
        }
        #[cfg(loom)]
        {
            self.inner.lock().unwrap()
        }
    }
}

/// Process-wide one-time initialisation (the clock base of [`crate::time`]). Not modeled by
/// loom: it guards no state that the tree's races touch.
pub(crate) use std::sync::OnceLock;

/// A box allocated on first use, for the parts of a tree node that most nodes never need
/// (a children registry, receipt counters). Reading it is one `Acquire` load; the first use
/// publishes the box with one compare-and-swap (two racing first uses allocate twice and one
/// box is dropped), which is much cheaper than a `OnceLock` for a node that lives a few
/// microseconds.
#[cfg(not(loom))]
#[derive(Default)]
pub(crate) struct LazyBox<T>(once_cell::race::OnceBox<T>);

#[cfg(not(loom))]
impl<T: Default> LazyBox<T> {
    pub(crate) const fn new() -> Self {
        LazyBox(once_cell::race::OnceBox::new())
    }

    pub(crate) fn get(&self) -> Option<&T> {
        self.0.get()
    }

    pub(crate) fn get_or_init(&self) -> &T {
        self.0.get_or_init(Box::default)
    }
}

#[cfg(not(loom))]
impl<T: std::fmt::Debug> std::fmt::Debug for LazyBox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LazyBox").field(&self.0.get()).finish()
    }
}

/// Under loom the box is allocated eagerly: loom cannot model `OnceLock`, and an eager box is
/// the state a lazy one reaches on first use, so the races that matter (on the contents) are the
/// same.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct LazyBox<T>(Box<T>);

#[cfg(loom)]
impl<T: Default> LazyBox<T> {
    pub(crate) fn new() -> Self {
        LazyBox(Box::default())
    }

    pub(crate) fn get(&self) -> Option<&T> {
        Some(&self.0)
    }

    pub(crate) fn get_or_init(&self) -> &T {
        &self.0
    }
}

/// A small number that stays the same for the calling thread and differs between threads
/// started one after the other (for spreading them over lock shards).
#[cfg(not(loom))]
pub(crate) fn thread_index() -> usize {
    use std::cell::Cell;
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local!(static INDEX: Cell<usize> = const { Cell::new(usize::MAX) });
    INDEX.with(|i| {
        let mut v = i.get();
        if v == usize::MAX {
            // Relaxed: only spreads threads over shards, orders nothing.
            v = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            i.set(v);
        }
        v
    })
}

/// Under loom: the model thread's number (0 for the main thread, then 1, 2, ... in spawn
/// order), so that model threads use different shards, the same in every execution, without an
/// extra modelled operation. loom exposes it only through `Debug` (`ThreadId(N)`).
#[cfg(loom)]
pub(crate) fn thread_index() -> usize {
    let id = format!("{:?}", loom::thread::current().id());
    id.trim_start_matches("ThreadId(")
        .trim_end_matches(')')
        .parse()
        .unwrap_or(0)
}
