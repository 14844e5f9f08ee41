//! Building a child scope.

use std::time::Duration;

use tokio::time::Instant;

use super::{Scope, ScopeExt};
use crate::budget::{ChildBudget, Rules};
use crate::error::Error;
use crate::spec::ChildSpec;
use crate::time::deadline_after;
use crate::tree;

/// Builds a child of a [`Scope`]: `deadline = min(parent - reserve, now + cap, now + timeout,
/// operation deadline)`, never later than the parent's.
///
/// Created by [`Scope::child`]. With no options the child keeps the parent's deadline and
/// needs no timer of its own.
///
/// The rules only ever tighten: [`reserve`](Self::reserve), [`min_useful`](Self::min_useful),
/// [`cap`](Self::cap) (and [`timeout`](Self::timeout)) and [`deadline`](Self::deadline) set
/// twice keep the stricter value (the larger reserve and minimum, the smaller cap and
/// deadline), whatever the order: a layer that adds its own rule to a builder it was handed
/// cannot loosen one set before it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::Scope;
/// let ms = Duration::from_millis;
///
/// let parent = Scope::with_timeout(ms(1000));
/// let child = parent.child().reserve(ms(100)).cap(ms(5000)).build().unwrap();
/// assert_eq!(child.remaining(), Some(ms(900))); // asking for more gives nothing more
///
/// let err = parent.child().min_useful(ms(2000)).build().unwrap_err();
/// assert!(err.is_budget_exhausted()); // fail fast: nothing is started
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ChildBuilder<'a> {
    parent: &'a Scope,
    reserve: Duration,
    cap: Option<Duration>,
    deadline: Option<Instant>,
    min_useful: Duration,
    name: Option<std::sync::Arc<str>>,
    grace: Option<Duration>,
    /// Tokens that cancel the child, each with the cause it gives (see `token`).
    #[cfg(feature = "tokio-util")]
    pub(super) tokens: Vec<(tokio_util::sync::CancellationToken, crate::Cause)>,
}

impl<'a> ChildBuilder<'a> {
    #[inline]
    pub(super) fn new(parent: &'a Scope) -> Self {
        ChildBuilder {
            parent,
            reserve: Duration::ZERO,
            cap: None,
            deadline: None,
            min_useful: Duration::ZERO,
            name: None,
            grace: None,
            #[cfg(feature = "tokio-util")]
            tokens: Vec::new(),
        }
    }

    /// The child's own timeout from now: the former name of [`cap`](Self::cap) (set twice, or
    /// with `cap`, the smaller one holds).
    ///
    /// # Examples
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let c = Scope::new().child().timeout(Duration::from_millis(20)).build().unwrap();
    /// assert_eq!(c.remaining(), Some(Duration::from_millis(20)));
    /// # }
    /// ```
    #[deprecated(since = "0.1.0", note = "one name for one rule: use `cap`")]
    #[inline]
    pub fn timeout(self, timeout: Duration) -> Self {
        self.cap(timeout)
    }

    /// The dependency's cap: it never gets more than this, however much the parent has. Set
    /// twice, the smaller cap holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let ms = Duration::from_millis;
    /// let p = Scope::with_timeout(Duration::from_secs(10));
    /// let c = p.child().cap(ms(300)).build().unwrap();
    /// assert_eq!(c.remaining(), Some(ms(300)));
    /// let c = p.child().cap(ms(300)).cap(ms(900)).build().unwrap();
    /// assert_eq!(c.remaining(), Some(ms(300))); // a later, larger cap loosens nothing
    /// # }
    /// ```
    #[inline]
    pub fn cap(mut self, cap: Duration) -> Self {
        self.cap = Some(self.cap.map_or(cap, |c| c.min(cap)));
        self
    }

    /// An absolute deadline for the child (e.g. the operation's); never extends the parent's.
    /// Set twice, the earlier deadline holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::Scope;
    /// let p = Scope::with_timeout(Duration::from_millis(100));
    /// let c = p.child().deadline(Instant::now() + Duration::from_secs(9)).build().unwrap();
    /// assert_eq!(c.deadline(), p.deadline());
    /// # }
    /// ```
    #[inline]
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(self.deadline.map_or(deadline, |d| d.min(deadline)));
        self
    }

    /// Time the parent keeps for itself after the child returns. Set twice, the larger
    /// reserve holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let ms = Duration::from_millis;
    /// let p = Scope::with_timeout(ms(100));
    /// let c = p.child().reserve(ms(30)).build().unwrap();
    /// assert_eq!(c.remaining(), Some(ms(70)));
    /// let c = p.child().reserve(ms(30)).reserve(ms(10)).build().unwrap();
    /// assert_eq!(c.remaining(), Some(ms(70))); // a later, smaller reserve loosens nothing
    /// # }
    /// ```
    #[inline]
    pub fn reserve(mut self, reserve: Duration) -> Self {
        self.reserve = self.reserve.max(reserve);
        self
    }

    /// The least budget that makes the child worth starting; below it `build` fails fast.
    /// Set twice, the larger minimum holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let ms = Duration::from_millis;
    /// let p = Scope::with_timeout(ms(100));
    /// assert!(p.child().min_useful(ms(150)).build().is_err());
    /// assert!(p.child().min_useful(ms(150)).min_useful(ms(10)).build().is_err());
    /// # }
    /// ```
    #[inline]
    pub fn min_useful(mut self, min_useful: Duration) -> Self {
        self.min_useful = self.min_useful.max(min_useful);
        self
    }

    /// The reserve, cap and minimum useful budget of `rules` at once: the same as calling
    /// [`reserve`](Self::reserve), [`cap`](Self::cap) (if the rules have one) and
    /// [`min_useful`](Self::min_useful), so each only tightens what is set already.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{budget::Rules, Scope};
    /// let ms = Duration::from_millis;
    /// let p = Scope::with_timeout(ms(1000));
    /// let db = Rules::new().reserve(ms(50)).cap(ms(300)).min_useful(ms(20));
    /// assert_eq!(p.child().rules(db).build().unwrap().remaining(), Some(ms(300)));
    /// assert!(p.child().rules(db.min_useful(ms(2000))).build().is_err());
    /// # }
    /// ```
    #[inline]
    pub fn rules(self, rules: Rules) -> Self {
        let child = self.reserve(rules.reserve).min_useful(rules.min_useful);
        match rules.cap {
            Some(cap) => child.cap(cap),
            None => child,
        }
    }

    /// A name for logs and reports.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let c = Scope::new().child().name("inventory").build().unwrap();
    /// assert_eq!(c.name(), Some("inventory"));
    /// ```
    #[inline]
    pub fn name(mut self, name: impl Into<std::sync::Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How long [`Scope::quiesce`] waits after a cancel of this scope before quarantining
    /// the work below it that has not stopped (inherited; default
    /// [`DEFAULT_GRACE`](crate::DEFAULT_GRACE)): the `quiesce` of this scope or of any
    /// ancestor. Where cancelled scopes are nested, the grace period that ends first holds
    /// for the work below both.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    /// let c = Scope::new().child().grace(Duration::from_millis(50)).build().unwrap();
    /// # drop(c);
    /// ```
    #[inline]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// Creates the child.
    ///
    /// # Errors
    ///
    /// * [`Error::is_cancelled`] / [`Error::is_closed`]: the parent no longer accepts children
    ///   ([`Error::is_deadline_exceeded`] too if the parent's deadline has passed, even before
    ///   its timer ran: that is the parent's cancel).
    /// * [`Error::is_budget_exhausted`]: the child's budget would be zero or below
    ///   [`min_useful`](Self::min_useful).
    /// * With the `tokio-util` feature, [`Error::is_cancelled`] with its cause: a token given
    ///   to `cancelled_by` is cancelled already.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or in one without a timer, when the child tightens the deadline
    /// (its timer is a tokio task).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let p = Scope::new();
    /// assert!(p.child().build().is_ok());
    /// p.cancel();
    /// assert!(p.child().build().is_err());
    /// ```
    #[track_caller]
    #[inline]
    pub fn build(self) -> Result<Scope, Error> {
        #[cfg(feature = "tokio-util")]
        if !self.tokens.is_empty() {
            return super::token::build_cancelled_by(self);
        }
        let parent = self.parent;
        if parent.node.state().is_closed() {
            // Fast path of the check that `new_child` makes under the registry lock.
            return Err(refused(parent));
        }
        let plain = parent.node.ext.deadline.is_none()
            && self.cap.is_none()
            && self.deadline.is_none()
            && self.name.is_none()
            && self.grace.is_none();
        if plain {
            // No budget to compute and nothing of its own: the child inherits everything. (A
            // separate function, so that the inlined check above is all a plain `build` costs
            // at the call site besides it.)
            return build_plain(parent);
        }
        self.build_bounded()
    }

    /// Creates the child as a registered and dispatched child of its parent too, described by
    /// `spec` (one node instead of a child scope and a ticket: a retry attempt). Its receipt
    /// is given through [`OwnTicket`](crate::child::OwnTicket); the parent's quarantine lists
    /// it with `spec`.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    #[track_caller]
    #[inline]
    pub(crate) fn build_dispatched(self, spec: &ChildSpec) -> Result<Scope, Error> {
        if self.parent.node.state().is_closed() {
            return Err(refused(self.parent));
        }
        self.build_with(Some(spec))
    }

    #[track_caller]
    fn build_bounded(self) -> Result<Scope, Error> {
        self.build_with(None)
    }

    // Always inlined into its two callers: passed on by value, the builder would be copied
    // from the narrow stores that assembled it (a store-forwarding stall per child).
    #[track_caller]
    #[inline(always)]
    fn build_with(self, own: Option<&ChildSpec>) -> Result<Scope, Error> {
        // Taken apart at once: the parts travel in registers, not as a copied struct.
        let ChildBuilder {
            parent,
            reserve,
            cap,
            deadline,
            min_useful,
            name,
            grace,
            #[cfg(feature = "tokio-util")]
                tokens: _,
        } = self;
        let pext = &parent.node.ext;
        let bounded = pext.deadline.is_some() || cap.is_some() || deadline.is_some();
        let mut read_at = None;
        let mut would_be = None;
        let deadline = if bounded {
            let now = *read_at.insert(Instant::now());
            if pext.deadline.is_some_and(|d| d <= now) {
                // The parent's deadline has passed and its timer has not run yet: that is its
                // cancel now, and the refusal says so (as `spawn` and `run` do), rather than
                // "budget exhausted" with the parent left running.
                parent.expire_if_due(now);
                return Err(refused(parent));
            }
            let mut budget = ChildBudget::new().reserve(reserve).min_useful(min_useful);
            if let Some(c) = cap {
                budget = budget.cap(c);
            }
            if let Some(d) = deadline {
                budget = budget.operation(d.saturating_duration_since(now));
            }
            let remaining = pext.deadline.map(|d| d.saturating_duration_since(now));
            let b = budget.compute(remaining).map_err(Error::exhausted)?;
            let deadline = within_parent(b.map(|b| deadline_after(now, b)), pext);
            if let Some(left) = parent.would_be_left(now) {
                would_be = shadow_child(parent, &budget, remaining, left, now, deadline);
            }
            deadline
        } else {
            // Unbounded parent and child: an unbounded budget is always useful.
            None
        };
        link(parent, deadline, read_at, name, grace, false, own, would_be)
    }

    /// [`build_dispatched`](Self::build_dispatched) of a retry attempt: a child of `parent`,
    /// named after `spec` and marked with it (one retry owner: a nested retry of the same
    /// dependency does not multiply the attempts), with `budget` from `now`. In shadow mode,
    /// `would_be` is the budget the attempt would have had on the request's would-be budget
    /// (`None`: enforced, or none computed).
    ///
    /// The retry layer computed `budget` from `now` against the reserve and the minimum
    /// useful budget already, so nothing is computed twice and no builder is assembled on
    /// the path every attempt takes (passed on by value, one would be copied from the narrow
    /// stores that made it: a store-forwarding stall).
    #[track_caller]
    #[inline(always)]
    pub(crate) fn attempt(
        parent: &Scope,
        spec: &ChildSpec,
        budget: Option<Duration>,
        now: Instant,
        would_be: Option<Duration>,
    ) -> Result<Scope, Error> {
        if parent.node.state().is_closed() {
            return Err(refused(parent));
        }
        let deadline = within_parent(budget.map(|b| deadline_after(now, b)), &parent.node.ext);
        let would_be = would_be.and_then(|b| own_would_be(parent, now, b, deadline));
        link(
            parent,
            deadline,
            Some(now),
            None,
            None,
            true,
            Some(spec),
            would_be,
        )
    }
}

/// Shadow mode: the decision `budget` would have made on the request's would-be budget,
/// `left` at `now` (within the parent's `remaining`), recorded for the report if it would
/// have refused the child; the child is made with the enforced bound, `deadline`. Returns the
/// child's would-be deadline if it is its own (see [`own_would_be`]). Out of line: only a
/// shadowed request's children come here.
#[cold]
#[inline(never)]
fn shadow_child(
    parent: &Scope,
    budget: &ChildBudget,
    remaining: Option<Duration>,
    left: Duration,
    now: Instant,
    deadline: Option<Instant>,
) -> Option<Instant> {
    let would_be = remaining.map_or(left, |r| r.min(left));
    match budget.compute(Some(would_be)) {
        Ok(b) => own_would_be(parent, now, b?, deadline),
        Err(e) => {
            parent.note_would_be(super::WouldBe::child_refused(now, e.to_string()));
            None
        }
    }
}

/// The would-be deadline of a child of `parent` given a would-be `budget` at `now`, if it is
/// its own: earlier than its parent's would-be deadline (else the parent's lateness is the
/// one to report) and than its enforced `deadline` (else enforcing would change nothing).
#[cold]
#[inline(never)]
fn own_would_be(
    parent: &Scope,
    now: Instant,
    budget: Duration,
    deadline: Option<Instant>,
) -> Option<Instant> {
    let inherited = parent.shadow_state()??;
    let would_be = deadline_after(now, budget);
    (would_be < inherited && deadline.is_none_or(|d| would_be < d)).then_some(would_be)
}

/// `deadline`, never later than the parent's, even if `now + budget` rounded (invariant 4).
#[inline(always)]
fn within_parent(deadline: Option<Instant>, parent: &ScopeExt) -> Option<Instant> {
    match (deadline, parent.deadline) {
        (Some(d), Some(p)) => Some(d.min(p)),
        (d, p) => d.or(p),
    }
}

/// Creates the child with its `deadline`, computed from the clock reading `read_at` (if one
/// was needed), and links it into `parent` (as its ticket too, described by `own`, if given);
/// its timer is armed if it tightens the parent's deadline. `would_be`: in shadow mode, the
/// child's own would-be deadline. Always inlined, for the same reason as
/// [`ChildBuilder::build_with`].
#[track_caller]
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the parts travel in registers (see `build_with`)
fn link(
    parent: &Scope,
    deadline: Option<Instant>,
    read_at: Option<Instant>,
    name: Option<std::sync::Arc<str>>,
    grace: Option<Duration>,
    marked: bool,
    own: Option<&ChildSpec>,
    would_be: Option<Instant>,
) -> Result<Scope, Error> {
    let pext = &parent.node.ext;
    let tightens = ScopeExt::tightens(pext, deadline);
    let ext = |_| ScopeExt::child_of(pext, deadline, tightens, name, grace, marked, would_be);
    let node = match own {
        None => tree::new_child(&parent.node, ext),
        Some(spec) => {
            // The child's unit CAS in `parent` is its dispatch: the request's effect flag is
            // set before it, unless the watermark already refuses it (see `scope::effect`).
            if spec.effect().may_have_effect() && !parent.node.state().is_closed() {
                parent.note_effect();
            }
            tree::new_child_dispatched(&parent.node, spec, ext)
        }
    }
    .map_err(Error::from)?;
    Ok(Scope::from_child_node(node, read_at.filter(|_| tightens)))
}

/// A child without a deadline, a name or marks of its own, under a parent without a deadline.
fn build_plain(parent: &Scope) -> Result<Scope, Error> {
    let pext = &parent.node.ext;
    let node =
        tree::new_child(&parent.node, |_| ScopeExt::plain_child_of(pext)).map_err(Error::from)?;
    Ok(Scope::from_child_node(node, None))
}

fn refused(parent: &Scope) -> Error {
    match parent.cause() {
        Some(c) => Error::cancelled(c),
        None => Error::closed(),
    }
}
