//! The `service-operation` response header: the operation a request was admitted under, so
//! that the client can retry under it.
//!
//! # Why a header
//!
//! An edge issues the operation id of a request that comes without one it may keep (a
//! caller it does not trust to name operations): 128 random bits, unguessable. With an
//! operation registry, a retry under that id gets what the operation has left, never a fresh
//! budget — but only if the client knows the id. The server layer
//! (`integrations::tower::Admit`, feature `tower`) says it on every answer to an admitted
//! request: the handler's own, and the answers the layer gives for a request it stopped
//! (deadline, cancel, shutdown, a panic).
//!
//! The id said is always the admission's ([`Admission::operation_id`]): one this server
//! issued ([`OperationSource::Local`]), the caller's own where the policy trusts it
//! ([`OperationSource::Caller`]), or one the registry holds ([`OperationSource::Known`]).
//! An id a caller sent and the policy did not believe is never repeated: that caller gets
//! the id the server issued instead. Requests refused at admission get no header: they have
//! no operation.
//!
//! # Format
//!
//! An RFC 8941 String Item: the id (1 to 128 printable ASCII characters) in double quotes,
//! `\` and `"` escaped with a `\`. It is the form of the `op` member of `service-budget`, so a
//! client can put the value in its retry's `service-budget` as it came:
//!
//! ```text
//! service-operation: "4b1c9e0d57a2f3e8a1d6c0b9e7f2a4c3"
//! service-budget: v=1, rem=800, op="4b1c9e0d57a2f3e8a1d6c0b9e7f2a4c3"
//! ```
//!
//! A reader ([`parse`]) takes exactly one String Item (parameters ignored) holding a valid
//! operation id, and nothing else.
//!
//! [`Admission::operation_id`]: crate::wire::Admission::operation_id
//! [`OperationSource::Local`]: crate::wire::OperationSource::Local
//! [`OperationSource::Caller`]: crate::wire::OperationSource::Caller
//! [`OperationSource::Known`]: crate::wire::OperationSource::Known
//!
//! # Examples
//!
//! ```
//! use cancel_scope::registry::OperationId;
//! use cancel_scope::wire::service_operation;
//!
//! assert_eq!(service_operation::HEADER, "service-operation");
//! let id = OperationId::new("checkout-7f3a").unwrap();
//! let value = service_operation::encode(&id);
//! assert_eq!(value, "\"checkout-7f3a\"");
//! assert_eq!(service_operation::parse(value.as_bytes()), Some(id));
//! assert_eq!(service_operation::parse(b"checkout-7f3a"), None); // a Token, not a String
//! ```

use sfv::visitor::{Ignored, ItemVisitor, ParameterVisitor};
use sfv::{BareItemFromInput, Parser};

use crate::registry::OperationId;

/// The header's name (lowercase, as HTTP/2 sends it).
pub const HEADER: &str = "service-operation";

/// The header value naming `id`: an RFC 8941 String.
///
/// # Examples
///
/// ```
/// use cancel_scope::registry::OperationId;
/// use cancel_scope::wire::service_operation;
/// let id = OperationId::new(r#"say "hi""#).unwrap();
/// assert_eq!(service_operation::encode(&id), r#""say \"hi\"""#);
/// ```
pub fn encode(id: &OperationId) -> String {
    let mut out = Vec::with_capacity(id.as_str().len() + 2);
    encode_into(id.as_str(), &mut out);
    String::from_utf8(out).unwrap_or_else(|_| unreachable!("an id is printable ASCII"))
}

/// Appends the header value naming `id` (printable ASCII, as an [`OperationId`] is) to `out`.
pub(crate) fn encode_into(id: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    // An id the edge issued (hex digits) has nothing to escape.
    if !id.bytes().any(|b| matches!(b, b'"' | b'\\')) {
        out.extend_from_slice(id.as_bytes());
        out.push(b'"');
        return;
    }
    for &b in id.as_bytes() {
        if matches!(b, b'"' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
}

/// Reads a header value: the operation id it names, or `None` if it is not one RFC 8941
/// String Item holding a valid id (empty, too long, a Token, a list, garbage).
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::service_operation;
/// assert_eq!(service_operation::parse(br#""op-1";v=2"#).unwrap().as_str(), "op-1");
/// assert_eq!(service_operation::parse(br#""""#), None);
/// assert_eq!(service_operation::parse(br#""a", "b""#), None);
/// ```
pub fn parse(value: &[u8]) -> Option<OperationId> {
    let mut id = None;
    Parser::new(value)
        .parse_item_with_visitor(Item(&mut id))
        .ok()?;
    OperationId::new(id?).ok()
}

/// Keeps the Item's String; any other bare item fails the parse.
struct Item<'a>(&'a mut Option<String>);

impl<'de> ItemVisitor<'de> for Item<'_> {
    type Error = NotAString;

    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de>, NotAString> {
        match bare_item {
            BareItemFromInput::String(s) => {
                *self.0 = Some(s.as_str().to_owned());
                Ok(Ignored)
            }
            _ => Err(NotAString),
        }
    }
}

#[derive(Debug)]
struct NotAString;

impl std::fmt::Display for NotAString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a String")
    }
}

impl std::error::Error for NotAString {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_round_trips() {
        for id in [
            "op-1",
            " leading and trailing ",
            "\\",
            "\"",
            "~!@#$%^&*()_+{}|:<>?`-=[];',./",
            &"x".repeat(crate::registry::MAX_ID_LEN),
        ] {
            let id = OperationId::new(id).unwrap();
            assert_eq!(parse(encode(&id).as_bytes()), Some(id));
        }
        assert_eq!(
            parse(encode(&OperationId::random()).as_bytes()).map(|i| i.as_str().len()),
            Some(32)
        );
    }

    #[test]
    fn anything_but_one_string_naming_a_valid_id_is_refused() {
        let long = format!("\"{}\"", "x".repeat(crate::registry::MAX_ID_LEN + 1));
        for v in [
            &b""[..],
            b"op-1",
            b"1",
            b"?1",
            b"\"op-1",
            b"\"a\", \"b\"",
            b"(\"a\")",
            b"\"\"",
            b"\"a\\x\"",
            b"\"a\" junk",
            long.as_bytes(),
        ] {
            assert_eq!(parse(v), None, "{:?}", String::from_utf8_lossy(v));
        }
    }
}
