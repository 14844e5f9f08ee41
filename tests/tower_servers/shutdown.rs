//! A server's graceful shutdown over real servers on loopback: axum's
//! `with_graceful_shutdown` and tonic's `serve_with_incoming_shutdown` given
//! `ServerScope::draining`, requests in flight that finish within the grace period, new ones
//! refused with 503 / `UNAVAILABLE`, stragglers cancelled with `Cause::Shutdown` at its end
//! (500 / `UNKNOWN` for one that had sent a write), and the shutdown's report.
//!
//! Real sockets run on the real clock: the grace periods are long against a loopback request
//! (a handler that must finish within one takes a tenth of it), and every wait is on an
//! observable event, bounded so that a bug fails the test instead of hanging it.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{AdmissionError, EndpointPolicy, ServerScope};
use cancel_scope::{Cause, ChildSpec, Lifecycle, Scope};
use http::StatusCode;
use tokio::sync::Notify;
use tokio::time::timeout;

use crate::support::grpc::{self, UnaryFn};

const PATIENCE: Duration = Duration::from_secs(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the handlers tell the test.
#[derive(Clone, Default)]
struct Handlers {
    started: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    causes: Arc<Mutex<Vec<Cause>>>,
}

impl Handlers {
    /// Waits until `n` handlers have started.
    async fn started(&self, n: usize) {
        timeout(PATIENCE, async {
            while self.started.load(Ordering::SeqCst) < n {
                self.arrived.notified().await;
            }
        })
        .await
        .expect("the handlers did not start");
    }

    fn start(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.arrived.notify_waiters();
        self.arrived.notify_one();
    }
}

/// `/work/{ms}` works that long; `/stuck/{effect}` dispatches a child (`post`:
/// side-effecting, anything else: read-only) and waits for ever, noting the cause it is
/// stopped with; `/blocking` also runs a blocking job that no cancel stops (quarantined).
async fn handler(State(h): State<Handlers>, Path((what, arg)): Path<(String, String)>) -> String {
    let scope = Scope::current();
    h.start();
    // Noted at the cancel (the handler's future is not polled again after it).
    let causes = h.causes.clone();
    let _noted = scope.on_cancel(move |cause| causes.lock().unwrap().push(cause.clone()));
    match what.as_str() {
        "work" => {
            tokio::time::sleep(ms(arg.parse().unwrap())).await;
            "done".to_owned()
        }
        "blocking" => {
            let _job = scope
                .spawn_blocking(|| std::thread::sleep(Duration::from_secs(3)))
                .unwrap();
            std::future::pending().await
        }
        _ => {
            let spec = match arg.as_str() {
                "post" => ChildSpec::side_effecting("charge", "charge-1"),
                _ => ChildSpec::read_only("lookup"),
            };
            let _call = scope.register(spec).unwrap().dispatch().unwrap();
            std::future::pending().await
        }
    }
}

type Refusals = Arc<Mutex<Vec<String>>>;

fn app(server: &ServerScope, handlers: &Handlers) -> (Router, Refusals) {
    let refusals = Refusals::default();
    let seen = refusals.clone();
    let layer = AdmitLayer::new(EndpointPolicy::builder(ms(60_000)).build())
        .server(server)
        .on_refusal(move |e: &AdmissionError| seen.lock().unwrap().push(e.to_string()));
    let app = Router::new()
        .route("/{what}/{arg}", get(handler))
        .with_state(handlers.clone())
        .layer(layer);
    (app, refusals)
}

async fn listen() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

#[tokio::test]
async fn axum_drains_in_flight_requests_and_cancels_the_stragglers_at_the_grace_end() {
    let server = ServerScope::new().stop_grace(ms(300));
    let handlers = Handlers::default();
    let (app, _) = app(&server, &handlers);
    let (listener, url) = listen().await;
    let serving = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(server.draining())
            .into_future(),
    );

    let client = reqwest::Client::new();
    let get = |path: &str| tokio::spawn(client.get(format!("{url}{path}")).send());
    let work = get("/work/200");
    let write = get("/stuck/post");
    let read = get("/stuck/get");
    let blocking = get("/blocking/x");
    handlers.started(4).await;

    // Longer than the work (ten times), shorter than the blocking job.
    let grace = ms(2_000);
    let report = timeout(PATIENCE, server.shutdown(grace)).await.unwrap();

    // In flight within the grace period: finished as if nothing happened.
    let work = work.await.unwrap().unwrap();
    assert_eq!(work.status(), StatusCode::OK);
    assert_eq!(work.text().await.unwrap(), "done");
    // The stragglers, cancelled with `Shutdown` at its end.
    let write = write.await.unwrap().unwrap();
    assert_eq!(write.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(write.headers()["service-effect"], "unknown");
    assert!(write.headers().get("retry-after").is_none());
    let read = read.await.unwrap().unwrap();
    assert_eq!(read.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(read.headers()["service-effect"], "none");
    assert_eq!(read.headers()["retry-after"], "1");
    assert_eq!(blocking.await.unwrap().unwrap().status(), 503);
    let causes = handlers.causes.lock().unwrap().clone();
    assert_eq!(causes.len(), 3, "{causes:?}");
    assert!(causes.iter().all(Cause::is_shutdown), "{causes:?}");

    assert_eq!(report.in_flight(), 4, "{report}");
    assert_eq!(report.cancelled(), 3, "{report}");
    assert_eq!(report.finished(), 1, "{report}");
    // The blocking job did not stop within the stop grace.
    assert_eq!(report.quarantined(), 1, "{report}");
    let pending: Vec<_> = report
        .pending_effects()
        .iter()
        .map(|e| e.effect_id())
        .collect();
    assert_eq!(pending, ["charge-1"], "{report}");
    assert_eq!(report.report().state(), Lifecycle::NeedsReconciliation);
    assert!(report.took() >= grace, "{report}");
    // Every handler's own receipt is in it: one answered, three stopped.
    assert_eq!(report.report().succeeded(), 1, "{report}");

    // With its connections answered, axum's own graceful shutdown ends.
    timeout(PATIENCE, serving).await.unwrap().unwrap().unwrap();
    // Nothing more happens: the report stands.
    assert_eq!(server.shutdown(grace).await.report(), report.report());
}

#[tokio::test]
async fn requests_that_reach_a_draining_server_get_503_with_retry_after() {
    let server = ServerScope::new().retry_after(ms(2_500));
    let handlers = Handlers::default();
    let (app, refusals) = app(&server, &handlers);
    // A server that is not told to stop accepting: the layer refuses on its own.
    let (listener, url) = listen().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("{url}/work/0"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let report = server.shutdown(ms(1_000)).await;
    assert_eq!(report.in_flight(), 0, "{report}");
    let res = client.get(format!("{url}/work/0")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "3");
    assert_eq!(res.headers()["service-effect"], "none");
    assert_eq!(res.text().await.unwrap(), "service unavailable");
    // The handler never ran, and the refusal went to the refusal callback.
    assert_eq!(handlers.started.load(Ordering::SeqCst), 1);
    let refusals = refusals.lock().unwrap().clone();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("shutting down"), "{refusals:?}");
}

/// A tonic server given the server's draining future, whose method (`"{what} {arg}"`) works
/// `arg` ms (`work`) or dispatches a child and waits for ever (`stuck`, `post` or `get`).
async fn tonic_server(server: &ServerScope, handlers: &Handlers, drain: bool) -> String {
    let policy = EndpointPolicy::builder(ms(60_000)).build();
    let layer = AdmitLayer::new(policy).server(server);
    let h = handlers.clone();
    let svc = UnaryFn(move |message: String| {
        let h = h.clone();
        async move {
            h.start();
            let (what, arg) = message.split_once(' ').unwrap();
            if what == "work" {
                tokio::time::sleep(ms(arg.parse().unwrap())).await;
                return Ok("done".to_owned());
            }
            let spec = match arg {
                "post" => ChildSpec::side_effecting("charge", "charge-1"),
                _ => ChildSpec::read_only("lookup"),
            };
            let _call = Scope::current().register(spec).unwrap().dispatch().unwrap();
            std::future::pending::<()>().await;
            Ok(String::new())
        }
    });
    let (listener, url) = listen().await;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let router = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(svc);
    if drain {
        tokio::spawn(router.serve_with_incoming_shutdown(incoming, server.draining()));
    } else {
        tokio::spawn(router.serve_with_incoming(incoming));
    }
    url
}

async fn channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn tonic_drains_in_flight_calls_and_cancels_the_stragglers_at_the_grace_end() {
    let server = ServerScope::new();
    let handlers = Handlers::default();
    let url = tonic_server(&server, &handlers, true).await;
    let channel = channel(&url).await;
    let call = |message: &'static str| tokio::spawn(grpc::call(channel.clone(), message));
    let work = call("work 400");
    let write = call("stuck post");
    let read = call("stuck get");
    handlers.started(3).await;

    let report = timeout(PATIENCE, server.shutdown(ms(4_000))).await.unwrap();
    assert_eq!(work.await.unwrap().unwrap(), "done");
    let write = write.await.unwrap().unwrap_err();
    assert_eq!(write.code(), tonic::Code::Unknown);
    assert_eq!(write.metadata().get("service-effect").unwrap(), "unknown");
    let read = read.await.unwrap().unwrap_err();
    assert_eq!(read.code(), tonic::Code::Unavailable);
    assert_eq!(read.metadata().get("service-effect").unwrap(), "none");
    assert_eq!(
        read.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "1000"
    );
    assert_eq!(
        (report.in_flight(), report.cancelled(), report.finished()),
        (3, 2, 1),
        "{report}"
    );
    assert_eq!(report.pending_effects().len(), 1, "{report}");
}

#[tokio::test]
async fn tonic_calls_that_reach_a_draining_server_get_unavailable() {
    let server = ServerScope::new();
    let handlers = Handlers::default();
    let url = tonic_server(&server, &handlers, false).await;
    let channel = channel(&url).await;
    server.shutdown(ms(1_000)).await;
    let status = grpc::call(channel, "work 0").await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(status.message(), "service unavailable");
    assert_eq!(status.metadata().get("service-effect").unwrap(), "none");
    assert_eq!(handlers.started.load(Ordering::SeqCst), 0);
}
