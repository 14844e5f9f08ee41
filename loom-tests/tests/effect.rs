//! loom models of the request-wide effect flag (`scope::effect`): the layer
//! that answers for a stopped request cancels its scope and then reads the flag, and must see
//! every dispatch of a possibly-effectful child that succeeded — whoever cancelled first.
#![cfg(loom)]

use cancel_scope::{Cause, ChildSpec, Scope};
use cancel_scope_loom_tests::{model, model_bounded, THREE_THREAD_PREEMPTIONS};
use loom::thread;

fn post() -> ChildSpec {
    ChildSpec::side_effecting("post", "post-1")
}

/// Model 46: a handler's task dispatches an effectful call in a child of the request while
/// another thread cancels the request (explicitly, or its deadline: `first`), and the
/// answering thread cancels it too and then reads the flag. A dispatch that won its CAS is
/// always seen by the answer (its write happens-before the answer's cancel returns); one that
/// lost leaves the flag clear, unless it had already looked (then a false `unknown`, which is
/// allowed: only a missed one is a bug).
fn effect_flag_seen_after_cancel(first: Cause) {
    let request = Scope::__request_root();
    let call_scope = request.child().build().unwrap();
    let ticket = call_scope.register(post()).unwrap();

    let dispatcher = thread::spawn(move || match ticket.dispatch() {
        Ok(call) => {
            call.succeed();
            true
        }
        Err(_) => false,
    });
    let canceller = {
        let request = request.clone();
        thread::spawn(move || {
            request.cancel_because(first);
        })
    };
    let answered_unknown = request.__cancel_then_effect();
    let dispatched = dispatcher.join().unwrap();
    canceller.join().unwrap();
    if dispatched {
        assert!(
            answered_unknown,
            "a dispatch that won its CAS was missed by the answer"
        );
    }
    drop(call_scope);
}

#[test]
fn effect_flag_seen_after_cancel_explicit() {
    model_bounded(
        "effect_flag_seen_after_cancel_explicit",
        THREE_THREAD_PREEMPTIONS,
        || effect_flag_seen_after_cancel(Cause::cancelled("stop")),
    );
}

#[test]
fn effect_flag_seen_after_cancel_deadline() {
    model_bounded(
        "effect_flag_seen_after_cancel_deadline",
        THREE_THREAD_PREEMPTIONS,
        || effect_flag_seen_after_cancel(Cause::DeadlineExceeded),
    );
}

/// Model 47: the same for a retry attempt's own ticket (its dispatch is the unit CAS in its
/// parent), against the answer alone.
#[test]
fn effect_flag_seen_for_an_attempts_own_ticket() {
    model("effect_flag_seen_for_an_attempts_own_ticket", || {
        let request = Scope::__request_root();
        let attempts = request.child().build().unwrap();
        let dispatcher = thread::spawn(move || match attempts.__child_dispatched(&post()) {
            Ok((_scope, ticket)) => {
                ticket.succeed();
                true
            }
            Err(_) => false,
        });
        let answered_unknown = request.__cancel_then_effect();
        if dispatcher.join().unwrap() {
            assert!(answered_unknown, "an attempt that started was missed");
        }
    });
}
