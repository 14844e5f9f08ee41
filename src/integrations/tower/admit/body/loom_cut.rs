//! loom models of the cut (the module docs' invariants 1 and 2): the cancel's waker racing a
//! poll, and a drop, of the body. The scope is never cancelled here: the cut is driven
//! directly, as the cancel's wake-up runs it, so that only the protocol is explored.

use super::*;
use crate::sync::Arc;
use loom::sync::atomic::AtomicBool;

/// A handler's body: its drop checks that nobody is using it and that it is the first.
struct Probe {
    using: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        assert!(!self.using.load(Ordering::SeqCst), "dropped while in use");
        assert!(!self.dropped.swap(true, Ordering::SeqCst), "dropped twice");
    }
}

fn stop_of(scope: &Scope, probe: Probe) -> std::sync::Arc<BodyStop<Probe>> {
    std::sync::Arc::new(BodyStop {
        state: AtomicU8::new(0),
        scope: scope.clone(),
        runtime: None,
        task: Mutex::new(None),
        held: Mutex::new(Held {
            body: Some(Box::pin(probe)),
            unit: scope.tether(None).ok(),
        }),
    })
}

fn is_quiet(scope: &Scope) -> bool {
    scope.node.state().is_quiet()
}

/// The server's side, as `poll_frame` (without the waker's hand-over) or the drop: marks
/// the body busy; if it was cut, ends it (a no-op if the cut did); otherwise uses the
/// handler's body under the lock, as a poll does (it must still be there and the unit
/// held: the report cannot have come), and then lets go (`leave`), or, for a drop, ends
/// the body.
fn server(stop: &BodyStop<Probe>, scope: &Scope, using: &AtomicBool, drop_it: bool) {
    let was = stop.state.fetch_or(BUSY, Ordering::AcqRel);
    if was & CUT != 0 {
        stop.end(&mut None);
        return;
    }
    {
        let held = stop.held.lock();
        using.store(true, Ordering::SeqCst);
        assert!(
            held.body.is_some(),
            "the body went while the server used it"
        );
        assert!(
            !is_quiet(scope),
            "the unit went back while the body was in use"
        );
        using.store(false, Ordering::SeqCst);
    }
    if drop_it {
        stop.end(&mut None);
    } else {
        stop.leave(&mut None);
    }
}

fn model(drop_it: bool) {
    loom::model(move || {
        let scope = Scope::new();
        let using = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicBool::new(false));
        let probe = Probe {
            using: using.clone(),
            dropped: dropped.clone(),
        };
        let stop = stop_of(&scope, probe);
        scope.close();
        let polling = {
            let (stop, scope, using) = (stop.clone(), scope.clone(), using.clone());
            loom::thread::spawn(move || server(&stop, &scope, &using, drop_it))
        };
        stop.cut();
        if is_quiet(&scope) {
            // The cut ended the body: the server was not using it then, and finds it cut
            // if it comes later.
            assert!(
                dropped.load(Ordering::SeqCst),
                "the unit went back before the body"
            );
        }
        polling.join().unwrap();
        // Exactly once: ended by one side, whoever (a second give-back would release a
        // unit twice, which the tree asserts against; a second drop, the probe).
        assert!(is_quiet(&scope), "the unit was never given back");
        assert!(
            dropped.load(Ordering::SeqCst),
            "the handler's body was never dropped"
        );
        let held = stop.held.lock();
        assert!(held.unit.is_none() && held.body.is_none());
    });
}

#[test]
fn loom_cut_racing_a_poll_ends_the_body_once_never_under_the_poll() {
    model(false);
}

#[test]
fn loom_cut_racing_the_drop_ends_the_body_once_after_the_drop() {
    model(true);
}
