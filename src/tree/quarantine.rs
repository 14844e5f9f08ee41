//! Quarantine: the children of a subtree that have no receipt yet get `Quarantined` receipts
//! (a ticket never dispatched, `Cancelled`), and give back their units (invariants 5, 6).

use super::cancel::cancel_then;
use super::receipts::{
    count_receipt, end_own, Kind, OWN_DISPATCHED, OWN_NONE, OWN_QUARANTINED, OWN_RECORDED,
};
use super::registry::push_children;
use super::units::release_unit_caught;
use super::{InFlight, Node, TicketState};
use crate::panic::Caught;
use crate::sync::{Arc, Ordering};

/// Quarantines every ticket of `node`'s subtree that has no receipt yet: each gets a
/// `Quarantined` receipt (its record lists it) and gives back its unit; the late real outcome is
/// then ignored (invariant 5). Spawned tasks are recorded with `task_info`. A ticket never
/// dispatched gets a `Cancelled` receipt instead (it cannot be dispatched any more, so it
/// ran nothing and no effect of it is unknown). Returns how many were quarantined.
///
/// If `node` is cancelled, its cancel first reaches the whole subtree (a walk of its own, as
/// a repeated `cancel` makes): the cancel that preceded this quarantine may still be walking
/// down (a zero grace period, or a walk that stalled). Quarantining the own ticket of a
/// closed child before that walk reached it would give back the child's last unit and make
/// it quiet, and a quiet node is never cancelled afterwards (invariant 6): its body (a retry
/// attempt's run) would wait on for a cancel that never comes (loom model 38). That walk may
/// be the first to reach a child, and so run its `on_cancel` callbacks: they run after the
/// quarantine, so that one that panics (the panic comes out of this call) cannot skip it
/// (loom model 41).
pub(crate) fn quarantine_subtree<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
) -> usize {
    quarantine_subtree_then(node, task_info, stamp, None)
}

/// [`quarantine_subtree`], putting into `in_progress` what each child of the subtree is
/// whose receipt someone else won (its owner, or another quarantine: the subtree's own
/// `quiesce()`) and may not have recorded yet: what a caller that reads the subtree's records
/// right after (a quarantined shield's stop, noting the effects its cleanup left open) must
/// take as possibly unknown, since that record may land after its read.
///
/// Found during the walk: a ticket still listed in flight though decided (its owner unlists it
/// under the shard lock after it has counted the receipt and written its records), a node
/// whose own ticket ended without `OWN_RECORDED` (set, Release, after the records). One that
/// is neither has its records written before the walk passed it (through that shard lock, or
/// that flag read with Acquire), so a read of the records after this call finds them. A
/// receipt that was in fact recorded, or that lists no effect, is put in too: the caller
/// filters, and a false alarm is the price of never missing one (loom models 43–45).
pub(crate) fn quarantine_subtree_noting<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
    in_progress: &mut Vec<R>,
) -> usize {
    quarantine_subtree_then(node, task_info, stamp, Some(in_progress))
}

fn quarantine_subtree_then<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
    in_progress: Option<&mut Vec<R>>,
) -> usize {
    let quarantine = || {
        let mut caught = Caught::default();
        let n = quarantine_walk(node, task_info, stamp, &mut caught, in_progress);
        (n, caught)
    };
    // A waker's panic comes out once the whole quarantine is done (after the cancel walk's
    // callbacks, if one of those panics first).
    let (n, caught) = match node.cause() {
        Some(cause) => cancel_then(node, cause, stamp, quarantine).1,
        None => quarantine(),
    };
    caught.resume();
    n
}

/// The walk of [`quarantine_subtree`], once the subtree is cancelled.
fn quarantine_walk<X, R: Clone>(
    node: &Arc<Node<X, R>>,
    task_info: &R,
    stamp: u64,
    caught: &mut Caught,
    mut in_progress: Option<&mut Vec<R>>,
) -> usize {
    let mut work = vec![node.clone()];
    let mut n_quarantined = 0;
    while let Some(n) = work.pop() {
        // Made if it does not exist yet: a ticket whose unit was taken before the cancel may
        // be about to make it and list itself, and must find it marked quarantined (see
        // `InFlight::list_ticket`). Only a quarantine pays for it.
        let in_flight = n.in_flight.get_or_init();
        n_quarantined += quarantine_in_flight(
            &n,
            in_flight,
            task_info,
            stamp,
            caught,
            in_progress.as_deref_mut(),
        );
        let first_child = work.len();
        push_children(&n, &mut work);
        // Children that are tickets of `n` (see `new_child_dispatched`), with no lock held.
        for child in &work[first_child..] {
            if quarantine_own(child, stamp, caught) {
                n_quarantined += 1;
            } else if let Some(in_progress) = in_progress.as_deref_mut() {
                in_progress.extend(own_in_progress(child).cloned());
            }
        }
    }
    n_quarantined
}

/// Quarantines `child`'s own ticket in its parent if it has no receipt yet.
fn quarantine_own<X, R: Clone>(child: &Node<X, R>, stamp: u64, caught: &mut Caught) -> bool {
    let Some(info) = &child.own_info else {
        return false;
    };
    // The ticket's unit of `child`: its parent's goes with the child's last (the quarantine
    // gives back the other units of the subtree as it walks it; guards are waited for).
    end_own(
        child,
        OWN_QUARANTINED,
        Kind::Quarantined,
        Some(info),
        &|| stamp,
        Some(caught),
    )
}

/// What `child` is as its parent's ticket, if that ticket's receipt was won and is not
/// recorded yet (see [`quarantine_subtree_noting`]).
fn own_in_progress<X, R>(child: &Node<X, R>) -> Option<&R> {
    // Acquire: pairs with the Release store of `OWN_RECORDED` in `end_own`.
    let own = child.own.load(Ordering::Acquire);
    let decided = own != OWN_NONE && own != OWN_DISPATCHED;
    (decided && own & OWN_RECORDED == 0)
        .then_some(child.own_info.as_ref())
        .flatten()
}

/// Quarantines the children in flight in `n` (see [`quarantine_subtree`]); returns how many.
/// Tickets found listed but decided by someone else go into `in_progress`, if given (see
/// [`quarantine_subtree_noting`]).
fn quarantine_in_flight<X, R: Clone>(
    n: &Node<X, R>,
    in_flight: &InFlight<R>,
    task_info: &R,
    stamp: u64,
    caught: &mut Caught,
    mut in_progress: Option<&mut Vec<R>>,
) -> usize {
    let mut count = 0;
    let (cells, tasks) = in_flight.take_for_quarantine(caught);
    for cell in cells {
        let Some(was) = cell.finish_as(TicketState::Quarantined) else {
            // Decided, and still listed: its receipt may not be recorded yet.
            if let Some(in_progress) = in_progress.as_deref_mut() {
                in_progress.push(cell.info());
            }
            continue;
        };
        if was == TicketState::Dispatched {
            let info = [cell.info()];
            count_receipt(n, Kind::Quarantined, &info, Some(cell.started()), &|| stamp);
            count += 1;
        } else {
            // Never dispatched, and now it never can be: it sent nothing and holds
            // nothing of the scope's, so it is not listed as quarantined work, and a
            // side-effecting one is no unknown effect (that was a false alarm).
            count_receipt(n, Kind::Cancelled, &[], None, &|| stamp);
        }
        // An owner that waits for it is told (with no lock held) before its unit goes
        // back, which may make the node quiet: a shield's waker cancels the shield's own
        // scope right here, so that nothing it started is still open once `quiesce()`
        // resolves (invariant 6).
        cell.wake_quarantined(caught);
        in_flight.unlist_ticket(cell.key());
        // A `quiesce()` waker's panic (the release may make `n` quiet) is kept: the
        // quarantine goes on to its end.
        release_unit_caught(n, caught);
    }
    // Tasks taken out of the list or the unlisted count are decided: their late receipts (and
    // listings) find nothing (invariant 5).
    for _ in 0..tasks {
        let info = std::slice::from_ref(task_info);
        count_receipt(n, Kind::Quarantined, info, Some(0), &|| stamp);
        release_unit_caught(n, caught);
        count += 1;
    }
    count
}
