//! A request's scope under a server's: a child for cancel and quiet, a root for its report.
//!
//! A server's scope is a long-lived root; each request admitted under it is a *boundary*
//! child (see the tree's module docs): the server's cancel reaches it (a shutdown), and while
//! it has work it holds one of the server's units, so the server is quiet once every request
//! is. But its receipts, records and notes stay in it: the server does not pay for every
//! receipt of every request on the hot path, nor keep their records for its whole life. Its
//! deadline, request context (the admitted [`Operation`](crate::wire::Operation)) and effect
//! flag are its own, as a root's would be.
//!
//! While the server is closed ([`close_own`](Scope::close_own): it admits no one), a request
//! whose work ends (it can take none again) adds its counts and records to the server's before
//! it gives back its unit of the server: the server's report, made once it is quiet, is then
//! the sum of the requests that were still running when it closed.

use std::time::Duration;

use tokio::time::Instant;

use super::{Context, EffectFlag, Scope, ScopeExt, Shared, Timers};
use crate::cause::Cause;
use crate::error::Error;
use crate::sync::{Arc, AtomicU8, LazyBox};
use crate::time::deadline_after;
use crate::tree;

impl Scope {
    /// A request's scope as a boundary child of this (server's) scope: its deadline `timeout`
    /// after `now` (never later than this scope's), named `name`, carrying the request-wide
    /// `context` and a fresh effect flag, with this scope's grace period.
    ///
    /// # Errors
    ///
    /// This scope is closed (it admits no one) or cancelled.
    #[track_caller]
    pub(crate) fn request_child_after(
        &self,
        now: Instant,
        timeout: Duration,
        name: Option<std::sync::Arc<str>>,
        context: Option<Context>,
    ) -> Result<Scope, Error> {
        let pext = &self.node.ext;
        let mut deadline = deadline_after(now, timeout);
        if let Some(p) = pext.deadline {
            deadline = deadline.min(p);
        }
        let tightens = ScopeExt::tightens(pext, Some(deadline));
        let inherited = pext.shared();
        let new_timers = tightens
            .then(|| Timers::for_child_of(inherited.timers.as_ref()))
            .flatten();
        let shared = std::sync::Arc::new(Shared {
            grace: inherited.grace,
            context,
            timers: new_timers.or_else(|| inherited.timers.clone()),
            effect: Some(Arc::new(EffectFlag::new())),
        });
        let ext = |_| ScopeExt {
            deadline: Some(deadline),
            name,
            shared: Some(shared),
            timer: AtomicU8::new(0),
            marked: false,
            own_would_be: false,
            notes: LazyBox::new(),
            #[cfg(feature = "tokio-util")]
            token: super::token::TokenSlot::new(),
        };
        let node = tree::new_boundary_child(&self.node, ext).map_err(Error::from)?;
        Ok(Scope::from_child_node(node, tightens.then_some(now)))
    }

    /// Closes this scope's own registration watermark, not its children's: no new child, task
    /// or ticket here, while the running children go on (a server that stops admitting).
    /// Returns how many units it had: its children with work, and its own tickets and guards.
    pub(crate) fn close_own(&self) -> u64 {
        tree::close_own(&self.node).active()
    }

    /// How many boundary children (requests) became quiet while this scope was closed and
    /// were added to its report, and how many of them its own cancel had reached.
    pub(crate) fn rolled_up(&self) -> (u64, u64) {
        self.node
            .with_records(|r| (r.rolled_up, r.rolled_up_cancelled))
    }

    /// A boundary child of this scope without a deadline, as a request's scope under a
    /// server's but with no timer (there is none under loom); for the loom models.
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __request_child(&self) -> Result<Scope, Error> {
        let ext = |_| ScopeExt {
            deadline: None,
            name: None,
            shared: Some(std::sync::Arc::new(Shared {
                effect: Some(Arc::new(EffectFlag::new())),
                ..Shared::DEFAULT
            })),
            timer: AtomicU8::new(0),
            marked: false,
            own_would_be: false,
            notes: LazyBox::new(),
            #[cfg(feature = "tokio-util")]
            token: super::token::TokenSlot::new(),
        };
        let node = tree::new_boundary_child(&self.node, ext).map_err(Error::from)?;
        Ok(Scope::from_child_node(node, None))
    }

    /// [`close_own`](Self::close_own), for the loom models.
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __close_own(&self) -> u64 {
        self.close_own()
    }

    /// [`rolled_up`](Self::rolled_up), for the loom models.
    #[doc(hidden)]
    #[cfg(any(test, feature = "__test-hooks"))]
    pub fn __rolled_up(&self) -> (u64, u64) {
        self.rolled_up()
    }
}

impl Scope {
    /// Cancels a server's scope with `cause`, as [`cancel_because`](Self::cancel_because)
    /// does, but not counted as a root of the application's in telemetry: its requests are
    /// counted, each with its own cause, when they end.
    pub(crate) fn cancel_uncounted(&self, cause: Cause) -> bool {
        tree::cancel(&self.node, cause, crate::time::now_stamp())
    }

    /// A root for a server named `name`, whose requests (its boundary children, see
    /// [`request_child_after`](Self::request_child_after)) get `grace` after its cancel before
    /// what has not stopped is quarantined.
    pub(crate) fn server_root(name: std::sync::Arc<str>, grace: Duration) -> Scope {
        let shared = (grace != super::DEFAULT_GRACE).then(|| {
            std::sync::Arc::new(Shared {
                grace,
                ..Shared::DEFAULT
            })
        });
        let node = tree::new_root(ScopeExt {
            deadline: None,
            name: Some(name),
            shared,
            timer: AtomicU8::new(0),
            marked: false,
            own_would_be: false,
            notes: LazyBox::new(),
            #[cfg(feature = "tokio-util")]
            token: super::token::TokenSlot::new(),
        });
        Scope { node }
    }
}
