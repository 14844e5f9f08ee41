//! A graceful shutdown with axum: three requests are in flight when the server is told to stop
//! — a quick one, a slow one, and one that has sent a payment downstream — and the server gives
//! them one second: the quick one finishes, the other two are cancelled with
//! `Cause::Shutdown` (the slow one answers 503 with `Retry-After`, the payment 500 with
//! `service-effect: unknown`: retrying it could pay twice), a request that comes meanwhile is
//! refused with 503, and the shutdown's report lists the payment for reconciliation.
//!
//! ```sh
//! cargo run --example graceful_shutdown
//! ```
//!
//! It checks its own claims and exits with 1 if one does not hold.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{EndpointPolicy, ServerScope};
use cancel_scope::{ChildSpec, Scope};
use tokio::sync::Semaphore;

/// `/work/{ms}` works that long; `/pay` sends a payment (a side-effecting call that has not
/// answered) and waits for it. Each adds a permit to `started` first.
async fn handler(State(started): State<Arc<Semaphore>>, Path(what): Path<String>) -> String {
    started.add_permits(1);
    if let Ok(ms) = what.parse() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return "done\n".to_owned();
    }
    let scope = Scope::current();
    let _payment = scope
        .register(ChildSpec::side_effecting("payment", "order-17"))
        .and_then(|t| t.dispatch())
        .unwrap();
    std::future::pending().await
}

#[tokio::main]
async fn main() -> ExitCode {
    let server = ServerScope::new().stop_grace(Duration::from_millis(200));
    let started = Arc::new(Semaphore::new(0));
    let policy = EndpointPolicy::builder(Duration::from_secs(60)).build();
    let app = Router::new()
        .route("/{what}", get(handler))
        .with_state(started.clone())
        .layer(AdmitLayer::new(policy).server(&server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Not told to stop accepting yet: a late request reaches the layer, which refuses it.
    let serving = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let client = reqwest::Client::new();
    let get = |path: &'static str| tokio::spawn(client.get(format!("{url}{path}")).send());
    let requests = [get("/100"), get("/60000"), get("/pay")];
    let _all_in = started.acquire_many(3).await.unwrap();

    println!("shutting down with 3 requests in flight and a grace period of 1 s");
    let shutdown = {
        let server = server.clone();
        tokio::spawn(async move { server.shutdown(Duration::from_secs(1)).await })
    };
    server.draining().await;
    let late = client.get(format!("{url}/100")).send().await.unwrap();
    let mut ok = late.status() == 503;
    println!(
        "a late request: {} {:?}",
        late.status(),
        late.headers().get("retry-after")
    );

    let mut statuses = Vec::new();
    for (path, request) in ["/100", "/60000", "/pay"].into_iter().zip(requests) {
        let res = request.await.unwrap().unwrap();
        let effect = res.headers().get("service-effect").cloned();
        println!("{path}: {} (service-effect: {effect:?})", res.status());
        statuses.push(res.status().as_u16());
    }
    ok &= statuses == [200, 503, 500];
    let report = shutdown.await.unwrap();
    println!("{report}");
    ok &= (report.in_flight(), report.finished(), report.cancelled()) == (3, 1, 2);
    ok &= report
        .pending_effects()
        .iter()
        .any(|e| e.effect_id() == "order-17");
    serving.abort();
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("a claim did not hold");
        ExitCode::FAILURE
    }
}
