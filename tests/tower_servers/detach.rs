//! `DetachLayer` over a real axum server and a reqwest client: a request whose client
//! disconnects runs on to its answer, where without the layer it would be cancelled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::middleware::{from_fn, Next};
use axum::routing::any;
use axum::Router;
use cancel_scope::integrations::tower::DetachLayer;
use cancel_scope::wire::EndpointPolicy;
use cancel_scope::{Lifecycle, Scope};
use tokio::sync::{oneshot, Notify};
use tokio::time::timeout;

use crate::support::servers::{next_report, serve, OnDrop, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::reporting;

#[tokio::test]
async fn a_detached_request_runs_to_its_answer_after_its_client_disconnects() {
    let (started_tx, started) = oneshot::channel();
    let started_tx = Arc::new(Mutex::new(Some(started_tx)));
    let (gone_tx, gone) = oneshot::channel();
    let gone_tx = Arc::new(Mutex::new(Some(gone_tx)));
    let release = Arc::new(Notify::new());
    let committed = Arc::new(AtomicBool::new(false));
    let (admit, mut reports) = reporting(EndpointPolicy::builder(ms(60_000)).build());
    let (held, done) = (release.clone(), committed.clone());
    let handler = move || async move {
        if let Some(tx) = started_tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
        held.notified().await;
        assert!(!Scope::current().is_cancelled());
        done.store(true, Ordering::SeqCst);
        "committed"
    };
    // Outermost: a marker whose future the server drops when the client goes away.
    let mark = move |req: Request, next: Next| {
        let guard = OnDrop(gone_tx.lock().unwrap().take());
        async move {
            let _guard = guard;
            next.run(req).await
        }
    };
    let app = Router::new()
        .route("/", any(handler))
        .layer(admit)
        .layer(DetachLayer::new(PATIENCE))
        .layer(from_fn(mark));
    let url = format!("http://{}/", serve(app).await);

    let request = tokio::spawn(reqwest::Client::new().post(url).send());
    timeout(PATIENCE, started).await.unwrap().unwrap();
    request.abort(); // the client goes away mid-request
    timeout(PATIENCE, gone).await.unwrap().unwrap();
    // The server has dropped the request's future; the handler is still running.
    release.notify_one();

    let (_, report) = next_report(&mut reports).await;
    assert!(committed.load(Ordering::SeqCst));
    assert_eq!(report.state(), Lifecycle::Completed, "{report}");
    assert_eq!(report.cause(), None, "{report}");
}
