//! The reqwest extension keeps the caller's own, shorter bounds on a request: its `timeout`
//! and a budget header set on the builder survive `scoped()`; the scope may only shorten them.
//!
//! Real loopback sockets (a bare `TcpListener`, no server framework), so the real clock:
//! tokio's paused clock would auto-advance past the timers before the socket events arrive.
//! Nothing sleeps: every wait is on a socket event or on the call's own timeout, and every
//! test is bounded by a scope of `SCOPE`.
//!
//! The bounds are far apart, so that a loaded machine cannot blur them: a caller's "shorter"
//! bound is 2 s (a loopback request reaches the server well within it, also while other
//! processes hold the CPU), the scope's budget is two minutes, and "gave up after the shorter
//! bound, not the scope's" is told apart at one minute. (With 50 ms and 2 s, a request whose
//! head had not reached the server within 50 ms, or a timer that fired a second late, failed
//! these tests on a loaded 2-core machine with no bug behind it.)

use std::time::Duration;

use cancel_scope::integrations::reqwest::{RequestBuilderExt, ScopedResponse};
use cancel_scope::wire::{grpc_timeout, service_budget::ServiceBudget};
use cancel_scope::Scope;
use reqwest::RequestBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};

use crate::support::time::ms;

/// The scope's budget in every test: never reached when the library keeps the shorter bound.
const SCOPE: Duration = Duration::from_secs(120);
/// A caller's or client's own bound, shorter than the scope's: what the call must keep.
const SHORTER: Duration = Duration::from_secs(2);
/// Between the two: a call that gave up before it kept the shorter bound.
const SPLIT: Duration = Duration::from_secs(60);

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

/// `.timeout(2 s)` on the builder, then `.scoped()` in a two-minute scope: the request gives
/// up after about 2 s, as a deadline, and the server is told no more than 2 s.
#[tokio::test]
async fn the_callers_shorter_timeout_is_kept() {
    let (url, head) = one_shot_server(false).await;
    let client = reqwest::Client::new();
    let scope = Scope::with_timeout(SCOPE);
    let start = Instant::now();
    let res = scope
        .run(async { client.get(&url).timeout(SHORTER).scoped().send().await })
        .await
        .unwrap();
    let took = start.elapsed();
    let err = res.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err}");
    assert!(
        took < SPLIT,
        "the caller's 2 s timeout was replaced by the scope's budget: gave up after {took:?}"
    );
    let (grpc, rem) = told(&head.await.unwrap());
    assert!(
        grpc <= SHORTER && rem <= SHORTER,
        "told {grpc:?}, rem {rem:?}"
    );
    assert!(!scope.is_cancelled());
}

/// Sends a GET made by `with` from a scope of `SCOPE` to a server that answers; returns the
/// response and the request head the server read.
async fn send_in_scope(
    with: impl FnOnce(RequestBuilder) -> RequestBuilder,
) -> (ScopedResponse, String) {
    let (url, head) = one_shot_server(true).await;
    let client = reqwest::Client::new();
    let scope = Scope::with_timeout(SCOPE);
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
    let (res, head) = send_in_scope(|b| b.timeout(SCOPE * 10)).await;
    assert!(res.remaining().unwrap() <= SCOPE);
    let (grpc, rem) = told(&head);
    assert!(grpc <= SCOPE && rem <= SCOPE, "told {grpc:?}, rem {rem:?}");
}

/// A preset, shorter `grpc-timeout` / `service-budget` on the builder is not replaced by the
/// scope's longer budget; the call's own budget shrinks with it.
#[tokio::test]
async fn a_shorter_preset_budget_header_is_not_lengthened() {
    let (res, head) = send_in_scope(|b| {
        b.header("grpc-timeout", "2000000u")
            .header("service-budget", "v=1, rem=2000")
    })
    .await;
    assert!(res.remaining().unwrap() <= SHORTER);
    let (grpc, rem) = told(&head);
    assert!(
        grpc <= SHORTER && rem <= SHORTER,
        "preset 2 s sent as grpc-timeout {grpc:?}, rem {rem:?}"
    );
}

/// A malformed preset budget header is replaced by the scope's budget: not trusted, no error.
#[tokio::test]
async fn a_malformed_preset_budget_header_is_replaced() {
    let (_, head) = send_in_scope(|b| {
        b.header("grpc-timeout", "soon")
            .header("service-budget", "rem=1")
    })
    .await;
    let (grpc, rem) = told(&head);
    assert!(grpc > SPLIT && grpc <= SCOPE, "told {grpc:?}");
    assert!(rem > SPLIT && rem <= SCOPE, "rem {rem:?}");
}

/// The same bound set on the client (`ClientBuilder::timeout(2 s)`), not on the request.
/// reqwest applies a request's own timeout in place of the client's, so `send()` must not give
/// a request the scope's budget as its own timeout (it did: the client's bound became the
/// scope's).
#[tokio::test]
async fn the_clients_shorter_timeout_is_kept() {
    let (url, _head) = one_shot_server(false).await;
    let client = reqwest::Client::builder().timeout(SHORTER).build().unwrap();
    let scope = Scope::with_timeout(SCOPE);
    let start = Instant::now();
    let res = scope
        .run(async { client.get(&url).scoped().send().await })
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(res.is_err());
    assert!(
        took < SPLIT,
        "the client's 2 s timeout was replaced by the scope's budget: gave up after {took:?}"
    );
}

/// A timer of the client's own transport (`ClientBuilder::read_timeout(50 ms)`) that fires
/// while the call still has most of its budget is a transport failure, receipted `Failed`:
/// not the call's deadline (which would tell a handler to answer 504, and a retry policy that
/// the budget is gone, with nearly all of it left), and not `Cancelled` (nothing cancelled the
/// call).
#[tokio::test]
async fn a_transport_timeout_with_budget_left_is_a_failure_not_the_deadline() {
    let (url, _head) = one_shot_server(false).await;
    let client = reqwest::Client::builder()
        .read_timeout(ms(50))
        .build()
        .unwrap();
    let scope = Scope::with_timeout(SCOPE);
    let err = scope
        .run(async { client.get(&url).scoped().send().await })
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_transport(), "{err}");
    assert!(!err.is_deadline_exceeded(), "{err}");
    assert!(!scope.is_cancelled());
    scope.close();
    let report = timeout(SPLIT, scope.quiesce()).await.unwrap();
    assert_eq!(report.failed(), 1, "{report}");
    assert_eq!(report.cancelled(), 0, "{report}");
}

/// A `service-budget` on the builder that a handler copied from its own caller (with that
/// caller's priority and operation id) is replaced, also when the call's scope has no
/// deadline (a root from `Scope::new()`): then the call carries no budget header at all, as
/// the callee's own default applies to it, rather than the copied 24 hours. The caller's own
/// per-call `grpc-timeout` still bounds such a call (and is all its headers say).
#[tokio::test]
async fn a_copied_service_budget_does_not_give_an_unbounded_call_a_budget() {
    const COPIED: &str = r#"v=1, rem=86400000, prio=0, op="victim-op", gen=7"#;
    for own_timeout in [None, Some("2S")] {
        let (url, head) = one_shot_server(true).await;
        let mut req = reqwest::Client::new()
            .get(&url)
            .header("service-budget", COPIED)
            .header("x-envoy-expected-rq-timeout-ms", "86400000");
        if let Some(t) = own_timeout {
            req = req.header("grpc-timeout", t);
        }
        let res = req.scoped_in(&Scope::new()).send().await.unwrap();
        let head = head.await.unwrap();
        assert_eq!(
            header(&head, "x-envoy-expected-rq-timeout-ms"),
            None,
            "{head}"
        );
        match own_timeout {
            None => {
                assert_eq!(header(&head, "service-budget"), None, "{head}");
                assert_eq!(header(&head, "grpc-timeout"), None, "{head}");
                assert_eq!(res.remaining(), None);
            }
            Some(_) => {
                let (grpc, rem) = told(&head);
                assert!(grpc <= SHORTER && rem <= SHORTER, "{head}");
                let budget = ServiceBudget::parse(header(&head, "service-budget").unwrap());
                let budget = budget.unwrap();
                assert_eq!((budget.priority(), budget.operation_id()), (None, None));
                assert!(res.remaining().unwrap() <= SHORTER);
            }
        }
    }
}
