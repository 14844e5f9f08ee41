//! How an outgoing call ended: its receipt from what the callee answered and from what the
//! call may have done. The one table both client integrations use.
//!
//! | answer | read-only call | call that may have had an effect |
//! |---|---|---|
//! | HTTP 1xx, 2xx, 3xx; gRPC `OK` | `Succeeded` | `Succeeded` |
//! | HTTP 4xx; gRPC `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | `Failed` | `Failed`: refused unprocessed (`EffectUnknown` if the call was redirected: the refusal is the last hop's) |
//! | any other status (HTTP 5xx; gRPC `UNKNOWN`, `INTERNAL`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`, …), a gRPC response without a status | `Failed` | `EffectUnknown` |
//! | no answer: the transport failed | `Failed` | `EffectUnknown` |
//! | no answer: stopped by the call's scope (deadline, cancel) or dropped | `Cancelled` | `EffectUnknown` |
//!
//! An answer that came before the body was cut keeps its say: a call refused with a 4xx whose
//! body is then cut is `Failed`, a read-only call answered 500 is `Failed`. The status of an
//! answer is kept in the `EffectUnknown` record ([`EffectRecord::status_str`]), with where a
//! redirect took the call ([`EffectRecord::redirected_to_str`]).
//!
//! # What the callee says of its own effects
//!
//! A server of this library that stopped a request itself says beside the status whether the
//! request had dispatched a call that may have had an effect: `service-effect: unknown` or
//! `none` (see [`wire::service_effect`](crate::wire::service_effect); in the head of the
//! answer, or in the trailers of a gRPC body it cut). That say can only make a receipt *less*
//! certain: `unknown` turns a `Failed` (a read-only call answered 5xx, an effectful call
//! answered 4xx) into `EffectUnknown` — the callee may have charged a card although the call
//! only read — and `none` never turns an `EffectUnknown` into `Failed` (the handler may have
//! had effects of its own that no scope saw). A success stays a success. The record's status
//! then says so (`HTTP 500, service-effect: unknown`).
//!
//! [`is_effect_unknown`] is the same reading for a retry classifier: an answer that says
//! `unknown` is [`Decision::EffectUnknown`](crate::retry::Decision::EffectUnknown), so
//! side-effecting work never retries it and idempotent work retries it only with its key.

use http::header::{HeaderMap, HeaderName};
use http::StatusCode;

use crate::reconcile::Resolution;
use crate::wire::service_effect::{self, ServiceEffect};
use crate::{Dispatched, EffectRecord, Receipt};

const SERVICE_EFFECT: HeaderName = HeaderName::from_static(service_effect::HEADER);

/// What the `service-effect` header in `headers` (the head of a response, or gRPC trailers)
/// says: `None` if there is none (the callee does not send it), otherwise
/// [`ServiceEffect::Unknown`] unless every line says exactly `none` (see
/// [`wire::service_effect`](crate::wire::service_effect)).
///
/// # Examples
///
/// ```
/// use cancel_scope::integrations::service_effect_in;
/// use cancel_scope::wire::ServiceEffect;
/// let mut headers = http::HeaderMap::new();
/// assert_eq!(service_effect_in(&headers), None);
/// headers.insert("service-effect", "unknown".parse().unwrap());
/// assert_eq!(service_effect_in(&headers), Some(ServiceEffect::Unknown));
/// ```
pub fn service_effect_in(headers: &HeaderMap) -> Option<ServiceEffect> {
    ServiceEffect::from_lines(headers.get_all(SERVICE_EFFECT).iter().map(|v| v.as_bytes()))
}

/// Whether an answer's headers (or gRPC trailers) say that the request the callee stopped may
/// have had an effect (`service-effect: unknown`, or any value but `none`): the predicate a
/// retry classifier uses, for which such an answer is
/// [`Decision::EffectUnknown`](crate::retry::Decision::EffectUnknown) whatever its status —
/// side-effecting work then never retries, idempotent work retries only with its key. The
/// receipts of this library's client layers read it the same way (see the
/// [`integrations`](crate::integrations) docs).
///
/// A foreign server sends no such header: this is then `false`, and the status decides alone.
///
/// # Examples
///
/// A classifier for HTTP answers (`status`, `headers`) that honours the header:
///
/// ```
/// use cancel_scope::integrations::is_effect_unknown;
/// use cancel_scope::retry::Decision;
/// use http::{HeaderMap, StatusCode};
///
/// fn classify((status, headers): &(StatusCode, HeaderMap)) -> Decision {
///     if is_effect_unknown(headers) {
///         return Decision::EffectUnknown; // the server stopped after a write went out
///     }
///     match status.as_u16() {
///         429 | 503 => Decision::Backoff,
///         500..=599 => Decision::EffectUnknown,
///         _ => Decision::Never,
///     }
/// }
///
/// let mut stopped = HeaderMap::new();
/// stopped.insert("service-effect", "unknown".parse().unwrap());
/// assert_eq!(classify(&(StatusCode::INTERNAL_SERVER_ERROR, stopped)), Decision::EffectUnknown);
/// let mut nothing_done = HeaderMap::new();
/// nothing_done.insert("service-effect", "none".parse().unwrap());
/// assert_eq!(classify(&(StatusCode::SERVICE_UNAVAILABLE, nothing_done)), Decision::Backoff);
/// ```
pub fn is_effect_unknown(headers: &HeaderMap) -> bool {
    service_effect_in(headers).is_some_and(ServiceEffect::is_unknown)
}

/// Merges what two places of one answer (its head, its trailers) say: `unknown` wins.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) fn said_effect(
    a: Option<ServiceEffect>,
    b: Option<ServiceEffect>,
) -> Option<ServiceEffect> {
    match (a, b) {
        (Some(ServiceEffect::Unknown), _) | (_, Some(ServiceEffect::Unknown)) => {
            Some(ServiceEffect::Unknown)
        }
        (a, b) => a.or(b),
    }
}

#[cfg_attr(not(feature = "tower"), allow(dead_code))]
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// What the callee said about the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "tower"), allow(dead_code))] // gRPC: the tower client only
pub(crate) enum Answer {
    /// An HTTP status (of a gRPC call too, when it came without a `grpc-status`).
    Http(StatusCode),
    /// A gRPC status code.
    Grpc(u32),
    /// A gRPC response that ended without a `grpc-status`.
    GrpcMissing,
}

/// The gRPC codes that say the request was refused before it was processed.
const REFUSED: [u32; 8] = [3, 5, 6, 7, 9, 11, 12, 16];

/// gRPC `CANCELLED` and `DEADLINE_EXCEEDED`.
#[cfg(feature = "tower")]
pub(crate) const GRPC_CANCELLED: u32 = 1;
#[cfg(feature = "tower")]
pub(crate) const GRPC_DEADLINE_EXCEEDED: u32 = 4;

impl Answer {
    /// The `grpc-status` in `headers` (trailers, or the head of a trailers-only response). A
    /// value that is not a number is `UNKNOWN`, as gRPC clients read it.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn grpc_in(headers: &HeaderMap) -> Option<Answer> {
        let v = headers.get(GRPC_STATUS)?;
        let code = std::str::from_utf8(v.as_bytes())
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(2);
        Some(Answer::Grpc(code))
    }

    fn succeeded(self) -> bool {
        match self {
            Answer::Http(s) => s.as_u16() < 400,
            Answer::Grpc(code) => code == 0,
            Answer::GrpcMissing => false,
        }
    }

    /// The request was refused unprocessed.
    fn refused(self) -> bool {
        match self {
            Answer::Http(s) => s.is_client_error(),
            Answer::Grpc(code) => REFUSED.contains(&code),
            Answer::GrpcMissing => false,
        }
    }

    /// How a record shows it: `HTTP 503`, `gRPC UNAVAILABLE`.
    fn describe(self) -> String {
        match self {
            Answer::Http(s) => format!("HTTP {}", s.as_u16()),
            Answer::Grpc(code) => match crate::telemetry::GRPC_NAMES.get(code as usize) {
                Some(name) => format!("gRPC {name}"),
                None => format!("gRPC {code}"),
            },
            Answer::GrpcMissing => "gRPC status missing".to_owned(),
        }
    }
}

/// How the exchange of a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The whole answer was read: its status (for gRPC, the one in the trailers).
    Answered(Answer),
    /// The transport failed before the end.
    Failed,
    /// The call's scope stopped it (deadline, cancel), or it was dropped, before the end.
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Succeeded,
    Failed,
    Unknown,
}

/// The verdict of `answer`; `server_unknown`: the callee said `service-effect: unknown`,
/// which turns a failure into an unknown effect (never a success into anything else).
fn verdict(answer: Answer, effectful: bool, redirected: bool, server_unknown: bool) -> Verdict {
    if answer.succeeded() {
        Verdict::Succeeded
    } else if server_unknown {
        Verdict::Unknown
    } else if !effectful || (answer.refused() && !redirected) {
        Verdict::Failed
    } else {
        Verdict::Unknown
    }
}

/// Gives `call` its receipt for `end` (see the [module docs](self)). `head`: what the response
/// head already said (an HTTP status; for gRPC, a trailers-only status or an HTTP error
/// status). `redirected_to`: where a followed redirect took the call. `server`: what the
/// callee said of its effects (`service-effect`, in the head or the trailers).
pub(crate) fn receipt(
    call: Dispatched,
    end: End,
    head: Option<Answer>,
    redirected_to: Option<&str>,
    server: Option<ServiceEffect>,
) -> Option<Resolution> {
    let effectful = call.spec().effect().may_have_effect();
    let redirected = redirected_to.is_some();
    let server_unknown = server.is_some_and(ServiceEffect::is_unknown);
    let judge = |a| verdict(a, effectful, redirected, server_unknown);
    let said = match end {
        End::Answered(answer) => Some((answer, judge(answer))),
        End::Failed | End::Stopped => head
            .map(|a| (a, judge(a)))
            // An answer that the cut or failure came after keeps its say, unless it said all
            // was well: the rest of the exchange did not happen.
            .filter(|(_, v)| *v != Verdict::Succeeded),
    };
    // What the receipt says of the call's intent, if it was journaled: applied, not applied,
    // or (`None`) unknown, to reconcile.
    match said {
        Some((_, Verdict::Succeeded)) => {
            call.succeed();
            Some(Resolution::Applied)
        }
        Some((_, Verdict::Failed)) => {
            call.fail();
            Some(Resolution::NotApplied)
        }
        Some((answer, Verdict::Unknown)) => {
            unknown(call, Some(answer), redirected_to, server_unknown);
            None
        }
        None if effectful || (server_unknown && end == End::Failed) => {
            unknown(call, head, redirected_to, server_unknown);
            None
        }
        None if end == End::Failed => {
            call.fail();
            Some(Resolution::NotApplied)
        }
        // Stopped: `Cancelled` by the drop (`Failed` while unwinding).
        None => {
            drop(call);
            Some(Resolution::NotApplied)
        }
    }
}

fn unknown(
    call: Dispatched,
    answer: Option<Answer>,
    redirected_to: Option<&str>,
    server_unknown: bool,
) {
    let spec = call.spec();
    let mut record = spec
        .effect_record()
        .cloned()
        .unwrap_or_else(|| EffectRecord::new(spec.name()));
    match (answer, server_unknown) {
        (Some(a), true) => {
            record = record.status(format!("{}, service-effect: unknown", a.describe()))
        }
        (Some(a), false) => record = record.status(a.describe()),
        (None, true) => record = record.status("service-effect: unknown"),
        (None, false) => {}
    }
    if let Some(to) = redirected_to {
        record = record.redirected_to(to);
    }
    call.finish(Receipt::EffectUnknown(record));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChildSpec, Scope};

    /// The receipt `end` gives a call of `spec`: `s`ucceeded, `f`ailed, `c`ancelled or
    /// `u`nknown with the status its record keeps.
    fn receipt_of(spec: &ChildSpec, end: End, head: Option<Answer>, to: Option<&str>) -> String {
        let scope = Scope::new();
        let d = scope.register(spec.clone()).unwrap().dispatch().unwrap();
        receipt(d, end, head, to, None);
        scope.close();
        // Quiet at once: the one child has its receipt.
        assert!(scope.lifecycle().is_final());
        let r = scope.report();
        match (r.succeeded(), r.failed(), r.cancelled(), r.effect_unknown()) {
            (1, 0, 0, 0) => "s".to_owned(),
            (0, 1, 0, 0) => "f".to_owned(),
            (0, 0, 1, 0) => "c".to_owned(),
            (0, 0, 0, 1) => match r.pending_effects()[0].status_str() {
                Some(status) => format!("u {status}"),
                None => "u".to_owned(),
            },
            _ => format!("? {r}"),
        }
    }

    fn http(code: u16) -> Option<Answer> {
        Some(Answer::Http(StatusCode::from_u16(code).unwrap()))
    }

    #[test]
    fn the_table() {
        let (r, w) = (
            ChildSpec::read_only("get"),
            ChildSpec::side_effecting("post", "p"),
        );
        let (grpc, missing) = (Answer::Grpc, Answer::GrpcMissing);
        let redirected = Some("http://b/");
        use End::{Answered as A, Failed as F, Stopped as S};
        let answered = |a: Option<Answer>| A(a.unwrap());
        for (spec, end, head, to, want) in [
            (&r, answered(http(200)), http(200), None, "s"),
            (&r, answered(http(302)), http(302), None, "s"),
            (&r, answered(http(503)), http(503), None, "f"),
            (&r, answered(http(404)), http(404), None, "f"),
            (&w, answered(http(201)), http(201), None, "s"),
            (&w, answered(http(409)), http(409), None, "f"),
            (&w, answered(http(500)), http(500), None, "u HTTP 500"),
            // A refusal after a redirect is the last hop's: the first may have done it.
            (&w, answered(http(404)), http(404), redirected, "u HTTP 404"),
            (&r, A(grpc(0)), None, None, "s"),
            (&r, A(grpc(14)), None, None, "f"),
            (&w, A(grpc(5)), None, None, "f"),
            (&w, A(grpc(16)), None, None, "f"),
            (&w, A(grpc(4)), None, None, "u gRPC DEADLINE_EXCEEDED"),
            (&w, A(grpc(99)), None, None, "u gRPC 99"),
            (&w, A(missing), None, None, "u gRPC status missing"),
            (&r, A(missing), None, None, "f"),
            // Cut or failed after the head, or with no answer at all.
            (&r, S, http(200), None, "c"),
            (&r, S, http(500), None, "f"),
            (&r, F, http(200), None, "f"),
            (&w, S, http(200), None, "u HTTP 200"),
            (&w, S, http(400), None, "f"),
            (&w, F, http(502), None, "u HTTP 502"),
            (&w, S, None, None, "u"),
            (&r, S, None, None, "c"),
            (&r, F, None, None, "f"),
            (&w, F, None, None, "u"),
        ] {
            let what = format!("{:?} {end:?} after {head:?}", spec.effect());
            assert_eq!(receipt_of(spec, end, head, to), want, "{what}");
        }
    }

    /// The callee's `service-effect: unknown` turns a failure into an unknown effect, for a
    /// read-only call too; `none` changes nothing; a success stays one.
    #[test]
    fn the_callee_can_only_make_a_receipt_less_certain() {
        let (r, w) = (
            ChildSpec::read_only("get"),
            ChildSpec::side_effecting("post", "p"),
        );
        let of = |spec: &ChildSpec, end: End, head: Option<Answer>, said: ServiceEffect| {
            let scope = Scope::new();
            let d = scope.register(spec.clone()).unwrap().dispatch().unwrap();
            receipt(d, end, head, None, Some(said));
            scope.close();
            let r = scope.report();
            match (r.succeeded(), r.failed(), r.cancelled(), r.effect_unknown()) {
                (1, 0, 0, 0) => "s".to_owned(),
                (0, 1, 0, 0) => "f".to_owned(),
                (0, 0, 1, 0) => "c".to_owned(),
                (0, 0, 0, 1) => format!("u {}", r.pending_effects()[0].status_str().unwrap_or("")),
                _ => format!("? {r}"),
            }
        };
        let (unknown, none) = (ServiceEffect::Unknown, ServiceEffect::None);
        let a = |code: u16| End::Answered(http(code).unwrap());
        assert_eq!(
            of(&r, a(503), http(503), unknown),
            "u HTTP 503, service-effect: unknown"
        );
        assert_eq!(of(&r, a(503), http(503), none), "f");
        assert_eq!(
            of(&w, a(409), http(409), unknown),
            "u HTTP 409, service-effect: unknown"
        );
        assert_eq!(of(&w, a(409), http(409), none), "f");
        assert_eq!(of(&w, a(500), http(500), none), "u HTTP 500");
        assert_eq!(of(&r, a(200), http(200), unknown), "s");
        let g = |code| End::Answered(Answer::Grpc(code));
        assert_eq!(
            of(&r, g(14), None, unknown),
            "u gRPC UNAVAILABLE, service-effect: unknown"
        );
        assert_eq!(of(&r, g(14), None, none), "f");
        assert_eq!(
            of(&r, End::Failed, None, unknown),
            "u service-effect: unknown"
        );
        assert_eq!(of(&r, End::Stopped, None, unknown), "c");
    }

    #[test]
    fn the_service_effect_header_is_read_conservatively() {
        let mut h = HeaderMap::new();
        assert_eq!(service_effect_in(&h), None);
        assert!(!is_effect_unknown(&h));
        h.append(SERVICE_EFFECT, "none".parse().unwrap());
        assert_eq!(service_effect_in(&h), Some(ServiceEffect::None));
        h.append(SERVICE_EFFECT, "bogus".parse().unwrap());
        assert!(is_effect_unknown(&h));
        assert_eq!(
            said_effect(Some(ServiceEffect::None), Some(ServiceEffect::Unknown)),
            Some(ServiceEffect::Unknown)
        );
        assert_eq!(
            said_effect(None, Some(ServiceEffect::None)),
            Some(ServiceEffect::None)
        );
    }

    #[test]
    fn grpc_status_is_read_from_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(Answer::grpc_in(&h), None);
        h.insert(GRPC_STATUS, "14".parse().unwrap());
        assert_eq!(Answer::grpc_in(&h), Some(Answer::Grpc(14)));
        h.insert(GRPC_STATUS, "garbage".parse().unwrap());
        assert_eq!(Answer::grpc_in(&h), Some(Answer::Grpc(2)));
    }
}
