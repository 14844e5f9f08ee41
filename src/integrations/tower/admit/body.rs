//! The response body of [`Admit`](super::Admit).
//!
//! # How a tracked body lets go of its request
//!
//! A tracked body holds a unit of the request's scope, so that the scope's report waits for
//! it. A server polls the body only when it can send more, so the body's own poll cannot be
//! what gives the unit back at the scope's cancel: a client that stops reading would keep the
//! request busy, and its report unsent, for as long as its connection lives. So the body
//! leaves a waker, [`BodyStop`], in the scope's cancel waiters, and the cancel (on whatever
//! thread it happens) gives the unit back through it, without waiting for a poll.
//!
//! 1. **Exactly once.** The unit sits in [`Held::unit`]; it is given back by whoever takes it
//!    out under the lock (the cancel's waker, or the body: at its end, its drop,
//!    `into_inner`, or a poll that ends it after the cut), so never twice and, at the latest
//!    when the last holder of the [`BodyStop`] goes, always.
//! 2. **Never under a poll.** The server marks the body [`BUSY`] for the length of each poll
//!    and for its drop; the cancel marks it [`CUT`]. Both are read-modify-writes of one word,
//!    so one of them sees the other: a cancel that finds the body busy leaves the unit to the
//!    poll (or drop), which gives it back when it is done; a poll that finds the body cut
//!    polls the handler's body no more. So the report (written once the request's scope is
//!    quiet) never comes while the handler's body is being polled, and once a cut gave the
//!    unit back the handler's body is never polled again. (A poll that unwinds leaves the
//!    body busy: its unit then goes back with its drop.)
//! 3. **No grace period.** The grace period after a cancel is the time given to work that
//!    must notice the cancel and stop by itself. The body does nothing by itself: from the
//!    cancel on it is polled only to be ended, so it has stopped at the cancel (or at the end
//!    of the poll under way) and its unit goes back then. Waiting longer would only delay the
//!    report of a stalled client, and show as time the body ran on.
//!
//! The cost on a body sent before any cancel: one allocation when it is tracked (the
//! [`BodyStop`]; its waker takes the scope's inline cancel-waiter slot, which the handler's
//! `run` has left), one lock at its first poll (to hand over the server's waker) and one at
//! its end; each poll adds two uncontended read-modify-writes of the state word.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::answer::Answers;
use crate::guard::Tethered;
use crate::scope::with_current;
use crate::sync::{AtomicU8, Mutex, Ordering};
use crate::tree::Caught;
use crate::{Cancelled, Cause, Error, Scope};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// [`BodyStop::state`]: the server is polling the body, or dropping it.
const BUSY: u8 = 1;
/// [`BodyStop::state`]: the request's scope was cancelled; the body ends at its next poll.
const CUT: u8 = 2;

/// A body still being sent: the request's scope bounds it and waits for it.
struct Streaming {
    scope: Scope,
    /// Keeps `stop` in the scope's cancel waiters; dropping it takes it out.
    _cancelled: Cancelled,
    stop: std::sync::Arc<BodyStop>,
    /// The waker last handed to `stop`: a poll by the same task takes no lock.
    task: Option<Waker>,
    answers: Answers,
    /// Bytes still to send when the length is known (the body's exact size, or the response's
    /// `content-length`): a server stops after the last of them and drops the body without
    /// polling it to its end (hyper's HTTP/1 encoder does), so the body ends there.
    left: Option<u64>,
}

/// What a tracked body leaves in its request scope's cancel waiters (see the module docs):
/// woken by the cancel, it gives the body's unit back, unless the server is using the body
/// right then, and wakes the server's task so that it polls the body and ends it.
struct BodyStop {
    /// [`BUSY`] | [`CUT`]. Every change is a read-modify-write, `AcqRel`: a cancel that finds
    /// the body not busy gives the unit back after the last poll's work (it acquires what that
    /// poll's `leave` released), and a poll that finds it cut acquires the cancel's write.
    state: AtomicU8,
    held: Mutex<Held>,
}

struct Held {
    /// Keeps the request's scope from being quiet (and reported) until the body is done or
    /// cut; whoever takes it out gives it back (invariant 1 of the module docs). `None` from
    /// the start if the scope was cancelled or closed as the handler answered: the body is not
    /// waited for (and, cancelled, stops at once).
    unit: Option<Tethered<()>>,
    /// The server's task, woken at the cut; `None` until the first poll, and after the cut.
    task: Option<Waker>,
}

impl BodyStop {
    /// Gives the body's unit back, if nobody did yet. Takes the lock: called once per body,
    /// never per poll.
    fn give_back(&self) {
        let unit = self.held.lock().unit.take();
        // Dropped after the lock is released: giving the unit back may wake the report.
        drop(unit);
    }

    /// The server is done with the body for now (a poll returned): if the scope was cancelled
    /// meanwhile, its unit goes back now, as the cancel left it to this poll.
    fn leave(&self) {
        if self.state.fetch_and(!BUSY, Ordering::AcqRel) & CUT != 0 {
            self.give_back();
        }
    }

    /// The cancel of the request's scope (this waker's one wake-up).
    fn cut(&self) {
        let was = self.state.fetch_or(CUT, Ordering::AcqRel);
        let mut held = self.held.lock();
        // Busy: the poll (or drop) under way gives the unit back when it is done.
        let unit = if was & BUSY == 0 {
            held.unit.take()
        } else {
            None
        };
        let task = held.task.take();
        drop(held);
        // The server's task is woken after the unit went back, also if giving it back
        // panics (a `quiesce()` waker of a scope it makes quiet): the server must still poll
        // the body to end it. That panic comes out after.
        let mut caught = Caught::default();
        caught.run(move || drop(unit));
        if let Some(task) = task {
            task.wake();
        }
        caught.resume();
    }
}

impl Wake for BodyStop {
    fn wake(self: std::sync::Arc<Self>) {
        self.cut();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.cut();
    }
}

impl Streaming {
    /// Tracks a body of the request admitted into `scope`.
    fn new(scope: &Scope, answers: Answers, left: Option<u64>) -> Streaming {
        let stop = std::sync::Arc::new(BodyStop {
            state: AtomicU8::new(0),
            held: Mutex::new(Held {
                unit: scope.tether(()).ok(),
                task: None,
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
            scope: scope.clone(),
            _cancelled: cancelled,
            stop,
            task: None,
            answers,
            left,
        }
    }

    /// The server starts a poll of the body (its task wakes with `waker`): marks it busy and
    /// returns whether it is cut (the scope was cancelled: the body ends now).
    fn enter(&mut self, waker: &Waker) -> bool {
        if !self.task.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.task = Some(waker.clone());
            let old = self.stop.held.lock().task.replace(waker.clone());
            drop(old);
        }
        // The task is handed over before this: a cancel that this does not see finds it.
        self.mark_busy()
    }

    /// Marks the body busy (a cut from now on leaves the unit to the caller) and returns
    /// whether it is cut, also by a cancel whose wake-up has not run yet: after the cancel
    /// nothing more is sent.
    fn mark_busy(&self) -> bool {
        let was = self.stop.state.fetch_or(BUSY, Ordering::AcqRel);
        was & CUT != 0 || self.scope.is_cancelled()
    }
}

pin_project! {
    /// The response body of a request admitted by [`Admit`](super::Admit): the handler's
    /// body, bounded by the request's scope, or the text of an answer the layer made itself.
    ///
    /// The request's scope is closed when the handler returns the response head, and its
    /// report waits for the body as well as for the work the handler left running:
    /// * when the scope's deadline passes (or the scope is cancelled) before the body is
    ///   sent, the body stops: a gRPC body ends with `grpc-status` trailers
    ///   (`DEADLINE_EXCEEDED` for the deadline), any other body with an [`Error`], on which
    ///   the server aborts the response (the client sees a cut body, never a short one that
    ///   looks complete);
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
    /// The scope stops waiting for the body at its cancel, without waiting for the server to
    /// poll the body: a client that stops reading (so that the server cannot send, and does
    /// not poll) does not keep the request busy. The report then comes as soon as the rest of
    /// the request's work is done; it gives the scope's cause (`DeadlineExceeded` at the
    /// deadline), not `ClientGone`: a server cannot tell a slow client from a gone one, and
    /// the connection going later changes nothing (the first cause wins, and a report is
    /// final). There is no grace period for the body: from the cancel on it is polled only to
    /// be ended, so it has stopped. A poll under way when the cancel comes is waited for: the
    /// report never comes while the handler's body is polled, and once the scope stopped
    /// waiting the handler's body is never polled again. Whenever the server polls the body
    /// next (when the client reads again), the body ends as above; if it never does, the
    /// handler's body is dropped with the response, when the connection goes. So the report
    /// does not wait for that drop: a handler's body that holds work of the request's scope
    /// itself (a [`Tethered`](crate::Tethered) resource, a task's handle) keeps the scope busy
    /// until it is dropped.
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
        inner: Option<B>,
        // The text of an answer the layer made, until it is sent.
        text: Option<Bytes>,
        streaming: Option<Streaming>,
        // The request's scope, current while the handler's body is polled or dropped (it is
        // the handler's code, as its future was); `None` for a body the layer made.
        scope: Option<Scope>,
    }

    impl<B> PinnedDrop for ResponseBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            // Still tracked: not sent to its end (every poll that ends it, and a body found
            // ended after a frame, stops the tracking). The client went away, or the handler's
            // body panicked in a poll (which left the body busy), unless the scope's cancel
            // came first (the first cause wins: a deadline that fired stays the cause).
            if let Some(streaming) = this.streaming.take() {
                // Busy: the cancel below (or one racing with this drop) leaves the unit to
                // this drop (invariant 2 of the module docs).
                let was = streaming.stop.state.fetch_or(BUSY, Ordering::AcqRel);
                // A panic of the cancel (a waker or `on_cancel` callback of the request's)
                // comes out after the rest: unwinding from here would drop `streaming`, and
                // so give the unit back, before the handler's body.
                let mut caught = Caught::default();
                if was & CUT == 0 {
                    caught.run(|| {
                        streaming.scope.cancel_because(if was & BUSY != 0 {
                            Cause::cancelled(super::future::HANDLER_PANICKED)
                        } else {
                            Cause::ClientGone
                        });
                    });
                }
                // The body goes first, then the unit (stopped before it is counted).
                with_current(this.scope, || this.inner.set(None));
                streaming.stop.give_back();
                drop(streaming);
                caught.resume();
            } else if this.inner.is_some() {
                with_current(this.scope, || this.inner.set(None));
            }
        }
    }
}

impl<B> ResponseBody<B> {
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
            inner: None,
            text: None,
            streaming: None,
            scope: None,
        }
    }

    /// A body of the layer's own (a refusal's text).
    pub(super) fn text(text: Bytes) -> Self {
        ResponseBody {
            inner: None,
            text: Some(text),
            streaming: None,
            scope: None,
        }
    }

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
        if let Some(streaming) = self.streaming.take() {
            // Busy: a cut from now on leaves the unit here (invariant 2 of the module docs).
            if streaming.mark_busy() {
                // Stopped: the body goes first, then the unit (stopped before it is counted).
                let inner = self.inner.take();
                with_current(&mut self.scope, || drop(inner));
                streaming.stop.give_back();
                return None;
            }
            streaming.stop.give_back();
        }
        self.inner.take()
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
    ) -> Self
    where
        B: Body,
    {
        let left = body.size_hint().exact().or(length);
        let streaming = (track && !body.is_end_stream() && left != Some(0))
            .then(|| Streaming::new(scope, answers, left));
        ResponseBody {
            inner: Some(body),
            text: None,
            streaming,
            scope: Some(scope.clone()),
        }
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
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if let Some(text) = this.text.take() {
            return Poll::Ready(Some(Ok(Frame::data(text))));
        }
        if let Some(s) = this.streaming.as_mut() {
            // The scope first: after its cancel nothing more is sent.
            if s.enter(cx.waker()) {
                let cause = s.scope.cause_or_cancelled();
                let answers = s.answers;
                with_current(this.scope, || this.inner.set(None));
                // Given back by the cut already, unless it found this body busy.
                s.stop.give_back();
                *this.streaming = None;
                return Poll::Ready(Some(if answers.grpc {
                    Ok(Frame::trailers(answers.cut_trailers(&cause)))
                } else {
                    Err(Box::new(Error::cancelled(cause)))
                }));
            }
        }
        // Marked busy (if tracked) until the end of this poll.
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        let polled = match with_current(this.scope, || inner.poll_frame(cx)) {
            Poll::Pending => {
                if let Some(s) = this.streaming.as_ref() {
                    s.stop.leave();
                }
                return Poll::Pending;
            }
            Poll::Ready(polled) => polled,
        };
        let ended = match &polled {
            None | Some(Err(_)) => true,
            // Trailers are the last frame; a body that says it has ended may never be polled
            // again.
            Some(Ok(frame)) => {
                frame.is_trailers()
                    || this
                        .inner
                        .as_ref()
                        .as_pin_ref()
                        .is_none_or(|b| b.is_end_stream())
            }
        };
        if ended {
            with_current(this.scope, || this.inner.set(None));
            if let Some(s) = this.streaming.take() {
                s.stop.give_back();
            }
        } else if let Some(s) = this.streaming.as_mut() {
            // All the bytes its length announced are sent: the server may drop the body now
            // without polling it again, and that is no client going away. (Kept: it may still
            // have trailers to send.)
            let sent_all = match (s.left.as_mut(), &polled) {
                (Some(left), Some(Ok(frame))) => {
                    let sent = frame.data_ref().map_or(0, |d| d.remaining() as u64);
                    *left = left.saturating_sub(sent);
                    *left == 0
                }
                _ => false,
            };
            if sent_all {
                s.stop.give_back();
                *this.streaming = None;
            } else {
                // A cut that came during this poll gives the unit back here; the next poll
                // ends the body.
                s.stop.leave();
            }
        }
        Poll::Ready(polled.map(|r| {
            r.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                .map_err(Into::into)
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.text.is_none() && self.inner.as_ref().is_none_or(B::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.text) {
            (Some(b), _) => b.size_hint(),
            (None, Some(t)) => SizeHint::with_exact(t.len() as u64),
            (None, None) => SizeHint::with_exact(0),
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
        f.debug_struct("ResponseBody")
            .field("done", &self.inner.is_none())
            .field("tracked", &self.streaming.is_some())
            .finish()
    }
}

/// loom models of the cut (the module docs' invariants 1 and 2): the cancel's waker racing a
/// poll, and a drop, of the body. The scope is never cancelled here: the cut is driven
/// directly, as the cancel's wake-up runs it, so that only the protocol is explored.
#[cfg(all(test, loom))]
mod loom_cut {
    use super::*;
    use crate::sync::Arc;
    use loom::sync::atomic::AtomicBool;

    fn stop_of(scope: &Scope) -> std::sync::Arc<BodyStop> {
        std::sync::Arc::new(BodyStop {
            state: AtomicU8::new(0),
            held: Mutex::new(Held {
                unit: scope.tether(()).ok(),
                task: None,
            }),
        })
    }

    fn is_quiet(scope: &Scope) -> bool {
        scope.node.state().is_quiet()
    }

    /// The server's side, as `poll_frame` (without the waker's hand-over) or the drop: marks
    /// the body busy; if it was cut, ends it (a poll) or drops it (the report may have come:
    /// the handler's body was counted stopped at the cut) and gives the unit back (a no-op
    /// then); otherwise uses the handler's body (the unit must still be held: the report
    /// cannot have come) and then lets go (`leave`), or, for a drop, gives the unit back.
    fn server(stop: &BodyStop, scope: &Scope, using: &AtomicBool, drop_it: bool) {
        let was = stop.state.fetch_or(BUSY, Ordering::AcqRel);
        if was & CUT != 0 {
            stop.give_back();
            return;
        }
        using.store(true, Ordering::SeqCst);
        assert!(
            !is_quiet(scope),
            "the unit went back while the body was in use"
        );
        using.store(false, Ordering::SeqCst);
        if drop_it {
            stop.give_back();
        } else {
            stop.leave();
        }
    }

    fn model(drop_it: bool) {
        loom::model(move || {
            let scope = Scope::new();
            let stop = stop_of(&scope);
            scope.close();
            let using = Arc::new(AtomicBool::new(false));
            let polling = {
                let (stop, scope, using) = (stop.clone(), scope.clone(), using.clone());
                loom::thread::spawn(move || server(&stop, &scope, &using, drop_it))
            };
            stop.cut();
            if is_quiet(&scope) {
                // The cut gave the unit back: the server was not using the body then, and
                // finds it cut if it comes later.
                assert!(!using.load(Ordering::SeqCst), "given back under a use");
            }
            polling.join().unwrap();
            // Exactly once: given back by one side, whoever (a second give-back would
            // release a unit twice, which the tree asserts against).
            assert!(is_quiet(&scope), "the unit was never given back");
            assert!(stop.held.lock().unit.is_none());
        });
    }

    #[test]
    fn loom_cut_racing_a_poll_gives_the_unit_back_once_never_under_the_poll() {
        model(false);
    }

    #[test]
    fn loom_cut_racing_the_drop_gives_the_unit_back_once_after_the_drop() {
        model(true);
    }
}
