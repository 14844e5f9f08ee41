//! Durable intents on the reqwest call path (`ScopedRequest::journal`) against a real
//! loopback axum server: the intent is in the store before the server sees the request, it is
//! resolved by the call's receipt, a read-only call writes none, and a store that fails
//! refuses the call before anything is sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::reconcile::{
    InMemoryIntents, Intent, IntentError, IntentRecord, IntentStore, Journal, Resolution, Resolved,
};
use cancel_scope::registry::BoxFuture;
use cancel_scope::{Lifecycle, Scope};
use tokio::time::Instant;

use crate::support::servers::{serve, PATIENCE};
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
        // 4xx: refused unprocessed; 5xx: the effect is unknown, left to reconcile (the
        // receipt came with the body's end: nothing is written after it).
        let record = match resolution {
            Some(_) => resolved(&shop.store, &answer).await,
            None => {
                let id = answer.split_once(" id=").unwrap().1;
                shop.store.get(id).await.unwrap().unwrap()
            }
        };
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
