//! reqwest calls inside a scope: the caller's own, shorter bounds are kept, the response
//! read as users read it (`error_for_status`, `json`, `text`, `bytes`), and the
//! `reqwest-middleware` middleware, on real loopback sockets and axum servers.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    #[cfg(feature = "__test-servers")]
    pub mod servers;
    pub mod time;
    #[cfg(feature = "__test-servers")]
    pub mod tower;
}

mod caller_bounds;
#[cfg(feature = "__test-servers")]
mod classify;
#[cfg(all(feature = "__test-servers", feature = "reqwest-middleware"))]
mod middleware;
#[cfg(all(feature = "__test-servers", feature = "json"))]
mod response;
