//! The cost of telemetry under real load: an axum server with `AdmitLayer` answering a small
//! handler, driven by `wrk` on loopback, with telemetry off (the same build, nothing
//! installed) and on (a Prometheus recorder and a `tracing` subscriber at INFO), alternating
//! the sides round by round. Each side is a process of its own (this binary with
//! `--serve off|on`), since the metrics recorder is process-wide; the server runs one runtime
//! worker pinned to core 0 and `wrk` runs on core 1 where `taskset` is there.
//!
//! ```sh
//! apt-get install -y wrk
//! cargo bench --bench telemetry_load --features __test-servers,tracing,metrics
//! ```
//!
//! Options after `--`: `--rounds N` (default 10), `--seconds N` (default 3), `--connections N`
//! (default 32). Prints requests per second and p99 latency per side and round, and the ratio
//! (on / off): the median of each round's ratio of its two sides, which ran back to back and
//! so on the same machine state, with their range (a machine whose speed drifts over the run
//! moves both sides of a round alike, where it moves the medians of the sides apart).

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::EndpointPolicy;

#[path = "support/wrk.rs"]
mod wrk;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(args.get(i + 1).map(String::as_str) == Some("on"));
        return;
    }
    if !wrk::can_measure(&args, "telemetry_load") {
        return;
    }
    let measured = wrk::rounds(
        &["off", "on"],
        wrk::option(&args, "--rounds", 10).max(1),
        wrk::option(&args, "--seconds", 3),
        wrk::option(&args, "--connections", 32),
    );
    wrk::print_side("off", &measured[0]);
    wrk::print_side("on", &measured[1]);
    wrk::print_ratio(("on", &measured[1]), ("off", &measured[0]));
}

/// The server side: `AdmitLayer` around a hello handler on one runtime worker; with
/// `telemetry`, a Prometheus recorder and a subscriber at INFO (to a sink) installed first.
/// Prints its address on the first line of stdout, then serves until killed.
fn serve(telemetry: bool) {
    if telemetry {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.01, 0.1, 1.0, 10.0])
            .expect("buckets")
            .build_recorder();
        metrics::set_global_recorder(recorder).expect("the only recorder");
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let ms = Duration::from_millis;
        let app = Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(AdmitLayer::new(
                EndpointPolicy::builder(ms(2_000))
                    .default_budget(ms(1_000))
                    .build(),
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        axum::serve(listener, app).await.unwrap();
    });
}
