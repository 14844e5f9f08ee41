//! The timer task of a thread's heap exits once every scope with a deadline has gone, also
//! when the last one goes on another thread than the one the timer task runs on.

use std::time::Duration;

use cancel_scope::Scope;

/// Request roots made and dropped one at a time on a plain thread (in the runtime's context)
/// while the runtime's worker runs the timer task: after each drop the task must exit, not
/// sleep on until the dropped root's deadline (an hour) because it looked at the heap after
/// the root counted itself gone but before its node was freed.
///
/// Real threads and the real clock, as the race needs them; the thirty seconds only bound a
/// wait that ends as soon as the task has exited (within microseconds; before the fix, an
/// hour), so that a loaded machine cannot fail it. A fresh runtime for
/// every few requests: its worker, not parked yet, polls the woken task at once, which is
/// when the race shows.
#[test]
fn the_timer_task_exits_when_the_last_scope_goes_on_another_thread() {
    for round in 0..200 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let metrics = rt.metrics();
        let _in = rt.enter();
        for i in 0..10 {
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
