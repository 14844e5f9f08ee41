//! Invariant 7: finished children are unlinked, so a long-lived parent keeps flat memory.

use std::time::Duration;

use cancel_scope::{ChildSpec, Scope};

#[test]
fn a_million_short_lived_children_leave_no_node_behind() {
    let root = Scope::new();
    for i in 0..1_000_000u32 {
        let child = root.child().build().unwrap();
        if i % 2 == 0 {
            // Some with grandchildren, dropped child-first and parent-first.
            let g = child.child().build().unwrap();
            if i % 4 == 0 {
                drop(child);
                drop(g);
            } else {
                drop(g);
                drop(child);
            }
        }
        assert!(root.__live_children() <= 1);
    }
    assert_eq!(root.__live_children(), 0);
}

#[tokio::test(start_paused = true)]
async fn children_with_deadlines_and_tickets_leave_nothing_behind() {
    let root = Scope::with_timeout(Duration::from_secs(3600));
    for _ in 0..100_000u32 {
        let child = root.child().cap(Duration::from_secs(60)).build().unwrap();
        child
            .register(ChildSpec::read_only("q"))
            .unwrap()
            .dispatch()
            .unwrap()
            .succeed();
    }
    assert_eq!(root.__live_children(), 0);
    // The deadlines of dropped children were disarmed: the root's still fires on time.
    root.close();
    let report = root.quiesce().await;
    assert_eq!(report.succeeded(), 100_000);
}

#[test]
fn a_handle_less_scope_stays_linked_while_it_has_children() {
    let root = Scope::new();
    let leaf = root.child().build().unwrap().child().build().unwrap();
    assert_eq!(
        root.__live_children(),
        1,
        "the middle scope is still linked"
    );
    root.cancel();
    assert!(leaf.is_cancelled());
    drop(leaf);
    assert_eq!(
        root.__live_children(),
        0,
        "the middle scope unlinked with its last child"
    );
}
