//! Making scope handles and their deadlines: roots, the handle of a new child, arming a
//! scope's deadline timer, expiring a deadline that has passed before its timer fired, and
//! the cancel of a scope of its own (counted in telemetry for the application's roots).

use std::time::Duration;

use tokio::time::Instant;

use super::ext::{Context, ScopeExt, ARMED};
use super::{Core, EffectFlag, Scope, Timers};
use crate::cause::Cause;
use crate::sync::{Arc, Ordering};
use crate::time::{deadline_after, stamp_of};
use crate::tree;

impl Scope {
    #[track_caller]
    pub(crate) fn root(deadline: Option<Instant>, name: Option<std::sync::Arc<str>>) -> Scope {
        Scope::root_with_context(deadline, None, name, None, None)
    }

    /// A root whose deadline is `timeout` after `now` (a clock reading the caller has
    /// already taken: not read twice), carrying request-wide `context`, which every descendant
    /// shares, and the request's `effect` flag, if it has one (see `effect`).
    #[track_caller]
    pub(crate) fn root_after(
        now: Instant,
        timeout: Duration,
        name: Option<std::sync::Arc<str>>,
        context: Option<Context>,
        effect: Option<Arc<EffectFlag>>,
    ) -> Scope {
        let deadline = Some(deadline_after(now, timeout));
        Scope::root_with_context(deadline, Some(now), name, context, effect)
    }

    /// A root carrying request-wide `context` and `effect` flag, which every descendant
    /// shares; `read_at`: the clock reading `deadline` was computed from, if any (otherwise
    /// the clock is read to arm the deadline).
    #[track_caller]
    pub(super) fn root_with_context(
        deadline: Option<Instant>,
        read_at: Option<Instant>,
        name: Option<std::sync::Arc<str>>,
        context: Option<Context>,
        effect: Option<Arc<EffectFlag>>,
    ) -> Scope {
        let node = tree::new_root(ScopeExt::root(deadline, name, context, effect));
        let scope = Scope { node };
        if deadline.is_some() {
            scope.arm_timer(read_at.unwrap_or_else(Instant::now));
        }
        scope
    }

    /// Starts the deadline timer of a scope that tightened its deadline (`now`: the clock
    /// reading its deadline was computed from).
    #[track_caller]
    fn arm_timer(&self, now: Instant) {
        let ext = &self.node.ext;
        let (Some(deadline), Some(timers)) = (ext.deadline, ext.timers()) else {
            return;
        };
        if deadline <= now {
            cancel_node(&self.node, Cause::DeadlineExceeded, stamp_of(now));
            return;
        }
        Timers::insert(timers, deadline, &self.node);
        // Relaxed: read only by the drop that takes the node's handle count to zero, which
        // synchronizes with this thread through that count; nobody else writes it (the scope
        // is being made).
        let t = ext.timer.load(Ordering::Relaxed);
        ext.timer.store(t | ARMED, Ordering::Relaxed);
    }

    /// [`expire_if_due`](Scope::expire_if_due) now, reading the clock only for a scope with a
    /// deadline: what every step that starts work calls first (a deadline that has passed is a
    /// cancel whose timer task has not run yet, tokio firing timers on millisecond ticks), so
    /// that nothing starts at or after it with nothing left of its budget (invariant 2).
    #[inline]
    pub(crate) fn expire_if_passed(&self) -> bool {
        self.deadline().is_some() && self.expire_if_due(Instant::now())
    }

    /// If this scope's deadline has passed at `now`, cancels it with
    /// [`Cause::DeadlineExceeded`] now rather than when its timer task gets to run, and returns
    /// `true`.
    ///
    /// As the timers would: every scope on the way up whose deadline has passed and that has a
    /// timer of its own (it tightened the deadline it inherited) is cancelled with
    /// [`Cause::DeadlineExceeded`], in the order its timer would fire (deadlines never grow
    /// down the tree: the lowest first), so every scope gets the cause its timer would have
    /// given it. A scope that kept its parent's deadline is cancelled by its parent's cancel.
    /// The walk stops at the first ancestor still in time.
    pub(crate) fn expire_if_due(&self, now: Instant) -> bool {
        if self.deadline().is_none_or(|d| d > now) {
            return false;
        }
        let stamp = stamp_of(now);
        for n in tree::ancestors(&self.node) {
            let parent = n.parent();
            if parent.is_none_or(|p| ScopeExt::tightens(&p.ext, n.ext.deadline)) {
                cancel_node(n, Cause::DeadlineExceeded, stamp);
            }
            match parent {
                Some(p) if p.ext.deadline.is_some_and(|d| d <= now) => {}
                _ => break,
            }
        }
        true
    }
}

impl Scope {
    /// The handle of a new child node; `armed_at`: the clock reading its deadline was computed
    /// from, if it tightened its deadline (and so needs a timer of its own).
    #[track_caller]
    pub(crate) fn from_child_node(node: Arc<Core>, armed_at: Option<Instant>) -> Scope {
        let s = Scope { node };
        if let Some(now) = armed_at {
            s.arm_timer(now);
        }
        s
    }
}

/// Cancels `node` with `cause` ([`tree::cancel`]), returning whether this cancel won: every
/// cancel of a scope for a cause of its own in this layer goes through here. A root the
/// application made that this cancel reached is counted in telemetry; an admitted request's
/// scope and a shield's clean-up (the roots that carry a request's effect flag) are counted
/// at the request's report, and the server's scope cancels with `cancel_uncounted`.
pub(crate) fn cancel_node(node: &Arc<Core>, cause: Cause, stamp: u64) -> bool {
    let counted =
        crate::telemetry::COUNTS && node.parent().is_none() && node.ext.shared().effect.is_none();
    if !counted {
        return tree::cancel(node, cause, stamp);
    }
    let label = cause.clone();
    let won = tree::cancel(node, cause, stamp);
    if won {
        crate::telemetry::root_cancelled(&label);
    }
    won
}
