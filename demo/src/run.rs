//! One mode's run: start the chain, send the success and the failure request, wait until
//! every service is done with each, and check the claims.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::wire::grpc_timeout;
use tokio::time::Instant;

use cancel_scope::Report;

use crate::chain::{Chain, ENFORCED_VERSION, REQUEST_ID, SHADOW_VERSION};
use crate::options::{Mode, Options};
use crate::outcome::{
    describe_work, millis, yes, Check, ClientOutcome, Group, ModeRun, RequestRun, Work,
};
use crate::record::{Event, Hop, Recorder, What};

/// How long past the budgets and the work the run waits for the services to be done with a
/// request before it calls that a failure (a bound on waiting for events, never a sleep),
/// before the time scale.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// How long the run waits, after the client's call, for a request on its way to a hop to
/// reach that hop's server. On a loaded machine a server can read a request well after its
/// caller gave up; but a caller that gave up before its connection wrote the request (while
/// connecting, say) sent nothing, and no event tells the two apart. Before the time scale.
pub(crate) const ARRIVAL: Duration = Duration::from_secs(1);

/// The servers could not be started.
#[derive(Debug)]
pub struct DemoError(std::io::Error);

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not start the services on 127.0.0.1: {}", self.0)
    }
}

impl std::error::Error for DemoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Starts `mode`'s chain, sends the success request (2 s budget) and then the failure request
/// (`options.client_budget`), waits until the services are done with each, and checks the
/// claims. In [`Mode::Shadow`] it then switches every hop's policy to enforcing, without
/// restarting the servers, and sends the failure request again ([`ModeRun::enforced`]).
/// Every duration is multiplied by `options.time_scale`.
///
/// # Errors
///
/// [`DemoError`] if a server cannot listen on 127.0.0.1.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), cancel_scope_demo::DemoError> {
/// use cancel_scope_demo::{run_mode, Mode, Options, Work};
///
/// let run = run_mode(Mode::Scoped, &Options { time_scale: 5, ..Options::default() }).await?;
/// assert!(run.passed());
/// assert!(matches!(run.failure().inventory_work(), Work::Stopped { .. }));
/// # Ok(()) }
/// ```
pub async fn run_mode(mode: Mode, options: &Options) -> Result<ModeRun, DemoError> {
    let rec = Recorder::new();
    let t = options.timing();
    let chain = Chain::start(mode, &t, &rec).map_err(DemoError)?;
    let bench = Bench {
        mode,
        // The client is not one of the services: its own connection pool.
        client: reqwest::Client::new(),
        url: chain.frontend.clone(),
        rec,
        arrival: t.arrival,
        patience: t.success.max(t.client) + t.quote + t.patience,
    };
    let success = bench.send(Group::Success, t.success).await;
    let failure = bench.send(Group::Failure, t.client).await;
    // Shadow mode: every hop's policy becomes enforcing, its server running on; the failure
    // request again.
    let enforced = if mode == Mode::Shadow {
        chain.enforce();
        Some(bench.send(Group::Enforced, t.client).await)
    } else {
        None
    };
    drop(chain);
    let checks = checks(mode, options, &success, &failure, enforced.as_ref());
    Ok(ModeRun {
        mode,
        options: *options,
        success,
        failure,
        enforced,
        checks,
    })
}

/// The client's side of one mode's run.
struct Bench {
    mode: Mode,
    client: reqwest::Client,
    url: String,
    rec: Recorder,
    arrival: Duration,
    patience: Duration,
}

impl Bench {
    /// Sends the request of `group` with `budget`, then waits until every service that saw it
    /// is done with it (bounded by the patience), and collects its events.
    async fn send(&self, group: Group, budget: Duration) -> RequestRun {
        let (mode, rec) = (self.mode, &self.rec);
        let id: Arc<str> = format!("{mode}/{}", group.name()).into();
        let sent = Instant::now();
        let client = call(&self.client, &self.url, &id, budget).await;
        let elapsed = sent.elapsed();
        // First every request on its way arrives (or, after a while, is taken never to have
        // been sent), then every service that read it is done with it.
        let arrived = |events: &[Event]| settled(events, &id, mode, &client, true);
        let settled = rec.wait_until(self.arrival, arrived).await
            || rec
                .wait_until(self.patience, |events| {
                    settled(events, &id, mode, &client, false)
                })
                .await;
        RequestRun {
            mode,
            group,
            events: rec.events_of(&id),
            id,
            budget,
            sent,
            elapsed,
            client,
            settled,
            patience: self.patience,
        }
    }
}

/// The client: like `curl --max-time`, it gives up when its budget runs out, and it declares
/// that budget in `grpc-timeout` (which only the scoped chain reads).
async fn call(client: &reqwest::Client, url: &str, id: &str, budget: Duration) -> ClientOutcome {
    let sent = client
        .get(url)
        .header(REQUEST_ID, id)
        .header(grpc_timeout::HEADER, grpc_timeout::encode(budget))
        .timeout(budget)
        .send()
        .await;
    let failed = |e: reqwest::Error| {
        if e.is_timeout() {
            ClientOutcome::TimedOut
        } else {
            ClientOutcome::Failed(e.to_string())
        }
    };
    match sent {
        Ok(res) => {
            let status = res.status().as_u16();
            match res.text().await {
                Ok(body) => ClientOutcome::Answered { status, body },
                Err(e) => failed(e),
            }
        }
        Err(e) => failed(e),
    }
}

/// Whether every service is done with request `id`: every server that read it is done with
/// it, every handler answered or was dropped, inventory's quote ended, and (scoped) every
/// request scope that ran a handler reported quiescence. With `arrivals`, also every request
/// on its way to a hop (the client's to frontend, a call a hop made and did not see end)
/// reached that hop's server.
///
/// A hop whose server has not read a request sent to it is not done with it: on a loaded
/// machine a server can read a request after its caller gave up, and its handler then runs.
fn settled(events: &[Event], id: &str, mode: Mode, client: &ClientOutcome, arrivals: bool) -> bool {
    let of = |hop: Hop| events.iter().filter(move |e| e.hop == hop && &*e.id == id);
    // Whether a request is on its way to `to` (unless it has arrived).
    let sent_to = |to: Hop| match to {
        // Unless the client could not send it at all (a refused connection, say).
        Hop::Frontend => !matches!(client, ClientOutcome::Failed(_)),
        // A call that ended has its answer, or failed (and then whether the request went out
        // is not known here); a call that did not end was dropped with its caller after the
        // request went out, or is still waiting for its answer.
        to => Hop::ALL.iter().any(|&from| {
            let calling = of(from).filter(|e| matches!(e.what, What::Calling { to: t } if t == to));
            let ended =
                of(from).filter(|e| matches!(e.what, What::CallEnded { to: t, .. } if t == to));
            calling.count() > ended.count()
        }),
    };
    Hop::ALL.iter().all(|&hop| {
        let (mut received, mut left) = (false, false);
        let (mut started, mut ended, mut quiet, mut working) = (false, false, false, false);
        for e in of(hop) {
            match e.what {
                What::Received => received = true,
                What::Left { .. } => left = true,
                What::Started { .. } => started = true,
                What::Answered { .. } | What::Dropped { .. } => ended = true,
                What::Quiet { .. } => quiet = true,
                What::WorkStarted { .. } => working = true,
                What::WorkFinished { .. } | What::WorkStopped { .. } => working = false,
                _ => {}
            }
        }
        (received || !arrivals || !sent_to(hop))
            && (!received || left)
            && (!started || (ended && !working && (quiet || mode == Mode::PerHop)))
    })
}

fn check(r: &RequestRun, claim: String, passed: bool, detail: String) -> Check {
    Check {
        request: r.id.clone(),
        claim,
        passed,
        detail,
    }
}

/// The claims of a mode, checked against what the client got and the services logged.
fn checks(
    mode: Mode,
    options: &Options,
    success: &RequestRun,
    failure: &RequestRun,
    enforced: Option<&RequestRun>,
) -> Vec<Check> {
    let ms = |d: Duration| d.as_millis();
    let mut out = Vec::new();
    for r in [success, failure].into_iter().chain(enforced) {
        if !r.settled {
            out.push(check(
                r,
                "every service was done with the request".to_owned(),
                false,
                format!("still busy after waiting {:.1} s", r.patience.as_secs_f64()),
            ));
        }
    }

    // The success group reaches inventory v1 and external-stub.
    let through = matches!(
        &success.client,
        ClientOutcome::Answered { status: 200, body }
            if body.contains("inventory v1") && body.contains("external-stub")
    );
    out.push(check(
        success,
        "the client got 200 from inventory v1 and external-stub".to_owned(),
        through,
        format!("{} after {:.1} ms", success.client, millis(success.elapsed)),
    ));
    out.push(check(
        success,
        "inventory and external-stub logged the request id".to_owned(),
        success.saw(Hop::Inventory) && success.saw(Hop::External),
        format!(
            "inventory: {}, external-stub: {}",
            yes(success.saw(Hop::Inventory)),
            yes(success.saw(Hop::External))
        ),
    ));

    // The failure group: the client gives up, external-stub never hears of the request.
    for failure in [failure].into_iter().chain(enforced) {
        out.push(check(
            failure,
            format!(
                "the client got no quote within its {} ms (it timed out, or was told 504)",
                ms(failure.budget)
            ),
            failure.client.gave_up(),
            format!("{} after {:.1} ms", failure.client, millis(failure.elapsed)),
        ));
        let external = failure.saw(Hop::External) || failure.called(Hop::Orders, Hop::External);
        out.push(check(
            failure,
            "external-stub never saw the request id".to_owned(),
            !external,
            format!(
                "orders called it: {}, it logged the id: {}",
                yes(failure.called(Hop::Orders, Hop::External)),
                yes(failure.saw(Hop::External))
            ),
        ));
    }

    let quote = options.timing().quote;
    let work = ms(quote);
    match mode {
        // The claim: the quote ran on after the client had left (when it did,
        // not when its budget said it would: its timer can fire late).
        Mode::PerHop => {
            let (passed, detail) = match failure.inventory_work() {
                Work::Finished { at, .. } if at > failure.client_done() => (
                    true,
                    format!(
                        "finished {:.1} ms after the client gave up",
                        millis(at - failure.client_done())
                    ),
                ),
                Work::Finished { at, .. } => (
                    false,
                    format!(
                        "finished {:.1} ms before the client gave up",
                        millis(failure.client_done() - at)
                    ),
                ),
                w => (false, describe_work(&w, failure)),
            };
            out.push(check(
                failure,
                format!("inventory still finished its {work} ms quote after the client gave up"),
                passed,
                detail,
            ));
        }
        Mode::Scoped => {
            out.push(stopped_by_its_scope(failure, quote));
            for r in [success, failure] {
                out.push(quiescence(r));
            }
        }
        Mode::Shadow => {
            out.extend(shadow_checks(failure, quote));
            for r in [success, failure].into_iter().chain(enforced) {
                out.push(quiescence(r));
            }
            if let Some(enforced) = enforced {
                out.push(stopped_by_its_scope(enforced, quote));
                out.push(versions(success, failure, enforced));
            }
        }
    }
    out
}

/// Only a quote that started and then stopped shows that the scope stopped it: one that never
/// started (the request refused, or its budget spent before inventory) proves nothing.
fn stopped_by_its_scope(failure: &RequestRun, quote: Duration) -> Check {
    let w = failure.inventory_work();
    let passed = match &w {
        Work::Stopped { worked, .. } => *worked < quote,
        Work::NotStarted | Work::Running | Work::Finished { .. } => false,
    };
    check(
        failure,
        format!(
            "inventory started its {} ms quote and stopped before finishing it",
            quote.as_millis()
        ),
        passed,
        describe_work(&w, failure),
    )
}

/// Every hop that ran the request reported its scope's stable quiescence.
fn quiescence(r: &RequestRun) -> Check {
    let missing: Vec<_> = Hop::ALL
        .into_iter()
        .filter(|&h| r.saw(h) && !r.report(h).is_some_and(|rep| rep.state().is_final()))
        .map(Hop::name)
        .collect();
    let passed = missing.is_empty();
    let detail = match r.report(Hop::Frontend) {
        _ if !passed => format!("no report from {}", missing.join(", ")),
        Some(rep) => format!("edge: {:?}", rep.state()),
        // Refused at admission: no scope was made, nothing ran.
        None if r.received(Hop::Frontend) => {
            "no handler ran: the edge refused the request".to_owned()
        }
        None => "no handler ran: the request never reached the edge".to_owned(),
    };
    check(
        r,
        "every hop's request scope reported stable quiescence".to_owned(),
        passed,
        detail,
    )
}

/// Shadow mode's claims on the failure request: nothing was enforced — the client timed out
/// on its own, as with per-hop timeouts, and inventory's quote ran past the deadline its
/// budget would have had — and every hop recorded what its budget would have done.
/// How long after its would-be deadline the request of a report ended (not one of its
/// children, whose own late ends are listed beside it).
pub(crate) fn request_late_by(decisions: &[&cancel_scope::wire::WouldBe]) -> Option<Duration> {
    decisions
        .iter()
        .filter(|d| !d.is_child_late())
        .find_map(|d| d.late_by())
}

fn shadow_checks(failure: &RequestRun, quote: Duration) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(check(
        failure,
        "no hop answered 504: the client timed out on its own, as with per-hop timeouts".to_owned(),
        failure.client == ClientOutcome::TimedOut,
        format!("{} after {:.1} ms", failure.client, millis(failure.elapsed)),
    ));
    let would_be = failure.would_be_deadline(Hop::Inventory).flatten();
    let w = failure.inventory_work();
    let (passed, detail) = match (&w, would_be) {
        (Work::Finished { at, .. } | Work::Stopped { at, .. }, Some(d)) if *at > d => {
            let deadline = matches!(&w, Work::Stopped { cause: Some(c), .. } if c.origin().is_deadline_exceeded());
            (
                !deadline,
                format!(
                    "{}, {:.1} ms past its would-be deadline",
                    describe_work(&w, failure),
                    millis(*at - d)
                ),
            )
        }
        (_, None) => (false, "inventory has no would-be deadline".to_owned()),
        _ => (false, describe_work(&w, failure)),
    };
    out.push(check(
        failure,
        format!(
            "inventory's {} ms quote ran past its would-be deadline: no budget stopped it",
            quote.as_millis()
        ),
        passed,
        detail,
    ));
    let shadowed: Vec<_> = Hop::ALL
        .into_iter()
        .filter(|&h| failure.saw(h) && failure.would_be_deadline(h).is_none())
        .map(Hop::name)
        .collect();
    out.push(check(
        failure,
        "every hop that ran the request ran it in shadow mode (policy version 1)".to_owned(),
        shadowed.is_empty() && failure.saw(Hop::Frontend),
        if shadowed.is_empty() {
            "each hop's admission has its would-be deadline".to_owned()
        } else {
            format!("enforced at {}", shadowed.join(", "))
        },
    ));
    let late = failure
        .report(Hop::Inventory)
        .and_then(|rep| request_late_by(&rep.would_be()));
    out.push(check(
        failure,
        "inventory's report says its budget would have cancelled the request".to_owned(),
        late.is_some(),
        late.map_or_else(
            || "no would-be cancel in inventory's report".to_owned(),
            |d| format!("ended {:.1} ms after the would-be deadline", millis(d)),
        ),
    ));
    out
}

/// The policy version each hop's report names: 1 (shadow) before the switch, 2 (enforcing)
/// after it, from the same servers.
fn versions(success: &RequestRun, failure: &RequestRun, enforced: &RequestRun) -> Check {
    let of = |r: &RequestRun| -> Vec<u32> {
        Hop::ALL
            .into_iter()
            .filter_map(|h| r.report(h).and_then(Report::policy_version))
            .collect()
    };
    let (before, after) = ([of(success), of(failure)].concat(), of(enforced));
    let passed = !before.is_empty()
        && before.iter().all(|&v| v == SHADOW_VERSION)
        && !after.is_empty()
        && after.iter().all(|&v| v == ENFORCED_VERSION)
        && Hop::ALL
            .into_iter()
            .all(|h| enforced.would_be_deadline(h).is_none());
    check(
        enforced,
        "after the switch every hop enforced its budget (policy version 2), no server restarted"
            .to_owned(),
        passed,
        format!("versions before: {before:?}, after: {after:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(hop: Hop, what: What) -> Event {
        Event {
            at: Instant::now(),
            hop,
            id: "per-hop/failure".into(),
            what,
        }
    }

    /// On a loaded machine a hop's server can read a request after its caller gave up: the
    /// run must not take its snapshot before that hop's events are in.
    #[test]
    fn a_request_on_its_way_to_a_hop_is_not_settled() {
        let id = "per-hop/failure";
        // The client gave up before frontend's server read the request.
        let gave_up = ClientOutcome::TimedOut;
        assert!(!settled(&[], id, Mode::PerHop, &gave_up, true));
        // Frontend called orders and was dropped before orders' server read the call.
        let events = [
            event(
                Hop::Frontend,
                What::Started {
                    budget: None,
                    deadline: None,
                },
            ),
            event(Hop::Frontend, What::Calling { to: Hop::Orders }),
            event(Hop::Frontend, What::Dropped { cause: None }),
        ];
        assert!(!settled(&events, id, Mode::PerHop, &gave_up, true));
        // Unless it was never sent: after a while the run stops waiting for it to arrive.
        assert!(settled(&events, id, Mode::PerHop, &gave_up, false));
        // Once orders' server read the call and is done with it, and no hop is busy, it is.
        let events = [
            &events[..],
            &[
                event(Hop::Frontend, What::Received),
                event(Hop::Frontend, What::Left { status: None }),
                event(Hop::Orders, What::Received),
                event(Hop::Orders, What::Left { status: None }),
            ],
        ]
        .concat();
        assert!(settled(&events, id, Mode::PerHop, &gave_up, true));
        // A server that read the request is busy with it until it is done (a handler may be
        // about to start, or admission about to refuse).
        let events = [event(Hop::Frontend, What::Received)];
        assert!(!settled(&events, id, Mode::PerHop, &gave_up, false));
    }

    /// A request run: the client sent it at `sent`, waited `elapsed` and got `client`.
    fn request(
        group: Group,
        sent: Instant,
        elapsed: Duration,
        client: ClientOutcome,
        events: Vec<Event>,
    ) -> RequestRun {
        RequestRun {
            mode: Mode::PerHop,
            group,
            id: "per-hop/failure".into(),
            budget: Duration::from_millis(100),
            sent,
            elapsed,
            client,
            settled: true,
            patience: PATIENCE,
            events,
        }
    }

    /// The per-hop claim is about when the client gave up, not about when its budget ran
    /// out: a client whose timer fired late (a loaded machine) was still waiting when the
    /// quote finished, and the claim does not hold.
    #[test]
    fn the_quote_is_compared_with_when_the_client_gave_up() {
        let sent = Instant::now();
        let ms = Duration::from_millis;
        let work = |started: u64, finished: u64| {
            vec![
                Event {
                    at: sent + ms(started),
                    ..event(Hop::Inventory, What::WorkStarted { planned: ms(350) })
                },
                Event {
                    at: sent + ms(finished),
                    ..event(Hop::Inventory, What::WorkFinished { worked: ms(395) })
                },
            ]
        };
        let claim = |elapsed: u64| {
            let success = request(
                Group::Success,
                sent,
                ms(360),
                ClientOutcome::TimedOut,
                vec![],
            );
            let failure = request(
                Group::Failure,
                sent,
                ms(elapsed),
                ClientOutcome::TimedOut,
                work(3, 398),
            );
            checks(Mode::PerHop, &Options::default(), &success, &failure, None)
                .into_iter()
                .find(|c| c.claim.starts_with("inventory still finished"))
                .unwrap()
        };
        // The client gave up at 630 ms (its 100 ms timer fired late): the quote had ended.
        let late = claim(630);
        assert!(!late.passed, "{}", late.detail);
        // It gave up at 101 ms: the quote ended 297 ms later.
        let on_time = claim(101);
        assert!(on_time.passed, "{}", on_time.detail);
        assert!(
            on_time.detail.contains("after the client gave up"),
            "{}",
            on_time.detail
        );
    }
}
