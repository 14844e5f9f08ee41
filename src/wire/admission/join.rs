//! Admission with the operation registry: the request joins its operation, whose remaining
//! time bounds its budget and whose cancel refuses it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::server::ServerScope;
use super::{
    request_child_of, request_root, Admission, AdmissionError, Incoming, Operation,
    OperationSource, Prepared, RegistryTerm, Settled,
};
use crate::registry::{Join, JoinError, OperationId, Operations, RegistryFault};
use crate::scope::Note;
use crate::wire::EndpointPolicy;
use crate::Scope;

/// How a request's operation was settled with the registry, before its scope exists.
struct Outcome {
    settled: Settled,
    /// The registry's fault, for the request's report.
    fault: Option<String>,
}

impl EndpointPolicy {
    /// [`admit`](Self::admit), with the operation registry's term: the request joins its
    /// operation through `ops` ([`Operations::join`]) and gets
    ///
    /// ```text
    /// remaining = min(header, endpoint maximum, the operation's remaining time) − queued − reserve
    /// ```
    ///
    /// Who may name the operation follows the trust split
    /// ([`caller_operation`](Self::caller_operation)):
    ///
    /// | the caller sent | trusted to name operations | not trusted (the default) |
    /// |---|---|---|
    /// | an `op` the registry holds | joins it (its `gen` checked) | joins it: only shortens ([`OperationSource::Known`]) |
    /// | an `op` the registry does not hold | begins it with the request's budget | a fresh id ([`OperationId::random`]) begun with the request's budget: the caller's is never created |
    /// | no `op` | a fresh id, begun | a fresh id, begun |
    ///
    /// The request's generation — what its outgoing calls carry as `gen` — is the registry's.
    /// The request's scope is attached to the operation ([`Operations::attach`]), so that the
    /// operation's cancel, made here or in another process, cancels it.
    ///
    /// A registry that fails — unreachable, slower than the smaller of
    /// [`Operations::timeout`] and the request's budget, or full — does not stop admission:
    /// the request is admitted on the endpoint's own terms (never without a deadline), under
    /// a trusted caller's `op` and `gen` or else a fresh id, the fault counted
    /// ([`JoinCounts::faults`](crate::registry::JoinCounts::faults)) and noted in the
    /// request's report ([`Report::registry_faults`](crate::Report::registry_faults)); its
    /// [`Admission::registry`] says [`RegistryTerm::Fault`].
    ///
    /// # Errors
    ///
    /// Those of [`admit`](Self::admit) (checked before the registry is asked), and
    /// [`AdmissionError::is_operation_cancelled`]: the operation was cancelled, or the
    /// trusted caller's generation is not the operation's (answer 409 / `ABORTED`). A budget
    /// the registry shortened below the minimum useful budget is
    /// [`is_exhausted`](AdmissionError::is_exhausted).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`admit`](Self::admit).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future admits nothing (at most an operation was begun in
    /// the registry, and expires with its deadline).
    ///
    /// # Examples
    ///
    /// A client's retry under the operation id the edge issued gets what the operation has
    /// left, not a fresh budget:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, OperationSource};
    ///
    /// let edge = EndpointPolicy::builder(Duration::from_secs(2)).build();
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let (_, first) = edge.admit_joined(&ops, Incoming::new(), Instant::now()).await.unwrap();
    /// let id = first.operation_id().to_owned(); // returned to the client
    ///
    /// tokio::time::advance(Duration::from_millis(1500)).await;
    /// let retry = format!("v=1, rem=2000, op=\"{id}\"");
    /// let incoming = Incoming::new().service_budget(retry.as_bytes());
    /// let (scope, again) = edge.admit_joined(&ops, incoming, Instant::now()).await.unwrap();
    /// assert_eq!(again.operation_id(), id);
    /// assert_eq!(again.operation_source(), OperationSource::Known);
    /// assert_eq!(scope.remaining(), Some(Duration::from_millis(500)));
    ///
    /// // An id the registry does not know is not the caller's to create.
    /// let victim = Incoming::new().service_budget(b"v=1, rem=1, op=victim-op");
    /// let (_, other) = edge.admit_joined(&ops, victim, Instant::now()).await.unwrap();
    /// assert_ne!(other.operation_id(), "victim-op");
    /// # }
    /// ```
    pub fn admit_joined(
        &self,
        ops: &Operations,
        incoming: Incoming,
        ingress: Instant,
    ) -> impl std::future::Future<Output = Result<(Scope, Admission), AdmissionError>> + Send + '_
    {
        self.admit_joined_with(ops, incoming, ingress, request_root)
    }

    /// [`admit_joined`](Self::admit_joined), with the request's scope a child of `server`'s,
    /// as [`admit_in`](Self::admit_in).
    ///
    /// # Errors
    ///
    /// Those of [`admit_joined`](Self::admit_joined), and
    /// [`AdmissionError::is_unavailable`]: the server's shutdown has begun.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`admit`](Self::admit).
    ///
    /// # Cancel safety
    ///
    /// As [`admit_joined`](Self::admit_joined).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::registry::{InProcessRegistry, Operations};
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, ServerScope};
    ///
    /// let server = ServerScope::new();
    /// let policy = EndpointPolicy::builder(Duration::from_secs(2))
    ///     .default_budget(Duration::from_secs(1))
    ///     .build();
    /// let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    /// let (scope, _) = policy.admit_joined_in(&server, &ops, Incoming::new(), Instant::now())
    ///     .await
    ///     .unwrap();
    /// assert_eq!(scope.remaining(), Some(Duration::from_secs(1)));
    /// # }
    /// ```
    pub fn admit_joined_in<'a>(
        &'a self,
        server: &'a ServerScope,
        ops: &Operations,
        incoming: Incoming,
        ingress: Instant,
    ) -> impl std::future::Future<Output = Result<(Scope, Admission), AdmissionError>> + Send + 'a
    {
        self.admit_joined_with(ops, incoming, ingress, request_child_of(server))
    }

    /// Admission with the registry, with `scope` making the request's scope (as for
    /// `admit_with`). The headers are decoded and checked at once, before the registry is
    /// asked.
    fn admit_joined_with<'a>(
        &'a self,
        ops: &Operations,
        incoming: Incoming,
        ingress: Instant,
        scope: impl FnOnce(Instant, Duration, Arc<str>, Arc<Operation>) -> Result<Scope, AdmissionError>
            + Send
            + 'a,
    ) -> impl std::future::Future<Output = Result<(Scope, Admission), AdmissionError>> + Send + 'a
    {
        let prepared = self.prepare(incoming, ingress);
        let ops = ops.clone();
        async move {
            let admitted = async {
                let prepared = prepared?;
                let outcome = self.settle_operation(&ops, &prepared).await?;
                self.admitted(&ops, prepared, outcome, scope)
            }
            .await;
            super::recorded(&admitted);
            admitted
        }
    }

    /// The request's scope made, attached to its operation, a registry fault noted.
    fn admitted(
        &self,
        ops: &Operations,
        prepared: Prepared,
        outcome: Outcome,
        scope: impl FnOnce(Instant, Duration, Arc<str>, Arc<Operation>) -> Result<Scope, AdmissionError>,
    ) -> Result<(Scope, Admission), AdmissionError> {
        let id = outcome.settled.id.clone();
        let (scope, admission) = self.settle(prepared, outcome.settled, scope)?;
        if let Some(error) = outcome.fault {
            scope.add_note(Note::new(Arc::new(RegistryFault::new(id.clone(), error))));
        }
        // A cancel that came while the registry answered: the scope is cancelled by it now.
        ops.attach(&id, &scope).map_err(AdmissionError::operation)?;
        Ok((scope, admission))
    }

    /// Settles the request's operation with the registry (see
    /// [`admit_joined`](Self::admit_joined) for who may name one).
    async fn settle_operation(
        &self,
        ops: &Operations,
        prepared: &Prepared,
    ) -> Result<Outcome, AdmissionError> {
        let trusted = self.accepts_caller_operation();
        let claimed = prepared.claimed();
        let deadline = prepared.deadline();
        if let Some((id, generation)) = claimed {
            let join = Join::new(id.clone(), prepared.remaining);
            let join = if trusted {
                join.generation(generation).create(true)
            } else {
                join
            };
            match ops.join(join).await {
                Ok(joined) => {
                    let (source, term) = match (trusted, joined.created()) {
                        (true, true) => (OperationSource::Caller, RegistryTerm::Created),
                        (true, false) => (OperationSource::Caller, RegistryTerm::Joined),
                        (false, _) => (OperationSource::Known, RegistryTerm::Joined),
                    };
                    return Ok(Outcome::joined(joined, source, term));
                }
                Err(e) if e.is_refused() => return Err(AdmissionError::operation(e)),
                // An untrusted caller's id the registry does not hold: not the caller's to
                // create; the edge issues one below.
                Err(e) if e.is_unknown() && !trusted => {}
                Err(e) if trusted => {
                    return Ok(Outcome::fault(id, generation, OperationSource::Caller, &e));
                }
                // A fault: whether the caller's id is known cannot be told, so it is not
                // adopted (a trusted hop behind would create it).
                Err(e) => {
                    let fresh = OperationId::random();
                    return Ok(Outcome::fault(fresh, 0, OperationSource::Local, &e));
                }
            }
        }
        // A fresh operation, issued by this edge, begun with what the request has left.
        let fresh = OperationId::random();
        let left = deadline.saturating_duration_since(Instant::now());
        match ops.join(Join::new(fresh.clone(), left).create(true)).await {
            Ok(joined) => Ok(Outcome::joined(
                joined,
                OperationSource::Local,
                RegistryTerm::Created,
            )),
            Err(e) if e.is_refused() => Err(AdmissionError::operation(e)),
            Err(e) => Ok(Outcome::fault(fresh, 0, OperationSource::Local, &e)),
        }
    }
}

impl Outcome {
    fn joined(
        joined: crate::registry::Joined,
        source: OperationSource,
        term: RegistryTerm,
    ) -> Self {
        Outcome {
            settled: Settled {
                generation: joined.generation(),
                deadline: Some(joined.deadline()),
                id: joined.id().clone(),
                source,
                registry: term,
            },
            fault: None,
        }
    }

    fn fault(id: OperationId, generation: u64, source: OperationSource, e: &JoinError) -> Self {
        Outcome {
            settled: Settled {
                id,
                generation,
                source,
                deadline: None,
                registry: RegistryTerm::Fault,
            },
            fault: Some(e.to_string()),
        }
    }
}
