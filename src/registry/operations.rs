//! What admission calls: join a request to its operation, attach its scope, cancel.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::error::{JoinError, RegistryError};
use super::id::OperationId;
use super::{CancelOutcome, OperationRegistry, OperationState, MIN_BUDGET};
use crate::time::deadline_after;
use crate::Scope;

/// How long [`Operations`] waits for the registry by default (and never longer than the
/// request's budget): 100 ms.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::registry::DEFAULT_TIMEOUT;
/// assert_eq!(DEFAULT_TIMEOUT, Duration::from_millis(100));
/// ```
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// A registry with the rules admission applies: a time bound on every call, the generation
/// check, and counts of what happened.
///
/// Cloning is cheap (one shared registry, one set of counts).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
///
/// let ops = Operations::new(Arc::new(InProcessRegistry::new())).timeout(Duration::from_millis(20));
/// let id = OperationId::random();
/// let joined = ops.join(Join::new(id, Duration::from_secs(1)).create(true)).await.unwrap();
/// assert_eq!(joined.generation(), 0);
/// assert_eq!(ops.counts().created(), 1);
/// # }
/// ```
#[derive(Clone)]
pub struct Operations {
    registry: Arc<dyn OperationRegistry>,
    timeout: Duration,
    counts: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    joined: AtomicU64,
    created: AtomicU64,
    refused: AtomicU64,
    unknown: AtomicU64,
    faults: AtomicU64,
}

/// Counts of [`Operations::join`] outcomes since the [`Operations`] was made.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use cancel_scope::registry::{InProcessRegistry, Operations};
/// let counts = Operations::new(Arc::new(InProcessRegistry::new())).counts();
/// assert_eq!(counts.faults(), 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinCounts {
    joined: u64,
    created: u64,
    refused: u64,
    unknown: u64,
    faults: u64,
}

impl JoinCounts {
    /// Requests that joined their operation (those that created it included).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::JoinCounts;
    /// assert_eq!(JoinCounts::default().joined(), 0);
    /// ```
    pub fn joined(&self) -> u64 {
        self.joined
    }

    /// Requests that created their operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::JoinCounts;
    /// assert_eq!(JoinCounts::default().created(), 0);
    /// ```
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Requests refused: a cancelled operation or another generation
    /// ([`JoinError::is_refused`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::JoinCounts;
    /// assert_eq!(JoinCounts::default().refused(), 0);
    /// ```
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Requests naming an operation the registry does not know, that could not create it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::JoinCounts;
    /// assert_eq!(JoinCounts::default().unknown(), 0);
    /// ```
    pub fn unknown(&self) -> u64 {
        self.unknown
    }

    /// Calls the registry did not answer (unreachable, slow, full).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::JoinCounts;
    /// assert_eq!(JoinCounts::default().faults(), 0);
    /// ```
    pub fn faults(&self) -> u64 {
        self.faults
    }
}

/// One request's claim on an operation, for [`Operations::join`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::registry::{Join, OperationId};
/// // A trusted hop continuing operation op-1 at generation 0, which it may create.
/// let join = Join::new(OperationId::new("op-1").unwrap(), Duration::from_millis(800))
///     .generation(0)
///     .create(true);
/// # let _ = join;
/// ```
#[derive(Clone, Debug)]
pub struct Join {
    id: OperationId,
    budget: Duration,
    generation: Option<u64>,
    create: bool,
}

impl Join {
    /// A request of operation `id` whose own budget (from its headers and the endpoint's
    /// cap) is `budget`: the operation's budget if it creates it, and the most the
    /// registry call may take.
    ///
    /// By default the caller's generation is not checked and the operation is not created.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::{Join, OperationId};
    /// let join = Join::new(OperationId::random(), Duration::from_secs(1));
    /// # let _ = join;
    /// ```
    pub fn new(id: OperationId, budget: Duration) -> Join {
        Join {
            id,
            budget,
            generation: None,
            create: false,
        }
    }

    /// The generation the caller's budget was cut from (`gen`): checked against the
    /// operation's. Give it only for callers whose generation the endpoint trusts.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::{Join, OperationId};
    /// let join = Join::new(OperationId::random(), Duration::from_secs(1)).generation(2);
    /// # let _ = join;
    /// ```
    pub fn generation(mut self, generation: u64) -> Join {
        self.generation = Some(generation);
        self
    }

    /// Whether the operation is begun if the registry does not hold it: only for an id the
    /// edge issued, or a caller trusted to name operations. An untrusted caller may only
    /// continue an operation the registry knows, and then only with what it has left.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::{Join, OperationId};
    /// let join = Join::new(OperationId::random(), Duration::from_secs(1)).create(true);
    /// # let _ = join;
    /// ```
    pub fn create(mut self, create: bool) -> Join {
        self.create = create;
        self
    }
}

/// A request that joined its operation: the operation's deadline and generation.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
/// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
/// let joined = ops
///     .join(Join::new(OperationId::random(), Duration::from_secs(1)).create(true))
///     .await
///     .unwrap();
/// assert_eq!(joined.remaining(), Duration::from_secs(1));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joined {
    id: OperationId,
    generation: u64,
    deadline: Instant,
    created: bool,
}

impl Joined {
    /// The operation's id.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let id = OperationId::random();
    /// let joined = ops.join(Join::new(id.clone(), Duration::from_secs(1)).create(true)).await.unwrap();
    /// assert_eq!(joined.id(), &id);
    /// # }
    /// ```
    pub fn id(&self) -> &OperationId {
        &self.id
    }

    /// The operation's generation: what the request's outgoing calls carry (`gen`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let j = ops.join(Join::new(OperationId::random(), Duration::from_secs(1)).create(true));
    /// assert_eq!(j.await.unwrap().generation(), 0);
    /// # }
    /// ```
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The operation's deadline on this process's monotonic clock: the moment the call
    /// started plus the time the store said was left, so never later than the store's own
    /// deadline. The request's deadline is the earlier of this and its own.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let start = Instant::now();
    /// let j = ops.join(Join::new(OperationId::random(), Duration::from_secs(1)).create(true));
    /// assert_eq!(j.await.unwrap().deadline(), start + Duration::from_secs(1));
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The time left until [`deadline`](Self::deadline), now.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let j = ops.join(Join::new(OperationId::random(), Duration::from_secs(1)).create(true));
    /// let joined = j.await.unwrap();
    /// tokio::time::advance(Duration::from_millis(300)).await;
    /// assert_eq!(joined.remaining(), Duration::from_millis(700));
    /// # }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether this request created the operation.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let j = ops.join(Join::new(OperationId::random(), Duration::from_secs(1)).create(true));
    /// assert!(j.await.unwrap().created());
    /// # }
    /// ```
    pub fn created(&self) -> bool {
        self.created
    }
}

impl Operations {
    /// Admission's view of `registry`, waiting at most [`DEFAULT_TIMEOUT`] per call.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// # let _ = ops;
    /// ```
    pub fn new(registry: Arc<dyn OperationRegistry>) -> Operations {
        Operations {
            registry,
            timeout: DEFAULT_TIMEOUT,
            counts: Arc::default(),
        }
    }

    /// Waits at most `timeout` for the registry (a join also at most the request's budget).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new())).timeout(Duration::from_millis(20));
    /// # let _ = ops;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Operations {
        self.timeout = timeout;
        self
    }

    /// The registry.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// assert_eq!(ops.registry().scopes().entries(), 0);
    /// ```
    pub fn registry(&self) -> &Arc<dyn OperationRegistry> {
        &self.registry
    }

    /// Joins an incoming request to its operation.
    ///
    /// In order: this process's record of cancelled operations ([`LocalScopes::check`], no
    /// round trip); then the registry — [`begin`](OperationRegistry::begin) if the request
    /// may create the operation, else [`get`](OperationRegistry::get) — within the smaller of
    /// the [timeout](Self::timeout) and the request's budget; then the generation check. A
    /// registry that says the operation was cancelled also has this process's scopes of it
    /// cancelled now: an announcement of that cancel was lost, and this is where it is
    /// caught.
    ///
    /// # Errors
    ///
    /// See [`JoinError`] for each kind and what admission answers. A budget under
    /// [`MIN_BUDGET`] is a fault whose error [`is_invalid`](RegistryError::is_invalid): the
    /// request has nothing left to begin an operation with.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves at most an operation begun in the store (which
    /// expires with its deadline).
    ///
    /// [`LocalScopes::check`]: super::LocalScopes::check
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
    ///
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let id = OperationId::random();
    /// ops.join(Join::new(id.clone(), Duration::from_millis(300)).create(true)).await.unwrap();
    /// // A caller that asks for more gets what the operation has left.
    /// let joined = ops.join(Join::new(id, Duration::from_secs(30))).await.unwrap();
    /// assert_eq!(joined.remaining(), Duration::from_millis(300));
    /// # }
    /// ```
    pub async fn join(&self, join: Join) -> Result<Joined, JoinError> {
        let started = Instant::now();
        let out = self.join_at(join, started).await;
        let c = &self.counts;
        let counter = match &out {
            Ok(j) if j.created => {
                c.created.fetch_add(1, Ordering::Relaxed);
                &c.joined
            }
            Ok(_) => &c.joined,
            Err(e) if e.is_refused() => &c.refused,
            Err(e) if e.is_unknown() => &c.unknown,
            Err(_) => &c.faults,
        };
        // Relaxed: counts for reports, ordering nothing.
        counter.fetch_add(1, Ordering::Relaxed);
        out
    }

    async fn join_at(&self, join: Join, started: Instant) -> Result<Joined, JoinError> {
        let Join {
            id,
            budget,
            generation,
            create,
        } = join;
        self.registry.scopes().check(&id)?;
        if budget < MIN_BUDGET {
            return Err(JoinError::from_fault(RegistryError::invalid(
                "an operation cannot begin with less than 1 ms",
            )));
        }
        let bound = self.timeout.min(budget);
        let (state, created): (Option<OperationState>, bool) = if create {
            let begun = bounded(
                bound,
                self.registry.begin(&id, budget),
                RegistryError::timeout,
            )
            .await
            .map_err(JoinError::from_fault)?;
            (Some(begun.state()), begun.created())
        } else {
            let state = bounded(bound, self.registry.get(&id), RegistryError::timeout)
                .await
                .map_err(JoinError::from_fault)?;
            (state, false)
        };
        let state = state.ok_or_else(JoinError::unknown)?;
        let deadline = deadline_after(started, state.remaining());
        if state.is_cancelled() {
            self.registry.scopes().cancel(&id, Some(deadline));
            return Err(JoinError::cancelled(Some(state.generation())));
        }
        if let Some(g) = generation.filter(|g| *g != state.generation()) {
            return Err(JoinError::stale(g, state.generation()));
        }
        Ok(Joined {
            id,
            generation: state.generation(),
            deadline,
            created,
        })
    }

    /// Attaches a request's scope (normally its root) to operation `id` in this process's
    /// index, so that the operation's cancel — made here or heard from another process —
    /// stops it. Attach a request admitted on a registry fault too: a local cancel still
    /// reaches it.
    ///
    /// # Errors
    ///
    /// [`JoinError::is_cancelled`] if the operation's cancel is known here (it may have come
    /// between [`join`](Self::join) and this call): the scope is cancelled now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::registry::{InProcessRegistry, OperationId, Operations};
    /// use cancel_scope::Scope;
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let request = Scope::new();
    /// ops.attach(&OperationId::new("op-1").unwrap(), &request).unwrap();
    /// ```
    pub fn attach(&self, id: &OperationId, scope: &Scope) -> Result<(), JoinError> {
        self.registry.scopes().attach(id, scope)
    }

    /// Whether this process knows operation `id` was cancelled ([`LocalScopes::check`]: one
    /// lock, no round trip).
    ///
    /// [`LocalScopes::check`]: super::LocalScopes::check
    ///
    /// # Errors
    ///
    /// [`JoinError::is_cancelled`] if it does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::registry::{InProcessRegistry, OperationId, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// assert!(ops.check(&OperationId::new("op-1").unwrap()).is_ok());
    /// ```
    pub fn check(&self, id: &OperationId) -> Result<(), JoinError> {
        self.registry.scopes().check(id)
    }

    /// Cancels operation `id`: this process's scopes of it at once (also when the registry
    /// then fails), then the registry's record, within the [timeout](Self::timeout).
    ///
    /// # Errors
    ///
    /// A fault ([`RegistryError::is_fault`]) when the registry did not answer in time: the
    /// local scopes are cancelled, the other processes may not know. Try again.
    ///
    /// # Panics
    ///
    /// As [`LocalScopes::cancel`](super::LocalScopes::cancel).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use cancel_scope::registry::{CancelOutcome, InProcessRegistry, OperationId, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let unknown = ops.cancel(&OperationId::new("op-1").unwrap()).await.unwrap();
    /// assert_eq!(unknown, CancelOutcome::Unknown);
    /// # }
    /// ```
    pub async fn cancel(&self, id: &OperationId) -> Result<CancelOutcome, RegistryError> {
        // The registry cancels the local scopes when it is called, before any await.
        let out = bounded(
            self.timeout,
            self.registry.cancel(id),
            RegistryError::timeout,
        )
        .await;
        if out.is_err() {
            // Whatever the registry did before it failed: stopped here all the same.
            self.registry.scopes().cancel(id, None);
        }
        out
    }

    /// The counts of [`join`](Self::join) outcomes so far.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// assert_eq!(ops.counts().joined(), 0);
    /// ```
    pub fn counts(&self) -> JoinCounts {
        let c = &self.counts;
        JoinCounts {
            joined: c.joined.load(Ordering::Relaxed),
            created: c.created.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            unknown: c.unknown.load(Ordering::Relaxed),
            faults: c.faults.load(Ordering::Relaxed),
        }
    }
}

/// `call`, given at most `bound`: no answer by then is `elapsed(bound)`.
pub(crate) async fn bounded<T, E>(
    bound: Duration,
    call: impl std::future::Future<Output = Result<T, E>>,
    elapsed: impl FnOnce(Duration) -> E,
) -> Result<T, E> {
    tokio::time::timeout(bound, call)
        .await
        .unwrap_or_else(|_| Err(elapsed(bound)))
}

impl fmt::Debug for Operations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operations")
            .field("registry", &self.registry)
            .field("timeout", &self.timeout)
            .field("counts", &self.counts())
            .finish()
    }
}
