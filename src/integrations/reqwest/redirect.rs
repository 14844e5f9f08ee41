//! A redirect policy that keeps a call's budget headers within the origin it was sent to.

use reqwest::{redirect, Url};

/// A redirect policy for clients that make scoped calls: redirects within the origin of the
/// request (scheme, host and port) are followed, up to 10 as reqwest's default policy does
/// (more is an error); one to another origin is not, and its 3xx answer is the call's
/// response. So the budget headers of a call, with its operation id, generation and priority,
/// never reach an origin the caller did not send them to (reqwest copies a request's headers
/// onto every redirect it follows).
///
/// # Examples
///
/// ```
/// let client = reqwest::Client::builder()
///     .redirect(cancel_scope::integrations::reqwest::redirect_policy())
///     .build()
///     .unwrap();
/// # let _ = client;
/// ```
pub fn redirect_policy() -> redirect::Policy {
    let within = redirect::Policy::default();
    redirect::Policy::custom(move |attempt| {
        // `previous` starts with the request's own URL.
        let first = attempt.previous().first();
        if first.is_some_and(|from| !same_origin(from, attempt.url())) {
            attempt.stop()
        } else {
            within.redirect(attempt)
        }
    })
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}
