//! Policy versions swapped at run time (`AdmitLayer::versioned`, feature `rollout`) over real
//! loopback servers: axum servers, reqwest clients, the real clock.
//!
//! Every wait is on an observable event (a response, a report, a handler's signal), bounded by
//! `PATIENCE`; the assertions are about which version admitted what, never exact milliseconds.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Router};
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::{Admission, EndpointPolicy, PolicyHandle, Trust};
use cancel_scope::Scope;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::timeout;

use crate::support::servers::{call_next, PATIENCE};
use crate::support::time::ms;
use crate::support::tower::Reports;

/// A versioned admission layer over `policies` whose reports come out of the channel.
fn reporting(policies: &PolicyHandle) -> (AdmitLayer, Reports) {
    let (tx, rx) = mpsc::unbounded_channel();
    let layer = AdmitLayer::versioned(policies).on_report(move |a, r| {
        let _ = tx.send((a.clone(), r.clone()));
    });
    (layer, rx)
}

async fn serve(app: Router) -> String {
    let addr = crate::support::servers::serve(app).await;
    format!("http://{addr}/")
}

/// Version `v`: a maximum of 60 s and a default of `60 - v` seconds, so that a request's
/// budget also tells which version admitted it.
fn version(v: u32) -> EndpointPolicy {
    EndpointPolicy::builder(ms(60_000))
        .default_budget(ms(60_000 - u64::from(v) * 1_000))
        .version(v)
        .build()
}

/// What the held handler is given: the release, and where it says it was admitted.
#[derive(Clone)]
struct Hold {
    release: watch::Receiver<bool>,
    entered: mpsc::UnboundedSender<u32>,
}

/// Says which version admitted the request, then answers with it and its budget once
/// `release` says so.
async fn held(State(hold): State<Hold>, Extension(a): Extension<Admission>) -> String {
    let _ = hold.entered.send(a.policy_version());
    let mut release = hold.release.clone();
    let _ = release.wait_for(|go| *go).await;
    format!(
        "{} {}",
        a.policy_version(),
        a.initial_remaining().as_millis()
    )
}

#[tokio::test]
async fn a_version_swap_under_load_loses_no_request_and_each_reports_its_version() {
    let policies = PolicyHandle::new(version(1)).unwrap();
    let (layer, mut reports) = reporting(&policies);
    let (release, held_until) = watch::channel(false);
    let (entered, mut admitted) = mpsc::unbounded_channel();
    let hold = Hold {
        release: held_until,
        entered,
    };
    let url = serve(
        Router::new()
            .route("/", get(held))
            .with_state(hold)
            .layer(layer),
    )
    .await;
    let client = reqwest::Client::new();

    // Requests keep coming while the version changes four times: each batch is admitted (and
    // held in its handler) before the next swap, so requests of every version are in flight
    // at once when they are released.
    const BATCH: usize = 25;
    let mut calls = Vec::new();
    for v in 1..=5u32 {
        if v > 1 {
            policies.set(version(v)).unwrap();
        }
        for _ in 0..BATCH {
            let (client, url) = (client.clone(), url.clone());
            calls.push(tokio::spawn(async move {
                let res = client.get(&url).send().await.unwrap();
                assert_eq!(res.status(), 200);
                res.text().await.unwrap()
            }));
        }
        // This batch is in its handlers before the next swap.
        for _ in 0..BATCH {
            let entered = timeout(PATIENCE, admitted.recv()).await.unwrap().unwrap();
            assert_eq!(entered, v);
        }
    }
    release.send(true).unwrap();

    let mut answered: HashMap<u32, usize> = HashMap::new();
    for call in calls {
        let text = timeout(PATIENCE, call).await.unwrap().unwrap();
        let mut parts = text.split(' ');
        let v: u32 = parts.next().unwrap().parse().unwrap();
        let granted: u64 = parts.next().unwrap().parse().unwrap();
        // The budget is the admitting version's default, less the time it queued.
        let default = 60_000 - u64::from(v) * 1_000;
        assert!(granted <= default && granted + 1_000 > default, "{text}");
        *answered.entry(v).or_default() += 1;
    }
    assert_eq!(
        answered,
        (1..=5).map(|v| (v, BATCH)).collect::<HashMap<_, _>>(),
        "every request answered once, by the version current when it came"
    );

    // One report per request, naming the same version as its admission.
    let mut reported: HashMap<u32, usize> = HashMap::new();
    for _ in 0..5 * BATCH {
        let (a, report) = timeout(PATIENCE, reports.recv()).await.unwrap().unwrap();
        assert_eq!(
            report.policy_version(),
            Some(a.policy_version()),
            "{report}"
        );
        *reported.entry(a.policy_version()).or_default() += 1;
    }
    assert_eq!(reported, answered);
}

/// Answers at once with the admitting version and the budget it granted.
async fn which(Extension(a): Extension<Admission>) -> String {
    format!(
        "{} {}",
        a.policy_version(),
        a.initial_remaining().as_millis()
    )
}

#[tokio::test]
async fn versions_swapped_while_requests_race_never_mix_two_versions_in_one_request() {
    let policies = PolicyHandle::new(version(1)).unwrap();
    let (layer, mut reports) = reporting(&policies);
    let url = serve(Router::new().route("/", get(which)).layer(layer)).await;
    let client = reqwest::Client::new();

    const CLIENTS: usize = 8;
    const EACH: usize = 25;
    // The swapper sets a new version each time client 0 has an answer, and client 0 waits
    // for it: client 0's requests see every version; the others race the swaps.
    let (answered_tx, mut answered_rx) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let mut calls = Vec::new();
    for i in 0..CLIENTS {
        let (client, url) = (client.clone(), url.clone());
        let answered = (i == 0).then(|| answered_tx.clone());
        calls.push(tokio::spawn(async move {
            let mut texts = Vec::new();
            for _ in 0..EACH {
                let res = client.get(&url).send().await.unwrap();
                assert_eq!(res.status(), 200);
                texts.push(res.text().await.unwrap());
                if let Some(answered) = &answered {
                    let (swapped, wait) = oneshot::channel();
                    answered.send(swapped).unwrap();
                    wait.await.unwrap();
                }
            }
            texts
        }));
    }
    drop(answered_tx);
    let swapper = {
        let policies = policies.clone();
        tokio::spawn(async move {
            let mut v = 1;
            while let Some(swapped) = answered_rx.recv().await {
                v += 1;
                policies.set(version(v)).unwrap();
                let _ = swapped.send(());
            }
            v
        })
    };
    let mut texts = Vec::new();
    for call in calls {
        texts.extend(timeout(PATIENCE, call).await.unwrap().unwrap());
    }
    let last = timeout(PATIENCE, swapper).await.unwrap().unwrap();
    assert_eq!(last, 1 + EACH as u32);
    assert_eq!(texts.len(), CLIENTS * EACH);
    let mut seen = std::collections::BTreeSet::new();
    for text in &texts {
        let mut parts = text.split(' ');
        let v: u64 = parts.next().unwrap().parse().unwrap();
        seen.insert(v);
        let granted: u64 = parts.next().unwrap().parse().unwrap();
        // The budget is the admitting version's: its default less what the request queued.
        let default = 60_000 - v * 1_000;
        assert!(granted <= default && granted + 1_000 > default, "{text}");
    }
    // Client 0 alone saw versions 1 to 25.
    assert!(seen.len() >= EACH, "{seen:?}");
    for _ in 0..CLIENTS * EACH {
        let (a, report) = timeout(PATIENCE, reports.recv()).await.unwrap().unwrap();
        assert_eq!(
            report.policy_version(),
            Some(a.policy_version()),
            "{report}"
        );
    }
}

/// One hop of a chain: calls the next hop, if any, and answers with what it was admitted
/// under (`version/caller's pv`) and what the hop below answered.
#[derive(Clone)]
struct Hop {
    next: Option<String>,
    client: reqwest::Client,
}

async fn hop(
    State(h): State<Hop>,
    Extension(a): Extension<Admission>,
) -> Result<String, StatusCode> {
    let here = format!(
        "{}/{}",
        a.policy_version(),
        a.caller_policy_version()
            .map_or_else(|| "-".to_owned(), |v| v.to_string())
    );
    let Some(next) = &h.next else {
        return Ok(here);
    };
    assert_eq!(
        Scope::current().operation().unwrap().policy_version(),
        a.policy_version()
    );
    let below = call_next(&h.client, next).await?;
    Ok(format!("{here} > {below}"))
}

/// Serves a hop admitting under `policies`, calling `next`.
async fn hop_server(layer: AdmitLayer, next: Option<String>) -> String {
    let state = Hop {
        next,
        client: reqwest::Client::new(),
    };
    serve(
        Router::new()
            .route("/", get(hop))
            .with_state(state)
            .layer(layer),
    )
    .await
}

#[tokio::test]
async fn a_hop_of_a_newer_version_talks_to_a_hop_of_an_older_one() {
    let trusted = |v| {
        version(v)
            .to_builder()
            .transport_pad(ms(2_000))
            .trust(Trust::Trusted)
            .build()
    };
    // The older hop knows version 1 only; the newer hop holds 1 and 2 (its current).
    let older = PolicyHandle::new(trusted(1)).unwrap();
    let newer = PolicyHandle::new(trusted(1)).unwrap();
    newer.set(trusted(2)).unwrap();
    // A hop whose policy predates versions altogether: a fixed policy of version 0, which
    // reads `pv` as any v1 reader reads an unknown member... and writes none.
    let fixed = EndpointPolicy::builder(ms(60_000))
        .default_budget(ms(30_000))
        .transport_pad(ms(2_000))
        .trust(Trust::Trusted)
        .build();

    // newer -> older -> fixed -> newer
    let tail = hop_server(AdmitLayer::versioned(&newer), None).await;
    let third = hop_server(AdmitLayer::new(fixed), Some(tail)).await;
    let second = hop_server(AdmitLayer::versioned(&older), Some(third)).await;
    let first = hop_server(AdmitLayer::versioned(&newer), Some(second)).await;

    let client = reqwest::Client::new();
    let res = client
        .get(&first)
        .header("grpc-timeout", "50S")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // The edge admits under its current version 2 and sends `pv=2`; the older hop does not
    // hold 2 and applies its own 1, and sends `pv=1`; the fixed hop applies its own (0) and
    // sends no `pv`; the newer hop at the end gets none and applies its current 2.
    assert_eq!(res.text().await.unwrap(), "2/- > 1/2 > 0/1 > 2/-");

    // A caller naming a version the newer hop still holds (a hop not yet upgraded) is
    // admitted under it there, within the current cap.
    let budget = "v=1, rem=50000, op=older-caller, pv=1";
    let res = client
        .get(&first)
        .header("service-budget", budget)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "1/1 > 1/1 > 0/1 > 2/-");
}
