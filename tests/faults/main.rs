//! Budget exhaustion and cancellation as injected faults, against the fake downstream of
//! `support::fault`: the nine fault scenarios, and random call trees, each checked for
//! the six invariants.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod fault;
    pub mod time;
}

mod call_trees;
mod scenarios;
