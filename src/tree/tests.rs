use super::*;

#[test]
fn node_size() {
    eprintln!(
        "Node<ScopeExt, ChildSpec> = {} bytes; Inner = {}; Shard = {}; Counts = {}",
        std::mem::size_of::<crate::scope::Core>(),
        std::mem::size_of::<Mutex<Inner<(), ()>>>(),
        std::mem::size_of::<Shard<(), ()>>(),
        std::mem::size_of::<Counts>(),
    );
}
