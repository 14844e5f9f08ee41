//! The work of a scope: registered children and their receipts, spawned tasks, the quarantine
//! of tasks that do not stop, and guards (permits and tethered values).

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod panics;
    pub mod wakers;
}

mod guards;
mod quarantine;
mod receipts;
mod spawn;
