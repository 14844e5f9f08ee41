//! Shadow mode: every admission decision computed as when enforcing, none enforced; the
//! request runs bounded by the hard cap, and what would have happened is recorded.

use tokio::time::Instant;

use super::admission::{Admission, AdmissionError};
pub use crate::scope::WouldBe;
use crate::Report;

/// Whether an endpoint enforces its budget decisions or only records them
/// ([`EndpointPolicyBuilder::mode`](crate::wire::EndpointPolicyBuilder::mode)). An enforcing policy can also
/// shadow part of its requests: by class ([`EndpointPolicyBuilder::enforce_for`]) and by a fraction
/// of operations ([`EndpointPolicyBuilder::enforced_percent`]).
///
/// [`EndpointPolicyBuilder::enforce_for`]: crate::wire::EndpointPolicyBuilder::enforce_for
/// [`EndpointPolicyBuilder::enforced_percent`]: crate::wire::EndpointPolicyBuilder::enforced_percent
///
/// In [`Shadow`](Mode::Shadow) mode admission computes every decision exactly as when
/// enforcing — the declared budget clamped to the maximum, less what was queued and the
/// reserve, refusals of bad or over-long headers and of too little budget — and enforces none
/// of them:
///
/// * the request runs bounded by the **hard cap** alone (the policy's maximum, less what it
///   queued); [`Scope::remaining`](crate::Scope::remaining), the sqlx `statement_timeout` and the `grpc-timeout` and
///   `rem` of its outgoing calls follow that enforced bound (peers such as grpc-go, tonic and
///   Envoy enforce `grpc-timeout`);
/// * the would-be budget travels in an extra `service-budget` member, `wb`, that version 1
///   readers ignore, so a next hop in shadow mode computes its own would-be decision from it;
/// * each decision that would have acted is a [`WouldBe`] in the
///   [`Admission`](Admission::would_be) and in the [`Report`] ([`Report::would_be`]): a
///   refusal at admission, a clamp, a call that would not have been sent, and (for a request
///   through [`AdmitLayer`](crate::integrations::tower::AdmitLayer)) a request that ended
///   after the would-be deadline — its handler answered, or it was stopped (its client gone,
///   the hard cap) — with how long after: the delta that justifies enforcing.
///
/// Always enforced, in every mode: the hard cap, an operation's generation refusals (with a
/// registry), no registration after a cancel, and reconciliation of unknown effects. A client
/// that disconnects cannot be shadowed: the server drops the request's future, and the
/// request ends as `ClientGone` whatever the mode.
///
/// Inside the handler the mode travels in the request's scope (set at admission, shared by
/// its descendants): a child scope that the would-be budget would have refused (below its
/// `min_useful`, or its reserve eating what is left) is made with the enforced bound and
/// recorded ([`WouldBe::is_child_refusal`]), and so is a retry or hedge the would-be budget
/// would have stopped ([`WouldBe::is_retry_stop`], once a call). A child that enforcing would
/// have given a deadline of its own (a reserve, a cap, a retry attempt's share) and that ends
/// after it is recorded with how late it ended ([`WouldBe::is_child_late`]). A shielded
/// cleanup and detached work are bounded by their own budgets, in every mode.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, Incoming, Mode};
///
/// let ms = Duration::from_millis;
/// let policy = EndpointPolicy::builder(ms(5_000))
///     .default_budget(ms(1_000))
///     .mode(Mode::Shadow)
///     .build();
/// // A budget header that enforcing admission would refuse as malformed.
/// let (scope, a) = policy.admit(Incoming::new().grpc_timeout(b"-5m"), tokio::time::Instant::now()).unwrap();
/// assert_eq!(scope.remaining(), Some(ms(5_000))); // the hard cap
/// assert!(a.would_be()[0].is_refusal());
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// Every decision enforced (the default).
    #[default]
    Enforce,
    /// Every decision computed and recorded, none enforced but the hard cap.
    Shadow,
}

/// What admission in shadow mode decided: the would-be deadline (none if it would have
/// refused) and the decisions it did not enforce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shadowed {
    pub(crate) would_be_deadline: Option<Instant>,
    pub(crate) decisions: Vec<WouldBe>,
    /// An enforcing policy's refusal that the rejection cap let through.
    pub(crate) over_rejection_cap: bool,
}

impl Shadowed {
    /// What a refusal `refused` that the rejection cap let through at `now` records.
    pub(crate) fn over_rejection_cap(now: Instant, refused: &AdmissionError) -> Shadowed {
        Shadowed {
            would_be_deadline: None,
            decisions: vec![WouldBe::refused_over_cap(now, refused.to_string())],
            over_rejection_cap: true,
        }
    }
}

impl Admission {
    /// The decisions admission computed and did not enforce (in [`Mode::Shadow`]); empty
    /// when enforcing, or when nothing would have acted.
    ///
    /// # Examples
    ///
    /// See [`Mode`].
    pub fn would_be(&self) -> &[WouldBe] {
        self.0.shadow.as_deref().map_or(&[], |s| &s.decisions)
    }

    /// The deadline the request would have had if its policy enforced (in [`Mode::Shadow`];
    /// `None` when enforcing, or when admission would have refused it).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Mode};
    /// let p = EndpointPolicy::builder(Duration::from_secs(9))
    ///     .default_budget(Duration::from_secs(1))
    ///     .mode(Mode::Shadow)
    ///     .build();
    /// let now = tokio::time::Instant::now();
    /// let (scope, a) = p.admit(Incoming::new().grpc_timeout(b"100m"), now).unwrap();
    /// assert_eq!(a.would_be_deadline(), Some(now + Duration::from_millis(100)));
    /// assert_eq!(scope.deadline(), Some(now + Duration::from_secs(9)));
    /// # }
    /// ```
    pub fn would_be_deadline(&self) -> Option<Instant> {
        self.0.shadow.as_ref().and_then(|s| s.would_be_deadline)
    }

    /// In shadow mode, the decision a request that ends at `at` would have met: the cancel at
    /// its would-be deadline, if `at` is past it (or admission would have refused it).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn late_by(&self, at: Instant) -> Option<WouldBe> {
        let shadow = self.0.shadow.as_ref()?;
        // Refused at admission: that decision is recorded already.
        let deadline = shadow.would_be_deadline?;
        (at > deadline).then(|| WouldBe::late(deadline, at - deadline))
    }

    /// Whether an enforcing policy refused the request and its
    /// [`RejectionCap`](super::RejectionCap) let it through: it runs shadowed, bounded by
    /// `min(declared or default, default, maximum − queued)`, its refusal in
    /// [`would_be`](Self::would_be). Also [`is_shadowed`](Self::is_shadowed).
    ///
    /// # Examples
    ///
    /// See [`RejectionCap`](super::RejectionCap).
    pub fn is_over_rejection_cap(&self) -> bool {
        self.0.shadow.as_ref().is_some_and(|s| s.over_rejection_cap)
    }

    /// Whether the request was admitted in [`Mode::Shadow`] (or shadowed by staged
    /// enforcement, or let through by the rejection cap).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// assert!(!p.admit(Incoming::new(), tokio::time::Instant::now()).unwrap().1.is_shadowed());
    /// # }
    /// ```
    pub fn is_shadowed(&self) -> bool {
        self.0.shadow.is_some()
    }
}

impl Report {
    /// The decisions that were computed and not enforced for the request this report is of
    /// (its endpoint in [`Mode::Shadow`]), oldest first: at admission, at its children,
    /// retries and outgoing calls, a child's late end, and the request's.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EgressPolicy, EndpointPolicy, Incoming, Mode};
    ///
    /// let ms = Duration::from_millis;
    /// let policy = EndpointPolicy::builder(ms(5_000))
    ///     .default_budget(ms(1_000))
    ///     .mode(Mode::Shadow)
    ///     .build();
    /// let (scope, _) = policy.admit(Incoming::new().grpc_timeout(b"100m"), tokio::time::Instant::now()).unwrap();
    /// tokio::time::sleep(ms(150)).await; // past the would-be deadline
    /// let call = scope.child().build().unwrap();
    /// let out = EgressPolicy::new().outgoing(&call).unwrap(); // sent, bounded by the hard cap
    /// assert_eq!(out.remaining(), Some(ms(4_850)));
    /// drop(call);
    /// scope.close();
    /// let report = scope.quiesce().await;
    /// // The call's scope would have been refused (no would-be budget left), and the call not sent.
    /// let [child, not_sent] = &report.would_be()[..] else { panic!("{report}") };
    /// assert!(child.is_child_refusal() && !child.is_retry_stop());
    /// assert!(not_sent.is_not_sent() && not_sent.why().contains("would-be budget"));
    /// assert_eq!(not_sent.late_by(), None);
    /// assert!(not_sent.at() > tokio::time::Instant::now() - ms(1));
    /// # }
    /// ```
    pub fn would_be(&self) -> Vec<&WouldBe> {
        self.notes()
            .iter()
            .filter_map(|n| n.get::<WouldBe>())
            .collect()
    }
}
