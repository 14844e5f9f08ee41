//! The gates: each one a function from a phase's observations to a row of the report (the
//! figure, the threshold, the verdict). Nothing here measures: the phases collect, these judge.

use std::time::Duration;

/// Which phase observed a figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Random call trees on tokio's paused clock, through the tower layers in process.
    Trees,
    /// Real load on loopback servers, on the real clock.
    Load,
}

impl Phase {
    /// The phase's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Trees => "trees (virtual time)",
            Phase::Load => "load (real clock)",
        }
    }
}

/// What one phase observed, summed over its trees or requests.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    /// Root requests run (call trees, or client requests).
    pub requests: u64,
    /// Requests seen on the wire (every hop's incoming request).
    pub sent: u64,
    /// Sent requests whose budget ends later than what their sender had (or that were
    /// admitted with a later deadline than they carried).
    pub expanded: u64,
    /// Sent requests covered by a registered child of their sender (per sender, at most as
    /// many as its report has receipts).
    pub registered_sends: u64,
    /// Sent requests whose budget, counted from their arrival, ends after their sender's
    /// deadline: the time they waited for a connection after the egress wrote the header
    /// (more than the transport pad) is not deducted.
    pub outlived: u64,
    /// The largest such excess.
    pub outlived_max: Duration,
    /// Requests a hop admitted (its handler ran).
    pub admitted: u64,
    /// Admitted requests (and client roots) whose scope went quiet with a receipt for every
    /// child.
    pub quiet: u64,
    /// Root scopes expected to go quiet (client side).
    pub roots: u64,
    /// Requests a downstream accepted although their sender was cancelled or past its
    /// deadline when sending.
    pub late_accepts: u64,
    /// Per cancelled request: from the cancel to the last byte any hop sent for it.
    pub cancel_to_quiet: Vec<Duration>,
    /// Per cancelled request, what that last byte was (in the order of `cancel_to_quiet`).
    pub last_io: Vec<&'static str>,
    /// Permits and connections still held once everything was quiet.
    pub orphans: u64,
    /// Requests that ran to an answer (not cancelled by their client).
    pub answered: u64,
    /// Of those, answered after the client's budget.
    pub missed: u64,
    /// How late each missed answer came.
    pub late_by: Vec<Duration>,
    /// Requests their client cancelled (or disconnected from).
    pub client_cancels: u64,
    /// Receipts `Cancelled` over all reports.
    pub cancelled_receipts: u64,
    /// Receipts `Quarantined` over all reports.
    pub quarantined: u64,
    /// Effects pending reconciliation (`EffectUnknown` receipts) over all reports.
    pub pending_effects: u64,
    /// Client requests with a malformed budget header (phase 2), not in the figures above.
    pub hostile: u64,
    /// Of those, refused at admission (the rejection cap allowed the refusal).
    pub hostile_refused: u64,
    /// Requests an edge admitted past its rejection cap (refusals it turned into shadow
    /// decisions): counted in a row of their own.
    pub over_rejection_cap: u64,
}

impl Observations {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: Observations) {
        self.requests += other.requests;
        self.sent += other.sent;
        self.expanded += other.expanded;
        self.registered_sends += other.registered_sends;
        self.admitted += other.admitted;
        self.quiet += other.quiet;
        self.roots += other.roots;
        self.late_accepts += other.late_accepts;
        self.outlived += other.outlived;
        self.outlived_max = self.outlived_max.max(other.outlived_max);
        self.cancel_to_quiet.extend(other.cancel_to_quiet);
        self.last_io.extend(other.last_io);
        self.orphans += other.orphans;
        self.answered += other.answered;
        self.missed += other.missed;
        self.late_by.extend(other.late_by);
        self.client_cancels += other.client_cancels;
        self.cancelled_receipts += other.cancelled_receipts;
        self.quarantined += other.quarantined;
        self.pending_effects += other.pending_effects;
        self.hostile += other.hostile;
        self.hostile_refused += other.hostile_refused;
        self.over_rejection_cap += other.over_rejection_cap;
    }
}

/// A row's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The figure meets the threshold.
    Pass,
    /// It does not (or nothing was measured that could meet it).
    Fail,
    /// The build has nothing to measure for this row yet; it does not decide the exit status.
    Waiting,
    /// A figure reported beside the gates, not gated.
    Info,
}

impl Verdict {
    fn of(pass: bool) -> Verdict {
        if pass {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }

    /// The verdict in the report.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::Waiting => "waiting",
            Verdict::Info => "info",
        }
    }
}

/// One row of the report.
#[derive(Clone, Debug)]
pub struct Row {
    /// The gate.
    pub gate: &'static str,
    /// The phase whose observations it judges (`None`: rows of no phase).
    pub phase: Option<Phase>,
    /// The figure, as the report prints it.
    pub figure: String,
    /// The figure as a number (a count, a fraction, or milliseconds), for the JSON.
    pub value: Option<f64>,
    /// The threshold, as the report prints it.
    pub threshold: String,
    /// Pass, fail or waiting.
    pub verdict: Verdict,
}

/// The cancel-propagation gate: the seed's P99.
pub const CANCEL_P99_GATE: Duration = Duration::from_millis(100);
/// This library's own target for the same P99 (shown, not gated).
pub const CANCEL_P99_TARGET: Duration = Duration::from_millis(1);
/// The end-to-end deadline-miss gate: below 0.1 % of answered requests.
pub const MISS_RATE_GATE: f64 = 0.001;

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Budget expansion: no hop may carry or be admitted with more than its sender had.
pub fn budget_expansion(phase: Phase, o: &Observations) -> Row {
    Row {
        gate: "budget expansion",
        phase: Some(phase),
        figure: format!("{} of {} hops", o.expanded, o.sent),
        value: Some(o.expanded as f64),
        threshold: "= 0".into(),
        verdict: Verdict::of(o.expanded == 0 && o.requests > 0),
    }
}

/// Child pre-registration: every request on the wire had a registered child in its sender.
pub fn pre_registration(phase: Phase, o: &Observations) -> Row {
    let covered = o.registered_sends.min(o.sent);
    Row {
        gate: "child pre-registration coverage",
        phase: Some(phase),
        figure: format!(
            "{:.4} % ({covered} of {} sent)",
            percent(covered, o.sent),
            o.sent
        ),
        value: Some(percent(covered, o.sent)),
        threshold: "= 100 %".into(),
        verdict: Verdict::of(o.registered_sends >= o.sent && o.requests > 0),
    }
}

/// Terminal receipts: every admitted request and every client root went quiet, each child
/// with its receipt.
pub fn receipt_coverage(phase: Phase, o: &Observations) -> Row {
    let expected = o.admitted + o.roots;
    Row {
        gate: "terminal-receipt coverage",
        phase: Some(phase),
        figure: format!(
            "{:.4} % ({} of {expected} scopes quiet)",
            percent(o.quiet, expected),
            o.quiet
        ),
        value: Some(percent(o.quiet, expected)),
        threshold: "= 100 %".into(),
        verdict: Verdict::of(o.quiet == expected && o.requests > 0),
    }
}

/// No downstream accepts new work from a sender already cancelled or past its deadline.
pub fn late_accepts(phase: Phase, o: &Observations) -> Row {
    Row {
        gate: "downstream accepts after deadline or cancel",
        phase: Some(phase),
        figure: format!("{}", o.late_accepts),
        value: Some(o.late_accepts as f64),
        threshold: "= 0".into(),
        verdict: Verdict::of(o.late_accepts == 0 && o.requests > 0),
    }
}

/// The `q`-quantile (nearest rank) of `samples`, `None` without samples.
pub fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

/// Cancel propagation to "no new I/O": P99 under 100 ms gates; the 1 ms target is shown. No
/// cancel observed is a failure: a gate that measured nothing has not passed.
pub fn cancel_propagation(phase: Phase, o: &Observations) -> Row {
    let p99 = quantile(&o.cancel_to_quiet, 0.99);
    let figure = match p99 {
        Some(p) => format!(
            "P99 {:.3} ms over {} cancels (target < {} ms: {})",
            p.as_secs_f64() * 1e3,
            o.cancel_to_quiet.len(),
            CANCEL_P99_TARGET.as_millis(),
            if p < CANCEL_P99_TARGET {
                "met"
            } else {
                "not met"
            }
        ),
        None => "no cancel observed".into(),
    };
    Row {
        gate: "cancel propagation to no new I/O",
        phase: Some(phase),
        figure,
        value: p99.map(|p| p.as_secs_f64() * 1e3),
        threshold: format!("P99 < {} ms", CANCEL_P99_GATE.as_millis()),
        verdict: Verdict::of(p99.is_some_and(|p| p < CANCEL_P99_GATE)),
    }
}

/// Orphan connections and permits once everything is quiet.
pub fn orphans(phase: Phase, o: &Observations) -> Row {
    Row {
        gate: "orphan connections and permits",
        phase: Some(phase),
        figure: format!("{}", o.orphans),
        value: Some(o.orphans as f64),
        threshold: "= 0".into(),
        verdict: Verdict::of(o.orphans == 0 && o.requests > 0),
    }
}

/// End-to-end deadline misses: answers later than the client's budget, under 0.1 %.
pub fn deadline_miss(phase: Phase, o: &Observations) -> Row {
    let rate = if o.answered == 0 {
        1.0
    } else {
        o.missed as f64 / o.answered as f64
    };
    Row {
        gate: "end-to-end deadline miss",
        phase: Some(phase),
        figure: format!(
            "{:.4} % ({} of {} answered)",
            rate * 100.0,
            o.missed,
            o.answered
        ),
        value: Some(rate * 100.0),
        threshold: format!("< {} %", MISS_RATE_GATE * 100.0),
        verdict: Verdict::of(o.answered > 0 && rate < MISS_RATE_GATE),
    }
}

/// Not a gate: requests whose budget, counted from their arrival, ends after their sender's
/// deadline because they waited for a connection after the header was written (the
/// transport's time beyond its pad). The sender's own cut still ends them at its deadline.
pub fn outlived(phase: Phase, o: &Observations) -> Row {
    Row {
        gate: "budget past the sender's by connection waits",
        phase: Some(phase),
        figure: format!(
            "{} of {} hops, at most {:.3} ms",
            o.outlived,
            o.sent,
            o.outlived_max.as_secs_f64() * 1e3
        ),
        value: Some(o.outlived as f64),
        threshold: "not gated".into(),
        verdict: Verdict::Info,
    }
}

/// Every gate of one phase, in the report's order.
pub fn phase_rows(phase: Phase, o: &Observations) -> Vec<Row> {
    vec![
        budget_expansion(phase, o),
        pre_registration(phase, o),
        receipt_coverage(phase, o),
        late_accepts(phase, o),
        cancel_propagation(phase, o),
        orphans(phase, o),
        deadline_miss(phase, o),
        outlived(phase, o),
    ]
}

/// What the rollout rows count: requests the enforced figures leave out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rollout {
    /// Requests run in shadow mode (decisions recorded, not enforced); `None`: not counted.
    pub shadow: Option<u64>,
    /// Requests admitted past the rejection cap; `None`: no such cap.
    pub over_rejection_cap: Option<u64>,
}

fn rollout_row(gate: &'static str, count: Option<u64>, missing: &str) -> Row {
    match count {
        Some(n) => Row {
            gate,
            phase: None,
            figure: format!("{n} requests (not in the enforced figures)"),
            value: Some(n as f64),
            threshold: "counted apart".into(),
            verdict: Verdict::Pass,
        },
        None => Row {
            gate,
            phase: None,
            figure: format!("not measured: {missing}"),
            value: None,
            threshold: "counted apart".into(),
            verdict: Verdict::Waiting,
        },
    }
}

/// The rows of requests that the enforced figures leave out: shadow mode, and admissions past
/// the rejection cap.
pub fn rollout_rows(r: Rollout) -> Vec<Row> {
    vec![
        rollout_row(
            "requests in shadow mode",
            r.shadow,
            "no shadow mode to count",
        ),
        rollout_row(
            "requests admitted past the rejection cap",
            r.over_rejection_cap,
            "no rejection cap in this run",
        ),
    ]
}

/// Whether the run passed: no row failed.
pub fn passed(rows: &[Row]) -> bool {
    rows.iter().all(|r| r.verdict != Verdict::Fail)
}

/// Whether the rows of `phase` (and those of no phase) passed.
pub fn passed_in(rows: &[Row], phase: Phase) -> bool {
    rows.iter()
        .filter(|r| r.phase.is_none_or(|p| p == phase))
        .all(|r| r.verdict != Verdict::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trees::{run_trees, Sabotage, TreeConfig};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn run(sabotage: Sabotage) -> Vec<Row> {
        let cfg = TreeConfig {
            trees: 300,
            seed: 27,
            sabotage,
        };
        let o = run_trees(&cfg, &|_| {});
        phase_rows(Phase::Trees, &o)
    }

    fn verdict_of(rows: &[Row], gate: &str) -> Verdict {
        rows.iter().find(|r| r.gate == gate).unwrap().verdict
    }

    fn failing(rows: &[Row]) -> Vec<&'static str> {
        rows.iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| r.gate)
            .collect()
    }

    #[test]
    fn the_library_passes_every_gate_of_the_trees() {
        let rows = run(Sabotage::None);
        assert!(failing(&rows).is_empty(), "{rows:#?}");
    }

    #[test]
    fn a_hop_that_writes_a_larger_budget_fails_budget_expansion() {
        let rows = run(Sabotage::GrowBudget);
        assert_eq!(
            verdict_of(&rows, "budget expansion"),
            Verdict::Fail,
            "{rows:#?}"
        );
    }

    #[test]
    fn a_child_sent_after_cancel_fails_late_accepts_and_pre_registration() {
        let rows = run(Sabotage::SendAfterCancel);
        let failed = failing(&rows);
        assert!(
            failed.contains(&"downstream accepts after deadline or cancel"),
            "{rows:#?}"
        );
        assert!(
            failed.contains(&"child pre-registration coverage"),
            "{rows:#?}"
        );
    }

    #[test]
    fn a_permit_never_released_fails_orphans() {
        let rows = run(Sabotage::LeakPermit);
        assert_eq!(failing(&rows), vec!["orphan connections and permits"]);
    }

    #[test]
    fn a_late_answer_fails_deadline_miss() {
        let rows = run(Sabotage::LateAnswer);
        assert_eq!(
            verdict_of(&rows, "end-to-end deadline miss"),
            Verdict::Fail,
            "{rows:#?}"
        );
    }

    #[test]
    fn gates_that_measured_nothing_do_not_pass() {
        let rows = phase_rows(Phase::Load, &Observations::default());
        let gated = rows.iter().filter(|r| r.verdict != Verdict::Info);
        assert!(
            gated.clone().all(|r| r.verdict == Verdict::Fail),
            "{rows:#?}"
        );
    }

    #[test]
    fn cancel_propagation_gates_at_100_ms_and_shows_the_1_ms_target() {
        let mut o = Observations {
            requests: 1,
            ..Observations::default()
        };
        o.cancel_to_quiet = vec![ms(0); 98];
        o.cancel_to_quiet.extend([ms(5), ms(500)]);
        let row = cancel_propagation(Phase::Load, &o);
        assert_eq!(row.verdict, Verdict::Pass, "{row:?}");
        assert!(row.figure.contains("P99 5.000 ms") && row.figure.contains("not met"));
        o.cancel_to_quiet.push(ms(150));
        o.cancel_to_quiet.push(ms(150));
        assert_eq!(cancel_propagation(Phase::Load, &o).verdict, Verdict::Fail);
    }

    #[test]
    fn rollout_rows_wait_without_the_modes_and_count_apart_with_them() {
        let rows = rollout_rows(Rollout::default());
        assert!(rows.iter().all(|r| r.verdict == Verdict::Waiting));
        assert!(passed(&rows));
        let rows = rollout_rows(Rollout {
            shadow: Some(3),
            over_rejection_cap: Some(0),
        });
        assert!(rows.iter().all(|r| r.verdict == Verdict::Pass));
    }
}
