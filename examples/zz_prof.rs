fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        for _ in 0..100 {
            let scope = cancel_scope::Scope::new();
            for _ in 0..10_000 {
                let _ = scope
                    .spawn(async { tokio::task::yield_now().await })
                    .unwrap();
            }
            scope.close();
            scope.quiesce().await;
        }
    });
}
