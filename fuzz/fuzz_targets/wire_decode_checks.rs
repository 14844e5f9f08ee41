//! The checks of the `wire_decode` fuzz target, one function per decoder, each given the raw
//! input. Besides "never panics", they check the decoders' contracts: `&str` and byte entry
//! points agree, accepted values stay within their maxima, and accepted values re-encode to
//! themselves.
//!
//! The fuzz target runs all three on every input; the test suite, which runs on stable
//! (`cargo fuzz` needs a nightly toolchain), includes this file and runs each on proptest's
//! inputs (`tests/wire/grpc_timeout.rs`, `tests/wire/service_budget.rs`, `tests/wire/envoy.rs`).

use cancel_scope::wire::envoy;
use cancel_scope::wire::grpc_timeout;
use cancel_scope::wire::service_budget::{ServiceBudget, MAX_REMAINING};

/// `grpc-timeout`.
pub fn grpc_timeout(data: &[u8]) {
    let timeout = grpc_timeout::decode_bytes(data);
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(grpc_timeout::decode(text), timeout);
    }
    if let Ok(d) = timeout {
        assert!(d <= grpc_timeout::MAX_TIMEOUT);
        // Units divide each other, so a decoded value re-encodes exactly.
        assert_eq!(grpc_timeout::decode(&grpc_timeout::encode(d)), Ok(d));
    }
}

/// `service-budget`.
pub fn service_budget(data: &[u8]) {
    if let Ok(budget) = ServiceBudget::parse(data) {
        assert!(budget.remaining() <= MAX_REMAINING);
        assert_eq!(
            ServiceBudget::parse(budget.to_header_value()).ok(),
            Some(budget)
        );
    }
}

/// `x-envoy-expected-rq-timeout-ms`.
pub fn envoy(data: &[u8]) {
    let envoy_timeout = envoy::decode_expected_timeout_bytes(data);
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(envoy::decode_expected_timeout(text), envoy_timeout);
    }
}
