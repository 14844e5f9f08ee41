//! Helpers shared by integration tests.

#![allow(dead_code)]

#[cfg(feature = "sqlx-postgres")]
pub mod postgres;

pub mod fault;
pub mod panics;
pub mod quiesce;
#[cfg(feature = "tower")]
pub mod tower;
