//! The response body of [`Admit`](super::Admit).
//!
//! # How a tracked body lets go of its request
//!
//! A tracked body holds a unit of the request's scope, so that the scope's report waits for
//! it, and the handler's body holds what the handler gave it: a pool's connection, a permit, a
//! tethered resource. A server polls the body only when it can send more, so the body's own
//! poll cannot be what ends it at the scope's cancel: a client that stops reading would keep
//! the handler's body, its resources and the request's report for as long as its connection
//! lives. So the handler's body lives in a [`BodyStop`], which the body leaves as a waker in
//! the scope's cancel waiters, and the cancel (on whatever thread it happens) drops the
//! handler's body and gives the unit back through it, without waiting for a poll.
//!
//! 1. **Exactly once.** The handler's body and the unit sit in [`Held`]; they are ended by
//!    whoever takes them out under the lock (the cancel's waker, or the body: at its end, its
//!    drop, `into_inner`, or a poll that ends it after the cut), so never twice and, at the
//!    latest when the last holder of the [`BodyStop`] goes, always. The handler's body goes
//!    first, then the unit: it has stopped before it is counted stopped.
//! 2. **Never under a poll.** The server marks the body [`BUSY`] for the length of each poll
//!    and for its drop; the cancel marks it [`CUT`]. Both are read-modify-writes of one word,
//!    so one of them sees the other: a cancel that finds the body busy leaves the handler's
//!    body and the unit to the poll (or drop), which ends them when it is done; a poll that
//!    finds the body cut polls the handler's body no more. So the handler's body is never
//!    dropped while it is polled, the report (written once the request's scope is quiet)
//!    never comes while it is polled, and once a cut ended it, it is gone. (A poll that
//!    unwinds leaves the body busy: it ends with its drop.) A poll holds the lock of [`Held`]
//!    while it polls the handler's body: nobody else takes that lock then (the cancel takes it
//!    only when the body is not busy), so the handler's code under it waits for nobody, and a
//!    cancel it makes itself does not deadlock.
//! 3. **No grace period.** The grace period after a cancel is the time given to work that
//!    must notice the cancel and stop by itself. The body does nothing by itself: from the
//!    cancel on it is polled only to be ended, so it has stopped at the cancel (or at the end
//!    of the poll under way) and is ended then. Waiting longer would only keep a stalled
//!    client's resources, delay its report, and show as time the body ran on.
//!
//! The cut drops the handler's body on the thread that cancels (the deadline's timer, a
//! `cancel()`), with the request's scope current, inside the runtime the response was made on
//! if that thread is in none (a pool's connection goes back to its pool through a task).
//!
//! The cost on a body sent before any cancel: two allocations when it is tracked (the
//! [`BodyStop`], and the handler's body boxed in it: it must be pinned where the cancel can
//! reach it; the waker takes the scope's inline cancel-waiter slot, which the handler's `run`
//! has left), one lock at its first poll (to hand over the server's waker), one per poll (the
//! handler's body) and one at its end; each poll adds two uncontended read-modify-writes of the
//! state word.

use std::fmt;
use std::mem;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Wake, Waker};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::runtime::Handle;

use super::answer::Answers;
use super::finish::Reporter;
use crate::guard::Tethered;
use crate::panic::Caught;
use crate::scope::with_current;
use crate::sync::{AtomicU8, Mutex, Ordering};
use crate::telemetry;
use crate::wire::ServiceEffect;
use crate::{Cancelled, Cause, Error, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// [`BodyStop::state`]: the server is polling the body, or dropping it.
const BUSY: u8 = 1;
/// [`BodyStop::state`]: the request's scope was cancelled; the body ends at its next poll.
const CUT: u8 = 2;

/// A body still being sent: the request's scope bounds it and waits for it.
struct Streaming<B> {
    /// Keeps `stop` in the scope's cancel waiters; dropping it takes it out.
    _cancelled: Cancelled,
    stop: std::sync::Arc<BodyStop<B>>,
    /// The waker last handed to `stop`: a poll by the same task takes no lock for it.
    task: Option<Waker>,
    answers: Answers,
    /// Bytes still to send when the length is known (the body's exact size, or the response's
    /// `content-length`): a server stops after the last of them and drops the body without
    /// polling it to its end (hyper's HTTP/1 encoder does), so the body ends there.
    left: Option<u64>,
    /// The handler's body's size hint after its last poll (read without the lock).
    hint: SizeHint,
}

/// What a tracked body leaves in its request scope's cancel waiters (see the module docs):
/// woken by the cancel, it drops the handler's body and gives the body's unit back, unless the
/// server is using the body right then, and wakes the server's task so that it polls the body
/// and ends it.
struct BodyStop<B> {
    /// [`BUSY`] | [`CUT`]. Every change is a read-modify-write, `AcqRel`: a cancel that finds
    /// the body not busy ends it after the last poll's work (it acquires what that poll's
    /// `leave` released), and a poll that finds it cut acquires the cancel's write.
    state: AtomicU8,
    /// The request's scope.
    scope: Scope,
    /// The runtime the response was made on, for a cut on a thread outside any runtime.
    runtime: Option<Handle>,
    /// The server's task, woken at the cut; `None` until the first poll, and after the cut.
    task: Mutex<Option<Waker>>,
    held: Mutex<Held<B>>,
}

/// What a tracked body ends (invariant 1 of the module docs).
struct Held<B> {
    /// The handler's body. `None` once ended.
    body: Option<Pin<Box<B>>>,
    /// Keeps the request's scope from being quiet (and reported) until the body is done or
    /// cut. `None` from the start if the scope was cancelled or closed as the handler
    /// answered: the body is not waited for (and, cancelled, stops at once).
    /// With the request's telemetry report, made once the unit is given back (see
    /// `Reporter`).
    unit: Option<Tethered<Option<Reporter>>>,
}

impl<B> BodyStop<B> {
    /// Takes the handler's body and the unit out (invariant 1 of the module docs).
    fn take(&self) -> Held<B> {
        let empty = Held {
            body: None,
            unit: None,
        };
        mem::replace(&mut *self.held.lock(), empty)
    }

    /// Ends the body, if nobody did yet: drops the handler's body with the scope in `current`
    /// current, then gives the unit back. Takes the lock: once per body, never per poll. A
    /// panic of the handler's body's drop comes out once the unit went back.
    fn end(&self, current: &mut Option<Scope>) {
        let Held { body, unit } = self.take();
        // Dropped after the lock is released: the body's drop is the handler's code, and
        // giving the unit back may wake the report.
        let mut caught = Caught::default();
        if body.is_some() {
            caught.run(|| with_current(current, || drop(body)));
        }
        release(&self.scope, unit, &mut caught);
        caught.resume();
    }

    /// The server is done with the body for now (a poll returned): if the scope was cancelled
    /// meanwhile, the body ends now, as the cancel left it to this poll.
    fn leave(&self, current: &mut Option<Scope>) {
        if self.state.fetch_and(!BUSY, Ordering::AcqRel) & CUT != 0 {
            self.end(current);
        }
    }

    /// The cancel of the request's scope (this waker's one wake-up).
    fn cut(&self) {
        let was = self.state.fetch_or(CUT, Ordering::AcqRel);
        let task = self.task.lock().take();
        // Busy: the poll (or drop) under way ends the body when it is done. The server's task
        // is woken after the body ended, also if that panics (the handler's body's drop, or a
        // `quiesce()` waker of a scope the unit makes quiet): the server must still poll the
        // body to end the response. That panic comes out after.
        let mut caught = Caught::default();
        if was & BUSY == 0 {
            caught.run(|| {
                let outside = || Handle::try_current().is_err();
                let _runtime = self
                    .runtime
                    .as_ref()
                    .filter(|_| outside())
                    .map(Handle::enter);
                self.end(&mut Some(self.scope.clone()));
            });
        }
        if let Some(task) = task {
            task.wake();
        }
        caught.resume();
    }
}

impl<B> Wake for BodyStop<B> {
    fn wake(self: std::sync::Arc<Self>) {
        self.cut();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.cut();
    }
}

impl<B: Body + Send + 'static> Streaming<B> {
    /// Tracks `body`, the handler's body of the request admitted into `scope`.
    fn new(
        body: B,
        scope: &Scope,
        answers: Answers,
        left: Option<u64>,
        reporter: Option<Reporter>,
    ) -> Streaming<B> {
        let hint = body.size_hint();
        let stop = std::sync::Arc::new(BodyStop {
            state: AtomicU8::new(0),
            scope: scope.clone(),
            runtime: Handle::try_current().ok(),
            task: Mutex::new(None),
            held: Mutex::new(Held {
                body: Some(Box::pin(body)),
                unit: scope.tether(reporter).ok(),
            }),
        });
        let mut cancelled = scope.cancelled();
        let waker = Waker::from(stop.clone());
        if cancelled
            .poll_cancelled(&mut Context::from_waker(&waker))
            .is_ready()
        {
            // Cancelled since the unit was taken (or before): nothing waits for a poll.
            stop.cut();
        }
        Streaming {
            _cancelled: cancelled,
            stop,
            task: None,
            answers,
            left,
            hint,
        }
    }
}

impl<B> Streaming<B> {
    /// The server starts a poll of the body (its task wakes with `waker`): marks it busy and
    /// returns whether it is cut (the scope was cancelled: the body ends now).
    fn enter(&mut self, waker: &Waker) -> bool {
        if !self.task.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.task = Some(waker.clone());
            let old = self.stop.task.lock().replace(waker.clone());
            drop(old);
        }
        // The task is handed over before this: a cancel that this does not see finds it.
        self.mark_busy()
    }

    /// Marks the body busy (a cut from now on leaves the body to the caller) and returns
    /// whether it is cut, also by a cancel whose wake-up has not run yet: after the cancel
    /// nothing more is sent.
    fn mark_busy(&self) -> bool {
        let was = self.stop.state.fetch_or(BUSY, Ordering::AcqRel);
        was & CUT != 0 || self.stop.scope.is_cancelled()
    }
}

impl<B: Body> Streaming<B> {
    /// Polls the handler's body (the body is busy and not cut: nobody else takes the lock)
    /// with the scope in `current` current; also says whether the frame is its last.
    fn poll_handler(&mut self, current: &mut Option<Scope>, cx: &mut Context<'_>) -> Polled<B> {
        let mut held = self.stop.held.lock();
        let Some(body) = held.body.as_mut() else {
            return Poll::Ready((None, true));
        };
        let Poll::Ready(polled) = with_current(current, || body.as_mut().poll_frame(cx)) else {
            return Poll::Pending;
        };
        let last = is_last(&polled, &**body);
        self.hint = body.size_hint();
        Poll::Ready((polled, last))
    }
}

/// Gives back a tracked body's `unit` of `scope`, closing the scope first: it stayed open
/// while the body streamed (the handler's work for it could still start children), and the
/// body's end is the request's (a panic of a `quiesce()` waker goes to `caught`).
fn release(scope: &Scope, unit: Option<Tethered<Option<Reporter>>>, caught: &mut Caught) {
    if let Some(unit) = unit {
        caught.run(|| scope.close());
        // The unit first: then the request is quiet, if this was its last work, and the
        // report is made at once.
        let reporter = unit.into_inner();
        caught.run(|| drop(reporter));
    }
}

/// A poll of a handler's body `B`, and whether its frame is the last.
type Polled<B> = Poll<(
    Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>,
    bool,
)>;

/// Polls an untracked handler's `body` with the scope in `current` current.
fn poll_untracked<P: Body + ?Sized>(
    body: Pin<&mut P>,
    current: &mut Option<Scope>,
    cx: &mut Context<'_>,
) -> Polled<P> {
    let mut body = body;
    let Poll::Ready(polled) = with_current(current, || body.as_mut().poll_frame(cx)) else {
        return Poll::Pending;
    };
    let last = is_last(&polled, &*body);
    Poll::Ready((polled, last))
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // An answer the layer made: its text, until it is sent.
        Text { text: Option<Bytes> },
        // The handler's body, not tracked (a `HEAD` request, a status without a body, empty
        // or of length 0 when the handler answered).
        Plain { #[pin] body: B },
        // The handler's body, tracked: it lives in the stop, where the cut can end it.
        Tracked { streaming: Streaming<B> },
        // The handler's body, no longer tracked once all the bytes its length announced were
        // sent (it may still have trailers).
        Sent { body: Pin<Box<B>> },
        // Ended: the handler's body is gone.
        Done,
    }
}

pin_project! {
    /// The response body of a request admitted by [`Admit`](super::Admit): the handler's
    /// body, bounded by the request's scope, or the text of an answer the layer made itself.
    ///
    /// The request's scope is closed when the handler returns the response head, and its
    /// report waits for the body as well as for the work the handler left running:
    /// * when the scope's deadline passes (or the scope is cancelled) before the body is
    ///   sent, the handler's body is dropped at once and the body stops: a gRPC body ends
    ///   with `grpc-status` trailers (`DEADLINE_EXCEEDED` for the deadline), any other body
    ///   with an [`Error`], on which the server aborts the response (the client sees a cut
    ///   body, never a short one that looks complete);
    /// * dropped before its end (the server drops it when the client goes away), it cancels
    ///   the scope with [`Cause::ClientGone`];
    /// * read to its end (its last frame, trailers, or an error of its own), it lets the
    ///   scope become quiet.
    ///
    /// The handler's body is its code too: it is polled and dropped with the request's scope
    /// as [`Scope::current`] (so `Scope::current()` in a stream does not panic, and a call
    /// made there is bounded by the request: the scope is closed by then, so new work there
    /// is refused, as for the handler's tasks, rather than sent with no budget at all).
    ///
    /// A body that is empty when the handler answers, one of a known length once that many
    /// bytes are sent, the body of a `HEAD` request or of a status without a body (1xx, 204,
    /// 304) and the bodies of the layer's own answers are not tracked. Frames are passed on as
    /// [`Bytes`] (axum, tonic and hyper bodies send `Bytes` already; other data is copied).
    ///
    /// The scope's cancel ends the body without waiting for the server to poll it: a client
    /// that stops reading (so that the server cannot send, and does not poll) keeps neither
    /// the handler's body nor the request. At the cancel the handler's body is dropped, on
    /// the thread that cancels (the deadline's timer, a `cancel()`), so that what it holds —
    /// a pool's connection, a semaphore permit, a [`Tethered`] resource of the
    /// scope — goes back then, and the report comes as soon as the rest of the request's work
    /// is done. The report gives the scope's cause (`DeadlineExceeded` at the deadline), not
    /// `ClientGone`: a server cannot tell a slow client from a gone one, and the connection
    /// going later changes nothing (the first cause wins, and a report is final). There is no
    /// grace period for the body: from the cancel on it is polled only to be ended, so it has
    /// stopped. A poll under way when the cancel comes is waited for: the handler's body is
    /// never dropped while it is polled, the report never comes while it is polled, and it is
    /// never polled again after the cut. Whenever the server polls the body next (when the
    /// client reads again), the body ends as above. (A poll of the handler's body that
    /// panicked leaves it to the response's drop.)
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use cancel_scope::integrations::tower::admit::ResponseBody;
    /// let body: ResponseBody<String> = ResponseBody::empty();
    /// assert!(body.is_end_stream());
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // The request's scope, current while the handler's body is polled or dropped (it is
        // the handler's code, as its future was); `None` for a body the layer made.
        scope: Option<Scope>,
        // The request's span, for a gRPC answer whose status comes in the trailers.
        span: Option<telemetry::Request>,
    }

    impl<B> PinnedDrop for ResponseBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            // Still tracked: not sent to its end (every poll that ends it, and a body found
            // ended after a frame, stops the tracking). The client went away, or the handler's
            // body panicked in a poll (which left the body busy), unless the scope's cancel
            // came first (the first cause wins: a deadline that fired stays the cause).
            if let KindProj::Tracked { streaming } = this.kind.as_mut().project() {
                // Busy: the cancel below (or one racing with this drop) leaves the body to
                // this drop (invariant 2 of the module docs).
                let was = streaming.stop.state.fetch_or(BUSY, Ordering::AcqRel);
                // A panic of the cancel (a waker or `on_cancel` callback of the request's)
                // comes out after the body ended.
                let mut caught = Caught::default();
                if was & CUT == 0 {
                    caught.run(|| {
                        streaming.stop.scope.cancel_because(if was & BUSY != 0 {
                            Cause::cancelled(super::finish::HANDLER_PANICKED)
                        } else {
                            Cause::ClientGone
                        });
                    });
                }
                streaming.stop.end(this.scope);
                caught.resume();
            }
            with_current(this.scope, || this.kind.set(Kind::Done));
        }
    }
}

impl<B> ResponseBody<B> {
    /// Records the `grpc-status` of the trailers this body ends with on `span`, the request's
    /// (a gRPC answer whose head had no status).
    pub(super) fn record_trailers(&mut self, span: telemetry::Request) {
        self.span = Some(span);
    }

    /// Whether the body is tracked (its request's scope waits for it, and closes at its end).
    pub(super) fn is_tracked(&self) -> bool {
        matches!(self.kind, Kind::Tracked { .. })
    }

    /// A body with nothing in it.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use cancel_scope::integrations::tower::admit::ResponseBody;
    /// assert_eq!(ResponseBody::<String>::empty().size_hint().exact(), Some(0));
    /// ```
    pub fn empty() -> Self {
        ResponseBody {
            kind: Kind::Done,
            scope: None,
            span: None,
        }
    }

    /// A body of the layer's own (a refusal's text).
    pub(super) fn text(text: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Text { text: Some(text) },
            scope: None,
            span: None,
        }
    }

    /// The handler's `body` for a request admitted into `scope`, tracked unless `track` is
    /// false (a `HEAD` request, or a status without a body) or it is empty already. `length`:
    /// the response's `content-length`, if any.
    pub(super) fn admitted(
        body: B,
        scope: &Scope,
        answers: Answers,
        track: bool,
        length: Option<u64>,
        reporter: &mut Option<Reporter>,
    ) -> Self
    where
        B: Body + Send + 'static,
    {
        let left = body.size_hint().exact().or(length);
        let kind = if track && !body.is_end_stream() && left != Some(0) {
            Kind::Tracked {
                streaming: Streaming::new(body, scope, answers, left, reporter.take()),
            }
        } else {
            Kind::Plain { body }
        };
        ResponseBody {
            kind,
            scope: Some(scope.clone()),
            span: None,
        }
    }
}

impl<B: Unpin> ResponseBody<B> {
    /// The handler's body, taken out of the layer's hands: the request's scope stops waiting
    /// for it and no longer bounds it. `None` for a body the layer made, or one that was read
    /// to its end or stopped (also by the request's cancel or deadline that no poll has seen
    /// yet: it is dropped here, as its scope's report counted it stopped).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::tower::admit::ResponseBody;
    /// assert_eq!(ResponseBody::<String>::empty().into_inner(), None);
    /// ```
    pub fn into_inner(mut self) -> Option<B> {
        match mem::replace(&mut self.kind, Kind::Done) {
            Kind::Plain { body } => Some(body),
            Kind::Sent { body } => Some(*Pin::into_inner(body)),
            Kind::Tracked { streaming } => {
                // Busy: a cut from now on leaves the body here (invariant 2 of the module docs).
                if streaming.mark_busy() {
                    // Stopped: the body goes first, then the unit.
                    streaming.stop.end(&mut self.scope);
                    return None;
                }
                let Held { body, unit } = streaming.stop.take();
                let mut caught = Caught::default();
                release(&streaming.stop.scope, unit, &mut caught);
                caught.resume();
                body.map(|b| *Pin::into_inner(b))
            }
            Kind::Text { .. } | Kind::Done => None,
        }
    }
}

/// Whether a frame polled from `body` is its last: its end, an error, trailers, or a frame
/// after which the body says it has ended (and may never be polled again).
fn is_last<B: Body + ?Sized>(polled: &Option<Result<Frame<B::Data>, B::Error>>, body: &B) -> bool {
    match polled {
        None | Some(Err(_)) => true,
        Some(Ok(frame)) => frame.is_trailers() || body.is_end_stream(),
    }
}

/// A frame of the handler's body as this body sends it.
fn pass_on<D: Buf, E: Into<BoxError>>(
    polled: Option<Result<Frame<D>, E>>,
) -> Option<Result<Frame<Bytes>, BoxError>> {
    polled.map(|r| {
        r.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
            .map_err(Into::into)
    })
}

impl<B> ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// The next frame to send (see `poll_frame`).
    fn poll_body(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let (polled, last) = match this.kind.as_mut().project() {
            KindProj::Done => return Poll::Ready(None),
            KindProj::Text { text } => {
                return Poll::Ready(text.take().map(|t| Ok(Frame::data(t))));
            }
            KindProj::Plain { body } => ready!(poll_untracked(body, this.scope, cx)),
            KindProj::Sent { body } => ready!(poll_untracked(body.as_mut(), this.scope, cx)),
            KindProj::Tracked { streaming: s } => {
                // The scope first: after its cancel nothing more is sent.
                if s.enter(cx.waker()) {
                    let answers = s.answers;
                    let scope = &s.stop.scope;
                    // The cancel first: the flag is read once it reached the whole request.
                    let effect = answers
                        .grpc
                        .then(|| ServiceEffect::from_dispatched(scope.cancel_then_effect()));
                    let cause = scope.cause_or_cancelled();
                    // Ended by the cut already, unless it found this body busy.
                    s.stop.end(this.scope);
                    this.kind.set(Kind::Done);
                    return Poll::Ready(Some(if let Some(effect) = effect {
                        Ok(Frame::trailers(answers.cut_trailers(&cause, effect)))
                    } else {
                        Err(Box::new(Error::cancelled(cause)))
                    }));
                }
                // Marked busy until the end of this poll.
                let Poll::Ready((polled, last)) = s.poll_handler(this.scope, cx) else {
                    s.stop.leave(this.scope);
                    return Poll::Pending;
                };
                if last {
                    s.stop.end(this.scope);
                    this.kind.set(Kind::Done);
                    return Poll::Ready(pass_on(polled));
                }
                // All the bytes its length announced are sent: the server may drop the body
                // now without polling it again, and that is no client going away. (Kept: it
                // may still have trailers to send.)
                let sent_all = match (s.left.as_mut(), &polled) {
                    (Some(left), Some(Ok(frame))) => {
                        let sent = frame.data_ref().map_or(0, |d| d.remaining() as u64);
                        *left = left.saturating_sub(sent);
                        *left == 0
                    }
                    _ => false,
                };
                if sent_all {
                    let Held { body, unit } = s.stop.take();
                    let mut caught = Caught::default();
                    release(&s.stop.scope, unit, &mut caught);
                    caught.resume();
                    match body {
                        Some(body) => this.kind.set(Kind::Sent { body }),
                        None => this.kind.set(Kind::Done),
                    }
                } else {
                    // A cut that came during this poll ends the body here; the next poll
                    // ends the response.
                    s.stop.leave(this.scope);
                }
                return Poll::Ready(pass_on(polled));
            }
        };
        // An untracked handler's body, dropped at its end with the scope current.
        if last {
            with_current(this.scope, || this.kind.set(Kind::Done));
        }
        Poll::Ready(pass_on(polled))
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = ready!(self.as_mut().poll_body(cx));
        if let Some(trailers) = polled
            .as_ref()
            .and_then(|f| f.as_ref().ok()?.trailers_ref())
        {
            let this = self.project();
            if let Some(span) = this.span.take() {
                let deadline = this
                    .scope
                    .as_ref()
                    .and_then(Scope::cause)
                    .is_some_and(|c| c.origin().is_deadline_exceeded());
                span.trailers(trailers, deadline);
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Done => true,
            Kind::Text { text } => text.is_none(),
            Kind::Plain { body } => body.is_end_stream(),
            Kind::Sent { body } => body.is_end_stream(),
            // A tracked body that says it has ended is ended and no longer tracked; a cut one
            // must not look complete before its end is sent.
            Kind::Tracked { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Done => SizeHint::with_exact(0),
            Kind::Text { text } => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
            Kind::Plain { body } => body.size_hint(),
            Kind::Sent { body } => body.size_hint(),
            // `SizeHint` is `Copy` only from http-body 1.1 on; this crate accepts any 1.x.
            #[allow(clippy::clone_on_copy)]
            Kind::Tracked { streaming } => streaming.hint.clone(),
        }
    }
}

impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        ResponseBody::empty()
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Text { .. } => "text",
            Kind::Plain { .. } | Kind::Sent { .. } => "untracked",
            Kind::Tracked { .. } => "tracked",
            Kind::Done => "done",
        };
        f.debug_struct("ResponseBody")
            .field("state", &state)
            .finish()
    }
}

#[cfg(all(test, loom))]
mod loom_cut;
