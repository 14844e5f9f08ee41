//! A handler that answers at once, and one request through a service with its response body
//! read to the end: what the `Admit` benches put through the layer.

use std::convert::Infallible;
use std::future::poll_fn;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

/// Answers "hello" at once.
#[derive(Clone)]
pub struct Hello;

impl Service<Request<()>> for Hello {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new("hello".to_owned())))
    }
}

/// Calls `svc` once with `req` and reads the response body to its end.
pub async fn one<S, B>(svc: &mut S, req: Request<()>)
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body + Unpin,
{
    let res = svc.call(req).await.unwrap();
    let mut body = res.into_body();
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        black_box(frame.is_ok());
    }
}
