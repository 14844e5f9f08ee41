//! reqwest calls inside a scope: the caller's own, shorter bounds are kept, on real loopback
//! sockets.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod time;
}

mod caller_bounds;
