//! One outgoing call, prepared the same way by every client integration.

use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use super::headers;
use crate::telemetry;
use crate::time::deadline_after;
use crate::wire::EgressPolicy;
use crate::{ChildSpec, Dispatched, Error, Scope, Ticket};
#[cfg(any(feature = "reqwest", feature = "tower"))]
use {
    super::CallError,
    crate::reconcile::{Journal, PendingIntent},
};

/// A call that may now be sent.
pub(crate) struct Prepared {
    /// The call's own scope (its deadline is the call's timeout).
    pub(crate) call: Scope,
    pub(crate) dispatched: Dispatched,
    /// When the budget the callee was told runs out.
    pub(crate) announced: Option<Instant>,
    /// Its span and metrics (see [`telemetry`](crate::telemetry)).
    pub(crate) telemetry: telemetry::Call,
}

/// A call registered (its ticket comes beside it), its headers written.
struct Cut {
    call: Scope,
    announced: Option<Instant>,
    /// The budget the headers carry.
    told: Option<Duration>,
}

impl Cut {
    /// The call, dispatched as `dispatched`, counted for `dependency`.
    fn prepared(
        self,
        dependency: &'static str,
        parent: &Scope,
        dispatched: Dispatched,
    ) -> Prepared {
        let telemetry = telemetry::Call::new(
            dependency,
            parent.remaining(),
            self.call.remaining(),
            self.told,
        );
        Prepared {
            call: self.call,
            dispatched,
            announced: self.announced,
            telemetry,
        }
    }
}

/// Cuts the call's scope from `parent` by `egress` (or the parent's operation's), registers
/// it as `spec` and writes its budget into `headers`; the call is dispatched by the caller
/// ([`prepare`], [`prepare_journaled`]).
///
/// Budgets only shrink, so the call's deadline is also no later than `within` (a bound the
/// caller has besides `parent`: another scope's deadline, a client timeout) nor than the
/// shortest valid budget header already in `headers` (the caller's own per-call timeout:
/// tonic's `Request::set_timeout` writes `grpc-timeout`; see [`headers::preset`] for a call
/// that is otherwise unbounded). The headers sent, the call's own deadline and the budget
/// `announced` to the callee all come from that one scope, so they shrink together. Every
/// budget header found is replaced by the call's own (none for a call without a deadline):
/// a malformed one is not trusted, and a copied one's priority, operation id and generation
/// do not go on.
fn register(
    parent: &Scope,
    within: Option<Instant>,
    egress: Option<EgressPolicy>,
    spec: ChildSpec,
    headers: &mut HeaderMap,
) -> Result<(Cut, Ticket), Error> {
    let egress = egress.unwrap_or_else(|| EgressPolicy::for_scope(parent));
    let bounded = parent.deadline().is_some() || within.is_some() || egress.cap_budget().is_some();
    let mut child = egress.call_child(parent);
    if let Some(d) = within {
        child = child.deadline(d);
    }
    if let Some(preset) = headers::preset(headers, bounded) {
        // The caller's header is read as its timeout for the call, as tonic's channel does:
        // the callee is told that less the transport pad.
        child = child.cap(preset);
    }
    let call = child.build()?;
    let ticket = call.register(spec)?;
    let out = egress.outgoing(&call)?;
    headers::insert(headers, &out);
    // What the headers carry, not `remaining`: both truncate, and the callee (or a transport
    // enforcing `grpc-timeout`, as tonic's channel does) gives up at the shorter budget.
    let told = out.told();
    let announced = told.map(|r| deadline_after(Instant::now(), r));
    let cut = Cut {
        call,
        announced,
        told,
    };
    Ok((cut, ticket))
}

/// Cuts, registers and writes the headers of the call as [`register`] does, and dispatches
/// it: after `Ok` the request may be sent; after `Err` it must not be.
///
/// The call counts for `dependency` in telemetry: its budget, or why it was refused.
pub(crate) fn prepare(
    dependency: &'static str,
    parent: &Scope,
    within: Option<Instant>,
    egress: Option<EgressPolicy>,
    spec: ChildSpec,
    headers: &mut HeaderMap,
) -> Result<Prepared, Error> {
    let prepared = register(parent, within, egress, spec, headers).and_then(|(cut, ticket)| {
        // Last: the compare-and-swap that fails if the call's scope was cancelled since it
        // was registered (invariant 2).
        let dispatched = ticket.dispatch()?;
        Ok(cut.prepared(dependency, parent, dispatched))
    });
    if let Err(e) = &prepared {
        telemetry::call_refused(dependency, telemetry::Refused::of(e));
    }
    prepared
}

/// [`prepare`], with `journal`'s intent written before the dispatch when the journal records
/// the call's effect class ([`Journal::records`]): a call whose intent could not be written
/// is refused before anything is sent ([`CallError::is_intent_not_recorded`]). The intent
/// comes back with the call, to be resolved by its receipt.
#[cfg(any(feature = "reqwest", feature = "tower"))]
pub(crate) async fn prepare_journaled(
    dependency: &'static str,
    parent: &Scope,
    within: Option<Instant>,
    egress: Option<EgressPolicy>,
    spec: ChildSpec,
    headers: &mut HeaderMap,
    journal: &Journal,
) -> Result<(Prepared, Option<PendingIntent>), CallError> {
    let refused = |e: Error| {
        telemetry::call_refused(dependency, telemetry::Refused::of(&e));
        CallError::from(e)
    };
    let (cut, ticket) = register(parent, within, egress, spec, headers).map_err(refused)?;
    let operation = parent.operation().map(crate::wire::Operation::id);
    let journaled =
        journal
            .dispatch(ticket, operation)
            .await
            .map_err(|e| match e.into_refusal() {
                Ok(e) => refused(e),
                Err(e) => CallError::intent_not_recorded(e),
            })?;
    let (dispatched, intent) = journaled.into_parts();
    Ok((cut.prepared(dependency, parent, dispatched), intent))
}
