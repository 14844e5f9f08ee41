//! The budget headers of outgoing requests, shared by the client integrations.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::wire::service_budget::ServiceBudget;
use crate::wire::{envoy, grpc_timeout, service_budget, Outgoing};

pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static(grpc_timeout::HEADER);
pub(crate) const SERVICE_BUDGET: HeaderName = HeaderName::from_static(service_budget::HEADER);
const ENVOY: HeaderName = HeaderName::from_static(envoy::EXPECTED_RQ_TIMEOUT_MS);

/// The shortest valid budget among the budget headers already on an outgoing request (the
/// caller's own bound: tonic's `Request::set_timeout` writes `grpc-timeout`), or `None`.
///
/// Each line counts on its own: the shortest of them can only shorten the call, so a line
/// that repeats or contradicts another is no risk here (unlike at ingress, where a budget
/// header sent on more than one line is refused as ambiguous). A malformed line is ignored:
/// [`insert`] replaces it with the call's budget (if the call has one).
pub(crate) fn preset(headers: &HeaderMap) -> Option<Duration> {
    let grpc = headers
        .get_all(GRPC_TIMEOUT)
        .iter()
        .filter_map(|v| grpc_timeout::decode_bytes(v.as_bytes()).ok());
    let budget = headers
        .get_all(SERVICE_BUDGET)
        .iter()
        .filter_map(|v| ServiceBudget::parse(v.as_bytes()).ok())
        .map(|b| b.remaining());
    grpc.chain(budget).min()
}

/// Replaces the request's budget headers with `out`'s; leaves them alone if `out` has no
/// budget (the call's scope has no deadline).
///
/// Envoy's `x-envoy-expected-rq-timeout-ms` goes too: Envoy sets it for the hop it routes, a
/// service does not forward it (a handler that copies its incoming headers onto a call would
/// otherwise pass a caller's value, forged or stale, on to the next service).
pub(crate) fn insert(headers: &mut HeaderMap, out: &Outgoing) {
    if out.remaining().is_none() {
        return;
    }
    headers.remove(GRPC_TIMEOUT);
    headers.remove(SERVICE_BUDGET);
    headers.remove(ENVOY);
    if let Some(v) = out.grpc_timeout() {
        // Digits and a unit letter: always a valid header value.
        if let Ok(v) = HeaderValue::try_from(v) {
            headers.insert(GRPC_TIMEOUT, v);
        }
    }
    if let Some(b) = out.service_budget() {
        // RFC 8941 output is printable ASCII: always a valid header value.
        if let Ok(v) = HeaderValue::try_from(b.to_header_value()) {
            headers.insert(SERVICE_BUDGET, v);
        }
    }
}
