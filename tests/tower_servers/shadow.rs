//! Shadow mode over real loopback servers (axum + reqwest, the real clock): the seed chain
//! frontend → orders → inventory → external with a client budget of 100 ms and a slow
//! inventory. Enforcing, the budget stops inventory and the external service never sees the
//! request; shadowing, the outcome is that of per-hop timeouts, and every hop records what
//! scoped budgets would have done.
//!
//! Inventory's 400 ms of work is the scenario (a slow dependency), not a wait for anything to
//! settle; every wait of the test is on a response or a report, bounded by `PATIENCE`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use cancel_scope::wire::{EndpointPolicy, Mode, Trust};
use cancel_scope::Scope;

use crate::support::servers::{call_next, next_report};
use crate::support::time::ms;
use crate::support::tower::{reporting, Reports};

#[derive(Clone)]
struct Hop {
    name: &'static str,
    next: Option<String>,
    /// Work before the call to the next hop.
    work: Duration,
    client: reqwest::Client,
    calls: Arc<AtomicUsize>,
}

async fn hop(State(h): State<Hop>) -> Result<String, StatusCode> {
    h.calls.fetch_add(1, Ordering::SeqCst);
    if !h.work.is_zero() {
        // Enforcing, the scope's deadline stops this work.
        Scope::current()
            .run(tokio::time::sleep(h.work))
            .await
            .map_err(|_| StatusCode::GATEWAY_TIMEOUT)?;
    }
    let Some(next) = &h.next else {
        return Ok(h.name.to_owned());
    };
    let below = call_next(&h.client, next).await?;
    Ok(format!("{} > {below}", h.name))
}

/// The seed chain under `mode`: the answer to a 100 ms client budget, how many requests
/// reached each hop, and each hop's reports (frontend first).
async fn chain(mode: Mode) -> (StatusCode, String, [usize; 4], Vec<Reports>) {
    // Per-hop timeouts of 30 s (the hard cap); a generous pad for a loaded machine.
    let policy = EndpointPolicy::builder(ms(30_000))
        .transport_pad(ms(5))
        .trust(Trust::Trusted)
        .mode(mode)
        .build();
    let client = reqwest::Client::new();
    let mut next = None;
    let mut reports = Vec::new();
    let mut counts = Vec::new();
    for (name, work) in [
        ("external", ms(0)),
        ("inventory", ms(400)),
        ("orders", ms(0)),
        ("frontend", ms(0)),
    ] {
        let (layer, rx) = reporting(policy);
        reports.push(rx);
        let calls = Arc::new(AtomicUsize::new(0));
        counts.push(calls.clone());
        let state = Hop {
            name,
            next: next.take(),
            work,
            client: client.clone(),
            calls,
        };
        let app = Router::new()
            .route("/", get(hop))
            .with_state(state)
            .layer(layer);
        let addr = crate::support::servers::serve(app).await;
        next = Some(format!("http://{addr}/"));
    }
    let res = client
        .get(next.unwrap())
        .header("grpc-timeout", "100m")
        .send()
        .await
        .unwrap();
    let status = StatusCode::from_u16(res.status().as_u16()).unwrap();
    let text = res.text().await.unwrap();
    reports.reverse();
    counts.reverse();
    let counts = [0, 1, 2, 3].map(|i| counts[i].load(Ordering::SeqCst));
    (status, text, counts, reports)
}

#[tokio::test]
async fn enforcing_the_budget_stops_inventory_and_external_never_sees_the_request() {
    let (status, _, counts, mut reports) = chain(Mode::Enforce).await;
    // Inventory's own deadline answers 504 first; the hops above pass the failure up (502 or
    // their own 504, whichever comes first).
    assert!(
        [StatusCode::BAD_GATEWAY, StatusCode::GATEWAY_TIMEOUT].contains(&status),
        "{status}"
    );
    assert_eq!(counts, [1, 1, 1, 0]);
    let (_, inventory) = next_report(&mut reports[2]).await;
    assert!(inventory.would_be().is_empty(), "{inventory}");
}

#[tokio::test]
async fn shadow_mode_changes_no_outcome_and_records_each_would_be_decision() {
    let (status, text, counts, mut reports) = chain(Mode::Shadow).await;
    // As with per-hop timeouts: every hop ran, and external saw the request.
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text, "frontend > orders > inventory > external");
    assert_eq!(counts, [1, 1, 1, 1]);

    let mut decisions = Vec::new();
    for rx in &mut reports {
        let (a, report) = next_report(rx).await;
        assert!(a.is_shadowed());
        decisions.push(report.would_be().into_iter().cloned().collect::<Vec<_>>());
    }
    let [frontend, orders, inventory, external] = &decisions[..] else {
        unreachable!()
    };
    // Each hop would have cancelled at its would-be deadline: it answered after it.
    for (name, hop) in [
        ("frontend", frontend),
        ("orders", orders),
        ("inventory", inventory),
    ] {
        let late = hop
            .iter()
            .filter(|d| !d.is_child_late())
            .find_map(|d| d.late_by());
        assert!(late.is_some(), "{name}: {hop:?}");
    }
    // Inventory's would-be budget ran out during its work: the call to external would not
    // have been sent, and external's admission would have refused it (a would-be budget of 0).
    assert!(inventory.iter().any(|d| d.is_not_sent()), "{inventory:?}");
    assert!(external.iter().any(|d| d.is_refusal()), "{external:?}");
    // Frontend, which answered after inventory's 400 ms, is at least 300 ms late.
    let late = frontend
        .iter()
        .filter(|d| !d.is_child_late())
        .find_map(|d| d.late_by())
        .unwrap();
    assert!(late >= ms(300), "{late:?}");
}
