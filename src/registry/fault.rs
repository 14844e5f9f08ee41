//! A registry fault, as the report of the request it happened to lists it.

use std::fmt;

use super::id::OperationId;
use crate::Report;

/// A request admitted on the endpoint's own terms because the operation registry failed
/// (unreachable, slower than its bound, full): one note in the request's [`Report`]
/// ([`Report::registry_faults`]).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use cancel_scope::registry::{InProcessRegistry, Operations};
/// use cancel_scope::wire::{EndpointPolicy, Incoming, RegistryTerm};
///
/// // A registry that holds one operation at most: the second is a fault.
/// let ops = Operations::new(Arc::new(InProcessRegistry::new().max_entries(1)));
/// let policy = EndpointPolicy::builder(Duration::from_secs(2))
///     .default_budget(Duration::from_secs(1))
///     .build();
/// let now = tokio::time::Instant::now;
/// let _first = policy.admit_joined(&ops, Incoming::new(), now()).await.unwrap();
/// let (scope, a) = policy.admit_joined(&ops, Incoming::new(), now()).await.unwrap();
/// assert_eq!(a.registry(), RegistryTerm::Fault);
/// assert_eq!(scope.remaining(), Some(Duration::from_secs(1))); // the endpoint's own terms
/// assert_eq!(ops.counts().faults(), 1);
///
/// scope.close();
/// let report = scope.quiesce().await;
/// assert_eq!(report.registry_faults()[0].operation().as_str(), a.operation_id());
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryFault {
    operation: OperationId,
    error: String,
}

impl RegistryFault {
    pub(crate) fn new(operation: OperationId, error: String) -> RegistryFault {
        RegistryFault { operation, error }
    }

    /// The operation the request was admitted under.
    ///
    /// # Examples
    ///
    /// See [`RegistryFault`].
    pub fn operation(&self) -> &OperationId {
        &self.operation
    }

    /// What the registry failed with (the fault's `Display` text: for logs).
    ///
    /// # Examples
    ///
    /// See [`RegistryFault`].
    pub fn error(&self) -> &str {
        &self.error
    }
}

impl fmt::Debug for RegistryFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryFault")
            .field("operation", &self.operation)
            .field("error", &self.error)
            .finish()
    }
}

impl fmt::Display for RegistryFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "operation {}: admitted on the endpoint's terms: {}",
            self.operation, self.error
        )
    }
}

impl Report {
    /// The registry faults of the requests in this report ([`RegistryFault`]): each was
    /// admitted on its endpoint's own terms, without the operation's remaining time. Oldest
    /// first, the newest 64 notes at most (see [`dropped_notes`](Report::dropped_notes)).
    ///
    /// # Examples
    ///
    /// See [`RegistryFault`].
    pub fn registry_faults(&self) -> Vec<&RegistryFault> {
        self.notes()
            .iter()
            .filter_map(|n| n.get::<RegistryFault>())
            .collect()
    }
}
