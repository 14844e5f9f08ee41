//! loom models of a server's scope and its requests (boundary children): the server closes its
//! own watermark to stop admitting while a request's work ends, and its quiet report has every
//! request that was still running when it closed, and never changes after.
#![cfg(loom)]

use cancel_scope::{ChildSpec, Lifecycle, Scope};
use cancel_scope_loom_tests::model;
use loom::future::block_on;
use loom::thread;

/// Model 48: a request's handler ends (its ticket's receipt, its last unit) on one thread
/// while the server stops admitting and waits for quiet on the other. Either the request went
/// idle before the close (not in flight: nothing rolled up) or after it (in flight: rolled up,
/// its receipt in the server's report, counted before the server could be quiet). The report
/// says the same after everything is done, and a request admitted after the close cannot
/// start work.
#[test]
fn a_request_ending_as_the_server_closes() {
    model("a_request_ending_as_the_server_closes", || {
        let server = Scope::new();
        let request = server.__request_child().unwrap();
        let handler = request.register(ChildSpec::read_only("handler")).unwrap();
        let handler = handler.dispatch().unwrap();

        let ends = thread::spawn(move || handler.succeed());
        let had = server.__close_own();
        let report = block_on(server.quiesce());
        ends.join().unwrap();

        let (rolled, cancelled) = server.__rolled_up();
        assert_eq!(cancelled, 0);
        assert!(had <= 1 && rolled <= 1, "{had} {rolled}");
        // Rolled up: its receipt is in the report that the server's quiet made.
        assert_eq!(report.succeeded(), rolled, "{report:?}");
        assert_eq!(report.state(), Lifecycle::Completed);
        assert_eq!(
            block_on(server.quiesce()),
            report,
            "the report never changes"
        );
        // The request, idle under a closed server, can start nothing.
        assert!(request.register(ChildSpec::read_only("late")).is_err());
        assert!(server.__request_child().is_err());
    });
}
