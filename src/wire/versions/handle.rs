//! The shared handle of an endpoint's policy versions.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::{bounded, ErrorKind, PolicyError};
use crate::wire::{Admission, AdmissionError, EndpointPolicy, Incoming, ServerScope};
use crate::Scope;

/// The most earlier versions a handle keeps for [`rollback`](PolicyHandle::rollback); the
/// oldest goes first.
const HISTORY: usize = 8;

/// The versions a handle holds: what readers load.
#[derive(Debug)]
struct Versions {
    current: EndpointPolicy,
    /// Earlier versions, the newest last.
    previous: Vec<EndpointPolicy>,
    /// The highest version number ever held.
    highest: u32,
}

/// An endpoint's policy versions, swapped at run time: a current [`EndpointPolicy`] that every
/// clone of the handle (and every layer given one, [`AdmitLayer::versioned`]) reads per request,
/// and up to 8 earlier versions to roll back to.
///
/// Reading is one atomic load (`arc-swap`); [`set`](Self::set) and
/// [`rollback`](Self::rollback) replace the whole set of versions at once, so a request is
/// admitted under one version or the next, never a mix.
///
/// # Rules
///
/// * **No version removes the deadline.** A policy's maximum is its hard cap; one above
///   [`MAX_CAP`](crate::wire::MAX_CAP) (24 h, the most a `service-budget` header can carry) is refused
///   ([`PolicyError::is_unbounded`]), as is a handle made with one.
/// * **Versions only go forward.** [`set`](PolicyHandle::set) refuses a version number that is
///   not above every number the handle has held ([`PolicyError::is_stale_version`]): one number
///   names one set of rules in every report.
/// * **A rollback never raises the cap.** [`rollback`](PolicyHandle::rollback) makes the
///   previous version current again, with its hard cap lowered to the smaller of the two
///   versions' caps (its default follows it down); it keeps its number. Rolling back again
///   keeps lowering: the cap after any number of rollbacks is at most every cap on the way.
///   What the layer holds besides the policy (its operation registry, its server, the durable
///   intents and their reconciler, its rejection cap's window) is not part of a version and is
///   never rolled back; a version brings only the cap's settings
///   ([`EndpointPolicyBuilder::rejection_cap`](crate::wire::EndpointPolicyBuilder::rejection_cap)), which a rollback restores with it.
/// * **A version a hop does not hold is its own current one.** Where the current version
///   trusts the caller's operation ([`caller_operation`](crate::wire::EndpointPolicyBuilder::caller_operation)),
///   a request whose `service-budget` names (`pv`) a version this handle still holds is
///   admitted under that version, capped at the current version's cap, so that one operation
///   meets the same rules on every hop while a rollout is under way. Any other `pv` (unknown,
///   rolled back, or from a caller not trusted with its operation) is ignored: the current
///   version applies. A caller never picks a version the hop does not have, nor a longer cap.
///
/// [`AdmitLayer::versioned`]: crate::integrations::tower::AdmitLayer::versioned
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), cancel_scope::wire::PolicyError> {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, Incoming, PolicyHandle};
///
/// let ms = Duration::from_millis;
/// let policies = PolicyHandle::new(EndpointPolicy::builder(ms(800))
///     .default_budget(ms(500))
///     .version(1)
///     .build())?;
/// let (_, first) = policies.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
/// policies.set(EndpointPolicy::builder(ms(800)).default_budget(ms(300)).version(2).build())?;
/// let (_, second) = policies.admit(Incoming::new(), tokio::time::Instant::now()).unwrap();
/// assert_eq!((first.policy_version(), first.initial_remaining()), (1, ms(500)));
/// assert_eq!((second.policy_version(), second.initial_remaining()), (2, ms(300)));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PolicyHandle {
    versions: Arc<ArcSwap<Versions>>,
}

impl PolicyHandle {
    /// A handle whose current version is `policy`, with nothing to roll back to.
    ///
    /// # Errors
    ///
    /// [`PolicyError::is_unbounded`]: the policy's maximum is over
    /// [`MAX_CAP`](crate::wire::MAX_CAP).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, PolicyHandle};
    /// let h = PolicyHandle::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .version(3)
    ///     .build())?;
    /// assert_eq!(h.version(), 3);
    /// # Ok::<(), cancel_scope::wire::PolicyError>(())
    /// ```
    pub fn new(policy: EndpointPolicy) -> Result<Self, PolicyError> {
        let current = bounded(policy)?;
        Ok(PolicyHandle {
            versions: Arc::new(ArcSwap::from_pointee(Versions {
                current,
                previous: Vec::new(),
                highest: current.policy_version(),
            })),
        })
    }

    /// The current version: what the next request is admitted under (unless its trusted
    /// caller names another version the handle holds, see [`policy_for`](Self::policy_for)).
    ///
    /// # Examples
    ///
    /// See [`PolicyHandle`].
    pub fn current(&self) -> EndpointPolicy {
        self.versions.load().current
    }

    /// The current version's number.
    ///
    /// # Examples
    ///
    /// See [`new`](Self::new).
    pub fn version(&self) -> u32 {
        self.current().policy_version()
    }

    /// The version numbers held, the current one first, then the earlier ones, newest first.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, PolicyHandle};
    /// let p = EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .build();
    /// let h = PolicyHandle::new(p.to_builder().version(1).build())?;
    /// h.set(p.to_builder().version(2).build())?;
    /// h.set(p.to_builder().version(5).build())?;
    /// assert_eq!(h.versions(), [5, 2, 1]);
    /// # Ok::<(), cancel_scope::wire::PolicyError>(())
    /// ```
    pub fn versions(&self) -> Vec<u32> {
        let v = self.versions.load();
        std::iter::once(&v.current)
            .chain(v.previous.iter().rev())
            .map(EndpointPolicy::policy_version)
            .collect()
    }

    /// Makes `policy` the current version; the one it replaces is kept for
    /// [`rollback`](Self::rollback) (the 8 newest are kept). Requests already admitted keep
    /// the version they were admitted under.
    ///
    /// # Errors
    ///
    /// [`PolicyError::is_unbounded`]: its maximum is over [`MAX_CAP`](crate::wire::MAX_CAP).
    /// [`PolicyError::is_stale_version`]: its version number is not above every number the
    /// handle has held (also one rolled back from).
    ///
    /// # Examples
    ///
    /// See [`PolicyHandle`].
    pub fn set(&self, policy: EndpointPolicy) -> Result<(), PolicyError> {
        let policy = bounded(policy)?;
        self.replace(|old| {
            if policy.policy_version() <= old.highest {
                return Err(PolicyError {
                    kind: ErrorKind::StaleVersion {
                        version: policy.policy_version(),
                        highest: old.highest,
                    },
                });
            }
            let mut previous = old.previous.clone();
            if previous.len() == HISTORY {
                previous.remove(0);
            }
            previous.push(old.current);
            Ok(Versions {
                current: policy,
                previous,
                highest: policy.policy_version(),
            })
        })
        .map(|_| ())
    }

    /// Replaces the versions by `next` of them, atomically (retried if another replacement
    /// came in between); nothing changes if `next` fails.
    fn replace(
        &self,
        next: impl Fn(&Versions) -> Result<Versions, PolicyError>,
    ) -> Result<EndpointPolicy, PolicyError> {
        let mut outcome = Err(PolicyError {
            kind: ErrorKind::NoPrevious,
        });
        self.versions.rcu(|old| match next(old) {
            Ok(new) => {
                outcome = Ok(new.current);
                Arc::new(new)
            }
            Err(e) => {
                outcome = Err(e);
                Arc::clone(old)
            }
        });
        outcome
    }

    /// Makes the previous version current again, with its hard cap (maximum) lowered to the
    /// smaller of its own and the current version's; returns it. The version rolled back
    /// from is dropped: a caller that names it gets the current version.
    ///
    /// # Errors
    ///
    /// [`PolicyError::is_no_previous`]: the handle holds no earlier version.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, PolicyHandle};
    /// let s = Duration::from_secs;
    /// let h = PolicyHandle::new(EndpointPolicy::builder(s(10))
    ///     .default_budget(s(5))
    ///     .version(1)
    ///     .build())?;
    /// h.set(EndpointPolicy::builder(s(3)).default_budget(s(2)).version(2).build())?;
    /// let back = h.rollback()?;
    /// // Version 1's rules, within version 2's shorter cap.
    /// assert_eq!((back.policy_version(), back.max_budget(), back.default_budget()), (1, s(3), s(3)));
    /// # Ok::<(), cancel_scope::wire::PolicyError>(())
    /// ```
    pub fn rollback(&self) -> Result<EndpointPolicy, PolicyError> {
        self.replace(|old| {
            let mut previous = old.previous.clone();
            let back = previous.pop().ok_or(PolicyError {
                kind: ErrorKind::NoPrevious,
            })?;
            Ok(Versions {
                current: back.capped_at(old.current.max_budget()),
                previous,
                highest: old.highest,
            })
        })
    }

    /// The policy that admits `incoming`: the version its `service-budget` names (`pv`), if
    /// the current version trusts the caller's operation and the handle holds that version
    /// (capped at the current version's cap); otherwise the current version.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, PolicyHandle, Trust};
    /// let s = Duration::from_secs;
    /// let h = PolicyHandle::new(EndpointPolicy::builder(s(2))
    ///     .default_budget(s(1))
    ///     .trust(Trust::Trusted)
    ///     .version(1)
    ///     .build())?;
    /// h.set(EndpointPolicy::builder(s(4))
    ///     .default_budget(s(3))
    ///     .trust(Trust::Trusted)
    ///     .version(2)
    ///     .build())?;
    /// let named = |pv: &str| Incoming::new().service_budget(format!("v=1, rem=100, pv={pv}").as_bytes());
    /// assert_eq!(h.policy_for(&named("1")).policy_version(), 1); // held: followed
    /// assert_eq!(h.policy_for(&named("7")).policy_version(), 2); // unknown: the current one
    /// # Ok::<(), cancel_scope::wire::PolicyError>(())
    /// ```
    pub fn policy_for(&self, incoming: &Incoming) -> EndpointPolicy {
        let v = self.versions.load();
        let current = v.current;
        let Some(named) = incoming
            .claimed_policy_version()
            .filter(|&n| n != current.policy_version() && current.accepts_caller_operation())
        else {
            return current;
        };
        v.previous
            .iter()
            .find(|p| p.policy_version() == named)
            .map_or(current, |p| p.capped_at(current.max_budget()))
    }

    /// Admits `incoming` under [`policy_for`](Self::policy_for) it
    /// ([`EndpointPolicy::admit`]). The joined admissions are the chosen policy's own:
    /// `handle.policy_for(&incoming).admit_joined(&ops, incoming, ingress)`.
    ///
    /// # Errors
    ///
    /// Those of [`EndpointPolicy::admit`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`EndpointPolicy::admit`].
    ///
    /// # Examples
    ///
    /// See [`PolicyHandle`].
    #[track_caller]
    pub fn admit(
        &self,
        incoming: Incoming,
        ingress: Instant,
    ) -> Result<(Scope, Admission), AdmissionError> {
        self.policy_for(&incoming).admit(incoming, ingress)
    }

    /// Admits `incoming` as a child of `server`'s scope under
    /// [`policy_for`](Self::policy_for) it ([`EndpointPolicy::admit_in`]).
    ///
    /// # Errors
    ///
    /// Those of [`EndpointPolicy::admit_in`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`EndpointPolicy::admit`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, PolicyHandle, ServerScope};
    /// let server = ServerScope::new();
    /// let h = PolicyHandle::new(EndpointPolicy::builder(Duration::from_secs(1))
    ///     .default_budget(Duration::ZERO)
    ///     .version(2)
    ///     .build()).unwrap();
    /// let (_, a) = h.admit_in(&server, Incoming::new().grpc_timeout(b"100m"), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(a.policy_version(), 2);
    /// # }
    /// ```
    #[track_caller]
    pub fn admit_in(
        &self,
        server: &ServerScope,
        incoming: Incoming,
        ingress: Instant,
    ) -> Result<(Scope, Admission), AdmissionError> {
        self.policy_for(&incoming)
            .admit_in(server, incoming, ingress)
    }
}

impl fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.versions.load();
        f.debug_struct("PolicyHandle")
            .field("current", &v.current)
            .field("previous", &v.previous)
            .field("highest", &v.highest)
            .finish()
    }
}
