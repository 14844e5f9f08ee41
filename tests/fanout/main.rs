//! Fan-out: branches that share the parent's budget, required and optional, a concurrency
//! limit, and what a branch sees of its own scope.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod time;
}

mod branch_scope;
mod branches;
mod join_future;
