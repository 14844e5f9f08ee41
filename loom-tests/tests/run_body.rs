//! loom models of the body of `Scope::run`: it is work of its scope (it holds a unit of it), so
//! the scope is not quiet while a body runs (docs/design.md invariant 6: once quiet, nothing of the
//! scope can still commit) and a cancel of an ancestor reaches a body that closed its own
//! scope (invariant 1).
#![cfg(loom)]

use cancel_scope::{Cause, Error, Lifecycle, Scope};
use cancel_scope_loom_tests::model;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// A body of `scope`, made and run on another thread, that sets the returned flag when it
/// runs; the thread yields what its `Run` yielded.
fn spawn_body(scope: &Scope) -> (Arc<AtomicBool>, thread::JoinHandle<Result<(), Error>>) {
    let done = Arc::new(AtomicBool::new(false));
    let scope = scope.clone();
    let flag = done.clone();
    let body = thread::spawn(move || {
        loom::future::block_on(scope.run(async move { flag.store(true, Ordering::Release) }))
    });
    (done, body)
}

/// Waits for `scope`'s quiet and checks it against the body (invariant 6): `accepted`, the
/// body had finished when `quiesce` resolved; refused, it never ran.
fn check_quiet_after_body(scope: &Scope, done: &AtomicBool, accepted: impl FnOnce() -> bool) {
    let report = loom::future::block_on(scope.quiesce());
    let done_at_quiet = done.load(Ordering::Acquire);
    let accepted = accepted();
    assert_eq!(report.state(), Lifecycle::Completed);
    assert_eq!(
        done_at_quiet, accepted,
        "quiet while an accepted body had not finished"
    );
    assert_eq!(
        done.load(Ordering::Acquire),
        accepted,
        "a refused body was polled"
    );
}

/// Model 30: a body made and run on one thread while another closes the scope and waits for
/// its quiet.
///
/// Invariant 6: a body made before the close has finished (its write is visible) when
/// `quiesce` resolves; one made after it (the scope then closed and quiet: it has no other
/// work) is refused (`is_closed`) and never polled. Without the body's unit, `quiesce`
/// resolves while an accepted body has not run yet.
#[test]
fn run_body_racing_close_and_quiesce() {
    model("run_body_racing_close_and_quiesce", || {
        let scope = Scope::new();
        let (done, body) = spawn_body(&scope);
        scope.close();
        check_quiet_after_body(&scope, &done, || match body.join().unwrap() {
            Ok(()) => true,
            Err(e) => {
                assert!(e.is_closed() && !e.is_cancelled(), "{e}");
                false
            }
        });
    });
}

/// Model 31: a body closes its own scope and then waits for the scope's cancel, while another
/// thread cancels the parent.
///
/// Invariant 1 with invariant 6: the scope is not quiet while its body runs, so the parent's
/// cancel walk reaches it and the body is woken (loom reports a deadlock otherwise: a quiet
/// scope is passed by the walk).
#[test]
fn closed_body_reached_by_parent_cancel() {
    model("closed_body_reached_by_parent_cancel", || {
        let parent = Scope::new();
        let scope = parent.child().build().unwrap();
        let body = {
            let scope = scope.clone();
            thread::spawn(move || {
                let inner = scope.clone();
                let run = scope.run(async move {
                    inner.close();
                    inner.cancelled().await;
                });
                loom::future::block_on(run)
            })
        };
        parent.cancel_because(Cause::ClientGone);
        let out = body.join().unwrap();
        // Stopped by the run (cancel seen before or after its poll) or by the body's own wait.
        if let Err(e) = out {
            assert_eq!(e.cause().map(Cause::origin), Some(&Cause::ClientGone));
        }
        assert_eq!(
            scope.cause().as_ref().map(Cause::origin),
            Some(&Cause::ClientGone)
        );
        assert_eq!(
            loom::future::block_on(scope.quiesce()).state(),
            Lifecycle::CancelledStable
        );
    });
}

/// Model 32: a closed scope whose last work (a guard) is released, and the scope then
/// quiesced, on one thread while another makes a body in it (work of that scope running after
/// the close, as a task would).
///
/// Invariant 6: the body is accepted only while the scope still has work (its unit taken
/// before the guard's release made the scope quiet), and then `quiesce` waits for it; otherwise
/// it is refused and never polled. A quiet scope never takes a unit again.
#[test]
fn body_made_while_the_last_work_of_a_closed_scope_ends() {
    model(
        "body_made_while_the_last_work_of_a_closed_scope_ends",
        || {
            let scope = Scope::new();
            let guard = scope.tether(()).unwrap();
            scope.close();
            let (done, body) = spawn_body(&scope);
            drop(guard);
            check_quiet_after_body(&scope, &done, || body.join().unwrap().is_ok());
        },
    );
}

/// Model 39: a scope that has work (a guard) throughout is closed on one
/// thread while another makes a body in it.
///
/// A closed scope that still has work accepts a body (model 32), and so does an open one: so
/// this body is accepted whichever comes first. Before the fix it could be refused as
/// "closed": the open state read first sent it to the open path, whose unit CAS then found
/// the close and refused instead of deciding again as a closed, busy scope.
#[test]
fn body_of_a_busy_scope_racing_its_close_is_accepted() {
    model("body_of_a_busy_scope_racing_its_close_is_accepted", || {
        let scope = Scope::new();
        let guard = scope.tether(()).unwrap();
        let closer = {
            let scope = scope.clone();
            thread::spawn(move || scope.close())
        };
        let out = loom::future::block_on(scope.run(async { 7 }));
        closer.join().unwrap();
        drop(guard);
        assert_eq!(
            out.map_err(|e| e.to_string()),
            Ok(7),
            "a body of a scope that had work throughout was refused"
        );
        assert_eq!(
            loom::future::block_on(scope.quiesce()).state(),
            Lifecycle::Completed
        );
    });
}
