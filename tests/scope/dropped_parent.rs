//! A scope whose handles are all dropped while it still has live children: the children stay
//! reachable by the ancestors' cancel and keep the inherited deadline (invariant 1), and the
//! tree is unlinked once they are gone too (invariant 7). Regression tests for the bug the
//! loom model `middle_drop_racing_root_cancel` found.

use std::time::Duration;

use cancel_scope::{Cause, Scope};

#[test]
fn root_cancel_reaches_grandchild_of_dropped_scope() {
    let root = Scope::new();
    let middle = root.child().build().unwrap();
    let leaf = middle.child().build().unwrap();
    drop(middle);
    // The middle scope stays linked while its child lives.
    assert_eq!(root.__live_children(), 1);

    root.cancel_with("stop");
    assert!(leaf.is_cancelled());
    assert_eq!(leaf.cause().unwrap().origin(), &Cause::cancelled("stop"));

    drop(leaf);
    assert_eq!(root.__live_children(), 0);
}

#[test]
fn dropping_leaf_then_middle_unlinks_both() {
    let root = Scope::new();
    let middle = root.child().build().unwrap();
    let leaf = middle.child().build().unwrap();
    drop(leaf);
    assert_eq!(middle.__live_children(), 0);
    assert_eq!(root.__live_children(), 1);
    drop(middle);
    assert_eq!(root.__live_children(), 0);
}

#[tokio::test(start_paused = true)]
async fn child_keeps_inherited_deadline_after_parent_handle_dropped() {
    let ms = Duration::from_millis;
    let root = Scope::with_timeout(ms(100));
    let child = root.child().build().unwrap(); // inherits the deadline: no timer of its own
    drop(root);

    let cause = tokio::time::timeout(ms(200), async {
        child.cancelled().await;
        child.cause().unwrap()
    })
    .await
    .expect("the inherited deadline fired");
    assert!(cause.is_deadline_exceeded());
}

#[tokio::test(start_paused = true)]
async fn grandchild_keeps_deadline_of_dropped_middle_scope() {
    let ms = Duration::from_millis;
    let root = Scope::new();
    let middle = root.child().cap(ms(50)).build().unwrap(); // tightens: its own timer
    let leaf = middle.child().build().unwrap();
    drop(middle);

    tokio::time::timeout(ms(100), leaf.cancelled())
        .await
        .expect("the middle scope's deadline fired");
    assert!(leaf.cause().unwrap().is_deadline_exceeded());
    assert!(!root.is_cancelled());

    drop(leaf);
    assert_eq!(root.__live_children(), 0);
}

#[test]
fn children_on_many_threads_keep_a_handle_less_parent_linked_then_free_it() {
    for round in 0..200 {
        let root = Scope::new();
        let parent = root.child().build().unwrap();
        let freed = parent.__freed_probe();
        let (made_tx, made_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let go_rx = std::sync::Arc::new(std::sync::Mutex::new(go_rx));
        // Children built on four threads land in different registry shards of `parent`.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (parent, made_tx, go_rx) = (parent.clone(), made_tx.clone(), go_rx.clone());
                std::thread::spawn(move || {
                    let child = parent.child().build().unwrap();
                    drop(parent);
                    made_tx.send(()).unwrap();
                    go_rx.lock().unwrap().recv().unwrap();
                    child
                })
            })
            .collect();
        for _ in 0..4 {
            made_rx.recv().unwrap();
        }
        // The last handle of `parent` goes while its four children live.
        drop(parent);
        assert_eq!(root.__live_children(), 1, "round {round}");
        for _ in 0..4 {
            go_tx.send(()).unwrap();
        }
        let children: Vec<Scope> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        root.cancel();
        assert!(children.iter().all(Scope::is_cancelled), "round {round}");
        // Dropped on as many threads, racing each other to retire the orphaned parent.
        let droppers: Vec<_> = children
            .into_iter()
            .map(|c| std::thread::spawn(move || drop(c)))
            .collect();
        for d in droppers {
            d.join().unwrap();
        }
        assert_eq!(root.__live_children(), 0, "round {round}");
        assert!(freed(), "round {round}: the parent's node was not freed");
    }
}

#[test]
fn a_scope_with_children_is_freed_once_everything_is_dropped() {
    let lone = Scope::new();
    let freed_lone = lone.__freed_probe();
    let kid = lone.child().build().unwrap();
    drop(kid);
    // A scope that had a child but still has its handle keeps its links; its last handle
    // drops them.
    drop(lone);
    assert!(freed_lone());

    let root = Scope::new();
    let freed_root = root.__freed_probe();
    let child = root.child().build().unwrap();
    let freed_child = child.__freed_probe();
    let grandchild = child.child().build().unwrap();
    drop(root);
    drop(child);
    // Both are still needed: the grandchild's cancel path and deadline go through them.
    assert!(!freed_root() && !freed_child());
    drop(grandchild);
    assert!(
        freed_root() && freed_child(),
        "a reference cycle outlived the tree"
    );
}
