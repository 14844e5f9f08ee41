//! Staged enforcement over real loopback servers (axum + reqwest, the real clock): a stage
//! that stops a read-only request but not a write, and enforced fractions honoured per
//! operation on every hop, nesting across hops.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Router};
use cancel_scope::wire::{fraction_bucket, Admission, EndpointPolicy, Stage, Trust};
use tokio::time::timeout;

use crate::support::servers::{call_next, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::reporting;

async fn serve(app: Router) -> String {
    let addr = crate::support::servers::serve(app).await;
    format!("http://{addr}/")
}

async fn ok() -> &'static str {
    "done"
}

#[tokio::test]
async fn a_read_only_stage_stops_a_read_only_request_but_not_a_write() {
    // A budget of 10 ms is below the minimum useful 50 ms: refused where enforced.
    let policy = EndpointPolicy::builder(ms(30_000))
        .min_useful(ms(50))
        .enforce_for(Stage::ReadOnly)
        .build();
    let (layer, mut reports) = reporting(policy);
    let url = serve(
        Router::new()
            .route("/", get(ok).post(ok).put(ok))
            .layer(layer),
    )
    .await;
    let client = reqwest::Client::new();
    let send = |req: reqwest::RequestBuilder| async move {
        req.header("grpc-timeout", "10m")
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(send(client.get(&url)).await, 504);
    assert_eq!(send(client.post(&url)).await, 200);
    assert_eq!(send(client.put(&url)).await, 200);
    for _ in 0..2 {
        let (a, report) = timeout(PATIENCE, reports.recv()).await.unwrap().unwrap();
        assert!(a.is_shadowed());
        assert!(report.would_be()[0].is_refusal(), "{report}");
    }
    // Idempotent writes next: the PUT is stopped, the POST still runs.
    let policy = policy.to_builder().enforce_for(Stage::Idempotent).build();
    let url = serve(
        Router::new()
            .route("/", get(ok).post(ok).put(ok))
            .layer(cancel_scope::integrations::tower::AdmitLayer::new(policy)),
    )
    .await;
    assert_eq!(send(client.put(&url)).await, 504);
    assert_eq!(
        send(client.post(&url).header("idempotency-key", "k-1")).await,
        504
    );
    assert_eq!(send(client.post(&url)).await, 200);
}

#[derive(Clone)]
struct Next {
    url: Option<String>,
    client: reqwest::Client,
}

/// Answers whether this hop shadowed the request, and what the hop below answered.
async fn hop(
    State(next): State<Next>,
    Extension(a): Extension<Admission>,
) -> Result<String, StatusCode> {
    let here = if a.is_shadowed() { "shadow" } else { "enforce" };
    let Some(url) = &next.url else {
        return Ok(here.to_owned());
    };
    let below = call_next(&next.client, url).await?;
    Ok(format!("{here} {below}"))
}

/// A chain of two trusted hops enforcing `first` and `second` percent of operations.
async fn two_hops(first: u8, second: u8) -> String {
    let policy = |p| {
        EndpointPolicy::builder(ms(30_000))
            .transport_pad(ms(1))
            .trust(Trust::Trusted)
            .enforced_percent(p)
            .build()
    };
    let client = reqwest::Client::new();
    let inner = serve(
        Router::new()
            .route("/", get(hop))
            .with_state(Next {
                url: None,
                client: client.clone(),
            })
            .layer(cancel_scope::integrations::tower::AdmitLayer::new(policy(
                second,
            ))),
    )
    .await;
    serve(
        Router::new()
            .route("/", get(hop))
            .with_state(Next {
                url: Some(inner),
                client,
            })
            .layer(cancel_scope::integrations::tower::AdmitLayer::new(policy(
                first,
            ))),
    )
    .await
}

/// What each hop of the chain at `url` did with each of `ops`.
async fn modes(url: &str, ops: &[String]) -> HashMap<String, String> {
    let client = reqwest::Client::new();
    let mut seen = HashMap::new();
    for op in ops {
        let res = client
            .get(url)
            .header("service-budget", format!("v=1, rem=20000, op={op}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        seen.insert(op.clone(), res.text().await.unwrap());
    }
    seen
}

#[tokio::test]
async fn enforced_fractions_hold_per_operation_on_every_hop_and_nest() {
    let ops: Vec<String> = (0..60).map(|i| format!("order-{i}")).collect();
    for percent in [0, 50, 100] {
        let url = two_hops(percent, percent).await;
        for (op, seen) in modes(&url, &ops).await {
            let mode = if fraction_bucket(&op) < percent {
                "enforce"
            } else {
                "shadow"
            };
            // The same on both hops, as the operation's bucket says.
            assert_eq!(seen, format!("{mode} {mode}"), "{op} at {percent} %");
        }
    }
    // 10 % at the first hop, 50 % at the second: enforced first means enforced second.
    let url = two_hops(10, 50).await;
    let seen = modes(&url, &ops).await;
    assert!(seen.values().all(|s| s != "enforce shadow"), "{seen:?}");
    assert!(seen.values().any(|s| s == "shadow enforce"), "{seen:?}");
}
