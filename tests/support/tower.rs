//! Tower helpers for the tests that drive the layers with in-process services, and the
//! receipt of one client call.

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll};

use cancel_scope::Report;
use tower_service::Service;

/// What the report of a scope that made one call says of it: `s`ucceeded, `f`ailed,
/// `c`ancelled, or `u`nknown followed by the status its record keeps (`-` for none).
pub fn verdict(report: &Report) -> String {
    let counts = (
        report.succeeded(),
        report.failed(),
        report.cancelled(),
        report.effect_unknown(),
    );
    match counts {
        (1, 0, 0, 0) => "s".to_owned(),
        (0, 1, 0, 0) => "f".to_owned(),
        (0, 0, 1, 0) => "c".to_owned(),
        (0, 0, 0, 1) => {
            let status = report.pending_effects()[0].status_str();
            format!("u {}", status.unwrap_or("-"))
        }
        _ => format!("? {report}"),
    }
}

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
