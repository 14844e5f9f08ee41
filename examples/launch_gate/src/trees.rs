//! Phase 1: random call trees on tokio's paused clock, one after the other on a
//! current-thread runtime, through the real admission and egress layers (see `hop`).
//!
//! A tree is a client with a random budget calling a first hop; a hop either is a leaf (it
//! answers after a while, fails, hangs, or ignores cancellation) or makes one to three calls at
//! once (a fan-out), each once, with retries or with a hedge, read-only, idempotent or
//! side-effecting, under its own endpoint policy (maximum, reserve, minimum useful budget) and
//! egress policy (reserve, cap, transport pad, minimum useful budget), over a transport that
//! may connect slowly, never connect, or lose the answer. A third of the clients cancel at a
//! random moment. After each tree, everything is waited for until quiet and judged.

pub use crate::hop::Sabotage;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::wire::{EgressPolicy, EndpointPolicy};
use cancel_scope::Scope;
use http::Method;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::gates::Observations;
use crate::hop::{client_call, Call, Kind, Leaf, Mode, Node, Wire, World};

/// Phase 1's parameters.
#[derive(Clone, Copy, Debug)]
pub struct TreeConfig {
    /// How many trees.
    pub trees: u64,
    /// The seed of the trees' random choices.
    pub seed: u64,
    /// The harness's deliberate bug, if any.
    pub sabotage: Sabotage,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn policy(rng: &mut SmallRng) -> EndpointPolicy {
    let max = ms(rng.random_range(200..=2000));
    EndpointPolicy::builder(max)
        .default_budget(ms(rng.random_range(100..=1000)))
        .reserve(ms(rng.random_range(0..=20)))
        .transport_pad(ms(rng.random_range(0..=3)))
        .min_useful(ms(rng.random_range(0..=10)))
        .build()
}

fn leaf(rng: &mut SmallRng) -> Leaf {
    match rng.random_range(0..10) {
        0..=5 => Leaf::Respond(ms(rng.random_range(1..=300))),
        6 => Leaf::Fail(ms(rng.random_range(1..=50))),
        7 | 8 => Leaf::IgnoreCancel(ms(rng.random_range(1..=800))),
        _ => Leaf::Hang,
    }
}

fn call(rng: &mut SmallRng, depth: u32) -> Call {
    let (method, mode) = match rng.random_range(0..6) {
        0 | 1 => (Method::GET, Mode::Once),
        2 => (Method::GET, Mode::Hedge(ms(rng.random_range(5..=100)))),
        3 => (Method::PUT, Mode::Retry(rng.random_range(2..=3))),
        _ => (Method::POST, Mode::Once),
    };
    let mut egress = EgressPolicy::builder()
        .reserve(ms(rng.random_range(0..=10)))
        .transport_pad(ms(rng.random_range(0..=2)))
        .min_useful(ms(rng.random_range(0..=5)));
    if rng.random_bool(0.3) {
        egress = egress.cap(ms(rng.random_range(20..=500)));
    }
    let egress = egress.build();
    let wire = Wire {
        connect: match rng.random_range(0..40) {
            0 => None,
            1..=4 => Some(ms(rng.random_range(1..=100))),
            _ => Some(Duration::ZERO),
        },
        lose_response: rng.random_range(0..40) == 0,
    };
    Call {
        mode,
        method,
        egress,
        wire,
        node: Arc::new(node(rng, depth + 1)),
    }
}

fn node(rng: &mut SmallRng, depth: u32) -> Node {
    let calls = depth < 3 && rng.random_bool(0.6);
    let kind = if calls {
        let n = rng.random_range(1..=3);
        Kind::Calls((0..n).map(|_| call(rng, depth)).collect())
    } else {
        Kind::Leaf(leaf(rng))
    };
    Node {
        policy: policy(rng),
        kind,
    }
}

/// Runs the trees (calling `progress` with how many are done) and sums what they showed.
pub fn run_trees(cfg: &TreeConfig, progress: &dyn Fn(u64)) -> Observations {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut rng = SmallRng::seed_from_u64(cfg.seed);
        let mut total = Observations::default();
        for i in 0..cfg.trees {
            total.merge(one_tree(&mut rng, cfg.sabotage).await);
            if i % 256 == 255 {
                progress(i + 1);
            }
        }
        progress(cfg.trees);
        total
    })
}

/// How long after a tree's client is quiet its hops may still take to go quiet (virtual time:
/// waiting costs nothing); past it, the hops that did not are counted as not quiet.
const PATIENCE: Duration = Duration::from_secs(600);

async fn one_tree(rng: &mut SmallRng, sabotage: Sabotage) -> Observations {
    let world = World::new(sabotage, rng.random_range(1..=8));
    let root_node = Arc::new(node(rng, 0));
    let budget = ms(rng.random_range(20..=1500));
    let cancel_at = rng
        .random_bool(0.3)
        .then(|| ms(rng.random_range(0..budget.as_millis() as u64)));
    let root = Scope::with_timeout(budget);
    let deadline = root.deadline().expect("a budget");
    let start = Instant::now();

    let call = client_call(&world, &root, root_node);
    let mut o = Observations {
        requests: 1,
        roots: 1,
        ..Observations::default()
    };
    let cancelled = match cancel_at {
        None => {
            call.await;
            answered(&mut o, deadline);
            None
        }
        Some(after) => {
            tokio::select! {
                // In a fixed order: the same seed makes the same run.
                biased;
                _ = call => {
                    answered(&mut o, deadline);
                    None
                }
                _ = tokio::time::sleep_until(start + after) => {
                    root.cancel_with("client cancel");
                    o.client_cancels = 1;
                    Some(Instant::now())
                }
            }
        }
    };
    root.close();
    let report = root.quiesce().await;
    o.quiet += 1;
    // The hops: wait (on the paused clock) until every transport has ended and every
    // admitted request has its report.
    let waited = Instant::now();
    for step in 0u64.. {
        // On the paused clock a sleep returns once every task that can run has run.
        tokio::time::sleep(ms(if step < 16 { 1 } else { 100 })).await;
        let done = world.in_flight.load(Ordering::SeqCst) == 0
            && world
                .sent
                .lock()
                .unwrap()
                .iter()
                .all(|s| s.admitted.is_none() || s.report.is_some());
        if done || waited.elapsed() > PATIENCE {
            break;
        }
    }
    let sent = world.sent.lock().unwrap().clone();
    let mut sends_from = vec![0u64; sent.len()];
    let mut root_sends = 0u64;
    for s in &sent {
        o.sent += 1;
        // A send is covered by a registration only if its sender could hold a live child,
        // and a sender covers at most as many sends as its report has receipts.
        match (s.sender_live, s.from) {
            (false, _) => {}
            (true, Some(p)) => sends_from[p as usize] += 1,
            (true, None) => root_sends += 1,
        }
        // What the sender had: its admitted deadline (a hop), or the client's.
        let line = match s.from {
            Some(p) => sent[p as usize].admitted.flatten(),
            None => Some(deadline),
        };
        let until = s.carried.map(|c| s.written + c);
        let grew = match (line, until) {
            (Some(l), Some(u)) => u > l,
            (Some(_), None) => true,
            (None, _) => false,
        };
        // Admission counts the budget from the request's arrival.
        let from_arrival = s.carried.map(|c| s.arrived + c);
        let admitted_later =
            matches!((s.admitted, from_arrival), (Some(Some(d)), Some(u)) if d > u);
        o.expanded += u64::from(grew || admitted_later);
        if let (Some(l), Some(u)) = (line, from_arrival) {
            if u > l {
                o.outlived += 1;
                o.outlived_max = o.outlived_max.max(u - l);
            }
        }
        let expired = s.sender_deadline.is_some_and(|d| s.written >= d);
        if s.admitted.is_some() && (s.sender_cancelled || expired) {
            o.late_accepts += 1;
        }
        o.admitted += u64::from(s.admitted.is_some());
    }
    o.registered_sends += root_sends.min(report.total());
    count_receipts(&mut o, &report);
    for (i, s) in sent.iter().enumerate() {
        if let Some(r) = &s.report {
            o.quiet += 1;
            o.registered_sends += sends_from[i].min(r.total());
            count_receipts(&mut o, r);
        }
    }
    if let Some(at) = cancelled {
        let last = sent.iter().map(|s| s.last_io).max().unwrap_or(at);
        o.cancel_to_quiet.push(last.saturating_duration_since(at));
        o.last_io.push("a request or an answer on the wire");
    }
    o.orphans = world.held();
    o
}

/// The client has its answer: on time or late.
fn answered(o: &mut Observations, deadline: Instant) {
    let now = Instant::now();
    o.answered = 1;
    if now > deadline {
        o.missed = 1;
        o.late_by.push(now - deadline);
    }
}

fn count_receipts(o: &mut Observations, r: &cancel_scope::Report) {
    o.cancelled_receipts += r.cancelled();
    o.quarantined += r.quarantined();
    o.pending_effects += r.pending_effects().len() as u64;
}
