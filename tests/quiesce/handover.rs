//! A `quiesce()` waiting while cancels come below it: it is handed each busy cancel once the
//! cancel walk is done and looks through that scope's subtree only, so the shorter grace
//! period of a scope below a handed one holds; no cancel is lost (wake-ups, drains, two
//! threads); invariant 6 and exact counts with overlapping grace ends. (Handed scopes that
//! finish and go are freed at once: `memory`.) loom models of the handover are in
//! `src/tree/loom_handover.rs`.

use std::time::Duration;

use cancel_scope::{Lifecycle, Report, Scope};
use futures::FutureExt;
use tokio::time::Instant;

use crate::support::quiesce::*;

// ------------------------------------------------------------------------------------------
// The shorter grace period of a scope below a handed-over cancel.

/// A closed top's `quiesce()` that waits *before* a busy cancel of `mid` (grace 1 h) is
/// handed `mid` once the cancel has reached `inner` (grace 10 ms) below it, and looks through
/// `mid`'s subtree: `inner`'s stuck work is quarantined at `inner`'s grace end (10 ms), as
/// `mid.quiesce()` does and as a `top.quiesce()` started after the cancel does. (Before, the
/// waiting one used `mid`'s 1 h.) Server shape: the process root's drain keeps the DB call
/// scope's grace, not the request scope's.
#[tokio::test(start_paused = true)]
async fn a_waiting_quiesce_handed_a_parents_cancel_keeps_the_shorter_grace_below_it() {
    let mut got = Vec::new();
    for waits_before in [false, true] {
        let top = Scope::new();
        let mid = top.child().grace(secs(3600)).build().unwrap();
        let inner = mid.child().grace(ms(10)).build().unwrap();
        let _work = stuck(&inner, "db call");
        top.close();
        let early = if waits_before {
            Some(waiting_quiesce(&top).await)
        } else {
            None
        };
        let start = Instant::now();
        mid.cancel();
        let q = match early {
            Some(q) => q,
            None => waiting_quiesce(&top).await,
        };
        let report = q.await.unwrap();
        assert_eq!(report.quarantined(), 1, "{report}");
        got.push((waits_before, start.elapsed()));
    }
    assert_eq!(
        got,
        [(false, ms(10)), (true, ms(10))],
        "(quiesce waited before the cancel, time to quiet)"
    );
}

/// The same when the handed scope's grace period never ends (`grace(Duration::MAX)`: "wait
/// for the receipts"): the handed `mid` gets no end, but the 10 ms grace of `inner` below it
/// holds, whether the `quiesce()` waited before the cancel or started after it. (Before, one
/// that waited never resolved.)
#[tokio::test(start_paused = true)]
async fn a_waiting_quiesce_handed_a_never_ending_grace_still_ends_the_shorter_one_below() {
    let mut got = Vec::new();
    for waits_before in [false, true] {
        let top = Scope::new();
        let mid = top.child().grace(Duration::MAX).build().unwrap();
        let inner = mid.child().grace(ms(10)).build().unwrap();
        let _work = stuck(&inner, "db call");
        top.close();
        let early = if waits_before {
            Some(waiting_quiesce(&top).await)
        } else {
            None
        };
        let start = Instant::now();
        mid.cancel();
        let q = match early {
            Some(q) => q,
            None => waiting_quiesce(&top).await,
        };
        let resolved = tokio::time::timeout(secs(24 * 3600), q).await.is_ok();
        got.push((waits_before, resolved.then(|| start.elapsed())));
    }
    assert_eq!(
        got,
        [(false, Some(ms(10))), (true, Some(ms(10)))],
        "(quiesce waited before the cancel, time to quiet; None: not within a day)"
    );
}

/// A cancelled scope's own `quiesce()` polled *during* its cancel walk (as another worker of
/// a multi-thread runtime can: made deterministic here by a waker that polls when woken, woken
/// by the parent's cancel before the walk goes down) still keeps the child's shorter grace
/// (10 ms, not the parent's 1 h): it is handed its scope only once the walk is done, and then
/// looks through the whole cancelled subtree. (Before, it was woken and looked before the
/// walk reached the child.)
#[tokio::test(start_paused = true)]
async fn a_quiesce_polled_during_its_scopes_cancel_walk_keeps_the_childs_shorter_grace() {
    let parent = Scope::new().child().grace(secs(3600)).build().unwrap();
    let child = parent.child().grace(ms(10)).build().unwrap();
    let _work = stuck(&child, "stuck");
    let w = FirstPollOnWake::new(&parent, &child);
    assert!(w.poll_now().is_pending(), "waits (registered)");
    // The same waker waits for the parent's cancel, which wakes it before the walk down (the
    // quiesce itself is woken after the walk): the quiesce is polled during the walk.
    let _cancelled = w.arm_on_cancel_of(&parent);
    let start = Instant::now();
    parent.cancel();
    assert_eq!(
        *w.child_seen_cancelled.lock().unwrap(),
        Some(false),
        "the early poll ran before the walk reached the child"
    );
    let report = w.report().await;
    assert_eq!(report.quarantined(), 1, "{report}");
    assert_eq!(start.elapsed(), ms(10), "{report}");
}

// ------------------------------------------------------------------------------------------
// Wake-ups and handovers.

/// A waiter that was handed a descendant and not polled since is drained by its scope's own
/// idle cancel (`mark_cancelled`, `prev.active() == 0`): the handed node goes with it, and the
/// quiesce resolves with the right report.
#[tokio::test(start_paused = true)]
async fn a_waiter_drained_by_an_idle_cancel_with_handed_nodes_resolves() {
    let s = Scope::new();
    let child = s.child().grace(ms(10)).build().unwrap();
    let work = stuck(&child, "w");
    let mut q = s.quiesce();
    assert!((&mut q).now_or_never().is_none(), "registered");
    child.cancel(); // handed to `q`'s waiter, which is not polled
    work.succeed();
    drop(child); // quiet, unlinked; only the waiter's list holds the node
    s.cancel(); // idle: drains the waiter (and the handed node)
    let report = q.now_or_never().expect("quiet");
    assert_eq!(report.succeeded(), 1, "{report}");
    assert_eq!(report.state(), Lifecycle::CancelledStable);
}

/// Two `quiesce()` futures on one scope and one on its ancestor, one of them dropped and made
/// again half way: every one quarantines the stuck work at the child's grace end, each ticket
/// is quarantined once, the reports agree and never change (invariant 6).
#[tokio::test(start_paused = true)]
async fn nested_and_repeated_quiesces_quarantine_once_and_agree() {
    let top = Scope::new();
    let mid = top.child().build().unwrap();
    let kids: Vec<_> = (0..3)
        .map(|i| {
            let c = mid.child().grace(ms(10 * (i + 1))).build().unwrap();
            let w = stuck(&c, "w");
            (c, w)
        })
        .collect();
    top.close();
    let start = Instant::now();
    let a = waiting_quiesce(&top).await;
    let b = waiting_quiesce(&mid).await;
    let mut dropped = mid.quiesce();
    assert!((&mut dropped).now_or_never().is_none());
    kids[0].0.cancel();
    drop(dropped); // took a handover, gone
    let c = waiting_quiesce(&mid).await;
    kids[1].0.cancel();
    tokio::task::yield_now().await;
    kids[2].0.cancel();
    let (ra, rb, rc) = (a.await.unwrap(), b.await.unwrap(), c.await.unwrap());
    assert_eq!(start.elapsed(), ms(30));
    assert_eq!(ra.quarantined(), 3, "{ra}");
    assert_eq!(rb, rc);
    assert_eq!(rb.quarantined(), 3, "{rb}");
    tokio::time::sleep(secs(5)).await;
    assert_eq!(top.quiesce().await, ra, "the report never changes");
    drop(kids);
}

/// A child cancelled first (grace 10 ms) under a parent cancelled later (grace 20 ms): both
/// entries expire, the child's ticket is quarantined once, the parent's own at its end; counts
/// and the quarantined list are exact.
#[tokio::test(start_paused = true)]
async fn overlapping_grace_ends_quarantine_each_ticket_once() {
    let top = Scope::new();
    let parent = top.child().grace(ms(20)).build().unwrap();
    let child = parent.child().grace(ms(10)).build().unwrap();
    let _p = stuck(&parent, "parent work");
    let _c = stuck(&child, "child work");
    top.close();
    let q = waiting_quiesce(&top).await;
    let start = Instant::now();
    child.cancel();
    tokio::time::sleep(ms(5)).await;
    parent.cancel();
    let report = q.await.unwrap();
    assert_eq!(start.elapsed(), ms(25), "{report}");
    assert_eq!(report.quarantined(), 2, "{report}");
    assert_eq!(report.total(), 2, "{report}");
    let mut names: Vec<_> = report
        .quarantined_children()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["child work", "parent work"]);
}

/// Two threads: cancels of busy child scopes race the first poll of `quiesce()` futures on
/// the closed top, on a middle scope, and a dropped-and-made-again one; each round must end
/// (no lost handover), with every stuck ticket quarantined once and a stable report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handovers_racing_first_polls_on_two_threads_lose_no_cancel() {
    let rounds: usize = std::env::var("STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    for round in 0..rounds {
        let top = Scope::new();
        let mid = top.child().build().unwrap();
        let kids: Vec<_> = (0..4)
            .map(|_| {
                let c = mid.child().grace(ms(1)).build().unwrap();
                let g = c.child().grace(ms(1)).build().unwrap();
                let w = (stuck(&c, "c"), stuck(&g, "g"));
                (c, g, w)
            })
            .collect();
        top.close();
        let cancels: Vec<Scope> = kids
            .iter()
            .enumerate()
            .map(|(i, (c, g, _))| if (round + i) % 2 == 0 { c } else { g }.clone())
            .collect();
        let canceller = tokio::spawn(async move {
            for (i, s) in cancels.iter().enumerate() {
                s.cancel();
                if i % 2 == 1 {
                    tokio::task::yield_now().await;
                }
            }
        });
        let on_top = tokio::spawn({
            let top = top.clone();
            async move { top.quiesce().await }
        });
        let on_mid = tokio::spawn({
            let mid = mid.clone();
            async move {
                let mut first = mid.quiesce();
                let _ = (&mut first).now_or_never();
                drop(first);
                mid.quiesce().await
            }
        });
        canceller.await.unwrap();
        // The stuck work of cancelled scopes is held until the quiesces resolve: only a
        // quarantine (after a look or a handover) can end it. A child whose grandchild alone
        // was cancelled finishes its own ticket.
        let deadline = Duration::from_secs(10);
        let mut held = Vec::new();
        for (c, g, (wc, wg)) in kids {
            if c.is_cancelled() {
                held.push(wc);
            } else {
                wc.succeed();
            }
            held.push(wg);
            drop((c, g));
        }
        let n_held = held.len() as u64;
        let report = tokio::time::timeout(deadline, on_top)
            .await
            .unwrap_or_else(|_| panic!("round {round}: top's quiesce never resolved"))
            .unwrap();
        let mid_report = tokio::time::timeout(deadline, on_mid)
            .await
            .unwrap_or_else(|_| panic!("round {round}: mid's quiesce never resolved"))
            .unwrap();
        assert_eq!(report.total(), 8, "round {round}: {report}");
        assert_eq!(report.quarantined(), n_held, "round {round}: {report}");
        drop(held); // late: ignored
                    // The same work, quarantined once: the lists of the two scopes can differ in order
                    // only (two quarantines on two threads record into both, one after the other).
        let summary = |r: &Report| {
            let mut listed: Vec<_> = r
                .quarantined_children()
                .iter()
                .map(|c| format!("{c:?}"))
                .collect();
            listed.sort();
            (r.state(), r.total(), r.quarantined(), listed)
        };
        assert_eq!(summary(&mid_report), summary(&report), "round {round}");
        assert_eq!(top.quiesce().await, report, "round {round}: stable");
    }
}
