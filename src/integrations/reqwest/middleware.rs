//! A `reqwest-middleware` middleware that makes every call of a `ClientWithMiddleware` a
//! scoped call, as `send_scoped` makes it.

use std::sync::Arc;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::exchange::{self, How};
use crate::integrations::CallError;
use crate::reconcile::Journal;
use crate::wire::EgressPolicy;
use crate::{ChildSpec, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Makes every call of a `reqwest_middleware::ClientWithMiddleware` a call in a child scope,
/// exactly as [`send_scoped`](super::RequestBuilderExt::send_scoped) does (the same code):
/// the child cut by the egress policy, too little budget failing fast, the budget headers
/// owned and written, nothing sent after a cancel, the head and the body bounded by the
/// call's deadline, the receipt by the status and effect class (see [the module
/// docs](super#receipts)).
///
/// The call is made in the current scope ([`Scope::current`]), or in the [`Scope`] put in the
/// request's extensions (`RequestBuilder::with_extension(scope)`); a [`ChildSpec`] or an
/// [`EgressPolicy`] there says what the call is and how it takes its budget, as
/// [`ScopedRequest::spec`](super::ScopedRequest::spec) and
/// [`egress`](super::ScopedRequest::egress) do, and a [`Journal`] there writes the call's
/// intent before it is sent, as [`ScopedRequest::journal`](super::ScopedRequest::journal)
/// does. A call outside any scope fails with
/// [`CallError::is_no_scope`], nothing sent, unless the middleware
/// [allows it](Self::allow_unscoped).
///
/// The response is a plain `reqwest::Response`: its body is cut at the call's deadline
/// (reading it then fails with an error whose `is_timeout()` is true) or its scope's cancel,
/// and the call's receipt is given when the body has been read to its end (an empty body: at
/// once), when reading it fails, or when it is dropped before its end. A call that did not
/// complete fails with `reqwest_middleware::Error::Middleware` holding the [`CallError`]
/// (`err.downcast_ref::<CallError>()` on the `anyhow::Error`).
///
/// Put it last, after any retry middleware: each of that middleware's attempts is then a call
/// of its own, with what is left of the budget on the wire and a receipt of its own. The
/// client should follow redirects within an origin only
/// ([`redirect_policy`](super::redirect_policy)).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cancel_scope::integrations::reqwest::{redirect_policy, ScopedMiddleware};
/// use cancel_scope::integrations::CallError;
///
/// let http = reqwest::Client::builder().redirect(redirect_policy()).build().unwrap();
/// let client = reqwest_middleware::ClientBuilder::new(http).with(ScopedMiddleware::new()).build();
///
/// // Outside any scope: refused, nothing sent.
/// let err = client.get("http://127.0.0.1:1/").send().await.unwrap_err();
/// let call = match &err {
///     reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<CallError>().unwrap(),
///     _ => unreachable!(),
/// };
/// assert!(call.is_no_scope());
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ScopedMiddleware {
    unscoped: bool,
}

impl ScopedMiddleware {
    /// The middleware: every call in a child of the current scope.
    ///
    /// # Examples
    ///
    /// See [`ScopedMiddleware`].
    pub fn new() -> Self {
        ScopedMiddleware::default()
    }

    /// Lets a call made outside any scope through unchanged (no child, no receipt, its
    /// budget headers as the caller set them), instead of refusing it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::reqwest::ScopedMiddleware;
    /// let lenient = ScopedMiddleware::new().allow_unscoped();
    /// # let _ = lenient;
    /// ```
    pub fn allow_unscoped(mut self) -> Self {
        self.unscoped = true;
        self
    }
}

#[async_trait::async_trait]
impl Middleware for ScopedMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let parent = extensions
            .get::<Scope>()
            .cloned()
            .or_else(Scope::try_current);
        let Some(parent) = parent else {
            if self.unscoped {
                return next.run(req, extensions).await;
            }
            let dependency = crate::telemetry::UNNAMED_DEPENDENCY;
            crate::telemetry::call_refused(dependency, crate::telemetry::Refused::NoScope);
            return Err(reqwest_middleware::Error::middleware(CallError::no_scope()));
        };
        let how = How {
            egress: extensions.get::<EgressPolicy>().cloned(),
            spec: extensions.get::<ChildSpec>().cloned(),
            name: extensions.get::<CallName>().map(|n| n.0.clone()),
            journal: extensions.get::<Journal>().cloned(),
            dependency: crate::telemetry::UNNAMED_DEPENDENCY,
        };
        let send = |req| async move { next.run(req, extensions).await.map_err(unwrap) };
        let res = exchange::call(&parent, how, req, send).await;
        match res {
            Ok(res) => Ok(res.into_plain(true)),
            Err(e) => Err(reqwest_middleware::Error::middleware(e)),
        }
    }
}

/// A failure of the rest of the chain, with reqwest's own error as it is (its `is_connect`
/// read by [`CallError::is_connect`]).
fn unwrap(e: reqwest_middleware::Error) -> BoxError {
    match e {
        reqwest_middleware::Error::Reqwest(e) => e.into(),
        reqwest_middleware::Error::Middleware(e) => e.into(),
    }
}

/// The name of a call made through [`ScopedMiddleware`], when put in the request's
/// extensions (default `"call"`; a [`ChildSpec`] there has its own name).
///
/// # Examples
///
/// ```
/// use cancel_scope::integrations::reqwest::{CallName, ScopedMiddleware};
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(ScopedMiddleware::new())
///     .build();
/// let request = client.get("http://127.0.0.1:1/stock").with_extension(CallName::new("inventory"));
/// # let _ = request;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallName(Arc<str>);

impl CallName {
    /// The name `name`.
    ///
    /// # Examples
    ///
    /// See [`CallName`].
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        CallName(name.into())
    }
}
