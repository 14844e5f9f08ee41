//! reqwest calls inside a request's budget, against an inventory service this example starts
//! on loopback: a JSON answer read with `error_for_status` and `json`, a callee's empty 504
//! that is an error rather than an empty success, a busy answer retried by the built-in HTTP
//! classifier after its `Retry-After`, the same calls through a `reqwest-middleware` client,
//! and a body that trickles cut at the call's deadline. The request's report lists every call
//! and the retry's ledger.
//!
//! Run with `cargo run --example reqwest_client`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::classify::HttpClassifier;
use cancel_scope::integrations::reqwest::{redirect_policy, RequestBuilderExt, ScopedMiddleware};
use cancel_scope::retry::Retry;
use cancel_scope::{ChildSpec, Scope};

type Stock = HashMap<String, u32>;

/// The inventory: `/stock` as JSON, `/gave-up` an empty 504, `/busy` a 503 with
/// `Retry-After: 1` to its first request, `/slow` a body that never ends.
async fn inventory() -> String {
    let busy = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/stock", get(|| async { r#"{"apples": 3, "pears": 0}"# }))
        .route("/gave-up", get(|| async { StatusCode::GATEWAY_TIMEOUT }))
        .route(
            "/busy",
            get(move || async move {
                match busy.fetch_add(1, Ordering::SeqCst) {
                    0 => (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")]).into_response(),
                    _ => r#"{"apples": 3}"#.into_response(),
                }
            }),
        )
        .route(
            "/slow",
            get(|| async {
                let first = futures_util::stream::once(async { Ok::<_, std::io::Error>("[1,") });
                let rest = futures_util::stream::pending();
                axum::body::Body::from_stream(futures_util::StreamExt::chain(first, rest))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::main]
async fn main() {
    let url = inventory().await;
    let http = reqwest::Client::builder()
        .redirect(redirect_policy())
        .build()
        .unwrap();
    let request = Scope::with_timeout(Duration::from_secs(5));

    // A JSON answer: the status checked first, the body read within the call's deadline.
    let call = http
        .get(format!("{url}/stock"))
        .scoped_in(&request)
        .name("stock");
    let stock: Stock = call
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    println!("stock: {stock:?}");

    // A callee that gave up answers an empty 504: read as text it is "", an empty success.
    let call = http
        .get(format!("{url}/gave-up"))
        .scoped_in(&request)
        .name("gave-up");
    let err = call.send().await.unwrap().error_for_status().unwrap_err();
    println!("gave-up: {err} (status {:?})", err.status());

    // Busy: the classifier reads the 503's `Retry-After`, and the GET is retried a second later.
    let retry = Retry::new(HttpClassifier::new()).max_attempts(3);
    let busy = retry
        .run(&request, ChildSpec::read_only("busy"), |attempt| {
            let call = http.get(format!("{url}/busy")).scoped_in(attempt.scope());
            async move { call.send().await?.error_for_status()?.json::<Stock>().await }
        })
        .await
        .unwrap();
    println!("busy, then: {busy:?}");

    // The same calls through a `ClientWithMiddleware`: each a child of the current scope.
    let client = reqwest_middleware::ClientBuilder::new(http.clone())
        .with(ScopedMiddleware::new())
        .build();
    let res = request
        .run(client.get(format!("{url}/stock")).send())
        .await
        .unwrap();
    let body = res.unwrap().text().await.unwrap();
    println!("through the middleware: {body}");

    // A body that trickles: the read stops at the call's deadline, not the request's.
    let slow = request
        .child()
        .name("slow")
        .cap(Duration::from_millis(300))
        .build()
        .unwrap();
    let res = http
        .get(format!("{url}/slow"))
        .scoped_in(&slow)
        .send()
        .await
        .unwrap();
    let err = res.bytes().await.unwrap_err();
    println!("slow: {err} (deadline: {})", err.is_deadline_exceeded());

    request.close();
    let report = request.quiesce().await;
    println!("request: {report}");
    let ok = stock["apples"] == 3
        && err.is_deadline_exceeded()
        && busy["apples"] == 3
        && report.retry_ledgers().len() == 1
        && (report.succeeded(), report.failed(), report.cancelled()) == (4, 3, 1);
    if !ok {
        eprintln!("unexpected outcome");
        std::process::exit(1);
    }
}
