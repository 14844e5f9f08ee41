//! An admission's record, shared by its copies (the request's extension, the layer's own):
//! moving or cloning an [`Admission`](super::Admission) moves one pointer.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::record::{BudgetSource, OperationSource, PrioritySource, RegistryTerm};
use crate::wire::operation::Operation;
use crate::wire::service_budget::ServiceBudget;

/// The fields behind an [`Admission`](super::Admission): see its getters.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::wire) struct Admission {
    pub(in crate::wire) operation: Arc<Operation>,
    /// The caller's `service-budget`, if it sent one valid line.
    pub(in crate::wire) caller: Option<ServiceBudget>,
    /// The shortest valid `grpc-timeout` line.
    pub(in crate::wire) grpc_timeout: Option<Duration>,
    /// The shortest valid `x-envoy-expected-rq-timeout-ms` line, read or not.
    pub(in crate::wire) envoy_timeout: Option<Duration>,
    pub(in crate::wire) policy_version: u32,
    pub(in crate::wire) ingress: Instant,
    pub(in crate::wire) admitted_at: Instant,
    pub(in crate::wire) deadline: Instant,
    pub(in crate::wire) audit_deadline: SystemTime,
    pub(in crate::wire) initial_remaining: Duration,
    pub(in crate::wire) declared: Option<Duration>,
    pub(in crate::wire) clamped: bool,
    pub(in crate::wire) budget_source: BudgetSource,
    pub(in crate::wire) priority_source: PrioritySource,
    pub(in crate::wire) operation_source: OperationSource,
    pub(in crate::wire) registry: RegistryTerm,
    pub(in crate::wire) operation_deadline: Option<Instant>,
    /// What shadow mode did not enforce, if the policy shadows.
    pub(in crate::wire) shadow: Option<Arc<crate::wire::shadow::Shadowed>>,
}
