//! Feeds arbitrary bytes to every wire decoder.
//!
//! Run with `cargo +nightly fuzz run wire_decode` from the repository root. Besides "never
//! panics", it checks the decoders' contracts: `&str` and byte entry points agree, accepted
//! values stay within their maxima, and accepted values re-encode to themselves.

#![no_main]

use cancel_scope::wire::envoy;
use cancel_scope::wire::grpc_timeout;
use cancel_scope::wire::service_budget::{ServiceBudget, MAX_REMAINING};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // grpc-timeout.
    let timeout = grpc_timeout::decode_bytes(data);
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(grpc_timeout::decode(text), timeout);
    }
    if let Ok(d) = timeout {
        assert!(d <= grpc_timeout::MAX_TIMEOUT);
        // Units divide each other, so a decoded value re-encodes exactly.
        assert_eq!(grpc_timeout::decode(&grpc_timeout::encode(d)), Ok(d));
    }

    // service-budget.
    if let Ok(budget) = ServiceBudget::parse(data) {
        assert!(budget.remaining() <= MAX_REMAINING);
        assert_eq!(
            ServiceBudget::parse(budget.to_header_value()).ok(),
            Some(budget)
        );
    }

    // x-envoy-expected-rq-timeout-ms.
    let envoy_timeout = envoy::decode_expected_timeout_bytes(data);
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(envoy::decode_expected_timeout(text), envoy_timeout);
    }
});
