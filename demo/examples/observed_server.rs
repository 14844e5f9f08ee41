//! An axum service whose budgets an operator can see: `AdmitLayer` admits each request, the
//! handler calls a downstream service with what is left, `tracing-subscriber` prints the
//! crate's spans and events (DEBUG: the request's span, its call's span, the report), and a
//! Prometheus endpoint at `/metrics` shows the crate's metrics (explicit histogram buckets, in
//! seconds). With `--requests N` it sends itself N requests (the last one with too short a
//! budget for the downstream), prints the crate's lines of `/metrics`, and stops: what CI runs.
//!
//! ```sh
//! cargo run --example observed_server                  # serves until Ctrl-C; try:
//! curl -H 'grpc-timeout: 300m' http://127.0.0.1:3000/quote/7
//! curl -s http://127.0.0.1:3000/metrics | grep cancel_scope
//! cargo run --example observed_server -- --requests 3  # sends itself 3 requests, then stops
//! ```

use std::io::IsTerminal;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::integrations::CallError;
use cancel_scope::telemetry;
use cancel_scope::wire::{EndpointPolicy, ServerScope};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Bucket bounds of every histogram, in seconds: budgets and waits from 1 ms to 10 s.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The downstream: a price, after 50 ms of work (a plain axum service).
async fn price(Path(item): Path<u32>) -> String {
    tokio::time::sleep(Duration::from_millis(50)).await;
    format!("{}", item * 100 + 99)
}

/// The edge: a quote for `item` from the downstream, within the request's budget. The call is
/// named `prices` in telemetry (a static name: never a host).
async fn quote(State(prices): State<String>, Path(item): Path<u32>) -> Result<String, CallError> {
    let res = reqwest::Client::new()
        .get(format!("{prices}/price/{item}"))
        .scoped()
        .dependency("prices")
        .send()
        .await?;
    Ok(format!("item {item}: {} cents\n", res.text().await?))
}

async fn listen(port: u16) -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// The Prometheus recorder, installed for the whole process, with the crate's metrics
/// described; its upkeep (draining histograms) runs every 5 s.
fn install_prometheus() -> PrometheusHandle {
    let handle = PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .expect("bucket bounds")
        .install_recorder()
        .expect("no other recorder installed");
    telemetry::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    handle
}

#[tokio::main]
async fn main() {
    let requests: Option<u32> = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [flag, n] if flag == "--requests" => Some(n.parse().expect("--requests N")),
        [] => None,
        _ => panic!("usage: observed_server [--requests N]"),
    };
    // The crate's spans and events at DEBUG (`target: cancel_scope`), everything else at INFO.
    let only_ours = Targets::new()
        .with_target("cancel_scope", Level::DEBUG)
        .with_default(Level::INFO);
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    tracing_subscriber::registry()
        .with(stderr.with_filter(only_ours))
        .init();
    let prometheus = install_prometheus();

    let (listener, prices) = listen(0).await;
    let downstream = Router::new().route("/price/{item}", get(price));
    tokio::spawn(async move { axum::serve(listener, downstream).await.unwrap() });

    // Callers get at most 2 s (1 s when they say nothing); 20 ms are kept for the answer.
    let policy = EndpointPolicy::builder(Duration::from_secs(2))
        .default_budget(Duration::from_secs(1))
        .reserve(Duration::from_millis(20))
        .build();
    let server = ServerScope::new();
    // Each request's report, once it is quiet (its metrics and event are recorded by then).
    let (reported, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let admit = AdmitLayer::new(policy)
        .server(&server)
        .on_report(move |_, _| {
            let _ = reported.send(());
        });
    let app = Router::new()
        .route("/quote/{item}", get(quote))
        .with_state(prices)
        // The layer applies to the routes above it: `/metrics` is not admitted.
        .layer(admit)
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        );
    let (listener, url) = listen(if requests.is_some() { 0 } else { 3000 }).await;
    eprintln!("serving on {url}/quote/{{item}} and {url}/metrics");
    let serving = axum::serve(listener, app).with_graceful_shutdown(server.draining());
    let serving = tokio::spawn(async move { serving.await.unwrap() });

    if let Some(n) = requests {
        let client = reqwest::Client::new();
        for item in 1..=n {
            // The last request's budget is shorter than the downstream's 50 ms.
            let budget = if item == n { "30m" } else { "500m" };
            let res = client
                .get(format!("{url}/quote/{item}"))
                .header("grpc-timeout", budget)
                .send()
                .await
                .unwrap();
            let want = if item == n { 504 } else { 200 };
            assert_eq!(res.status(), want, "request {item}");
            let status = res.status().as_u16();
            println!("{status} {}", res.text().await.unwrap().trim_end());
        }
        for _ in 0..n {
            reports.recv().await.unwrap();
        }
        let metrics = client
            .get(format!("{url}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let ours: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("cancel_scope_") && !l.contains("_bucket{"))
            .collect();
        assert!(
            ours.iter()
                .any(|l| l.starts_with("cancel_scope_scope_cancelled{cause=\"deadline_exceeded\"}")),
            "the last request's deadline is counted: {metrics}"
        );
        for line in ours {
            println!("{line}");
        }
        println!("{}", server.shutdown(Duration::from_secs(5)).await);
    } else {
        tokio::signal::ctrl_c().await.unwrap();
        server.shutdown(Duration::from_secs(5)).await;
    }
    serving.await.unwrap();
}
