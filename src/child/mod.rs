//! Registered children: tickets, receipts and tasks.
//!
//! Every piece of work under a scope is a *child*: it is first registered (PREPARED: identity,
//! generation, budget, [`Effect`](crate::Effect)), then dispatched by a compare-and-swap that
//! fails once the scope was cancelled, and finally ends with exactly one [`Receipt`] — also
//! when it is dropped or panics. [`Scope::spawn`](crate::Scope::spawn) does all three for a tokio task.

mod concurrent;
mod failure;
#[cfg(feature = "tower")]
mod handler;
mod own;
mod receipt;
mod shield;
mod task;
mod ticket;

pub(crate) use concurrent::{Finished, InFlight};
pub use failure::Failure;
#[cfg(feature = "tower")]
pub(crate) use handler::HandlerTicket;
pub(crate) use own::OwnRun;
#[cfg_attr(not(feature = "__test-hooks"), allow(unreachable_pub))]
pub use own::OwnTicket;
pub(crate) use receipt::unknown_in;
pub use receipt::Receipt;
pub use task::JoinHandle;
pub use ticket::{Dispatched, Ticket};
