//! The `service-effect` header's reader (`wire::service_effect`): whatever a peer or a proxy
//! sends, it never panics and reads `none` only from a value that says exactly that.

use cancel_scope::wire::ServiceEffect;
use proptest::prelude::*;

/// The reference reading: every comma-separated member, without spaces and tabs around it,
/// is `none`.
fn says_none(value: &[u8]) -> bool {
    let ows = |b: &&u8| **b == b' ' || **b == b'\t';
    value.split(|&b| b == b',').all(|member| {
        let rest = &member[member.iter().take_while(ows).count()..];
        let end = rest.len() - rest.iter().rev().take_while(ows).count();
        &rest[..end] == b"none"
    })
}

proptest! {
    #[test]
    fn any_bytes_read_as_none_only_when_they_say_none(value in proptest::collection::vec(any::<u8>(), 0..64)) {
        let read = ServiceEffect::parse(&value);
        prop_assert_eq!(read == ServiceEffect::None, says_none(&value));
    }

    #[test]
    fn lists_of_members_near_none(members in proptest::collection::vec(
        prop_oneof![
            Just("none".to_owned()),
            Just(" none\t".to_owned()),
            Just("unknown".to_owned()),
            Just("NONE".to_owned()),
            Just("".to_owned()),
            "[ -~]{0,6}",
        ],
        1..5,
    )) {
        let value = members.join(",");
        let expected = members.iter().all(|m| m.trim_matches(|c| c == ' ' || c == '\t') == "none");
        prop_assert_eq!(ServiceEffect::parse(value.as_bytes()) == ServiceEffect::None, expected);
        // Several lines: `unknown` if any says so (or says anything else).
        let lines: Vec<&[u8]> = members.iter().map(|m| m.as_bytes()).collect();
        let read = ServiceEffect::from_lines(lines.iter().copied());
        let all_none = members.iter().all(|m| ServiceEffect::parse(m.as_bytes()) == ServiceEffect::None);
        prop_assert_eq!(read, Some(if all_none { ServiceEffect::None } else { ServiceEffect::Unknown }));
    }
}
