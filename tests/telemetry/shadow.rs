//! Shadow mode's counters, kept apart from the enforced ones, and the shadow fields of a
//! request's spans — ours and the server's own `RequestSpan` — also for refusals the
//! rejection cap let through.

use std::convert::Infallible;

use cancel_scope::integrations::tower::admit::ResponseBody;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::telemetry;
use cancel_scope::wire::{EndpointPolicy, Mode, RejectionCap};
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::capture::{Metrics, Telemetry};
use crate::support::time::ms;
use crate::support::tower::{next_report, reporting, Fn_, Reports};

/// Answers after 300 ms of work.
async fn slow(_: Request<()>) -> Result<Response<String>, Infallible> {
    tokio::time::sleep(ms(300)).await;
    Ok(Response::new("ok".to_owned()))
}

async fn ok(_: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("ok".to_owned()))
}

/// One `invalid` and one `exhausted` refusal counted as shadowed, never as enforced, and
/// `capped` times each as let through by the rejection cap.
fn assert_counted_as_shadowed(m: &Metrics, capped: u64) {
    for reason in ["invalid", "exhausted"] {
        let labels = [("reason", reason)];
        let count = |name| m.counter(name, &labels);
        assert_eq!(count(telemetry::SHADOW_ADMISSION_REJECTED), 1, "{reason}");
        assert_eq!(count(telemetry::ADMISSION_REJECTED), 0, "{reason}");
        assert_eq!(
            count(telemetry::ADMISSION_REJECTION_CAPPED),
            capped,
            "{reason}"
        );
    }
}

/// A shadowing layer (maximum 2 s, default 1 s, minimum useful 100 ms) over [`slow`], its
/// reports, and its policy.
fn shadowed_slow_service() -> (
    impl Service<Request<()>, Response = Response<ResponseBody<String>>, Error = Infallible>,
    Reports,
    EndpointPolicy,
) {
    let policy = EndpointPolicy::builder(ms(2_000))
        .default_budget(ms(1_000))
        .min_useful(ms(100))
        .mode(Mode::Shadow)
        .build();
    let (layer, reports) = reporting(policy);
    (layer.layer(Fn_(slow)), reports, policy)
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
    let (mut svc, mut reports, policy) = shadowed_slow_service();
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
    let mut svc = AdmitLayer::new(policy.to_builder().mode(Mode::Enforce).build()).layer(Fn_(ok));
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
    let layer = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .min_useful(ms(100))
            .build(),
    )
    .rejection_cap(&cap);
    let mut svc = layer.layer(Fn_(ok));
    for value in ["12x", "10m"] {
        assert_eq!(in_server_span(&mut svc, with(value)).await, 200, "{value}");
    }
    let m = t.metrics();
    assert_counted_as_shadowed(&m, 1);
    for name in ["request", telemetry::REQUEST_SPAN] {
        for span in t.traces.spans(name) {
            assert_eq!(span.field("cancel_scope.mode"), Some("shadow"), "{name}");
            assert_eq!(span.field("cancel_scope.would_be"), Some("refused"));
            assert_eq!(span.field("cancel_scope.over_rejection_cap"), Some("true"));
        }
    }
    assert_eq!(cap.let_through(), 2);
}

#[tokio::test(start_paused = true)]
async fn shadow_decisions_count_under_their_own_names_not_as_enforced_ones() {
    let t = Telemetry::install();
    let (mut svc, mut reports, _) = shadowed_slow_service();
    let with = |value: &str| {
        Request::builder()
            .header("grpc-timeout", value)
            .body(())
            .unwrap()
    };
    // Bad input, too little budget, and a deadline the handler overruns: all run.
    for value in ["12x", "10m", "200m"] {
        assert_eq!(
            svc.call(with(value)).await.unwrap().status(),
            200,
            "{value}"
        );
        let (_, report) = next_report(&mut reports).await;
        assert_eq!(report.would_be().len(), 1, "{value}: {report}");
    }
    let m = t.metrics();
    assert_counted_as_shadowed(&m, 0);
    assert_eq!(m.counter(telemetry::SHADOW_DEADLINE_EXCEEDED, &[]), 1);
    let spans = t.traces.spans(telemetry::REQUEST_SPAN);
    assert_eq!(spans.len(), 3);
    assert!(spans
        .iter()
        .all(|s| s.field("cancel_scope.mode") == Some("shadow")));
    let refused = spans
        .iter()
        .filter(|s| s.field("cancel_scope.would_be_refused") == Some("true"))
        .count();
    assert_eq!(refused, 2);
    assert!(spans
        .iter()
        .any(|s| s.field("cancel_scope.would_be_budget_ms") == Some("200")));
    // (The responses above were dropped unread: client gone, in every mode.)
    let deadline = [("cause", "deadline_exceeded")];
    assert_eq!(m.counter(telemetry::SCOPE_CANCELLED, &deadline), 0);
}

#[tokio::test(start_paused = true)]
async fn a_child_past_its_own_would_be_deadline_counts_as_a_shadow_deadline_cancel() {
    use cancel_scope::wire::Incoming;
    let t = Telemetry::install();
    let policy = EndpointPolicy::builder(ms(5_000))
        .default_budget(ms(1_000))
        .mode(Mode::Shadow)
        .build();
    let (scope, _) = policy
        .admit(
            Incoming::new().grpc_timeout(b"100m"),
            tokio::time::Instant::now(),
        )
        .unwrap();
    // Would-be deadlines at 70 ms (late) and 100 ms less 10 ms (in time).
    for (reserve, runs) in [(30, 85), (10, 0)] {
        let db = scope.child().reserve(ms(reserve)).build().unwrap();
        db.run(tokio::time::sleep(ms(runs))).await.unwrap();
    }
    let m = t.metrics();
    assert_eq!(m.counter(telemetry::SHADOW_DEADLINE_EXCEEDED, &[]), 1);
    let enforced = [("cause", "deadline_exceeded")];
    assert_eq!(m.counter(telemetry::SCOPE_CANCELLED, &enforced), 0);
}
