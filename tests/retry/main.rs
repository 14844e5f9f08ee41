//! Retries and hedges: decisions, backoff, the retry budget, the ledger and its owner, the
//! first attempt, the attempt's scope and its quarantine, a call that is dropped or races a
//! cancel, and the call's own future.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod panics;
    pub mod time;
    pub mod wakers;
}

mod attempt_scope;
mod backoff;
mod budget;
mod cancel;
mod decisions;
mod dropped_call;
mod first_attempt;
mod hedge;
mod hedge_future;
mod ledger;
mod owner;
mod quarantine;
mod run_future;
#[cfg(feature = "tower-retry")]
mod tower_budget;

/// A dependency that is down: the error of the calls that always fail.
#[derive(Debug)]
struct Unavailable;

/// A dependency's two ways to fail: busy (it says when to come back) or down.
#[derive(Debug)]
enum Failure {
    Busy,
    Down,
}
