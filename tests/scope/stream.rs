//! `Scope::run_stream`: a stream bounded by a scope ends with the cause at the cancel or the
//! deadline, or after an idle timeout; it is work of the scope until it ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cancel_scope::{Lifecycle, Scope};
use futures::stream::FusedStream;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// An item every `every`, for ever; counts the items taken and says when it is dropped.
struct Ticks {
    sleep: Pin<Box<tokio::time::Sleep>>,
    every: Duration,
    taken: Arc<AtomicUsize>,
    dropped: Arc<AtomicBool>,
}

impl Ticks {
    fn every(every: Duration) -> Ticks {
        Ticks {
            sleep: Box::pin(tokio::time::sleep(every)),
            every,
            taken: Arc::default(),
            dropped: Arc::default(),
        }
    }
}

impl Stream for Ticks {
    type Item = usize;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        std::task::ready!(self.sleep.as_mut().poll(cx));
        let next = Instant::now() + self.every;
        self.sleep.as_mut().reset(next);
        Poll::Ready(Some(self.taken.fetch_add(1, Ordering::SeqCst) + 1))
    }
}

impl Drop for Ticks {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_the_stream_with_its_cause() {
    let scope = Scope::with_timeout(100 * MS);
    let ticks = Ticks::every(30 * MS);
    let dropped = ticks.dropped.clone();
    let start = Instant::now();
    let mut s = scope.run_stream(ticks);
    for n in 1..=3 {
        assert_eq!(s.next().await.unwrap().unwrap(), n);
    }
    let err = s.next().await.unwrap().unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err:?}");
    assert_eq!(start.elapsed(), 100 * MS);
    // Ended: dropped at once (what it holds is released), and it stays ended.
    assert!(dropped.load(Ordering::SeqCst));
    assert!(s.is_terminated());
    assert!(s.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_ends_the_stream_with_its_reason() {
    let scope = Scope::new();
    let mut s = scope.run_stream(Ticks::every(30 * MS));
    assert_eq!(s.next().await.unwrap().unwrap(), 1);
    let stop = scope.clone();
    tokio::spawn(async move {
        tokio::time::sleep(10 * MS).await;
        stop.cancel_with("client asked to stop");
    });
    let start = Instant::now();
    let err = s.next().await.unwrap().unwrap_err();
    assert_eq!(
        start.elapsed(),
        10 * MS,
        "at the cancel, not at the next item"
    );
    assert_eq!(err.cause().unwrap().reason(), Some("client asked to stop"));
    assert!(s.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn no_item_for_the_idle_timeout_ends_the_stream_but_not_the_scope() {
    let scope = Scope::with_timeout(Duration::from_secs(10));
    let stalls = futures::stream::iter([1, 2]).chain(futures::stream::pending());
    let mut s = scope.run_stream(stalls).idle_timeout(50 * MS);
    assert_eq!(s.next().await.unwrap().unwrap(), 1);
    assert_eq!(s.next().await.unwrap().unwrap(), 2);
    let start = Instant::now();
    let err = s.next().await.unwrap().unwrap_err();
    assert!(err.is_idle_timeout() && !err.is_cancelled(), "{err:?}");
    assert_eq!(err.idle_timeout(), Some(50 * MS));
    assert_eq!(start.elapsed(), 50 * MS);
    assert!(s.next().await.is_none());
    assert!(!scope.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn the_idle_timeout_counts_only_while_an_item_is_waited_for() {
    // Each item takes 30 ms from when it is asked for, with a 50 ms idle timeout, and the
    // consumer takes 40 ms per item: 70 ms pass between two items, but the stream is never
    // waited for 50 ms, however slow the consumer is.
    let on_demand = futures::stream::unfold(0, |n| async move {
        tokio::time::sleep(30 * MS).await;
        Some((n + 1, n + 1))
    });
    let scope = Scope::new();
    let mut s = scope.run_stream(Box::pin(on_demand)).idle_timeout(50 * MS);
    for n in 1..=5 {
        assert_eq!(s.next().await.unwrap().unwrap(), n);
        tokio::time::sleep(40 * MS).await;
    }
    // Slower than the timeout: it ends.
    let mut slow = scope
        .run_stream(Ticks::every(60 * MS))
        .idle_timeout(50 * MS);
    assert!(slow.next().await.unwrap().unwrap_err().is_idle_timeout());
}

#[tokio::test(start_paused = true)]
async fn a_refused_stream_is_never_polled() {
    let scope = Scope::new();
    scope.cancel_with("gone");
    let polled = Arc::new(AtomicBool::new(false));
    let flag = polled.clone();
    let mut s = scope.run_stream(futures::stream::poll_fn(move |_| {
        flag.store(true, Ordering::SeqCst);
        Poll::Ready(Some(()))
    }));
    let err = s.next().await.unwrap().unwrap_err();
    assert_eq!(err.cause().unwrap().reason(), Some("gone"));
    assert!(s.next().await.is_none());
    assert!(!polled.load(Ordering::SeqCst));

    // Closed and quiet: refused as closed.
    let done = Scope::new();
    done.close();
    let err = done.run_stream(futures::stream::iter([1])).next().await;
    assert!(err.unwrap().unwrap_err().is_closed());
}

#[tokio::test(start_paused = true)]
async fn the_stream_is_work_of_the_scope_until_it_ends() {
    let scope = Scope::new();
    let mut s = scope.run_stream(futures::stream::iter([1, 2]));
    scope.close();
    assert_eq!(scope.lifecycle(), Lifecycle::Running, "the stream holds it");
    assert_eq!(s.next().await.unwrap().unwrap(), 1);
    assert_eq!(s.next().await.unwrap().unwrap(), 2);
    assert!(s.next().await.is_none());
    // Ended: the scope completes although the `RunStream` is still here.
    assert_eq!(scope.lifecycle(), Lifecycle::Completed);
    drop(s);

    // Dropped before its end: the same.
    let scope = Scope::new();
    let s = scope.run_stream(Ticks::every(MS));
    scope.close();
    assert_eq!(scope.lifecycle(), Lifecycle::Running);
    drop(s);
    assert_eq!(scope.quiesce().await.state(), Lifecycle::Completed);
}

#[tokio::test(start_paused = true)]
async fn the_stream_is_polled_and_dropped_with_its_scope_current() {
    struct SeesScope(Arc<AtomicBool>);
    impl Drop for SeesScope {
        fn drop(&mut self) {
            let seen = Scope::try_current().is_some_and(|s| s.name() == Some("rows"));
            self.0.store(seen, Ordering::SeqCst);
        }
    }
    let scope = Scope::new().child().name("rows").build().unwrap();
    let seen_at_drop = Arc::new(AtomicBool::new(false));
    let guard = SeesScope(seen_at_drop.clone());
    let names = futures::stream::repeat_with(move || {
        let _keep = &guard;
        Scope::current().name().map(str::to_owned)
    });
    let mut s = scope.run_stream(names);
    assert_eq!(s.next().await.unwrap().unwrap().as_deref(), Some("rows"));
    assert!(Scope::try_current().is_none());
    drop(s);
    assert!(seen_at_drop.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_next_dropped_by_select_loses_no_item() {
    let scope = Scope::new();
    let mut s = scope
        .run_stream(Ticks::every(30 * MS))
        .idle_timeout(100 * MS);
    let mut got = Vec::new();
    let mut timer_wins = 0;
    while got.len() < 5 {
        tokio::select! {
            item = s.next() => got.push(item.unwrap().unwrap()),
            () = tokio::time::sleep(7 * MS) => timer_wins += 1,
        }
    }
    assert_eq!(got, [1, 2, 3, 4, 5]);
    assert!(
        timer_wins >= 5,
        "the other branch won in between ({timer_wins})"
    );
}
