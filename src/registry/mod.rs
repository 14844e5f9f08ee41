//! The operation registry: one operation's deadline and cancel generation, shared by every
//! request of that operation, across requests and processes.
//!
//! # Why
//!
//! A budget header only says what the *caller* had left. A request that re-enters under the
//! same operation — a client's retry of an operation the edge issued, a callback, the second
//! leg of a saga — would otherwise start with a fresh budget, and a cancel would be seen only
//! in the process that made it. The registry is where an operation's own deadline and
//! generation live:
//!
//! * **Remaining time.** An operation begins with its deadline ([`OperationRegistry::begin`],
//!   created only if absent); every later hop reads what is left and admits with
//!   `min(header, endpoint cap, registry remaining)`, so a retry under the same id never gets
//!   more than the operation has left. Time is always *remaining* time on the store's clock
//!   (Redis: the key's `PTTL`), never a wall-clock instant compared across machines.
//! * **Generation.** Cancelling an operation bumps its generation and closes it, in one step.
//!   Every hop checks the generation a request carries at admission: a request cut before
//!   the cancel is refused wherever it arrives, also when the cancel's announcement never
//!   reached that process.
//! * **Local scopes.** Each registry keeps a [`LocalScopes`] index of this process's scopes
//!   per operation (weakly: it never keeps a scope alive), so a cancel — made here, or heard
//!   from another process — stops every scope of the operation here at once.
//!
//! # The API admission calls
//!
//! [`Operations`] wraps an `Arc<dyn OperationRegistry>` with the time bound and the decisions:
//!
//! | step | call | outcome |
//! |---|---|---|
//! | ingress, before the handler | [`Operations::join`] with the request's operation id, its budget, the caller's generation (trusted callers only) and whether the caller may create the operation | [`Joined`]: the operation's deadline and generation; or a [`JoinError`] |
//! | once the request's root scope exists | [`Operations::attach`] | the scope is stopped by the operation's cancel |
//! | to cancel an operation | [`Operations::cancel`] | local scopes stopped at once, then the store |
//!
//! A registry that does not answer within the bound (the smaller of
//! [`Operations::timeout`] and the request's budget) is a fault ([`JoinError::is_fault`]):
//! admission goes on with the endpoint's own cap — never without a deadline — and counts it
//! ([`Operations::counts`]).
//!
//! # Implementations
//!
//! | type | where |
//! |---|---|
//! | [`InProcessRegistry`] | one process; bounded memory, entries expire with their deadline |
//! | `integrations::redis::RedisRegistry` (feature `redis`) | shared by processes: one key per operation with a `PX` expiry, cancels announced on pub/sub |
//!
//! The trait uses boxed futures so that it can be used as `Arc<dyn OperationRegistry>`.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cancel_scope::registry::{InProcessRegistry, Join, OperationId, Operations};
//! use cancel_scope::Scope;
//!
//! let ops = Operations::new(Arc::new(InProcessRegistry::new()));
//! let id = OperationId::random();
//!
//! // The edge begins the operation with the 2 s it gives it.
//! let first = ops.join(Join::new(id.clone(), Duration::from_secs(2)).create(true)).await?;
//! assert!(first.created());
//!
//! // 1.5 s later the client retries under the same id, asking for 10 s: it gets what is left.
//! tokio::time::advance(Duration::from_millis(1500)).await;
//! let retry = ops.join(Join::new(id.clone(), Duration::from_secs(10))).await?;
//! assert_eq!(retry.remaining(), Duration::from_millis(500));
//!
//! // A cancel stops the request's scopes here and refuses the operation's later requests.
//! let request = Scope::with_deadline(retry.deadline());
//! ops.attach(&id, &request)?;
//! ops.cancel(&id).await?;
//! assert!(request.is_cancelled());
//! assert!(ops.join(Join::new(id, Duration::from_secs(1))).await.unwrap_err().is_refused());
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub(crate) mod error;
mod fault;
mod id;
mod memory;
mod operations;
mod scopes;

pub use error::{JoinError, RegistryError};
pub use fault::RegistryFault;
pub use id::{OperationId, MAX_ID_LEN};
pub use memory::InProcessRegistry;
pub(crate) use operations::bounded;
pub use operations::{Join, JoinCounts, Joined, Operations, DEFAULT_TIMEOUT};
pub use scopes::{LocalScopes, OPERATION_CANCELLED};

/// The future an [`OperationRegistry`] (or [`IntentStore`](crate::reconcile::IntentStore))
/// method returns: boxed, so that the traits can be used as `Arc<dyn _>`.
///
/// # Examples
///
/// ```
/// use cancel_scope::registry::BoxFuture;
/// fn answer<'a>() -> BoxFuture<'a, u8> {
///     Box::pin(async { 42 })
/// }
/// # let _ = answer();
/// ```
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The longest an operation is kept: a longer budget is shortened to it when the operation
/// begins (30 days; budgets are never lengthened, only this shortened).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry, MAX_LIFETIME};
/// let registry = InProcessRegistry::new();
/// let begun = registry.begin(&OperationId::new("a").unwrap(), Duration::MAX).await.unwrap();
/// assert_eq!(begun.state().remaining(), MAX_LIFETIME);
/// # }
/// ```
pub const MAX_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// The shortest budget an operation can begin with: stores count time in milliseconds.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry, MIN_BUDGET};
/// let registry = InProcessRegistry::new();
/// let id = OperationId::new("a").unwrap();
/// let short = MIN_BUDGET - Duration::from_nanos(1);
/// assert!(registry.begin(&id, short).await.unwrap_err().is_invalid());
/// # }
/// ```
pub const MIN_BUDGET: Duration = Duration::from_millis(1);

/// Where operations' deadlines and generations live.
///
/// Implementations answer for the store only; the time bound, the generation check and the
/// refusals are [`Operations`]'. Each method's future may be dropped at any `.await` (it is
/// raced against a timeout): nothing is left half done in the store by that, since every
/// change is one atomic step of the store.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry};
///
/// let registry: Arc<dyn OperationRegistry> = Arc::new(InProcessRegistry::new());
/// let id = OperationId::new("op-1").unwrap();
/// let begun = registry.begin(&id, Duration::from_secs(1)).await.unwrap();
/// assert!(begun.created());
/// assert_eq!(registry.get(&id).await.unwrap().unwrap().generation(), 0);
/// # }
/// ```
pub trait OperationRegistry: fmt::Debug + Send + Sync {
    /// Begins operation `id` with `budget` (shortened to [`MAX_LIFETIME`]) if the store does
    /// not hold it, and returns its state either way: an existing operation keeps its
    /// deadline and generation (a second `begin` never lengthens it). Creating and reading
    /// are one atomic step.
    ///
    /// # Errors
    ///
    /// [`RegistryError::is_invalid`] for a budget under [`MIN_BUDGET`]; a fault
    /// ([`RegistryError::is_fault`]) when the store did not answer, or (bounded stores)
    /// [`RegistryError::is_full`] when it holds as many operations as it may.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry};
    /// let registry = InProcessRegistry::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// registry.begin(&id, Duration::from_secs(1)).await.unwrap();
    /// let again = registry.begin(&id, Duration::from_secs(9)).await.unwrap();
    /// assert!(!again.created());
    /// assert_eq!(again.state().remaining(), Duration::from_secs(1));
    /// # }
    /// ```
    fn begin<'a>(
        &'a self,
        id: &'a OperationId,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Begun, RegistryError>>;

    /// The state of operation `id`, or `None` if the store does not hold it (never begun, or
    /// expired).
    ///
    /// # Errors
    ///
    /// A fault when the store did not answer.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use cancel_scope::registry::{InProcessRegistry, OperationId, OperationRegistry};
    /// let registry = InProcessRegistry::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// assert!(registry.get(&id).await.unwrap().is_none());
    /// # }
    /// ```
    fn get<'a>(
        &'a self,
        id: &'a OperationId,
    ) -> BoxFuture<'a, Result<Option<OperationState>, RegistryError>>;

    /// Cancels operation `id`: cancels this process's scopes of the operation
    /// ([`scopes`](Self::scopes)) when it is called, before the returned future first awaits
    /// anything; then bumps the operation's generation and closes it in the store in one atomic
    /// step (once: a second cancel changes nothing), and announces it to the other processes
    /// where the store can. The operation stays in the store, cancelled, until its deadline.
    ///
    /// # Errors
    ///
    /// A fault when the store did not answer.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::registry::{CancelOutcome, InProcessRegistry, OperationId, OperationRegistry};
    /// let registry = InProcessRegistry::new();
    /// let id = OperationId::new("op-1").unwrap();
    /// registry.begin(&id, Duration::from_secs(1)).await.unwrap();
    /// assert!(matches!(registry.cancel(&id).await.unwrap(), CancelOutcome::Cancelled(_)));
    /// assert!(matches!(registry.cancel(&id).await.unwrap(), CancelOutcome::AlreadyCancelled(_)));
    /// # }
    /// ```
    fn cancel<'a>(
        &'a self,
        id: &'a OperationId,
    ) -> BoxFuture<'a, Result<CancelOutcome, RegistryError>>;

    /// This process's index of scopes per operation, which cancels go through.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{InProcessRegistry, OperationRegistry};
    /// assert_eq!(InProcessRegistry::new().scopes().entries(), 0);
    /// ```
    fn scopes(&self) -> &LocalScopes;
}

/// What the store says of one operation.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::registry::OperationState;
/// let s = OperationState::new(Duration::from_millis(250), 1, true);
/// assert_eq!((s.remaining(), s.generation(), s.is_cancelled()), (Duration::from_millis(250), 1, true));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperationState {
    remaining: Duration,
    generation: u64,
    cancelled: bool,
}

impl OperationState {
    /// A state (for implementations of [`OperationRegistry`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::OperationState;
    /// assert_eq!(OperationState::new(Duration::ZERO, 0, false).generation(), 0);
    /// ```
    pub const fn new(remaining: Duration, generation: u64, cancelled: bool) -> OperationState {
        OperationState {
            remaining,
            generation,
            cancelled,
        }
    }

    /// The time the operation had left when the store answered (by the store's clock).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::OperationState;
    /// let s = OperationState::new(Duration::from_secs(1), 0, false);
    /// assert_eq!(s.remaining(), Duration::from_secs(1));
    /// ```
    pub const fn remaining(&self) -> Duration {
        self.remaining
    }

    /// The cancel generation: `0` when the operation began, bumped by its cancel.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::OperationState;
    /// assert_eq!(OperationState::new(Duration::ZERO, 2, true).generation(), 2);
    /// ```
    pub const fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the operation was cancelled (it then admits no request).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::OperationState;
    /// assert!(!OperationState::new(Duration::ZERO, 0, false).is_cancelled());
    /// ```
    pub const fn is_cancelled(&self) -> bool {
        self.cancelled
    }
}

/// What [`OperationRegistry::begin`] found or made.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::registry::{Begun, OperationState};
/// let b = Begun::new(OperationState::new(Duration::from_secs(1), 0, false), true);
/// assert!(b.created());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begun {
    state: OperationState,
    created: bool,
}

impl Begun {
    /// The answer of a `begin` (for implementations of [`OperationRegistry`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::{Begun, OperationState};
    /// let b = Begun::new(OperationState::new(Duration::ZERO, 0, false), false);
    /// assert!(!b.created());
    /// ```
    pub const fn new(state: OperationState, created: bool) -> Begun {
        Begun { state, created }
    }

    /// The operation's state after the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::{Begun, OperationState};
    /// let s = OperationState::new(Duration::ZERO, 0, false);
    /// assert_eq!(Begun::new(s, true).state(), s);
    /// ```
    pub const fn state(&self) -> OperationState {
        self.state
    }

    /// Whether this call created the operation (`false`: it existed).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::{Begun, OperationState};
    /// assert!(Begun::new(OperationState::new(Duration::ZERO, 0, false), true).created());
    /// ```
    pub const fn created(&self) -> bool {
        self.created
    }
}

/// What [`OperationRegistry::cancel`] did.
///
/// # Examples
///
/// ```
/// use cancel_scope::registry::CancelOutcome;
/// assert_eq!(CancelOutcome::Unknown.state(), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// This call cancelled it: the state after the cancel (its new generation).
    Cancelled(OperationState),
    /// It was cancelled already; nothing changed.
    AlreadyCancelled(OperationState),
    /// The store does not hold it (never begun, or expired). This process's scopes of it were
    /// cancelled all the same.
    Unknown,
}

impl CancelOutcome {
    /// The operation's state, unless it is unknown.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::registry::{CancelOutcome, OperationState};
    /// let s = OperationState::new(Duration::from_secs(1), 1, true);
    /// assert_eq!(CancelOutcome::Cancelled(s).state(), Some(s));
    /// ```
    pub const fn state(&self) -> Option<OperationState> {
        match self {
            CancelOutcome::Cancelled(s) | CancelOutcome::AlreadyCancelled(s) => Some(*s),
            CancelOutcome::Unknown => None,
        }
    }
}
