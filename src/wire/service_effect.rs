//! The `service-effect` response header: whether a request that the server stopped may have
//! had an effect.
//!
//! # Why a header
//!
//! A server that stops a request itself — its deadline, an explicit cancel, a shutdown, a
//! handler that panicked — answers with an error status, and a caller that sees `503` or
//! gRPC `UNAVAILABLE` takes it as "try again": nothing happened. That is false when the
//! handler had already dispatched a call that may have had an effect (a payment, a write):
//! the call may have committed although its answer never came back. The server knows which
//! case it is (every dispatch of a possibly-effectful child of the request sets a sticky
//! request-wide flag), and says so beside the status:
//!
//! | value | meaning |
//! |---|---|
//! | `none` | no child that may have had an effect was dispatched in the request (the handler's own code may still have done something no scope saw) |
//! | `unknown` | one was: what the request did is unknown, and a retry may repeat it |
//!
//! The server layer (`integrations::tower::Admit`, feature `tower`) puts it on
//! every answer for a request it stopped (and, for gRPC, in the trailers of a body it cut); it
//! is not sent on a handler's own answers. With `unknown` it also answers HTTP `500` instead
//! of `503` and gRPC `UNKNOWN` instead of `UNAVAILABLE`, so that a client that knows nothing
//! of this header does not read the answer as "safe to retry" either.
//!
//! # Reading it
//!
//! A reader is conservative: only a value that is exactly `none` (a comma-separated list of
//! `none`s, as a proxy that joins repeated lines makes) reads as [`ServiceEffect::None`];
//! anything else — `unknown`, a value of a later version, garbage, an empty value — reads as
//! [`ServiceEffect::Unknown`]. A missing header says nothing (`None` from
//! [`ServiceEffect::from_lines`]): the answer came from a server that does not send it.
//!
//! # Examples
//!
//! ```
//! use cancel_scope::wire::service_effect::{self, ServiceEffect};
//!
//! assert_eq!(service_effect::HEADER, "service-effect");
//! assert_eq!(ServiceEffect::Unknown.as_str(), "unknown");
//! assert_eq!(ServiceEffect::parse(b"none"), ServiceEffect::None);
//! assert_eq!(ServiceEffect::parse(b"maybe"), ServiceEffect::Unknown);
//! assert_eq!(ServiceEffect::from_lines([&b"none"[..], b"unknown"]), Some(ServiceEffect::Unknown));
//! assert_eq!(ServiceEffect::from_lines(std::iter::empty::<&[u8]>()), None);
//! ```

use std::fmt;

/// The header's name (lowercase, as HTTP/2 sends it).
pub const HEADER: &str = "service-effect";

/// What a server said about the effects of a request it stopped (see the
/// [module docs](self)).
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::service_effect::ServiceEffect;
/// assert!(ServiceEffect::parse(b"unknown").is_unknown());
/// assert!(!ServiceEffect::parse(b" none ").is_unknown());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceEffect {
    /// No child that may have had an effect was dispatched in the request.
    None,
    /// One was: the request's effect is unknown.
    Unknown,
}

impl ServiceEffect {
    /// The header value.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_effect::ServiceEffect;
    /// assert_eq!(ServiceEffect::None.as_str(), "none");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            ServiceEffect::None => "none",
            ServiceEffect::Unknown => "unknown",
        }
    }

    /// `Unknown` if `dispatched`, else `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_effect::ServiceEffect;
    /// assert_eq!(ServiceEffect::from_dispatched(true), ServiceEffect::Unknown);
    /// ```
    pub const fn from_dispatched(dispatched: bool) -> Self {
        if dispatched {
            ServiceEffect::Unknown
        } else {
            ServiceEffect::None
        }
    }

    /// Whether this says the effect is unknown.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_effect::ServiceEffect;
    /// assert!(ServiceEffect::Unknown.is_unknown());
    /// ```
    pub const fn is_unknown(self) -> bool {
        matches!(self, ServiceEffect::Unknown)
    }

    /// Reads one header value. Never fails: only a value whose every comma-separated member
    /// is `none` (spaces and tabs around members allowed) is `None`; anything else is
    /// `Unknown`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_effect::ServiceEffect;
    /// assert_eq!(ServiceEffect::parse(b"none, none"), ServiceEffect::None);
    /// assert_eq!(ServiceEffect::parse(b"None"), ServiceEffect::Unknown);
    /// assert_eq!(ServiceEffect::parse(b""), ServiceEffect::Unknown);
    /// ```
    pub fn parse(value: &[u8]) -> Self {
        let all_none = value
            .split(|&b| b == b',')
            .all(|member| trim(member) == b"none");
        if all_none {
            ServiceEffect::None
        } else {
            ServiceEffect::Unknown
        }
    }

    /// Reads every line of the header: `None` (nothing said) when there is none, `Unknown` if
    /// any line reads as unknown.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_effect::ServiceEffect;
    /// assert_eq!(ServiceEffect::from_lines([&b"none"[..]]), Some(ServiceEffect::None));
    /// ```
    pub fn from_lines<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> Option<Self> {
        lines.into_iter().map(ServiceEffect::parse).reduce(
            |a, b| {
                if a.is_unknown() {
                    a
                } else {
                    b
                }
            },
        )
    }
}

impl fmt::Display for ServiceEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `bytes` without leading and trailing spaces and tabs (HTTP's optional whitespace).
fn trim(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        for e in [ServiceEffect::None, ServiceEffect::Unknown] {
            assert_eq!(ServiceEffect::parse(e.as_str().as_bytes()), e);
            assert_eq!(e.to_string(), e.as_str());
        }
    }

    #[test]
    fn only_none_is_none() {
        for v in [&b"none"[..], b" none\t", b"none,none", b"none , none"] {
            assert_eq!(ServiceEffect::parse(v), ServiceEffect::None, "{v:?}");
        }
        for v in [
            &b""[..],
            b",",
            b"none,",
            b"NONE",
            b"none;v=2",
            b"\"none\"",
            b"no ne",
            b"unknown, none",
            b"none\xff",
        ] {
            assert_eq!(ServiceEffect::parse(v), ServiceEffect::Unknown, "{v:?}");
        }
    }
}
