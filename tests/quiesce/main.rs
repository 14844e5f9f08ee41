//! Quiescence: a scope's way to quiet and its report, the grace period and the quarantine of
//! work that ignores a cancel, shields and detached scopes, the handover of cancels to a
//! waiting `quiesce()`, quiesces racing cancel walks, and what a waiting quiesce keeps.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod alloc;
    pub mod panics;
    pub mod quiesce;
    pub mod time;
    pub mod wakers;
}

// The memory tests count the bytes and allocations of their own thread.
#[global_allocator]
static ALLOC: support::alloc::Counting = support::alloc::Counting;

mod grace;
mod handover;
mod lifecycle;
mod memory;
mod racing_cancels;
mod report;
mod shield;
