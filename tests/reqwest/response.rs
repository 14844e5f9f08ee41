//! The scoped reqwest response as users read it: `error_for_status`, `json`, `text` and
//! `bytes`, each bounded by the call's deadline and receipted by the status table, against
//! real axum servers on loopback.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{any, get};
use axum::Router;
use cancel_scope::integrations::classify::HttpClassifier;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::retry::{Classify, Decision};
use cancel_scope::{Lifecycle, Scope};
use tokio::time::{timeout, Instant};

use crate::support::servers::{serve, CUT_AFTER, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::verdict;

/// A server that answers `/504` with an empty 504 (a callee that gave up), `/503` with
/// `Retry-After: 7`, `/json` and `/not-json` with 200, and `/trickle` with a first chunk and
/// then nothing, for ever.
async fn server() -> String {
    let trickle = || async {
        let first = futures::stream::once(async { Ok::<_, std::io::Error>("{\"apples\": ") });
        let body = futures::StreamExt::chain(first, futures::stream::pending());
        axum::body::Body::from_stream(body)
    };
    let app = Router::new()
        .route("/504", any(|| async { StatusCode::GATEWAY_TIMEOUT }))
        .route(
            "/503",
            any(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "7")],
                    "busy",
                )
            }),
        )
        .route("/json", get(|| async { "{\"apples\": 3, \"pears\": 0}" }))
        .route("/not-json", get(|| async { "<html>sorry</html>" }))
        .route("/trickle", get(trickle));
    format!("http://{}", serve(app).await)
}

async fn report_of(scope: &Scope) -> cancel_scope::Report {
    scope.close();
    timeout(PATIENCE, scope.quiesce()).await.unwrap()
}

/// Read as a body, an empty 504 is an empty string; `error_for_status` makes it the error it
/// is, with the status, and the call's receipt follows the table: a `GET` failed, a `POST`
/// of unknown effect.
#[tokio::test]
async fn an_empty_504_is_an_error_not_an_empty_success() {
    let url = server().await;
    let client = reqwest::Client::new();

    let scope = Scope::with_timeout(ms(10_000));
    let res = client.get(format!("{url}/504")).scoped_in(&scope);
    assert_eq!(res.send().await.unwrap().text().await.unwrap(), "");
    let res = client.get(format!("{url}/504")).scoped_in(&scope);
    let err = res.send().await.unwrap().error_for_status().unwrap_err();
    assert!(err.is_status(), "{err}");
    assert_eq!(err.status(), Some(StatusCode::GATEWAY_TIMEOUT));
    assert!(!err.is_transport() && !err.is_deadline_exceeded());
    let report = report_of(&scope).await;
    assert_eq!((report.failed(), report.total()), (2, 2), "{report}");

    let scope = Scope::with_timeout(ms(10_000));
    let res = client.post(format!("{url}/504")).scoped_in(&scope);
    let err = res.send().await.unwrap().error_for_status().unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::GATEWAY_TIMEOUT));
    let report = report_of(&scope).await;
    assert_eq!(verdict(&report), "u HTTP 504");
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation);
}

/// The error keeps the answer's headers: the HTTP classifier reads its `Retry-After`.
#[tokio::test]
async fn error_for_status_keeps_the_headers_for_the_classifier() {
    let url = server().await;
    let scope = Scope::with_timeout(ms(10_000));
    let res = reqwest::Client::new()
        .get(format!("{url}/503"))
        .scoped_in(&scope)
        .send()
        .await
        .unwrap();
    let err = res.error_for_status().unwrap_err();
    let headers: &HeaderMap = err.response_headers().unwrap();
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(
        HttpClassifier::new().classify(&err),
        Decision::EffectUnknownAfter(Duration::from_secs(7))
    );
    assert!(err.to_string().contains("503"), "{err}");
    assert_eq!(verdict(&report_of(&scope).await), "f");
}

/// A success passes `error_for_status` untouched, and its body is then read as usual.
#[tokio::test]
async fn json_reads_the_body_and_receipts_it() {
    let url = server().await;
    let client = reqwest::Client::new();
    let scope = Scope::with_timeout(ms(10_000));
    let fruit: HashMap<String, u32> = client
        .get(format!("{url}/json"))
        .scoped_in(&scope)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(fruit["apples"], 3);
    assert_eq!(verdict(&report_of(&scope).await), "s");

    // A body that came whole but is not the JSON asked for: a decode error, with the status;
    // the answer itself was read (`Succeeded`).
    let scope = Scope::with_timeout(ms(10_000));
    let res = client.get(format!("{url}/not-json")).scoped_in(&scope);
    let err = res
        .send()
        .await
        .unwrap()
        .json::<Vec<u32>>()
        .await
        .unwrap_err();
    assert!(err.is_decode(), "{err}");
    assert_eq!(err.status(), Some(StatusCode::OK));
    assert!(HttpClassifier::new().classify(&err) == Decision::Never);
    assert_eq!(verdict(&report_of(&scope).await), "s");
}

/// `json`, `text` and `bytes` all stop at the call's deadline while the body trickles: the
/// error says the deadline, and the read-only call is `Cancelled`.
#[tokio::test]
async fn every_body_read_stops_at_the_deadline() {
    let url = server().await;
    let client = reqwest::Client::new();
    for read in ["json", "text", "bytes"] {
        let scope = Scope::with_timeout(CUT_AFTER);
        let started = Instant::now();
        let res = client.get(format!("{url}/trickle")).scoped_in(&scope);
        let res = res.send().await.unwrap();
        let err = timeout(PATIENCE, async {
            match read {
                "json" => res.json::<HashMap<String, u32>>().await.map(drop),
                "text" => res.text().await.map(drop),
                _ => res.bytes().await.map(drop),
            }
        })
        .await
        .expect("the body was read past the deadline")
        .unwrap_err();
        assert!(err.is_deadline_exceeded(), "{read}: {err}");
        assert!(started.elapsed() >= CUT_AFTER, "{read}");
        assert_eq!(verdict(&report_of(&scope).await), "c", "{read}");
    }
}

/// The plain response of `into_inner` stays bounded by the call: its body stops at a cancel
/// of the call's scope as at its deadline (it was cut at the deadline only), and the call is
/// receipted at the hand-over, by its status.
#[tokio::test]
async fn the_plain_response_is_cut_at_a_cancel() {
    let url = server().await;
    let scope = Scope::with_timeout(ms(10_000));
    let res = reqwest::Client::new()
        .get(format!("{url}/trickle"))
        .scoped_in(&scope)
        .send()
        .await
        .unwrap();
    let mut plain = res.into_inner();
    assert_eq!(plain.chunk().await.unwrap().unwrap(), "{\"apples\": ");
    scope.cancel();
    let err = timeout(PATIENCE, plain.chunk())
        .await
        .expect("the body was read past the cancel")
        .unwrap_err();
    assert!(!err.is_timeout(), "{err}");
    assert_eq!(verdict(&report_of(&scope).await), "s");
}
