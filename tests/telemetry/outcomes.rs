//! How admitted requests end, as the metrics and the report event say it: a deadline (DEBUG,
//! `error.type`), a client gone, a quarantined child and an unknown effect (WARN).

use std::collections::VecDeque;
use std::convert::Infallible;

use cancel_scope::telemetry;
use cancel_scope::wire::EndpointPolicy;
use cancel_scope::{ChildSpec, Scope};
use http::{Request, Response};
use http_body::Frame;
use tokio::time::advance;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Level;

use crate::capture::Telemetry;
use crate::support::time::ms;
use crate::support::tower::{next_frame, next_report, reporting, stuck, Fn_, Frames};

fn budgeted(value: &str) -> Request<()> {
    Request::builder()
        .header("grpc-timeout", value)
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_deadline_counts_its_cause_and_marks_the_span_without_a_warning() {
    let t = Telemetry::install();
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = layer.layer(Fn_(stuck));
    let res = svc.call(budgeted("250m")).await.unwrap();
    assert_eq!(res.status(), 504);
    drop(res);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cancelled(), 2);

    let m = t.metrics();
    let cause = [("cause", "deadline_exceeded")];
    assert_eq!(m.counter(telemetry::SCOPE_CANCELLED, &cause), 1);
    assert_eq!(m.label_sets(telemetry::SCOPE_CANCELLED).len(), 1);
    assert_eq!(m.counter(telemetry::RECEIPTS, &[("kind", "cancelled")]), 2);
    // Everything stopped at the cancel itself.
    assert_eq!(m.histogram(telemetry::SCOPE_CANCEL_TO_QUIET, &[]), [0.0]);

    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(span.field("http.response.status_code"), Some("504"));
    assert_eq!(span.field("error.type"), Some("deadline_exceeded"));
    let event = t.traces.event("request report");
    assert_eq!(
        event.level,
        Level::DEBUG,
        "a plain deadline is no operator's problem"
    );
    assert_eq!(event.field("cancel_scope.cause"), Some("deadline exceeded"));
    assert_eq!(
        event.field("cancel_scope.lifecycle"),
        Some("CancelledStable")
    );
}

#[tokio::test(start_paused = true)]
async fn a_grpc_deadline_records_the_status_name() {
    let t = Telemetry::install();
    let mut svc = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .0
    .layer(Fn_(stuck));
    let req = Request::builder()
        .header("grpc-timeout", "100m")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "4");
    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(
        span.field("rpc.response.status_code"),
        Some("DEADLINE_EXCEEDED")
    );
    assert_eq!(span.field("http.response.status_code"), None);
    assert_eq!(span.field("error.type"), Some("deadline_exceeded"));
}

fn grpc_request(timeout: &str) -> Request<()> {
    Request::builder()
        .header("grpc-timeout", timeout)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_grpc_status_in_the_trailers_is_recorded_on_the_request_span() {
    let t = Telemetry::install();
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    // A gRPC answer: a message, then its status in the trailers (as tonic sends one).
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "5".parse().unwrap());
        let frames = VecDeque::from([Frame::data(&b"\0\0\0\0\0"[..]), Frame::trailers(trailers)]);
        let mut res = Response::new(Frames::<false>(frames));
        res.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        Ok::<_, Infallible>(res)
    }));
    let mut res = svc.call(grpc_request("1S")).await.unwrap();
    assert!(
        res.headers().get("grpc-status").is_none(),
        "not trailers-only"
    );
    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(
        span.field("rpc.response.status_code"),
        None,
        "not known yet"
    );

    while let Some(frame) = next_frame(res.body_mut()).await {
        if frame.unwrap().is_trailers() {
            break;
        }
    }
    next_report(&mut reports).await;
    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(span.field("rpc.response.status_code"), Some("NOT_FOUND"));
    assert_eq!(span.field("http.response.status_code"), None);
    assert_eq!(
        span.field("error.type"),
        None,
        "the handler's status, no deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_grpc_body_cut_by_the_deadline_records_its_trailers_status() {
    let t = Telemetry::install();
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    // A server-streaming answer that sends one message and then stalls.
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        let frames = VecDeque::from([Frame::data(&b"\0\0\0\0\0"[..])]);
        let mut res = Response::new(Frames::<false>(frames));
        res.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        Ok::<_, Infallible>(res)
    }));
    let mut res = svc.call(grpc_request("200m")).await.unwrap();
    assert!(next_frame(res.body_mut()).await.unwrap().unwrap().is_data());
    advance(ms(200)).await;
    let trailers = next_frame(res.body_mut()).await.unwrap().unwrap();
    assert_eq!(trailers.trailers_ref().unwrap()["grpc-status"], "4");
    next_report(&mut reports).await;
    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(
        span.field("rpc.response.status_code"),
        Some("DEADLINE_EXCEEDED")
    );
    assert_eq!(span.field("error.type"), Some("deadline_exceeded"));
}

#[tokio::test(start_paused = true)]
async fn a_client_gone_counts_as_its_cause() {
    let t = Telemetry::install();
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    let mut svc = layer.layer(Fn_(stuck));
    let fut = svc.call(budgeted("1S"));
    let polled = tokio::time::timeout(ms(100), fut).await;
    assert!(
        polled.is_err(),
        "still running: the client gives up and drops it"
    );
    next_report(&mut reports).await;

    let m = t.metrics();
    assert_eq!(
        m.counter(telemetry::SCOPE_CANCELLED, &[("cause", "client_gone")]),
        1
    );
    assert_eq!(m.label_sets(telemetry::SCOPE_CANCELLED).len(), 1);
    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(span.field("error.type"), None);
    assert_eq!(span.field("http.response.status_code"), None);
    assert_eq!(t.traces.event("request report").level, Level::DEBUG);
}

#[tokio::test(start_paused = true)]
async fn a_quarantined_child_is_counted_and_reported_at_warn() {
    let t = Telemetry::install();
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    // A child that never gets a receipt (work that ignores its cancel).
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        let ticket = Scope::current()
            .register(ChildSpec::read_only("ignores-cancel"))
            .unwrap();
        std::mem::forget(ticket.dispatch().unwrap());
        std::future::pending::<()>().await;
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let res = svc.call(budgeted("100m")).await.unwrap();
    assert_eq!(res.status(), 504);
    drop(res);
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.quarantined(), 1, "{report}");

    let m = t.metrics();
    assert_eq!(
        m.counter(telemetry::RECEIPTS, &[("kind", "quarantined")]),
        1
    );
    let to_quiet = m.histogram(telemetry::SCOPE_CANCEL_TO_QUIET, &[]);
    assert_eq!(to_quiet.len(), 1);
    assert!(
        to_quiet[0] > 0.0,
        "quiet only at the end of the grace period: {to_quiet:?}"
    );
    let event = t.traces.event("request report");
    assert_eq!(event.level, Level::WARN);
    assert_eq!(event.field("cancel_scope.receipts.quarantined"), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn an_unknown_effect_is_counted_and_reported_at_warn() {
    let t = Telemetry::install();
    let (layer, mut reports) = reporting(
        EndpointPolicy::builder(ms(5_000))
            .default_budget(ms(1_000))
            .build(),
    );
    // A payment sent and cut off by the deadline before it confirmed.
    let mut svc = layer.layer(Fn_(|_: Request<()>| async {
        let ticket = Scope::current()
            .register(ChildSpec::side_effecting("pay", "payment-7"))
            .unwrap();
        let _sent = ticket.dispatch().unwrap();
        std::future::pending::<()>().await;
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let res = svc.call(budgeted("100m")).await.unwrap();
    assert_eq!(res.status(), 504);
    drop(res);
    advance(ms(1)).await;
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.effect_unknown(), 1, "{report}");

    let m = t.metrics();
    assert_eq!(
        m.counter(telemetry::RECEIPTS, &[("kind", "effect_unknown")]),
        1
    );
    let event = t.traces.event("request report");
    assert_eq!(event.level, Level::WARN);
    assert_eq!(
        event.field("cancel_scope.lifecycle"),
        Some("NeedsReconciliation")
    );
    assert_eq!(
        event.field("cancel_scope.receipts.effect_unknown"),
        Some("1")
    );
}
