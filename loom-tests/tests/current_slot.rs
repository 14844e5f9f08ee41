//! loom model of the current-scope slot: two tasks, each polled on its own model thread, whose
//! work reaches a preemption point while its scope is current.
//!
//! loom runs every model thread on the one OS thread that calls `loom::model`, switching
//! between them at each loom operation. A slot kept in a `std` thread-local is then shared by
//! all model threads: a task's scope moved into it can be moved out by another thread's task
//! (and the other thread's scope left in its place), so a model whose work does a loom
//! operation while its scope is current checks something tokio can never do, unless the slot
//! is a `loom` thread-local under `cfg(loom)`.
#![cfg(loom)]

use cancel_scope::Scope;
use cancel_scope_loom_tests::model;
use loom::thread;

/// Model: each of two tasks, in scopes "a" and "b", yields to loom inside its work (as any
/// atomic or lock of the tree would let it) and then reads `Scope::current()`: each must see
/// its own scope, and each task must get its handle back after the poll.
#[test]
fn two_tasks_preempted_inside_their_work_each_see_their_own_scope() {
    model(
        "two_tasks_preempted_inside_their_work_each_see_their_own_scope",
        || {
            let root = Scope::new();
            let runner = |name: &'static str| {
                let scope = root.child().name(name).build().unwrap();
                thread::spawn(move || {
                    let task = scope
                        .__task(async move {
                            thread::yield_now();
                            Scope::current().name().map(str::to_owned)
                        })
                        .unwrap();
                    let seen = loom::future::block_on(task).unwrap();
                    assert_eq!(
                        seen.as_deref(),
                        Some(name),
                        "another thread's scope was current"
                    );
                })
            };
            let a = runner("a");
            let b = runner("b");
            a.join().unwrap();
            b.join().unwrap();
            assert!(Scope::try_current().is_none());
        },
    );
}
