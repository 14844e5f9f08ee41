//! Operations across requests and processes: the in-process registry, the Redis registry
//! (`redis`; each test starts a throwaway `redis-server`, `support/redis.rs`), durable intents
//! and their reconciliation, in memory and in PostgreSQL (`sqlx-postgres`; a throwaway
//! cluster, `support/postgres.rs`); admission with a registry, on virtual time, and over
//! real axum servers sharing one Redis (`redis` and `__test-servers`).

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    #[cfg(feature = "sqlx-postgres")]
    pub mod postgres;
    #[cfg(feature = "redis")]
    pub mod redis;
    #[cfg(feature = "__test-servers")]
    pub mod servers;
    #[cfg(feature = "__test-servers")]
    pub mod tower;
}

mod admission;
mod in_process;
mod journal;
#[cfg(feature = "sqlx-postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(all(feature = "redis", feature = "__test-servers"))]
mod servers;
