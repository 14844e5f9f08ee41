//! The tower layers with tonic: `Admit` in a tonic server, `Propagate` around a tonic
//! channel, against plain tonic peers on loopback.
//!
//! The service is written by hand on `tonic::server::Grpc` / `tonic::client::Grpc` with a
//! tiny UTF-8 string codec, so no protobuf compiler is needed. Real sockets mean real time:
//! budgets are generous and the assertions are about status codes, causes and inequalities.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, Propagate, PropagateLayer};
use cancel_scope::wire::{
    grpc_timeout, Admission, EgressPolicy, EndpointPolicy, OverCap, ServiceBudget, Trust,
};
use cancel_scope::{Cause, Lifecycle, Report, Scope};
use http::uri::PathAndQuery;
use tokio::time::{timeout, Instant};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tower::{Layer, ServiceBuilder};

use crate::support::grpc::Utf8;
use crate::support::servers::{next_report, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::{reporting, verdict, Reports};

// --- the service: "/test.Budget/Probe" -------------------------------------------------------
//
// The request is how long to work, in ms ("forever" for ever), "status:N" to fail with the
// gRPC code N, or "forward <url>" (see `forward`). The response says what the server saw: the budget of its current scope (if a
// layer admitted it), the budget headers, and what admission decided (priority, operation id,
// the caller's operation id, the declared budget). "/test.Budget/Stream" answers "one", then
// ends with `OK` (request "ok") or `INTERNAL` in the trailers (anything else).

#[derive(Clone, Default)]
struct Probe {
    calls: Arc<AtomicUsize>,
    arrived: Arc<tokio::sync::Notify>,
}

impl tonic::server::NamedService for Probe {
    const NAME: &'static str = "test.Budget";
}

struct ProbeCall;

impl tonic::server::UnaryService<String> for ProbeCall {
    type Response = String;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<String>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
        Box::pin(async move {
            let header = |name: &str| {
                request
                    .metadata()
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            let seen_timeout = header("grpc-timeout")
                .map(|v| grpc_timeout::decode(&v).unwrap().as_micros().to_string());
            let seen_budget = header("service-budget").map(|v| {
                ServiceBudget::parse(&v)
                    .unwrap()
                    .remaining()
                    .as_millis()
                    .to_string()
            });
            let scope_left = Scope::try_current()
                .and_then(|s| s.remaining())
                .map(|d| d.as_micros().to_string());
            let admission = request.extensions().get::<Admission>().cloned();
            if let Some(inner) = request.get_ref().strip_prefix("forward ") {
                return forward(inner, &request).await.map(tonic::Response::new);
            }
            match request.get_ref().as_str() {
                "forever" => std::future::pending::<()>().await,
                work => match work.strip_prefix("status:") {
                    Some(code) => {
                        let code = Code::from_i32(code.parse().unwrap());
                        return Err(Status::new(code, "as asked"));
                    }
                    None => tokio::time::sleep(ms(work.parse().unwrap())).await,
                },
            }
            let show = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
            let a = admission.as_ref();
            Ok(tonic::Response::new(format!(
                "timeout_us={} budget_ms={} scope_us={} prio={} op={} caller_op={} declared_ms={}",
                show(seen_timeout),
                show(seen_budget),
                show(scope_left),
                show(a.map(|a| a.priority().to_string())),
                show(a.map(|a| a.operation_id().to_owned())),
                show(a.and_then(|a| a.caller_operation_id().map(str::to_owned))),
                show(
                    a.and_then(|a| a.declared())
                        .map(|d| d.as_millis().to_string())
                ),
            )))
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Probe {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.arrived.notify_one();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Utf8);
            if req.uri().path() == STREAM {
                return Ok(grpc.server_streaming(StreamCall, req).await);
            }
            Ok(grpc.unary(ProbeCall, req).await)
        })
    }
}

struct StreamCall;

type Messages = Pin<Box<dyn futures::Stream<Item = Result<String, Status>> + Send>>;

impl tonic::server::ServerStreamingService<String> for StreamCall {
    type Response = String;
    type ResponseStream = Messages;
    type Future = std::future::Ready<Result<tonic::Response<Messages>, Status>>;

    fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
        let end = match request.get_ref().as_str() {
            "ok" => None,
            _ => Some(Err(Status::internal("broke mid-stream"))),
        };
        let messages = futures::stream::iter(std::iter::once(Ok("one".to_owned())).chain(end));
        std::future::ready(Ok(tonic::Response::new(Box::pin(messages) as Messages)))
    }
}

const PROBE: &str = "/test.Budget/Probe";
const STREAM: &str = "/test.Budget/Stream";

/// A parsed probe answer.
#[derive(Debug)]
struct Seen {
    timeout_us: Option<u64>,
    budget_ms: Option<u64>,
    scope_us: Option<u64>,
    prio: Option<u8>,
    op: Option<String>,
    caller_op: Option<String>,
    declared_ms: Option<u64>,
}

fn parse(answer: &str) -> Seen {
    let text = |key: &str| {
        let v = answer
            .split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .unwrap();
        (v != "-").then(|| v.to_owned())
    };
    let field = |key: &str| text(key).map(|v| v.parse().unwrap());
    Seen {
        timeout_us: field("timeout_us"),
        budget_ms: field("budget_ms"),
        scope_us: field("scope_us"),
        prio: text("prio").map(|v| v.parse().unwrap()),
        op: text("op"),
        caller_op: text("caller_op"),
        declared_ms: field("declared_ms"),
    }
}

// --- servers and clients ----------------------------------------------------------------

/// A tonic server with our `Admit` layer.
async fn admitted_server(policy: EndpointPolicy) -> (String, Probe, Reports) {
    let (layer, reports) = reporting(policy);
    let probe = Probe::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder().layer(layer).add_service(probe.clone());
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    (format!("http://{addr}"), probe, reports)
}

/// A plain tonic server.
async fn plain_server() -> (String, Arc<AtomicUsize>) {
    let probe = Probe::default();
    let calls = probe.calls.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder().add_service(probe);
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    (format!("http://{addr}"), calls)
}

async fn channel(url: &str) -> Channel {
    Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// One probe call through any gRPC client service.
async fn probe<T>(client: T, work: &str, deadline: Option<Duration>) -> Result<String, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut grpc = tonic::client::Grpc::new(client);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.into().to_string()))?;
    let mut request = tonic::Request::new(work.to_owned());
    if let Some(d) = deadline {
        request.set_timeout(d);
    }
    grpc.unary(request, PathAndQuery::from_static(PROBE), Utf8)
        .await
        .map(tonic::Response::into_inner)
}

/// Our client layer around a channel.
async fn propagated(url: &str, egress: EgressPolicy) -> Propagate<Channel> {
    PropagateLayer::new()
        .egress(egress)
        .layer(channel(url).await)
}

/// A probe made in a fresh scope with `budget`, that must fail: the status our client layer
/// gives. The scope goes in the request's extensions, not around the call as `Scope::run`:
/// `run` would stop the call itself at the deadline, with an error of its own, whenever its
/// timer came before the layer's answer (on a loaded machine, now and then), and the layer's
/// status would go unchecked.
async fn failed_probe_within(budget: Duration, client: Propagate<Channel>, work: &str) -> Status {
    let scope = Scope::with_timeout(budget);
    let mut grpc = tonic::client::Grpc::new(client);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(work.to_owned());
    request.extensions_mut().insert(scope);
    grpc.unary(request, PathAndQuery::from_static(PROBE), Utf8)
        .await
        .unwrap_err()
}

// --- tests -------------------------------------------------------------------------------

#[tokio::test]
async fn a_tonic_deadline_reaches_our_server_as_the_handlers_budget() {
    let reserve = ms(50);
    let (url, _, mut reports) = admitted_server(
        EndpointPolicy::builder(ms(30_000))
            .default_budget(ms(10_000))
            .reserve(reserve)
            .build(),
    )
    .await;
    let sent = Instant::now();
    // 20 s: between the endpoint's default and its maximum, and far more than a loopback call
    // takes on a loaded machine.
    let answer = probe(channel(&url).await, "0", Some(ms(20_000)))
        .await
        .unwrap();
    let seen = parse(&answer);
    // The handler's scope has the caller's 20 s less the reserve and the trip, not the
    // endpoint's default of 10 s.
    let scope = Duration::from_micros(seen.scope_us.unwrap());
    assert!(scope <= ms(20_000) - reserve, "{answer}");
    assert!(scope + sent.elapsed() >= ms(20_000) - reserve, "{answer}");
    // tonic's server read `grpc-timeout` before the layer; the layer took it off the request:
    // the handler sees neither budget header (they are in the `Admission`).
    assert_eq!((seen.timeout_us, seen.budget_ms), (None, None), "{answer}");
    let (admission, report) = next_report(&mut reports).await;
    assert_eq!(admission.declared(), Some(ms(20_000)));
    assert_eq!(admission.grpc_timeout(), Some(ms(20_000)));
    assert_eq!(report.state(), Lifecycle::Completed);
}

/// tonic's server enforces `grpc-timeout` itself, before any layer, and reports its own
/// expiry as CANCELLED; so does tonic's client. The server's reserve (as the module docs of
/// the tower integration say) is what makes our answer come first and reach the client before
/// the client's own timer fires: it must cover the trip of the request and of the answer, so
/// it is 2.5 s of a 3 s timeout here. (With 50 ms of 400 ms, a loaded machine lost that race
/// and the test saw tonic's CANCELLED, with no bug behind it.) The message is the fixed one.
#[tokio::test]
async fn a_tonic_client_sees_deadline_exceeded_from_our_server_not_cancelled() {
    let (url, _, mut reports) = admitted_server(
        EndpointPolicy::builder(ms(30_000))
            .default_budget(ms(10_000))
            .reserve(ms(2_500))
            .build(),
    )
    .await;
    let status = probe(channel(&url).await, "forever", Some(ms(3_000)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.message(), "deadline exceeded", "{status:?}");
    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::DeadlineExceeded), "{report}");
}

/// A probe whose `service-budget` metadata is `value`, as a tonic client sends it.
async fn probe_with_budget(url: &str, value: &'static str) -> Status {
    let mut grpc = tonic::client::Grpc::new(channel(url).await);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new("0".to_owned());
    request
        .metadata_mut()
        .insert("service-budget", value.parse().unwrap());
    grpc.unary(request, PathAndQuery::from_static(PROBE), Utf8)
        .await
        .unwrap_err()
}

/// Refusals reach a tonic client as their status with one fixed `grpc-message` per kind (no
/// numbers, no header values) when the policy does not show the detail, and with the detail
/// when it does; the handler never runs.
#[tokio::test]
async fn refusals_reach_a_tonic_client_with_a_fixed_message() {
    let policy = EndpointPolicy::builder(ms(30_000))
        .default_budget(ms(10_000))
        .over_cap(OverCap::Reject)
        .min_useful(ms(100))
        .build();
    let (url, probe, _) = admitted_server(policy).await;
    for (value, code, message) in [
        (
            "v=2, rem=10",
            Code::InvalidArgument,
            "invalid budget header",
        ),
        (
            "v=1, rem=86400000",
            Code::InvalidArgument,
            "budget exceeds the endpoint's maximum",
        ),
        ("v=1, rem=5", Code::DeadlineExceeded, "budget exhausted"),
    ] {
        let status = probe_with_budget(&url, value).await;
        assert_eq!(status.code(), code, "{value}: {status:?}");
        assert_eq!(status.message(), message, "{value}: {status:?}");
    }
    assert_eq!(probe.calls.load(Ordering::SeqCst), 0);

    let (url, _, _) = admitted_server(policy.to_builder().trust(Trust::Trusted).build()).await;
    let status = probe_with_budget(&url, "v=2, rem=10").await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("invalid budget header: service-budget"),
        "{status:?}"
    );
}

#[tokio::test]
async fn our_client_layer_sends_the_budget_a_tonic_server_reads() {
    let (url, calls) = plain_server().await;
    let pad = ms(10);
    let client = ServiceBuilder::new()
        .layer(PropagateLayer::new().egress(EgressPolicy::builder().transport_pad(pad).build()))
        .service(channel(&url).await);
    // Told apart from "nothing, or a default" by a wide margin: 60 s of time for the call.
    let scope = Scope::with_timeout(ms(120_000));
    let before = scope.remaining().unwrap();
    let answer = scope.run(probe(client, "0", None)).await.unwrap().unwrap();
    let seen = parse(&answer);
    let timeout = Duration::from_micros(seen.timeout_us.unwrap());
    let budget = ms(seen.budget_ms.unwrap());
    assert!(timeout <= before - pad, "{answer}");
    assert!(timeout > ms(60_000), "{answer}");
    assert!(budget <= timeout, "{answer}");
    assert_eq!(seen.scope_us, None); // a plain tonic server has no scope
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The call was receipted in the caller's scope.
    scope.close();
    let report = timeout_quiesce(&scope).await;
    assert_eq!(report.succeeded(), 1, "{report}");
}

async fn timeout_quiesce(scope: &Scope) -> Report {
    timeout(PATIENCE, scope.quiesce()).await.unwrap()
}

#[tokio::test]
async fn our_client_layer_reports_expiry_as_deadline_exceeded() {
    // Against a plain tonic server, which times out on `grpc-timeout` by itself and would
    // say CANCELLED...
    let (url, _) = plain_server().await;
    let client = propagated(&url, EgressPolicy::builder().transport_pad(ms(10)).build()).await;
    let status = failed_probe_within(ms(400), client, "forever").await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    // ... and against our own server, whose deadline comes first: its reserve (2.5 s of 3 s)
    // covers the trip, also on a loaded machine. (With 50 ms of 400 ms, the caller's own
    // deadline came first there: the server saw its client go, not its deadline.)
    let (url, _, mut reports) = admitted_server(
        EndpointPolicy::builder(ms(30_000))
            .default_budget(ms(10_000))
            .reserve(ms(2_500))
            .build(),
    )
    .await;
    let client = propagated(&url, EgressPolicy::new()).await;
    let status = failed_probe_within(ms(3_000), client, "forever").await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let (_, report) = next_report(&mut reports).await;
    assert!(report.cause().unwrap().is_deadline_exceeded(), "{report}");
}

#[tokio::test]
async fn our_client_layer_sends_nothing_after_a_cancel_or_without_budget() {
    let (url, calls) = plain_server().await;
    let chan = channel(&url).await;

    let cancelled = Scope::with_timeout(ms(10_000));
    cancelled.cancel_with("user left");
    let client = ServiceBuilder::new()
        .layer(PropagateLayer::new())
        .service(chan.clone());
    // The call's parent scope given explicitly, in the request's extensions.
    let mut grpc = tonic::client::Grpc::new(client);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new("0".to_owned());
    req.extensions_mut().insert(cancelled.clone());
    let status = grpc
        .unary(req, PathAndQuery::from_static(PROBE), Utf8)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Cancelled, "{status:?}");

    let client = PropagateLayer::new()
        .egress(EgressPolicy::builder().min_useful(ms(20_000)).build())
        .layer(chan);
    let status = failed_probe_within(ms(10_000), client, "0").await;
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_cancelled_caller_resets_the_stream_and_the_server_sees_the_client_go() {
    let (url, server, mut reports) =
        admitted_server(EndpointPolicy::builder(ms(60_000)).build()).await;
    let client = ServiceBuilder::new()
        .layer(PropagateLayer::new().read_only_method(PROBE))
        .service(channel(&url).await);
    let caller = Scope::with_timeout(ms(60_000));
    let call = tokio::spawn({
        let caller = caller.clone();
        async move { caller.run(probe(client, "forever", None)).await }
    });
    timeout(PATIENCE, server.arrived.notified())
        .await
        .expect("the call never arrived");
    caller.cancel_with("user pressed stop");
    let stopped = call.await.unwrap();
    assert!(stopped.unwrap_err().is_cancelled());

    let (_, report) = next_report(&mut reports).await;
    assert_eq!(report.cause(), Some(&Cause::ClientGone), "{report}");
    // Declared read-only: cut off, it is `Cancelled`.
    let report = timeout_quiesce(&caller).await;
    assert_eq!(report.cancelled(), 1, "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
}

/// A gRPC call is side-effecting unless the layer is told otherwise: cut off after the server
/// got it, it may have had its effect (`EffectUnknown`, the report `NeedsReconciliation`).
#[tokio::test]
async fn a_grpc_call_cut_off_after_the_server_got_it_needs_reconciliation() {
    let (url, server, _reports) =
        admitted_server(EndpointPolicy::builder(ms(60_000)).build()).await;
    let client = propagated(&url, EgressPolicy::new()).await;
    let caller = Scope::with_timeout(ms(60_000));
    let call = tokio::spawn({
        let caller = caller.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(client);
            grpc.ready().await.unwrap();
            let mut request = tonic::Request::new("forever".to_owned());
            request.extensions_mut().insert(caller);
            grpc.unary(request, PathAndQuery::from_static(PROBE), Utf8)
                .await
                .unwrap_err()
        }
    });
    timeout(PATIENCE, server.arrived.notified())
        .await
        .expect("the call never arrived");
    caller.cancel_with("user pressed stop");
    let status = call.await.unwrap();
    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    let report = timeout_quiesce(&caller).await;
    assert_eq!(report.state(), Lifecycle::NeedsReconciliation, "{report}");
    assert_eq!(report.effect_unknown(), 1, "{report}");
    let id = report.pending_effects()[0].effect_id().to_owned();
    assert!(id.starts_with("POST /test.Budget/Probe (call "), "{id}");
}

/// gRPC error statuses from a real tonic server: any error fails a read-only call; a call that
/// may have had an effect fails only on a refusal (`NOT_FOUND`, `INVALID_ARGUMENT`, ...) and is
/// `EffectUnknown` on any other error, its status kept in the record.
#[tokio::test]
async fn grpc_error_statuses_receipt_by_the_effect_class() {
    let (url, _) = plain_server().await;
    let chan = channel(&url).await;
    for (code, read_only, want) in [
        (Code::Ok, false, "s"),
        (Code::Unavailable, true, "f"),
        (Code::Internal, true, "f"),
        (Code::NotFound, false, "f"),
        (Code::InvalidArgument, false, "f"),
        (Code::FailedPrecondition, false, "f"),
        (Code::Unavailable, false, "u gRPC UNAVAILABLE"),
        (Code::Unknown, false, "u gRPC UNKNOWN"),
        (Code::Internal, false, "u gRPC INTERNAL"),
        (Code::DeadlineExceeded, false, "u gRPC DEADLINE_EXCEEDED"),
    ] {
        let layer = PropagateLayer::new();
        let layer = if read_only {
            layer.read_only_method(PROBE)
        } else {
            layer
        };
        let client = layer.layer(chan.clone());
        let scope = Scope::with_timeout(ms(60_000));
        let work = if code == Code::Ok {
            "0".to_owned()
        } else {
            format!("status:{}", code as i32)
        };
        let res = scope.run(probe(client, &work, None)).await.unwrap();
        assert_eq!(
            res.map(drop).map_err(|s| s.code()).err(),
            (code != Code::Ok).then_some(code)
        );
        scope.close();
        let report = timeout_quiesce(&scope).await;
        assert_eq!(
            verdict(&report),
            want,
            "{code:?}, read-only {read_only}: {report}"
        );
    }
}

/// A server stream that fails after its first message has its status in the trailers, not in
/// the head (which says 200 and nothing about the outcome): the receipt is decided at the end
/// of the body. `INTERNAL` there: `EffectUnknown` for a call that may have had an effect,
/// `Failed` for a read-only one; a stream that ends `OK` succeeds.
#[tokio::test]
async fn a_mid_stream_grpc_error_in_the_trailers_decides_the_receipt() {
    let (url, _) = plain_server().await;
    let chan = channel(&url).await;
    for (ask, read_only, want) in [
        ("ok", false, "s"),
        ("fail", true, "f"),
        ("fail", false, "u gRPC INTERNAL"),
    ] {
        let layer = PropagateLayer::new();
        let layer = if read_only {
            layer.read_only_method("/test.Budget/")
        } else {
            layer
        };
        let scope = Scope::with_timeout(ms(60_000));
        let mut grpc = tonic::client::Grpc::new(layer.layer(chan.clone()));
        let mut stream = scope
            .run(async {
                grpc.ready().await.unwrap();
                let request = tonic::Request::new(ask.to_owned());
                grpc.server_streaming(request, PathAndQuery::from_static(STREAM), Utf8)
                    .await
            })
            .await
            .unwrap()
            .unwrap()
            .into_inner();
        assert_eq!(stream.message().await.unwrap().as_deref(), Some("one"));
        let end = stream.message().await;
        if ask == "ok" {
            assert_eq!(end.unwrap(), None);
        } else {
            assert_eq!(end.unwrap_err().code(), Code::Internal);
        }
        drop(stream);
        scope.close();
        let report = timeout_quiesce(&scope).await;
        assert_eq!(
            verdict(&report),
            want,
            "{ask}, read-only {read_only}: {report}"
        );
    }
}

/// A tonic client whose call through our layer has no scope at all (a bare task, a
/// background thread) is refused with a status it can read, `FAILED_PRECONDITION` — not
/// `UNKNOWN` with an error's text — and nothing is sent. Opted in with `allow_unscoped`, the
/// call goes out without the `service-budget` a handler copied onto it, and with a
/// `grpc-timeout` no longer than the layer's cap.
#[tokio::test]
async fn an_unscoped_call_is_refused_unless_the_layer_allows_it() {
    let (url, calls) = plain_server().await;
    let client = propagated(&url, EgressPolicy::new()).await;
    let status = probe(client, "0", None).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("no current scope"), "{status:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let client = PropagateLayer::new()
        .allow_unscoped(ms(5_000))
        .layer(channel(&url).await);
    let mut grpc = tonic::client::Grpc::new(client);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new("0".to_owned());
    request
        .metadata_mut()
        .insert("service-budget", HOSTILE.parse().unwrap());
    request.set_timeout(ms(60_000));
    let answer = grpc
        .unary(request, PathAndQuery::from_static(PROBE), Utf8)
        .await
        .unwrap()
        .into_inner();
    let seen = parse(&answer);
    assert_eq!(seen.budget_ms, None, "{answer}");
    assert!(seen.timeout_us.unwrap() <= 5_000_000, "{answer}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// What a caller of the edge sends: the most it may ask for, the most urgent priority, and
/// the operation id of someone else's request.
const HOSTILE: &str = r#"v=1, rem=86400000, prio=0, op="victim-op", gen=7"#;

/// The metadata a request arrived with, before any layer of the server looked at it.
#[derive(Clone)]
struct Raw(http::HeaderMap);

/// The edge's handler (a probe asked `forward <url>`): copies its caller's budget headers, as
/// they arrived, onto calls to the probe at `url` through our client layer — from a bare task,
/// from a root scope with no deadline and from the request's own scope — and answers with the
/// bare task's status and the two answers, one a line.
async fn forward(inner: &str, request: &tonic::Request<String>) -> Result<String, Status> {
    let Raw(raw) = request.extensions().get::<Raw>().unwrap().clone();
    let inner = channel(inner).await;
    let forwarded = move || {
        let mut request = tonic::Request::new("0".to_owned());
        for name in ["service-budget", "grpc-timeout"] {
            if let Some(v) = raw.get(name) {
                let v = v.to_str().unwrap().parse().unwrap();
                request.metadata_mut().insert(name, v);
            }
        }
        request
    };
    let call = |request: tonic::Request<String>| {
        let client = PropagateLayer::new().layer(inner.clone());
        async move {
            let mut grpc = tonic::client::Grpc::new(client);
            grpc.ready().await.unwrap();
            grpc.unary(request, PathAndQuery::from_static(PROBE), Utf8)
                .await
                .map(tonic::Response::into_inner)
        }
    };
    // (a) A bare task.
    let bare = tokio::spawn(call(forwarded())).await.unwrap();
    let mut results = vec![format!("{:?}", bare.unwrap_err().code())];
    // (b) A root scope with no deadline.
    results.push(Scope::new().run(call(forwarded())).await.unwrap()?);
    // (c) The request's own scope.
    results.push(call(forwarded()).await?);
    Ok(results.join("\n"))
}

/// The attack over tonic: an untrusted caller of the edge (at most 10 s) sends
/// `service-budget` with 86400000 ms, priority 0 and operation "victim-op"; the edge's handler
/// copies it onto its calls to a trusted inner service (at most 30 s, which believes its
/// callers' priority and operation id) through our client layer. From a bare task the call is
/// refused (`FAILED_PRECONDITION`); from a root with no deadline it carries no budget header;
/// from the request's scope it carries the edge's own. The inner service never sees the
/// caller's budget, priority or operation id.
#[tokio::test]
async fn a_handler_that_copies_its_callers_metadata_does_not_pass_the_budget_on() {
    let (inner_url, _, _reports) = admitted_server(
        EndpointPolicy::builder(ms(30_000))
            .default_budget(ms(10_000))
            .trust(cancel_scope::wire::Trust::Trusted)
            .priority(5)
            .build(),
    )
    .await;
    let keep_raw =
        tower::util::MapRequestLayer::new(|mut req: http::Request<tonic::body::Body>| {
            let raw = Raw(req.headers().clone());
            req.extensions_mut().insert(raw);
            req
        });
    let admit = AdmitLayer::new(
        EndpointPolicy::builder(ms(10_000))
            .default_budget(ms(1_000))
            .priority(4)
            .build(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let edge_url = format!("http://{}", listener.local_addr().unwrap());
    let router = Server::builder()
        .layer(ServiceBuilder::new().layer(keep_raw).layer(admit))
        .add_service(Probe::default());
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));

    let mut grpc = tonic::client::Grpc::new(channel(&edge_url).await);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(format!("forward {inner_url}"));
    request
        .metadata_mut()
        .insert("service-budget", HOSTILE.parse().unwrap());
    let answer = grpc
        .unary(request, PathAndQuery::from_static(PROBE), Utf8)
        .await
        .unwrap()
        .into_inner();
    let results: Vec<_> = answer.lines().collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(
        results[0], "FailedPrecondition",
        "a bare task's call was sent"
    );
    let (unbounded, scoped) = (parse(results[1]), parse(results[2]));
    for seen in [&unbounded, &scoped] {
        assert_ne!(seen.caller_op.as_deref(), Some("victim-op"), "{results:?}");
        assert_ne!(seen.op.as_deref(), Some("victim-op"), "{results:?}");
        assert_ne!(seen.prio, Some(0), "{results:?}");
        assert!(seen.declared_ms.is_none_or(|d| d <= 10_000), "{results:?}");
    }
    // No deadline: no budget header, the inner service's default and priority.
    assert_eq!(unbounded.declared_ms, None, "{results:?}");
    assert_eq!(unbounded.prio, Some(5), "{results:?}");
    // The request's scope: the edge's operation and priority, at most the edge's budget.
    assert!(scoped.declared_ms.is_some(), "{results:?}");
    assert_eq!(scoped.prio, Some(4), "{results:?}");
    assert_eq!(scoped.caller_op, scoped.op, "{results:?}");
}
