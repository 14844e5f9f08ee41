//! The HTTP retry classifier with real answers: a retry of scoped reqwest calls that obeys
//! `Retry-After`, retries what is safe to retry and never repeats a write whose effect is
//! unknown, against an axum server on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::any;
use axum::Router;
use cancel_scope::integrations::classify::HttpClassifier;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::retry::{Retry, Stop};
use cancel_scope::{ChildSpec, Lifecycle, Scope};
use tokio::time::timeout;

use crate::support::servers::{serve, PATIENCE};

/// `/{status}` answers `status` with `Retry-After: 1` to its first request, `200 ok` after.
async fn flaky() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = Router::new().route(
        "/{status}",
        any(
            move |axum::extract::Path(status): axum::extract::Path<u16>| {
                let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    let status = if first { status } else { 200 };
                    let status = StatusCode::from_u16(status).unwrap();
                    (status, [("retry-after", "1")], "ok")
                }
            },
        ),
    );
    (format!("http://{}", serve(app).await), hits)
}

/// Retries `method` to `url` as `spec` with the classifier: the body, the stop, the gap
/// between the first two attempts, and the scope's report.
async fn retried(
    method: reqwest::Method,
    url: String,
    spec: ChildSpec,
) -> (Result<String, Stop>, Option<Duration>, cancel_scope::Report) {
    let scope = Scope::with_timeout(PATIENCE);
    let client = reqwest::Client::new();
    let (result, ledger) = Retry::new(HttpClassifier::new())
        .max_attempts(3)
        .run_with_ledger(&scope, spec, |attempt| {
            let request = client
                .request(method.clone(), &url)
                .scoped_in(attempt.scope());
            async move { request.send().await?.error_for_status()?.text().await }
        })
        .await;
    let gap = match ledger.attempts() {
        [first, second, ..] => Some(second.started_at() - first.started_at()),
        _ => None,
    };
    scope.close();
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    (result.map_err(|e| e.stop().clone()), gap, report)
}

/// A `GET` answered 503 with `Retry-After: 1` is retried a second later, and succeeds.
#[tokio::test]
async fn a_read_answered_503_is_retried_after_retry_after() {
    let (url, hits) = flaky().await;
    let spec = ChildSpec::read_only("stock");
    let (result, gap, report) = retried(reqwest::Method::GET, format!("{url}/503"), spec).await;
    assert_eq!(result, Ok("ok".to_owned()));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert!(gap.unwrap() >= Duration::from_secs(1), "{gap:?}");
    // Each attempt and its call: the first two failed, the second two succeeded.
    assert_eq!((report.failed(), report.succeeded()), (2, 2), "{report}");
}

/// An idempotent `PUT` refused with 429 is retried with its key after `Retry-After`.
#[tokio::test]
async fn an_idempotent_write_refused_429_is_retried() {
    let (url, hits) = flaky().await;
    let spec = ChildSpec::idempotent("put-order", "order-5");
    let (result, gap, report) = retried(reqwest::Method::PUT, format!("{url}/429"), spec).await;
    assert_eq!(result, Ok("ok".to_owned()));
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert!(gap.unwrap() >= Duration::from_secs(1), "{gap:?}");
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
}

/// A side-effecting `POST` answered 503 may have had its effect: one attempt, no retry, and
/// the call listed for reconciliation.
#[tokio::test]
async fn a_write_answered_503_is_not_repeated() {
    let (url, hits) = flaky().await;
    let spec = ChildSpec::side_effecting("charge", "charge-5");
    let (result, gap, report) = retried(reqwest::Method::POST, format!("{url}/503"), spec).await;
    assert_eq!(result, Err(Stop::EffectUnknown));
    assert_eq!((hits.load(Ordering::SeqCst), gap), (1, None));
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{report}");
    let effects = report.pending_effects();
    assert!(
        effects.iter().any(|e| e.effect_id() == "charge-5"),
        "{report}"
    );
}

/// The gRPC classifier on the answers a proxy in front of a gRPC server gives over HTTP, as
/// the scoped response's `error_for_status` carries them: `503` and `429` with a pushback are
/// `UNAVAILABLE` (retried after the pushback), `404` is `UNIMPLEMENTED` (never), and a
/// `grpc-status` the answer states itself wins over its HTTP status.
#[tokio::test]
async fn the_grpc_classifier_reads_an_answer_refused_over_http() {
    use cancel_scope::integrations::classify::GrpcClassifier;
    use cancel_scope::retry::{Classify, Decision};
    let app = Router::new().route(
        "/{status}/{grpc}",
        any(
            |axum::extract::Path((status, grpc)): axum::extract::Path<(u16, String)>| async move {
                let mut headers = axum::http::HeaderMap::new();
                headers.insert("grpc-retry-pushback-ms", "40".parse().unwrap());
                if grpc != "-" {
                    headers.insert("grpc-status", grpc.parse().unwrap());
                }
                (StatusCode::from_u16(status).unwrap(), headers, "")
            },
        ),
    );
    let url = format!("http://{}", serve(app).await);
    let scope = Scope::with_timeout(PATIENCE);
    let client = reqwest::Client::new();
    let after = Decision::EffectUnknownAfter(Duration::from_millis(40));
    for (path, want) in [
        ("503/-", after),
        ("429/-", after),
        ("404/-", Decision::Never),
        ("503/5", Decision::Never), // its own NOT_FOUND
    ] {
        let answer = client
            .post(format!("{url}/{path}"))
            .scoped_in(&scope)
            .send()
            .await
            .unwrap();
        let e = answer.error_for_status().unwrap_err();
        assert_eq!(GrpcClassifier::new().classify(&e), want, "{path}: {e}");
    }
}
