//! The budget headers of outgoing requests, shared by the client integrations.

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::wire::{grpc_timeout, service_budget, Outgoing};

pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static(grpc_timeout::HEADER);
pub(crate) const SERVICE_BUDGET: HeaderName = HeaderName::from_static(service_budget::HEADER);

/// Replaces the request's budget headers with `out`'s; leaves them alone if `out` has no
/// budget (the call's scope has no deadline).
pub(crate) fn insert(headers: &mut HeaderMap, out: &Outgoing) {
    if out.remaining().is_none() {
        return;
    }
    headers.remove(GRPC_TIMEOUT);
    headers.remove(SERVICE_BUDGET);
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
