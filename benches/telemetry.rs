//! What telemetry costs a request through `Admit`: the same build (features `tracing` and
//! `metrics`) with nothing installed, against a Prometheus recorder and a `tracing` subscriber
//! at INFO installed (the DEBUG spans are then disabled at their call sites; the metrics and
//! the report task run).
//!
//! `cargo bench --bench telemetry --features tower,tracing,metrics`

// `criterion_group!` defines a `pub fn` without documentation.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::EndpointPolicy;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

#[path = "support/hello.rs"]
mod hello;
#[path = "support/paired.rs"]
mod paired;
use hello::{one, Hello};
use paired::Paired;

/// A request with a `grpc-timeout` header.
fn request() -> Request<()> {
    Request::builder()
        .header("grpc-timeout", "500m")
        .body(())
        .unwrap()
}

/// A current-thread runtime of one side's own: the report tasks its requests spawn run in
/// its own turns, never in the other side's.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `n` requests through `svc` on `rt`, timed.
fn timed<S, B>(rt: &tokio::runtime::Runtime, svc: &mut S, n: u64) -> Duration
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body + Unpin,
{
    rt.block_on(async {
        let t = Instant::now();
        for _ in 0..n {
            one(svc, request()).await;
            // Lets the report task of the request run in this side's time.
            tokio::task::yield_now().await;
        }
        t.elapsed()
    })
}

fn admit(c: &mut Criterion) {
    let ms = Duration::from_millis;
    let policy = EndpointPolicy::builder(ms(2_000))
        .default_budget(ms(1_000))
        .build();
    let (off_rt, on_rt) = (runtime(), runtime());
    let mut off = AdmitLayer::new(policy).layer(Hello);
    let mut on = AdmitLayer::new(policy).layer(Hello);

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[0.001, 0.01, 0.1, 1.0, 10.0])
        .unwrap()
        .build_recorder();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .finish();
    let dispatch = tracing::Dispatch::new(subscriber);

    Paired::new("telemetry/admit", 256)
        .side("telemetry off (nothing installed)", |n| {
            timed(&off_rt, &mut off, n)
        })
        .side("prometheus recorder + subscriber at INFO", |n| {
            let _metrics = metrics::set_default_local_recorder(&recorder);
            let _tracing = tracing::dispatcher::set_default(&dispatch);
            timed(&on_rt, &mut on, n)
        })
        .run(c.benchmark_group("telemetry/admit"));
    let rendered = recorder.handle().render();
    assert!(
        rendered.contains("cancel_scope_admission_budget_count"),
        "the recorder saw the requests"
    );
}

criterion_group!(benches, admit);
criterion_main!(benches);
