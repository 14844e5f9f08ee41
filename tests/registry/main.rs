//! Operations across requests and processes: the in-process registry, the Redis registry
//! (`redis`; each test starts a throwaway `redis-server`, `support/redis.rs`), durable intents
//! and their reconciliation, in memory and in PostgreSQL (`sqlx-postgres`; a throwaway
//! cluster, `support/postgres.rs`).

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    #[cfg(feature = "sqlx-postgres")]
    pub mod postgres;
    #[cfg(feature = "redis")]
    pub mod redis;
}

mod admission;
mod in_process;
mod journal;
#[cfg(feature = "sqlx-postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
