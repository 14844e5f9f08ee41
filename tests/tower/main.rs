//! The tower layers in process, on tokio's virtual clock (no sockets): admission, the cut of a
//! response body, and propagation to outgoing calls. `tower_servers` runs them over real
//! loopback servers.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod time;
    pub mod tower;
}

mod admit;
mod body_cut;
mod detach;
mod propagate;
mod streaming;
