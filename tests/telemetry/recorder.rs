//! The metrics' descriptions, and a recorder installed after the first use.

use std::convert::Infallible;

use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::telemetry;
use cancel_scope::wire::EndpointPolicy;
use http::{Request, Response};
use metrics::Unit;
use metrics_util::debugging::DebuggingRecorder;
use metrics_util::MetricKind;
use tower_layer::Layer;
use tower_service::Service;

use crate::capture::Metrics;
use crate::support::time::ms;
use crate::support::tower::Fn_;

const NAMES: [&str; 11] = [
    telemetry::ADMISSION_BUDGET,
    telemetry::ADMISSION_QUEUE_WAIT,
    telemetry::ADMISSION_REJECTED,
    telemetry::CALL_BUDGET,
    telemetry::CALL_REFUSED,
    telemetry::SCOPE_CANCELLED,
    telemetry::SCOPE_CANCEL_TO_QUIET,
    telemetry::SCOPE_ORPHAN_WORK,
    telemetry::RECEIPTS,
    telemetry::RETRY_ATTEMPTS,
    telemetry::RETRY_BUDGET_EXHAUSTED,
];

#[test]
fn describe_gives_every_metric_its_unit() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        telemetry::describe();
        // The debugging recorder shows a description on the metrics that were registered.
        for name in NAMES {
            if name.ends_with("rejected")
                || name.ends_with("refused")
                || name.ends_with("cancelled")
                || name.ends_with("receipts")
                || name.ends_with("attempts")
                || name.ends_with("exhausted")
            {
                metrics::counter!(name).increment(1);
            } else {
                metrics::histogram!(name).record(1.0);
            }
        }
    });
    let m = Metrics::take(&snapshotter);
    assert_eq!(m.0.len(), NAMES.len());
    for seen in &m.0 {
        let want = match seen.kind {
            MetricKind::Histogram => Unit::Seconds,
            _ => Unit::Count,
        };
        assert_eq!(seen.unit, Some(want), "{}", seen.name);
        assert!(seen.name.starts_with("cancel_scope."), "{}", seen.name);
    }
}

#[tokio::test(start_paused = true)]
async fn a_recorder_installed_after_the_first_request_sees_the_next_ones() {
    let mut svc = AdmitLayer::new(
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .build(),
    )
    .layer(Fn_(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    // Before any recorder: recorded nowhere.
    svc.call(Request::new(())).await.unwrap();
    // Both alive at once: a thread tells recorders apart by their address.
    let recorders = [DebuggingRecorder::new(), DebuggingRecorder::new()];
    for (round, recorder) in recorders.iter().enumerate() {
        let snapshotter = recorder.snapshotter();
        let fut = metrics::with_local_recorder(recorder, || svc.call(Request::new(())));
        // The admission is recorded in `call`, under the recorder installed then.
        drop(fut);
        let m = Metrics::take(&snapshotter);
        let labels = [("source", "default"), ("clamped", "false")];
        assert_eq!(
            m.histogram(telemetry::ADMISSION_BUDGET, &labels),
            [1.0],
            "round {round}"
        );
    }
}
