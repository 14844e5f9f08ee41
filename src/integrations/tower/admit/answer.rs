//! The layer's own answers: a refusal at admission, and the answer for a request that stopped
//! before its handler answered or while its body was sent.
//!
//! A caller that the policy does not show the detail
//! ([`EndpointPolicyBuilder::error_detail`](crate::wire::EndpointPolicyBuilder::error_detail)) gets one
//! fixed text per kind of answer, in the HTTP body or in `grpc-message`: no numbers, no header
//! values, no cancel reasons (an operator's `cancel_with("…")` or a panic's message is
//! internal). The detail goes to the layer's callbacks
//! ([`on_refusal`](super::AdmitLayer::on_refusal), [`on_report`](super::AdmitLayer::on_report)).

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use super::body::ResponseBody;
use crate::integrations::tower::headers::{self, GrpcCode};
use crate::wire::{AdmissionError, ServiceEffect};
use crate::Cause;

/// The text of the answer for a request stopped by its deadline.
const DEADLINE_EXCEEDED: &str = "deadline exceeded";
/// ... by the server (a cancel, a shutdown, a handler that panicked).
const UNAVAILABLE: &str = "service unavailable";
/// ... by its client going away (the answer goes to nobody; it is for logs).
const CLIENT_GONE: &str = "client gone";
/// ... by its handler's panic.
const INTERNAL: &str = "internal error";

/// gRPC's `Retry-After` (gRFC A6): how long a client's retry policy waits before it retries.
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// How the layer answers one request.
#[derive(Clone, Copy, Debug)]
pub(super) struct Answers {
    /// The request speaks gRPC: answers are trailers-only responses, and a cut body ends with
    /// trailers.
    pub(super) grpc: bool,
    /// The caller is shown the detail.
    pub(super) detail: bool,
    /// The `Retry-After` of the answers a server's shutdown gives (refused, or cancelled with
    /// nothing possibly effectful dispatched); `None` outside a server.
    pub(super) retry_after: Option<Duration>,
}

impl Answers {
    /// The answer refusing a request that `e` says was not admitted: HTTP 400 / gRPC
    /// `INVALID_ARGUMENT`, 504 / `DEADLINE_EXCEEDED` when too little budget was left, 503 /
    /// `UNAVAILABLE` from a server shutting down, 409 / `ABORTED` for a cancelled operation.
    pub(super) fn refusal<B>(self, e: &AdmissionError) -> Response<ResponseBody<B>> {
        let text = self.text(e.public_message(), || e.to_string());
        // Refusals of requests that had nothing done for them, and say so.
        let unprocessed = if e.is_unavailable() {
            // The server's shutdown began: another instance can take it.
            Some((GrpcCode::Unavailable, StatusCode::SERVICE_UNAVAILABLE, true))
        } else if e.is_operation_cancelled() {
            // The operation was cancelled: a retry under it is refused again.
            Some((GrpcCode::Aborted, StatusCode::CONFLICT, false))
        } else {
            None
        };
        if let Some((code, status, retry_hint)) = unprocessed {
            let mut res = if self.grpc {
                grpc(code, &text)
            } else {
                http(status, text)
            };
            headers::insert_effect(res.headers_mut(), ServiceEffect::None);
            if retry_hint {
                self.retry_hint(res.headers_mut());
            }
            return res;
        }
        match (self.grpc, e.is_budget_exhausted()) {
            (true, true) => grpc(GrpcCode::DeadlineExceeded, &text),
            (true, false) => grpc(GrpcCode::InvalidArgument, &text),
            (false, true) => http(StatusCode::GATEWAY_TIMEOUT, text),
            (false, false) => http(StatusCode::BAD_REQUEST, text),
        }
    }

    /// The answer for a request whose handler panicked before it answered: HTTP 500 / gRPC
    /// `INTERNAL`, with `service-effect` as for [`stopped`](Self::stopped) (the panic's
    /// message is internal: it goes to the report, never to the caller).
    pub(super) fn panicked<B>(self, effect: ServiceEffect) -> Response<ResponseBody<B>> {
        let mut res = if self.grpc {
            grpc(GrpcCode::Internal, INTERNAL)
        } else {
            http(StatusCode::INTERNAL_SERVER_ERROR, Cow::Borrowed(INTERNAL))
        };
        headers::insert_effect(res.headers_mut(), effect);
        res
    }

    /// Puts the server's `Retry-After` (HTTP, whole seconds rounded up) or
    /// `grpc-retry-pushback-ms` (gRPC) in `headers`, if the request came through a server.
    fn retry_hint(self, headers: &mut HeaderMap) {
        let Some(after) = self.retry_after else {
            return;
        };
        if self.grpc {
            let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        } else {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
    }

    /// The answer for a request whose scope stopped with `cause` before the handler answered;
    /// `effect`: whether a child that may have had an effect was dispatched in it (read after
    /// the scope's cancel, see `Scope::cancel_then_effect`), said in the status and in the
    /// `service-effect` header.
    pub(super) fn stopped<B>(
        self,
        cause: &Cause,
        effect: ServiceEffect,
    ) -> Response<ResponseBody<B>> {
        let text = self.cause_text(cause);
        let mut res = if self.grpc {
            grpc(headers::grpc_code_of(cause, effect), &text)
        } else {
            http(headers::http_status_of(cause, effect), text)
        };
        headers::insert_effect(res.headers_mut(), effect);
        if cause.is_shutdown() && !effect.is_unknown() {
            self.retry_hint(res.headers_mut());
        }
        res
    }

    /// The trailers that end a gRPC body whose request's scope stopped with `cause` (`effect`
    /// as for [`stopped`](Self::stopped)).
    pub(super) fn cut_trailers(self, cause: &Cause, effect: ServiceEffect) -> HeaderMap {
        let code = headers::grpc_code_of(cause, effect);
        let mut trailers = headers::grpc_status_headers(code, &self.cause_text(cause));
        headers::insert_effect(&mut trailers, effect);
        if cause.is_shutdown() && !effect.is_unknown() {
            self.retry_hint(&mut trailers);
        }
        trailers
    }

    fn cause_text(self, cause: &Cause) -> Cow<'static, str> {
        let fixed = match cause.origin() {
            Cause::DeadlineExceeded => DEADLINE_EXCEEDED,
            Cause::ClientGone => CLIENT_GONE,
            _ => UNAVAILABLE,
        };
        self.text(fixed, || cause.to_string())
    }

    fn text(self, fixed: &'static str, detail: impl FnOnce() -> String) -> Cow<'static, str> {
        if self.detail {
            Cow::Owned(detail())
        } else {
            Cow::Borrowed(fixed)
        }
    }
}

/// A trailers-only gRPC answer.
fn grpc<B>(code: GrpcCode, text: &str) -> Response<ResponseBody<B>> {
    headers::grpc_response(code, text, ResponseBody::empty())
}

/// An HTTP answer whose body is `text`.
fn http<B>(status: StatusCode, text: Cow<'static, str>) -> Response<ResponseBody<B>> {
    let bytes = match text {
        Cow::Borrowed(s) => Bytes::from_static(s.as_bytes()),
        Cow::Owned(s) => Bytes::from(s),
    };
    let mut res = headers::http_response(status, ResponseBody::text(bytes));
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}
