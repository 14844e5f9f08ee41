//! The budget headers of outgoing requests, shared by the client integrations.
//!
//! Egress owns them: whatever budget headers a request already carries (set by the caller,
//! or copied from an incoming request by a handler that forwards its headers), the library
//! reads them only as a bound that may shorten the call, and replaces them all with its own.
//! A copied header's priority, operation id and generation never go on.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::wire::service_budget::ServiceBudget;
use crate::wire::{envoy, grpc_timeout, service_budget, Outgoing};

pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static(grpc_timeout::HEADER);
pub(crate) const SERVICE_BUDGET: HeaderName = HeaderName::from_static(service_budget::HEADER);
pub(crate) const ENVOY: HeaderName = HeaderName::from_static(envoy::EXPECTED_RQ_TIMEOUT_MS);

/// The shortest valid budget among the budget headers already on an outgoing request (the
/// caller's own bound), or `None`, for a call that is `bounded` (its scope, a timeout or the
/// egress policy's cap gives it a deadline) or not.
///
/// Each line counts on its own: the shortest of them can only shorten a bounded call, so a
/// line that repeats or contradicts another is no risk here (unlike at ingress, where a budget
/// header sent on more than one line is refused as ambiguous). A malformed line is ignored:
/// [`insert`] replaces it.
///
/// An unbounded call has no budget to shorten: a header would *give* it one, and the callee,
/// which applies its own default budget to a request without a header, could get more than
/// that default. So there only `grpc-timeout` counts, the header through which gRPC clients
/// set their own per-call timeout (tonic's `Request::set_timeout`); `service-budget` (written
/// by this library's egress only) and Envoy's header (written by Envoy for its hop) on an
/// outgoing request were copied from elsewhere, and are dropped.
pub(crate) fn preset(headers: &HeaderMap, bounded: bool) -> Option<Duration> {
    let grpc = grpc_preset(headers);
    if !bounded {
        return grpc;
    }
    let budget = headers
        .get_all(SERVICE_BUDGET)
        .iter()
        .filter_map(|v| ServiceBudget::parse(v.as_bytes()).ok())
        .map(|b| b.remaining());
    let envoy = headers
        .get_all(ENVOY)
        .iter()
        .filter_map(|v| envoy::decode_expected_timeout_bytes(v.as_bytes()).ok());
    grpc.into_iter().chain(budget).chain(envoy).min()
}

fn grpc_preset(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all(GRPC_TIMEOUT)
        .iter()
        .filter_map(|v| grpc_timeout::decode_bytes(v.as_bytes()).ok())
        .min()
}

/// Removes every budget header of the request and writes `out`'s (none if `out` has no
/// budget: the call's scope has no deadline).
///
/// Envoy's `x-envoy-expected-rq-timeout-ms` goes too: Envoy sets it for the hop it routes, a
/// service does not forward it.
pub(crate) fn insert(headers: &mut HeaderMap, out: &Outgoing) {
    remove_all(headers);
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

/// The budget headers of a call made outside any scope, where that is allowed: `grpc-timeout`
/// is the shorter of the caller's own (if valid) and `cap`; `service-budget` and Envoy's
/// header are removed (there is no operation whose budget, priority or generation they could
/// carry).
#[cfg(feature = "tower")]
pub(crate) fn unscoped(headers: &mut HeaderMap, cap: Duration) {
    let timeout = grpc_preset(headers).map_or(cap, |t| t.min(cap));
    remove_all(headers);
    if let Ok(v) = HeaderValue::try_from(grpc_timeout::encode(timeout)) {
        headers.insert(GRPC_TIMEOUT, v);
    }
}

fn remove_all(headers: &mut HeaderMap) {
    headers.remove(GRPC_TIMEOUT);
    headers.remove(SERVICE_BUDGET);
    headers.remove(ENVOY);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(lines: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in lines {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_bounded_call_takes_the_shortest_valid_line_of_any_budget_header() {
        let ms = Duration::from_millis;
        let h = headers(&[
            (&GRPC_TIMEOUT, "5S"),
            (&GRPC_TIMEOUT, "soon"),
            (&SERVICE_BUDGET, "v=1, rem=300"),
            (&ENVOY, "200"),
            (&ENVOY, "-1"),
        ]);
        assert_eq!(preset(&h, true), Some(ms(200)));
        // Unbounded: only the caller's own per-call timeout.
        assert_eq!(preset(&h, false), Some(ms(5_000)));
        let copied = headers(&[(
            &SERVICE_BUDGET,
            "v=1, rem=86400000, prio=0, op=\"victim-op\"",
        )]);
        assert_eq!(preset(&copied, false), None);
        assert_eq!(preset(&copied, true), Some(ms(86_400_000)));
    }

    #[cfg(feature = "tower")]
    #[test]
    fn an_unscoped_call_keeps_only_a_capped_grpc_timeout() {
        let cap = Duration::from_secs(2);
        let mut h = headers(&[
            (&GRPC_TIMEOUT, "99999999H"),
            (&SERVICE_BUDGET, "v=1, rem=86400000, prio=0"),
            (&ENVOY, "9999999"),
        ]);
        unscoped(&mut h, cap);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[GRPC_TIMEOUT], "2000000u");
        let mut h = headers(&[(&GRPC_TIMEOUT, "150m")]);
        unscoped(&mut h, cap);
        assert_eq!(h[GRPC_TIMEOUT], "150000u");
        let mut h = HeaderMap::new();
        unscoped(&mut h, cap);
        assert_eq!(h[GRPC_TIMEOUT], "2000000u");
    }
}
