//! Deadline timers are disarmed lazily: a scope that goes leaves its entry in its tree's timer
//! heap, dead, and the heap is compacted as scopes go. Live deadlines must still fire at their
//! own time, memory must follow the live deadlines (invariant 7), and the timer task must exit
//! once no scope with a deadline is left. The trees one thread makes in one runtime share a
//! heap and a timer task.

use std::time::Duration;

use cancel_scope::{Cause, Scope};
use tokio::time::Instant;

use crate::support::panics::PanicsOnDrop;
use crate::support::time::{ms, paused_runtime};

/// How long the timer task stays once no scope with a deadline is live (`scope::timer`).
const LINGER: Duration = Duration::from_millis(100);

/// A child of `parent` with its own `timeout`.
fn child_within(parent: &Scope, timeout: Duration) -> Scope {
    parent.child().cap(timeout).build().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_long_lived_root_with_many_short_lived_deadlines_keeps_flat_timers() {
    let root = Scope::with_timeout(Duration::from_secs(3600));
    for _ in 0..10_000 {
        drop(child_within(&root, Duration::from_secs(30)));
    }
    // The root's entry, the last child's and at most a compaction's worth of dead ones.
    assert!(root.__timer_entries() <= 16, "{}", root.__timer_entries());

    // With 1,000 deadlines live, churn keeps the heap within one and a half times that.
    let live: Vec<_> = (0..1_000)
        .map(|_| child_within(&root, Duration::from_secs(60)))
        .collect();
    for _ in 0..10_000 {
        drop(child_within(&root, Duration::from_secs(30)));
    }
    let n = root.__timer_entries();
    assert!((1_001..=1_001 + 1_001 / 2 + 16).contains(&n), "{n}");

    // When they all go, the heap shrinks again, with no new deadline armed.
    drop(live);
    assert!(root.__timer_entries() <= 16, "{}", root.__timer_entries());
}

#[tokio::test(start_paused = true)]
async fn compactions_keep_every_live_deadline_firing_at_its_own_time() {
    let start = Instant::now();
    let root = Scope::with_timeout(Duration::from_secs(10));
    // Every other child is kept: the dropped ones interleave with the live ones in the heap.
    let mut kept = Vec::new();
    for i in 1..=200u64 {
        let c = child_within(&root, ms(i * 10));
        if i % 2 == 0 {
            kept.push((i, c));
        }
    }
    // More churn, so that several compactions run.
    for _ in 0..1_000 {
        drop(child_within(&root, ms(5)));
    }
    assert!(root.__timer_entries() < 300, "{}", root.__timer_entries());
    for (i, c) in &kept {
        c.cancelled().await;
        assert_eq!(start.elapsed(), ms(i * 10), "child {i}");
        assert_eq!(c.cause(), Some(Cause::DeadlineExceeded));
    }
    assert!(!root.is_cancelled());
    root.cancelled().await;
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_scope_is_freed_at_once_and_later_deadlines_still_fire() {
    let root = Scope::with_timeout(Duration::from_secs(10));
    let first = child_within(&root, ms(10));
    let probe = first.__freed_probe();
    drop(first);
    assert!(
        probe(),
        "the node is freed at once, its entry does not keep it"
    );
    let second = child_within(&root, ms(50));
    tokio::time::sleep(ms(20)).await; // past the dropped scope's deadline
    assert!(!second.is_cancelled());
    assert!(!root.is_cancelled());
    second.cancelled().await;
    assert_eq!(second.cause(), Some(Cause::DeadlineExceeded));
}

#[tokio::test(start_paused = true)]
async fn the_timer_task_exits_when_the_scope_that_made_the_timers_goes() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let root = Scope::with_timeout(Duration::from_secs(3600));
    let child = child_within(&root, Duration::from_secs(60));
    assert_eq!(metrics.num_alive_tasks(), 1, "the tree's timer task");
    drop(child);
    assert_eq!(
        root.__timer_entries(),
        2,
        "the child's entry is dead, not removed"
    );
    drop(root);
    // With the clock paused, this sleep ends only once every task has nothing left to do: the
    // timer task has handled its wake-up by then, and stays for the next scope a while.
    tokio::time::sleep(ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 1, "the timer task lingers");
    tokio::time::sleep(LINGER + ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0, "the timer task exited");

    // The same for timers made by a child (its parent has no deadline).
    let root = Scope::new();
    let owner = child_within(&root, Duration::from_secs(60));
    let inner = child_within(&owner, Duration::from_secs(30));
    assert_eq!(metrics.num_alive_tasks(), 1);
    drop(owner); // orphaned: its child still holds it
    tokio::time::sleep(ms(1)).await;
    assert_eq!(
        metrics.num_alive_tasks(),
        1,
        "the inner deadline still needs it"
    );
    drop(inner);
    tokio::time::sleep(LINGER + ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0);
    drop(root);
}

/// Three threads churn children with deadlines (racing the gone count and compactions with
/// inserts) while some stay: the heap stays within about one and a half times the live
/// deadlines, and every live deadline fires at its own time.
#[tokio::test(start_paused = true)]
async fn concurrent_churn_keeps_live_deadlines_and_bounds_the_heap() {
    let root = Scope::with_timeout(Duration::from_secs(3600));
    let handle = tokio::runtime::Handle::current();
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let root = root.clone();
            let handle = handle.clone();
            std::thread::spawn(move || {
                let _runtime = handle.enter();
                let mut kept = Vec::new();
                for i in 0..60_000u64 {
                    let c = child_within(&root, ms(1 + (i * 7 + t) % 5000));
                    if i % 200 == 0 {
                        kept.push((c.deadline().unwrap(), c));
                    }
                }
                kept
            })
        })
        .collect();
    let mut kept = Vec::new();
    for t in threads {
        kept.extend(t.join().unwrap());
    }
    let n = root.__timer_entries();
    assert!(
        n <= kept.len() + 1 + kept.len() / 2 + 64,
        "{n} entries, {} live",
        kept.len()
    );
    kept.sort_by_key(|(d, _)| *d);
    for (d, c) in &kept {
        c.cancelled().await;
        assert_eq!(Instant::now(), *d);
        assert_eq!(c.cause(), Some(Cause::DeadlineExceeded));
    }
    assert!(!root.is_cancelled());
}

/// The scope that made the timers is orphaned, and goes through the last of its descendants,
/// on another thread: until then the deadline of an orphaned scope in between still reaches
/// its child; then the timer task exits.
#[tokio::test(start_paused = true)]
async fn timers_made_by_an_orphaned_scope_last_until_its_last_descendant_goes() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let root = Scope::new();
    let owner = child_within(&root, Duration::from_secs(60));
    let mid = child_within(&owner, Duration::from_secs(30));
    let leaf = mid.child().build().unwrap(); // inherits mid's deadline: no entry of its own
    drop(owner);
    drop(mid);
    assert_eq!(metrics.num_alive_tasks(), 1);
    let start = Instant::now();
    tokio::time::timeout(Duration::from_secs(40), leaf.cancelled())
        .await
        .expect("the orphaned scope's deadline reached its child");
    assert_eq!(start.elapsed(), Duration::from_secs(30));
    std::thread::spawn(move || drop(leaf)).join().unwrap();
    tokio::time::sleep(LINGER + ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0);
    drop(root);
}

/// Roots with deadlines that come and go (`with_timeout`, `detach` with a child, a root whose
/// deadline has passed already, `shield`) leave no timer task behind.
#[tokio::test(start_paused = true)]
async fn roots_that_come_and_go_leave_no_timer_task() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let request = Scope::new();
    for _ in 0..1000 {
        drop(Scope::with_timeout(Duration::from_secs(3600)));
        let detached = request.detach(Duration::from_secs(3600));
        let child = child_within(&detached, Duration::from_secs(60));
        drop(detached);
        drop(child);
        drop(Scope::with_deadline(Instant::now()));
    }
    let cleanup = request
        .shield(Duration::from_secs(3600), tokio::time::sleep(ms(5)))
        .unwrap();
    cleanup.await.unwrap();
    tokio::time::sleep(LINGER + ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0);
}

/// The trees a thread makes one after another, one per request, share one heap and one timer
/// task: 100 request roots with deadlines in flight at once run one task, and each deadline
/// still fires at its own time. Once they have all gone, the task exits.
#[tokio::test(start_paused = true)]
async fn request_roots_made_on_one_thread_share_one_timer_task() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let start = Instant::now();
    let requests: Vec<_> = (1..=100u64)
        .map(|i| Scope::with_timeout(ms(1000 - i)))
        .collect();
    assert_eq!(metrics.num_alive_tasks(), 1, "one timer task for 100 trees");
    assert_eq!(requests[0].__timer_entries(), 100, "one heap for 100 trees");
    for (i, r) in requests.iter().enumerate().rev() {
        r.cancelled().await;
        assert_eq!(start.elapsed(), ms(1000 - (i as u64 + 1)));
        assert_eq!(r.cause(), Some(Cause::DeadlineExceeded));
    }
    drop(requests);
    tokio::time::sleep(LINGER + ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0, "the timer task exited");

    // Requests one after another, each gone before the next: the task stays while they come.
    for _ in 0..100 {
        let r = Scope::with_timeout(Duration::from_secs(30));
        tokio::task::yield_now().await;
        assert_eq!(metrics.num_alive_tasks(), 1);
        drop(r);
    }
    tokio::time::sleep(LINGER + ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0);
}

/// A server's worker whose requests come and go one at a time, none live between two while
/// the timer task runs: the task stays for the next request instead of exiting (and a new one
/// being spawned) per request; it exits a second after the last one.
#[tokio::test(start_paused = true)]
async fn the_timer_task_stays_between_requests_that_come_one_at_a_time() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let start = Instant::now();
    for _ in 0..100 {
        drop(Scope::with_timeout(Duration::from_secs(30)));
        // The timer task runs now and finds no scope live.
        tokio::task::yield_now().await;
        assert_eq!(
            metrics.num_alive_tasks(),
            1,
            "it stays for the next request"
        );
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Still a live timer: a request that comes during the linger is cancelled at its deadline.
    tokio::time::sleep(ms(50)).await;
    let late = Scope::with_timeout(ms(200));
    late.cancelled().await;
    assert_eq!(start.elapsed(), ms(250));
    drop(late);
    tokio::time::sleep(LINGER - ms(1)).await;
    assert_eq!(
        metrics.num_alive_tasks(),
        1,
        "until `LINGER` after the last scope"
    );
    tokio::time::sleep(ms(2)).await;
    assert_eq!(metrics.num_alive_tasks(), 0, "the timer task exited");
}

/// A thread that makes deadlines in two runtimes uses a heap (and a timer task) of each: a
/// root made in the second runtime is cancelled by that runtime's clock, while the first
/// runtime, which made the thread's earlier timers, is not running at all.
#[test]
fn each_runtime_has_its_own_timers() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let first = paused();
    let early = first.block_on(async { Scope::with_timeout(ms(10)) });
    let second = paused();
    let fired = second.block_on(async {
        let late = Scope::with_timeout(ms(20));
        let start = Instant::now();
        // Paused: with nothing else to wait for, the clock jumps to the next timer, so a
        // deadline that no timer task of this runtime watches would end the wait at 1 s.
        let fired = tokio::time::timeout(Duration::from_secs(1), late.cancelled())
            .await
            .is_ok();
        (fired, start.elapsed())
    });
    assert_eq!(fired, (true, ms(20)), "the second runtime's deadline fired");
    first.block_on(async {
        early.cancelled().await;
        assert_eq!(early.cause(), Some(Cause::DeadlineExceeded));
    });
}

/// One timer task serves every tree of its thread, so a burst of deadlines due at once must
/// not hold the worker: another task gets to run while the burst's scopes are cancelled (at
/// most a few dozen cancels between two of its turns), and every scope is still cancelled at
/// its deadline.
#[tokio::test(start_paused = true)]
async fn a_burst_of_deadlines_lets_other_tasks_run() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    let turns = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
    let start = Instant::now();
    let burst: Vec<_> = (0..320)
        .map(|_| {
            let s = Scope::with_timeout(ms(10));
            let (turns, seen) = (turns.clone(), seen.clone());
            // Each cancel notes how many turns the other task has had so far.
            let guard =
                s.on_cancel(move |_| seen.lock().unwrap().push(turns.load(Ordering::SeqCst)));
            (s, guard)
        })
        .collect();
    let other = {
        let turns = turns.clone();
        tokio::spawn(async move {
            // From the burst's deadline on (before it, the paused clock must be able to run
            // forward, which it does only while every task waits).
            tokio::time::sleep(ms(10)).await;
            loop {
                turns.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    for (s, _) in &burst {
        s.cancelled().await;
        assert_eq!(start.elapsed(), ms(10));
    }
    other.abort();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 320);
    let most_in_one_turn = seen
        .chunk_by(|a, b| a == b)
        .map(<[usize]>::len)
        .max()
        .unwrap();
    // The driver yields every 32 cancels; a yielded task waits for the runtime's next tick,
    // so the other task's turn can come after the second batch. (Without yielding: 320.)
    assert!(
        most_in_one_turn <= 64,
        "{most_in_one_turn} cancels without a turn of the other task"
    );
}

/// In the current runtime (paused): a child of `root` that tightens the deadline to 10 ms is
/// cancelled at 10 ms by its deadline. A deadline no timer task of this runtime watches ends
/// the wait at 60 s instead.
async fn a_child_fires_at_its_deadline(root: &Scope) {
    let start = Instant::now();
    let child = child_within(root, ms(10));
    let fired = tokio::time::timeout(Duration::from_secs(60), child.cancelled()).await;
    assert!(fired.is_ok(), "the child's deadline never fired");
    assert_eq!(child.cause(), Some(Cause::DeadlineExceeded));
    assert_eq!(start.elapsed(), ms(10));
}

/// A runtime dropped before its timer task ever ran (a current-thread runtime runs spawned
/// tasks only while it blocks on something that waits) must not leave its heap believing a
/// timer task runs: a child that tightens the deadline of a root it made, in a later runtime,
/// is cancelled at its deadline.
#[test]
fn a_deadline_fires_after_the_runtime_whose_timer_task_never_ran_was_dropped() {
    let first = paused_runtime();
    let root = first.block_on(async { Scope::with_timeout(Duration::from_secs(3600)) });
    drop(first);
    let second = paused_runtime();
    second.block_on(a_child_fires_at_its_deadline(&root));
}

/// The same outside any runtime: with the runtime gone no timer task watches the tree, so a
/// child that tightens its deadline panics (a deadline needs a runtime), not made with a
/// deadline that never fires.
#[test]
fn a_child_that_tightens_outside_a_runtime_after_the_runtime_went_panics() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    let first = paused_runtime();
    let root = first.block_on(async { Scope::with_timeout(Duration::from_secs(3600)) });
    drop(first);
    let child = catch_unwind(AssertUnwindSafe(|| child_within(&root, ms(10))));
    assert!(
        child.is_err(),
        "a child with an unwatched deadline was made"
    );
}
/// A scope made in one runtime and given a child that tightens its deadline in another: the
/// child's deadline is watched in the runtime it was made in, even while the first runtime
/// (a current-thread one, alive but not blocking on anything) runs no task at all.
#[test]
fn a_child_made_in_another_runtime_fires_while_the_first_one_is_idle() {
    let first = paused_runtime();
    let root = first.block_on(async {
        let root = Scope::with_timeout(Duration::from_secs(3600));
        // The first runtime's timer task runs and sleeps until the root's deadline.
        tokio::task::yield_now().await;
        root
    });
    let second = paused_runtime();
    second.block_on(a_child_fires_at_its_deadline(&root));
    drop(first);
}

/// Runtimes have clocks of their own (a paused one runs ahead of the real clock once
/// advanced): a child that tightens the deadline of a scope made in another runtime is
/// cancelled by the clock of the runtime it was made in, never earlier. The first runtime runs
/// on a thread of its own, its paused clock an hour ahead of the real one and held there (a
/// blocking task in flight stops a paused clock from jumping).
#[test]
fn a_child_made_in_another_runtime_fires_by_its_own_runtimes_clock() {
    use std::sync::mpsc;

    let (root_tx, root_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let first = std::thread::spawn(move || {
        paused_runtime().block_on(async move {
            tokio::time::advance(Duration::from_secs(3600)).await;
            root_tx
                .send(Scope::with_timeout(Duration::from_secs(10 * 3600)))
                .unwrap();
            tokio::task::spawn_blocking(move || stop_rx.recv())
                .await
                .unwrap()
                .ok();
        });
    });
    let root = root_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    // The real clock here: what is waited for is the other thread's cancel, if it comes early.
    let real = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    real.block_on(async {
        let child = child_within(&root, ms(100));
        let deadline = child.deadline().unwrap();
        let fired = tokio::time::timeout(Duration::from_secs(60), child.cancelled()).await;
        assert!(fired.is_ok(), "the child's deadline never fired");
        assert_eq!(child.cause(), Some(Cause::DeadlineExceeded));
        let early = deadline.saturating_duration_since(Instant::now());
        assert_eq!(early, Duration::ZERO, "fired before its deadline");
    });
    stop_tx.send(()).unwrap();
    first.join().unwrap();
}

/// The timer task contains the panic of an `on_cancel` callback it ran, and must contain all of
/// it: a panic whose payload panics again when dropped (`panic_any` of such a value) must not
/// end the task, which would leave the other scopes due at the same time, and every later
/// deadline of its heap, uncancelled.
#[tokio::test(start_paused = true)]
async fn a_callback_panic_whose_payload_panics_on_drop_does_not_stop_the_timers() {
    let start = Instant::now();
    let first = Scope::with_timeout(ms(10));
    let _guard = first.on_cancel(|_| std::panic::panic_any(PanicsOnDrop));
    let same_time: Vec<_> = (0..40).map(|_| Scope::with_timeout(ms(10))).collect();
    let later = Scope::with_timeout(ms(20));
    let fired = tokio::time::timeout(Duration::from_secs(60), later.cancelled()).await;
    assert!(fired.is_ok(), "the later deadline never fired");
    assert_eq!(start.elapsed(), ms(20));
    assert_eq!(first.cause(), Some(Cause::DeadlineExceeded));
    for s in &same_time {
        assert_eq!(s.cause(), Some(Cause::DeadlineExceeded));
    }
}

// The timer task of a thread's heap exits `LINGER` after every scope with a deadline has
// gone, also when the last one goes on another thread than the one the timer task runs on.

/// Request roots made and dropped one at a time on a plain thread (in the runtime's context)
/// while the runtime's worker runs the timer task: after each drop the task must exit (once
/// it has lingered), not
/// sleep on until the dropped root's deadline (an hour) because it looked at the heap after
/// the root counted itself gone but before its node was freed.
///
/// Real threads and the real clock, as the race needs them; the thirty seconds only bound a
/// wait that ends as soon as the task has exited (`LINGER` after the scope went; before the
/// fix, an hour), so that a loaded machine cannot fail it. A fresh runtime for every few
/// requests: its worker, not parked yet, polls the woken task at once, which is when the race
/// shows.
#[test]
fn the_timer_task_exits_when_the_last_scope_goes_on_another_thread() {
    for round in 0..50 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let metrics = rt.metrics();
        let _in = rt.enter();
        for i in 0..4 {
            drop(Scope::with_timeout(Duration::from_secs(3600)));
            let start = std::time::Instant::now();
            while metrics.num_alive_tasks() != 0 {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "runtime {round}, request {i}: the timer task outlived every scope"
                );
                std::thread::yield_now();
            }
        }
    }
}
