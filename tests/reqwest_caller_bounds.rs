//! The reqwest extension keeps the caller's own, shorter bounds on a request: its `timeout`
//! and a budget header set on the builder survive `scoped()`; the scope may only shorten them.
//!
//! Real loopback sockets (a bare `TcpListener`, no server framework), so the real clock:
//! tokio's paused clock would auto-advance past the timers before the socket events arrive.
//! Nothing sleeps: every wait is on a socket event or on the call's own timeout, and every
//! test is bounded by a 2 s scope.

use std::time::Duration;

use cancel_scope::integrations::reqwest::{RequestBuilderExt, ScopedResponse};
use cancel_scope::wire::{grpc_timeout, service_budget::ServiceBudget};
use cancel_scope::Scope;
use reqwest::RequestBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Accepts one connection, sends back the request head it read, and answers `200` only if
/// `answer`; otherwise holds the connection open without a word.
async fn one_shot_server(answer: bool) -> (String, oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0_u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
        if answer {
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
        // Hold the connection until the client goes.
        let _ = sock.read(&mut buf).await;
    });
    (url, rx)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The budget a request head carries: (grpc-timeout, service-budget rem).
fn told(head: &str) -> (Duration, Duration) {
    let grpc = grpc_timeout::decode(header(head, "grpc-timeout").unwrap()).unwrap();
    let rem = ServiceBudget::parse(header(head, "service-budget").unwrap())
        .unwrap()
        .remaining();
    (grpc, rem)
}

/// `.timeout(50 ms)` on the builder, then `.scoped()` in a 2 s scope: the request gives up
/// after about 50 ms, as a deadline, and the server is told no more than 50 ms.
#[tokio::test]
async fn the_callers_shorter_timeout_is_kept() {
    let (url, head) = one_shot_server(false).await;
    let client = reqwest::Client::new();
    let scope = Scope::with_timeout(ms(2_000));
    let start = Instant::now();
    let res = scope
        .run(async { client.get(&url).timeout(ms(50)).scoped().send().await })
        .await
        .unwrap();
    let took = start.elapsed();
    let err = res.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err}");
    assert!(
        took < ms(1_000),
        "the caller's 50 ms timeout was replaced by the scope's budget: gave up after {took:?}"
    );
    let (grpc, rem) = told(&head.await.unwrap());
    assert!(
        grpc <= ms(50) && rem <= ms(50),
        "told {grpc:?}, rem {rem:?}"
    );
    assert!(!scope.is_cancelled());
}

/// Sends a GET made by `with` from a 2 s scope to a server that answers; returns the
/// response and the request head the server read.
async fn send_in_2s(
    with: impl FnOnce(RequestBuilder) -> RequestBuilder,
) -> (ScopedResponse, String) {
    let (url, head) = one_shot_server(true).await;
    let client = reqwest::Client::new();
    let scope = Scope::with_timeout(ms(2_000));
    let res = scope
        .run(async { with(client.get(&url)).scoped().send().await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    (res, head.await.unwrap())
}

/// A longer timeout on the builder does not lengthen the scope's budget.
#[tokio::test]
async fn a_longer_caller_timeout_gives_no_more_than_the_scope() {
    let (res, head) = send_in_2s(|b| b.timeout(ms(60_000))).await;
    assert!(res.remaining().unwrap() <= ms(2_000));
    let (grpc, rem) = told(&head);
    assert!(
        grpc <= ms(2_000) && rem <= ms(2_000),
        "told {grpc:?}, rem {rem:?}"
    );
}

/// A preset, shorter `grpc-timeout` / `service-budget` on the builder is not replaced by the
/// scope's longer budget; the call's own budget shrinks with it.
#[tokio::test]
async fn a_shorter_preset_budget_header_is_not_lengthened() {
    let (res, head) = send_in_2s(|b| {
        b.header("grpc-timeout", "50000u")
            .header("service-budget", "v=1, rem=50")
    })
    .await;
    assert!(res.remaining().unwrap() <= ms(50));
    let (grpc, rem) = told(&head);
    assert!(
        grpc <= ms(50) && rem <= ms(50),
        "preset 50 ms sent as grpc-timeout {grpc:?}, rem {rem:?}"
    );
}

/// A malformed preset budget header is replaced by the scope's budget: not trusted, no error.
#[tokio::test]
async fn a_malformed_preset_budget_header_is_replaced() {
    let (_, head) = send_in_2s(|b| {
        b.header("grpc-timeout", "soon")
            .header("service-budget", "rem=1")
    })
    .await;
    let (grpc, rem) = told(&head);
    assert!(grpc > ms(1_000) && grpc <= ms(2_000), "told {grpc:?}");
    assert!(rem > ms(1_000) && rem <= ms(2_000), "rem {rem:?}");
}

/// The same bound set on the client (`ClientBuilder::timeout(50 ms)`), not on the request.
/// reqwest applies a request's own timeout in place of the client's, so `send()` must not give
/// a request the scope's budget as its own timeout (it did: the client's 50 ms became 2 s).
#[tokio::test]
async fn the_clients_shorter_timeout_is_kept() {
    let (url, _head) = one_shot_server(false).await;
    let client = reqwest::Client::builder().timeout(ms(50)).build().unwrap();
    let scope = Scope::with_timeout(ms(2_000));
    let start = Instant::now();
    let res = scope
        .run(async { client.get(&url).scoped().send().await })
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(res.is_err());
    assert!(
        took < ms(1_000),
        "the client's 50 ms timeout was replaced by the scope's budget: gave up after {took:?}"
    );
}

/// A timer of the client's own transport (`ClientBuilder::read_timeout(50 ms)`) that fires
/// while the call still has most of its 2 s budget is a transport failure, receipted `Failed`:
/// not the call's deadline (which would tell a handler to answer 504, and a retry policy that
/// the budget is gone, with 1.9 s left), and not `Cancelled` (nothing cancelled the call).
#[tokio::test]
async fn a_transport_timeout_with_budget_left_is_a_failure_not_the_deadline() {
    let (url, _head) = one_shot_server(false).await;
    let client = reqwest::Client::builder()
        .read_timeout(ms(50))
        .build()
        .unwrap();
    let scope = Scope::with_timeout(ms(2_000));
    let err = scope
        .run(async { client.get(&url).scoped().send().await })
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_transport(), "{err}");
    assert!(!err.is_deadline_exceeded(), "{err}");
    assert!(!scope.is_cancelled());
    scope.close();
    let report = timeout(ms(1_000), scope.quiesce()).await.unwrap();
    assert_eq!(report.failed(), 1, "{report}");
    assert_eq!(report.cancelled(), 0, "{report}");
}
