//! A stream bounded by a scope: [`Scope::run_stream`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::stream::{FusedStream, Stream};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::future::{stop_body, Hold};
use super::{with_current, Scope};
use crate::error::Error;
use crate::time::sleepable_after;
use crate::tree::{self, WaiterKey};

impl Scope {
    /// Runs `stream` as a body of this scope, as [`run`](Scope::run) runs a future: each item
    /// comes as `Ok`, and when the scope is cancelled (or its deadline passes) the stream ends
    /// with the cause, as one last `Err` item, then `None`.
    ///
    /// Like `run`'s future, the stream is polled (and dropped) with this scope as
    /// [`Scope::current`], it is work of the scope until it ends or is dropped (`quiesce` waits
    /// for it), and a scope that is cancelled, or closed and quiet, refuses it: its first item
    /// is the refusal and the stream is never polled. The stream is dropped as soon as it ends
    /// (its own end, the cancel, the idle timeout), so what it holds is released then, not
    /// when the `RunStream` goes.
    ///
    /// [`idle_timeout`](RunStream::idle_timeout) ends it too when no item comes for that long,
    /// beside the scope's deadline for the whole stream. (For a deadline of the stream's own,
    /// run it in a [`child`](Scope::child) with a timeout.)
    ///
    /// The items are `Result<S::Item, Error>`, as those of `tokio_stream::StreamExt::timeout`:
    /// `while let Some(item) = s.next().await { let item = item?; … }`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if a `next()` is dropped (another `select!` branch won), no item is lost;
    /// an item is only taken from `stream` when it is returned.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use futures::StreamExt;
    /// use cancel_scope::Scope;
    ///
    /// let ticks = tokio_stream_like_interval(Duration::from_millis(30));
    /// let scope = Scope::with_timeout(Duration::from_millis(100));
    /// let items: Vec<_> = scope.run_stream(ticks).collect().await;
    /// assert_eq!(items.len(), 4); // ticks at 30, 60 and 90 ms, then the deadline
    /// assert!(items[..3].iter().all(Result::is_ok));
    /// assert!(items[3].as_ref().unwrap_err().is_deadline_exceeded());
    ///
    /// # fn tokio_stream_like_interval(every: Duration) -> impl futures::Stream<Item = ()> {
    /// #     futures::stream::unfold((), move |()| async move {
    /// #         tokio::time::sleep(every).await;
    /// #         Some(((), ()))
    /// #     })
    /// # }
    /// # }
    /// ```
    pub fn run_stream<S: Stream>(&self, stream: S) -> RunStream<S> {
        RunStream {
            stream: Some(stream),
            hold: Hold::take(self),
            scope: Some(self.clone()),
            key: WaiterKey::default(),
            idle: None,
            sleep: None,
            waiting: false,
        }
    }
}

pin_project! {
    /// A stream run as a body of a scope: ends with the cause when the scope is cancelled, or
    /// after an idle timeout. Returned by [`Scope::run_stream`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (see [`Scope::run_stream`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use futures::StreamExt;
    /// use cancel_scope::Scope;
    /// let scope = Scope::new();
    /// let mut numbers = scope.run_stream(futures::stream::iter([1, 2]));
    /// assert_eq!(numbers.next().await.unwrap().unwrap(), 1);
    /// scope.cancel_with("enough");
    /// let err = numbers.next().await.unwrap().unwrap_err();
    /// assert_eq!(err.cause().unwrap().reason(), Some("enough"));
    /// assert!(numbers.next().await.is_none());
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct RunStream<S> {
        // `None` once it has ended (and been dropped).
        #[pin]
        stream: Option<S>,
        // The scope's handle: in the current-scope slot while the stream is polled or
        // dropped, here otherwise.
        scope: Option<Scope>,
        // Its entry in the scope's cancel waiters, once a poll of the stream was pending.
        key: WaiterKey,
        // What it holds of its scope (a unit, until it ends).
        hold: Hold,
        idle: Option<Duration>,
        // The idle timer, made at the first wait (boxed: the stream stays `Unpin` when `S`
        // is, for `StreamExt::next`); `None` too for an idle timeout too long to represent
        // (never).
        sleep: Option<Pin<Box<Sleep>>>,
        // Whether `sleep` is set for the wait under way (an item was asked for and none has
        // come since).
        waiting: bool,
    }

    impl<S> PinnedDrop for RunStream<S> {
        fn drop(this: Pin<&mut Self>) {
            this.stop();
        }
    }
}

impl<S> RunStream<S> {
    /// Ends the stream when no item comes for `idle` while one is waited for: counted from
    /// each poll that finds no item ready after the last item (the time the consumer takes
    /// between items does not count), the stream's last item is then an
    /// [`Error::is_idle_timeout`] error. Set twice, the shorter one holds.
    ///
    /// # Panics
    ///
    /// The stream then panics when polled outside a tokio runtime with a timer.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use futures::StreamExt;
    /// use cancel_scope::Scope;
    /// let ms = Duration::from_millis;
    ///
    /// // Two items, then silence.
    /// let stalls = futures::stream::iter([1, 2]).chain(futures::stream::pending());
    /// let scope = Scope::new();
    /// let start = tokio::time::Instant::now();
    /// let items: Vec<_> = scope.run_stream(stalls).idle_timeout(ms(50)).collect().await;
    /// assert_eq!(items.len(), 3);
    /// assert!(items[2].as_ref().unwrap_err().is_idle_timeout());
    /// assert_eq!(start.elapsed(), ms(50));
    /// assert!(!scope.is_cancelled()); // the scope goes on
    /// # }
    /// ```
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle = Some(self.idle.map_or(idle, |d| d.min(idle)));
        self
    }

    /// The scope the stream runs in.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let scope = Scope::new();
    /// let s = scope.run_stream(futures::stream::empty::<()>());
    /// assert_eq!(s.scope().generation(), scope.generation());
    /// ```
    pub fn scope(&self) -> &Scope {
        match &self.scope {
            Some(scope) => scope,
            None => unreachable!("the scope is back after every poll"),
        }
    }

    /// Ends the stream: leaves the cancel waiters, drops the stream with the scope current
    /// (as it ran), and only then gives back the unit, so that a scope seen quiet has no
    /// stream of its left (invariant 6); given back also if the stream's drop panics (see
    /// `Run::stop`).
    fn stop(self: Pin<&mut Self>) {
        let this = self.project();
        *this.sleep = None;
        stop_body(this.scope, this.key, this.hold, None, this.stream);
    }
}

impl<S: Stream> RunStream<S> {
    /// One poll; the stream has to be stopped after anything but an item or `Pending`.
    fn poll_body(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<S::Item, Error>>> {
        let this = self.project();
        let Some(stream) = this.stream.as_pin_mut() else {
            return Poll::Ready(None);
        };
        if let Hold::Refused(refused) = this.hold {
            let refused = Error::from(refused.clone());
            *this.hold = Hold::Nothing;
            return Poll::Ready(Some(Err(refused)));
        }
        if let Some(cancelled) = cancelled(this.scope) {
            // A cancelled scope never polls its work again (invariant 2).
            return Poll::Ready(Some(Err(cancelled)));
        }
        match with_current(this.scope, || stream.poll_next(cx)) {
            Poll::Ready(Some(item)) => {
                *this.waiting = false;
                return Poll::Ready(Some(Ok(item)));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        let Some(scope) = this.scope.as_ref() else {
            unreachable!("the scope is back after every poll");
        };
        // Pending: only now register for the cancel (a stream that always has an item ready
        // never touches the waiter list). A cancel that came meanwhile is seen here.
        if tree::poll_cancelled(&scope.node, this.key, cx.waker()) {
            return Poll::Ready(Some(Err(Error::cancelled(scope.cause_or_cancelled()))));
        }
        let Some(idle) = *this.idle else {
            return Poll::Pending;
        };
        let sleep = this.sleep;
        if !*this.waiting {
            *this.waiting = true;
            match (sleepable_after(Instant::now(), idle), sleep.as_mut()) {
                (Some(at), Some(armed)) => armed.as_mut().reset(at),
                (at, _) => *sleep = at.map(|at| Box::pin(tokio::time::sleep_until(at))),
            }
        }
        match sleep.as_mut().map(|s| s.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Some(Err(Error::idle(idle)))),
            _ => Poll::Pending,
        }
    }
}

/// The scope's cancel, if it is cancelled.
fn cancelled(scope: &Option<Scope>) -> Option<Error> {
    let scope = scope.as_ref()?;
    scope
        .is_cancelled()
        .then(|| Error::cancelled(scope.cause_or_cancelled()))
}

impl<S: Stream> Stream for RunStream<S> {
    type Item = Result<S::Item, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let out = self.as_mut().poll_body(cx);
        if !matches!(out, Poll::Pending | Poll::Ready(Some(Ok(_)))) {
            self.stop();
        }
        out
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.stream {
            // Any item may be the last (a cancel), and one error item may come after the last.
            Some(s) => (0, s.size_hint().1.and_then(|n| n.checked_add(1))),
            None => (0, Some(0)),
        }
    }
}

impl<S: Stream> FusedStream for RunStream<S> {
    fn is_terminated(&self) -> bool {
        self.stream.is_none()
    }
}

impl<S> fmt::Debug for RunStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunStream")
            .field("scope", &self.scope)
            .field("idle", &self.idle)
            .field("ended", &self.stream.is_none())
            .finish_non_exhaustive()
    }
}
