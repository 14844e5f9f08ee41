//! Feeds arbitrary bytes to every wire decoder.
//!
//! Run with `cargo +nightly fuzz run wire_decode` from the repository root. Besides "never
//! panics", it checks the decoders' contracts (see `wire_decode_checks.rs`, which the test
//! suite also runs, on proptest's inputs): `&str` and byte entry points agree, accepted
//! values stay within their maxima, and accepted values re-encode to themselves.

#![no_main]

use libfuzzer_sys::fuzz_target;

mod wire_decode_checks;

fuzz_target!(|data: &[u8]| {
    wire_decode_checks::grpc_timeout(data);
    wire_decode_checks::service_budget(data);
    wire_decode_checks::envoy(data);
});
