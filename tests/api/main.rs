//! The public API's auto traits, pinned: which types are `Send`, `Sync`, `Unpin` and unwind
//! safe, which are errors, and which futures can be spawned.

mod auto_traits;
mod retry_fanout;
#[cfg(feature = "tower")]
mod tower;
mod wire;
