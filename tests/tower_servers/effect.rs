//! A server-side stop never invites an unsafe retry: a request that the
//! server stops after it dispatched a call that may have had an effect says so
//! (`service-effect: unknown`, HTTP 500 / gRPC `UNKNOWN` instead of 503 / `UNAVAILABLE`), and
//! this crate's clients receipt such an answer `EffectUnknown` — over real axum and tonic
//! servers on loopback, with reqwest and `Propagate` clients.
//!
//! Real sockets run on the real clock: budgets are generous, every wait is on an observable
//! event (a downstream request arriving, a response), bounded so that a bug fails the test.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::{any, get};
use axum::Router;
use cancel_scope::integrations::classify::{GrpcClassifier, HttpClassifier};
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::integrations::tower::{AdmitLayer, PropagateLayer};
use cancel_scope::retry::{Classify, Decision, Retry, Stop};
use cancel_scope::wire::{EndpointPolicy, ServiceEffect};
use cancel_scope::{ChildSpec, Lifecycle, Scope};
use http::StatusCode;
use tokio::sync::Notify;
use tokio::time::timeout;
use tower::Layer as _;

use crate::support::grpc::{self, UnaryFn};
use crate::support::tower::verdict;

const PATIENCE: Duration = Duration::from_secs(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn listen() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

async fn serve(app: Router) -> String {
    let (listener, url) = listen().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A plain downstream that signals each request's arrival and never answers: a call to it
/// has been sent, and may have had its effect, when the signal comes.
async fn downstream() -> (String, Arc<Notify>) {
    let arrived = Arc::new(Notify::new());
    let signal = arrived.clone();
    let app = Router::new().route(
        "/{*path}",
        any(move || {
            let signal = signal.clone();
            async move {
                signal.notify_one();
                std::future::pending::<()>().await
            }
        }),
    );
    (serve(app).await, arrived)
}

#[derive(Clone)]
struct Edge {
    downstream: String,
    arrived: Arc<Notify>,
    client: reqwest::Client,
}

/// `/{method}/{stop}`: calls the downstream with `method` (`POST`: may have an effect; `GET`:
/// read-only) in a task of the request, waits until it arrived there, then stops the request:
/// `cancel` cancels it, `deadline` waits for its deadline.
async fn edge(State(e): State<Edge>, Path((method, stop)): Path<(String, String)>) -> String {
    let scope = Scope::current();
    let (client, url) = (e.client.clone(), format!("{}/pay", e.downstream));
    let _call = scope
        .spawn(async move {
            let request = match method.as_str() {
                "post" => client.post(url),
                _ => client.get(url),
            };
            let _ = request.send_scoped().await;
        })
        .unwrap();
    timeout(PATIENCE, e.arrived.notified()).await.unwrap();
    if stop == "cancel" {
        scope.cancel_with("an operator stopped it");
    }
    std::future::pending().await
}

/// An edge with `AdmitLayer` (a 1 s default budget: the `deadline` stop) before `downstream`.
async fn edge_server() -> String {
    let (downstream, arrived) = downstream().await;
    let state = Edge {
        downstream,
        arrived,
        client: reqwest::Client::new(),
    };
    let app = Router::new()
        .route("/{method}/{stop}", get(edge))
        .with_state(state)
        .layer(AdmitLayer::new(EndpointPolicy::builder(ms(1_000)).build()));
    serve(app).await
}

/// A `GET` of `url` made through this crate's reqwest integration, in a scope of its own: the
/// status, the `service-effect` the answer said, and the call's receipt.
async fn get_scoped(url: &str) -> (StatusCode, Option<String>, String) {
    let scope = Scope::with_timeout(PATIENCE);
    let client = reqwest::Client::new();
    let res = scope
        .run(async { client.get(url).send_scoped().await })
        .await
        .unwrap()
        .unwrap();
    let status = res.status();
    let effect = res
        .headers()
        .get("service-effect")
        .map(|v| v.to_str().unwrap().to_owned());
    res.bytes().await.unwrap();
    scope.close();
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    (status, effect, verdict(&report))
}

#[tokio::test]
async fn a_request_cancelled_after_a_post_answers_500_unknown_and_is_effect_unknown() {
    let edge = edge_server().await;
    let (status, effect, receipt) = get_scoped(&format!("{edge}/post/cancel")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(effect.as_deref(), Some("unknown"));
    // The caller's call was a read-only GET, whose 5xx is `Failed`: the server's say makes it
    // unknown (the server had sent a payment on its behalf).
    assert_eq!(receipt, "u HTTP 500, service-effect: unknown");
}

#[tokio::test]
async fn a_request_cancelled_after_reads_only_answers_503_none_and_fails() {
    let edge = edge_server().await;
    let (status, effect, receipt) = get_scoped(&format!("{edge}/get/cancel")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(effect.as_deref(), Some("none"));
    assert_eq!(receipt, "f");
}

#[tokio::test]
async fn a_request_past_its_deadline_after_a_post_answers_504_unknown() {
    let edge = edge_server().await;
    let (status, effect, receipt) = get_scoped(&format!("{edge}/post/deadline")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(effect.as_deref(), Some("unknown"));
    assert_eq!(receipt, "u HTTP 504, service-effect: unknown");

    let (status, effect, receipt) = get_scoped(&format!("{edge}/get/deadline")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(effect.as_deref(), Some("none"));
    assert_eq!(receipt, "f");
}

/// A retried call of `url` (`spec`) with the HTTP classifier, which reads the header: the
/// ledger's attempts, why it stopped, and the scope's report.
async fn retried(url: &str, spec: ChildSpec) -> (usize, Option<Stop>, cancel_scope::Report) {
    let scope = Scope::with_timeout(PATIENCE);
    let client = reqwest::Client::new();
    let retry = Retry::new(HttpClassifier::new())
        .max_attempts(3)
        .backoff(std::iter::repeat(ms(10)));
    let err = retry
        .run(&scope, spec, |_attempt| {
            let request = client.get(url);
            async move { request.send_scoped().await?.error_for_status().map(drop) }
        })
        .await
        .unwrap_err();
    let ledger = err.ledger();
    let (attempts, stop) = (ledger.attempts().len(), ledger.stop().cloned());
    scope.close();
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    (attempts, stop, report)
}

#[tokio::test]
async fn a_retry_that_reads_the_header_never_repeats_a_stopped_write() {
    let edge = edge_server().await;
    // A side-effecting checkout: the server stopped after its payment went out. One attempt,
    // and the checkout is listed for reconciliation (a 503 read by its status alone would have
    // been a plain failure, with nothing listed).
    let checkout = ChildSpec::side_effecting("checkout", "checkout-1");
    let (attempts, stop, report) = retried(&format!("{edge}/post/cancel"), checkout).await;
    assert_eq!((attempts, stop), (1, Some(Stop::EffectUnknown)));
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{report}");
    assert!(report
        .pending_effects()
        .iter()
        .any(|e| e.effect_id() == "checkout-1"));

    // Nothing possibly effectful went out: `none`, a 503 (a 5xx: unknown for all the classifier
    // knows), retried with the key after the backoff.
    let idempotent = ChildSpec::idempotent("lookup", "lookup-1");
    let (attempts, _, _) = retried(&format!("{edge}/get/cancel"), idempotent).await;
    assert_eq!(attempts, 3);
}

// --- gRPC ------------------------------------------------------------------------------------

/// A tonic server with `AdmitLayer` whose method, asked `"{effect} {stop}"`, dispatches a
/// child (`post`: side-effecting, `get`: read-only) and then stops the request (`cancel`, or
/// waits for its `deadline`). Behind tonic, which enforces `grpc-timeout` itself, the reserve
/// makes the layer's deadline come first.
async fn grpc_server() -> String {
    let policy = EndpointPolicy::builder(ms(1_000)).reserve(ms(200)).build();
    let layer = AdmitLayer::new(policy);
    let svc = UnaryFn(|message: String| async move {
        let scope = Scope::current();
        let spec = match message.split(' ').next() {
            Some("post") => ChildSpec::side_effecting("charge", "charge-1"),
            _ => ChildSpec::read_only("lookup"),
        };
        let call = scope.register(spec).unwrap().dispatch().unwrap();
        if message.ends_with("cancel") {
            scope.cancel_with("an operator stopped it");
        }
        std::future::pending::<()>().await;
        drop(call);
        Ok(String::new())
    });
    let (listener, url) = listen().await;
    let router = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(svc);
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    url
}

/// A call with `message` through `Propagate` (the method declared read-only, so that only the
/// server's say can make its receipt unknown), in a scope of its own: the status code, the
/// `service-effect` it carried, the call's receipt and the gRPC classifier's decision.
async fn grpc_call(
    url: &str,
    message: &str,
) -> (tonic::Code, Option<ServiceEffect>, String, Decision) {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = PropagateLayer::new()
        .read_only_method(grpc::METHOD)
        .layer(channel);
    let scope = Scope::with_timeout(PATIENCE);
    let status = scope
        .run(grpc::call(client, message))
        .await
        .unwrap()
        .unwrap_err();
    let effect = status
        .metadata()
        .get("service-effect")
        .map(|v| ServiceEffect::parse(v.as_bytes()));
    scope.close();
    let report = timeout(PATIENCE, scope.quiesce()).await.unwrap();
    let decision = GrpcClassifier::new().classify(&status);
    (status.code(), effect, verdict(&report), decision)
}

#[tokio::test]
async fn grpc_a_stop_after_an_effectful_dispatch_is_unknown_not_unavailable() {
    let url = grpc_server().await;
    let (code, effect, receipt, decision) = grpc_call(&url, "post cancel").await;
    assert_eq!(code, tonic::Code::Unknown);
    assert_eq!(effect, Some(ServiceEffect::Unknown));
    assert_eq!(receipt, "u gRPC UNKNOWN, service-effect: unknown");
    // `UNKNOWN` alone is not retried; with the header it is an answer of unknown effect
    // (retried with its key by idempotent work, never by a side-effecting write).
    assert_eq!(decision, Decision::EffectUnknown);

    let (code, effect, receipt, decision) = grpc_call(&url, "get cancel").await;
    assert_eq!(code, tonic::Code::Unavailable);
    assert_eq!(effect, Some(ServiceEffect::None));
    assert_eq!(receipt, "f");
    assert_eq!(decision, Decision::EffectUnknown);
}

#[tokio::test]
async fn grpc_a_deadline_after_an_effectful_dispatch_says_so_beside_deadline_exceeded() {
    let url = grpc_server().await;
    let (code, effect, receipt, decision) = grpc_call(&url, "post deadline").await;
    assert_eq!(code, tonic::Code::DeadlineExceeded);
    assert_eq!(effect, Some(ServiceEffect::Unknown));
    assert_eq!(receipt, "u gRPC DEADLINE_EXCEEDED, service-effect: unknown");
    assert_eq!(decision, Decision::EffectUnknown);

    let (code, effect, receipt, _) = grpc_call(&url, "get deadline").await;
    assert_eq!(code, tonic::Code::DeadlineExceeded);
    assert_eq!(effect, Some(ServiceEffect::None));
    assert_eq!(receipt, "f");
}
