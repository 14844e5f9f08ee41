//! User code that panics — a waker, an `on_cancel` callback, a retry's operation or
//! classifier, a fan-out branch's constructor, a handler's body, a body's drop — leaves the
//! library whole: every child gets its one receipt, every unit goes back, nothing is left
//! running, and the panic comes out after that.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod panics;
    pub mod time;
    #[cfg(feature = "tower")]
    pub mod tower;
    pub mod wakers;
}

mod callbacks;
mod drops;
mod hedge_fanout;
mod layers;
mod wakers;
