//! The tower layers over real loopback servers, on the real clock: axum servers with reqwest
//! and hyper clients (HTTP), tonic servers and channels (gRPC), and the cut of a response body
//! on the wire, with its cost on the normal path counted.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod alloc;
    pub mod grpc;
    pub mod servers;
    pub mod time;
    pub mod tower;
}

// The body-cut tests count the allocations of their own thread.
#[global_allocator]
static ALLOC: support::alloc::Counting = support::alloc::Counting;

mod body_cut;
mod classify;
mod detach;
mod effect;
mod extractors;
mod grpc;
mod http;
mod journal;
mod registry;
mod rejection_cap;
mod shadow;
mod shutdown;
mod stage;
#[cfg(feature = "rollout")]
mod versions;
