//! tonic conveniences (feature `tonic`, which depends on `tonic` without its transport): the
//! crate's errors as [`tonic::Status`], by the server layer's table.
//!
//! | error says | code | message |
//! |---|---|---|
//! | a deadline passed (also a stream's idle timeout, a retry out of time) | `DEADLINE_EXCEEDED` | `deadline exceeded` |
//! | too little budget left to start | `DEADLINE_EXCEEDED` | `budget exhausted` |
//! | a budget header is malformed or over a rejecting maximum | `INVALID_ARGUMENT` | the header's fixed text |
//! | cancelled, closed, a shutdown, a server that admits no one | `UNAVAILABLE` (`UNKNOWN` after a possibly effectful dispatch in the request) | `service unavailable` |
//! | the client went away | `CANCELLED` | `client gone` |
//! | a dependency failed (transport, a retry that gave up, a required fan-out branch) | `UNAVAILABLE` (`UNKNOWN` after a possibly effectful dispatch) | `bad gateway` |
//! | an effect whose outcome is unknown (a retry stopped so, a cut-off `COMMIT`) | `UNKNOWN` | `effect unknown` |
//! | a panic, a call made outside any scope, a database error | `INTERNAL` | `internal error` |
//!
//! The message is fixed (an error's `Display` may carry internal detail); the status's
//! metadata says `service-effect` (see [`wire::service_effect`](crate::wire::service_effect))
//! for every code but `INVALID_ARGUMENT`.
//!
//! # Examples
//!
//! ```
//! use cancel_scope::Scope;
//! // In a tonic method: `scope.child().build().map_err(tonic::Status::from)?`.
//! let s = Scope::new();
//! s.cancel();
//! let status = tonic::Status::from(s.child().build().unwrap_err());
//! assert_eq!(status.code(), tonic::Code::Unavailable);
//! assert_eq!(status.message(), "service unavailable");
//! assert_eq!(status.metadata().get("service-effect").unwrap(), "none");
//! ```

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use super::status::{self, Said};
use crate::wire::AdmissionError;

/// The status for what an error says (see the [module docs](self)).
fn status_of(said: Said) -> Status {
    let (_, code, message, effect) = said.resolve();
    let mut metadata = MetadataMap::new();
    if let Some(effect) = effect {
        metadata.insert(
            crate::wire::service_effect::HEADER,
            MetadataValue::from_static(effect.as_str()),
        );
    }
    Status::with_metadata(Code::from_i32(i32::from(code)), message, metadata)
}

impl From<crate::Error> for Status {
    fn from(e: crate::Error) -> Status {
        status_of(Said::of_error(&e))
    }
}

#[cfg(any(feature = "tower", feature = "reqwest"))]
impl From<crate::integrations::CallError> for Status {
    fn from(e: crate::integrations::CallError) -> Status {
        status_of(status::of_call(&e))
    }
}

impl From<AdmissionError> for Status {
    fn from(e: AdmissionError) -> Status {
        status_of(status::of_admission(&e))
    }
}

impl<E> From<crate::retry::RetryError<E>> for Status {
    fn from(e: crate::retry::RetryError<E>) -> Status {
        status_of(status::of_retry(&e))
    }
}

impl From<crate::fanout::FanOutError> for Status {
    fn from(e: crate::fanout::FanOutError) -> Status {
        status_of(status::of_fanout(&e))
    }
}

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
impl From<crate::integrations::sqlx::Error> for Status {
    fn from(e: crate::integrations::sqlx::Error) -> Status {
        status_of(status::of_sqlx(&e))
    }
}
