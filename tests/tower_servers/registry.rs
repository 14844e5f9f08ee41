//! The admission layer with an operation registry (`AdmitLayer::operations`, the in-process
//! registry here; two servers on one Redis are in the `registry` binary) over real loopback
//! servers: a cancelled operation's requests are answered 409 / `ABORTED` without reaching
//! the handler, a cancel stops a request in flight, and the next hop joins the operation the
//! edge issued through the `op` and `gen` the outgoing call carries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use cancel_scope::integrations::reqwest::RequestBuilderExt;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::registry::{InProcessRegistry, OperationId, Operations};
use cancel_scope::wire::{service_operation, Admission, EndpointPolicy, RegistryTerm, Trust};
use cancel_scope::Scope;
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::support::servers::{serve, PATIENCE};
use crate::support::time::ms;

#[derive(Clone)]
struct App {
    calls: Arc<AtomicUsize>,
    /// Where `/wait` says which operation it runs under, once it runs.
    arrived: mpsc::UnboundedSender<String>,
    next: Option<String>,
    client: reqwest::Client,
}

/// What a handler saw: its operation, the registry's term, its budget and generation; and,
/// with a next hop, what that one saw.
async fn seen(State(app): State<App>, Extension(a): Extension<Admission>) -> String {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let scope = Scope::current();
    let mine = format!(
        "op={} term={:?} rem_ms={} gen={}",
        a.operation_id(),
        a.registry(),
        scope.remaining().unwrap().as_millis(),
        scope.operation().unwrap().generation(),
    );
    match &app.next {
        None => mine,
        Some(next) => {
            let below = app.client.get(next).send_scoped().await.unwrap();
            format!("{mine} | {}", below.text().await.unwrap())
        }
    }
}

/// Runs until its request's scope is cancelled.
async fn wait(State(app): State<App>, Extension(a): Extension<Admission>) -> &'static str {
    app.calls.fetch_add(1, Ordering::SeqCst);
    app.arrived.send(a.operation_id().to_owned()).unwrap();
    Scope::current().cancelled().await;
    "stopped"
}

fn field<'a>(answer: &'a str, key: &str) -> &'a str {
    answer
        .split(' ')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {answer}"))
}

async fn server(
    policy: EndpointPolicy,
    ops: &Operations,
    next: Option<String>,
) -> (String, Arc<AtomicUsize>, mpsc::UnboundedReceiver<String>) {
    let (arrived, rx) = mpsc::unbounded_channel();
    let app = App {
        calls: Arc::default(),
        arrived,
        next,
        client: reqwest::Client::new(),
    };
    let calls = app.calls.clone();
    let router = Router::new()
        .route("/seen", get(seen))
        .route("/wait", get(wait))
        .with_state(app)
        .layer(AdmitLayer::new(policy).operations(ops));
    (format!("http://{}", serve(router).await), calls, rx)
}

fn claim(op: &str) -> String {
    format!("v=1, rem=10000, op=\"{op}\"")
}

/// A GET of `url`'s `/seen` by `client`, claiming operation `op` (an RFC 8941 String's
/// contents, escaped).
async fn claiming(client: &reqwest::Client, url: &str, op: &str) -> reqwest::Response {
    client
        .get(format!("{url}/seen"))
        .header("service-budget", claim(op))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_cancelled_operations_requests_get_409_and_a_cancel_stops_one_in_flight() {
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let edge = EndpointPolicy::builder(Duration::from_secs(10)).build();
    let (url, calls, mut arrived) = server(edge, &ops, None).await;
    let client = reqwest::Client::new();

    // A request in flight under an operation the edge issued.
    let in_flight = tokio::spawn(client.get(format!("{url}/wait")).send());
    let id = timeout(PATIENCE, arrived.recv()).await.unwrap().unwrap();
    ops.cancel(&OperationId::new(&id).unwrap()).await.unwrap();
    let stopped = timeout(PATIENCE, in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stopped.status(), 503);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The client's retry under that operation is refused before any handler runs.
    let refused = claiming(&client, &url, &id).await;
    assert_eq!(refused.status(), 409);
    assert_eq!(refused.headers()["service-effect"], "none");
    assert!(refused.headers().get("retry-after").is_none());
    assert_eq!(refused.text().await.unwrap(), "operation cancelled");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(ops.counts().refused(), 1);
}

#[tokio::test]
async fn the_next_hop_joins_the_operation_the_edge_issued_with_its_generation() {
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let inner = EndpointPolicy::builder(Duration::from_secs(30))
        .trust(Trust::Trusted)
        .transport_pad(ms(5))
        .build();
    let (inner_url, _, _) = server(inner, &ops, None).await;
    let edge = EndpointPolicy::builder(Duration::from_secs(2)).build();
    let (edge_url, _, _) = server(edge, &ops, Some(format!("{inner_url}/seen"))).await;

    let answer = reqwest::Client::new()
        .get(format!("{edge_url}/seen"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (outer, below) = answer.split_once(" | ").unwrap();
    assert_eq!(field(outer, "term"), format!("{:?}", RegistryTerm::Created));
    // The inner hop trusts its caller: it joined the edge's operation (not a new one), at
    // its generation, with no more than the edge had.
    assert_eq!(field(below, "op"), field(outer, "op"));
    assert_eq!(field(below, "term"), format!("{:?}", RegistryTerm::Joined));
    assert_eq!(field(below, "gen"), "0");
    let (edge_ms, inner_ms): (u64, u64) = (
        field(outer, "rem_ms").parse().unwrap(),
        field(below, "rem_ms").parse().unwrap(),
    );
    assert!(inner_ms <= edge_ms, "{answer}");
    assert_eq!(ops.counts().created(), 1);
}

#[tokio::test]
async fn a_grpc_request_of_a_cancelled_operation_is_aborted() {
    use tonic::transport::{Endpoint, Server};

    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let id = OperationId::random();
    let trusted = EndpointPolicy::builder(Duration::from_secs(10))
        .caller_operation(true)
        .build();
    let probe = Probe::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder()
        .layer(AdmitLayer::new(trusted).operations(&ops))
        .add_service(probe.clone());
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();

    let call = |gen: u64| {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        let mut request = tonic::Request::new(String::from("hi"));
        let header = format!("v=1, rem=5000, op=\"{id}\", gen={gen}");
        request
            .metadata_mut()
            .insert("service-budget", header.parse().unwrap());
        async move {
            grpc.ready().await.unwrap();
            let path = http::uri::PathAndQuery::from_static("/test.Registry/Echo");
            grpc.unary(request, path, crate::support::grpc::Utf8).await
        }
    };
    // The trusted caller begins the operation; its cancel then refuses its calls.
    assert_eq!(call(0).await.unwrap().into_inner(), "hi");
    ops.cancel(&id).await.unwrap();
    let status = call(0).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert_eq!(status.message(), "operation cancelled");
    assert_eq!(status.metadata().get("service-effect").unwrap(), "none");
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
}

/// A hand-written tonic service, "/test.Registry/Echo".
#[derive(Clone, Default)]
struct Probe {
    calls: Arc<AtomicUsize>,
}

impl tonic::server::NamedService for Probe {
    const NAME: &'static str = "test.Registry";
}

struct Echo;

impl tonic::server::UnaryService<String> for Echo {
    type Response = String;
    type Future = std::future::Ready<Result<tonic::Response<String>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(request.into_inner())))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Probe {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(crate::support::grpc::Utf8);
            Ok(grpc.unary(Echo, req).await)
        })
    }
}

#[tokio::test]
async fn the_axum_and_tonic_conversions_answer_a_cancelled_operation_409_and_aborted() {
    use axum::response::IntoResponse as _;

    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let policy = EndpointPolicy::builder(Duration::from_secs(2)).build();
    let now = tokio::time::Instant::now;
    let (_, a) = policy
        .admit_joined(&ops, cancel_scope::wire::Incoming::new(), now())
        .await
        .unwrap();
    ops.cancel(&OperationId::new(a.operation_id()).unwrap())
        .await
        .unwrap();
    let header = format!("v=1, rem=500, op=\"{}\"", a.operation_id());
    let refused = || async {
        let incoming = cancel_scope::wire::Incoming::new().service_budget(header.as_bytes());
        policy
            .admit_joined(&ops, incoming, now())
            .await
            .unwrap_err()
    };
    let status = tonic::Status::from(refused().await);
    assert_eq!(status.code(), tonic::Code::Aborted);
    assert_eq!(status.message(), "operation cancelled");
    assert_eq!(status.metadata().get("service-effect").unwrap(), "none");
    let res = refused().await.into_response();
    assert_eq!(res.status(), 409);
    assert_eq!(res.headers()["service-effect"], "none");
}

/// The operation an answer names (`service-operation`), read as a client reads it.
fn named_operation(res: &reqwest::Response) -> Option<String> {
    let value = res.headers().get(service_operation::HEADER)?;
    let id = service_operation::parse(value.as_bytes()).expect("a valid service-operation");
    Some(id.as_str().to_owned())
}

#[tokio::test]
async fn the_edge_names_the_operation_it_issued_and_a_retry_under_it_continues_it() {
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let edge = EndpointPolicy::builder(Duration::from_secs(10)).build();
    let (url, _, mut arrived) = server(edge, &ops, None).await;
    let client = reqwest::Client::new();

    // No operation sent: the edge issues one, and says which.
    let first = client.get(format!("{url}/seen")).send().await.unwrap();
    let value = first.headers()[service_operation::HEADER].clone();
    let id = named_operation(&first).unwrap();
    let answer = first.text().await.unwrap();
    assert_eq!(field(&answer, "op"), id);
    assert_eq!(
        field(&answer, "term"),
        format!("{:?}", RegistryTerm::Created)
    );
    assert_eq!(id.len(), 32, "128 random bits: {id}");

    // The retry puts the value in its `op` as it came: it continues that operation, with no
    // more than the operation has left, and is told the same id.
    let budget = format!("v=1, rem=60000, op={}", value.to_str().unwrap());
    let retry = client
        .get(format!("{url}/seen"))
        .header("service-budget", budget)
        .send()
        .await
        .unwrap();
    assert_eq!(named_operation(&retry).as_deref(), Some(id.as_str()));
    let again = retry.text().await.unwrap();
    assert_eq!(field(&again, "op"), id);
    assert_eq!(field(&again, "term"), format!("{:?}", RegistryTerm::Joined));
    let (first_ms, retry_ms): (u64, u64) = (
        field(&answer, "rem_ms").parse().unwrap(),
        field(&again, "rem_ms").parse().unwrap(),
    );
    assert!(retry_ms <= first_ms, "{answer} then {again}");

    // An id this untrusted caller made up is never repeated: it is told the one issued.
    let made_up = claiming(&client, &url, "victim-op").await;
    let issued = named_operation(&made_up).unwrap();
    assert_ne!(issued, "victim-op");
    assert_eq!(field(&made_up.text().await.unwrap(), "op"), issued);

    // The layer's own answer for a request it stopped names the operation too.
    let in_flight = tokio::spawn(client.get(format!("{url}/wait")).send());
    let waiting = timeout(PATIENCE, arrived.recv()).await.unwrap().unwrap();
    ops.cancel(&OperationId::new(&waiting).unwrap())
        .await
        .unwrap();
    let stopped = timeout(PATIENCE, in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stopped.status(), 503);
    assert_eq!(named_operation(&stopped), Some(waiting.clone()));

    // A request refused at admission has no operation to name.
    let refused = claiming(&client, &url, &waiting).await;
    assert_eq!(refused.status(), 409);
    assert_eq!(named_operation(&refused), None);
}

#[tokio::test]
async fn a_trusted_callers_operation_is_named_back() {
    let ops = Operations::new(Arc::new(InProcessRegistry::new()));
    let inner = EndpointPolicy::builder(Duration::from_secs(10))
        .trust(Trust::Trusted)
        .build();
    let (url, _, _) = server(inner, &ops, None).await;
    let res = claiming(&reqwest::Client::new(), &url, r#"checkout \"7f3a\""#).await;
    assert_eq!(named_operation(&res).as_deref(), Some("checkout \"7f3a\""));
}
