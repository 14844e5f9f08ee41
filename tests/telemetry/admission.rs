//! An admitted request's budget, queue wait, span and report; refusals by reason, at WARN
//! only for bad input.

use std::convert::Infallible;
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, Ingress};
use cancel_scope::telemetry;
use cancel_scope::wire::{EndpointPolicy, OverCap, ServerScope};
use cancel_scope::Scope;
use http::{Request, Response};
use tokio::time::{advance, Instant};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Level;

use crate::capture::{text, Telemetry};
use crate::support::time::ms;
use crate::support::tower::{next_report, reporting, Fn_};

async fn ok(_: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("ok".to_owned()))
}

/// The reason and level of each refusal event, in order.
fn refusal_levels(t: &Telemetry) -> Vec<(String, Level)> {
    t.traces
        .events("request refused at admission")
        .into_iter()
        .map(|e| (e.field("cancel_scope.reason").unwrap().to_owned(), e.level))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_admitted_request_records_its_budget_span_and_report() {
    let t = Telemetry::install();
    let policy = EndpointPolicy::builder(ms(2_000))
        .default_budget(ms(1_000))
        .version(7)
        .build();
    let (layer, mut reports) = reporting(policy);
    let mut svc = layer.layer(Fn_(ok));
    // It waited 30 ms before it was admitted.
    let ingress = Instant::now();
    advance(ms(30)).await;
    let mut req = Request::builder()
        .header("grpc-timeout", "500m")
        .body(())
        .unwrap();
    req.extensions_mut().insert(Ingress(ingress));
    let res = svc.call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(text(res.into_body()).await, "ok");
    let (admission, report) = next_report(&mut reports).await;
    assert_eq!(report.succeeded(), 1);

    let m = t.metrics();
    let labels = [("source", "grpc_timeout"), ("clamped", "false")];
    assert_eq!(m.histogram(telemetry::ADMISSION_BUDGET, &labels), [0.47]);
    assert_eq!(m.histogram(telemetry::ADMISSION_QUEUE_WAIT, &[]), [0.03]);
    assert_eq!(m.counter(telemetry::RECEIPTS, &[("kind", "succeeded")]), 1);
    assert_eq!(m.label_sets(telemetry::RECEIPTS).len(), 1);
    assert_eq!(m.histogram(telemetry::SCOPE_ORPHAN_WORK, &[]), [0.0]);
    // Not cancelled: no cancel, no time from a cancel to quiet.
    assert!(m.label_sets(telemetry::SCOPE_CANCELLED).is_empty());
    assert!(m
        .histogram(telemetry::SCOPE_CANCEL_TO_QUIET, &[])
        .is_empty());
    assert!(m.label_sets(telemetry::ADMISSION_REJECTED).is_empty());

    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(
        span.field("cancel_scope.operation_id"),
        Some(admission.operation_id())
    );
    assert_eq!(span.field("cancel_scope.budget_in_ms"), Some("500"));
    assert_eq!(span.field("cancel_scope.budget_out_ms"), Some("470"));
    assert_eq!(
        span.field("cancel_scope.budget_source"),
        Some("grpc_timeout")
    );
    assert_eq!(span.field("cancel_scope.clamped"), Some("false"));
    assert_eq!(span.field("cancel_scope.priority"), Some("3"));
    assert_eq!(span.field("cancel_scope.priority_source"), Some("policy"));
    assert_eq!(span.field("cancel_scope.policy_version"), Some("7"));
    assert_eq!(span.field("http.response.status_code"), Some("200"));
    assert_eq!(span.field("error.type"), None);

    let event = t.traces.event("request report");
    assert_eq!(event.level, Level::DEBUG);
    assert_eq!(event.parent.as_deref(), Some(telemetry::REQUEST_SPAN));
    assert_eq!(event.field("cancel_scope.lifecycle"), Some("Completed"));
    assert_eq!(event.field("cancel_scope.receipts.succeeded"), Some("1"));
    assert_eq!(
        event.field("cancel_scope.operation_id"),
        Some(admission.operation_id())
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_span_is_a_child_of_the_servers_span_and_fills_a_declared_one() {
    let t = Telemetry::install();
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(Fn_(ok));
    let req = Request::builder()
        .header("grpc-timeout", "9S")
        .body(())
        .unwrap();
    // The server's own span, made as tower-http's `TraceLayer` would with `RequestSpan`.
    let outer = telemetry::RequestSpan::new().make(&req);
    let res = {
        let _in = outer.enter();
        svc.call(req)
    };
    let res = {
        let _in = outer.enter();
        res.await.unwrap()
    };
    assert_eq!(res.status(), 200);

    let span = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(span.parent.as_deref(), Some("request"));
    assert_eq!(span.field("cancel_scope.clamped"), Some("true"));
    let theirs = t.traces.span("request");
    assert_eq!(theirs.field("cancel_scope.budget_in_ms"), Some("9000"));
    assert_eq!(theirs.field("cancel_scope.budget_out_ms"), Some("2000"));
    assert_eq!(theirs.field("cancel_scope.clamped"), Some("true"));
    assert_eq!(
        theirs.field("cancel_scope.operation_id"),
        span.field("cancel_scope.operation_id")
    );
    let m = t.metrics();
    let labels = [("source", "grpc_timeout"), ("clamped", "true")];
    assert_eq!(m.histogram(telemetry::ADMISSION_BUDGET, &labels), [2.0]);
}

#[tokio::test(start_paused = true)]
async fn refused_requests_count_by_reason_and_warn_only_for_bad_input() {
    let t = Telemetry::install();
    let policy = EndpointPolicy::builder(ms(2_000))
        .default_budget(ms(1_000))
        .min_useful(ms(100))
        .build();
    let mut svc = AdmitLayer::new(policy).layer(Fn_(ok));
    let with = |value: &str| {
        Request::builder()
            .header("grpc-timeout", value)
            .body(())
            .unwrap()
    };
    assert_eq!(svc.call(with("12x")).await.unwrap().status(), 400);
    assert_eq!(svc.call(with("10m")).await.unwrap().status(), 504);
    let strict = EndpointPolicy::builder(ms(2_000))
        .default_budget(ms(1_000))
        .over_cap(OverCap::Reject)
        .build();
    let mut strict = AdmitLayer::new(strict).layer(Fn_(ok));
    assert_eq!(strict.call(with("9S")).await.unwrap().status(), 400);
    let server = ServerScope::new();
    let mut closed = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .server(&server)
    .layer(Fn_(ok));
    server.shutdown(Duration::ZERO).await;
    assert_eq!(closed.call(with("1S")).await.unwrap().status(), 503);

    let m = t.metrics();
    for reason in ["invalid", "exhausted", "over_cap", "shutdown"] {
        let n = m.counter(telemetry::ADMISSION_REJECTED, &[("reason", reason)]);
        assert_eq!(n, 1, "{reason}");
    }
    assert!(m
        .histogram(
            telemetry::ADMISSION_BUDGET,
            &[("source", "grpc_timeout"), ("clamped", "false")]
        )
        .is_empty());
    assert!(t.traces.spans(telemetry::REQUEST_SPAN).is_empty());
    let levels = refusal_levels(&t);
    assert_eq!(
        levels,
        [
            ("invalid".to_owned(), Level::WARN),
            ("exhausted".to_owned(), Level::DEBUG),
            ("over_cap".to_owned(), Level::WARN),
            ("shutdown".to_owned(), Level::DEBUG),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_fallback_budget_counts_as_the_default_source() {
    let t = Telemetry::install();
    let policy = EndpointPolicy::builder(ms(2_000))
        .default_budget(ms(1_000))
        .on_bad_input(cancel_scope::wire::OnBadInput::Fallback(ms(200)))
        .build();
    let mut svc = AdmitLayer::new(policy).layer(Fn_(ok));
    let req = Request::builder()
        .header("grpc-timeout", "garbage")
        .body(())
        .unwrap();
    assert_eq!(svc.call(req).await.unwrap().status(), 200);
    let m = t.metrics();
    let labels = [("source", "default"), ("clamped", "false")];
    assert_eq!(m.histogram(telemetry::ADMISSION_BUDGET, &labels), [0.2]);
}

#[cfg(feature = "tower-http")]
#[tokio::test(start_paused = true)]
async fn tower_https_trace_layer_with_request_span_gets_the_requests_fields() {
    use tower_http::trace::TraceLayer;

    let t = Telemetry::install();
    // tower-http's `Trace` takes requests with a body.
    let handler =
        Fn_(|_: Request<String>| async { Ok::<_, Infallible>(Response::new("ok".to_owned())) });
    let admit = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(handler);
    let mut svc = TraceLayer::new_for_http()
        .make_span_with(telemetry::RequestSpan::new())
        .layer(admit);
    let res = svc.call(budgeted_request("300m")).await.unwrap();
    assert_eq!(res.status(), 200);

    let theirs = t.traces.span("request");
    assert_eq!(theirs.field("cancel_scope.budget_in_ms"), Some("300"));
    assert_eq!(
        theirs.field("cancel_scope.budget_source"),
        Some("grpc_timeout")
    );
    let ours = t.traces.span(telemetry::REQUEST_SPAN);
    assert_eq!(ours.parent.as_deref(), Some("request"));
}

#[cfg(feature = "tower-http")]
fn budgeted_request(value: &str) -> Request<String> {
    Request::builder()
        .header("grpc-timeout", value)
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn without_on_report_the_report_is_recorded_at_the_end_of_the_body() {
    let t = Telemetry::install();
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(Fn_(ok));
    let res = svc.call(Request::new(())).await.unwrap();
    // The body is the request's last work: not reported while it streams...
    assert!(t.traces.events("request report").is_empty());
    assert_eq!(text(res.into_body()).await, "ok");
    // ...and reported as soon as it ended, with no task to wait for.
    assert_eq!(t.traces.event("request report").level, Level::DEBUG);
    let m = t.metrics();
    assert_eq!(m.counter(telemetry::RECEIPTS, &[("kind", "succeeded")]), 1);
}

#[tokio::test(start_paused = true)]
async fn without_on_report_work_left_running_is_reported_when_it_ends() {
    let t = Telemetry::install();
    let handler = Fn_(|_: Request<()>| async {
        let left = Scope::current().spawn(tokio::time::sleep(ms(50))).unwrap();
        drop(left);
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(handler);
    let res = svc.call(Request::new(())).await.unwrap();
    assert_eq!(text(res.into_body()).await, "");
    assert!(t.traces.events("request report").is_empty());
    // The work ends at 50 ms; the task that waited for the request to be quiet was woken
    // then, and runs before this one resumes (one thread, woken tasks in order).
    tokio::time::sleep(ms(50)).await;
    tokio::task::yield_now().await;
    let event = t.traces.event("request report");
    assert_eq!(event.field("cancel_scope.receipts.succeeded"), Some("2"));
    let m = t.metrics();
    assert_eq!(m.counter(telemetry::RECEIPTS, &[("kind", "succeeded")]), 2);
}

/// A request of a cancelled operation (admission with the registry) is counted under its own
/// reason, `operation_cancelled`, at DEBUG: it is not hostile input.
#[tokio::test(start_paused = true)]
async fn a_cancelled_operations_refusal_has_its_own_reason() {
    use std::sync::Arc;

    use cancel_scope::registry::{InProcessRegistry, OperationId, Operations};
    use cancel_scope::wire::Incoming;

    let t = Telemetry::install();
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let policy = EndpointPolicy::builder(ms(2_000)).build();
    let (_scope, admission) = policy
        .admit_joined(&ops, Incoming::new(), Instant::now())
        .await
        .unwrap();
    let id = OperationId::new(admission.operation_id()).unwrap();
    ops.cancel(&id).await.unwrap();
    let header = format!("v=1, rem=500, op=\"{}\"", id.as_str());
    let again = Incoming::new().service_budget(header.as_bytes());
    let err = policy
        .admit_joined(&ops, again, Instant::now())
        .await
        .unwrap_err();
    assert!(err.is_operation_cancelled(), "{err}");

    let m = t.metrics();
    let reason = [("reason", "operation_cancelled")];
    assert_eq!(m.counter(telemetry::ADMISSION_REJECTED, &reason), 1);
    assert_eq!(
        m.counter(telemetry::ADMISSION_REJECTED, &[("reason", "invalid")]),
        0
    );
    let levels = refusal_levels(&t);
    assert_eq!(levels, [("operation_cancelled".to_owned(), Level::DEBUG)]);
}

/// Through the server layer: a client's retry under an operation that was cancelled is
/// answered 409 and counted under `operation_cancelled` alone (not `invalid`, not twice), at
/// DEBUG; the first request, admitted, is not a refusal.
#[tokio::test(start_paused = true)]
async fn the_layers_409_for_a_cancelled_operation_counts_under_its_own_reason() {
    use std::sync::Arc;

    use cancel_scope::registry::{InProcessRegistry, OperationId, Operations};
    use cancel_scope::wire::service_operation;

    let t = Telemetry::install();
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let mut svc = AdmitLayer::new(EndpointPolicy::builder(ms(2_000)).build())
        .operations(&ops)
        .layer(Fn_(ok));
    let first = svc.call(Request::new(())).await.unwrap();
    assert_eq!(first.status(), 200);
    let value = first.headers()[service_operation::HEADER].clone();
    let id: OperationId = service_operation::parse(value.as_bytes()).unwrap();
    ops.cancel(&id).await.unwrap();
    let retry = Request::builder()
        .header(
            "service-budget",
            format!("v=1, rem=500, op={}", value.to_str().unwrap()),
        )
        .body(())
        .unwrap();
    let refused = svc.call(retry).await.unwrap();
    assert_eq!(refused.status(), 409);

    let m = t.metrics();
    assert_eq!(
        m.label_sets(telemetry::ADMISSION_REJECTED),
        [vec![(
            "reason".to_owned(),
            "operation_cancelled".to_owned()
        )]]
    );
    assert_eq!(
        m.counter(
            telemetry::ADMISSION_REJECTED,
            &[("reason", "operation_cancelled")]
        ),
        1
    );
    let levels = refusal_levels(&t);
    assert_eq!(levels, [("operation_cancelled".to_owned(), Level::DEBUG)]);
}
