//! What shadow mode did not enforce ([`WouldBe`]), and the request-wide shadow state that
//! admission sets on a request's scope and its descendants read: the mode travels in the
//! scope, so that the layers below admission (children, retries) shadow their own decisions
//! without knowing the policy.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ext::name_of;
use super::note::add_note_at;
use super::{Core, Note};
use crate::time::now_stamp;
use crate::{tree, Scope};

/// What a decision that was not enforced would have done.
///
/// # Examples
///
/// See [`Mode`](crate::wire::Mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WouldBe {
    kind: Kind,
    at: Instant,
    why: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
enum Kind {
    Refused,
    /// An enforcing policy's refusal beyond the rejection cap.
    RefusedOverCap,
    Clamped,
    NotSent,
    LateBy(Duration),
    /// A child the request's would-be budget would have refused.
    ChildRefused,
    /// A retry the request's would-be budget would have stopped.
    RetryStopped,
    /// A child that ended this long after its own would-be deadline.
    ChildLateBy(Duration),
}

impl WouldBe {
    pub(crate) fn refused(at: Instant, why: String) -> WouldBe {
        WouldBe {
            kind: Kind::Refused,
            at,
            why,
        }
    }

    /// A refusal of an enforcing policy that its rejection cap let through.
    pub(crate) fn refused_over_cap(at: Instant, why: String) -> WouldBe {
        WouldBe {
            kind: Kind::RefusedOverCap,
            at,
            why,
        }
    }

    pub(crate) fn clamped(at: Instant, why: String) -> WouldBe {
        WouldBe {
            kind: Kind::Clamped,
            at,
            why,
        }
    }

    pub(crate) fn child_refused(at: Instant, why: String) -> WouldBe {
        WouldBe {
            kind: Kind::ChildRefused,
            at,
            why,
        }
    }

    pub(crate) fn retry_stopped(at: Instant, why: String) -> WouldBe {
        WouldBe {
            kind: Kind::RetryStopped,
            at,
            why,
        }
    }

    pub(crate) fn not_sent(at: Instant, why: String) -> WouldBe {
        WouldBe {
            kind: Kind::NotSent,
            at,
            why,
        }
    }

    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn late(at: Instant, by: Duration) -> WouldBe {
        WouldBe {
            kind: Kind::LateBy(by),
            at,
            why: "the would-be deadline passed first".to_owned(),
        }
    }

    /// A child scope that ended `by` after its own would-be deadline, `at`; `name`: the
    /// child's, if it has one.
    fn child_late(at: Instant, by: Duration, name: Option<&str>) -> WouldBe {
        WouldBe {
            kind: Kind::ChildLateBy(by),
            at,
            why: match name {
                Some(name) => format!("child `{name}`"),
                None => "an unnamed child".to_owned(),
            },
        }
    }

    /// A child scope (a call, a task's scope, a branch) would have been refused: the request's
    /// would-be budget, less the child's reserve, was below its minimum useful budget or ran
    /// out. The child was made with the enforced bound.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Mode};
    /// let ms = Duration::from_millis;
    /// let p = EndpointPolicy::builder(ms(5_000))
    ///     .default_budget(ms(1_000))
    ///     .mode(Mode::Shadow)
    ///     .build();
    /// let (scope, _) = p.admit(Incoming::new().grpc_timeout(b"100m"), tokio::time::Instant::now()).unwrap();
    /// // 80 ms of would-be budget left: a child that needs 200 ms would have been refused.
    /// tokio::time::advance(ms(20)).await;
    /// let child = scope.child().min_useful(ms(200)).build().unwrap(); // made: not enforced
    /// drop(child);
    /// scope.close();
    /// let report = scope.quiesce().await;
    /// assert!(report.would_be()[0].is_child_refusal(), "{report}");
    /// # }
    /// ```
    pub fn is_child_refusal(&self) -> bool {
        self.kind == Kind::ChildRefused
    }

    /// A retry or hedge would have stopped: the request's would-be budget left no attempt
    /// its minimum useful budget (or reached the retry's reserve). The attempt was made with
    /// the enforced bound.
    ///
    /// # Examples
    ///
    /// See [`Report::would_be`](crate::Report::would_be).
    pub fn is_retry_stop(&self) -> bool {
        self.kind == Kind::RetryStopped
    }

    /// Admission would have refused the request (in shadow mode, or beyond the
    /// [rejection cap](crate::wire::RejectionCap): [`is_over_rejection_cap`](Self::is_over_rejection_cap)).
    ///
    /// # Examples
    ///
    /// See [`Mode`](crate::wire::Mode).
    pub fn is_refusal(&self) -> bool {
        matches!(self.kind, Kind::Refused | Kind::RefusedOverCap)
    }

    /// An enforcing policy refused the request, and its [`RejectionCap`](crate::wire::RejectionCap)
    /// let it through: the refusals of its window were at the cap. Also
    /// [`is_refusal`](Self::is_refusal).
    ///
    /// # Examples
    ///
    /// See [`RejectionCap`](crate::wire::RejectionCap).
    pub fn is_over_rejection_cap(&self) -> bool {
        self.kind == Kind::RefusedOverCap
    }

    /// Admission would have clamped the declared budget to a shorter one than the request
    /// runs with.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Mode};
    /// let p = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .mode(Mode::Shadow)
    ///     .build();
    /// let (_, a) = p.admit(Incoming::new().grpc_timeout(b"9S"), tokio::time::Instant::now()).unwrap();
    /// assert!(a.would_be()[0].is_clamp());
    /// # }
    /// ```
    pub fn is_clamp(&self) -> bool {
        self.kind == Kind::Clamped
    }

    /// An outgoing call would not have been sent (too little would-be budget left).
    ///
    /// # Examples
    ///
    /// See [`Report::would_be`](crate::Report::would_be).
    pub fn is_not_sent(&self) -> bool {
        self.kind == Kind::NotSent
    }

    /// How long after its would-be deadline the request ended (its handler answered, or it
    /// was stopped), or, for [`is_child_late`](Self::is_child_late), the child did: it
    /// would have been cancelled at that deadline ([`at`](Self::at)).
    ///
    /// # Examples
    ///
    /// See [`Report::would_be`](crate::Report::would_be) and
    /// [`is_child_late`](Self::is_child_late).
    pub fn late_by(&self) -> Option<Duration> {
        match self.kind {
            Kind::LateBy(d) | Kind::ChildLateBy(d) => Some(d),
            _ => None,
        }
    }

    /// A child scope (a call, a task's scope, a fan-out branch, a retry attempt) ended after a
    /// would-be deadline of its own: enforcing would have given it a deadline shorter than
    /// its parent's (a reserve, a cap, a retry's share of the budget), and cancelled it there,
    /// [`late_by`](Self::late_by) before it ended. [`why`](Self::why) names the child. The
    /// child ends when its scope retires (its last handle and its children gone); one that
    /// ended in time records nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Mode};
    /// let ms = Duration::from_millis;
    /// let p = EndpointPolicy::builder(ms(5_000)).default_budget(ms(1_000)).mode(Mode::Shadow).build();
    /// let (scope, _) = p.admit(Incoming::new().grpc_timeout(b"100m"), tokio::time::Instant::now()).unwrap();
    /// // Enforcing, the call would get 100 ms less its 40 ms reserve: 60 ms.
    /// let call = scope.child().name("inventory").reserve(ms(40)).build().unwrap();
    /// call.run(tokio::time::sleep(ms(75))).await.unwrap(); // bounded by the hard cap
    /// drop(call);
    /// scope.close();
    /// let report = scope.quiesce().await;
    /// let late = report.would_be()[0];
    /// assert!(late.is_child_late() && late.why() == "child `inventory`");
    /// assert_eq!(late.late_by(), Some(ms(15)));
    /// assert!(report.to_string().contains(
    ///     "would have cancelled child `inventory` at its deadline: finished 15 ms after it"
    /// ));
    /// # }
    /// ```
    pub fn is_child_late(&self) -> bool {
        matches!(self.kind, Kind::ChildLateBy(_))
    }

    /// When the decision would have acted (the would-be deadline, for a late answer).
    ///
    /// # Examples
    ///
    /// See [`Report::would_be`](crate::Report::would_be).
    pub fn at(&self) -> Instant {
        self.at
    }

    /// Why (the refusal's detail, the clamp, the call's budget; for a child that ended late,
    /// the child: "child \`name\`").
    ///
    /// # Examples
    ///
    /// See [`Report::would_be`](crate::Report::would_be).
    pub fn why(&self) -> &str {
        &self.why
    }
}

impl fmt::Display for WouldBe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Refused => write!(f, "shadow: would have refused at admission: {}", self.why),
            Kind::RefusedOverCap => write!(
                f,
                "over the rejection cap: would have refused at admission: {}",
                self.why
            ),
            Kind::Clamped => write!(f, "shadow: would have clamped: {}", self.why),
            Kind::NotSent => write!(f, "shadow: would not have sent: {}", self.why),
            Kind::ChildRefused => write!(f, "shadow: would have refused a child: {}", self.why),
            Kind::RetryStopped => write!(f, "shadow: would have stopped a retry: {}", self.why),
            Kind::LateBy(d) => write!(
                f,
                "shadow: would have cancelled at the deadline: finished {} ms after the would-be deadline",
                d.as_millis()
            ),
            Kind::ChildLateBy(d) => write!(
                f,
                "shadow: would have cancelled {} at its deadline: finished {} ms after it",
                self.why,
                d.as_millis()
            ),
        }
    }
}

impl Scope {
    /// In shadow mode (set at admission on the request's scope, shared by its descendants):
    /// the time the request's would-be budget leaves at `now`, or `None` when its decisions
    /// are enforced (or admission would have refused it: that decision is recorded already).
    pub(crate) fn would_be_left(&self, now: Instant) -> Option<Duration> {
        let deadline = self.shadow_state()??;
        Some(deadline.saturating_duration_since(now))
    }

    /// `Some` if this scope's request runs in shadow mode: its would-be deadline (`None`
    /// inside: admission would have refused it). `None` when its decisions are enforced, and
    /// in a root of the request's that its budget does not bound (a shielded cleanup, detached
    /// work).
    pub(crate) fn shadow_state(&self) -> Option<Option<Instant>> {
        self.context()?.shadow()
    }

    /// Records a decision that was not enforced, for the report of this scope (the caller
    /// holds a unit of it, or it is not closed yet).
    pub(crate) fn note_would_be(&self, decision: WouldBe) {
        self.add_note(Note::shown(Arc::new(decision)));
    }
}

/// A scope with a would-be deadline of its own (`ScopeExt::own_would_be`) retired (its last
/// handle and its last child gone): if that was after its would-be deadline, the cancel that
/// did not happen is noted for its parent's report (and counted, as the deadline cancel would
/// have been). The note goes in under a unit of the parent, so that no report on the way is
/// made before it has the note (invariant 6); once the parent is closed and quiet its report
/// is final, and nothing is noted. Out of line: only a shadowed request's children come here.
#[cold]
#[inline(never)]
pub(super) fn child_retired(node: &Core) {
    let shadow = node.ext.shared().context.as_ref().and_then(|c| c.shadow());
    let Some(Some(deadline)) = shadow else {
        return;
    };
    let now = Instant::now();
    let Some(parent) = node.parent().filter(|_| now > deadline) else {
        return;
    };
    if tree::take_unit_while_busy(&**parent, false).is_err() {
        return;
    }
    let late = WouldBe::child_late(deadline, now - deadline, name_of(node));
    crate::telemetry::shadow_deadline_exceeded();
    add_note_at(parent, Note::shown(Arc::new(late)));
    tree::release_guard(&**parent, now_stamp);
}
