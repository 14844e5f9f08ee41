//! The crate's errors as answers: one table for the axum and the tonic conversions, the one of
//! the server layer (see the [`tower`](crate::integrations::tower) module docs).
//!
//! | error says | HTTP | gRPC | text |
//! |---|---|---|---|
//! | a deadline passed (also a stream's idle timeout, a retry out of time) | 504 | `DEADLINE_EXCEEDED` | `deadline exceeded` |
//! | too little budget left to start | 504 | `DEADLINE_EXCEEDED` | `budget exhausted` |
//! | a budget header is malformed or over a rejecting maximum | 400 | `INVALID_ARGUMENT` | the header's fixed text |
//! | cancelled, closed, a shutdown, a server that admits no one | 503 | `UNAVAILABLE` | `service unavailable` |
//! | a request of a cancelled operation (the operation registry's refusal) | 409 | `ABORTED` | `operation cancelled` |
//! | the client went away | 499 | `CANCELLED` | `client gone` |
//! | a dependency failed (transport, a retry that gave up, a required fan-out branch) | 502 | `UNAVAILABLE` | `bad gateway` |
//! | an effect whose outcome is unknown (a retry stopped so, a cut-off `COMMIT`) | 500 | `UNKNOWN` | `effect unknown` |
//! | a panic, a call made outside any scope, a database error | 500 | `INTERNAL` | `internal error` |
//!
//! Texts are fixed, as the layer's own answers are: an error's `Display` may carry internal
//! detail (a cancel's reason, a header's value, a database message) and is not sent.
//!
//! Every answer but the caller's own mistakes (400) also says `service-effect` (see
//! [`wire::service_effect`](crate::wire::service_effect)): `unknown` for an unknown effect,
//! otherwise whether a child that may have had an effect was dispatched in the current
//! request (the scope current where the error is converted, an admitted request's) — and then
//! a 503 / `UNAVAILABLE` becomes 500 / `UNKNOWN`, so that the caller does not retry it as
//! "nothing happened".

use http::StatusCode;

use crate::wire::ServiceEffect;
use crate::Scope;

/// What an error says, as an answer (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Said {
    DeadlineExceeded,
    BudgetExhausted,
    Invalid(&'static str),
    Unavailable,
    OperationCancelled,
    ClientGone,
    BadGateway,
    EffectUnknown,
    Internal,
}

impl Said {
    /// What a scope's error says.
    pub(crate) fn of_error(e: &crate::Error) -> Said {
        if e.is_panic() {
            Said::Internal
        } else if e.is_budget_exhausted() {
            Said::BudgetExhausted
        } else if e.is_deadline_exceeded() || e.is_idle_timeout() {
            Said::DeadlineExceeded
        } else if e.is_client_gone() {
            Said::ClientGone
        } else {
            Said::Unavailable
        }
    }

    /// HTTP status, gRPC code, fixed text.
    pub(crate) fn answer(self) -> (StatusCode, u16, &'static str) {
        match self {
            Said::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, 4, "deadline exceeded"),
            Said::BudgetExhausted => (StatusCode::GATEWAY_TIMEOUT, 4, "budget exhausted"),
            Said::Invalid(text) => (StatusCode::BAD_REQUEST, 3, text),
            Said::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, 14, "service unavailable"),
            Said::OperationCancelled => (StatusCode::CONFLICT, 10, "operation cancelled"),
            Said::ClientGone => (
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
                1,
                "client gone",
            ),
            Said::BadGateway => (StatusCode::BAD_GATEWAY, 14, "bad gateway"),
            Said::EffectUnknown => (StatusCode::INTERNAL_SERVER_ERROR, 2, "effect unknown"),
            Said::Internal => (StatusCode::INTERNAL_SERVER_ERROR, 13, "internal error"),
        }
    }

    /// The answer with what it says of the request's effects: `None` for a caller's mistake.
    /// A stop of the server's own after a possibly effectful dispatch in the current request
    /// is `UNKNOWN` / 500, not `UNAVAILABLE` / 503 (nor 502, which callers retry too).
    pub(crate) fn resolve(self) -> (StatusCode, u16, &'static str, Option<ServiceEffect>) {
        if let Said::Invalid(_) = self {
            let (http, grpc, text) = self.answer();
            return (http, grpc, text, None);
        }
        let dispatched = Scope::try_current()
            .and_then(|s| s.effect_flag().map(|f| f.is_set()))
            .unwrap_or(false);
        let effect = match self {
            Said::EffectUnknown => ServiceEffect::Unknown,
            _ => ServiceEffect::from_dispatched(dispatched),
        };
        let said = match self {
            Said::Unavailable | Said::BadGateway if effect.is_unknown() => Said::EffectUnknown,
            s => s,
        };
        let (http, grpc, text) = said.answer();
        (http, grpc, text, Some(effect))
    }
}

/// What a client call's error says.
#[cfg(any(feature = "tower", feature = "reqwest"))]
pub(crate) fn of_call(e: &crate::integrations::CallError) -> Said {
    if e.is_no_scope() {
        Said::Internal
    } else if e.is_budget_exhausted() {
        Said::BudgetExhausted
    } else if e.is_deadline_exceeded() {
        Said::DeadlineExceeded
    } else if e.is_transport() {
        Said::BadGateway
    } else if e.cause().is_some_and(crate::Cause::is_client_gone) {
        Said::ClientGone
    } else {
        Said::Unavailable
    }
}

/// What an admission's refusal says.
pub(crate) fn of_admission(e: &crate::wire::AdmissionError) -> Said {
    if e.is_unavailable() {
        Said::Unavailable
    } else if e.is_operation_cancelled() {
        Said::OperationCancelled
    } else if e.is_budget_exhausted() {
        Said::BudgetExhausted
    } else {
        Said::Invalid(e.public_message())
    }
}

/// What a retry that gave up says.
pub(crate) fn of_retry<E>(e: &crate::retry::RetryError<E>) -> Said {
    use crate::retry::Stop;
    match e.stop() {
        Stop::EffectUnknown => Said::EffectUnknown,
        _ if e.is_deadline_exceeded() || e.is_budget_exhausted() => Said::DeadlineExceeded,
        _ if e.is_cancelled() => match e.cause() {
            Some(c) if c.is_client_gone() => Said::ClientGone,
            Some(c) if c.is_deadline_exceeded() => Said::DeadlineExceeded,
            _ => Said::Unavailable,
        },
        _ => Said::BadGateway,
    }
}

/// What a fan-out that failed says.
pub(crate) fn of_fanout(e: &crate::fanout::FanOutError) -> Said {
    if e.is_deadline_exceeded() {
        Said::DeadlineExceeded
    } else if e.is_cancelled() {
        match e.cause() {
            Some(c) if c.is_client_gone() => Said::ClientGone,
            _ => Said::Unavailable,
        }
    } else {
        Said::BadGateway
    }
}

/// What a guarded database call's error says.
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) fn of_sqlx(e: &crate::integrations::sqlx::Error) -> Said {
    if e.is_effect_unknown() {
        Said::EffectUnknown
    } else if e.is_budget_exhausted() {
        Said::BudgetExhausted
    } else if e.is_deadline_exceeded() {
        Said::DeadlineExceeded
    } else if e.is_cancelled() || e.is_closed() {
        Said::Unavailable
    } else {
        Said::Internal
    }
}
