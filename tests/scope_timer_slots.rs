//! Deadline timers of one tree share a slab: a scope whose deadline already fired must not
//! disarm, when its last handle drops, another scope's deadline that reused the freed slot.

use std::time::Duration;

use cancel_scope::Scope;

#[tokio::test(start_paused = true)]
async fn dropping_a_fired_scope_keeps_a_later_deadline_armed() {
    let ms = Duration::from_millis;
    let root = Scope::with_timeout(ms(1000));
    let first = root.child().timeout(ms(10)).build().unwrap();
    first.cancelled().await; // its timer fired and its slot was freed
    let second = root.child().timeout(ms(50)).build().unwrap(); // takes the freed slot
    drop(first);

    tokio::time::timeout(ms(100), second.cancelled())
        .await
        .expect("the 50 ms deadline fired");
    assert!(second.cause().unwrap().is_deadline_exceeded());
    assert!(!root.is_cancelled());
}
