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
    let middle = root.child().timeout(ms(50)).build().unwrap(); // tightens: its own timer
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
