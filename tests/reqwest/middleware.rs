//! `ScopedMiddleware`: every call of a `reqwest_middleware::ClientWithMiddleware` is a scoped
//! call, as `send_scoped` makes it, against real axum servers on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::{any, get};
use axum::Router;
use cancel_scope::integrations::classify::HttpClassifier;
use cancel_scope::integrations::reqwest::{CallName, ScopedMiddleware};
use cancel_scope::integrations::CallError;
use cancel_scope::retry::{Classify, Decision};
use cancel_scope::wire::{EgressPolicy, ServiceBudget};
use cancel_scope::{ChildSpec, Scope};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::time::{timeout, Instant};

use crate::support::servers::{serve, CUT_AFTER, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::verdict;

fn client() -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(ScopedMiddleware::new())
        .build()
}

/// `/budget` answers with the `service-budget` remaining it was told (or `-`), `/503` with
/// an empty 503, `/trickle` with a first chunk and then nothing. `hits` counts requests.
async fn server(hits: Arc<AtomicUsize>) -> String {
    let budget = |headers: HeaderMap| async move {
        match headers.get("service-budget") {
            Some(v) => {
                let b = ServiceBudget::parse(v.to_str().unwrap()).unwrap();
                b.remaining().as_millis().to_string()
            }
            None => "-".to_owned(),
        }
    };
    let trickle = || async {
        let first = futures::stream::once(async { Ok::<_, std::io::Error>("first chunk") });
        axum::body::Body::from_stream(futures::StreamExt::chain(first, futures::stream::pending()))
    };
    let app = Router::new()
        .route("/budget", get(budget))
        .route("/503", any(|| async { StatusCode::SERVICE_UNAVAILABLE }))
        .route("/trickle", get(trickle))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                hits.fetch_add(1, Ordering::SeqCst);
                next.run(req)
            },
        ));
    format!("http://{}", serve(app).await)
}

fn call_error(e: &reqwest_middleware::Error) -> &CallError {
    match e {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref().expect("a CallError"),
        other => panic!("not the middleware's error: {other}"),
    }
}

async fn report_of(scope: &Scope) -> cancel_scope::Report {
    scope.close();
    timeout(PATIENCE, scope.quiesce()).await.unwrap()
}

/// A call in the current scope is a child of it: the callee is told what is left (minus the
/// transport pad), and the call's receipt is in the scope's report once its body was read.
#[tokio::test]
async fn a_call_in_the_current_scope_carries_its_budget_and_has_a_receipt() {
    let url = server(Arc::default()).await;
    let client = client();
    let scope = Scope::with_timeout(ms(5_000));
    let told = scope
        .run(async {
            let res = client.get(format!("{url}/budget")).send().await.unwrap();
            res.text().await.unwrap()
        })
        .await
        .unwrap();
    let told: u64 = told.parse().unwrap();
    assert!(told > 0 && told < 5_000, "told {told} ms");
    assert_eq!(verdict(&report_of(&scope).await), "s");
}

/// Outside any scope the call is refused and nothing is sent, unless allowed (then it goes
/// as it is, with no budget header).
#[tokio::test]
async fn a_call_outside_any_scope_is_refused_unless_allowed() {
    let hits = Arc::new(AtomicUsize::new(0));
    let url = server(hits.clone()).await;
    let err = client()
        .get(format!("{url}/budget"))
        .send()
        .await
        .unwrap_err();
    assert!(call_error(&err).is_no_scope());
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    let lenient = ClientBuilder::new(reqwest::Client::new())
        .with(ScopedMiddleware::new().allow_unscoped())
        .build();
    let res = lenient.get(format!("{url}/budget")).send().await.unwrap();
    assert_eq!(res.text().await.unwrap(), "-");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// A cancelled scope sends nothing; a scope put in the request's extensions is used instead
/// of the current one, with the spec and egress policy put there.
#[tokio::test]
async fn the_scope_spec_and_egress_of_the_extensions_are_used() {
    let hits = Arc::new(AtomicUsize::new(0));
    let url = server(hits.clone()).await;
    let client = client();

    let cancelled = Scope::new();
    cancelled.cancel();
    let req = client
        .get(format!("{url}/budget"))
        .with_extension(cancelled);
    assert!(call_error(&req.send().await.unwrap_err()).is_cancelled());
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    let scope = Scope::with_timeout(ms(5_000));
    let too_little = EgressPolicy::builder().min_useful(ms(60_000)).build();
    let req = client
        .get(format!("{url}/budget"))
        .with_extension(scope.clone());
    let err = req.with_extension(too_little).send().await.unwrap_err();
    assert!(call_error(&err).is_budget_exhausted());
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    // A POST declared idempotent, answered 503: its effect is unknown, under its own key.
    let req = client
        .post(format!("{url}/503"))
        .with_extension(scope.clone())
        .with_extension(ChildSpec::idempotent("restock", "restock-42"));
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(res);
    // A named read-only call.
    let req = client
        .get(format!("{url}/budget"))
        .with_extension(scope.clone())
        .with_extension(CallName::new("inventory"));
    req.send().await.unwrap().text().await.unwrap();
    let report = report_of(&scope).await;
    assert_eq!(
        (report.succeeded(), report.effect_unknown()),
        (1, 1),
        "{report}"
    );
    let effect = &report.pending_effects()[0];
    assert_eq!(effect.effect_id(), "restock-42");
    assert_eq!(effect.status_str(), Some("HTTP 503"));
}

/// The body of a plain `reqwest::Response` from the middleware is still cut at the call's
/// deadline (a timeout, as reqwest's own), and the read-only call is `Cancelled`.
#[tokio::test]
async fn the_body_is_cut_at_the_calls_deadline() {
    let url = server(Arc::default()).await;
    let client = client();
    let scope = Scope::with_timeout(CUT_AFTER);
    let started = Instant::now();
    let mut res = scope
        .run(client.get(format!("{url}/trickle")).send())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.chunk().await.unwrap().unwrap(), "first chunk");
    let err = timeout(PATIENCE, res.chunk())
        .await
        .expect("the body was read past the deadline")
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() >= CUT_AFTER);
    assert_eq!(verdict(&report_of(&scope).await), "c");
}

/// A response dropped unread ends the call: `Cancelled` for a `GET`.
#[tokio::test]
async fn a_response_dropped_unread_is_receipted() {
    let url = server(Arc::default()).await;
    let client = client();
    let scope = Scope::with_timeout(ms(5_000));
    let res = scope
        .run(client.get(format!("{url}/trickle")).send())
        .await
        .unwrap()
        .unwrap();
    drop(res);
    assert_eq!(verdict(&report_of(&scope).await), "c");
}

/// The HTTP classifier reads the middleware's errors: a connection refused (nothing sent) is
/// retried on another endpoint.
#[tokio::test]
async fn the_classifier_reads_the_middlewares_errors() {
    let scope = Scope::with_timeout(ms(5_000));
    // Port 1 on loopback: nobody listens.
    let req = client()
        .get("http://127.0.0.1:1/")
        .with_extension(scope.clone());
    let err = req.send().await.unwrap_err();
    assert!(call_error(&err).is_connect(), "{err}");
    assert_eq!(
        HttpClassifier::new().classify(&err),
        Decision::SwitchEndpoint
    );
    assert_eq!(verdict(&report_of(&scope).await), "f");
}

/// A `Journal` in the request's extensions journals the call as `ScopedRequest::journal`
/// does: the intent is pending in the store when the server sees the POST, and the call's
/// receipt resolves it; a GET writes none.
#[tokio::test]
async fn a_journal_in_the_extensions_writes_the_intent_before_the_call() {
    use cancel_scope::reconcile::{InMemoryIntents, IntentStore, Journal, Resolution};

    let store = Arc::new(InMemoryIntents::new());
    let seen = store.clone();
    let order = move || {
        let seen = seen.clone();
        async move {
            let pending = seen.pending(ms(0), 10).await.unwrap();
            let ids: Vec<&str> = pending.iter().map(|r| r.intent().effect_id()).collect();
            (StatusCode::CREATED, ids.join(","))
        }
    };
    let app = Router::new()
        .route("/orders", axum::routing::post(order))
        .route("/stock", get(|| async { "12" }));
    let url = format!("http://{}", serve(app).await);
    let journal = Journal::new(store.clone());
    let client = client();
    let scope = Scope::with_timeout(ms(5_000));

    let res = client
        .post(format!("{url}/orders"))
        .with_extension(scope.clone())
        .with_extension(journal.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let id = res.text().await.unwrap();
    assert!(!id.is_empty(), "the server saw no pending intent");
    // The receipt's resolution is written on a task of its own: wait for it.
    let start = Instant::now();
    let record = loop {
        let record = store.get(&id).await.unwrap().unwrap();
        if !record.is_pending() || start.elapsed() > PATIENCE {
            break record;
        }
        tokio::time::sleep(ms(5)).await;
    };
    assert_eq!(record.resolution(), Some(Resolution::Applied), "{record:?}");

    let stock = client
        .get(format!("{url}/stock"))
        .with_extension(scope.clone())
        .with_extension(journal)
        .send()
        .await
        .unwrap();
    assert_eq!(stock.text().await.unwrap(), "12");
    assert!(store.pending(ms(0), 10).await.unwrap().is_empty());
    let report = report_of(&scope).await;
    assert_eq!((report.succeeded(), report.total()), (2, 2), "{report}");
}
