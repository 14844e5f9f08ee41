//! What a mode's run yields: each request's outcome at the client and at every hop
//! ([`RequestRun`]), the claims checked on them ([`Check`]), and the mode's run ([`ModeRun`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{Cause, Report};
use tokio::time::Instant;

use crate::options::{Mode, Options};
use crate::record::{Event, Hop, What};

/// The two requests of a mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// A 2 s client budget: the request must go through.
    Success,
    /// The short client budget (`--client-ms`): the client gives up.
    Failure,
    /// Shadow mode: the failure request again, once every hop's policy enforces.
    Enforced,
}

impl Group {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Group::Success => "success",
            Group::Failure => "failure",
            Group::Enforced => "enforced",
        }
    }
}

/// What the client got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOutcome {
    /// An answer: status and body.
    Answered {
        /// The HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
    /// The client's own timer (its budget) ran out first: it gave up (curl's exit 28).
    TimedOut,
    /// The call failed otherwise.
    Failed(String),
}

impl ClientOutcome {
    /// Whether the client got nothing useful within its budget: it timed out, or the chain
    /// told it that the deadline passed (504).
    pub fn gave_up(&self) -> bool {
        matches!(
            self,
            ClientOutcome::TimedOut | ClientOutcome::Answered { status: 504, .. }
        )
    }
}

impl fmt::Display for ClientOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientOutcome::Answered { status, body } => {
                let reason = reqwest::StatusCode::from_u16(*status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("");
                write!(f, "{status} {reason}")?;
                if !body.is_empty() {
                    write!(f, " {body:?}")?;
                }
                Ok(())
            }
            ClientOutcome::TimedOut => f.write_str("timed out (the client gave up)"),
            ClientOutcome::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

/// What became of inventory's quote for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Inventory never started it.
    NotStarted,
    /// Started and not ended when the run stopped waiting.
    Running,
    /// Ran to its end.
    Finished {
        /// When it ended.
        at: Instant,
        /// How long it worked.
        worked: Duration,
    },
    /// Stopped before its end.
    Stopped {
        /// When it stopped.
        at: Instant,
        /// How long it had worked.
        worked: Duration,
        /// Why, as its scope said (none in per-hop mode).
        cause: Option<Cause>,
    },
}

/// One request through one chain, and everything the services logged for it.
#[derive(Clone, Debug)]
pub struct RequestRun {
    pub(crate) mode: Mode,
    pub(crate) group: Group,
    pub(crate) id: Arc<str>,
    pub(crate) budget: Duration,
    pub(crate) sent: Instant,
    pub(crate) elapsed: Duration,
    pub(crate) client: ClientOutcome,
    /// Whether every service that saw the request was done with it in time.
    pub(crate) settled: bool,
    /// How long the run waited for that after the client's call.
    pub(crate) patience: Duration,
    pub(crate) events: Vec<Event>,
}

impl RequestRun {
    /// The request id (`<mode>/<group>`), sent as `x-request-id` and logged at every hop.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Which group it belongs to.
    pub fn group(&self) -> Group {
        self.group
    }

    /// The client's budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// What the client got.
    pub fn client(&self) -> &ClientOutcome {
        &self.client
    }

    /// How long the client waited.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// When the client sent the request.
    pub fn sent(&self) -> Instant {
        self.sent
    }

    /// When the client's budget ran out. Its timer can fire later than that on a loaded
    /// machine: [`client_done`](Self::client_done) is when it stopped waiting.
    pub fn client_deadline(&self) -> Instant {
        self.sent + self.budget
    }

    /// When the client stopped waiting: it had its answer, or it gave up.
    pub fn client_done(&self) -> Instant {
        self.sent + self.elapsed
    }

    /// Whether every service that saw the request was done with it before the run stopped
    /// waiting.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// Whether `hop`'s server ever read this request (admitted or refused).
    pub fn received(&self, hop: Hop) -> bool {
        self.of(hop).any(|e| matches!(e.what, What::Received))
    }

    /// Whether `hop`'s handler ever ran for this request.
    pub fn saw(&self, hop: Hop) -> bool {
        self.of(hop).any(|e| matches!(e.what, What::Started { .. }))
    }

    /// The budget `hop`'s handler found in its scope when it started (scoped mode).
    pub fn budget_at(&self, hop: Hop) -> Option<Duration> {
        self.of(hop).find_map(|e| match e.what {
            What::Started { budget, .. } => budget,
            _ => None,
        })
    }

    /// Whether `from` ever started a call to `to` for this request.
    pub fn called(&self, from: Hop, to: Hop) -> bool {
        self.of(from)
            .any(|e| matches!(e.what, What::Calling { to: t } if t == to))
    }

    /// What became of inventory's quote.
    pub fn inventory_work(&self) -> Work {
        let mut work = Work::NotStarted;
        for e in self.of(Hop::Inventory) {
            match &e.what {
                What::WorkStarted { .. } => work = Work::Running,
                What::WorkFinished { worked } => {
                    work = Work::Finished {
                        at: e.at,
                        worked: *worked,
                    }
                }
                What::WorkStopped { worked, cause } => {
                    work = Work::Stopped {
                        at: e.at,
                        worked: *worked,
                        cause: cause.clone(),
                    }
                }
                _ => {}
            }
        }
        work
    }

    /// The quiescence report of `hop`'s request scope (scoped mode).
    pub fn report(&self, hop: Hop) -> Option<&Report> {
        self.of(hop).find_map(|e| match &e.what {
            What::Quiet { report, .. } => Some(report),
            _ => None,
        })
    }

    /// Shadow mode: the deadline `hop`'s request would have had if its policy enforced
    /// (`Some(None)`: admission would have refused it); `None` if `hop` enforced (or did not
    /// report).
    pub fn would_be_deadline(&self, hop: Hop) -> Option<Option<Instant>> {
        self.of(hop).find_map(|e| match &e.what {
            What::Quiet {
                would_be_deadline, ..
            } => *would_be_deadline,
            _ => None,
        })
    }

    /// When `hop` was told to stop working on the request, and why: its budget ran out (the
    /// scope's deadline; its timer fires a little later), the client went away, or (per-hop)
    /// its caller hung up. `None` if it was never stopped (it answered).
    pub fn told_to_stop(&self, hop: Hop) -> Option<(Instant, String)> {
        let (at, cause) = self.of(hop).find_map(|e| match &e.what {
            What::Dropped { cause } => Some((e.at, cause.clone())),
            _ => None,
        })?;
        Some(match cause {
            Some(c) if c.is_deadline_exceeded() => {
                let deadline = self.of(hop).find_map(|e| match e.what {
                    What::Started { deadline, .. } => deadline,
                    _ => None,
                });
                (deadline.unwrap_or(at), "its budget ran out".to_owned())
            }
            Some(c) => (at, c.to_string()),
            None => (at, "its caller hung up".to_owned()),
        })
    }

    pub(crate) fn of(&self, hop: Hop) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.hop == hop)
    }
}

/// One claim of the report, checked.
#[derive(Clone, Debug)]
pub struct Check {
    pub(crate) request: Arc<str>,
    pub(crate) claim: String,
    pub(crate) passed: bool,
    pub(crate) detail: String,
}

impl Check {
    /// The request id the claim is about.
    pub fn request(&self) -> &str {
        &self.request
    }

    /// The claim.
    pub fn claim(&self) -> &str {
        &self.claim
    }

    /// Whether it holds.
    pub fn passed(&self) -> bool {
        self.passed
    }

    /// What was observed.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

/// One mode's run: its two requests and its checked claims.
#[derive(Clone, Debug)]
pub struct ModeRun {
    pub(crate) mode: Mode,
    pub(crate) options: Options,
    pub(crate) success: RequestRun,
    pub(crate) failure: RequestRun,
    pub(crate) enforced: Option<RequestRun>,
    pub(crate) checks: Vec<Check>,
}

impl ModeRun {
    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The request with the 2 s budget.
    pub fn success(&self) -> &RequestRun {
        &self.success
    }

    /// The request with the short budget.
    pub fn failure(&self) -> &RequestRun {
        &self.failure
    }

    /// Shadow mode: the failure request sent again after every hop's policy was switched to
    /// enforcing, its server running on.
    pub fn enforced(&self) -> Option<&RequestRun> {
        self.enforced.as_ref()
    }

    /// The claims, checked.
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }

    /// Whether every claim holds.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(Check::passed)
    }
}

/// A duration in fractional milliseconds.
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(crate) fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// What became of the quote, and how long after inventory was told to stop.
pub(crate) fn describe_work(w: &Work, r: &RequestRun) -> String {
    let after = |end: Instant| {
        r.told_to_stop(Hop::Inventory)
            .filter(|(t, _)| end >= *t)
            .map(|(t, why)| format!(", {:.1} ms after {why}", millis(end - t)))
            .unwrap_or_default()
    };
    match w {
        Work::NotStarted => "never started".to_owned(),
        Work::Running => "still running when the run stopped waiting".to_owned(),
        Work::Finished { worked, at } => {
            format!(
                "finished after {:.1} ms of work{}",
                millis(*worked),
                after(*at)
            )
        }
        Work::Stopped { worked, cause, at } => {
            let why = cause
                .as_ref()
                .map_or_else(|| "dropped".to_owned(), ToString::to_string);
            format!(
                "stopped after {:.1} ms of work ({why}){}",
                millis(*worked),
                after(*at)
            )
        }
    }
}
