//! Retries and hedges that pay from the request's budget, against a catalog service this
//! example starts on loopback. The policies live in the application's state (`BoxRetry`,
//! nameable, sharing one process-wide `RetryBudget`), classify with the built-in HTTP
//! classifier, and show what each call did: a flaky read retried with backoff, a slow replica
//! hedged (the loser cancelled and receipted), a write answered 503 never repeated, and a
//! backoff that does not fit the budget saying so.
//!
//! Run with `cargo run --example retry_and_hedge`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use cancel_scope::integrations::classify::HttpClassifier;
use cancel_scope::integrations::reqwest::{RequestBuilderExt, ScopedRequest};
use cancel_scope::integrations::CallError;
use cancel_scope::retry::{BoxRetry, Exponential, HedgeDelay, Retry, RetryBudget, Stop};
use cancel_scope::{ChildSpec, Lifecycle, Scope};

const MS: Duration = Duration::from_millis(1);

/// The catalog: `/flaky` fails twice with 503, `/replica` stalls its first request for 5 s (a
/// GC pause) and answers the others in 10 ms, `/order` is down (503) for writes and reads.
async fn catalog() -> String {
    let (flaky, replica) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let app = Router::new()
        .route(
            "/flaky",
            get(move || async move {
                match flaky.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err(StatusCode::SERVICE_UNAVAILABLE),
                    _ => Ok("lamp"),
                }
            }),
        )
        .route(
            "/replica",
            get(move || async move {
                let pause = if replica.fetch_add(1, Ordering::SeqCst) == 0 {
                    5_000
                } else {
                    10
                };
                tokio::time::sleep(pause * MS).await;
                "chair"
            }),
        )
        .route("/order", post(down).get(down));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn down() -> StatusCode {
    StatusCode::SERVICE_UNAVAILABLE
}

/// The application's state: named policies, one retry budget for the dependency.
struct State {
    http: reqwest::Client,
    catalog: String,
    reads: BoxRetry<CallError>,
    writes: BoxRetry<CallError>,
}

impl State {
    /// One attempt: a scoped GET or POST of `path`, its status an error if it is one.
    fn call(&self, post: bool, path: &str, scope: &Scope) -> ScopedRequest {
        let url = format!("{}{path}", self.catalog);
        let req = if post {
            self.http.post(url)
        } else {
            self.http.get(url)
        };
        req.scoped_in(scope)
    }
}

#[tokio::main]
async fn main() {
    let budget = Arc::new(RetryBudget::new(20)); // retries: at most 20 % of requests, plus 10
    let state = Arc::new(State {
        http: reqwest::Client::new(),
        catalog: catalog().await,
        reads: Retry::boxed(HttpClassifier::new())
            .max_attempts(3)
            .backoff(Exponential::new(20 * MS, 200 * MS))
            .budget(budget.clone()),
        writes: Retry::boxed(HttpClassifier::new()).budget(budget.clone()),
    });
    let request = Scope::with_timeout(2_000 * MS);

    // A flaky read: two 503s, each backed off, then the answer.
    let lamp = state
        .reads
        .run(&request, ChildSpec::read_only("flaky"), |a| {
            let call = state.call(false, "/flaky", a.scope());
            async move { call.send().await?.error_for_status()?.text().await }
        })
        .await
        .unwrap();
    println!("flaky: {lamp}");

    // A slow replica: after 100 ms a hedge starts, answers first, and the stalled attempt is
    // cancelled (with its receipt) before the call returns.
    let hedge = state.reads.clone().hedge(HedgeDelay::Fixed(100 * MS));
    let (chair, ledger) = hedge
        .run_with_ledger(&request, ChildSpec::read_only("replica"), |a| {
            let call = state.call(false, "/replica", a.scope());
            async move { call.send().await?.error_for_status()?.text().await }
        })
        .await;
    println!("replica: {} ({ledger})", chair.unwrap());

    // A write answered 503 may have had its effect: one attempt, never repeated.
    let spec = ChildSpec::side_effecting("order", "order-17");
    let err = state
        .writes
        .run(&request, spec, |a| {
            let call = state.call(true, "/order", a.scope());
            async move { call.send().await?.error_for_status().map(drop) }
        })
        .await
        .unwrap_err();
    println!("order: {err:#}");
    let write_stop = err.stop().clone();

    // A backoff longer than what is left is not slept, and the error says it was the backoff.
    let short = request.child().name("short").cap(100 * MS).build().unwrap();
    let err = Retry::boxed(HttpClassifier::new())
        .backoff(vec![500 * MS])
        .run(&short, ChildSpec::read_only("order-status"), |a| {
            let call = state.call(false, "/order", a.scope());
            async move { call.send().await?.error_for_status().map(drop) }
        })
        .await
        .unwrap_err();
    println!("order status: {err}");

    request.close();
    let report = request.quiesce().await;
    println!("request: {report}");
    println!("retry budget: {budget:?}");
    let ok = write_stop == Stop::EffectUnknown
        && matches!(err.stop(), Stop::BackoffTooLong(_))
        && (ledger.started(), ledger.hedges()) == (2, 1)
        && report.state() == Lifecycle::NeedsReconciliation
        && report.retry_ledgers().len() == 4;
    if !ok {
        eprintln!("unexpected outcome");
        std::process::exit(1);
    }
}
