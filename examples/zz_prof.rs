fn main() {
    let s = cancel_scope::Scope::new();
    for _ in 0..5_000_000 {
        drop(std::hint::black_box(s.child().build().unwrap()));
    }
}
