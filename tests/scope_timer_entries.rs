//! Deadline timers are disarmed lazily: a scope that goes leaves its entry in its tree's timer
//! heap, dead, and the heap is compacted as scopes go. Live deadlines must still fire at their
//! own time, memory must follow the live deadlines (invariant 7), and the timer task must exit
//! once the scope that made the timers is gone.

use std::time::Duration;

use cancel_scope::{Cause, Scope};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn a_long_lived_root_with_many_short_lived_deadlines_keeps_flat_timers() {
    let root = Scope::with_timeout(Duration::from_secs(3600));
    for _ in 0..10_000 {
        drop(
            root.child()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        );
    }
    // The root's entry, the last child's and at most a compaction's worth of dead ones.
    assert!(root.__timer_entries() <= 16, "{}", root.__timer_entries());

    // With 1,000 deadlines live, churn keeps the heap within one and a half times that.
    let live: Vec<_> = (0..1_000)
        .map(|_| {
            root.child()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap()
        })
        .collect();
    for _ in 0..10_000 {
        drop(
            root.child()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        );
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
        let c = root.child().timeout(ms(i * 10)).build().unwrap();
        if i % 2 == 0 {
            kept.push((i, c));
        }
    }
    // More churn, so that several compactions run.
    for _ in 0..1_000 {
        drop(root.child().timeout(ms(5)).build().unwrap());
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
async fn a_dropped_scope_whose_deadline_passes_cancels_nothing() {
    let root = Scope::with_timeout(Duration::from_secs(10));
    let first = root.child().timeout(ms(10)).build().unwrap();
    let probe = first.__freed_probe();
    drop(first);
    assert!(
        probe(),
        "the node is freed at once, its entry does not keep it"
    );
    let second = root.child().timeout(ms(50)).build().unwrap();
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
    let child = root
        .child()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    assert_eq!(metrics.num_alive_tasks(), 1, "the tree's timer task");
    drop(child);
    assert_eq!(
        root.__timer_entries(),
        2,
        "the child's entry is dead, not removed"
    );
    drop(root);
    // With the clock paused, this sleep ends only once every task has nothing left to do: the
    // timer task has handled its wake-up by then.
    tokio::time::sleep(ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0, "the timer task exited");

    // The same for timers made by a child (its parent has no deadline).
    let root = Scope::new();
    let owner = root
        .child()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let inner = owner
        .child()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    assert_eq!(metrics.num_alive_tasks(), 1);
    drop(owner); // orphaned: its child still holds it
    tokio::time::sleep(ms(1)).await;
    assert_eq!(
        metrics.num_alive_tasks(),
        1,
        "the inner deadline still needs it"
    );
    drop(inner);
    tokio::time::sleep(ms(1)).await;
    assert_eq!(metrics.num_alive_tasks(), 0);
    drop(root);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_fired_scope_keeps_a_later_deadline_armed() {
    let root = Scope::with_timeout(ms(1000));
    let first = root.child().timeout(ms(10)).build().unwrap();
    first.cancelled().await; // its timer fired
    let second = root.child().timeout(ms(50)).build().unwrap();
    drop(first);

    tokio::time::timeout(ms(100), second.cancelled())
        .await
        .expect("the 50 ms deadline fired");
    assert!(second.cause().unwrap().is_deadline_exceeded());
    assert!(!root.is_cancelled());
}
