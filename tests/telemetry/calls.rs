//! Outgoing calls through `Propagate`: the call's budget and span by dependency, refusals by
//! reason, a call's own deadline counted once, and a gRPC call's status from its trailers.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, PropagateLayer};
use cancel_scope::telemetry;
use cancel_scope::wire::{grpc_timeout, EgressPolicy, EndpointPolicy};
use cancel_scope::Scope;
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use tower_layer::Layer;
use tower_service::Service;

use crate::capture::{text, Telemetry};
use crate::support::time::ms;
use crate::support::tower::{next_frame, Fn_, Frames};

/// A downstream that answers after 10 ms with the `grpc-timeout` it was told, in ms.
async fn downstream(req: Request<()>) -> Result<Response<String>, Infallible> {
    let told = req.headers()["grpc-timeout"].as_bytes().to_vec();
    let told = grpc_timeout::decode_bytes(&told).unwrap();
    tokio::time::sleep(ms(10)).await;
    Ok(Response::new(told.as_millis().to_string()))
}

/// A downstream that never answers.
async fn hangs(_: Request<()>) -> Result<Response<String>, Infallible> {
    std::future::pending().await
}

fn client() -> PropagateLayer {
    PropagateLayer::new()
        .dependency("inventory")
        .egress(EgressPolicy::builder().transport_pad(ms(5)).build())
}

#[tokio::test(start_paused = true)]
async fn a_call_from_a_handler_records_its_budget_and_a_child_span() {
    let t = Telemetry::install();
    let handler = Fn_(|_: Request<()>| async {
        let mut inventory = client().layer(Fn_(downstream));
        let res = inventory.call(Request::new(())).await.unwrap();
        let told = text(res.into_body()).await;
        Ok::<_, Infallible>(Response::new(told))
    });
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(300))
            .build(),
    )
    .layer(handler);
    let res = svc.call(Request::new(())).await.unwrap();
    assert_eq!(res.status(), 200);
    let told = text(res.into_body()).await;
    assert_eq!(told, "295");

    let m = t.metrics();
    let dependency = [("dependency", "inventory")];
    assert_eq!(m.histogram(telemetry::CALL_BUDGET, &dependency), [0.3]);
    assert!(m.label_sets(telemetry::CALL_REFUSED).is_empty());
    assert!(m.label_sets(telemetry::SCOPE_CANCELLED).is_empty());

    let span = t.traces.span(telemetry::CALL_SPAN);
    assert_eq!(span.parent.as_deref(), Some(telemetry::REQUEST_SPAN));
    assert_eq!(span.field("cancel_scope.dependency"), Some("inventory"));
    assert_eq!(span.field("cancel_scope.budget_in_ms"), Some("300"));
    assert_eq!(span.field("cancel_scope.budget_out_ms"), Some("295"));
    assert_eq!(span.field("http.response.status_code"), Some("200"));
    assert_eq!(span.field("error.type"), None);
}

#[tokio::test(start_paused = true)]
async fn refused_calls_count_by_dependency_and_reason() {
    let t = Telemetry::install();
    let mut inventory = client().layer(Fn_(downstream));
    // Outside any scope.
    assert!(inventory
        .call(Request::new(()))
        .await
        .unwrap_err()
        .is_no_scope());
    // From a cancelled scope.
    let cancelled = Scope::with_timeout(ms(1_000));
    cancelled.cancel();
    let mut req = Request::new(());
    req.extensions_mut().insert(cancelled);
    assert!(inventory.call(req).await.is_err());
    // With less than the least useful budget.
    let mut picky = PropagateLayer::new()
        .dependency("inventory")
        .egress(EgressPolicy::builder().min_useful(ms(50)).build())
        .layer(Fn_(downstream));
    let mut req = Request::new(());
    req.extensions_mut().insert(Scope::with_timeout(ms(30)));
    assert!(picky.call(req).await.unwrap_err().is_budget_exhausted());
    // From a scope whose deadline passed.
    let expired = Scope::with_timeout(ms(20));
    tokio::time::sleep(ms(20)).await;
    let mut req = Request::new(());
    req.extensions_mut().insert(expired);
    assert!(inventory.call(req).await.is_err());

    let m = t.metrics();
    for reason in ["no_scope", "cancelled", "min_useful", "deadline"] {
        let labels = [("dependency", "inventory"), ("reason", reason)];
        assert_eq!(m.counter(telemetry::CALL_REFUSED, &labels), 1, "{reason}");
    }
    assert!(m.label_sets(telemetry::CALL_BUDGET).is_empty());
    assert!(t.traces.spans(telemetry::CALL_SPAN).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_calls_own_deadline_counts_once_and_its_parents_cancel_only_as_the_parents() {
    let t = Telemetry::install();
    let capped = PropagateLayer::new()
        .dependency("payments")
        .egress(EgressPolicy::builder().cap(ms(100)).build());
    let mut payments = capped.layer(Fn_(hangs));
    let request = Scope::with_timeout(ms(1_000));
    let mut req = Request::new(());
    req.extensions_mut().insert(request.clone());
    assert!(payments.call(req).await.unwrap_err().is_deadline_exceeded());

    // A call stopped by its request's cancel: the request's cause, not the call's.
    let mut req = Request::new(());
    req.extensions_mut().insert(request.clone());
    let call = tokio::spawn(payments.call(req));
    tokio::time::sleep(ms(10)).await;
    request.cancel();
    assert!(call.await.unwrap().is_err());

    let m = t.metrics();
    let cause = [("cause", "deadline_exceeded")];
    assert_eq!(m.counter(telemetry::SCOPE_CANCELLED, &cause), 1);
    // The request (a root) counts its own cancel; the call it cut is not counted again.
    let cause = [("cause", "cancelled")];
    assert_eq!(m.counter(telemetry::SCOPE_CANCELLED, &cause), 1);
    assert_eq!(m.label_sets(telemetry::SCOPE_CANCELLED).len(), 2);
    assert_eq!(
        m.histogram(telemetry::CALL_BUDGET, &[("dependency", "payments")]),
        [0.1, 0.1]
    );
    let spans = t.traces.spans(telemetry::CALL_SPAN);
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].field("error.type"), Some("deadline_exceeded"));
    assert_eq!(spans[1].field("error.type"), None);
}

#[tokio::test(start_paused = true)]
async fn a_call_without_a_name_is_unnamed() {
    let t = Telemetry::install();
    let mut client = PropagateLayer::new().layer(Fn_(downstream));
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(Scope::with_timeout(Duration::from_secs(1)));
    client.call(req).await.unwrap();
    let m = t.metrics();
    let labels = [("dependency", telemetry::UNNAMED_DEPENDENCY)];
    assert_eq!(m.histogram(telemetry::CALL_BUDGET, &labels), [1.0]);
}

/// A gRPC downstream whose call's own status comes, as gRPC's does, in the trailers.
async fn not_found(_: Request<()>) -> Result<Response<Frames<false>>, Infallible> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "5".parse().unwrap());
    let frames = VecDeque::from([Frame::data(&b"\0\0\0\0\0"[..]), Frame::trailers(trailers)]);
    let mut res = Response::new(Frames::<false>(frames));
    res.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    Ok(res)
}

#[tokio::test(start_paused = true)]
async fn a_grpc_status_in_the_trailers_is_the_calls_status() {
    let t = Telemetry::install();
    let mut users = PropagateLayer::new()
        .dependency("users")
        .layer(Fn_(not_found));
    let mut req = Request::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    req.extensions_mut().insert(Scope::with_timeout(ms(1_000)));
    let res = users.call(req).await.unwrap();
    let mut body = Box::pin(res.into_body());
    while next_frame(&mut body).await.is_some() {}

    let span = t.traces.span(telemetry::CALL_SPAN);
    assert_eq!(span.field("rpc.response.status_code"), Some("NOT_FOUND"));
    assert_eq!(span.field("http.response.status_code"), None);
}
