//! The wire: ingress admission and egress policies, and the three budget headers
//! (`grpc-timeout`, `service-budget`, Envoy's `x-envoy-expected-rq-timeout-ms`), each parsed,
//! encoded and fuzzed on proptest's inputs.

#[path = "../support"]
#[allow(dead_code)] // each binary uses a part of the fixtures
mod support {
    pub mod time;
}

/// The checks of the `wire_decode` fuzz target (`fuzz/`), which needs a nightly toolchain:
/// the suite runs them on proptest's inputs instead.
#[allow(dead_code)]
#[path = "../../fuzz/fuzz_targets/wire_decode_checks.rs"]
mod wire_decode_checks;

mod admission;
mod envoy;
mod grpc_timeout;
mod rejection_cap;
mod service_budget;
mod service_effect;
mod shadow;
mod stage;
#[cfg(feature = "rollout")]
mod versions;
