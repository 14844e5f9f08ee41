//! The request-wide "a possibly-effectful child was dispatched" flag.
//!
//! A server that stops a request must tell its caller whether the request may have had an
//! effect (see [`wire::service_effect`](crate::wire::service_effect)). Every scope of a
//! request shares the request-wide part of its data (`Shared`), so the flag is installed
//! once, on the request's scope (by admission), and every descendant reaches it in O(1): no
//! walk up the tree. A shielded cleanup keeps it (it is still the request's work, with its
//! operation identity); [`detach`](crate::Scope::detach) does not (a new operation).
//!
//! # Ordering (the answer never misses a dispatch)
//!
//! 1. A dispatch of a child whose effect [`may_have_effect`](crate::Effect::may_have_effect)
//!    sets the flag *before* its dispatch compare-and-swap (the CAS on the state word of the
//!    ticket's scope, or the unit CAS of an attempt's own ticket), once it has seen that the
//!    CAS can succeed (an open watermark, its generation): a dispatch refused before that
//!    leaves the flag as it is. (A cancel between that look and the CAS makes the dispatch
//!    fail with the flag set: a false `unknown`, never a missed one.)
//! 2. The layer that answers for a stopped request first calls `cancel()` on its scope
//!    (idempotent; it returns only once every descendant is cancelled, whoever cancelled
//!    first) and only then reads the flag. A dispatch CAS that succeeded is ordered before the
//!    cancel's mark of its node in that node's state word (invariant 2), so the flag's write
//!    happens-before the cancel's return, and the read sees it (loom model
//!    `effect_flag_seen_after_cancel`).
//!
//! The flag only goes from clear to set. A set is a load first and a store only if it was
//! clear, so a request that dispatches many effectful calls writes the flag's line once.

use super::Scope;
use crate::sync::{Arc, AtomicU8, Ordering};

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct EffectFlag(AtomicU8);

impl EffectFlag {
    /// A clear flag.
    pub(crate) fn new() -> Self {
        EffectFlag(AtomicU8::new(0))
    }

    /// Notes that a possibly-effectful child is being dispatched (before its CAS).
    #[inline]
    pub(crate) fn note(&self) {
        // Relaxed load: a set seen here is the one the answer reads too (coherence: the
        // answer happens-after this dispatch, so it reads this value or a later one, and the
        // flag never clears). Release store: ordered before the dispatch CAS that follows.
        if self.0.load(Ordering::Relaxed) == 0 {
            self.0.store(1, Ordering::Release);
        }
    }

    /// Whether a possibly-effectful child was dispatched (read after the request's cancel).
    #[cfg_attr(
        not(any(feature = "tower", feature = "reqwest", feature = "__test-hooks")),
        allow(dead_code)
    )]
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire) != 0
    }
}

impl Scope {
    /// The request's effect flag, if this scope is (in) an admitted request (see `effect`).
    pub(crate) fn effect_flag(&self) -> Option<&Arc<EffectFlag>> {
        self.node.ext.shared().effect.as_ref()
    }

    /// Notes in the request's effect flag (if any) that a child that may have had an effect
    /// is about to be dispatched: before its dispatch compare-and-swap (see `effect`).
    #[inline]
    pub(crate) fn note_effect(&self) {
        if let Some(flag) = self.effect_flag() {
            flag.note();
        }
    }

    /// Cancels the scope (a no-op for the cause if it is already cancelled: see
    /// [`Scope::cancel`]), then reads the request's effect flag: whether a child that may
    /// have had an effect was dispatched in the request. The cancel first: it returns once
    /// every descendant is cancelled, so every dispatch that succeeded is seen (see
    /// `effect`). `false` for a scope without a flag.
    #[cfg_attr(
        not(any(feature = "tower", feature = "__test-hooks")),
        allow(dead_code)
    )]
    pub(crate) fn cancel_then_effect(&self) -> bool {
        self.cancel();
        self.effect_flag().is_some_and(|f| f.is_set())
    }

    /// A root without a deadline that carries a request's effect flag, as an admitted
    /// request's scope does; for the loom models.
    #[cfg(any(test, feature = "__test-hooks"))]
    #[doc(hidden)]
    pub fn __request_root() -> Scope {
        let flag = Arc::new(EffectFlag::new());
        Scope::root_with_context(None, None, None, None, Some(flag))
    }

    /// [`cancel_then_effect`](Self::cancel_then_effect), for the loom models.
    #[cfg(any(test, feature = "__test-hooks"))]
    #[doc(hidden)]
    pub fn __cancel_then_effect(&self) -> bool {
        self.cancel_then_effect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use crate::{ChildSpec, Scope};

    fn post() -> ChildSpec {
        ChildSpec::side_effecting("post", "post-1")
    }

    #[test]
    fn an_effectful_dispatch_anywhere_in_the_request_sets_it_a_read_only_one_does_not() {
        let request = Scope::__request_root();
        let child = request.child().build().unwrap();
        let get = child.register(ChildSpec::read_only("get")).unwrap();
        get.dispatch().unwrap().succeed();
        let t = child.register(post()).unwrap();
        assert!(!request.effect_flag().unwrap().is_set(), "registered only");
        t.dispatch().unwrap().succeed();
        // Once set, it stays set (a receipt does not clear it), and the answer reads it after
        // its cancel.
        assert!(request.cancel_then_effect());
        assert!(request.is_cancelled());
    }

    #[test]
    fn a_refused_dispatch_does_not_set_it() {
        let request = Scope::__request_root();
        let t = request.register(post()).unwrap();
        request.cancel();
        assert!(t.dispatch().unwrap_err().is_cancelled());
        assert!(!request.cancel_then_effect());

        // An attempt's own ticket (a retry's child scope) refused by a closed scope.
        let request = Scope::__request_root();
        request.close();
        assert!(request.__child_dispatched(&post()).is_err());
        assert!(!request.cancel_then_effect());
    }

    #[test]
    fn an_attempts_own_ticket_is_a_dispatch() {
        let request = Scope::__request_root();
        let (_attempt, ticket) = request
            .__child_dispatched(&ChildSpec::read_only("get"))
            .unwrap();
        ticket.succeed();
        assert!(!request.effect_flag().unwrap().is_set());
        let (_attempt, ticket) = request.__child_dispatched(&post()).unwrap();
        assert!(request.effect_flag().unwrap().is_set());
        ticket.succeed();
    }

    #[tokio::test(start_paused = true)]
    async fn a_shielded_cleanup_is_the_requests_a_detached_root_is_not() {
        let request = Scope::__request_root();
        let detached = request.detach(Duration::from_secs(5));
        assert!(detached.effect_flag().is_none());
        detached
            .register(post())
            .unwrap()
            .dispatch()
            .unwrap()
            .succeed();
        assert!(!request.effect_flag().unwrap().is_set());

        // The request is being torn down (it still has work, so a cleanup may start).
        let work = request.register(ChildSpec::read_only("handler")).unwrap();
        request.cancel();
        let cleanup = request
            .shield(Duration::from_millis(50), async {
                let call = Scope::current().register(post()).unwrap();
                call.dispatch().unwrap().succeed();
            })
            .unwrap();
        drop(work);
        cleanup.await.unwrap();
        assert!(request.cancel_then_effect());
    }

    #[test]
    fn a_scope_outside_any_request_has_none() {
        let plain = Scope::new();
        plain
            .register(post())
            .unwrap()
            .dispatch()
            .unwrap()
            .succeed();
        assert!(plain.effect_flag().is_none());
        assert!(!plain.cancel_then_effect());
    }
}
