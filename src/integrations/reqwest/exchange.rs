//! One scoped reqwest call, from a built request to its response: the steps that
//! `ScopedRequest::send` and the `reqwest-middleware` middleware share.

use std::future::Future;
use std::sync::Arc;

use reqwest::{Request, Response};
use tokio::time::Instant;

use super::response::{Call, ScopedResponse};
use super::target;
use crate::integrations::effect::{self, Class};
use crate::integrations::{call, CallError};
use crate::reconcile::Journal;
use crate::time::deadline_after;
use crate::wire::EgressPolicy;
use crate::{ChildSpec, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a call is made, when its caller says: its egress policy (else the scope's
/// operation's), its spec (else named `name`, or `"call"`, with the request's effect class).
pub(super) struct How {
    pub(super) egress: Option<EgressPolicy>,
    pub(super) spec: Option<ChildSpec>,
    pub(super) name: Option<Arc<str>>,
    /// Where the call's intent is written before its dispatch, if its effect class is one
    /// the journal records.
    pub(super) journal: Option<Journal>,
    /// The service the call goes to, as telemetry labels it.
    pub(super) dependency: &'static str,
}

/// Makes `req` a call in a child of `parent` and sends it with `send` (a client's `execute`,
/// or the rest of a middleware chain):
///
/// 1. the call's child is cut by the egress policy and bounded by the request's own timeout
///    and budget headers, too little budget fails fast (nothing sent);
/// 2. it is registered (`how.spec`, or the request's effect class), its budget headers
///    written, its intent written to `how.journal` (if the journal records its effect
///    class; a store fault refuses the call) and dispatched right before `send`, so that
///    nothing is sent after a cancel;
/// 3. a timeout the request has is shortened to the call's budget (none is set otherwise:
///    reqwest applies a request's own timeout in place of the client's, which would be lost);
/// 4. waiting for the head stops at the call's deadline or its scope's cancel.
pub(super) async fn call<F, Fut, E>(
    parent: &Scope,
    how: How,
    mut req: Request,
    send: F,
) -> Result<ScopedResponse, CallError>
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Result<Response, E>>,
    E: Into<BoxError>,
{
    let spec = how.spec.unwrap_or_else(|| {
        let name = how.name.unwrap_or_else(|| Arc::from("call"));
        let class = Class::of_method(req.method());
        let target = target(req.url());
        effect::spec(name, class, req.method(), &target, req.headers())
    });
    let url = req.url().clone();
    // The caller's own timeout on the request bounds the call's scope too: the callee is
    // told no more, and the call stops at it as at any deadline.
    let within = req.timeout().map(|t| deadline_after(Instant::now(), *t));
    let (prepared, intent) = match &how.journal {
        Some(journal) => {
            let headers = req.headers_mut();
            let dependency = how.dependency;
            call::prepare_journaled(
                dependency, parent, within, how.egress, spec, headers, journal,
            )
            .await?
        }
        None => (
            call::prepare(
                how.dependency,
                parent,
                within,
                how.egress,
                spec,
                req.headers_mut(),
            )?,
            None,
        ),
    };
    // Dispatched: from here on the request may be sent (and nothing below can fail). The
    // scope's cancel below stops the call at its deadline.
    if let (Some(left), Some(timeout)) = (prepared.call.remaining(), req.timeout_mut()) {
        *timeout = (*timeout).min(left);
    }
    let sent = prepared.telemetry.instrument(send(req));
    let mut state = Call::new(
        prepared.call,
        prepared.dispatched,
        prepared.announced,
        intent,
        prepared.telemetry,
    );
    let res = tokio::select! {
        biased;
        () = state.scope.cancelled() => return Err(state.stopped()),
        res = sent => res,
    };
    match res {
        Ok(inner) => Ok(ScopedResponse::new(inner, state, &url)),
        Err(e) => Err(state.failed(e)),
    }
}
