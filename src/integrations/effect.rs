//! The effect class of an outgoing call whose caller does not say, shared by the client
//! integrations.
//!
//! | call | class | effect id / key |
//! |---|---|---|
//! | HTTP `GET`, `HEAD`, `OPTIONS`, `TRACE` | read-only | – |
//! | any call with an `Idempotency-Key` header (not read-only) | idempotent | the header's value |
//! | HTTP `PUT`, `DELETE` | idempotent | `"PUT http://host/path?query"`: the method and target |
//! | HTTP `POST`, `PATCH`, any other method; gRPC | side-effecting | `"POST http://host/path (call N)"` |
//!
//! A `PUT` or `DELETE` without a key is named by what it does: repeating that request has the
//! effect once, so two of them that both end unknown are one thing to reconcile (the state of
//! that resource). A side-effecting call without a key is one effect of its own: its id gets a
//! number unique in the process, so that two `POST`s to one address that both end unknown are
//! listed as two. The target leaves out user info (`user:password@`) and any fragment.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName};
use http::Method;

use crate::ChildSpec;

/// The header whose value names an idempotent effect (draft-ietf-httpapi-idempotency-key-header).
pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// What a call may do, before it is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    ReadOnly,
    Idempotent,
    SideEffecting,
}

impl Class {
    /// The class of an HTTP call made with `method`, when its caller says nothing.
    pub(crate) fn of_method(method: &Method) -> Class {
        match *method {
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE => Class::ReadOnly,
            Method::PUT | Method::DELETE => Class::Idempotent,
            // POST, PATCH, CONNECT and methods this table does not know: may have any effect.
            _ => Class::SideEffecting,
        }
    }
}

/// The spec of a call of `class`, named `name`, made as `method` to `target` (its address,
/// without user info), with `headers` (for an `Idempotency-Key`).
pub(crate) fn spec(
    name: Arc<str>,
    class: Class,
    method: &Method,
    target: &dyn fmt::Display,
    headers: &HeaderMap,
) -> ChildSpec {
    if class == Class::ReadOnly {
        return ChildSpec::read_only(name);
    }
    if let Some(key) = idempotency_key(headers) {
        return ChildSpec::idempotent(name, key);
    }
    match class {
        Class::Idempotent => ChildSpec::idempotent(name, format!("{method} {target}")),
        _ => ChildSpec::side_effecting(name, format!("{method} {target} (call {})", next_call())),
    }
}

/// The request's idempotency key: the first non-empty `Idempotency-Key` line.
fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(IDEMPOTENCY_KEY)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .find(|k| !k.is_empty())
}

/// A number no other call of this process gets.
fn next_call() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Relaxed: only makes the numbers unique.
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// An `http::Uri` as the target of an effect: scheme, host and port, path and query (as far
/// as the URI has them; a gRPC client's request often has the path only), no user info.
#[cfg(feature = "tower")]
pub(crate) struct UriTarget<'a>(pub(crate) &'a http::Uri);

#[cfg(feature = "tower")]
impl fmt::Display for UriTarget<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uri = self.0;
        if let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) {
            let host = authority.as_str().rsplit('@').next().unwrap_or_default();
            write!(f, "{scheme}://{host}")?;
        }
        match uri.path_and_query() {
            Some(pq) => f.write_str(pq.as_str()),
            None => f.write_str("/"),
        }
    }
}

#[cfg(all(test, feature = "tower"))]
mod tests {
    use super::*;

    fn spec_of(method: Method, uri: &str, key: Option<&str>) -> ChildSpec {
        let uri: http::Uri = uri.parse().unwrap();
        let mut headers = HeaderMap::new();
        if let Some(k) = key {
            headers.insert(IDEMPOTENCY_KEY, k.parse().unwrap());
        }
        let class = Class::of_method(&method);
        spec("call".into(), class, &method, &UriTarget(&uri), &headers)
    }

    #[test]
    fn methods_have_their_classes_and_names() {
        use crate::Effect;
        for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert_eq!(
                spec_of(m, "http://h/x", Some("k")).effect(),
                &Effect::ReadOnly
            );
        }
        let put = spec_of(Method::PUT, "http://u:pw@h:8080/orders/1?v=2", None);
        assert_eq!(put.effect().key(), Some("PUT http://h:8080/orders/1?v=2"));
        let delete = spec_of(Method::DELETE, "/orders/1", None);
        assert_eq!(delete.effect().key(), Some("DELETE /orders/1"));
        let keyed = spec_of(Method::POST, "http://h/pay", Some(" pay-42 "));
        assert_eq!(keyed.effect().key(), Some("pay-42"));
        assert_eq!(keyed.effect_record().unwrap().effect_id(), "pay-42");
        let a = spec_of(Method::POST, "http://h/pay", None);
        let b = spec_of(Method::PATCH, "http://h/pay", None);
        assert_eq!(a.effect(), &Effect::SideEffecting);
        assert_eq!(b.effect(), &Effect::SideEffecting);
        let (a, b) = (a.effect_record().unwrap(), b.effect_record().unwrap());
        assert!(
            a.effect_id().starts_with("POST http://h/pay (call "),
            "{a:?}"
        );
        assert!(
            b.effect_id().starts_with("PATCH http://h/pay (call "),
            "{b:?}"
        );
        assert_ne!(
            spec_of(Method::POST, "http://h/pay", None).effect_record(),
            spec_of(Method::POST, "http://h/pay", None).effect_record()
        );
        let other = Method::from_bytes(b"PURGE").unwrap();
        assert_eq!(
            spec_of(other, "http://h/", None).effect(),
            &Effect::SideEffecting
        );
    }
}
