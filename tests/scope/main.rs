//! Scopes: cancel and its causes, `on_cancel`, deadlines and their timers, the current scope,
//! `run`, scopes whose handles are dropped, memory, and the budget arithmetic children are
//! built with.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod alloc;
    pub mod panics;
    pub mod time;
    pub mod wakers;
}

// The token tests count the bytes their own thread keeps allocated.
#[global_allocator]
static ALLOC: support::alloc::Counting = support::alloc::Counting;

mod budget;
mod cancel;
mod carry;
mod current;
mod deadline;
mod dropped_parent;
mod memory;
mod run;
#[cfg(feature = "stream")]
mod stream;
mod timers;
#[cfg(feature = "tokio-util")]
mod token;
