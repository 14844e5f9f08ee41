//! An axum service with a request budget: `AdmitLayer` admits each request into a scope
//! under a `ServerScope`, the handler takes its `Scope` and `Admission` as extractors, calls a
//! downstream service with what is left of the budget, and the server shuts down gracefully on
//! Ctrl-C (or, with `--requests N`, after sending itself N requests: what CI runs).
//!
//! ```sh
//! cargo run --example axum_server                  # serves until Ctrl-C; try:
//! curl -H 'grpc-timeout: 300m' http://127.0.0.1:3000/quote/7
//! cargo run --example axum_server -- --requests 3  # sends itself 3 requests, then stops
//! ```

use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::integrations::CallError;
use cancel_scope::wire::{Admission, EndpointPolicy, ServerScope};
use cancel_scope::Scope;

/// The downstream: a price, after 50 ms of work (a plain axum service).
async fn price(Path(item): Path<u32>) -> String {
    tokio::time::sleep(Duration::from_millis(50)).await;
    format!("{}", item * 100 + 99)
}

/// The edge: a quote for `item`, from the downstream, within the request's budget.
async fn quote(
    State(prices): State<String>,
    Path(item): Path<u32>,
    scope: Scope,
    admission: Admission,
) -> Result<String, CallError> {
    // `send_scoped` calls in a child of the request's scope: the downstream is told what is
    // left, and the call stops with the request.
    let client = reqwest::Client::new();
    let res = client
        .get(format!("{prices}/price/{item}"))
        .send_scoped()
        .await?;
    let price = res.text().await?;
    let left = scope.remaining().unwrap_or_default();
    Ok(format!(
        "item {item}: {price} cents (operation {}, {} ms left of {} ms)\n",
        admission.operation_id(),
        left.as_millis(),
        admission.initial_remaining().as_millis(),
    ))
}

async fn listen(port: u16) -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

#[tokio::main]
async fn main() {
    let requests: Option<u32> = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [flag, n] if flag == "--requests" => Some(n.parse().expect("--requests N")),
        [] => None,
        _ => panic!("usage: axum_server [--requests N]"),
    };

    let (listener, prices) = listen(0).await;
    let downstream = Router::new().route("/price/{item}", get(price));
    tokio::spawn(async move { axum::serve(listener, downstream).await.unwrap() });

    // Callers get at most 2 s (1 s when they say nothing); 20 ms are kept for the answer.
    let policy = EndpointPolicy::builder(Duration::from_secs(2))
        .default_budget(Duration::from_secs(1))
        .reserve(Duration::from_millis(20))
        .build();
    let server = ServerScope::new();
    let admit = AdmitLayer::new(policy)
        .server(&server)
        .on_report(|admission, report| eprintln!("{}: {report}", admission.operation_id()));
    let app = Router::new()
        .route("/quote/{item}", get(quote))
        .with_state(prices)
        .layer(admit);
    let (listener, url) = listen(if requests.is_some() { 0 } else { 3000 }).await;
    eprintln!("serving on {url}/quote/{{item}}");
    let serving = axum::serve(listener, app).with_graceful_shutdown(server.draining());
    let serving = tokio::spawn(async move { serving.await.unwrap() });

    match requests {
        Some(n) => {
            let client = reqwest::Client::new();
            for item in 1..=n {
                let res = client
                    .get(format!("{url}/quote/{item}"))
                    .header("grpc-timeout", "500m")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(res.status(), 200, "request {item}");
                print!("{}", res.text().await.unwrap());
            }
        }
        None => tokio::signal::ctrl_c().await.unwrap(),
    }
    let report = server.shutdown(Duration::from_secs(5)).await;
    println!("{report}");
    serving.await.unwrap();
}
