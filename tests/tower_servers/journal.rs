//! Durable intents on the call path — reqwest's (`ScopedRequest::journal`) and `Propagate`'s
//! (`PropagateLayer::journal`, around a hyper client) — against a real loopback axum server:
//! the intent is in the store before the server sees the request, it is resolved by the
//! call's receipt, a read-only call writes none, and a store that fails refuses the call
//! before anything is sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::integrations::tower::{Propagate, PropagateLayer};
use cancel_scope::integrations::CallError;
use cancel_scope::reconcile::{
    InMemoryIntents, Intent, IntentError, IntentRecord, IntentStore, Journal, Resolution, Resolved,
};
use cancel_scope::registry::BoxFuture;
use cancel_scope::{Lifecycle, Scope};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

use crate::support::servers::{read_body, serve, PATIENCE};
use crate::support::time::ms;

#[derive(Clone)]
struct Shop {
    store: Arc<InMemoryIntents>,
    calls: Arc<AtomicUsize>,
}

/// Answers with the status asked for, and says which intents were pending when the request
/// arrived.
async fn order(State(shop): State<Shop>, Path(status): Path<u16>) -> (StatusCode, String) {
    shop.calls.fetch_add(1, Ordering::SeqCst);
    let pending = shop.store.pending(Duration::ZERO, 100).await.unwrap();
    let ids: Vec<&str> = pending.iter().map(|r| r.intent().effect_id()).collect();
    let status = StatusCode::from_u16(status).unwrap();
    (
        status,
        format!("pending={} id={}", ids.len(), ids.join(",")),
    )
}

async fn shop() -> (String, Shop) {
    let shop = Shop {
        store: Arc::new(InMemoryIntents::new()),
        calls: Arc::default(),
    };
    let app = Router::new()
        .route("/orders/{status}", post(order))
        .route("/stock", get(|| async { "12" }))
        .with_state(shop.clone());
    (format!("http://{}", serve(app).await), shop)
}

/// The intent `answer` names (the server saw it pending), once resolved: the receipt's
/// resolution is written on a task of its own, so it is waited for (at most `PATIENCE`).
async fn resolved(store: &InMemoryIntents, answer: &str) -> IntentRecord {
    let id = answer.split_once(" id=").unwrap().1;
    let start = Instant::now();
    loop {
        let record = store.get(id).await.unwrap().unwrap();
        if !record.is_pending() || start.elapsed() > PATIENCE {
            return record;
        }
        tokio::time::sleep(ms(5)).await;
    }
}

/// The intent `answer` names: once resolved, when a `resolution` is expected; else as it is
/// (an unknown effect is left pending: nothing is written after the receipt, which came with
/// the body's end).
async fn record_of(
    store: &InMemoryIntents,
    answer: &str,
    resolution: Option<Resolution>,
) -> IntentRecord {
    match resolution {
        Some(_) => resolved(store, answer).await,
        None => {
            let id = answer.split_once(" id=").unwrap().1;
            store.get(id).await.unwrap().unwrap()
        }
    }
}

#[tokio::test]
async fn a_post_is_journaled_before_it_is_sent_and_resolved_by_its_receipt() {
    let (url, shop) = shop().await;
    let journal = Journal::new(shop.store.clone());
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let res = reqwest::Client::new()
        .post(format!("{url}/orders/201"))
        .scoped_in(&scope)
        .journal(&journal)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    // The server saw the intent in the store when the request reached it.
    let answer = res.text().await.unwrap();
    assert!(answer.starts_with("pending=1 id=POST http://"), "{answer}");
    let record = resolved(&shop.store, &answer).await;
    assert_eq!(record.resolution(), Some(Resolution::Applied));
    scope.close();
    assert_eq!(scope.quiesce().await.state(), Lifecycle::Completed);
}

#[tokio::test]
async fn a_refused_post_is_not_applied_and_an_answered_5xx_stays_pending() {
    for (status, resolution) in [(409, Some(Resolution::NotApplied)), (503, None)] {
        let (url, shop) = shop().await;
        let journal = Journal::new(shop.store.clone());
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let res = reqwest::Client::new()
            .post(format!("{url}/orders/{status}"))
            .scoped_in(&scope)
            .journal(&journal)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), status);
        let answer = res.text().await.unwrap();
        // 4xx: refused unprocessed; 5xx: the effect is unknown, left to reconcile.
        let record = record_of(&shop.store, &answer, resolution).await;
        assert_eq!(record.resolution(), resolution, "{status}");
    }
}

#[tokio::test]
async fn a_read_only_call_writes_no_intent() {
    let (url, shop) = shop().await;
    let journal = Journal::new(shop.store.clone());
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let res = reqwest::Client::new()
        .get(format!("{url}/stock"))
        .scoped_in(&scope)
        .journal(&journal)
        .send()
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "12");
    assert!(shop.store.is_empty());
}

/// An intent store that never answers.
#[derive(Debug)]
struct Hung;

impl IntentStore for Hung {
    fn record<'a>(&'a self, _: &'a Intent) -> BoxFuture<'a, Result<(), IntentError>> {
        Box::pin(std::future::pending())
    }

    fn note_provider_handle<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<(), IntentError>> {
        Box::pin(std::future::pending())
    }

    fn resolve<'a>(
        &'a self,
        _: &'a str,
        _: Resolution,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Resolved, IntentError>> {
        Box::pin(std::future::pending())
    }

    fn pending<'a>(
        &'a self,
        _: Duration,
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<IntentRecord>, IntentError>> {
        Box::pin(std::future::pending())
    }

    fn get<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<IntentRecord>, IntentError>> {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_store_that_does_not_answer_refuses_the_call_before_it_is_sent() {
    let (url, shop) = shop().await;
    let journal = Journal::new(Arc::new(Hung)).timeout(ms(50));
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let start = Instant::now();
    let err = reqwest::Client::new()
        .post(format!("{url}/orders/201"))
        .scoped_in(&scope)
        .journal(&journal)
        .send()
        .await
        .unwrap_err();
    assert!(start.elapsed() >= ms(50));
    assert!(err.is_intent_not_recorded(), "{err:?}");
    assert!(err.intent_error().unwrap().is_timeout());
    assert_eq!(shop.calls.load(Ordering::SeqCst), 0);
    // Nothing was dispatched: the scope has nothing to reconcile.
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.effect_unknown(), 0);
}

// ---------------------------------------------------------------------------------------------
// The same through `PropagateLayer::journal`, around a plain hyper client.

type HyperClient =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, String>;

fn journaled_hyper(journal: &Journal) -> Propagate<HyperClient, Journal> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    PropagateLayer::new()
        .dependency("shop")
        .journal(journal)
        .layer(client)
}

/// A `method` request to `url` in `scope`.
fn in_scope(method: &str, url: &str, scope: &Scope) -> http::Request<String> {
    let mut req = http::Request::builder()
        .method(method)
        .uri(url)
        .body(String::new())
        .unwrap();
    req.extensions_mut().insert(scope.clone());
    req
}

/// The status and text of a call through `client`, its body read to its end.
async fn send(
    client: Propagate<HyperClient, Journal>,
    req: http::Request<String>,
) -> Result<(u16, String), CallError> {
    let res = client.oneshot(req).await?;
    let status = res.status().as_u16();
    let body = read_body(res.into_body()).await.unwrap();
    Ok((status, String::from_utf8(body).unwrap()))
}

#[tokio::test]
async fn propagate_journals_a_write_before_it_is_sent_and_its_receipt_resolves_it() {
    for (status, resolution) in [
        (201, Some(Resolution::Applied)),
        (409, Some(Resolution::NotApplied)),
        (503, None),
    ] {
        let (url, shop) = shop().await;
        let journal = Journal::new(shop.store.clone());
        let scope = Scope::with_timeout(Duration::from_secs(10));
        let req = in_scope("POST", &format!("{url}/orders/{status}"), &scope);
        let (answered, answer) = send(journaled_hyper(&journal), req).await.unwrap();
        assert_eq!(answered, status);
        // The server saw the intent in the store when the request reached it.
        assert!(answer.starts_with("pending=1 id=POST http://"), "{answer}");
        let record = record_of(&shop.store, &answer, resolution).await;
        assert_eq!(record.resolution(), resolution, "{status}");
        assert_eq!(
            record.intent().effect_id(),
            answer.split_once(" id=").unwrap().1
        );
    }
}

#[tokio::test]
async fn propagate_writes_no_intent_for_a_read() {
    let (url, shop) = shop().await;
    let journal = Journal::new(shop.store.clone());
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let req = in_scope("GET", &format!("{url}/stock"), &scope);
    let (status, answer) = send(journaled_hyper(&journal), req).await.unwrap();
    assert_eq!((status, answer.as_str()), (200, "12"));
    assert!(shop.store.is_empty());
}

#[tokio::test]
async fn propagate_refuses_a_write_whose_intent_the_store_does_not_take() {
    let (url, shop) = shop().await;
    let journal = Journal::new(Arc::new(Hung)).timeout(ms(50));
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let start = Instant::now();
    let req = in_scope("POST", &format!("{url}/orders/201"), &scope);
    let err = send(journaled_hyper(&journal), req).await.unwrap_err();
    assert!(start.elapsed() >= ms(50));
    assert!(err.is_intent_not_recorded(), "{err:?}");
    assert!(err.intent_error().unwrap().is_timeout());
    assert_eq!(shop.calls.load(Ordering::SeqCst), 0, "nothing was sent");
    scope.close();
    let report = scope.quiesce().await;
    assert_eq!(report.effect_unknown(), 0, "{report}");
}
