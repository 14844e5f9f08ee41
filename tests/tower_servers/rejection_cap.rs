//! The rejection cap (`AdmitLayer::rejection_cap`) over real loopback servers (axum + reqwest,
//! the real clock): a burst of invalid budget headers and of exhausted budgets hits the cap,
//! and the rest run shadowed, with a budget never longer than declared, on the plain path,
//! with the operation registry, and under policy versions swapped mid-burst.
//!
//! The window is 10 minutes, so that no request leaves it while the test runs however slow
//! the machine; the requests are sent one after another, so the count is exact. A request is
//! told refused from admitted by the `service-operation` header, which only an admitted
//! request's answer carries (an admitted request with 30 ms may still meet its deadline on a
//! loaded machine: its report says what it was given).

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::registry::{InProcessRegistry, Operations};
use cancel_scope::wire::{EndpointPolicy, RejectionCap};
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::support::servers::PATIENCE;
use crate::support::time::ms;
use crate::support::tower::Reports;

/// max 30 s, default 2 s, minimum useful 50 ms.
fn policy() -> EndpointPolicy {
    EndpointPolicy::builder(ms(30_000))
        .default_budget(ms(2_000))
        .min_useful(ms(50))
        .build()
}

/// 20 % over 10 minutes.
fn cap() -> RejectionCap {
    RejectionCap::new(20, ms(600_000))
}

/// `layer` with its reports sent to the returned channel.
fn reported<R>(layer: AdmitLayer<R>) -> (AdmitLayer<R>, Reports) {
    let (tx, rx) = mpsc::unbounded_channel();
    let layer = layer.on_report(move |a, r| {
        let _ = tx.send((a.clone(), r.clone()));
    });
    (layer, rx)
}

/// What a burst did: the bad requests refused, and the admitted requests' reports.
struct Burst {
    refused: usize,
    admitted: usize,
}

/// Sends 10 good requests, then 20 bad ones (invalid and exhausted, in turn) to `url`;
/// `between` runs after the 10th bad one.
async fn burst(url: &str, between: impl FnOnce()) -> Burst {
    let client = reqwest::Client::new();
    let send = |header: &'static str, value: &'static str| {
        let req = client.get(url).header(header, value);
        async move {
            let res = req.send().await.unwrap();
            (
                res.status().as_u16(),
                res.headers().contains_key("service-operation"),
            )
        }
    };
    for _ in 0..10 {
        assert_eq!(send("grpc-timeout", "5S").await, (200, true));
    }
    let mut between = Some(between);
    let mut out = Burst {
        refused: 0,
        admitted: 10,
    };
    for i in 0..20 {
        if i == 10 {
            between.take().unwrap()();
        }
        let (header, value) = match i % 4 {
            0 => ("grpc-timeout", "1 hour"),                    // malformed
            1 => ("grpc-timeout", "30m"),                       // below the minimum useful
            2 => ("service-budget", "v=1, rem=300, rem=99999"), // a repeated member
            _ => ("service-budget", "v=1, rem=40"),             // below the minimum useful
        };
        let (status, admitted) = send(header, value).await;
        if admitted {
            out.admitted += 1;
        } else {
            assert!([400, 504].contains(&status), "{status}");
            out.refused += 1;
        }
    }
    out
}

/// Every report of a burst's admitted requests: a refusal let through got at most what it
/// declared and at most the default, and it says so in its report.
async fn check_reports(reports: &mut Reports, admitted: usize) -> usize {
    let mut over = 0;
    for _ in 0..admitted {
        let (a, report) = timeout(PATIENCE, reports.recv()).await.unwrap().unwrap();
        if !a.is_over_rejection_cap() {
            assert!(report.would_be().is_empty(), "{report}");
            continue;
        }
        over += 1;
        let bound = a.declared().map_or(ms(2_000), |d| d.min(ms(2_000)));
        assert!(a.initial_remaining() <= bound, "{a:?}");
        // A bad header never gets more than a request that declares nothing.
        assert!(a.initial_remaining() <= ms(2_000), "{a:?}");
        assert!(report.would_be()[0].is_over_rejection_cap(), "{report}");
    }
    over
}

/// Serves `app`; its URL.
async fn serve(app: Router) -> String {
    let addr = crate::support::servers::serve(app).await;
    format!("http://{addr}/")
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// 20 % of 30 requests: 6 refused, 14 let through.
fn assert_capped(b: &Burst, over: usize) {
    assert_eq!(b.refused, 6);
    assert_eq!(over, 14);
    assert_eq!(b.admitted, 24);
}

#[tokio::test]
async fn a_burst_of_bad_and_exhausted_budgets_hits_the_cap_and_the_rest_run_shadowed() {
    let cap = cap();
    let (layer, mut reports) = reported(AdmitLayer::new(policy()).rejection_cap(&cap));
    let url = serve(app().layer(layer)).await;
    let b = burst(&url, || {}).await;
    let over = check_reports(&mut reports, b.admitted).await;
    assert_capped(&b, over);
    assert_eq!((cap.refused(), cap.let_through()), (6, 14));
}

#[tokio::test]
async fn the_cap_holds_with_the_operation_registry() {
    let cap = cap();
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let layer = AdmitLayer::new(policy())
        .rejection_cap(&cap)
        .operations(&ops);
    let (layer, mut reports) = reported(layer);
    let url = serve(app().layer(layer)).await;
    let b = burst(&url, || {}).await;
    let over = check_reports(&mut reports, b.admitted).await;
    assert_capped(&b, over);
}

#[cfg(feature = "rollout")]
#[tokio::test]
async fn the_window_is_the_layers_and_outlives_a_version_swap() {
    use cancel_scope::wire::PolicyHandle;
    let cap = cap();
    let policies = PolicyHandle::new(policy().to_builder().version(1).build()).unwrap();
    let (layer, mut reports) = reported(AdmitLayer::versioned(&policies).rejection_cap(&cap));
    let url = serve(app().layer(layer)).await;
    let b = burst(&url, || {
        policies
            .set(policy().to_builder().version(2).build())
            .unwrap()
    })
    .await;
    let over = check_reports(&mut reports, b.admitted).await;
    assert_capped(&b, over);
}

/// The policy of version `v` with the rejection cap settings of `percent` % over 10 minutes.
#[cfg(feature = "rollout")]
fn capped_at(v: u32, percent: u8) -> EndpointPolicy {
    policy()
        .to_builder()
        .version(v)
        .rejection_cap(percent, ms(600_000))
        .build()
}

#[cfg(feature = "rollout")]
#[tokio::test]
async fn a_swap_from_20_to_50_percent_mid_burst_keeps_the_layers_counts() {
    use cancel_scope::wire::PolicyHandle;
    let policies = PolicyHandle::new(capped_at(1, 20)).unwrap();
    let (layer, mut reports) = reported(AdmitLayer::versioned(&policies));
    let url = serve(app().layer(layer)).await;
    let b = burst(&url, || policies.set(capped_at(2, 50)).unwrap()).await;
    let over = check_reports(&mut reports, b.admitted).await;
    // Under 20 %, 4 of the first 10 bad requests are refused (20 decided); under 50 %, with
    // those counts kept, all 10 others are. Counts reset at the swap would refuse 5 of them;
    // the 20 % kept, 2 (as `assert_capped`).
    assert_eq!((b.refused, over, b.admitted), (14, 6, 16));

    // Rolled back: 20 % again, over the same counts (14 refused of 30), so a bad request now
    // runs shadowed.
    policies.rollback().unwrap();
    let res = reqwest::get(&url).await.unwrap();
    assert!(res.headers().contains_key("service-operation"));
    let bad = reqwest::Client::new()
        .get(&url)
        .header("grpc-timeout", "1 hour");
    let res = bad.send().await.unwrap();
    assert!(
        res.headers().contains_key("service-operation"),
        "not capped"
    );
    for over_cap in [false, true] {
        let (a, report) = timeout(PATIENCE, reports.recv()).await.unwrap().unwrap();
        assert_eq!(a.policy_version(), 1);
        assert_eq!(a.is_over_rejection_cap(), over_cap, "{report}");
    }
}

#[cfg(feature = "rollout")]
#[tokio::test]
async fn a_layers_own_cap_wins_over_a_versions_settings() {
    use cancel_scope::wire::PolicyHandle;
    let cap = cap(); // 20 %
    let policies = PolicyHandle::new(capped_at(1, 100)).unwrap();
    let (layer, mut reports) = reported(AdmitLayer::versioned(&policies).rejection_cap(&cap));
    let url = serve(app().layer(layer)).await;
    let b = burst(&url, || policies.set(capped_at(2, 0)).unwrap()).await;
    let over = check_reports(&mut reports, b.admitted).await;
    assert_capped(&b, over);
    assert_eq!(
        (cap.percent(), cap.refused(), cap.let_through()),
        (20, 6, 14)
    );
}
