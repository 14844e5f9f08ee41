//! The shadow fields of a request's spans — ours and the server's own `RequestSpan` — and the
//! counters of refusals the rejection cap let through.

use std::convert::Infallible;

use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::telemetry;
use cancel_scope::wire::{EndpointPolicy, Mode, RejectionCap};
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::capture::Telemetry;
use crate::support::time::ms;
use crate::support::tower::{next_report, reporting, Fn_};

/// Answers after 300 ms of work.
async fn slow(_: Request<()>) -> Result<Response<String>, Infallible> {
    tokio::time::sleep(ms(300)).await;
    Ok(Response::new("ok".to_owned()))
}

async fn ok(_: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("ok".to_owned()))
}

fn with(value: &str) -> Request<()> {
    Request::builder()
        .header("grpc-timeout", value)
        .body(())
        .unwrap()
}

/// Calls `svc` with `req` inside a server span made by `RequestSpan`, as tower-http's
/// `TraceLayer` would, and waits for the answer there.
async fn in_server_span<S, B>(svc: &mut S, req: Request<()>) -> u16
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let outer = telemetry::RequestSpan::new().make(&req);
    let res = {
        let _in = outer.enter();
        svc.call(req)
    };
    let _in = outer.enter();
    res.await.unwrap().status().as_u16()
}

#[tokio::test(start_paused = true)]
async fn the_servers_request_span_gets_the_mode_and_the_would_be_decision_budget_and_lateness() {
    let t = Telemetry::install();
    let policy = EndpointPolicy::new(ms(2_000), ms(1_000))
        .min_useful(ms(100))
        .mode(Mode::Shadow);
    let (layer, mut reports) = reporting(policy);
    let mut svc = layer.layer(Fn_(slow));
    // Would be admitted with 200 ms, and the handler answers 100 ms after that; would be
    // clamped to 2 s; would be refused (too little budget).
    for value in ["200m", "9S", "10m"] {
        assert_eq!(in_server_span(&mut svc, with(value)).await, 200, "{value}");
        next_report(&mut reports).await;
    }
    let theirs = t.traces.spans("request");
    let ours = t.traces.spans(telemetry::REQUEST_SPAN);
    assert_eq!((theirs.len(), ours.len()), (3, 3));
    for spans in [&theirs, &ours] {
        assert!(spans
            .iter()
            .all(|s| s.field("cancel_scope.mode") == Some("shadow")));
        let [admitted, clamped, refused] = &spans[..] else {
            unreachable!()
        };
        assert_eq!(admitted.field("cancel_scope.would_be"), Some("admitted"));
        assert_eq!(
            admitted.field("cancel_scope.would_be_budget_ms"),
            Some("200")
        );
        assert_eq!(admitted.field("cancel_scope.would_be_late_ms"), Some("100"));
        assert_eq!(clamped.field("cancel_scope.would_be"), Some("clamped"));
        assert_eq!(
            clamped.field("cancel_scope.would_be_budget_ms"),
            Some("2000")
        );
        assert_eq!(clamped.field("cancel_scope.would_be_late_ms"), None);
        assert_eq!(refused.field("cancel_scope.would_be"), Some("refused"));
        assert_eq!(refused.field("cancel_scope.would_be_refused"), Some("true"));
        assert_eq!(refused.field("cancel_scope.over_rejection_cap"), None);
    }
    // Enforcing, the server's span says so, and nothing would-be.
    let mut svc = AdmitLayer::new(policy.mode(Mode::Enforce)).layer(Fn_(ok));
    assert_eq!(in_server_span(&mut svc, with("500m")).await, 200);
    let theirs = t.traces.spans("request");
    let last = theirs.last().unwrap();
    assert_eq!(last.field("cancel_scope.mode"), Some("enforce"));
    assert_eq!(last.field("cancel_scope.would_be"), None);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_over_the_rejection_cap_counts_as_shadowed_and_says_so_on_the_spans() {
    let t = Telemetry::install();
    let cap = RejectionCap::new(0, ms(10_000)); // every refusal let through
    let layer = AdmitLayer::new(EndpointPolicy::new(ms(2_000), ms(1_000)).min_useful(ms(100)))
        .rejection_cap(&cap);
    let mut svc = layer.layer(Fn_(ok));
    for value in ["12x", "10m"] {
        assert_eq!(in_server_span(&mut svc, with(value)).await, 200, "{value}");
    }
    let m = t.metrics();
    for reason in ["invalid", "exhausted"] {
        let labels = [("reason", reason)];
        assert_eq!(
            m.counter(telemetry::ADMISSION_REJECTION_CAPPED, &labels),
            1,
            "{reason}"
        );
        assert_eq!(
            m.counter(telemetry::SHADOW_ADMISSION_REJECTED, &labels),
            1,
            "{reason}"
        );
        assert_eq!(m.counter(telemetry::ADMISSION_REJECTED, &labels), 0);
    }
    for name in ["request", telemetry::REQUEST_SPAN] {
        for span in t.traces.spans(name) {
            assert_eq!(span.field("cancel_scope.mode"), Some("shadow"), "{name}");
            assert_eq!(span.field("cancel_scope.would_be"), Some("refused"));
            assert_eq!(span.field("cancel_scope.over_rejection_cap"), Some("true"));
        }
    }
    assert_eq!(cap.let_through(), 2);
}
