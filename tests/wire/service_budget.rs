//! `service-budget` header (version 1): table cases and properties.
//!
//! What a user cares about: a budget sent is the budget received (to the millisecond, never
//! more); a hostile or broken header is a typed error — never a panic, never a longer budget;
//! duplicates cannot smuggle a second value; unknown members from newer senders are ignored.

use std::time::Duration;

use cancel_scope::wire::service_budget::{
    ServiceBudget, ServiceBudgetError, ServiceBudgetErrorKind, HEADER, MAX_HEADER_LEN, MAX_INTEGER,
    MAX_OPERATION_ID_LEN, MAX_PRIORITY, MAX_REMAINING, VERSION,
};
use proptest::prelude::*;

fn kind(input: &str) -> ServiceBudgetErrorKind {
    match ServiceBudget::parse(input) {
        Ok(budget) => panic!("{input:?} parsed as {budget:?}"),
        Err(err) => err.kind(),
    }
}

fn err(input: &str) -> ServiceBudgetError {
    match ServiceBudget::parse(input) {
        Ok(budget) => panic!("{input:?} parsed as {budget:?}"),
        Err(err) => err,
    }
}

#[test]
fn constants() {
    assert_eq!(HEADER, "service-budget");
    assert_eq!(VERSION, 1);
    assert_eq!(MAX_HEADER_LEN, 1024);
    assert_eq!(MAX_REMAINING, Duration::from_secs(86_400));
    assert_eq!(MAX_OPERATION_ID_LEN, 128);
    assert_eq!(MAX_PRIORITY, 7);
    assert_eq!(MAX_INTEGER, 999_999_999_999_999);
}

#[test]
fn types_are_send_sync_static() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<ServiceBudget>();
    assert_send_sync::<ServiceBudgetError>();
    assert_send_sync::<ServiceBudgetErrorKind>();
}

#[test]
fn minimal_header() {
    let budget = ServiceBudget::parse("v=1, rem=250").unwrap();
    assert_eq!(budget.version(), 1);
    assert_eq!(budget.remaining(), Duration::from_millis(250));
    assert_eq!(budget.generation(), 0);
    assert_eq!(budget.operation_id(), None);
    assert_eq!(budget.priority(), None);
    assert_eq!(budget.audit_deadline_unix_ms(), None);
}

#[test]
fn full_header() {
    let budget = ServiceBudget::parse(
        r#"v=1, rem=86400000, gen=999999999999999, op="checkout 7f3a", prio=7, dl=1767225600000"#,
    )
    .unwrap();
    assert_eq!(budget.remaining(), MAX_REMAINING);
    assert_eq!(budget.generation(), MAX_INTEGER);
    assert_eq!(budget.operation_id(), Some("checkout 7f3a"));
    assert_eq!(budget.priority(), Some(7));
    assert_eq!(budget.audit_deadline_unix_ms(), Some(1_767_225_600_000));
}

#[test]
fn accepted_variations() {
    let cases: &[(&str, u64)] = &[
        // Order does not matter.
        ("rem=5, v=1", 5),
        // RFC 8941 whitespace rules: leading/trailing SP, OWS around commas.
        ("  v=1,rem=5  ", 5),
        ("v=1 ,\trem=5", 5),
        ("v=1, rem=0", 0),
        // Unknown keys (valid syntax) are ignored, even repeated ones.
        ("v=1, rem=5, x=1, x=2, future=(a b c), flag", 5),
        ("v=1, rem=5, *ext=\"hi\"", 5),
        // Parameters on members are ignored.
        ("v=1;a=1, rem=5;unit=ms", 5),
        // A Token operation id.
        ("v=1, rem=5, op=tok/en:1", 5),
    ];
    for &(input, rem_ms) in cases {
        let budget = ServiceBudget::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(
            budget.remaining(),
            Duration::from_millis(rem_ms),
            "{input:?}"
        );
    }
    assert_eq!(
        ServiceBudget::parse("v=1, rem=5, op=tok/en:1")
            .unwrap()
            .operation_id(),
        Some("tok/en:1")
    );
    assert_eq!(
        ServiceBudget::parse(r#"v=1, rem=5, op="q\"uo\\te""#)
            .unwrap()
            .operation_id(),
        Some(r#"q"uo\te"#)
    );
}

#[test]
fn rejected_table() {
    use ServiceBudgetErrorKind::*;
    let cases: &[(&str, ServiceBudgetErrorKind, Option<&str>)] = &[
        // Not a dictionary at all.
        ("v=1, rem=", Syntax, None),
        ("v=1,, rem=5", Syntax, None),
        ("v=1, rem=5,", Syntax, None),
        ("V=1, rem=5", Syntax, None),
        ("v=1; rem=5", MissingMember, Some("rem")),
        ("v=1 rem=5", Syntax, None),
        ("v=1, rem=5, op=\"é\"", Syntax, None),
        ("v=1, rem=1000000000000000", Syntax, None),
        ("v=1, rem=5, dl=@1767225600", Syntax, None), // RFC 9651 Date, not RFC 8941
        ("v=1, rem=5, op=%\"x\"", Syntax, None),      // RFC 9651 Display String
        ("\u{0}", Syntax, None),
        // Missing required members.
        ("", MissingMember, Some("v")),
        ("rem=5", MissingMember, Some("v")),
        ("v=1", MissingMember, Some("rem")),
        // Versions.
        ("v=2, rem=5", UnsupportedVersion(2), Some("v")),
        ("v=0, rem=5", UnsupportedVersion(0), Some("v")),
        ("v=-1, rem=5", UnsupportedVersion(-1), Some("v")),
        ("v=2, rem=-5", UnsupportedVersion(2), Some("v")),
        ("v=2", UnsupportedVersion(2), Some("v")),
        ("v=1.0, rem=5", NonInteger, Some("v")),
        ("v=\"1\", rem=5", WrongType, Some("v")),
        ("v, rem=5", WrongType, Some("v")),
        // Duplicates, whatever the values.
        ("v=1, rem=10, rem=99999", DuplicateMember, Some("rem")),
        ("v=1, rem=10, rem=10", DuplicateMember, Some("rem")),
        ("v=1, v=1, rem=10", DuplicateMember, Some("v")),
        ("v=1, rem=1, gen=1, gen=2", DuplicateMember, Some("gen")),
        ("v=1, rem=1, op=a, op=b", DuplicateMember, Some("op")),
        ("v=1, rem=1, prio=1, prio=1", DuplicateMember, Some("prio")),
        ("v=1, rem=1, dl=1, dl=2", DuplicateMember, Some("dl")),
        ("v=1, rem=(1), rem=2", DuplicateMember, Some("rem")),
        // rem.
        ("v=1, rem=-1", Negative, Some("rem")),
        ("v=1, rem=-0.5", NonInteger, Some("rem")),
        ("v=1, rem=1.5", NonInteger, Some("rem")),
        ("v=1, rem=86400001", OverMaximum, Some("rem")),
        ("v=1, rem=999999999999999", OverMaximum, Some("rem")),
        ("v=1, rem=\"5\"", WrongType, Some("rem")),
        ("v=1, rem=five", WrongType, Some("rem")),
        ("v=1, rem=?1", WrongType, Some("rem")),
        ("v=1, rem=:AAAA:", WrongType, Some("rem")),
        ("v=1, rem=(5)", WrongType, Some("rem")),
        ("v=1, rem", WrongType, Some("rem")),
        // gen.
        ("v=1, rem=1, gen=-1", Negative, Some("gen")),
        ("v=1, rem=1, gen=1.0", NonInteger, Some("gen")),
        ("v=1, rem=1, gen=one", WrongType, Some("gen")),
        // op.
        ("v=1, rem=1, op=\"\"", InvalidOperationId, Some("op")),
        ("v=1, rem=1, op=5", WrongType, Some("op")),
        ("v=1, rem=1, op=(a b)", WrongType, Some("op")),
        // prio.
        ("v=1, rem=1, prio=8", OverMaximum, Some("prio")),
        ("v=1, rem=1, prio=-1", Negative, Some("prio")),
        ("v=1, rem=1, prio=high", WrongType, Some("prio")),
        ("v=1, rem=1, prio=1.5", NonInteger, Some("prio")),
        // dl.
        ("v=1, rem=1, dl=-1", Negative, Some("dl")),
        ("v=1, rem=1, dl=1.5", NonInteger, Some("dl")),
        ("v=1, rem=1, dl=\"2026-01-01\"", WrongType, Some("dl")),
    ];
    for &(input, expected_kind, expected_member) in cases {
        let err = err(input);
        assert_eq!(err.kind(), expected_kind, "{input:?}: {err}");
        assert_eq!(err.member(), expected_member, "{input:?}: {err}");
    }
}

#[test]
fn operation_id_length_limit() {
    let ok = format!("v=1, rem=1, op=\"{}\"", "a".repeat(MAX_OPERATION_ID_LEN));
    assert_eq!(
        ServiceBudget::parse(&ok)
            .unwrap()
            .operation_id()
            .unwrap()
            .len(),
        MAX_OPERATION_ID_LEN
    );
    let long = format!(
        "v=1, rem=1, op=\"{}\"",
        "a".repeat(MAX_OPERATION_ID_LEN + 1)
    );
    assert_eq!(kind(&long), ServiceBudgetErrorKind::OverMaximum);
    let long_token = format!("v=1, rem=1, op=a{}", "b".repeat(MAX_OPERATION_ID_LEN));
    assert_eq!(kind(&long_token), ServiceBudgetErrorKind::OverMaximum);
}

#[test]
fn length_is_capped_before_parsing() {
    let header = "v=1, rem=5";
    let padded = format!("{header}{}", " ".repeat(MAX_HEADER_LEN - header.len()));
    assert_eq!(padded.len(), MAX_HEADER_LEN);
    assert!(ServiceBudget::parse(&padded).is_ok());
    let too_long = format!("{padded} ");
    assert_eq!(kind(&too_long), ServiceBudgetErrorKind::TooLong);
    // Even garbage is rejected for its length, without being looked at.
    assert_eq!(
        kind(&"\u{0}".repeat(MAX_HEADER_LEN + 1)),
        ServiceBudgetErrorKind::TooLong
    );
}

#[test]
fn parse_accepts_bytes() {
    let budget = ServiceBudget::parse(b"v=1, rem=7").unwrap();
    assert_eq!(budget.remaining(), Duration::from_millis(7));
    let bytes: Vec<u8> = b"v=1, rem=7".to_vec();
    assert_eq!(ServiceBudget::parse(&bytes).unwrap(), budget);
    assert_eq!(
        ServiceBudget::parse(b"v=1, rem=7, op=\"\xff\"")
            .unwrap_err()
            .kind(),
        ServiceBudgetErrorKind::Syntax
    );
}

#[test]
fn syntax_error_has_a_source() {
    use std::error::Error as _;
    let syntax = err("v=1, rem=");
    assert_eq!(syntax.kind(), ServiceBudgetErrorKind::Syntax);
    assert!(syntax.source().is_some());
    assert!(err("v=1").source().is_none());
}

#[test]
fn error_is_send_sync_static_and_displays() {
    fn assert_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    for input in [
        "x".repeat(2000).as_str(),
        "v=1, rem=",
        "v=1, rem=1, rem=2",
        "v=3, rem=1",
        "v=1",
        "v=1, rem=a",
        "v=1, rem=1.5",
        "v=1, rem=-1",
        "v=1, rem=99999999999",
        "v=1, rem=1, op=\"\"",
    ] {
        let err = err(input);
        assert_error(&err);
        let text = err.to_string();
        assert!(text.contains("service-budget"), "{text}");
    }
    assert!(err("v=3, rem=1").to_string().contains('3'));
    assert!(err("v=1, rem=-1").to_string().contains("rem"));
}

#[test]
fn builder_normalizes_remaining_down() {
    assert_eq!(
        ServiceBudget::new(Duration::from_nanos(999_999)).remaining(),
        Duration::ZERO
    );
    assert_eq!(
        ServiceBudget::new(Duration::from_micros(1_999)).remaining(),
        Duration::from_millis(1)
    );
    assert_eq!(
        ServiceBudget::new(MAX_REMAINING + Duration::from_nanos(1)).remaining(),
        MAX_REMAINING
    );
    assert_eq!(ServiceBudget::new(Duration::MAX).remaining(), MAX_REMAINING);
}

#[test]
fn builder_validates() {
    use ServiceBudgetErrorKind::*;
    let base = ServiceBudget::new(Duration::from_millis(1));
    let cases: Vec<(
        Result<ServiceBudget, ServiceBudgetError>,
        ServiceBudgetErrorKind,
        &str,
    )> = vec![
        (base.clone().with_operation_id(""), InvalidOperationId, "op"),
        (
            base.clone().with_operation_id("é"),
            InvalidOperationId,
            "op",
        ),
        (
            base.clone().with_operation_id("a\nb"),
            InvalidOperationId,
            "op",
        ),
        (
            base.clone()
                .with_operation_id(&"a".repeat(MAX_OPERATION_ID_LEN + 1)),
            OverMaximum,
            "op",
        ),
        (
            base.clone().with_generation(MAX_INTEGER + 1),
            OverMaximum,
            "gen",
        ),
        (base.clone().with_generation(u64::MAX), OverMaximum, "gen"),
        (base.clone().with_priority(8), OverMaximum, "prio"),
        (
            base.clone().with_audit_deadline_unix_ms(u64::MAX),
            OverMaximum,
            "dl",
        ),
    ];
    for (result, expected_kind, member) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), expected_kind);
        assert_eq!(err.member(), Some(member));
    }
}

#[test]
fn serializes_in_a_fixed_order() {
    let budget = ServiceBudget::new(Duration::from_millis(250))
        .with_operation_id(r#"a "quoted" \ id"#)
        .unwrap()
        .with_generation(3)
        .unwrap()
        .with_priority(0)
        .unwrap()
        .with_audit_deadline_unix_ms(1_767_225_600_000)
        .unwrap();
    let header = budget.to_header_value();
    assert_eq!(
        header,
        r#"v=1, rem=250, gen=3, op="a \"quoted\" \\ id", prio=0, dl=1767225600000"#
    );
    assert_eq!(ServiceBudget::parse(&header).unwrap(), budget);
    assert_eq!(
        ServiceBudget::new(Duration::ZERO).to_header_value(),
        "v=1, rem=0, gen=0"
    );
}

// ---- properties ----

use crate::wire_decode_checks;

fn any_budget() -> impl Strategy<Value = ServiceBudget> {
    (
        prop_oneof![
            (0_u64..=MAX_REMAINING.as_nanos() as u64 + 10_000_000).prop_map(Duration::from_nanos),
            any::<u64>().prop_map(Duration::from_millis),
            Just(MAX_REMAINING),
            Just(Duration::ZERO),
        ],
        prop_oneof![0_u64..100, 0_u64..=MAX_INTEGER],
        proptest::option::of("[ -~]{1,128}"),
        proptest::option::of(0_u8..=MAX_PRIORITY),
        proptest::option::of(0_u64..=MAX_INTEGER),
    )
        .prop_map(|(remaining, generation, op, priority, dl)| {
            let mut budget = ServiceBudget::new(remaining)
                .with_generation(generation)
                .unwrap();
            if let Some(op) = op {
                budget = budget.with_operation_id(&op).unwrap();
            }
            if let Some(priority) = priority {
                budget = budget.with_priority(priority).unwrap();
            }
            if let Some(dl) = dl {
                budget = budget.with_audit_deadline_unix_ms(dl).unwrap();
            }
            budget
        })
}

/// Syntactically plausible headers: known and unknown keys with all kinds of values.
fn plausible_header() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("v".to_owned()),
        Just("rem".to_owned()),
        Just("gen".to_owned()),
        Just("op".to_owned()),
        Just("prio".to_owned()),
        Just("dl".to_owned()),
        "[a-z*][a-z0-9_.*-]{0,4}",
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|i| format!("={}", i % 1_000_000_000_000_000)),
        (-2_i64..100_000_000).prop_map(|i| format!("={i}")),
        Just("=1".to_owned()),
        "=-?[0-9]{1,4}\\.[0-9]{1,3}",
        "=\"[ -!#-\\[\\]-~]{0,10}\"",
        "=[a-zA-Z*][a-zA-Z0-9:/!#$%&'*+.^_`|~-]{0,8}",
        Just("=?1".to_owned()),
        Just("=:AAAA:".to_owned()),
        Just("=(1 2)".to_owned()),
        Just(String::new()),
        Just(";p=1".to_owned()),
    ];
    proptest::collection::vec((key, value), 0..8).prop_map(|members| {
        members
            .into_iter()
            .map(|(k, v)| format!("{k}{v}"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn round_trips(budget in any_budget()) {
        let header = budget.to_header_value();
        prop_assert!(header.len() <= MAX_HEADER_LEN);
        let parsed = ServiceBudget::parse(&header);
        prop_assert_eq!(parsed.as_ref().ok(), Some(&budget), "{} -> {:?}", header, parsed);
    }

    #[test]
    fn new_never_extends(remaining in any::<(u64, u32)>()) {
        let d = Duration::new(remaining.0, remaining.1 % 1_000_000_000);
        let budget = ServiceBudget::new(d);
        prop_assert!(budget.remaining() <= d);
        prop_assert!(budget.remaining() <= MAX_REMAINING);
        prop_assert!(d.min(MAX_REMAINING) - budget.remaining() < Duration::from_millis(1));
    }

    #[test]
    fn never_panics_on_strings(s in any::<String>()) {
        let _ = ServiceBudget::parse(&s);
    }

    #[test]
    fn never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = ServiceBudget::parse(&bytes);
    }

    #[test]
    fn never_panics_on_plausible_headers(header in plausible_header()) {
        if let Ok(budget) = ServiceBudget::parse(&header) {
            // Whatever got through is within bounds and re-serializes to itself.
            prop_assert!(budget.remaining() <= MAX_REMAINING);
            prop_assert_eq!(ServiceBudget::parse(budget.to_header_value()).ok(), Some(budget));
        }
    }

    #[test]
    fn rem_out_of_range_is_an_error_never_a_longer_budget(
        rem in prop_oneof![
            -999_999_999_999_999_i64..0,
            86_400_001_i64..=999_999_999_999_999,
        ],
    ) {
        let header = format!("v=1, rem={rem}");
        let err = ServiceBudget::parse(&header).unwrap_err();
        let expected = if rem < 0 {
            ServiceBudgetErrorKind::Negative
        } else {
            ServiceBudgetErrorKind::OverMaximum
        };
        prop_assert_eq!(err.kind(), expected);
        prop_assert_eq!(err.member(), Some("rem"));
    }

    #[test]
    fn rem_in_range_is_exact(rem in 0_u64..=86_400_000) {
        let budget = ServiceBudget::parse(format!("v=1, rem={rem}")).unwrap();
        prop_assert_eq!(budget.remaining(), Duration::from_millis(rem));
    }

    #[test]
    fn a_repeated_rem_is_always_rejected(a in 0_u64..=86_400_000, b in 0_u64..=86_400_000) {
        let err = ServiceBudget::parse(format!("v=1, rem={a}, rem={b}")).unwrap_err();
        prop_assert_eq!(err.kind(), ServiceBudgetErrorKind::DuplicateMember);
    }
}

/// Bytes as the fuzzer would try them: anything, plausible dictionaries, and valid headers.
fn fuzz_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        plausible_header().prop_map(String::into_bytes),
        any_budget().prop_map(|b| b.to_header_value().into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// The fuzz target's contract for this decoder, on the same entry points (raw bytes).
    #[test]
    fn the_fuzz_targets_checks_hold(data in fuzz_input()) {
        wire_decode_checks::service_budget(&data);
    }
}
