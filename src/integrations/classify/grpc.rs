//! The gRPC classifier.

use http::{HeaderMap, StatusCode};

use super::hint::{pushback, Pushback};
use super::unanswered;
use crate::integrations::{is_effect_unknown, CallError};
use crate::retry::{Classify, Decision};

const CANCELLED: i32 = 1;
const UNKNOWN: i32 = 2;
const DEADLINE_EXCEEDED: i32 = 4;
const PERMISSION_DENIED: i32 = 7;
const RESOURCE_EXHAUSTED: i32 = 8;
const UNIMPLEMENTED: i32 = 12;
const INTERNAL: i32 = 13;
const UNAVAILABLE: i32 = 14;
const UNAUTHENTICATED: i32 = 16;

/// Classifies the errors of gRPC calls by the table of [the module docs](super#grpc-grpcclassifier):
/// `UNAVAILABLE` and `RESOURCE_EXHAUSTED` retried after the server's pushback as answers that
/// may have had their effect, `DEADLINE_EXCEEDED` and `CANCELLED` retried as unknown, every
/// other status never; a pushback that says not to retry is obeyed.
///
/// A [`Classify`] for `tonic::Status` (feature `tonic`: its code and metadata, where tonic puts
/// the trailers; a status whose source is a [`CallError`] is judged by it: a connection that
/// could not be made is retried on another endpoint) and for [`CallError`] (a call with no
/// answer as the HTTP table says; an answer refused with an HTTP status, by
/// [`answer`](Self::answer)). For an error type of your own, call [`status`](Self::status)
/// with the code and trailers.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use cancel_scope::integrations::classify::GrpcClassifier;
/// use cancel_scope::retry::Decision;
///
/// let mut trailers = HeaderMap::new();
/// trailers.insert("grpc-retry-pushback-ms", "250".parse().unwrap());
/// let grpc = GrpcClassifier::new();
/// assert_eq!(grpc.status(14, &trailers), Decision::EffectUnknownAfter(Duration::from_millis(250)));
/// assert_eq!(grpc.status(5, &trailers), Decision::Never); // NOT_FOUND
/// trailers.insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
/// assert_eq!(grpc.status(14, &trailers), Decision::Never); // the server said: do not retry
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcClassifier {
    _private: (),
}

impl GrpcClassifier {
    /// The classifier.
    ///
    /// # Examples
    ///
    /// See [`GrpcClassifier`].
    pub const fn new() -> Self {
        GrpcClassifier { _private: () }
    }

    /// The decision after the call ended with the gRPC status `code` and `trailers` (for a
    /// trailers-only answer, its headers), where the pushback and the server's word that it
    /// had dispatched an effect are read.
    ///
    /// # Examples
    ///
    /// See [`GrpcClassifier`].
    pub fn status(&self, code: i32, trailers: &HeaderMap) -> Decision {
        let dispatched = is_effect_unknown(trailers);
        let retryable = matches!(code, UNAVAILABLE | RESOURCE_EXHAUSTED);
        let unknown = retryable || matches!(code, DEADLINE_EXCEEDED | CANCELLED);
        if code == 0 || !(unknown || dispatched) {
            return Decision::Never;
        }
        match pushback(trailers) {
            Pushback::Refused => Decision::Never,
            Pushback::After(d) => Decision::EffectUnknownAfter(d),
            Pushback::None => Decision::EffectUnknown,
        }
    }

    /// The decision after an answer whose HTTP status is not `200` (a proxy's or a server's
    /// refusal of a gRPC request): its `grpc-status` header if it has one, else the status
    /// gRPC gives that HTTP status ([the gRPC HTTP-to-status table]: 400 `INTERNAL`, 401
    /// `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`, 404 `UNIMPLEMENTED`, 429, 502, 503 and 504
    /// `UNAVAILABLE`, any other `UNKNOWN`), judged with the answer's headers as
    /// [`status`](Self::status) judges trailers. This is how a [`CallError`] with an answer
    /// (`ScopedResponse::error_for_status`) is classified.
    ///
    /// [the gRPC HTTP-to-status table]: https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{HeaderMap, StatusCode};
    /// use cancel_scope::integrations::classify::GrpcClassifier;
    /// use cancel_scope::retry::Decision;
    ///
    /// let grpc = GrpcClassifier::new();
    /// let mut headers = HeaderMap::new();
    /// // A proxy that could not reach the server: UNAVAILABLE, which may have had its effect.
    /// assert_eq!(grpc.answer(StatusCode::BAD_GATEWAY, &headers), Decision::EffectUnknown);
    /// assert_eq!(grpc.answer(StatusCode::NOT_FOUND, &headers), Decision::Never); // UNIMPLEMENTED
    /// headers.insert("grpc-retry-pushback-ms", "40".parse().unwrap());
    /// assert_eq!(
    ///     grpc.answer(StatusCode::TOO_MANY_REQUESTS, &headers),
    ///     Decision::EffectUnknownAfter(Duration::from_millis(40)),
    /// );
    /// // A status the answer states itself wins over the HTTP one.
    /// headers.insert("grpc-status", "5".parse().unwrap()); // NOT_FOUND
    /// assert_eq!(grpc.answer(StatusCode::SERVICE_UNAVAILABLE, &headers), Decision::Never);
    /// ```
    pub fn answer(&self, status: StatusCode, headers: &HeaderMap) -> Decision {
        let stated = headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i32>().ok());
        let code = stated.unwrap_or(match status.as_u16() {
            400 => INTERNAL,
            401 => UNAUTHENTICATED,
            403 => PERMISSION_DENIED,
            404 => UNIMPLEMENTED,
            429 | 502 | 503 | 504 => UNAVAILABLE,
            _ => UNKNOWN,
        });
        self.status(code, headers)
    }
}

impl Classify<CallError> for GrpcClassifier {
    fn classify(&self, e: &CallError) -> Decision {
        if let Some(d) = unanswered(e) {
            return d;
        }
        match (e.status(), e.response_headers()) {
            (Some(status), Some(headers)) => self.answer(status, headers),
            _ => Decision::Never,
        }
    }
}

#[cfg(feature = "tonic")]
impl Classify<tonic::Status> for GrpcClassifier {
    fn classify(&self, status: &tonic::Status) -> Decision {
        // A status tonic made of a failure of ours (`Propagate`'s, under the channel).
        let mut source = std::error::Error::source(status);
        while let Some(e) = source {
            if let Some(call) = e.downcast_ref::<CallError>() {
                if let Some(d) = unanswered(call) {
                    return d;
                }
            }
            source = e.source();
        }
        let trailers = status.metadata().clone().into_headers();
        self.status(status.code() as i32, &trailers)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::header::{HeaderName, HeaderValue};

    use super::*;

    const SERVICE_EFFECT: HeaderName = HeaderName::from_static("service-effect");
    use crate::integrations::classify::hint::GRPC_RETRY_PUSHBACK_MS;

    fn decide(code: i32, headers: &[(&HeaderName, &str)]) -> Decision {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        GrpcClassifier::new().status(code, &h)
    }

    #[test]
    fn the_grpc_table() {
        use Decision::*;
        let push = [(&GRPC_RETRY_PUSHBACK_MS, "40")];
        let refuse = [(&GRPC_RETRY_PUSHBACK_MS, "-1")];
        let dispatched = [(&SERVICE_EFFECT, "unknown")];
        let after = EffectUnknownAfter(Duration::from_millis(40));
        for (code, headers, want) in [
            (UNAVAILABLE, &[][..], EffectUnknown),
            (UNAVAILABLE, &push[..], after),
            (UNAVAILABLE, &refuse[..], Never),
            (RESOURCE_EXHAUSTED, &[][..], EffectUnknown),
            (RESOURCE_EXHAUSTED, &push[..], after),
            (DEADLINE_EXCEEDED, &[][..], EffectUnknown),
            (CANCELLED, &[][..], EffectUnknown),
            (0, &push[..], Never),
            (2, &[][..], Never),                 // UNKNOWN
            (3, &push[..], Never),               // INVALID_ARGUMENT
            (5, &[][..], Never),                 // NOT_FOUND
            (10, &[][..], Never),                // ABORTED
            (13, &[][..], Never),                // INTERNAL
            (99, &[][..], Never),                // a code gRPC does not define
            (2, &dispatched[..], EffectUnknown), // a server stopped after dispatching an effect
            (13, &dispatched[..], EffectUnknown),
        ] {
            assert_eq!(decide(code, headers), want, "{code} {headers:?}");
        }
    }

    /// An answer refused with an HTTP status, as a `CallError` carries it: its own
    /// `grpc-status` if it has one, else gRPC's mapping of the HTTP status, then the table.
    #[test]
    fn a_call_error_with_an_answer_is_judged_by_its_status() {
        use Decision::*;
        let judge = |status: u16, headers: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in headers {
                h.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            let e = CallError::answered(StatusCode::from_u16(status).unwrap(), h, None);
            GrpcClassifier::new().classify(&e)
        };
        let push = ("grpc-retry-pushback-ms", "40");
        let after = EffectUnknownAfter(Duration::from_millis(40));
        for (status, headers, want) in [
            (503, &[][..], EffectUnknown),
            (502, &[][..], EffectUnknown),
            (504, &[][..], EffectUnknown),
            (429, &[push][..], after),
            (400, &[][..], Never),                           // INTERNAL
            (401, &[][..], Never),                           // UNAUTHENTICATED
            (403, &[][..], Never),                           // PERMISSION_DENIED
            (404, &[][..], Never),                           // UNIMPLEMENTED
            (500, &[][..], Never),                           // UNKNOWN
            (503, &[("grpc-status", "5")][..], Never),       // its own NOT_FOUND wins
            (500, &[("grpc-status", "8"), push][..], after), // RESOURCE_EXHAUSTED
            (500, &[("service-effect", "unknown")][..], EffectUnknown),
        ] {
            assert_eq!(judge(status, headers), want, "{status} {headers:?}");
        }
    }
}
