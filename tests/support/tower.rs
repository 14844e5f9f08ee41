//! Tower helpers: an admission layer whose reports the test reads, bodies and services made
//! in process, and the receipt of one client call.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{Admission, EndpointPolicy};
use cancel_scope::{Report, Scope};
use http::Response;
use http_body::{Body, Frame};
use tokio::sync::mpsc;
use tower_service::Service;

/// The reports of an admission layer made by [`reporting`], in the order the requests went
/// quiet.
pub type Reports = mpsc::UnboundedReceiver<(Admission, Report)>;

/// An admission layer with `policy` whose reports come out of the returned channel.
pub fn reporting(policy: EndpointPolicy) -> (AdmitLayer, Reports) {
    let (tx, rx) = mpsc::unbounded_channel();
    let layer = AdmitLayer::new(policy).on_report(move |a, r| {
        let _ = tx.send((a.clone(), r.clone()));
    });
    (layer, rx)
}

/// The next report, or a failure if none comes within `patience` (rather than a test that
/// hangs; on the paused clock the wait ends as soon as nothing else can happen).
pub async fn next_report_within(reports: &mut Reports, patience: Duration) -> (Admission, Report) {
    tokio::time::timeout(patience, reports.recv())
        .await
        .expect("no report: the request never went quiet")
        .expect("the report channel is open")
}

/// The next report, on the paused clock (waiting an hour costs nothing there).
pub async fn next_report(reports: &mut Reports) -> (Admission, Report) {
    next_report_within(reports, Duration::from_secs(3600)).await
}

/// No report comes any more (on the paused clock, waiting an hour costs nothing).
pub async fn assert_no_more_reports(reports: &mut Reports) {
    let more = tokio::time::timeout(Duration::from_secs(3600), reports.recv()).await;
    assert!(more.is_err(), "a second report: {more:?}");
}

/// The request's scope that a handler put in its response's extensions.
pub fn scope_of<B>(res: &Response<B>) -> Scope {
    res.extensions().get::<Scope>().unwrap().clone()
}

/// A response body that yields the given frames, then stays pending (or, `ENDS`, has ended).
pub struct Frames<const ENDS: bool>(pub VecDeque<Frame<&'static [u8]>>);

impl<const ENDS: bool> Body for Frames<ENDS> {
    type Data = &'static [u8];
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<&'static [u8]>, Infallible>>> {
        match self.0.pop_front() {
            Some(f) => Poll::Ready(Some(Ok(f))),
            None if ENDS => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        ENDS && self.0.is_empty()
    }
}

/// The next frame of `body`.
pub async fn next_frame<B: Body + Unpin>(body: &mut B) -> Option<Result<Frame<B::Data>, B::Error>> {
    poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

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

/// A handler that spawns 60 s of work in the request's scope and waits for it.
pub async fn stuck(_: http::Request<()>) -> Result<Response<String>, Infallible> {
    let work = Scope::current()
        .spawn(tokio::time::sleep(Duration::from_secs(60)))
        .unwrap();
    let _ = work.await;
    Ok(Response::new("finished".to_owned()))
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
