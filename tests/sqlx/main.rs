//! `integrations::sqlx` on real databases: PostgreSQL (`sqlx-postgres`; each test starts a
//! throwaway cluster, `support/postgres.rs`) and SQLite (`sqlx-sqlite`). Without either
//! feature the binary is empty.
#![cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    #[cfg(feature = "sqlx-postgres")]
    pub mod postgres;
    pub mod sqlx;
}

#[cfg(feature = "sqlx-postgres")]
mod postgres;
#[cfg(feature = "sqlx-postgres")]
mod postgres_cancel;
#[cfg(feature = "sqlx-postgres")]
mod postgres_transaction;
#[cfg(feature = "sqlx-sqlite")]
mod sqlite;
#[cfg(feature = "sqlx-sqlite")]
mod sqlite_transaction;
