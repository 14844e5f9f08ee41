//! cancel-scope

pub mod wire;
