//! The gRPC hop of phase 2: `pricing`, a tonic server behind the real `AdmitLayer` (and the
//! I/O log), called by `orders` through `PropagateLayer` around a tonic channel. Its one
//! unary method ([`METHOD`], a UTF-8 string codec: no protobuf compiler needed) works for a
//! few milliseconds; its budget arrives as `grpc-timeout` beside `service-budget`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::integrations::tower::{AdmitLayer, Propagate, PropagateLayer};
use cancel_scope::wire::Admission;
use cancel_scope::Scope;
use http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint, Server};
use tower::Layer as _;

use crate::iolog::{self, IoLogLayer, Shared, CALL, HOP, PARENT, REQ};

// The test suite's tiny gRPC service (a UTF-8 codec and a unary method from a closure).
#[path = "../../../tests/support/grpc.rs"]
#[allow(dead_code)] // its `call` is for the tests' clients
mod support;

pub use support::METHOD;
use support::{UnaryFn, Utf8};

/// The `pricing` service: notes its hop's admission, then answers after a few milliseconds
/// (bounded by the request's scope: the layer stops it at the deadline or the cancel).
#[derive(Clone, Debug)]
struct Pricing {
    log: Shared,
}

impl tonic::server::NamedService for Pricing {
    const NAME: &'static str = "test.Unary";
}

type Answer =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Pricing {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Answer {
        let key = iolog::header_u64(&req, HOP).expect("the log layer names the hop");
        let id = iolog::enter(&self.log, key, req.extensions().get::<Admission>());
        let mut method = UnaryFn(move |_message: String| async move {
            tokio::time::sleep(Duration::from_millis(1 + id % 8)).await;
            Ok(format!("priced {id}"))
        });
        method.call(req)
    }
}

/// Serves `pricing` behind `admit` on a loopback port; returns its URL.
pub async fn serve(log: Shared, admit: AdmitLayer) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder()
        .layer(IoLogLayer(log.clone()))
        .layer(admit)
        .add_service(Pricing { log });
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(router.serve_with_incoming(incoming));
    format!("http://{addr}")
}

/// The client of `pricing`: our layer around one channel (HTTP/2, many calls at once).
pub fn client(url: &str) -> Propagate<Channel> {
    let channel = Endpoint::from_shared(url.to_owned())
        .expect("a loopback URL")
        .connect_lazy();
    PropagateLayer::new().layer(channel)
}

/// One call of `pricing` in `scope`, for the client request `id`, as the hop `key`'s call
/// `seq`: whether it succeeded.
pub async fn call(client: Propagate<Channel>, scope: &Scope, id: u64, key: u64, seq: u64) -> bool {
    let mut grpc = tonic::client::Grpc::new(client);
    if grpc.ready().await.is_err() {
        return false;
    }
    let mut request = tonic::Request::new(String::new());
    let metadata = request.metadata_mut();
    for (name, value) in [(REQ, id), (PARENT, key), (CALL, seq)] {
        metadata.insert(name, MetadataValue::from(value));
    }
    request.extensions_mut().insert(scope.clone());
    grpc.unary(request, PathAndQuery::from_static(METHOD), Utf8)
        .await
        .is_ok()
}
