//! The error of an outgoing call made through a client integration.

use std::fmt;

use http::{HeaderMap, StatusCode};

use crate::{Cause, Error};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an outgoing call made through `tower::Propagate` or the `reqwest` extension did not
/// complete.
///
/// Either the scope stopped it — the call's deadline passed, its scope was cancelled, or too
/// little budget was left to send it at all (then nothing was sent) — or the transport failed,
/// or the callee answered with an error status that the caller asked to be an error
/// (`ScopedResponse::error_for_status`), or its answer could not be decoded
/// (`ScopedResponse::json`). One opaque type with predicates, in the manner of `hyper::Error`;
/// the `Display` text is not API.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{integrations::CallError, Scope};
///
/// let scope = Scope::with_timeout(Duration::from_millis(10));
/// let err: CallError = scope.run(std::future::pending::<()>()).await.unwrap_err().into();
/// assert!(err.is_deadline_exceeded());
/// assert!(!err.is_transport());
/// # }
/// ```
pub struct CallError {
    kind: Kind,
}

enum Kind {
    Scope(Error),
    Transport(BoxError),
    /// The transport failed after the budget the callee was told had run out: a timeout in
    /// all but name (e.g. tonic's own `grpc-timeout` timer, which says CANCELLED).
    TransportAfterDeadline(BoxError),
    NoScope,
    /// The callee answered with a client or server error status.
    Status(Box<Answered>),
    /// The callee's answer (whose head is kept) could not be decoded.
    #[cfg_attr(not(feature = "json"), allow(dead_code))]
    Decode(Box<Answered>, BoxError),
    /// The intent of the call could not be written: it was not sent.
    #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
    Intent(crate::reconcile::IntentError),
}

/// The head of an answer that made the call an error.
struct Answered {
    status: StatusCode,
    headers: HeaderMap,
    url: Option<Box<str>>,
}

impl CallError {
    pub(crate) fn transport(e: impl Into<BoxError>) -> Self {
        CallError {
            kind: Kind::Transport(e.into()),
        }
    }

    pub(crate) fn transport_after_deadline(e: impl Into<BoxError>) -> Self {
        CallError {
            kind: Kind::TransportAfterDeadline(e.into()),
        }
    }

    #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
    pub(crate) fn intent_not_recorded(e: crate::reconcile::IntentError) -> Self {
        CallError {
            kind: Kind::Intent(e),
        }
    }

    pub(crate) fn no_scope() -> Self {
        CallError {
            kind: Kind::NoScope,
        }
    }

    /// The callee answered `status` with `headers`, from `url` (the last address, after
    /// redirects).
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn answered(status: StatusCode, headers: HeaderMap, url: Option<&str>) -> Self {
        CallError {
            kind: Kind::Status(Box::new(Answered {
                status,
                headers,
                url: url.map(Into::into),
            })),
        }
    }

    /// The body of the answer `status` with `headers` could not be decoded: `e`.
    #[cfg(feature = "json")]
    pub(crate) fn decode(
        status: StatusCode,
        headers: HeaderMap,
        url: Option<&str>,
        e: impl Into<BoxError>,
    ) -> Self {
        let answered = Box::new(Answered {
            status,
            headers,
            url: url.map(Into::into),
        });
        CallError {
            kind: Kind::Decode(answered, e.into()),
        }
    }

    pub(crate) fn cancelled(cause: Cause) -> Self {
        CallError {
            kind: Kind::Scope(Error::cancelled(cause)),
        }
    }

    /// The call ran out of time: its scope's deadline (or an ancestor's) passed, or the
    /// transport gave up after the budget the callee was told had run out.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_because(Cause::DeadlineExceeded);
    /// let err = CallError::from(s.child().build().unwrap_err());
    /// assert!(err.is_deadline_exceeded());
    /// ```
    pub fn is_deadline_exceeded(&self) -> bool {
        match &self.kind {
            Kind::Scope(e) => e.is_deadline_exceeded(),
            Kind::TransportAfterDeadline(_) => true,
            _ => false,
        }
    }

    /// Too little budget was left for the call to be useful: nothing was sent.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::with_timeout(Duration::from_millis(5));
    /// let err = s.child().min_useful(Duration::from_millis(50)).build().unwrap_err();
    /// assert!(CallError::from(err).is_budget_exhausted());
    /// # }
    /// ```
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_budget_exhausted())
    }

    /// The call's scope was cancelled or closed for any cause (deadline included), so the call
    /// was not sent or was stopped.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(CallError::from(s.child().build().unwrap_err()).is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(&self.kind, Kind::Scope(e) if e.is_cancelled() || e.is_closed())
    }

    /// The transport failed (connection refused, reset, protocol error...).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(!CallError::from(s.child().build().unwrap_err()).is_transport());
    /// ```
    pub fn is_transport(&self) -> bool {
        matches!(
            self.kind,
            Kind::Transport(_) | Kind::TransportAfterDeadline(_)
        )
    }

    /// There was no current scope to make the call in ([`Scope::try_current`](crate::Scope::try_current)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(!CallError::from(s.child().build().unwrap_err()).is_no_scope());
    /// ```
    pub fn is_no_scope(&self) -> bool {
        matches!(self.kind, Kind::NoScope)
    }

    /// The callee answered with a client or server error status (4xx, 5xx), and the caller
    /// asked for that to be an error (`ScopedResponse::error_for_status`). The status is
    /// [`status`](Self::status), the answer's headers [`response_headers`](Self::response_headers).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// // A callee that gave up answers an empty 504: an error, not an empty success.
    /// let err = res.error_for_status().unwrap_err();
    /// assert!(err.is_status());
    /// assert_eq!(err.status().map(|s| s.as_u16()), Some(504));
    /// # }
    /// ```
    pub fn is_status(&self) -> bool {
        matches!(self.kind, Kind::Status(_))
    }

    /// The answer came but its body could not be decoded (`ScopedResponse::json`); its status
    /// is [`status`](Self::status).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// # #[cfg(feature = "json")] {
    /// let err = res.json::<Vec<u32>>().await.unwrap_err(); // "not json"
    /// assert!(err.is_decode());
    /// # }}
    /// ```
    pub fn is_decode(&self) -> bool {
        matches!(self.kind, Kind::Decode(..))
    }

    /// The status the callee answered, when that is what made the call an error
    /// ([`is_status`](Self::is_status)) or its body could not be decoded
    /// ([`is_decode`](Self::is_decode)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Scope};
    /// let s = Scope::new();
    /// s.cancel();
    /// assert_eq!(CallError::from(s.child().build().unwrap_err()).status(), None);
    /// ```
    pub fn status(&self) -> Option<StatusCode> {
        self.head().map(|a| a.status)
    }

    /// The headers of the answer, with [`status`](Self::status): where a classifier finds
    /// `Retry-After` (see `integrations::classify`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(res: cancel_scope::integrations::reqwest::ScopedResponse) {
    /// let err = res.error_for_status().unwrap_err();
    /// let retry_after = err.response_headers().and_then(|h| h.get("retry-after"));
    /// # let _ = retry_after;
    /// # }
    /// ```
    pub fn response_headers(&self) -> Option<&HeaderMap> {
        self.head().map(|a| &a.headers)
    }

    fn head(&self) -> Option<&Answered> {
        match &self.kind {
            Kind::Status(a) | Kind::Decode(a, _) => Some(a),
            _ => None,
        }
    }

    /// The call's intent could not be written to its [`Journal`](crate::reconcile::Journal)
    /// (the store failed, was slow or full): the call was refused before anything was sent,
    /// since a write without its intent is what the journal exists to prevent.
    /// [`intent_error`](Self::intent_error) says why.
    ///
    /// # Examples
    ///
    /// See `integrations::reqwest::ScopedRequest::journal` (feature `reqwest`).
    pub fn is_intent_not_recorded(&self) -> bool {
        matches!(self.kind, Kind::Intent(_))
    }

    /// The store's error, when [`is_intent_not_recorded`](Self::is_intent_not_recorded).
    ///
    /// # Examples
    ///
    /// See `integrations::reqwest::ScopedRequest::journal` (feature `reqwest`).
    pub fn intent_error(&self) -> Option<&crate::reconcile::IntentError> {
        match &self.kind {
            Kind::Intent(e) => Some(e),
            _ => None,
        }
    }

    /// The connection could not be made (refused, no route, name not resolved): nothing was
    /// sent. A [`is_transport`](Self::is_transport) failure whose source says so (a reqwest
    /// error's `is_connect`, or an I/O error of those kinds).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::reqwest::RequestBuilderExt;
    /// use cancel_scope::Scope;
    /// # #[cfg(feature = "reqwest")] {
    /// let scope = Scope::with_timeout(Duration::from_secs(5));
    /// // Port 1 on loopback: nobody listens.
    /// let err = reqwest::Client::new().get("http://127.0.0.1:1/").scoped_in(&scope)
    ///     .send().await.unwrap_err();
    /// assert!(err.is_connect());
    /// # }}
    /// ```
    pub fn is_connect(&self) -> bool {
        let Kind::Transport(e) = &self.kind else {
            return false;
        };
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&**e);
        while let Some(e) = next {
            #[cfg(feature = "reqwest")]
            if let Some(e) = e.downcast_ref::<reqwest::Error>() {
                if e.is_connect() {
                    return true;
                }
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind as K;
                if matches!(
                    io.kind(),
                    K::ConnectionRefused
                        | K::AddrNotAvailable
                        | K::HostUnreachable
                        | K::NetworkUnreachable
                ) {
                    return true;
                }
            }
            next = e.source();
        }
        false
    }

    /// The cancel cause, when the scope stopped the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{integrations::CallError, Cause, Scope};
    /// let s = Scope::new();
    /// s.cancel_because(Cause::ClientGone);
    /// let err = CallError::from(s.child().build().unwrap_err());
    /// assert!(err.cause().unwrap().is_client_gone());
    /// ```
    pub fn cause(&self) -> Option<&Cause> {
        match &self.kind {
            Kind::Scope(e) => e.cause(),
            _ => None,
        }
    }
}

impl From<Error> for CallError {
    fn from(e: Error) -> Self {
        CallError {
            kind: Kind::Scope(e),
        }
    }
}

impl fmt::Debug for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Scope(e) => f.debug_tuple("CallError::Scope").field(e).finish(),
            Kind::Transport(e) => f.debug_tuple("CallError::Transport").field(e).finish(),
            Kind::TransportAfterDeadline(e) => f
                .debug_tuple("CallError::TransportAfterDeadline")
                .field(e)
                .finish(),
            Kind::NoScope => f.write_str("CallError::NoScope"),
            Kind::Status(a) => f
                .debug_struct("CallError::Status")
                .field("status", &a.status)
                .field("url", &a.url)
                .finish_non_exhaustive(),
            Kind::Decode(a, e) => f
                .debug_struct("CallError::Decode")
                .field("status", &a.status)
                .field("url", &a.url)
                .field("error", e)
                .finish_non_exhaustive(),
            Kind::Intent(e) => f.debug_tuple("CallError::Intent").field(e).finish(),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Scope(e) => write!(f, "call stopped by its scope: {e}"),
            Kind::Transport(e) => write!(f, "call failed: {e}"),
            Kind::TransportAfterDeadline(e) => {
                write!(f, "call failed after its budget ran out: {e}")
            }
            Kind::NoScope => f.write_str("no current scope to make the call in"),
            Kind::Status(a) => {
                write!(f, "call answered HTTP {}", a.status)?;
                match &a.url {
                    Some(url) => write!(f, " by {url}"),
                    None => Ok(()),
                }
            }
            Kind::Decode(a, e) => {
                write!(f, "could not decode the HTTP {} answer: {e}", a.status)
            }
            Kind::Intent(e) => write!(f, "call not sent: its intent was not recorded: {e}"),
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Scope(e) => Some(e),
            Kind::Transport(e) | Kind::TransportAfterDeadline(e) | Kind::Decode(_, e) => Some(&**e),
            Kind::NoScope | Kind::Status(_) => None,
            Kind::Intent(e) => Some(e),
        }
    }
}
