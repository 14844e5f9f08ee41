//! One request, one budget: a 100 ms edge budget stops a 350 ms dependency call early, the
//! dependency that would have come after it is never called, and the request scope proves it
//! has stopped. The handler is a task whose receipt follows its result (`spawn_fallible`): it
//! ends `Failed`, and the report says why.
//!
//! Run with `cargo run --example request_budget`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{ChildSpec, Lifecycle, Scope};
use tokio::time::Instant;

#[tokio::main]
async fn main() {
    let start = Instant::now();
    let external_called = Arc::new(AtomicBool::new(false));

    // The edge admits the request with a 100 ms budget.
    let request = Scope::with_timeout(Duration::from_millis(100));

    let handler = {
        let external_called = external_called.clone();
        request.spawn_fallible(async move {
            // Inventory: 350 ms of work, with 10 ms kept for our own response.
            let inventory = Scope::current()
                .child()
                .name("inventory")
                .reserve(Duration::from_millis(10))
                .build()?;
            println!(
                "[{:>4} ms] inventory gets {:?}",
                start.elapsed().as_millis(),
                inventory.remaining().unwrap()
            );
            inventory
                .run(tokio::time::sleep(Duration::from_millis(350)))
                .await?;

            // Only if inventory succeeded: the external call, registered before dispatch.
            let call = Scope::current().register(ChildSpec::read_only("external-stub"))?;
            let call = call.dispatch()?;
            external_called.store(true, Ordering::SeqCst);
            call.succeed();
            Ok::<_, cancel_scope::Error>(())
        })
    };

    let outcome = handler.expect("the request scope accepts work").await;
    println!(
        "[{:>4} ms] handler: {}",
        start.elapsed().as_millis(),
        match &outcome {
            Ok(Ok(())) => "finished".to_string(),
            Ok(Err(e)) | Err(e) => format!("stopped: {e}"),
        }
    );

    let report = request.quiesce().await;
    println!(
        "[{:>4} ms] request scope: {report}",
        start.elapsed().as_millis()
    );
    for failure in report.failures() {
        println!("             failed: {failure}");
    }
    println!(
        "external-stub called: {}",
        external_called.load(Ordering::SeqCst)
    );

    let ok = !external_called.load(Ordering::SeqCst)
        && report.state() == Lifecycle::CancelledStable
        && report.failures().len() == 1
        && start.elapsed() < Duration::from_millis(350);
    if !ok {
        eprintln!("unexpected outcome");
        std::process::exit(1);
    }
}
