//! The readable report: per mode and request id, then the side-by-side comparison.

use std::fmt::Write as _;
use std::time::Duration;

use cancel_scope::{Cause, Report};
use tokio::time::Instant;

use crate::options::Mode;
use crate::outcome::{describe_work, millis, yes, Check, ClientOutcome, ModeRun, RequestRun, Work};
use crate::record::{Hop, What};

impl ModeRun {
    /// The mode's report: how the chain was set up, each request hop by hop, the checks.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let t = self.options.timing();
        let work = t.quote.as_millis();
        let _ = writeln!(s, "\n== {} ==", self.mode.title());
        let _ = match self.mode {
            Mode::PerHop => writeln!(
                s,
                "Each hop calls the next with a fixed timeout of its own (frontend {} ms, orders {} ms\n\
                 per call) and ignores the client's grpc-timeout; inventory runs its {work} ms quote\n\
                 with tokio::spawn, so nothing stops it.",
                t.frontend_timeout.as_millis(),
                t.orders_timeout.as_millis(),
            ),
            Mode::Scoped => writeln!(
                s,
                "The edge admits the client's grpc-timeout; every hop runs its request in a scope\n\
                 (AdmitLayer), keeps {} ms for its answer and tells the next hop {} ms less than it has\n\
                 (send_scoped); inventory runs its {work} ms quote with Scope::current().spawn.",
                t.reserve.as_millis(),
                t.pad.as_millis(),
            ),
            Mode::Shadow => writeln!(
                s,
                "The scoped chain, every hop's policy (version 1) in shadow mode: each budget decision is\n\
                 computed and recorded in the hop's report, none is enforced below the hard cap of {} ms;\n\
                 a client that leaves still stops the work it left (that cannot be shadowed). Then every\n\
                 hop's policy is set to version 2, enforcing, while its server runs on, and the failure\n\
                 request is sent again.",
                t.edge_max.as_millis(),
            ),
        };
        if t.scale > 1 {
            let _ = writeln!(
                s,
                "Every duration is {} times the default's (--time-scale {}).",
                t.scale, t.scale
            );
        }
        for r in [&self.success, &self.failure]
            .into_iter()
            .chain(self.enforced.as_ref())
        {
            if r.group == crate::outcome::Group::Enforced {
                let _ = writeln!(
                    s,
                    "\n-- every hop's policy switched to version 2 (enforcing); no server restarted --"
                );
            }
            request(&mut s, r);
        }
        let _ = writeln!(s, "\n  checks");
        for c in &self.checks {
            let _ = writeln!(
                s,
                "    {:<4}  {:<16} {}\n                           {}",
                if c.passed { "ok" } else { "FAIL" },
                c.request,
                c.claim,
                c.detail
            );
        }
        s
    }
}

/// Milliseconds since the request was sent: `+12.3 ms`.
fn at(r: &RequestRun, t: Instant) -> String {
    format!("+{:.1} ms", millis(t.saturating_duration_since(r.sent)))
}

fn request(s: &mut String, r: &RequestRun) {
    let _ = writeln!(
        s,
        "\nrequest {} (client budget {} ms)",
        r.id,
        r.budget.as_millis()
    );
    let _ = writeln!(
        s,
        "  {:<15} {} after {:.1} ms",
        "client",
        r.client,
        millis(r.elapsed)
    );
    let _ = writeln!(
        s,
        "  {:<15} {:>10}  {:<12} {:>10}  how it ended",
        "", "started", "budget", "ended"
    );
    for hop in Hop::ALL {
        if !r.saw(hop) {
            continue;
        }
        hop_row(s, r, hop);
        if hop == Hop::Inventory {
            work_row(s, r);
        }
    }
    if !Hop::ALL.iter().any(|&h| r.saw(h)) {
        let why = if r.received(Hop::Frontend) {
            "no handler ran for this request id: the edge refused it"
        } else {
            "no handler ran for this request id: it never reached the edge"
        };
        let _ = writeln!(s, "  {:<15} {why}", "");
    }
    if !r.saw(Hop::External) {
        let _ = writeln!(s, "  {:<15} never saw the request id", Hop::External.name());
    }
    if r.mode == Mode::PerHop {
        let _ = writeln!(
            s,
            "  {:<15} none: without scopes nothing can say when this request's work has stopped",
            "quiescence"
        );
        return;
    }
    let mut label = "quiescence";
    for hop in Hop::ALL {
        if let Some(report) = r.report(hop) {
            let name = if hop == Hop::Frontend {
                "frontend (edge)"
            } else {
                hop.name()
            };
            let _ = writeln!(s, "  {label:<15} {name:<16} {report}");
            label = "";
        }
    }
}

fn hop_row(s: &mut String, r: &RequestRun, hop: Hop) {
    let (mut started, mut budget, mut ended, mut how) = (
        String::new(),
        "-".to_owned(),
        "-".to_owned(),
        "still running".to_owned(),
    );
    for e in r.of(hop) {
        match &e.what {
            What::Started { budget: b, .. } => {
                started = at(r, e.at);
                if let Some(b) = b {
                    budget = format!("{:.0} ms", millis(*b));
                }
            }
            What::Answered { status } => {
                ended = at(r, e.at);
                how = format!("answered {status}");
            }
            What::Dropped { cause } => {
                ended = at(r, e.at);
                how = match cause {
                    Some(cause) => format!(
                        "stopped by its scope: {cause}; the layer answered {}",
                        layer_status(cause)
                    ),
                    None => "dropped: its caller hung up".to_owned(),
                };
            }
            _ => {}
        }
    }
    let _ = writeln!(
        s,
        "  {:<15} {started:>10}  {budget:<12} {ended:>10}  {how}",
        hop.name()
    );
}

fn work_row(s: &mut String, r: &RequestRun) {
    let Some((started, planned)) = r.of(Hop::Inventory).find_map(|e| match e.what {
        What::WorkStarted { planned } => Some((e.at, planned)),
        _ => None,
    }) else {
        return;
    };
    let w = r.inventory_work();
    let ended = match &w {
        Work::Finished { at: t, .. } | Work::Stopped { at: t, .. } => at(r, *t),
        Work::NotStarted | Work::Running => "-".to_owned(),
    };
    let how = describe_work(&w, r);
    let _ = writeln!(
        s,
        "    {:<13} {:>10}  {:<12} {ended:>10}  {how}",
        "quote",
        at(r, started),
        format!("{} ms work", planned.as_millis())
    );
}

/// What the `Admit` layer answers for a request whose scope stopped with `cause`.
fn layer_status(cause: &Cause) -> &'static str {
    match cause.origin() {
        Cause::DeadlineExceeded => "504",
        Cause::ClientGone => "499 (to nobody: the caller was gone)",
        _ => "503",
    }
}

/// The side-by-side comparison of the failure requests and the verdict.
///
/// # Examples
///
/// ```
/// use cancel_scope_demo::summary;
/// assert!(summary(&[]).contains("nothing ran"));
/// ```
pub fn summary(runs: &[ModeRun]) -> String {
    let mut s = String::new();
    let Some(first) = runs.first() else {
        return "nothing ran\n".to_owned();
    };
    let t = first.options.timing();
    // One column per failure request: each mode's, and shadow mode's after the switch.
    let columns: Vec<Column<'_>> = runs
        .iter()
        .flat_map(|r| {
            // A mode's claims; shadow mode's after the switch in a column of their own.
            let after = |c: &&Check| r.enforced().is_some_and(|e| c.request() == e.id());
            std::iter::once(Column {
                title: r.mode.title().to_owned(),
                mode: r.mode,
                failure: r.failure(),
                checks: r.checks().iter().filter(|c| !after(c)).collect(),
            })
            .chain(r.enforced().map(|e| Column {
                title: "then enforced (no restart)".to_owned(),
                mode: Mode::Scoped,
                failure: e,
                checks: r.checks().iter().filter(after).collect(),
            }))
        })
        .collect();
    let _ = writeln!(
        s,
        "\n== {}: the failure request (client budget {} ms, inventory quote {} ms) ==",
        runs.iter()
            .map(|r| r.mode.title())
            .collect::<Vec<_>>()
            .join(" vs "),
        t.client.as_millis(),
        t.quote.as_millis()
    );
    let mut row = |label: &str, cell: &dyn Fn(&Column<'_>) -> String| {
        let mut line = format!("  {label:<29}");
        for c in &columns {
            let _ = write!(line, " {:<34}", cell(c));
        }
        let _ = writeln!(s, "{}", line.trim_end());
    };
    row("", &|c| c.title.clone());
    row("client", &|c| client_cell(c.failure));
    row("inventory told to stop", &|c| told_cell(c.failure));
    row("inventory's quote ended", &|c| quote_cell(c.failure));
    row("  after being told", &|c| after_told_cell(c.failure));
    row("  vs the client's budget", &|c| vs_client_cell(c.failure));
    row("external-stub saw the id", &|c| {
        yes(c.failure.saw(Hop::External)).to_owned()
    });
    row("inventory quiescence report", &|c| {
        quiescence_cell(c, Hop::Inventory, |rep| match rep.cancel_to_quiet() {
            Some(d) => format!("{:?}, quiet {} after", rep.state(), ms(d)),
            None => format!("{:?}", rep.state()),
        })
    });
    row("edge quiescence report", &|c| {
        quiescence_cell(c, Hop::Frontend, |rep| {
            format!("{:?} (stable)", rep.state())
        })
    });
    if columns.iter().any(|c| c.mode == Mode::Shadow) {
        row("inventory would have", &would_be_cell);
    }
    row("claims", &|c| {
        let held = c.checks.iter().filter(|k| k.passed()).count();
        format!("{held} of {} hold", c.checks.len())
    });

    let failed: Vec<_> = runs
        .iter()
        .flat_map(|r| r.checks())
        .filter(|c| !c.passed())
        .collect();
    if failed.is_empty() {
        let _ = writeln!(s, "\nEvery claim holds.");
    } else {
        let _ = writeln!(s, "\nThese claims do not hold:");
        for c in failed {
            let _ = writeln!(s, "  {}: {} ({})", c.request(), c.claim(), c.detail());
        }
    }
    s
}

/// One column of the comparison: a failure request, and how its chain ran it.
struct Column<'a> {
    title: String,
    mode: Mode,
    failure: &'a RequestRun,
    checks: Vec<&'a Check>,
}

/// What inventory's report says its budget would have done (shadow mode).
fn would_be_cell(c: &Column<'_>) -> String {
    if c.mode != Mode::Shadow {
        return "-".to_owned();
    }
    let Some(rep) = c.failure.report(Hop::Inventory) else {
        return "-".to_owned();
    };
    match crate::run::request_late_by(&rep.would_be()) {
        Some(late) => format!("cancelled it, {} sooner", ms(late)),
        None => "done nothing".to_owned(),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", millis(d))
}

fn quiescence_cell(c: &Column<'_>, hop: Hop, cell: impl Fn(&Report) -> String) -> String {
    let r = c.failure;
    match r.report(hop) {
        Some(rep) => cell(rep),
        None if c.mode == Mode::PerHop => "none (no scope)".to_owned(),
        None if hop == Hop::Frontend && r.received(hop) && !r.saw(hop) => {
            "none: refused at admission".to_owned()
        }
        None if !r.saw(hop) => "-".to_owned(),
        None => "missing".to_owned(),
    }
}

fn client_cell(r: &RequestRun) -> String {
    match r.client() {
        ClientOutcome::Answered { status, .. } => format!("{status} after {}", ms(r.elapsed())),
        ClientOutcome::TimedOut => format!("timed out after {}", ms(r.elapsed())),
        ClientOutcome::Failed(_) => format!("failed after {}", ms(r.elapsed())),
    }
}

fn told_cell(r: &RequestRun) -> String {
    match r.told_to_stop(Hop::Inventory) {
        Some((t, why)) => format!("{}: {why}", at(r, t)),
        None if r.saw(Hop::Inventory) => "never".to_owned(),
        None => "never saw the request".to_owned(),
    }
}

fn quote_end(r: &RequestRun) -> Option<Instant> {
    match r.inventory_work() {
        Work::Finished { at, .. } | Work::Stopped { at, .. } => Some(at),
        Work::NotStarted | Work::Running => None,
    }
}

fn quote_cell(r: &RequestRun) -> String {
    match r.inventory_work() {
        Work::Finished { at: t, .. } => format!("{}: finished", at(r, t)),
        Work::Stopped { at: t, worked, .. } => {
            format!("{}: stopped after {}", at(r, t), ms(worked))
        }
        Work::NotStarted => "never started".to_owned(),
        Work::Running => "still running".to_owned(),
    }
}

fn after_told_cell(r: &RequestRun) -> String {
    match (r.told_to_stop(Hop::Inventory), quote_end(r)) {
        (Some((t, _)), Some(end)) if end >= t => format!("{} later", ms(end - t)),
        (Some((t, _)), Some(end)) => format!("{} before", ms(t - end)),
        _ => "-".to_owned(),
    }
}

fn vs_client_cell(r: &RequestRun) -> String {
    let Some(end) = quote_end(r) else {
        return "-".to_owned();
    };
    let deadline = r.client_deadline();
    if end > deadline {
        format!("{} after it ran out", ms(end - deadline))
    } else {
        format!("{} before it ran out", ms(deadline - end))
    }
}
