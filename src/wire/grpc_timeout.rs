//! The gRPC `grpc-timeout` header: encode a remaining budget, decode it strictly.
//!
//! gRPC over HTTP/2 carries a call's budget in the `grpc-timeout` request header
//! ([PROTOCOL-HTTP2]):
//!
//! ```text
//! Timeout      → "grpc-timeout" TimeoutValue TimeoutUnit
//! TimeoutValue → {positive integer as ASCII string of at most 8 digits}
//! TimeoutUnit  → Hour / Minute / Second / Millisecond / Microsecond / Nanosecond
//! Hour → "H"   Minute → "M"   Second → "S"   Millisecond → "m"   Microsecond → "u"   Nanosecond → "n"
//! ```
//!
//! [`encode`] picks the finest unit whose value fits in 8 digits, so precision is lost only
//! for long budgets, and then only downwards (truncation). Durations longer than
//! [`MAX_TIMEOUT`] (`99999999H`, about 11 400 years) saturate to it. A zero budget encodes as
//! `0n`; the grammar says "positive", but every major implementation accepts `0` and treats the
//! call as already expired, which is exactly what an exhausted budget means.
//!
//! [`decode`] is strict: 1 to 8 ASCII digits (leading zeros allowed, no sign, no whitespace, no
//! other Unicode digits) followed by exactly one unit character. Anything else is a
//! [`GrpcTimeoutError`]. Decoding never panics and never overflows: the largest value,
//! `99999999H`, fits comfortably in a [`Duration`].
//!
//! [PROTOCOL-HTTP2]: https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use cancel_scope::wire::grpc_timeout;
//!
//! assert_eq!(grpc_timeout::encode(Duration::from_millis(100)), "100000u");
//! assert_eq!(grpc_timeout::decode("100m")?, Duration::from_millis(100));
//! assert!(grpc_timeout::decode("-1S").is_err());
//! # Ok::<(), grpc_timeout::GrpcTimeoutError>(())
//! ```

use std::fmt;
use std::time::Duration;

/// The header name, `grpc-timeout` (lower case, as HTTP/2 requires).
///
/// # Examples
///
/// ```
/// assert_eq!(cancel_scope::wire::grpc_timeout::HEADER, "grpc-timeout");
/// ```
pub const HEADER: &str = "grpc-timeout";

/// The largest value a `TimeoutValue` may have: 8 digits.
const MAX_VALUE: u64 = 99_999_999;

/// The largest budget the header can express, `99999999H`; [`encode`] saturates to it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::grpc_timeout::{encode, MAX_TIMEOUT};
///
/// assert_eq!(encode(MAX_TIMEOUT), "99999999H");
/// assert_eq!(encode(Duration::MAX), "99999999H");
/// ```
pub const MAX_TIMEOUT: Duration = Duration::from_secs(MAX_VALUE * 3600);

/// Units from finest to coarsest: (unit character, nanoseconds per unit).
const UNITS: [(char, u128); 6] = [
    ('n', 1),
    ('u', 1_000),
    ('m', 1_000_000),
    ('S', 1_000_000_000),
    ('M', 60 * 1_000_000_000),
    ('H', 3_600 * 1_000_000_000),
];

/// Splits `d` into the value and unit [`encode`] writes: the finest unit whose value fits in
/// 8 digits, truncated; saturated at `99999999H`.
fn split(d: Duration) -> (u64, char) {
    let nanos = d.as_nanos();
    for (unit, per_unit) in UNITS {
        // Integer division truncates: the encoded budget is never longer than `d`.
        if let Ok(value) = u64::try_from(nanos / per_unit) {
            if value <= MAX_VALUE {
                return (value, unit);
            }
        }
    }
    (MAX_VALUE, 'H')
}

/// Encodes a remaining budget as a `grpc-timeout` header value.
///
/// Uses the finest unit (`n`, then `u`, `m`, `S`, `M`, `H`) whose value fits in 8 digits,
/// truncating when a coarser unit is needed: the decoded value is never longer than `d` and
/// is less than one unit shorter. Durations above [`MAX_TIMEOUT`] saturate to `99999999H`;
/// zero encodes as `0n`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::grpc_timeout::encode;
///
/// assert_eq!(encode(Duration::ZERO), "0n");
/// assert_eq!(encode(Duration::from_nanos(99_999_999)), "99999999n");
/// assert_eq!(encode(Duration::from_millis(100)), "100000u");
/// // 2.5 minutes do not fit in 8 digits of microseconds: milliseconds it is.
/// assert_eq!(encode(Duration::from_secs(150)), "150000m");
/// // Truncated, never rounded up: 100 000 000.9 ms becomes 100 000 s.
/// assert_eq!(encode(Duration::from_micros(100_000_000_900)), "100000S");
/// ```
#[must_use]
pub fn encode(d: Duration) -> String {
    let mut out = String::with_capacity(9);
    // Writing into a `String` cannot fail.
    let _ = encode_into(d, &mut out);
    out
}

/// Writes the [`encode`]d form of `d` into `out` without allocating.
///
/// The output is at most 9 bytes long.
///
/// # Errors
///
/// Only those of `out` itself; writing into a `String` never fails.
///
/// # Examples
///
/// ```
/// use std::fmt::Write as _;
/// use std::time::Duration;
/// use cancel_scope::wire::grpc_timeout::encode_into;
///
/// let mut header = String::new();
/// encode_into(Duration::from_secs(3), &mut header)?;
/// assert_eq!(header, "3000000u");
/// # Ok::<(), std::fmt::Error>(())
/// ```
pub fn encode_into<W: fmt::Write + ?Sized>(d: Duration, out: &mut W) -> fmt::Result {
    let (value, unit) = split(d);
    write!(out, "{value}{unit}")
}

/// Decodes a `grpc-timeout` header value strictly.
///
/// Accepts exactly 1 to 8 ASCII digits followed by one of `H M S m u n`, and nothing else:
/// no sign, no whitespace, no non-ASCII digits, no trailing characters. See
/// [`decode_bytes`] for raw header bytes.
///
/// # Errors
///
/// A [`GrpcTimeoutError`] saying what is wrong with `s`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::grpc_timeout::{decode, GrpcTimeoutError};
///
/// assert_eq!(decode("1S"), Ok(Duration::from_secs(1)));
/// assert_eq!(decode("99999999H"), Ok(Duration::from_secs(99_999_999 * 3600)));
/// assert_eq!(decode("123456789n"), Err(GrpcTimeoutError::TooManyDigits));
/// assert_eq!(decode("1x"), Err(GrpcTimeoutError::UnknownUnit));
/// ```
pub fn decode(s: &str) -> Result<Duration, GrpcTimeoutError> {
    decode_bytes(s.as_bytes())
}

/// Decodes a `grpc-timeout` header value given as raw bytes (as HTTP header values are).
///
/// Same grammar as [`decode`]; any byte outside it (including every non-ASCII byte) is an
/// error. Works directly on `http::HeaderValue::as_bytes()`.
///
/// # Errors
///
/// A [`GrpcTimeoutError`] saying what is wrong with `bytes`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::grpc_timeout::{decode_bytes, GrpcTimeoutError};
///
/// assert_eq!(decode_bytes(b"100m"), Ok(Duration::from_millis(100)));
/// assert_eq!(decode_bytes(b"1\xffS"), Err(GrpcTimeoutError::InvalidCharacter));
/// ```
pub fn decode_bytes(bytes: &[u8]) -> Result<Duration, GrpcTimeoutError> {
    let Some((&unit, digits)) = bytes.split_last() else {
        return Err(GrpcTimeoutError::Empty);
    };
    if unit.is_ascii_digit() {
        // No unit at all: either just too long, or digits only, or garbage.
        return Err(if !bytes.iter().all(u8::is_ascii_digit) {
            GrpcTimeoutError::InvalidCharacter
        } else if bytes.len() > 8 {
            GrpcTimeoutError::TooManyDigits
        } else {
            GrpcTimeoutError::MissingUnit
        });
    }
    if digits.is_empty() {
        return Err(GrpcTimeoutError::MissingValue);
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(GrpcTimeoutError::InvalidCharacter);
    }
    if digits.len() > 8 {
        return Err(GrpcTimeoutError::TooManyDigits);
    }
    // At most 8 digits, so `value <= 99_999_999` and nothing below can overflow.
    let value = digits
        .iter()
        .fold(0_u64, |acc, &digit| acc * 10 + u64::from(digit - b'0'));
    duration(value, unit).ok_or(GrpcTimeoutError::UnknownUnit)
}

/// The duration of `value` (at most 8 digits, so nothing overflows) in `unit`, if `unit` is one
/// of `H M S m u n`.
fn duration(value: u64, unit: u8) -> Option<Duration> {
    match unit {
        b'n' => Some(Duration::from_nanos(value)),
        b'u' => Some(Duration::from_micros(value)),
        b'm' => Some(Duration::from_millis(value)),
        b'S' => Some(Duration::from_secs(value)),
        b'M' => Some(Duration::from_secs(value * 60)),
        b'H' => Some(Duration::from_secs(value * 3600)),
        _ => None,
    }
}

/// The budget [`encode`] puts on the wire for `d`: `d` truncated to the unit it picks and
/// saturated at [`MAX_TIMEOUT`], i.e. `decode(&encode(d))` without the string.
#[cfg_attr(not(any(feature = "tower", feature = "reqwest")), allow(dead_code))]
pub(crate) fn truncate(d: Duration) -> Duration {
    let (value, unit) = split(d);
    // `split` only returns units of `UNITS`, all ASCII; the fallback is the shortest budget.
    u8::try_from(unit)
        .ok()
        .and_then(|unit| duration(value, unit))
        .unwrap_or(Duration::ZERO)
}

/// Why a `grpc-timeout` value was rejected by [`decode`] or [`decode_bytes`].
///
/// Variants may be added in later versions. The `Display` text is for humans and logs, not
/// API.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::grpc_timeout::{decode, GrpcTimeoutError};
///
/// let err = decode("").unwrap_err();
/// assert_eq!(err, GrpcTimeoutError::Empty);
/// println!("bad grpc-timeout: {err}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrpcTimeoutError {
    /// The value is empty.
    Empty,
    /// There are no digits before the unit (e.g. `S`).
    MissingValue,
    /// More than 8 digits (e.g. `123456789n`).
    TooManyDigits,
    /// A character that is neither an ASCII digit nor, in last position, a unit (e.g. `-1S`,
    /// `1 S`, `1.5S`, `١S`).
    InvalidCharacter,
    /// Digits without a unit (e.g. `100`).
    MissingUnit,
    /// The last character is not one of `H M S m u n` (e.g. `1x`, `1s`).
    UnknownUnit,
}

impl fmt::Display for GrpcTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Empty => "grpc-timeout is empty",
            Self::MissingValue => "grpc-timeout has no digits before its unit",
            Self::TooManyDigits => "grpc-timeout has more than 8 digits",
            Self::InvalidCharacter => {
                "grpc-timeout contains a character that is not an ASCII digit"
            }
            Self::MissingUnit => "grpc-timeout has no unit (expected one of H M S m u n)",
            Self::UnknownUnit => "grpc-timeout has an unknown unit (expected one of H M S m u n)",
        })
    }
}

impl std::error::Error for GrpcTimeoutError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_is_what_decode_reads_back() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(99_999_999),
            Duration::from_micros(100_000_500),
            Duration::from_secs(100_000) + Duration::from_nanos(1),
            MAX_TIMEOUT,
            Duration::MAX,
        ] {
            assert_eq!(Ok(truncate(d)), decode(&encode(d)), "{d:?}");
            assert!(truncate(d) <= d, "{d:?}");
        }
    }
}
