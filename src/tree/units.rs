//! Work units: taking and giving back the units of a node's state word, the dispatch
//! compare-and-swap, and going idle and quiet up the tree (invariants 2, 3, 6).

use super::waiters::wake_quiet;
use super::{ancestors, refusal, Node, Refused, State, ACTIVE_MASK, STARTED};
use crate::panic::Caught;
use crate::sync::Ordering;

/// Takes one work unit in `node` (a ticket, a guard). Fails once the watermark is closed
/// (invariant 3). A node going from 0 to 1 units first takes a unit of its parent.
///
/// Returns the generation the unit was taken in: the one of the state word the successful
/// CAS replaced (a cancel right after it bumps the generation, and must not be attributed to
/// this registration).
pub(crate) fn take_unit<X, R>(node: &Node<X, R>) -> Result<u64, Refused> {
    loop {
        let s = node.state();
        if s.is_closed() {
            return Err(refusal(node, s));
        }
        if s.active() == ACTIVE_MASK {
            // Four billion live units in one scope: refuse rather than overflow into CLOSED.
            return Err(Refused::Closed);
        }
        let need_parent = s.active() == 0;
        if need_parent {
            if let Some(p) = node.parent_node() {
                take_unit(p)?;
            }
        }
        // AcqRel: Acquire pairs with close/cancel (we fail if they came first); Release makes
        // the registration visible to a quiesce that reads the count afterwards.
        match node.state.compare_exchange(
            s.0,
            (s.0 + 1) | STARTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Ok(s.generation()),
            Err(_) => {
                if need_parent {
                    if let Some(p) = node.parent_node() {
                        release_unit(p);
                    }
                }
            }
        }
    }
}

/// Gives back a unit taken with [`take_unit`]; wakes quiesce waiters when the node becomes quiet
/// and passes the release up when the node becomes idle.
///
/// Inlined, with the rest out of line: most releases leave other units in the node, and a
/// bigger body here (the panic bookkeeping of the rest) made the compiler stop inlining the
/// callers' own hot paths.
#[inline]
pub(crate) fn release_unit<X, R>(node: &Node<X, R>) {
    let prev = give_back(node);
    if prev.active() == 1 {
        went_idle_then_resume(node, prev);
    }
}

/// [`release_unit`], keeping the panic of a `quiesce()`'s waker in `caught` (for a step that
/// releases several units, a quarantine, and must go on to its end).
pub(super) fn release_unit_caught<X, R>(node: &Node<X, R>, caught: &mut Caught) {
    let prev = give_back(node);
    if prev.active() == 1 {
        went_idle(node, prev, caught);
    }
}

/// Takes one unit off `n`'s count; returns the state before.
#[inline]
fn give_back<X, R>(n: &Node<X, R>) -> State {
    // AcqRel: Release publishes the receipt counted before this release to whoever observes
    // quiet (invariant 6); Acquire sees a concurrent close so exactly one side wakes.
    let prev = State(n.state.fetch_sub(1, Ordering::AcqRel));
    debug_assert!(prev.active() > 0, "unit released twice");
    prev
}

/// [`went_idle`], then the panic of a `quiesce()`'s waker comes out, once every release up
/// the tree is done.
#[inline(never)]
fn went_idle_then_resume<X, R>(node: &Node<X, R>, prev: State) {
    let mut caught = Caught::default();
    went_idle(node, prev, &mut caught);
    caught.resume();
}

/// `node` just gave back its last unit (`prev`: its state before): wakes its `quiesce()`s if
/// it is closed (now quiet), and gives back its unit in its parent, and so on up while each
/// node becomes idle. A waker's panic is kept in `caught`.
fn went_idle<X, R>(node: &Node<X, R>, prev: State, caught: &mut Caught) {
    if prev.is_closed() {
        wake_quiet(node, caught);
    }
    // Each node on the way with its parent.
    for (n, p) in ancestors(node).zip(ancestors(node).skip(1)) {
        if let Some(roll_up) = n.boundary {
            if p.state().is_closed() {
                // Idle while its parent is closed, so for good: its report goes into the
                // parent's before the parent's unit does (see the module docs).
                roll_up(n, p);
            }
        }
        let prev = give_back(p);
        if prev.active() != 1 {
            return;
        }
        if prev.is_closed() {
            wake_quiet(p, caught);
        }
    }
}

/// The dispatch compare-and-swap (invariant 2): succeeds only if `node`'s generation is still
/// `seen` and its watermark is open. A successful CAS writes the same value back, which puts it
/// in the modification order of the state word relative to every cancel.
pub(crate) fn dispatch<X, R>(node: &Node<X, R>, seen: u64) -> Result<(), Refused> {
    let mut s = node.state();
    loop {
        if s.is_cancelled() || s.is_closed() {
            return Err(refusal(node, s));
        }
        if s.generation() != seen {
            return Err(Refused::StaleGeneration);
        }
        // AcqRel: Release so a later cancel (which Acquires) happens-after this dispatch and
        // reaches whatever the dispatcher set up before it.
        match node
            .state
            .compare_exchange_weak(s.0, s.0, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Ok(()),
            Err(actual) => s = State(actual),
        }
    }
}

/// Takes a unit of `node` as [`take_unit`] does while its watermark is open; once it is closed,
/// only while the node is not quiet (it has units: work it already has is still running, and
/// the new unit is part of that work), and not at all once it is cancelled if
/// `refuse_cancelled`. Taking a unit where there are units already needs no parent unit and
/// cannot break a quiescence that has not been reached (invariant 6). Returns the generation
/// the unit was taken in.
pub(crate) fn take_unit_while_busy<X, R>(
    node: &Node<X, R>,
    refuse_cancelled: bool,
) -> Result<u64, Refused> {
    loop {
        let s = node.state();
        if !s.is_closed() {
            match take_unit(node) {
                // Closed (or cancelled) since the read: decide again, as a closed node.
                Err(_) if node.state().is_closed() => continue,
                taken => return taken,
            }
        }
        if (refuse_cancelled && s.is_cancelled()) || s.active() == 0 || s.active() == ACTIVE_MASK {
            return Err(refusal(node, s));
        }
        if node
            .state
            .compare_exchange(s.0, s.0 + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Ok(s.generation());
        }
    }
}
