//! cancel-scope
