//! Helpers shared by integration tests.

#![allow(dead_code)]

#[cfg(feature = "sqlx-postgres")]
pub mod postgres;

pub mod fault;
#[cfg(feature = "__test-servers")]
pub mod grpc;
pub mod panics;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub mod sqlx;
pub mod time;
#[cfg(feature = "tower")]
pub mod tower;
