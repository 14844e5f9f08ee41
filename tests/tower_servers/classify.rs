//! The gRPC retry classifier on real tonic statuses: what a tonic server answers (its code,
//! its `grpc-retry-pushback-ms`) as the client's `tonic::Status` carries it, and a retry that
//! obeys the pushback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cancel_scope::integrations::classify::GrpcClassifier;
use cancel_scope::retry::{Classify, Decision, Retry};
use cancel_scope::{ChildSpec, Scope};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::support::grpc::{self, UnaryFn};
use crate::support::servers::PATIENCE;
use crate::support::time::ms;

/// A tonic server whose method answers the status its message names (`"unavailable 40"`:
/// `UNAVAILABLE` with a 40 ms pushback), and `ok` once `fail_first` calls have failed.
async fn server(fail_first: usize) -> (tonic::transport::Channel, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = UnaryFn(move |message: String| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n >= fail_first {
                return Ok("ok".to_owned());
            }
            let mut words = message.split(' ');
            let code = match words.next() {
                Some("unavailable") => Code::Unavailable,
                Some("exhausted") => Code::ResourceExhausted,
                Some("not-found") => Code::NotFound,
                _ => Code::Internal,
            };
            let mut metadata = MetadataMap::new();
            if let Some(push) = words.next() {
                metadata.insert("grpc-retry-pushback-ms", push.parse().unwrap());
            }
            Err(Status::with_metadata(code, "refused", metadata))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = tonic::transport::Server::builder().add_service(svc);
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, calls)
}

/// Each answer of a real server, as the client's `Status` carries it (the pushback in the
/// trailers of a trailers-only answer), classified by the table.
#[tokio::test]
async fn statuses_and_pushbacks_of_a_real_server() {
    let (channel, _) = server(usize::MAX).await;
    let grpc = GrpcClassifier::new();
    for (message, want) in [
        ("unavailable 40", Decision::EffectUnknownAfter(ms(40))),
        ("unavailable", Decision::EffectUnknown),
        ("exhausted 250", Decision::EffectUnknownAfter(ms(250))),
        // The server says: do not retry.
        ("unavailable -1", Decision::Never),
        ("not-found 40", Decision::Never),
        ("internal", Decision::Never),
    ] {
        let status = grpc::call(channel.clone(), message).await.unwrap_err();
        assert_eq!(grpc.classify(&status), want, "{message}: {status:?}");
    }
}

/// A read-only retry with the classifier waits the server's pushback, then succeeds.
#[tokio::test]
async fn a_retry_waits_for_the_pushback() {
    let (channel, calls) = server(1).await;
    let scope = Scope::with_timeout(PATIENCE);
    let (result, ledger) = Retry::new(GrpcClassifier::new())
        .max_attempts(3)
        .run_with_ledger(&scope, ChildSpec::read_only("quotes"), |_| {
            grpc::call(channel.clone(), "unavailable 300")
        })
        .await;
    assert_eq!(result.unwrap(), "ok");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let [first, second] = ledger.attempts() else {
        panic!("two attempts expected: {ledger}")
    };
    assert!(
        second.started_at() - first.started_at() >= ms(300),
        "{ledger}"
    );
}
