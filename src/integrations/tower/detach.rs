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
        let (answer, answered) = oneshot::channel();
        let (gone, left) = oneshot::channel();
        let run = run_on(self.inner.call(req), answer, left, self.bound);
        // The request's span (tower-http's, tonic's) stays the parent of what it records.
        #[cfg(feature = "tracing")]
        let run = tracing::Instrument::in_current_span(run);
        Detached {
            task: tokio::spawn(run),
            answered,
            gone: Some(gone),
        }
    }
}

/// What the client's future hands back when it is dropped: the answer, if it had arrived but
/// was not taken yet.
type Left<R, E> = oneshot::Receiver<Option<Result<R, E>>>;

/// The request's future on its task: its answer goes to the client while the client waits;
/// once the client is gone, at most `bound` more of it, its answer's body read and discarded.
async fn run_on<F, B, E>(
    request: F,
    answer: oneshot::Sender<Result<Response<B>, E>>,
    left: Left<Response<B>, E>,
    bound: Duration,
) where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    let mut request = pin!(request);
    let mut left = pin!(left);
    let then = tokio::select! {
        biased;
        out = &mut request => match answer.send(out) {
            // The client takes it, or goes first and hands it back unread.
            Ok(()) => match left.await {
                Ok(Some(unread)) => Then::Drain(unread),
                _ => return,
            },
            // The client went while the request ran, as it answered.
            Err(out) => Then::Drain(out),
        },
        // The client went while the request ran (its future, dropped, sends `None`; one that
        // is forgotten sends nothing, and its request runs to its own deadline).
        _ = &mut left => Then::RunOn,
    };
    let mut bounded = pin!(tokio::time::sleep(bound));
    let out = match then {
        Then::Drain(out) => out,
        Then::RunOn => tokio::select! {
            biased;
            // First, so that a request that is always ready cannot keep the bound from firing.
            () = &mut bounded => return, // the request is dropped: `Admit` cancels it
            out = &mut request => out,
        },
    };
    if let Ok(response) = out {
        tokio::select! {
            biased;
            () = &mut bounded => {}
            () = drain(response.into_body()) => {}
        }
    }
}

/// What the request's task does once the client is gone.
enum Then<O> {
    /// Reads the body of this answer, within the bound.
    Drain(O),
    /// Runs the request on, within the bound.
    RunOn,
}

/// Reads `body` to its end (or its first error), discarding it; a body that is always ready
/// yields to the runtime as tokio's own resources do, so that the bound beside it fires.
async fn drain<B: Body>(body: B) {
    let mut body = pin!(body);
    // The frame is dropped before the yield: the task holds no body data across it.
    while matches!(
        poll_fn(|cx| body.as_mut().poll_frame(cx)).await,
        Some(Ok(_))
    ) {
        tokio::task::consume_budget().await;
    }
}

/// The response future of [`Detach`]: the request's answer, from the task it runs on.
///
/// # Cancel safety
///
/// Dropping it is how a server says the client went away: the request runs on for at most
/// the layer's bound (see [the module](self)); an answer that had arrived but was not taken
/// yet has its body read within the bound.
///
/// # Panics
///
/// A panic of the request's future (which [`Admit`](super::Admit) turns into an answer for a
/// handler's panic) comes out of this future, and so does the runtime's shutdown while the
/// request runs. Once the client is gone, such a panic ends the request's task (tokio reports
/// it there).
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Detached<R, E> {
    task: JoinHandle<()>,
    answered: oneshot::Receiver<Result<R, E>>,
    gone: Option<oneshot::Sender<Option<Result<R, E>>>>,
}

impl<R, E> Future for Detached<R, E> {
    type Output = Result<R, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Ok(out) = ready!(Pin::new(&mut self.answered).poll(cx)) {
            // Taken: the task ends.
            self.gone = None;
            return Poll::Ready(out);
        }
        // The task ended without an answer: it panicked, or its runtime shut down.
        match ready!(Pin::new(&mut self.task).poll(cx)) {
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            _ => panic!("the runtime shut down while a request ran"),
        }
    }
}

impl<R, E> Drop for Detached<R, E> {
    fn drop(&mut self) {
        if let Some(gone) = self.gone.take() {
            // An answer that arrived but was not taken goes back, for its body to be read.
            let _ = gone.send(self.answered.try_recv().ok());
        }
    }
}
