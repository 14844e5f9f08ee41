//! The service chain demonstration run in-process: four real axum servers on loopback, real
//! reqwest calls, the real clock. The assertions are about outcomes, order and causes, never
//! exact milliseconds; every wait inside the run is on an event (a response, a log entry, a
//! quiescence report), bounded so that a bug fails instead of hanging. The runs are at time
//! scale 5 (`--time-scale 5`): every duration five times the default's, so that a loaded
//! machine's delays (a timer firing late, a server reading a request late) stay well inside
//! the margins between the client's budget, the quote and the hop timeouts.

use std::time::Duration;

use cancel_scope::Lifecycle;
use cancel_scope_demo::{
    cli, run_mode, ClientOutcome, Hop, Mode, Options, OptionsError, Parsed, RequestRun, Work,
    EXIT_CLAIM_FAILED, EXIT_OK, EXIT_USAGE,
};

/// The time scale of every run in these tests.
const SCALE: &str = "5";

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// The default options at the tests' time scale.
fn scaled() -> Options {
    Options {
        time_scale: SCALE.parse().unwrap(),
        ..Options::default()
    }
}

/// Every one of `lines` is in `out`.
fn assert_has_lines(out: &str, lines: &[&str]) {
    for line in lines {
        assert!(out.contains(line), "{line:?} missing from\n{out}");
    }
}

fn went_through(r: &RequestRun) -> bool {
    matches!(
        r.client(),
        ClientOutcome::Answered { status: 200, body }
            if body.contains("inventory v1") && body.contains("external-stub")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_hop_timeouts_let_inventory_work_on_after_the_client_left() {
    let options = scaled();
    let run = run_mode(Mode::PerHop, &options).await.unwrap();
    assert!(run.passed(), "{}", run.render());

    let ok = run.success();
    assert!(went_through(ok), "{:?}", ok.client());
    assert!(ok.saw(Hop::Inventory) && ok.saw(Hop::External));
    // No hop gets a budget: each has its own fixed timeout.
    assert!(Hop::ALL.iter().all(|&h| ok.budget_at(h).is_none()));

    let failed = run.failure();
    assert_eq!(failed.client(), &ClientOutcome::TimedOut);
    // Dropping the connections stopped orders before it called external-stub...
    assert!(!failed.called(Hop::Orders, Hop::External));
    assert!(!failed.saw(Hop::External));
    // ... but inventory's quote ran to its end after the client had given up.
    match failed.inventory_work() {
        Work::Finished { at, worked } => {
            assert!(at > failed.client_done(), "{}", run.render());
            assert!(worked >= options.scaled(options.inventory_work));
        }
        w => panic!("{w:?}\n{}", run.render()),
    }
    // It was told (its caller hung up) and did not care.
    let (told, why) = failed.told_to_stop(Hop::Inventory).unwrap();
    assert_eq!(why, "its caller hung up");
    assert!(told >= failed.sent());
    // Nothing can report quiescence: there are no scopes.
    assert!(Hop::ALL.iter().all(|&h| failed.report(h).is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_budgets_stop_inventory_and_every_hop_goes_quiet() {
    let options = scaled();
    let run = run_mode(Mode::Scoped, &options).await.unwrap();
    assert!(run.passed(), "{}", run.render());

    let ok = run.success();
    assert!(went_through(ok), "{:?}", ok.client());
    // The budget shrinks from hop to hop: frontend > orders > inventory, all within 10 s.
    let budgets: Vec<_> = [Hop::Frontend, Hop::Orders, Hop::Inventory]
        .map(|h| ok.budget_at(h).unwrap())
        .to_vec();
    assert!(budgets[0] < ok.budget(), "{budgets:?}");
    assert!(budgets.windows(2).all(|w| w[1] < w[0]), "{budgets:?}");
    for hop in Hop::ALL {
        let report = ok.report(hop).unwrap();
        assert_eq!(report.state(), Lifecycle::Completed, "{hop}: {report}");
    }
    // Each handler has its receipt, and so do orders' two calls and inventory's quote task.
    assert_eq!(ok.report(Hop::Orders).unwrap().succeeded(), 3);
    assert_eq!(ok.report(Hop::Inventory).unwrap().succeeded(), 2);

    let failed = run.failure();
    assert!(failed.client().gave_up(), "{:?}", failed.client());
    assert!(!failed.called(Hop::Orders, Hop::External));
    assert!(!failed.saw(Hop::External));
    // Inventory's quote started, and was stopped by its scope long before its 1750 ms...
    match failed.inventory_work() {
        Work::Stopped { worked, cause, .. } => {
            assert!(
                worked < options.scaled(options.inventory_work),
                "{}",
                run.render()
            );
            let cause = cause.unwrap();
            assert!(
                cause.is_deadline_exceeded() || cause.is_client_gone(),
                "{cause}"
            );
        }
        w => panic!("{w:?}\n{}", run.render()),
    }
    // ... its request scope went quiet with the handler and the task receipted as cancelled ...
    let report = failed.report(Hop::Inventory).unwrap();
    assert_eq!(report.state(), Lifecycle::CancelledStable, "{report}");
    assert_eq!((report.cancelled(), report.total()), (2, 2), "{report}");
    // ... and every hop that saw the request, the edge first of all, reported quiescence.
    assert!(failed.report(Hop::Frontend).unwrap().state().is_final());
    for hop in Hop::ALL {
        assert_eq!(failed.saw(hop), failed.report(hop).is_some(), "{hop}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_runs_as_per_hop_timeouts_reports_the_would_be_cancels_then_enforces() {
    let options = scaled();
    let run = run_mode(Mode::Shadow, &options).await.unwrap();
    assert!(run.passed(), "{}", run.render());

    // Shadowed, the success request goes through as in every mode.
    assert!(went_through(run.success()), "{:?}", run.success().client());
    // The failure request: nothing enforced. The client timed out on its own (no 504), and
    // only its leaving stopped inventory's quote, past the deadline its budget would have had.
    let failed = run.failure();
    assert_eq!(
        failed.client(),
        &ClientOutcome::TimedOut,
        "{}",
        run.render()
    );
    assert!(!failed.saw(Hop::External));
    for hop in [Hop::Frontend, Hop::Orders, Hop::Inventory] {
        // Each hop ran bounded by the hard cap (5 s, less what the hops before it used), far
        // past the client's budget, and knows its would-be deadline.
        let budget = failed.budget_at(hop).unwrap();
        assert!(
            budget > options.scaled(Duration::from_secs(4)),
            "{hop}: {budget:?}"
        );
        assert!(failed.would_be_deadline(hop).flatten().is_some(), "{hop}");
    }
    let would_be = failed.would_be_deadline(Hop::Inventory).flatten().unwrap();
    match failed.inventory_work() {
        Work::Stopped { at, cause, .. } => {
            assert!(at > would_be, "{}", run.render());
            assert!(cause.unwrap().is_client_gone(), "{}", run.render());
        }
        w => panic!("{w:?}\n{}", run.render()),
    }
    // Inventory, whose would-be deadline came first, reports the cancel that did not happen.
    let inventory = failed.report(Hop::Inventory).unwrap();
    assert!(
        inventory.would_be().iter().any(|d| d.late_by().is_some()),
        "{inventory}"
    );
    assert_eq!(inventory.policy_version(), Some(1));

    // Switched to enforcing, the same servers stop the same request at its deadline.
    let enforced = run.enforced().unwrap();
    assert!(enforced.client().gave_up(), "{:?}", enforced.client());
    assert!(!enforced.saw(Hop::External));
    match enforced.inventory_work() {
        Work::Stopped { worked, .. } => {
            assert!(worked < options.scaled(options.inventory_work));
        }
        w => panic!("{w:?}\n{}", run.render()),
    }
    for hop in Hop::ALL.into_iter().filter(|&h| enforced.saw(h)) {
        let report = enforced.report(hop).unwrap();
        assert_eq!(report.policy_version(), Some(2), "{hop}");
        assert!(report.would_be().is_empty(), "{hop}: {report}");
        assert_eq!(enforced.would_be_deadline(hop), None, "{hop}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_runs_shadow_mode_alone_and_compares_before_and_after_the_switch() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = cli(
        args(&["--mode", "shadow", "--time-scale", SCALE]),
        &mut out,
        &mut err,
    )
    .await;
    let out = String::from_utf8(out).unwrap();
    assert_eq!(status, EXIT_OK, "{out}");
    assert_has_lines(
        &out,
        &[
            "== shadow mode ==",
            "request shadow/failure (client budget 500 ms)",
            "-- every hop's policy switched to version 2 (enforcing); no server restarted --",
            "request shadow/enforced (client budget 500 ms)",
            "shadow: would have cancelled at the deadline",
            "then enforced (no restart)",
            "Every claim holds.",
        ],
    );
    assert!(!out.contains("== per-hop timeouts =="), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_reports_both_modes_and_exits_zero() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = cli(args(&["--time-scale", SCALE]), &mut out, &mut err).await;
    let out = String::from_utf8(out).unwrap();
    assert_eq!(status, EXIT_OK, "{out}");
    assert_has_lines(
        &out,
        &[
            "== per-hop timeouts ==",
            "== scoped budgets ==",
            "Every duration is 5 times the default's (--time-scale 5).",
            "request per-hop/failure (client budget 500 ms)",
            "request scoped/failure (client budget 500 ms)",
            "== per-hop timeouts vs scoped budgets: the failure request (client budget 500 ms, \
         inventory quote 1750 ms)",
            "Every claim holds.",
        ],
    );
    assert!(!out.contains("FAIL"), "{out}");
}

/// The control: with a quote shorter than the client's budget the failure group's
/// claims are false, and the program must say so and exit 1 (not 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_does_not_hold_makes_the_exit_status_non_zero() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let a = args(&[
        "--client-ms",
        "1000",
        "--inventory-ms",
        "20",
        "--time-scale",
        SCALE,
    ]);
    let status = cli(a, &mut out, &mut err).await;
    let out = String::from_utf8(out).unwrap();
    assert_eq!(status, EXIT_CLAIM_FAILED, "{out}");
    assert!(out.contains("These claims do not hold:"), "{out}");
    for claim in [
        "per-hop/failure: the client got no quote within its 5000 ms",
        "per-hop/failure: external-stub never saw the request id",
        "per-hop/failure: inventory still finished its 100 ms quote after the client gave up",
        "scoped/failure: the client got no quote within its 5000 ms",
        "scoped/failure: inventory started its 100 ms quote and stopped before finishing it",
    ] {
        assert!(out.contains(claim), "{claim:?} not reported in\n{out}");
    }
}

/// "Inventory stopped before finishing" holds only for a quote that started: a client budget
/// the edge refuses at once (12 ms, scaled: less than the reserve and the minimum useful
/// budget) never reaches inventory, which proves nothing, and the program says so (before,
/// a quote that never started counted as stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quote_that_never_started_does_not_count_as_stopped() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let a = args(&[
        "--mode",
        "scoped",
        "--client-ms",
        "12",
        "--time-scale",
        SCALE,
    ]);
    let status = cli(a, &mut out, &mut err).await;
    let out = String::from_utf8(out).unwrap();
    assert_eq!(status, EXIT_CLAIM_FAILED, "{out}");
    let claim = "scoped/failure: inventory started its 1750 ms quote and stopped before \
                 finishing it (never started)";
    assert!(out.contains(claim), "{claim:?} not reported in\n{out}");
}

#[tokio::test]
async fn bad_options_get_a_typed_error_and_exit_status_2() {
    let parse = |a: &[&str]| Options::parse(args(a));
    assert_eq!(
        parse(&["--mode", "fast"]),
        Err(OptionsError::BadMode("fast".into()))
    );
    assert_eq!(
        parse(&["--mode"]),
        Err(OptionsError::MissingValue("--mode"))
    );
    assert_eq!(
        parse(&["--verbose"]),
        Err(OptionsError::Unknown("--verbose".into()))
    );
    for bad in [
        "0",
        "-5",
        "+5",
        "1.5",
        "5ms",
        "",
        "60001",
        "99999999999999999999999",
    ] {
        assert!(
            matches!(
                parse(&["--client-ms", bad]),
                Err(OptionsError::BadMillis { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        parse(&["--inventory-ms=-1"]),
        Err(OptionsError::BadMillis { .. })
    ));
    assert_eq!(
        parse(&[
            "--mode=per-hop",
            "--client-ms",
            "60000",
            "--inventory-ms",
            "0"
        ]),
        Ok(Parsed::Run(Options {
            mode: Some(Mode::PerHop),
            client_budget: Duration::from_secs(60),
            inventory_work: Duration::ZERO,
            time_scale: 1,
        }))
    );
    for bad in ["0", "21", "-1", "+2", "1.5", "x", ""] {
        assert_eq!(
            parse(&["--time-scale", bad]),
            Err(OptionsError::BadTimeScale(bad.into())),
            "{bad:?}"
        );
    }
    assert_eq!(
        parse(&["--time-scale=20"]).map(|p| match p {
            Parsed::Run(o) => o.time_scale,
            Parsed::Help => 0,
        }),
        Ok(20)
    );
    assert_eq!(parse(&["--client-ms", "7", "--help"]), Ok(Parsed::Help));

    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = cli(args(&["--client-ms", "soon"]), &mut out, &mut err).await;
    assert_eq!(status, EXIT_USAGE);
    let err = String::from_utf8(err).unwrap();
    assert!(
        err.contains("--client-ms takes a whole number of milliseconds"),
        "{err}"
    );
    assert!(err.contains("usage:"), "{err}");
    assert!(out.is_empty());
}
