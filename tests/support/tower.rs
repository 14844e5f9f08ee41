//! Tower helpers for the tests that drive the layers with in-process services.

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll};

use tower_service::Service;

/// A service from an async closure (always ready, never fails).
#[derive(Clone)]
pub struct Fn_<F>(pub F);

impl<F, R, Fut, T> Service<R> for Fn_<F>
where
    F: FnMut(R) -> Fut,
    Fut: Future<Output = Result<T, Infallible>>,
{
    type Response = T;
    type Error = Infallible;
    type Future = Fut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, r: R) -> Fut {
        (self.0)(r)
    }
}
