//! Budget headers on `http` requests and status answers on `http` responses.

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::registry::OperationId;
use crate::wire::service_effect::{self, ServiceEffect};
use crate::wire::service_operation;
use crate::Cause;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
pub(crate) const SERVICE_EFFECT: HeaderName = HeaderName::from_static(service_effect::HEADER);
pub(crate) const SERVICE_OPERATION: HeaderName = HeaderName::from_static(service_operation::HEADER);

/// The `service-operation` value of an admitted request's operation id (validated at
/// admission; `None` only for an id that is not one, which admission never makes).
pub(crate) fn operation_value(id: &str) -> Option<HeaderValue> {
    OperationId::check(id).ok()?;
    let mut out = Vec::with_capacity(id.len() + 2);
    service_operation::encode_into(id, &mut out);
    HeaderValue::from_maybe_shared(bytes::Bytes::from(out)).ok()
}

/// gRPC status codes used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrpcCode {
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    FailedPrecondition = 9,
    Aborted = 10,
    Internal = 13,
    Unavailable = 14,
}

/// Whether a request or response speaks gRPC (`application/grpc`, `+proto`, `-web`...).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    // A media type's type and subtype are case-insensitive (RFC 9110, 8.3.1).
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes()
            .get(..GRPC.len())
            .is_some_and(|t| t.eq_ignore_ascii_case(GRPC))
    })
}

/// The gRPC code a client sees for a call its own scope stopped: deadline or cancel.
pub(crate) fn client_grpc_code_of(cause: &Cause) -> GrpcCode {
    if cause.is_deadline_exceeded() {
        GrpcCode::DeadlineExceeded
    } else {
        GrpcCode::Cancelled
    }
}

/// The gRPC code a server answers for a scope that stopped with `cause`, where `effect` says
/// whether a child that may have had an effect was dispatched: a stop of the server's own
/// (a cancel, a shutdown) is `UNAVAILABLE` — which callers retry — only when none was, and
/// `UNKNOWN` otherwise.
pub(crate) fn grpc_code_of(cause: &Cause, effect: ServiceEffect) -> GrpcCode {
    match cause.origin() {
        Cause::DeadlineExceeded => GrpcCode::DeadlineExceeded,
        Cause::ClientGone => GrpcCode::Cancelled,
        _ if effect.is_unknown() => GrpcCode::Unknown,
        _ => GrpcCode::Unavailable,
    }
}

/// The HTTP status for a scope that stopped with `cause` (499 is nginx's "client closed
/// request", for logs: nobody is there to read it); a stop of the server's own is `503`
/// ("try again") only when no child that may have had an effect was dispatched, and `500`
/// otherwise (see [`grpc_code_of`]).
pub(crate) fn http_status_of(cause: &Cause, effect: ServiceEffect) -> StatusCode {
    match cause.origin() {
        Cause::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Cause::ClientGone => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        _ if effect.is_unknown() => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// Says `effect` in `headers` (the head of an answer, or the trailers of a cut gRPC body).
pub(crate) fn insert_effect(headers: &mut HeaderMap, effect: ServiceEffect) {
    headers.insert(SERVICE_EFFECT, HeaderValue::from_static(effect.as_str()));
}

/// The trailers (or trailers-only headers) of a gRPC status.
pub(crate) fn grpc_status_headers(code: GrpcCode, message: &str) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(4);
    h.insert(GRPC_STATUS, HeaderValue::from(code as u16));
    if let Ok(v) = HeaderValue::try_from(percent_encode(message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    h
}

/// A trailers-only gRPC response carrying `code`.
pub(crate) fn grpc_response<B>(code: GrpcCode, message: &str, body: B) -> Response<B> {
    let mut res = Response::new(body);
    *res.headers_mut() = grpc_status_headers(code, message);
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    res
}

/// An HTTP response with `status`.
pub(crate) fn http_response<B>(status: StatusCode, body: B) -> Response<B> {
    let mut res = Response::new(body);
    *res.status_mut() = status;
    res
}

/// If `headers` carry `grpc-status: 1` (CANCELLED) although the call's budget had run out,
/// rewrites it to 4 (DEADLINE_EXCEEDED): a callee or transport that enforces `grpc-timeout`
/// by itself (tonic does) reports expiry as CANCELLED.
pub(crate) fn fix_expired_status(headers: &mut HeaderMap) {
    if headers
        .get(GRPC_STATUS)
        .is_some_and(|v| v.as_bytes() == b"1")
    {
        headers.insert(
            GRPC_STATUS,
            HeaderValue::from(GrpcCode::DeadlineExceeded as u16),
        );
    }
}

/// gRPC's `grpc-message` encoding: percent-encode everything outside printable ASCII, and
/// `%` itself.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(percent_encode("a%b é\n"), "a%25b %C3%A9%0A");
    }

    #[test]
    fn grpc_content_types() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(!is_grpc(&h));
    }
}
