//! Envoy's `x-envoy-expected-rq-timeout-ms` header: the budget Envoy gave an upstream request.
//!
//! When Envoy routes a request it tells the upstream how long it will wait for the answer, in
//! whole milliseconds, as a plain decimal integer. A service behind Envoy can start its own
//! scope from that value instead of a fixed default. This module only *reads* the header: Envoy
//! sets it, services do not forward it.
//!
//! The decoder is strict: 1 to 10 ASCII digits (up to 9 999 999 999 ms, about 115 days),
//! nothing else (no sign, whitespace, decimal point or unit).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use cancel_scope::wire::envoy;
//!
//! assert_eq!(envoy::decode_expected_timeout("15000")?, Duration::from_secs(15));
//! # Ok::<(), envoy::EnvoyTimeoutError>(())
//! ```

use std::fmt;
use std::time::Duration;

/// The header name, `x-envoy-expected-rq-timeout-ms`.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::envoy::EXPECTED_RQ_TIMEOUT_MS;
///
/// assert_eq!(EXPECTED_RQ_TIMEOUT_MS, "x-envoy-expected-rq-timeout-ms");
/// ```
pub const EXPECTED_RQ_TIMEOUT_MS: &str = "x-envoy-expected-rq-timeout-ms";

/// Most digits accepted; 10 digits of milliseconds always fit in a [`Duration`].
const MAX_DIGITS: usize = 10;

/// Decodes an `x-envoy-expected-rq-timeout-ms` value: a non-negative integer of milliseconds.
///
/// Accepts 1 to 10 ASCII digits and nothing else. See [`decode_expected_timeout_bytes`] for
/// raw header bytes.
///
/// # Errors
///
/// An [`EnvoyTimeoutError`] if `s` is empty, longer than 10 digits or contains anything but
/// ASCII digits.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::envoy::{decode_expected_timeout, EnvoyTimeoutError};
///
/// assert_eq!(decode_expected_timeout("250"), Ok(Duration::from_millis(250)));
/// assert_eq!(decode_expected_timeout("-1"), Err(EnvoyTimeoutError::InvalidCharacter));
/// assert_eq!(decode_expected_timeout("12345678901"), Err(EnvoyTimeoutError::TooManyDigits));
/// ```
pub fn decode_expected_timeout(s: &str) -> Result<Duration, EnvoyTimeoutError> {
    decode_expected_timeout_bytes(s.as_bytes())
}

/// Decodes an `x-envoy-expected-rq-timeout-ms` value given as raw header bytes.
///
/// Same grammar as [`decode_expected_timeout`]; every non-ASCII byte is an error.
///
/// # Errors
///
/// An [`EnvoyTimeoutError`] if `bytes` is empty, longer than 10 digits or contains anything but
/// ASCII digits.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::envoy::decode_expected_timeout_bytes;
///
/// assert_eq!(decode_expected_timeout_bytes(b"0"), Ok(Duration::ZERO));
/// assert!(decode_expected_timeout_bytes(b"1\xff").is_err());
/// ```
pub fn decode_expected_timeout_bytes(bytes: &[u8]) -> Result<Duration, EnvoyTimeoutError> {
    if bytes.is_empty() {
        return Err(EnvoyTimeoutError::Empty);
    }
    if !bytes.iter().all(u8::is_ascii_digit) {
        return Err(EnvoyTimeoutError::InvalidCharacter);
    }
    if bytes.len() > MAX_DIGITS {
        return Err(EnvoyTimeoutError::TooManyDigits);
    }
    // At most 10 digits: the value is below 10^10 and cannot overflow a u64.
    let millis = bytes
        .iter()
        .fold(0_u64, |acc, &digit| acc * 10 + u64::from(digit - b'0'));
    Ok(Duration::from_millis(millis))
}

/// Why an `x-envoy-expected-rq-timeout-ms` value was rejected.
///
/// Variants may be added in later versions. The `Display` text is for humans and logs, not
/// API.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::envoy::{decode_expected_timeout, EnvoyTimeoutError};
///
/// assert_eq!(decode_expected_timeout(""), Err(EnvoyTimeoutError::Empty));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EnvoyTimeoutError {
    /// The value is empty.
    Empty,
    /// More than 10 digits.
    TooManyDigits,
    /// Something other than an ASCII digit (a sign, whitespace, a decimal point, a unit, ...).
    InvalidCharacter,
}

impl fmt::Display for EnvoyTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Empty => "x-envoy-expected-rq-timeout-ms is empty",
            Self::TooManyDigits => "x-envoy-expected-rq-timeout-ms has more than 10 digits",
            Self::InvalidCharacter => {
                "x-envoy-expected-rq-timeout-ms contains a character that is not an ASCII digit"
            }
        })
    }
}

impl std::error::Error for EnvoyTimeoutError {}
