//! `grpc-timeout` codec: table cases and properties.
//!
//! What a user cares about: a budget put on the wire is never longer when read back, it is at
//! most one unit shorter, the output is always valid for any gRPC peer, and garbage from the
//! network is a typed error, never a panic.

use std::time::Duration;

use cancel_scope::wire::grpc_timeout::{
    decode, decode_bytes, encode, encode_into, GrpcTimeoutError, HEADER, MAX_TIMEOUT,
};
use proptest::prelude::*;

const NS: u64 = 1;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

use crate::wire_decode_checks;

#[test]
fn header_name() {
    assert_eq!(HEADER, "grpc-timeout");
}

#[test]
fn decode_valid_table() {
    let cases: &[(&str, Duration)] = &[
        ("1S", Duration::from_secs(1)),
        ("100m", Duration::from_millis(100)),
        ("0n", Duration::ZERO),
        ("0H", Duration::ZERO),
        ("1n", Duration::from_nanos(1)),
        ("1u", Duration::from_micros(1)),
        ("1m", Duration::from_millis(1)),
        ("1M", Duration::from_secs(60)),
        ("1H", Duration::from_secs(3600)),
        ("00000001S", Duration::from_secs(1)),
        ("99999999n", Duration::from_nanos(99_999_999)),
        ("99999999u", Duration::from_micros(99_999_999)),
        ("99999999m", Duration::from_millis(99_999_999)),
        ("99999999S", Duration::from_secs(99_999_999)),
        ("99999999M", Duration::from_secs(99_999_999 * 60)),
        ("99999999H", Duration::from_secs(99_999_999 * 3600)),
    ];
    for &(input, expected) in cases {
        assert_eq!(decode(input), Ok(expected), "decode({input:?})");
        assert_eq!(
            decode_bytes(input.as_bytes()),
            Ok(expected),
            "decode_bytes({input:?})"
        );
    }
}

#[test]
fn decode_invalid_table() {
    use GrpcTimeoutError::*;
    let cases: &[(&str, GrpcTimeoutError)] = &[
        ("", Empty),
        ("S", MissingValue),
        ("n", MissingValue),
        ("x", MissingValue),
        ("1", MissingUnit),
        ("12345678", MissingUnit),
        ("123456789", TooManyDigits),
        ("123456789n", TooManyDigits),
        ("000000001S", TooManyDigits),
        ("1x", UnknownUnit),
        ("1s", UnknownUnit),
        ("1h", UnknownUnit),
        ("1N", UnknownUnit),
        ("1 ", UnknownUnit),
        ("-1S", InvalidCharacter),
        ("+1S", InvalidCharacter),
        ("1 S", InvalidCharacter),
        (" 1S", InvalidCharacter),
        ("1S ", InvalidCharacter),
        ("1.5S", InvalidCharacter),
        ("1SS", InvalidCharacter),
        ("1S1", InvalidCharacter),
        ("0x1S", InvalidCharacter),
        ("١S", InvalidCharacter),  // ARABIC-INDIC DIGIT ONE
        ("１S", InvalidCharacter), // FULLWIDTH DIGIT ONE
        ("1é", InvalidCharacter),
        ("1\u{2009}S", InvalidCharacter),
    ];
    for &(input, expected) in cases {
        assert_eq!(decode(input), Err(expected), "decode({input:?})");
    }
}

#[test]
fn decode_bytes_rejects_non_utf8() {
    assert_eq!(
        decode_bytes(b"1\xffS"),
        Err(GrpcTimeoutError::InvalidCharacter)
    );
    assert_eq!(decode_bytes(b"1\xff"), Err(GrpcTimeoutError::UnknownUnit));
    assert_eq!(decode_bytes(b"\x00"), Err(GrpcTimeoutError::MissingValue));
    assert_eq!(
        decode_bytes(b"1\x00S"),
        Err(GrpcTimeoutError::InvalidCharacter)
    );
}

#[test]
fn encode_table() {
    let cases: &[(Duration, &str)] = &[
        (Duration::ZERO, "0n"),
        (Duration::from_nanos(1), "1n"),
        (Duration::from_nanos(99_999_999), "99999999n"),
        // 100 ms does not fit in 8 digits of nanoseconds.
        (Duration::from_nanos(100_000_000), "100000u"),
        (Duration::from_nanos(100_000_999), "100000u"),
        (Duration::from_millis(100), "100000u"),
        (Duration::from_secs(1), "1000000u"),
        (Duration::from_micros(99_999_999), "99999999u"),
        (Duration::from_micros(100_000_000), "100000m"),
        (Duration::from_millis(99_999_999), "99999999m"),
        (Duration::from_millis(100_000_000), "100000S"),
        // Truncation, never rounding up: 100 000.999 s is still 100 000 s.
        (Duration::from_millis(100_000_999), "100000S"),
        (Duration::from_nanos(100_000_000_999_999_999), "1666666M"),
        (Duration::from_secs(99_999_999), "99999999S"),
        (Duration::from_secs(100_000_000), "1666666M"),
        (Duration::from_secs(99_999_999 * 60), "99999999M"),
        (Duration::from_secs(99_999_999 * 60 + 59), "99999999M"),
        (Duration::from_secs(100_000_000 * 60), "1666666H"),
        (MAX_TIMEOUT, "99999999H"),
        (MAX_TIMEOUT + Duration::from_nanos(1), "99999999H"),
        (Duration::from_secs(u64::MAX), "99999999H"),
        (Duration::MAX, "99999999H"),
    ];
    for &(input, expected) in cases {
        assert_eq!(encode(input), expected, "encode({input:?})");
        let mut buf = String::new();
        encode_into(input, &mut buf).unwrap();
        assert_eq!(buf, expected, "encode_into({input:?})");
    }
}

#[test]
fn encode_into_appends() {
    let mut header = String::from("timeout=");
    encode_into(Duration::from_millis(5), &mut header).unwrap();
    assert_eq!(header, "timeout=5000000n");
}

#[test]
fn error_is_send_sync_static_and_displays() {
    fn assert_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    let err = decode("-1S").unwrap_err();
    assert_error(&err);
    assert!(!err.to_string().is_empty());
    for err in [
        GrpcTimeoutError::Empty,
        GrpcTimeoutError::MissingValue,
        GrpcTimeoutError::TooManyDigits,
        GrpcTimeoutError::InvalidCharacter,
        GrpcTimeoutError::MissingUnit,
        GrpcTimeoutError::UnknownUnit,
    ] {
        assert!(err.to_string().contains("grpc-timeout"), "{err:?}");
    }
}

/// The length of one unit, for the unit character `encode` chose.
fn unit_nanos(unit: char) -> u64 {
    match unit {
        'n' => NS,
        'u' => US,
        'm' => MS,
        'S' => S,
        'M' => 60 * S,
        'H' => 3600 * S,
        other => panic!("unexpected unit {other:?}"),
    }
}

/// Durations spread over every unit's range, plus the saturation zone.
fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0_u64..=200_000_000).prop_map(Duration::from_nanos),
        (0_u64..=200_000_000_000).prop_map(Duration::from_nanos),
        (0_u64..=u64::MAX).prop_map(Duration::from_nanos),
        (0_u64..=200_000_000 * 3600, 0_u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        any::<(u64, u32)>().prop_map(|(s, n)| Duration::new(s, n % 1_000_000_000)),
        Just(MAX_TIMEOUT),
        Just(Duration::MAX),
    ]
}

fn is_grammar(s: &str) -> bool {
    let bytes = s.as_bytes();
    let Some((unit, digits)) = bytes.split_last() else {
        return false;
    };
    (1..=8).contains(&digits.len())
        && digits.iter().all(u8::is_ascii_digit)
        && b"HMSmun".contains(unit)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn encode_never_extends_and_loses_less_than_one_unit(d in any_duration()) {
        let encoded = encode(d);
        let decoded = decode(&encoded).expect("encode output must decode");
        prop_assert!(decoded <= d, "{d:?} -> {encoded} -> {decoded:?}");
        if d <= MAX_TIMEOUT {
            let unit = unit_nanos(encoded.chars().last().unwrap());
            prop_assert!(
                d - decoded < Duration::from_nanos(unit),
                "{d:?} -> {encoded} -> {decoded:?} lost a whole unit"
            );
        } else {
            prop_assert_eq!(decoded, MAX_TIMEOUT);
        }
    }

    #[test]
    fn encode_output_matches_grammar(d in any_duration()) {
        let encoded = encode(d);
        prop_assert!(is_grammar(&encoded), "{encoded:?}");
    }

    #[test]
    fn encode_uses_the_finest_unit_that_fits(d in any_duration()) {
        let encoded = encode(d);
        let unit = encoded.chars().last().unwrap();
        // The next finer unit would have needed more than 8 digits.
        let finer = match unit {
            'n' => None,
            'u' => Some(NS),
            'm' => Some(US),
            'S' => Some(MS),
            'M' => Some(S),
            'H' => Some(60 * S),
            _ => unreachable!(),
        };
        if let Some(finer) = finer {
            prop_assert!(d.as_nanos() / u128::from(finer) > 99_999_999, "{d:?} -> {encoded}");
        }
    }

    #[test]
    fn decode_never_panics_on_strings(s in any::<String>()) {
        let _ = decode(&s);
    }

    #[test]
    fn decode_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
        let _ = decode_bytes(&bytes);
    }

    #[test]
    fn decode_never_panics_on_near_misses(s in "[0-9HMSmun +\\-.x١]{0,12}") {
        let result = decode(&s);
        prop_assert_eq!(result.is_ok(), is_grammar(&s), "{:?} -> {:?}", s, result);
    }

    #[test]
    fn valid_strings_round_trip(s in "[0-9]{1,8}[HMSmun]") {
        let decoded = decode(&s).expect("valid by grammar");
        // Re-encoding may pick a finer unit, but it names the same duration.
        let reencoded = encode(decoded);
        prop_assert_eq!(decode(&reencoded), Ok(decoded), "{} -> {:?} -> {}", s, decoded, reencoded);
    }

    #[test]
    fn decode_bytes_agrees_with_decode(s in any::<String>()) {
        prop_assert_eq!(decode(&s), decode_bytes(s.as_bytes()));
    }
}

/// Bytes as the fuzzer would try them: anything, near misses of the grammar, and valid values.
fn fuzz_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..32),
        "[0-9HMSmun +\\-.x١]{0,12}".prop_map(String::into_bytes),
        "[0-9]{1,8}[HMSmun]".prop_map(String::into_bytes),
        "[0-9]{9,10}[HMSmun]".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// The fuzz target's contract for this decoder, on the same entry points (raw bytes).
    #[test]
    fn the_fuzz_targets_checks_hold(data in fuzz_input()) {
        wire_decode_checks::grpc_timeout(&data);
    }
}
