//! The operation a request belongs to: set on the root scope at admission, shared by every
//! descendant, read back by every outgoing call.

use std::fmt;
use std::sync::Arc;

use super::egress::EgressPolicy;
use crate::scope::Note;
use crate::{Report, Scope};

/// Request-wide facts that admission attaches to a request's root scope: the operation id,
/// the priority, the cancel generation the budget was cut from, and the endpoint's defaults
/// for outgoing calls.
///
/// Every scope of the request's tree shares it ([`Scope::operation`]), so an outgoing call
/// made from a child scope deep in the handler still sends the right `op`, `prio` and `gen`
/// in its `service-budget` header, and uses the endpoint's transport pad.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use cancel_scope::wire::{EndpointPolicy, Incoming};
///
/// let policy = EndpointPolicy::builder(Duration::from_secs(2))
///     .default_budget(Duration::from_secs(1))
///     .priority(2)
///     .build();
/// let (scope, admission) = policy.admit(Incoming::new(), Instant::now()).unwrap();
/// let child = scope.child().build().unwrap();
/// let op = child.operation().unwrap();
/// assert_eq!(op.id(), admission.operation_id());
/// assert_eq!(op.priority(), 2);
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Operation {
    id: Arc<str>,
    priority: u8,
    generation: u64,
    egress: EgressPolicy,
    policy_version: u32,
    /// In shadow mode: the would-be deadline (`None` inside: admission would have refused).
    would_be: Option<Option<tokio::time::Instant>>,
}

impl Operation {
    pub(crate) fn new(id: Arc<str>, priority: u8, generation: u64, egress: EgressPolicy) -> Self {
        Operation {
            id,
            priority,
            generation,
            egress,
            policy_version: 0,
            would_be: None,
        }
    }

    /// The operation, admitted in shadow mode with this would-be deadline (`Some(None)`:
    /// admission would have refused it), or enforcing (`None`).
    pub(crate) fn would_be(mut self, deadline: Option<Option<tokio::time::Instant>>) -> Self {
        self.would_be = deadline;
        self
    }

    /// The operation, admitted under policy version `version`.
    pub(crate) fn admitted_under(mut self, version: u32) -> Self {
        self.policy_version = version;
        self
    }

    /// The version of the endpoint policy that admitted the request
    /// ([`Admission::policy_version`](super::Admission::policy_version)): sent downstream as
    /// the `pv` member of `service-budget` when it is not `0`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    ///
    /// let policy = EndpointPolicy::builder(Duration::from_secs(1)).version(4).build();
    /// let (scope, _) = policy.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation().unwrap().policy_version(), 4);
    /// # }
    /// ```
    pub fn policy_version(&self) -> u32 {
        self.policy_version
    }

    /// The operation id (the `op` member sent downstream): printable ASCII, at most 128
    /// characters.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Trust};
    ///
    /// let policy = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .trust(Trust::Trusted)
    ///     .build();
    /// let incoming = Incoming::new().service_budget(b"v=1, rem=500, op=checkout-7");
    /// let (scope, _) = policy.admit(incoming, tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation().unwrap().id(), "checkout-7");
    /// # }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The operation id as a shared string.
    pub(crate) fn id_arc(&self) -> &Arc<str> {
        &self.id
    }

    /// The priority on the RFC 9218 urgency scale (`0` most urgent, `7` least), as admission
    /// decided it (see [`PrioritySource`](super::PrioritySource)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    ///
    /// let policy = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (scope, _) = policy.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation().unwrap().priority(), 3); // the RFC 9218 default
    /// # }
    /// ```
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// The cancel generation the operation's budget was cut from: the caller's `gen` where
    /// admission adopted the caller's operation
    /// ([`caller_operation`](crate::wire::EndpointPolicyBuilder::caller_operation)), else `0`, the start of
    /// a fresh local operation. Passed on unchanged to every downstream call.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, Trust};
    ///
    /// let incoming = || Incoming::new().service_budget(b"v=1, rem=500, op=checkout-7, gen=4");
    /// let edge = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// let (scope, _) = edge.admit(incoming(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation().unwrap().generation(), 0);
    /// let inner = edge.to_builder().trust(Trust::Trusted).build();
    /// let (scope, _) = inner.admit(incoming(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation().unwrap().generation(), 4);
    /// # }
    /// ```
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The endpoint's defaults for outgoing calls (transport pad, minimum useful budget).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    ///
    /// let ms = Duration::from_millis;
    /// let policy = EndpointPolicy::builder(ms(1000)).transport_pad(ms(5)).build();
    /// let (scope, _) = policy.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(scope.operation().unwrap().egress().transport_pad_budget(), ms(5));
    /// # }
    /// ```
    pub fn egress(&self) -> &EgressPolicy {
        &self.egress
    }
}

impl fmt::Debug for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operation")
            .field("id", &self.id)
            .field("priority", &self.priority)
            .field("generation", &self.generation)
            .field("egress", &self.egress)
            .field("policy_version", &self.policy_version)
            .field("would_be", &self.would_be)
            .finish()
    }
}

impl Scope {
    /// The operation this scope's request belongs to, if its root was made by admission
    /// ([`EndpointPolicy::admit`](super::EndpointPolicy::admit)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// assert!(Scope::new().operation().is_none());
    /// ```
    pub fn operation(&self) -> Option<&Operation> {
        self.context()
            .and_then(|c| c.as_any().downcast_ref::<Operation>())
    }
}

impl crate::scope::RequestContext for Operation {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn shadow(&self) -> Option<Option<tokio::time::Instant>> {
        self.would_be
    }
}

/// The version of the policy that admitted a request, as a note of its report.
#[derive(Debug)]
struct AdmittedUnder(u32);

impl Scope {
    /// Notes the version of the policy that admitted this request's scope, for its report
    /// ([`Report::policy_version`]).
    pub(crate) fn note_policy_version(&self, version: u32) {
        self.add_note(Note::new(Arc::new(AdmittedUnder(version))));
    }
}

impl Report {
    /// The version of the endpoint policy that admitted the request this report is of (see
    /// [`Admission::policy_version`](super::Admission::policy_version)); `None` for a scope
    /// that admission did not make, or one with so many notes (over 64) that this one, the
    /// oldest, was dropped ([`dropped_notes`](Report::dropped_notes)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming};
    ///
    /// let policy = EndpointPolicy::builder(Duration::from_secs(1)).version(5).build();
    /// let (scope, _) = policy.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
    /// scope.close();
    /// assert_eq!(scope.quiesce().await.policy_version(), Some(5));
    /// # }
    /// ```
    pub fn policy_version(&self) -> Option<u32> {
        self.notes()
            .iter()
            .find_map(|n| n.get::<AdmittedUnder>())
            .map(|v| v.0)
    }
}
