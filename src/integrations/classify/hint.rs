//! What an answer says about coming back: HTTP `Retry-After`, gRPC `grpc-retry-pushback-ms`.
//! (Whether the server had dispatched a possibly-effectful child of the request is
//! [`is_effect_unknown`](crate::integrations::is_effect_unknown).)

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

/// gRPC's server pushback (gRFC A6): milliseconds until the client may retry; a negative or
/// unreadable value asks it not to retry at all.
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// The delay a `Retry-After` asks for, read at wall-clock `now`: delay-seconds or an
/// HTTP-date (RFC 9110, 10.2.3), a date already past meaning "now". A value that is neither
/// is ignored; a number too large for a `Duration` saturates (it is only ever later than the
/// last moment an attempt may start). Of several lines, the latest delay counts.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    headers
        .get_all(RETRY_AFTER)
        .iter()
        .filter_map(|v| retry_after_value(v, now))
        .max()
}

fn retry_after_value(v: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(v.as_bytes()).ok()?.trim();
    if let Some(n) = digits(text) {
        return Some(n.map_or(Duration::MAX, Duration::from_secs));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `Some(Some(n))` for 1 or more ASCII digits that fit a `u64`, `Some(None)` for more digits
/// than that, `None` for anything else.
fn digits(text: &str) -> Option<Option<u64>> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().ok())
}

/// What a gRPC server's pushback says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushback {
    /// Not sent.
    None,
    /// Retry no sooner than this.
    After(Duration),
    /// Do not retry (a negative or unreadable value).
    Refused,
}

/// The `grpc-retry-pushback-ms` of `headers` (trailers, or a trailers-only head). Several
/// lines: a refusal in any wins, else the latest delay.
pub(crate) fn pushback(headers: &HeaderMap) -> Pushback {
    let mut out = Pushback::None;
    for v in headers.get_all(GRPC_RETRY_PUSHBACK_MS) {
        let text = std::str::from_utf8(v.as_bytes()).map(str::trim);
        let this = match text.ok().and_then(digits) {
            Some(ms) => Pushback::After(ms.map_or(Duration::MAX, Duration::from_millis)),
            None => return Pushback::Refused,
        };
        out = match (out, this) {
            (Pushback::After(a), Pushback::After(b)) => Pushback::After(a.max(b)),
            (_, this) => this,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &HeaderName, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(name, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let after = |values: &[&str]| retry_after(&headers(&RETRY_AFTER, values), now);
        assert_eq!(after(&[]), None);
        assert_eq!(after(&["120"]), Some(Duration::from_secs(120)));
        assert_eq!(after(&[" 0 "]), Some(Duration::ZERO));
        // 1_700_000_000 is Tue, 14 Nov 2023 22:13:20 GMT.
        let in_90s = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(in_90s, "Tue, 14 Nov 2023 22:14:50 GMT");
        assert_eq!(after(&[&in_90s]), Some(Duration::from_secs(90)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(after(&[&past]), Some(Duration::ZERO));
        // Hostile or broken values: ignored, or saturated, never a panic.
        assert_eq!(after(&["-5"]), None);
        assert_eq!(after(&["1.5"]), None);
        assert_eq!(after(&["soon"]), None);
        assert_eq!(after(&["99999999999999999999999999"]), Some(Duration::MAX));
        assert_eq!(after(&["5", "garbage", "7"]), Some(Duration::from_secs(7)));
    }

    #[test]
    fn pushback_follows_grpc_a6() {
        let push = |values: &[&str]| pushback(&headers(&GRPC_RETRY_PUSHBACK_MS, values));
        assert_eq!(push(&[]), Pushback::None);
        assert_eq!(push(&["250"]), Pushback::After(Duration::from_millis(250)));
        assert_eq!(push(&["0"]), Pushback::After(Duration::ZERO));
        assert_eq!(push(&["-1"]), Pushback::Refused);
        assert_eq!(push(&["later"]), Pushback::Refused);
        assert_eq!(push(&["100", "-1"]), Pushback::Refused);
        assert_eq!(
            push(&["100", "300"]),
            Pushback::After(Duration::from_millis(300))
        );
        assert_eq!(
            push(&["18446744073709551616"]),
            Pushback::After(Duration::MAX)
        );
    }
}
