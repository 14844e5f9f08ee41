//! Requests that run on, for a bounded time, after their client goes away.
//!
//! A server drops a request's response future when its client disconnects (or resets the
//! HTTP/2 stream), and [`Admit`](super::Admit) cancels the request with
//! [`Cause::ClientGone`](crate::Cause::ClientGone): the default, right for reads, whose answer
//! nobody will read. Some endpoints would rather finish what they started — an upload being
//! committed, a write whose client timed out a moment early, a cache fill others will read —
//! without letting a flood of abandoned requests run to their full budget. [`DetachLayer`],
//! put on such an endpoint *outside* [`AdmitLayer`](super::AdmitLayer), runs each request on
//! a task of its own:
//!
//! 1. While the client waits, the request runs as without the layer, and its answer goes to
//!    the client.
//! 2. When the client goes away first, the request goes on running for at most the layer's
//!    bound from that moment, and never past its own deadline (the budget only shrinks).
//! 3. If it answers within the bound, its response body is read to its end and discarded, so
//!    that work streaming the body finishes and the request's scope closes; its report is that
//!    of a request that answered.
//! 4. At the bound, the request is dropped as the server would have dropped it: `Admit`
//!    cancels it with `ClientGone`, and what it holds goes back.
//!
//! The cost is one task and one channel per request, on the endpoints that ask for it.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower_layer::Layer;
use tower_service::Service;

/// A layer that lets the requests of an endpoint run on for a bounded time after their client
/// goes away, instead of being cancelled at once (see [the module](self)). Put it outside
/// [`AdmitLayer`](super::AdmitLayer): what it keeps running is the admitted request.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::integrations::tower::{AdmitLayer, DetachLayer};
/// use cancel_scope::wire::EndpointPolicy;
/// use tower_layer::{Layer, Stack};
///
/// let policy = EndpointPolicy::builder(Duration::from_secs(5))
///     .default_budget(Duration::from_secs(2))
///     .build();
/// // An upload's commit runs on for up to 2 s after its client leaves: the detach layer
/// // outside, admission inside (with axum: `.route_layer(..)` on the upload's route).
/// let layers = Stack::new(AdmitLayer::new(policy), DetachLayer::new(Duration::from_secs(2)));
/// # let _ = layers;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct DetachLayer {
    bound: Duration,
}

impl DetachLayer {
    /// A layer whose requests run on for at most `bound` after their client goes away.
    ///
    /// # Examples
    ///
    /// See [`DetachLayer`].
    pub const fn new(bound: Duration) -> Self {
        DetachLayer { bound }
    }

    /// How long a request runs on after its client goes away, at most.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::integrations::tower::DetachLayer;
    /// assert_eq!(DetachLayer::new(Duration::from_secs(2)).bound(), Duration::from_secs(2));
    /// ```
    pub const fn bound(&self) -> Duration {
        self.bound
    }
}

impl<S> Layer<S> for DetachLayer {
    type Service = Detach<S>;

    fn layer(&self, inner: S) -> Detach<S> {
        Detach {
            inner,
            bound: self.bound,
        }
    }
}

/// The service of [`DetachLayer`].
///
/// # Examples
///
/// See [`DetachLayer`].
#[derive(Clone, Debug)]
pub struct Detach<S> {
    inner: S,
    bound: Duration,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Detach<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResB: Body + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Detached<Response<ResB>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    /// # Panics
    ///
    /// Outside a tokio runtime (the request runs on a task of its own).
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (gone, left) = oneshot::channel();
        let task = tokio::spawn(run_on(self.inner.call(req), left, self.bound));
        Detached {
            task,
            gone: Some(gone),
        }
    }
}

/// The request's future on its task: its answer for the client while the client waits;
/// once the client is gone, at most `bound` more of it (its body read and discarded).
async fn run_on<F, B, E>(
    request: F,
    left: oneshot::Receiver<()>,
    bound: Duration,
) -> Option<Result<Response<B>, E>>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    let mut request = pin!(request);
    tokio::select! {
        biased;
        out = &mut request => return Some(out),
        // `Err`: the client's future was forgotten, not dropped; it is gone all the same.
        _ = left => {}
    }
    let mut bounded = pin!(tokio::time::sleep(bound));
    tokio::select! {
        biased;
        out = &mut request => {
            if let Ok(response) = out {
                tokio::select! {
                    biased;
                    () = drain(response.into_body()) => {}
                    () = &mut bounded => {}
                }
            }
        }
        // Dropped below, as the server would have dropped it: the request is cancelled.
        () = &mut bounded => {}
    }
    None
}

/// Reads `body` to its end (or its first error), discarding it.
async fn drain<B: Body>(body: B) {
    let mut body = pin!(body);
    while let Some(Ok(_)) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {}
}

/// The response future of [`Detach`]: the request's answer, from the task it runs on.
///
/// # Cancel safety
///
/// Dropping it is how a server says the client went away: the request runs on for at most
/// the layer's bound (see [the module](self)).
///
/// # Panics
///
/// A panic of the request's future (which [`Admit`](super::Admit) turns into an answer for a
/// handler's panic) comes out of this future; so does the runtime's shutdown while the
/// request runs.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Detached<R, E> {
    task: JoinHandle<Option<Result<R, E>>>,
    gone: Option<oneshot::Sender<()>>,
}

impl<R, E> Future for Detached<R, E> {
    type Output = Result<R, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = ready!(Pin::new(&mut self.task).poll(cx));
        self.gone = None;
        match out {
            Ok(Some(out)) => Poll::Ready(out),
            Ok(None) => unreachable!("a request runs on only once its client is gone"),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => panic!("the runtime shut down while a request ran"),
        }
    }
}

impl<R, E> Drop for Detached<R, E> {
    fn drop(&mut self) {
        if let Some(gone) = self.gone.take() {
            // Fails when the request has answered already: its answer is dropped with the task's
            // output, as without the layer.
            let _ = gone.send(());
        }
    }
}
