//! Real loopback servers for the tower tests: serving an axum app, the bounds of tests on the
//! real clock, and a guard that tells when a server dropped what held it (the UTF-8 codec of
//! hand-written tonic services is in `grpc.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Buf;
use cancel_scope::wire::Admission;
use cancel_scope::Report;
use tokio::sync::oneshot;

use super::tower::{next_report_within, Reports};

/// How long a test on the real clock waits for what must come (a failure bound only: the wait
/// ends as soon as it comes).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The budget of a request whose response head and first frames must reach the client before
/// its deadline, which then cuts the body: long enough for a loopback request and answer on a
/// loaded machine (with 300 ms, the deadline there came first now and then, with no bug
/// behind it); sent as `grpc-timeout: 2S`.
pub const CUT_AFTER: Duration = Duration::from_secs(2);

/// Serves `app` on a loopback port of its own, on a task of the current runtime.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The next report of a server, or a failure if none comes within [`PATIENCE`].
pub async fn next_report(reports: &mut Reports) -> (Admission, Report) {
    next_report_within(reports, PATIENCE).await
}

/// A hop's scoped `GET` of the next hop at `url` (from the current scope), its body as text;
/// a call that fails or is not answered 2xx is the hop's 502.
pub async fn call_next(
    client: &reqwest::Client,
    url: &str,
) -> Result<String, axum::http::StatusCode> {
    use cancel_scope::integrations::reqwest::RequestBuilderExt as _;
    let bad_gateway = |_| axum::http::StatusCode::BAD_GATEWAY;
    let res = client.get(url).send_scoped().await.map_err(bad_gateway)?;
    if !res.status().is_success() {
        return Err(axum::http::StatusCode::BAD_GATEWAY);
    }
    res.text().await.map_err(bad_gateway)
}

/// Sends on its drop: the server dropped the response body it was in.
pub struct OnDrop(pub Option<oneshot::Sender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Reads a response body to its end (its receipt is recorded there).
pub async fn read_body<B>(body: B) -> Result<Vec<u8>, B::Error>
where
    B: http_body::Body,
    B::Data: Buf,
{
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(mut data) = frame?.into_data() {
            while data.has_remaining() {
                let chunk = data.chunk();
                out.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(out)
}
