//! A streaming response of `Admit`: the request's scope stays open while the body
//! streams, so that the body's code (a stream that calls downstream per message, a task the
//! handler left producing it) can start work for it, bounded by the request's deadline; the
//! scope closes at the body's end, and the report waits for it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{Admission, EndpointPolicy};
use cancel_scope::{ChildSpec, Lifecycle, Report, Scope};
use http::{Request, Response};
use http_body::{Body, Frame};
use tokio::sync::mpsc;
use tower_layer::Layer;
use tower_service::Service;

use crate::support::tower::Fn_;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A body of `messages` frames, each made by a downstream call of its own (a child of the
/// current scope: the request's), one every 10 ms.
struct PerMessage {
    left: usize,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for PerMessage {
    type Data = Bytes;
    type Error = cancel_scope::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, cancel_scope::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(ms(10))));
        std::task::ready!(wait.as_mut().poll(cx));
        self.wait = None;
        self.left -= 1;
        // The downstream call for this message: registered in the request's scope.
        let call = Scope::current().register(ChildSpec::read_only("lookup"));
        Poll::Ready(Some(call.and_then(|t| t.dispatch()).map(|d| {
            d.succeed();
            Frame::data(Bytes::from_static(b"message"))
        })))
    }
}

async fn next_frame<B: Body + Unpin>(body: &mut B) -> Option<Result<Frame<B::Data>, B::Error>> {
    std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

#[tokio::test(start_paused = true)]
async fn a_streaming_body_starts_downstream_work_per_message_until_its_end() {
    let (tx, mut reports) = mpsc::unbounded_channel::<(Admission, Report)>();
    let layer = AdmitLayer::new(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .on_report(move |a, r| {
        let _ = tx.send((a.clone(), r.clone()));
    });
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(PerMessage {
            left: 3,
            wait: None,
        }))
    }));
    let res = svc.call(Request::new(())).await.unwrap();
    let mut body = Box::pin(res.into_body());
    for _ in 0..3 {
        let frame = next_frame(&mut body).await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "message");
    }
    assert!(next_frame(&mut body).await.is_none());
    let (_, report) = reports.recv().await.unwrap();
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    // The handler and the three calls the body made.
    assert_eq!(report.succeeded(), 4, "{report}");
}

#[tokio::test(start_paused = true)]
async fn the_bodys_work_is_bounded_by_the_requests_deadline() {
    let (tx, mut reports) = mpsc::unbounded_channel::<(Admission, Report)>();
    let layer = AdmitLayer::new(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(25))
            .build(),
    )
    .on_report(move |a, r| {
        let _ = tx.send((a.clone(), r.clone()));
    });
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(PerMessage {
            left: 10,
            wait: None,
        }))
    }));
    let res = svc.call(Request::new(())).await.unwrap();
    let mut body = Box::pin(res.into_body());
    let mut sent = 0;
    while let Some(Ok(_)) = next_frame(&mut body).await {
        sent += 1;
    }
    // Two messages in 25 ms, then the deadline cut the body.
    assert_eq!(sent, 2);
    let (_, report) = reports.recv().await.unwrap();
    assert!(report.cause().unwrap().is_deadline_exceeded(), "{report}");
    assert_eq!(report.succeeded(), 3, "{report}");
}
