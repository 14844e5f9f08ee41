//! The HTTP classifier.

use std::time::SystemTime;

use http::{HeaderMap, StatusCode};

use super::hint::retry_after;
use super::unanswered;
use crate::integrations::{is_effect_unknown, CallError};
use crate::retry::{Classify, Decision};

/// Classifies the errors of HTTP calls by the table of [the module docs](super#http-httpclassifier):
/// 408 and 429 retried (after `Retry-After`), 5xx retried as answers that may have had their
/// effect, other 4xx never, connection failures on another endpoint.
///
/// A [`Classify`] for [`CallError`] (a scoped reqwest call, with
/// `integrations::reqwest::ScopedResponse::error_for_status`
/// to make an error status an error), for `reqwest::Error` (feature `reqwest`: its status, but
/// no headers, so no `Retry-After`) and for `reqwest_middleware::Error` (feature
/// `reqwest-middleware`). For an error type of your own, call [`answer`](Self::answer) with
/// what the callee answered.
///
/// # Examples
///
/// ```no_run
/// # async fn f(client: reqwest::Client) -> Result<(), cancel_scope::retry::RetryError<cancel_scope::integrations::CallError>> {
/// use std::time::Duration;
/// use cancel_scope::integrations::classify::HttpClassifier;
/// use cancel_scope::integrations::reqwest::RequestBuilderExt;
/// use cancel_scope::retry::Retry;
/// use cancel_scope::{ChildSpec, Scope};
///
/// let retry: Retry<HttpClassifier> = Retry::new(HttpClassifier::new()).max_attempts(3);
/// let request = Scope::with_timeout(Duration::from_millis(800));
/// let stock = retry
///     .run(&request, ChildSpec::read_only("inventory"), |attempt| {
///         let client = client.clone();
///         async move {
///             let res = client.get("http://127.0.0.1:8080/stock/42").scoped_in(attempt.scope());
///             res.send().await?.error_for_status()?.text().await
///         }
///     })
///     .await?;
/// # let _ = stock; Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpClassifier {
    _private: (),
}

impl HttpClassifier {
    /// The classifier.
    ///
    /// # Examples
    ///
    /// See [`HttpClassifier`].
    pub const fn new() -> Self {
        HttpClassifier { _private: () }
    }

    /// The decision after the callee answered `status` with `headers` (where `Retry-After`,
    /// and the server's word that it had dispatched an effect, are read).
    ///
    /// # Examples
    ///
    /// See [the module docs](super).
    pub fn answer(&self, status: StatusCode, headers: &HeaderMap) -> Decision {
        answer_at(status, headers, SystemTime::now())
    }
}

/// [`HttpClassifier::answer`] at wall-clock `now` (for an HTTP-date `Retry-After`).
pub(super) fn answer_at(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Decision {
    let hint = || retry_after(headers, now);
    let code = status.as_u16();
    if is_effect_unknown(headers) && code >= 400 {
        return hint().map_or(Decision::EffectUnknown, Decision::EffectUnknownAfter);
    }
    match code {
        // Refused before it was processed: safe to repeat, when the server allows.
        408 | 429 => hint().map_or(Decision::Backoff, Decision::RetryAfter),
        // Retrying cannot help: not implemented, version not supported, log in to the network.
        501 | 505 | 511 => Decision::Never,
        500..=599 => hint().map_or(Decision::EffectUnknown, Decision::EffectUnknownAfter),
        // Other refusals, and answers that are not failures at all.
        _ => Decision::Never,
    }
}

impl Classify<CallError> for HttpClassifier {
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

#[cfg(feature = "reqwest")]
impl Classify<reqwest::Error> for HttpClassifier {
    fn classify(&self, e: &reqwest::Error) -> Decision {
        if let Some(status) = e.status() {
            return self.answer(status, &HeaderMap::new());
        }
        if e.is_connect() {
            Decision::SwitchEndpoint
        } else if e.is_builder() || e.is_redirect() || e.is_decode() {
            Decision::Never
        } else {
            // A timeout or a failure while sending or reading: it may have been processed.
            Decision::EffectUnknown
        }
    }
}

#[cfg(feature = "reqwest-middleware")]
impl Classify<reqwest_middleware::Error> for HttpClassifier {
    fn classify(&self, e: &reqwest_middleware::Error) -> Decision {
        match e {
            reqwest_middleware::Error::Reqwest(e) => self.classify(e),
            reqwest_middleware::Error::Middleware(e) => {
                if let Some(call) = e.downcast_ref::<CallError>() {
                    self.classify(call)
                } else if let Some(e) = e.downcast_ref::<reqwest::Error>() {
                    self.classify(e)
                } else {
                    // Another middleware's failure: nobody here knows what was sent.
                    Decision::EffectUnknown
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::header::{HeaderName, HeaderValue, RETRY_AFTER};

    use super::*;

    const SERVICE_EFFECT: HeaderName = HeaderName::from_static("service-effect");

    fn decide(code: u16, headers: &[(&HeaderName, &str)]) -> Decision {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        answer_at(StatusCode::from_u16(code).unwrap(), &h, now)
    }

    #[test]
    fn the_http_table() {
        use Decision::*;
        let secs = Duration::from_secs;
        let after = [(&RETRY_AFTER, "3")];
        let date = [(&RETRY_AFTER, "Tue, 14 Nov 2023 22:14:50 GMT")]; // now + 90 s
        let dispatched = [(&SERVICE_EFFECT, "unknown")];
        for (code, headers, want) in [
            (429, &[][..], Backoff),
            (429, &after[..], RetryAfter(secs(3))),
            (429, &date[..], RetryAfter(secs(90))),
            (408, &[][..], Backoff),
            (400, &after[..], Never),
            (404, &[][..], Never),
            (409, &[][..], Never),
            (500, &[][..], EffectUnknown),
            (502, &[][..], EffectUnknown),
            (503, &[][..], EffectUnknown),
            (503, &after[..], EffectUnknownAfter(secs(3))),
            (503, &date[..], EffectUnknownAfter(secs(90))),
            (504, &[][..], EffectUnknown),
            (501, &[][..], Never),
            (505, &[][..], Never),
            (200, &[][..], Never),
            (304, &[][..], Never),
            // The server dispatched an effect before it stopped: unknown, whatever the status.
            (429, &dispatched[..], EffectUnknown),
            (400, &dispatched[..], EffectUnknown),
            (501, &dispatched[..], EffectUnknown),
        ] {
            assert_eq!(decide(code, headers), want, "{code} {headers:?}");
        }
        let both = [(&SERVICE_EFFECT, "unknown"), (&RETRY_AFTER, "3")];
        assert_eq!(decide(503, &both), EffectUnknownAfter(secs(3)));
        let none = [(&SERVICE_EFFECT, "none")];
        assert_eq!(decide(429, &none), Backoff);
    }
}
