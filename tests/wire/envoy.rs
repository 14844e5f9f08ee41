//! `x-envoy-expected-rq-timeout-ms` decoder: table cases and properties.

use std::time::Duration;

use cancel_scope::wire::envoy::{
    decode_expected_timeout, decode_expected_timeout_bytes, EnvoyTimeoutError,
    EXPECTED_RQ_TIMEOUT_MS,
};
use proptest::prelude::*;

use crate::wire_decode_checks;

#[test]
fn header_name() {
    assert_eq!(EXPECTED_RQ_TIMEOUT_MS, "x-envoy-expected-rq-timeout-ms");
}

#[test]
fn valid_table() {
    let cases: &[(&str, Duration)] = &[
        ("0", Duration::ZERO),
        ("1", Duration::from_millis(1)),
        ("15000", Duration::from_secs(15)),
        ("0000000001", Duration::from_millis(1)),
        ("9999999999", Duration::from_millis(9_999_999_999)),
    ];
    for &(input, expected) in cases {
        assert_eq!(decode_expected_timeout(input), Ok(expected), "{input:?}");
        assert_eq!(
            decode_expected_timeout_bytes(input.as_bytes()),
            Ok(expected),
            "{input:?}"
        );
    }
}

#[test]
fn invalid_table() {
    use EnvoyTimeoutError::*;
    let cases: &[(&str, EnvoyTimeoutError)] = &[
        ("", Empty),
        ("12345678901", TooManyDigits),
        ("00000000001", TooManyDigits),
        ("99999999999999999999999", TooManyDigits),
        ("-1", InvalidCharacter),
        ("+1", InvalidCharacter),
        (" 1", InvalidCharacter),
        ("1 ", InvalidCharacter),
        ("1.5", InvalidCharacter),
        ("1e3", InvalidCharacter),
        ("100ms", InvalidCharacter),
        ("0x10", InvalidCharacter),
        ("١", InvalidCharacter),
        ("1,000", InvalidCharacter),
    ];
    for &(input, expected) in cases {
        assert_eq!(decode_expected_timeout(input), Err(expected), "{input:?}");
    }
    assert_eq!(
        decode_expected_timeout_bytes(b"1\xff"),
        Err(InvalidCharacter)
    );
}

#[test]
fn error_is_send_sync_static_and_displays() {
    fn assert_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    let err = decode_expected_timeout("x").unwrap_err();
    assert_error(&err);
    for err in [
        EnvoyTimeoutError::Empty,
        EnvoyTimeoutError::TooManyDigits,
        EnvoyTimeoutError::InvalidCharacter,
    ] {
        assert!(err.to_string().contains(EXPECTED_RQ_TIMEOUT_MS), "{err:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn every_value_up_to_ten_digits_round_trips(ms in 0_u64..=9_999_999_999) {
        prop_assert_eq!(decode_expected_timeout(&ms.to_string()), Ok(Duration::from_millis(ms)));
    }

    #[test]
    fn never_panics_on_strings(s in any::<String>()) {
        let _ = decode_expected_timeout(&s);
    }

    #[test]
    fn never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
        let _ = decode_expected_timeout_bytes(&bytes);
    }

    #[test]
    fn accepts_exactly_one_to_ten_ascii_digits(s in "[0-9 +\\-.a١]{0,12}") {
        let valid = (1..=10).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
        prop_assert_eq!(decode_expected_timeout(&s).is_ok(), valid, "{:?}", s);
    }
}

/// Bytes as the fuzzer would try them: anything, near misses, and valid values.
fn fuzz_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..32),
        "[0-9 +\\-.a١]{0,12}".prop_map(String::into_bytes),
        "[0-9]{1,12}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// The fuzz target's contract for this decoder, on the same entry points (raw bytes).
    #[test]
    fn the_fuzz_targets_checks_hold(data in fuzz_input()) {
        wire_decode_checks::envoy(&data);
    }
}
