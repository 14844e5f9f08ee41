//! Scopes: cancel and its causes, `on_cancel`, deadlines and their timers, the current scope,
//! `run`, scopes whose handles are dropped, memory, and the budget arithmetic children are
//! built with.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod panics;
    pub mod time;
    pub mod wakers;
}

mod budget;
mod cancel;
mod current;
mod deadline;
mod dropped_parent;
mod memory;
mod run;
mod timers;
