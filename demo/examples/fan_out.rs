//! An aggregation page fanned out over four loopback services on one budget: price and stock
//! are required, recommendations and reviews optional. Every branch is a child scope of the
//! request, calls its service with what is left (`scoped_in` the branch's scope), and the page
//! keeps 300 ms to aggregate. The first page is served without the slow recommendations
//! (absent, not an error); for the second the stock service fails, which fails the page at
//! once, names the branch and cancels the calls still in flight, each with its receipt.
//!
//! Run with `cargo run --example fan_out`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use cancel_scope::fanout::FanOut;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::{Lifecycle, Report, Scope};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// The four services: each answers after its latency; stock fails while `stock_down`.
async fn services(stock_down: Arc<AtomicBool>) -> String {
    async fn after(ms: u64, body: &'static str) -> &'static str {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        body
    }
    let app = Router::new()
        .route("/price", get(|| after(800, "19.99")))
        .route("/recommendations", get(|| after(5_000, "socks, hat")))
        .route("/reviews", get(|| after(150, "4.5")))
        .route(
            "/stock",
            get(move || async move {
                tokio::time::sleep(40 * MS).await;
                match stock_down.load(Ordering::SeqCst) {
                    true => Err(StatusCode::SERVICE_UNAVAILABLE),
                    false => Ok("7"),
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// One page: the four calls in parallel within a 1.5 s budget, 300 ms kept to aggregate (the
/// optional branches are cut at 1.2 s); the page's text, or why it failed, and the report.
async fn page(http: &reqwest::Client, url: &str) -> (Result<String, String>, Report) {
    let request = Scope::with_timeout(1_500 * MS);
    let mut fan = FanOut::new(&request).aggregate_reserve(300 * MS);
    let call = |path: &str| {
        let (http, url) = (http.clone(), format!("{url}{path}"));
        move |branch: Scope| async move {
            let res = http.get(url).scoped_in(&branch).send().await?;
            res.error_for_status()?.text().await
        }
    };
    let price = fan.required("price", call("/price"));
    let stock = fan.required("stock", call("/stock"));
    let recommendations = fan.optional("recommendations", call("/recommendations"));
    let reviews = fan.optional("reviews", call("/reviews"));
    let text = match fan.join().await {
        Ok(mut page) => Ok(format!(
            "price {}, stock {}, recommendations {:?}, reviews {:?}",
            page.required(price),
            page.required(stock),
            page.optional(recommendations),
            page.optional(reviews),
        )),
        Err(e) => Err(format!("{e} (branch {:?})", e.branch())),
    };
    request.close();
    (text, request.quiesce().await)
}

#[tokio::main]
async fn main() {
    let stock_down = Arc::new(AtomicBool::new(false));
    let url = services(stock_down.clone()).await;
    let http = reqwest::Client::new();

    let started = Instant::now();
    let (first, report) = page(&http, &url).await;
    let took = started.elapsed();
    println!("page 1 in {took:?}: {first:?}\n  {report}");
    let served = first.is_ok_and(|p| p.contains("recommendations None"))
        && took < 1_500 * MS
        && report.state() == Lifecycle::Completed;

    stock_down.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let (second, report) = page(&http, &url).await;
    let took = started.elapsed();
    println!("page 2 in {took:?}: {second:?}\n  {report}");
    let failed_fast = second.is_err_and(|e| e.contains("Some(\"stock\")"))
        && took < 800 * MS // the price (800 ms) was not waited for
        && report.cancelled() >= 2;

    if !(served && failed_fast) {
        eprintln!("unexpected outcome");
        std::process::exit(1);
    }
}
