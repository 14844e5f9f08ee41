//! loom models of the cancel walk: concurrent cancels, cancel racing child creation, and child
//! handles dropped while the parent is cancelled (docs/design.md invariants 1, 3 and 7).
#![cfg(loom)]

use std::sync::Arc as StdArc;

use cancel_scope::{Cause, ChildSpec, Lifecycle, Scope};
use cancel_scope_loom_tests::{model, model_bounded, THREE_THREAD_PREEMPTIONS};
use loom::thread;

/// The cause a descendant of a scope cancelled with `cause` must carry.
fn inherited(cause: &Cause) -> Cause {
    Cause::ParentCancelled(StdArc::new(cause.origin().clone()))
}

/// Model 1: two threads cancel the same root with different causes.
///
/// Invariant 1: the first cause wins everywhere (exactly one call reports it cancelled, the
/// root keeps that cause, every descendant carries `ParentCancelled(origin)`), and each
/// `cancel` returns only once every descendant is cancelled — also the one that lost.
#[test]
fn concurrent_cancels_first_cause_wins() {
    model("concurrent_cancels_first_cause_wins", || {
        let root = Scope::new();
        let a = root.child().build().unwrap();
        let a1 = a.child().build().unwrap();

        let canceller = |cause: Cause| {
            let (root, a, a1) = (root.clone(), a.clone(), a1.clone());
            thread::spawn(move || {
                let won = root.cancel_because(cause.clone());
                // Invariant 1 (and `Scope::cancel`'s contract): when cancel returns, the whole
                // subtree is cancelled, whoever won.
                assert!(
                    a.is_cancelled(),
                    "cancel returned before a child was cancelled"
                );
                assert!(
                    a1.is_cancelled(),
                    "cancel returned before a grandchild was cancelled"
                );
                let seen = root.cause().expect("cancelled root has a cause");
                (won, cause, seen)
            })
        };
        let t1 = canceller(Cause::cancelled("one"));
        let t2 = canceller(Cause::ClientGone);
        let (won1, cause1, seen1) = t1.join().unwrap();
        let (won2, cause2, seen2) = t2.join().unwrap();

        // Invariant 1: exactly one call cancelled it, and its cause is the one everybody sees.
        assert!(won1 ^ won2, "exactly one cancel wins ({won1}, {won2})");
        let winner = if won1 { cause1 } else { cause2 };
        let final_cause = root.cause().unwrap();
        assert_eq!(final_cause, winner);
        assert_eq!(seen1, winner, "the cause changed after it was set");
        assert_eq!(seen2, winner, "the cause changed after it was set");
        assert_eq!(a.cause(), Some(inherited(&winner)));
        assert_eq!(a1.cause(), Some(inherited(&winner)));
        // One cancel, one generation bump.
        assert_eq!(root.generation(), 1);
        assert_eq!(a.generation(), 1);
    });
}

/// Model 1 (siblings): two sibling subtrees cancelled at once with different causes.
///
/// Invariant 1: cancelling a child never touches its parent or its siblings; each subtree
/// carries its own first cause.
#[test]
fn sibling_cancels_leave_parent_alone() {
    model("sibling_cancels_leave_parent_alone", || {
        let root = Scope::new();
        let a = root.child().build().unwrap();
        let a1 = a.child().build().unwrap();
        let b = root.child().build().unwrap();

        let ta = {
            let a = a.clone();
            thread::spawn(move || {
                assert!(a.cancel_because(Cause::DeadlineExceeded));
            })
        };
        let tb = {
            let b = b.clone();
            thread::spawn(move || {
                assert!(b.cancel_because(Cause::ClientGone));
            })
        };
        ta.join().unwrap();
        tb.join().unwrap();

        // Invariant 1: the parent was not touched by either child's cancel.
        assert!(!root.is_cancelled());
        assert!(!root.is_closed());
        assert_eq!(root.cause(), None);
        assert_eq!(root.generation(), 0);
        // ... and each subtree has its own cause.
        assert_eq!(a.cause(), Some(Cause::DeadlineExceeded));
        assert_eq!(a1.cause(), Some(inherited(&Cause::DeadlineExceeded)));
        assert_eq!(b.cause(), Some(Cause::ClientGone));
        // The parent still takes children.
        assert!(root.child().build().is_ok());
    });
}

/// Model 1 (nested): a child is cancelled while its parent is cancelled.
///
/// Invariant 1: the child keeps whichever cause reached it first (its own, or its parent's as
/// `ParentCancelled`), its descendants inherit the child's origin, the parent keeps its own
/// cause, and each call returns only once its subtree is cancelled.
#[test]
fn child_cancel_racing_parent_cancel() {
    model("child_cancel_racing_parent_cancel", || {
        let root = Scope::new();
        let a = root.child().build().unwrap();
        let a1 = a.child().build().unwrap();

        let ta = {
            let (a, a1) = (a.clone(), a1.clone());
            thread::spawn(move || {
                a.cancel_because(Cause::DeadlineExceeded);
                assert!(a1.is_cancelled(), "cancel returned before its subtree was");
            })
        };
        let tr = {
            let (root, a, a1) = (root.clone(), a.clone(), a1.clone());
            thread::spawn(move || {
                assert!(root.cancel_because(Cause::ClientGone));
                assert!(a.is_cancelled(), "cancel returned before its subtree was");
                assert!(a1.is_cancelled(), "cancel returned before its subtree was");
            })
        };
        ta.join().unwrap();
        tr.join().unwrap();

        assert_eq!(root.cause(), Some(Cause::ClientGone));
        let a_cause = a.cause().unwrap();
        assert!(
            a_cause == Cause::DeadlineExceeded || a_cause == inherited(&Cause::ClientGone),
            "child cause {a_cause:?}"
        );
        // Invariant 1: first cause wins everywhere below the child.
        assert_eq!(a1.cause(), Some(inherited(&a_cause)));
    });
}

/// Model 2: a child (and a grandchild) is created while the root is cancelled.
///
/// Invariants 1 and 3: creation either fails with the cancel as its error, or the new scope
/// ends up cancelled with `ParentCancelled(origin)`: never a live child under a cancelled
/// parent.
#[test]
fn cancel_racing_child_creation() {
    model("cancel_racing_child_creation", || {
        let root = Scope::new();
        let a = root.child().build().unwrap();

        let creator = {
            let (root, a) = (root.clone(), a.clone());
            thread::spawn(move || {
                let child = root.child().build();
                let grandchild = a.child().build();
                (child, grandchild)
            })
        };
        let canceller = {
            let root = root.clone();
            thread::spawn(move || root.cancel_with("stop"))
        };
        let (child, grandchild) = creator.join().unwrap();
        canceller.join().unwrap();

        let origin = Cause::cancelled("stop");
        for made in [child, grandchild] {
            match made {
                Ok(scope) => {
                    // Invariant 1: the cancel reached the new scope.
                    assert!(scope.is_cancelled(), "live child under a cancelled parent");
                    assert_eq!(scope.cause(), Some(inherited(&origin)));
                    // Invariant 3: and it refuses work.
                    assert!(scope.child().build().unwrap_err().is_cancelled());
                }
                // Invariant 3: refused, with the cancel as the reason.
                Err(e) => assert!(e.is_cancelled(), "unexpected error {e:?}"),
            }
        }
    });
}

/// Model 2 (close): a child is created while the root's watermark is closed (no cancel).
///
/// Invariant 3: the child is refused as closed, or it is created and then closed by the walk.
#[test]
fn close_racing_child_creation() {
    model("close_racing_child_creation", || {
        let root = Scope::new();
        let creator = {
            let root = root.clone();
            thread::spawn(move || root.child().build())
        };
        root.close();
        match creator.join().unwrap() {
            Ok(child) => {
                assert!(child.is_closed(), "open child under a closed parent");
                assert!(!child.is_cancelled());
                assert!(child.child().build().unwrap_err().is_closed());
            }
            Err(e) => assert!(e.is_closed(), "unexpected error {e:?}"),
        }
    });
}

/// Model 22 (two closes): the root is closed on two threads at once, with a child below.
///
/// Invariant 3: once a `close()` has returned, the whole subtree refuses new work — also for
/// the call that found the root closed already (the other may not have reached the child yet).
#[test]
fn second_close_returns_with_the_subtree_closed() {
    model("second_close_returns_with_the_subtree_closed", || {
        let root = Scope::new();
        let child = root.child().build().unwrap();
        let closer = {
            let (root, child) = (root.clone(), child.clone());
            thread::spawn(move || {
                root.close();
                assert!(child.is_closed(), "close returned with an open child");
            })
        };
        root.close();
        assert!(child.is_closed(), "close returned with an open child");
        closer.join().unwrap();
    });
}

/// Model 4: the last handle of a child is dropped while its parent is cancelled.
///
/// Invariant 7 (and loom's leak check): the child is unlinked exactly once whatever the
/// interleaving; nothing leaks, nothing is freed twice, and the parent ends with no live
/// children. Two clones of the child are dropped on two threads to race the handle count too.
#[test]
fn child_drop_racing_parent_cancel() {
    model("child_drop_racing_parent_cancel", || {
        let root = Scope::new();
        let child = root.child().build().unwrap();
        let clone = child.clone();
        assert_eq!(root.__live_children(), 1);

        let dropper = thread::spawn(move || drop(clone));
        let canceller = {
            let root = root.clone();
            thread::spawn(move || root.cancel())
        };
        drop(child);
        dropper.join().unwrap();
        canceller.join().unwrap();

        // Invariant 7: unlinked once, memory back to flat.
        assert_eq!(root.__live_children(), 0);
        assert!(root.is_cancelled());
        // loom checks at the end of every execution that every node (a loom `Arc`) was freed.
    });
}

/// Model 4 (a middle scope): the last handle of a scope that still has a live child is
/// dropped while the root is cancelled.
///
/// Invariant 1: cancelling a node cancels *every* descendant, including one whose parent
/// scope handle is gone. Invariant 7: once the grandchild is dropped too, both are unlinked
/// and freed.
#[test]
fn middle_drop_racing_root_cancel() {
    model("middle_drop_racing_root_cancel", || {
        let root = Scope::new();
        let middle = root.child().build().unwrap();
        let leaf = middle.child().build().unwrap();

        let dropper = thread::spawn(move || drop(middle));
        let canceller = {
            let root = root.clone();
            thread::spawn(move || root.cancel_with("stop"))
        };
        dropper.join().unwrap();
        canceller.join().unwrap();

        // Invariant 1: the grandchild is reached although its parent's handle is gone.
        assert!(
            leaf.is_cancelled(),
            "grandchild missed by its root's cancel"
        );
        assert_eq!(leaf.cause(), Some(inherited(&Cause::cancelled("stop"))));

        drop(leaf);
        // Invariant 7: nothing of the subtree stays linked.
        assert_eq!(root.__live_children(), 0);
    });
}

/// Model 4 (sequential core of the above): dropping a middle scope's handle must not cut its
/// live descendants off from the root's cancel (invariant 1) — no race needed.
#[test]
fn dropped_middle_handle_keeps_grandchild_reachable() {
    model("dropped_middle_handle_keeps_grandchild_reachable", || {
        let root = Scope::new();
        let middle = root.child().build().unwrap();
        let leaf = middle.child().build().unwrap();
        drop(middle);
        root.cancel();
        assert!(
            leaf.is_cancelled(),
            "grandchild missed by its root's cancel"
        );
        drop(leaf);
        assert_eq!(root.__live_children(), 0);
    });
}

/// Model 18: a scope loses its last handle while its children, linked in two different
/// registry shards (built on two threads), are created and dropped.
///
/// Invariants 1 and 7: the middle scope is not retired while a child lives (the root's cancel
/// still reaches it), and exactly one thread retires it — the one dropping its last handle if
/// no child is left, else the last child to unlink — so it ends unlinked once; nothing leaks: loom's leak check also covers the parent-link cycle that a
/// scope with handles keeps (invariant 8), which its last handle must break.
#[test]
fn last_handle_racing_children_on_two_shards() {
    model("last_handle_racing_children_on_two_shards", || {
        let root = Scope::new();
        let middle = root.child().build().unwrap();
        let near = middle.child().build().unwrap();
        let handle = middle.clone();
        let other = thread::spawn(move || {
            // Another thread: another shard of `middle`'s registry.
            let far = handle.child().build().unwrap();
            drop(handle);
            far
        });
        drop(middle);
        drop(near);
        let far = other.join().unwrap();
        // Invariant 1: `middle` was not retired while `far` lived, so the root's cancel still
        // reaches it.
        root.cancel();
        assert!(far.is_cancelled(), "live grandchild cut off from its root");
        drop(far);
        assert_eq!(root.__live_children(), 0);
    });
}

/// Model 18 (roots): a root's last handle dropped while its only child is dropped on another
/// thread, and a root that outlives nothing: loom's leak check shows that the link from child
/// to root never keeps the root alive once both are gone.
#[test]
fn root_and_child_dropped_at_once() {
    model("root_and_child_dropped_at_once", || {
        let root = Scope::new();
        let child = root.child().build().unwrap();
        let grandchild = child.child().build().unwrap();
        let t = thread::spawn(move || {
            drop(child);
            drop(grandchild);
        });
        drop(root);
        t.join().unwrap();
    });
}

/// Model 13: children of one parent are created and dropped on two threads — one builds a
/// child and a grandchild and drops the child's handle first, the other builds a child and
/// runs a registered job in it — while the parent is cancelled.
///
/// Invariant 7: each child is linked into and unlinked from the parent's registry exactly once
/// whatever the interleaving (both threads use the same registry shard under loom, so slot
/// reuse races too); the parent ends with no live children and loom's leak check finds every
/// node freed. Invariants 1 and 3: a child is either refused (the parent was cancelled) or
/// created and then reached by the cancel; a job registered in it has its receipt.
#[test]
fn siblings_created_and_dropped_racing_cancel() {
    model("siblings_created_and_dropped_racing_cancel", || {
        let parent = Scope::new();
        let nested = {
            let parent = parent.clone();
            thread::spawn(move || {
                let Ok(child) = parent.child().build() else {
                    return;
                };
                if let Ok(grandchild) = child.child().build() {
                    drop(child); // linked on through the grandchild
                    drop(grandchild);
                }
            })
        };
        let worker = {
            let parent = parent.clone();
            thread::spawn(move || match parent.child().build() {
                Ok(child) => match child.register(ChildSpec::read_only("job")) {
                    Ok(ticket) => u64::from(ticket.dispatch().map(|d| d.succeed()).is_ok()),
                    Err(e) => {
                        assert!(e.is_cancelled(), "unexpected error {e:?}");
                        0
                    }
                },
                Err(e) => {
                    assert!(e.is_cancelled(), "unexpected error {e:?}");
                    0
                }
            })
        };
        parent.cancel();
        nested.join().unwrap();
        let succeeded = worker.join().unwrap();

        assert_eq!(parent.__live_children(), 0, "every child unlinked");
        let report = loom::future::block_on(parent.quiesce());
        assert_eq!(report.succeeded(), succeeded);
        assert_eq!(report.total() - report.succeeded(), report.cancelled());
        assert_eq!(report.state(), Lifecycle::CancelledStable);
    });
}

/// Model 19: a cancel of a scope racing the cancel of its root, with the scope's subtree two
/// levels deep (it fails with a walk that passes its own cause below a grandchild).
///
/// Invariant 1: the first cause wins for the whole subtree of the scope cancelled first, at
/// every depth: the grandchild's origin is the child's.
#[test]
fn grandchild_below_precancelled_node_keeps_its_origin() {
    model(
        "grandchild_below_precancelled_node_keeps_its_origin",
        || {
            let root = Scope::new();
            let x = root.child().build().unwrap();
            let y = x.child().build().unwrap();
            let z = y.child().build().unwrap();
            let tx = {
                let x = x.clone();
                thread::spawn(move || {
                    x.cancel_because(Cause::DeadlineExceeded);
                })
            };
            root.cancel_because(Cause::ClientGone);
            tx.join().unwrap();
            let (xc, yc, zc) = (x.cause().unwrap(), y.cause().unwrap(), z.cause().unwrap());
            assert_eq!(yc.origin(), xc.origin(), "x={xc:?} y={yc:?} z={zc:?}");
            assert_eq!(zc.origin(), yc.origin(), "x={xc:?} y={yc:?} z={zc:?}");
        },
    );
}

/// Model 20: the last handle of a scope dropped while its last two children, linked in two
/// different registry shards, are dropped on two other threads.
///
/// Invariant 7: the orphaned parent is retired exactly once (the cross-shard emptiness check
/// and the `ORPHANED -> RETIRED` compare-and-swap), and nothing leaks.
#[test]
fn orphaned_parent_last_children_on_two_shards_unlink_at_once() {
    model_bounded(
        "orphaned_parent_last_children_on_two_shards_unlink_at_once",
        THREE_THREAD_PREEMPTIONS,
        || {
            let root = Scope::new();
            let middle = root.child().build().unwrap();
            let c1 = middle.child().build().unwrap();
            let m2 = middle.clone();
            // Built on another thread: another shard of `middle`'s registry.
            let c2 = thread::spawn(move || m2.child().build().unwrap())
                .join()
                .unwrap();
            let t1 = thread::spawn(move || drop(c1));
            let t2 = thread::spawn(move || drop(c2));
            drop(middle);
            t1.join().unwrap();
            t2.join().unwrap();
            assert_eq!(root.__live_children(), 0);
        },
    );
}
