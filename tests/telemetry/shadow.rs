//! The counters and span fields of refusals the rejection cap let through.

use std::convert::Infallible;

use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::telemetry;
use cancel_scope::wire::{EndpointPolicy, RejectionCap};
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::capture::Telemetry;
use crate::support::time::ms;
use crate::support::tower::Fn_;

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
    for span in t.traces.spans(telemetry::REQUEST_SPAN) {
        assert_eq!(span.field("cancel_scope.mode"), Some("shadow"));
        assert_eq!(span.field("cancel_scope.would_be_refused"), Some("true"));
        assert_eq!(span.field("cancel_scope.over_rejection_cap"), Some("true"));
    }
    assert_eq!(cap.let_through(), 2);
}
