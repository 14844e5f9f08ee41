//! Random call trees against the real library on virtual time, with the fault-injection
//! invariants (`support::fault`) checked on every tree.
//!
//! Each case builds a request tree of random shape — child scopes (reserve, cap, minimum useful
//! budget, a cancel at a random time), spawned tasks, retries (split, reserve, backoff, how
//! errors are classified, nested retries of the same dependency), hedges, fan-outs with
//! required and optional branches, sleeps, and calls through the fake downstream of
//! `support::fault` with random faults (delays, failures, hangs, ignored cancellation, lost
//! responses, stuck connects, lost cancel messages) and effects, including second hops run by
//! the downstream under the budget it admitted — and runs it on a paused tokio clock under a
//! random request deadline, a random connection pool, transport pad and endpoint cap, and
//! maybe a client that goes away. When the tree has quiesced (and every downstream has), the
//! checks of `Net::violations` run over every tree (the request's and each hop's), plus, for
//! every retry and hedge, that no attempt's budget reached past its reserve line, and that the
//! report is stable.
//!
//! # How many trees
//!
//! `cargo test` runs 5,000 trees (about 8 s in a debug build on the 2-core development
//! machine). `CANCEL_SCOPE_TREES=N` runs `N` instead; the launch-gate run of the design notes,
//! one million trees, is
//!
//! ```sh
//! CANCEL_SCOPE_TREES=1000000 cargo test --release --test faults random
//! ```
//!
//! and took 125–154 s there (two runs, release build, load average around 5; build time not
//! included; `tests/README.md` has the figures).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cancel_scope::budget::Split;
use cancel_scope::fanout::FanOut;
use cancel_scope::retry::{Attempt, Decision, HedgeDelay, Ledger, Retry};
use cancel_scope::{Cause, ChildSpec, Scope};
use proptest::prelude::*;
use tokio::time::Instant;

use crate::support::fault::{BoxFuture, Fault, Inbound, Net, Origin};

fn ms(n: u16) -> Duration {
    Duration::from_millis(u64::from(n))
}

/// What a call declares about its effect.
#[derive(Clone, Copy, Debug)]
enum Eff {
    ReadOnly,
    Idempotent,
    SideEffecting,
}

/// One call's faults (see `support::fault::Fault`).
#[derive(Clone, Debug)]
struct FaultSpec {
    /// 0 respond, 1 fail, 2 hang, 3 ignore cancellation, 4 lose the response, 5 record.
    kind: u8,
    after: u16,
    /// `None`: the connect is stuck.
    connect: Option<u16>,
    lose_cancel: bool,
}

type Body = Arc<Vec<Op>>;

#[derive(Clone, Debug)]
enum Op {
    Call {
        service: u8,
        fault: FaultSpec,
        effect: Eff,
    },
    Sleep(u16),
    Child {
        reserve: u16,
        cap: Option<u16>,
        min_useful: u16,
        cancel_after: Option<u16>,
        body: Body,
    },
    Spawn(Body),
    Retry {
        dep: u8,
        attempts: u8,
        reserve: u16,
        greedy: bool,
        backoff: u16,
        /// 0 now, 1 backoff, 2 switch endpoint, 3 never, 4 effect unknown, 5 retry-after.
        decision: u8,
        effect: Eff,
        body: Body,
    },
    Hedge {
        dep: u8,
        attempts: u8,
        delay: u16,
        effect: Eff,
        body: Body,
    },
    FanOut {
        reserve: u16,
        aggregate: u16,
        limit: u8,
        branches: Vec<(bool, Body)>,
    },
    /// A call whose downstream runs `body` under the budget it admitted.
    Hop {
        service: u8,
        connect: u16,
        lose_cancel: bool,
        body: Body,
    },
}

#[derive(Clone, Debug)]
struct Case {
    deadline: u16,
    pool: usize,
    pad: u16,
    cap: u16,
    client_gone_after: Option<u16>,
    end_by_cancel: bool,
    body: Body,
}

fn eff() -> impl Strategy<Value = Eff> {
    prop_oneof![
        3 => Just(Eff::ReadOnly),
        2 => Just(Eff::Idempotent),
        1 => Just(Eff::SideEffecting),
    ]
}

fn fault() -> impl Strategy<Value = FaultSpec> {
    (
        prop_oneof![
            6 => Just(0u8), 3 => Just(1u8), 1 => Just(2u8),
            1 => Just(3u8), 1 => Just(4u8), 1 => Just(5u8),
        ],
        0u16..400,
        prop_oneof![8 => Just(Some(0u16)), 3 => (1u16..60).prop_map(Some), 1 => Just(None)],
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(kind, after, connect, lose_cancel)| FaultSpec {
            kind,
            after,
            connect,
            lose_cancel,
        })
}

fn leaf() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, fault(), eff()).prop_map(|(service, fault, effect)| Op::Call {
            service,
            fault,
            effect
        }),
        1 => (0u16..200).prop_map(Op::Sleep),
    ]
}

fn body_of(op: impl Strategy<Value = Op>) -> impl Strategy<Value = Body> {
    proptest::collection::vec(op, 1..4).prop_map(Arc::new)
}

fn op() -> impl Strategy<Value = Op> {
    leaf().prop_recursive(4, 24, 4, |inner| {
        let body = move || body_of(inner.clone());
        prop_oneof![
            3 => (
                0u16..100,
                proptest::option::weighted(0.3, 10u16..800),
                prop_oneof![3 => Just(0u16), 1 => 1u16..300],
                proptest::option::weighted(0.3, 0u16..600),
                body(),
            )
                .prop_map(|(reserve, cap, min_useful, cancel_after, body)| Op::Child {
                    reserve,
                    cap,
                    min_useful,
                    cancel_after,
                    body,
                }),
            2 => body().prop_map(Op::Spawn),
            3 => (
                0u8..2,
                1u8..4,
                0u16..80,
                any::<bool>(),
                0u16..100,
                0u8..6,
                eff(),
                body(),
            )
                .prop_map(|(dep, attempts, reserve, greedy, backoff, decision, effect, body)| {
                    Op::Retry { dep, attempts, reserve, greedy, backoff, decision, effect, body }
                }),
            2 => (0u8..2, 1u8..4, 0u16..150, eff(), body())
                .prop_map(|(dep, attempts, delay, effect, body)| Op::Hedge {
                    dep,
                    attempts,
                    delay,
                    effect,
                    body
                }),
            2 => (
                0u16..60,
                0u16..150,
                1u8..4,
                proptest::collection::vec((any::<bool>(), body()), 1..4),
            )
                .prop_map(|(reserve, aggregate, limit, branches)| Op::FanOut {
                    reserve,
                    aggregate,
                    limit,
                    branches,
                }),
            2 => (0u8..3, 0u16..30, proptest::bool::weighted(0.2), body())
                .prop_map(|(service, connect, lose_cancel, body)| Op::Hop {
                    service,
                    connect,
                    lose_cancel,
                    body
                }),
        ]
    })
}

fn case() -> impl Strategy<Value = Case> {
    (
        20u16..1500,
        1usize..12,
        0u16..3,
        prop_oneof![3 => Just(30_000u16), 1 => 50u16..2000],
        proptest::option::weighted(0.2, 0u16..1500),
        any::<bool>(),
        body_of(op()),
    )
        .prop_map(
            |(deadline, pool, pad, cap, client_gone_after, end_by_cancel, body)| Case {
                deadline,
                pool,
                pad,
                cap,
                client_gone_after,
                end_by_cancel,
                body,
            },
        )
}

/// What the ops of one tree share.
#[derive(Clone)]
struct Ctx {
    net: Net,
    origin: Origin,
    /// Violations found while running (budget lines of child scopes and retry attempts).
    bad: Arc<Mutex<Vec<String>>>,
    /// Makes side-effect ids and idempotency keys unique.
    seq: Arc<AtomicU64>,
}

impl Ctx {
    fn with(&self, origin: Origin) -> Ctx {
        Ctx {
            origin,
            ..self.clone()
        }
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    fn spec(&self, name: String, effect: Eff) -> ChildSpec {
        match effect {
            Eff::ReadOnly => ChildSpec::read_only(name),
            Eff::Idempotent => {
                let key = format!("key-{}", self.next());
                ChildSpec::idempotent(name, key)
            }
            Eff::SideEffecting => {
                let id = format!("effect-{}", self.next());
                ChildSpec::side_effecting(name, id)
            }
        }
    }

    fn violation(&self, v: String) {
        self.bad.lock().unwrap().push(v);
    }

    /// The reserve line of a child of this origin's scope that keeps `reserve`.
    fn line_after(&self, reserve: Duration) -> Option<Instant> {
        let own = self
            .origin
            .scope
            .deadline()
            .map(|d| d.checked_sub(reserve).unwrap_or(d));
        match (own, self.origin.line) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Registrations made outside the transport count for this tree's receipt coverage.
    fn count(&self, n: u64) {
        self.net.count(self.origin.tree, n);
    }

    /// An attempt was registered and dispatched (the retry layer calls the operation once per
    /// started attempt): count it, and check its deadline against the reserve line.
    fn attempt_started(&self, a: &Attempt, line: Option<Instant>) {
        self.count(1);
        if let (Some(d), Some(line)) = (a.scope().deadline(), line) {
            if d > line {
                self.violation(format!(
                    "2: attempt {} deadline {d:?} after its line {line:?}",
                    a.number()
                ));
            }
        }
    }

    /// Budgets never grew across retries: no attempt's budget reaches past the line.
    fn check_ledger(&self, ledger: &Ledger, line: Option<Instant>) {
        for a in ledger.attempts() {
            if let (Some(b), Some(line)) = (a.budget(), line) {
                if a.started_at() + b > line {
                    self.violation(format!(
                        "2: attempt {} of {} got a budget past the reserve line",
                        a.number(),
                        ledger.dependency()
                    ));
                }
            }
        }
        if ledger.started() > ledger.max_attempts() {
            self.violation(format!("{} attempts over its maximum", ledger.dependency()));
        }
    }
}

fn fault_of(spec: &FaultSpec) -> Fault {
    let after = ms(spec.after);
    let mut f = match spec.kind {
        0 => Fault::respond(after),
        1 => Fault::fail(after),
        2 => Fault::hang(),
        3 => Fault::ignore_cancel(after),
        4 => Fault::lose_response(after),
        _ => Fault::record(),
    };
    f = match spec.connect {
        Some(c) => f.connect(ms(c)),
        None => f.connect_stuck(),
    };
    if spec.lose_cancel {
        f = f.lose_cancel();
    }
    f
}

fn decision(d: u8, backoff: u16) -> Decision {
    match d {
        0 => Decision::RetryNow,
        1 => Decision::Backoff,
        2 => Decision::SwitchEndpoint,
        3 => Decision::Never,
        4 => Decision::EffectUnknown,
        _ => Decision::RetryAfter(ms(backoff)),
    }
}

/// Runs `body` in order in the context's scope; tasks spawned by it are joined at its end.
fn exec(body: Body, ctx: Ctx) -> BoxFuture<Result<(), ()>> {
    Box::pin(async move {
        let mut ok = true;
        let mut tasks = Vec::new();
        for op in body.iter() {
            ok &= run(op, &ctx, &mut tasks).await.is_ok();
        }
        for t in tasks {
            ok &= matches!(t.await, Ok(Ok(())));
        }
        if ok {
            Ok(())
        } else {
            Err(())
        }
    })
}

async fn run(
    op: &Op,
    ctx: &Ctx,
    tasks: &mut Vec<cancel_scope::JoinHandle<Result<(), ()>>>,
) -> Result<(), ()> {
    let scope = ctx.origin.scope.clone();
    match op {
        Op::Call {
            service,
            fault,
            effect,
        } => {
            let name = format!("svc{service}");
            let spec = ctx.spec(name.clone(), *effect);
            ctx.net
                .call_with(&ctx.origin, &name, spec, fault_of(fault))
                .await
                .map(|_| ())
                .map_err(|_| ())
        }
        Op::Sleep(d) => {
            tokio::time::sleep(ms(*d)).await;
            Ok(())
        }
        Op::Child {
            reserve,
            cap,
            min_useful,
            cancel_after,
            body,
        } => {
            let mut b = scope
                .child()
                .reserve(ms(*reserve))
                .min_useful(ms(*min_useful));
            if let Some(c) = cap {
                b = b.cap(ms(*c));
            }
            let child = b.build().map_err(|_| ())?;
            let origin = ctx.origin.child(&child, ms(*reserve));
            if let (Some(d), Some(line)) = (child.deadline(), origin.line) {
                if d > line {
                    ctx.violation(format!("2: child deadline {d:?} after its line {line:?}"));
                }
            }
            if let Some(after) = cancel_after {
                let c = child.clone();
                let after = ms(*after);
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    c.cancel_with("random cancel");
                });
            }
            match child.run(exec(body.clone(), ctx.with(origin))).await {
                Ok(r) => r,
                Err(_) => Err(()),
            }
        }
        Op::Spawn(body) => {
            // `spawn` registers and dispatches with one CAS, then checks the deadline. A scope
            // that is still open registers the task even if its deadline passed in this very
            // instant (the task then never runs and has a `Cancelled` receipt). Only a closed
            // scope registers nothing.
            let open = !scope.is_closed();
            let spawned = scope.spawn(exec(body.clone(), ctx.clone()));
            ctx.count(u64::from(open));
            tasks.push(spawned.map_err(|_| ())?);
            Ok(())
        }
        Op::Retry {
            dep,
            attempts,
            reserve,
            greedy,
            backoff,
            decision: d,
            effect,
            body,
        } => {
            let reserve = ms(*reserve);
            let split = if *greedy {
                Split::Greedy { cap: None }
            } else {
                Split::Even { cap: None }
            };
            let decided = decision(*d, *backoff);
            let retry = Retry::new(move |_: &()| decided)
                .max_attempts(u32::from(*attempts))
                .reserve(reserve)
                .split(split)
                .backoff(vec![ms(*backoff); usize::from(*attempts)]);
            let spec = ctx.spec(format!("dep{dep}"), *effect);
            let line = ctx.line_after(reserve);
            let (res, ledger) = retry
                .run_with_ledger(&scope, spec, |a| {
                    ctx.attempt_started(&a, line);
                    let origin = ctx.origin.child(a.scope(), reserve);
                    exec(body.clone(), ctx.with(origin))
                })
                .await;
            ctx.check_ledger(&ledger, line);
            res.map(|_| ()).map_err(|_| ())
        }
        Op::Hedge {
            dep,
            attempts,
            delay,
            effect,
            body,
        } => {
            let hedge = Retry::new(|_: &()| Decision::RetryNow)
                .max_attempts(u32::from(*attempts))
                .hedge(HedgeDelay::Fixed(ms(*delay)));
            let spec = ctx.spec(format!("dep{dep}"), *effect);
            let line = ctx.line_after(Duration::ZERO);
            let (res, ledger) = hedge
                .run_with_ledger(&scope, spec, |a| {
                    ctx.attempt_started(&a, line);
                    let origin = ctx.origin.child(a.scope(), Duration::ZERO);
                    exec(body.clone(), ctx.with(origin))
                })
                .await;
            ctx.check_ledger(&ledger, line);
            res.map(|_| ()).map_err(|_| ())
        }
        Op::FanOut {
            reserve,
            aggregate,
            limit,
            branches,
        } => {
            let mut fan = FanOut::new(&scope)
                .reserve(ms(*reserve))
                .aggregate_reserve(ms(*aggregate))
                .limit(usize::from(*limit));
            for (i, (required, body)) in branches.iter().enumerate() {
                let kept = if *required {
                    ms(*reserve)
                } else {
                    ms(*reserve) + ms(*aggregate)
                };
                let (ctx, body) = (ctx.clone(), body.clone());
                let line = ctx.line_after(kept);
                let branch = move |s: Scope| {
                    // Called once per branch that was registered and dispatched.
                    ctx.count(1);
                    let origin = Origin {
                        scope: s,
                        line,
                        parent: ctx.origin.parent,
                        tree: ctx.origin.tree,
                    };
                    let fut = exec(body, ctx.with(origin));
                    async move { fut.await.map_err(|()| "branch failed") }
                };
                if *required {
                    let _ = fan.required(format!("branch{i}"), branch);
                } else {
                    let _ = fan.optional(format!("branch{i}"), branch);
                }
            }
            fan.join().await.map(|_| ()).map_err(|_| ())
        }
        Op::Hop {
            service,
            connect,
            lose_cancel,
            body,
        } => {
            let (hop_ctx, body) = (ctx.clone(), body.clone());
            let handler = Arc::new(move |inbound: Inbound| {
                let ctx = Ctx {
                    net: inbound.net,
                    origin: inbound.origin,
                    ..hop_ctx.clone()
                };
                exec(body.clone(), ctx)
            });
            let mut f = Fault::handle(handler).connect(ms(*connect));
            if *lose_cancel {
                f = f.lose_cancel();
            }
            let name = format!("hop{service}");
            let spec = ctx.spec(name.clone(), Eff::ReadOnly);
            ctx.net
                .call_with(&ctx.origin, &name, spec, f)
                .await
                .map(|_| ())
                .map_err(|_| ())
        }
    }
}

/// Runs one tree to quiescence and returns every violation found.
fn run_case(case: &Case) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let net = Net::with(case.pool, ms(case.pad), ms(case.cap));
        let root = Scope::with_timeout(ms(case.deadline));
        let ctx = Ctx {
            net: net.clone(),
            origin: Origin::root(&root, 0),
            bad: Arc::default(),
            seq: Arc::default(),
        };
        if let Some(after) = case.client_gone_after {
            let r = root.clone();
            tokio::spawn(async move {
                tokio::time::sleep(ms(after)).await;
                r.cancel_because(Cause::ClientGone);
            });
        }
        let _ = root.run(exec(case.body.clone(), ctx.clone())).await;
        if case.end_by_cancel {
            root.cancel();
        } else {
            root.close();
        }
        // Virtual time: an hour passes in no time if nothing else can run. A tree that is not
        // quiet by then never will be.
        let hour = Duration::from_secs(3600);
        let Ok(report) = tokio::time::timeout(hour, root.quiesce()).await else {
            return vec![format!(
                "the request never quiesced: {:?}",
                root.lifecycle()
            )];
        };
        if tokio::time::timeout(hour, net.settle()).await.is_err() {
            return vec!["a downstream never quiesced".to_owned()];
        }
        let mut v = net.violations(&[(0, &report)]);
        v.append(&mut ctx.bad.lock().unwrap());
        let again = root.quiesce().await;
        if again != report {
            v.push(format!(
                "6: the report changed after quiescence:\n    {report:?}\n    {again:?}"
            ));
        }
        v
    })
}

fn trees() -> u32 {
    std::env::var("CANCEL_SCOPE_TREES")
        .ok()
        .and_then(|s| s.replace('_', "").parse().ok())
        .unwrap_or(5_000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: trees(),
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    /// Every random call tree keeps the six invariants (and its retries' budget lines).
    #[test]
    fn random_call_trees_keep_every_invariant(case in case()) {
        let v = run_case(&case);
        prop_assert!(v.is_empty(), "{} violation(s):\n  {}", v.len(), v.join("\n  "));
    }
}

/// The trees are not all trivial: a fixed sample of them sends requests, retries, hedges,
/// fans out, hops, cancels and leaves effects to reconcile.
#[test]
fn the_generated_trees_exercise_the_faults() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut seen = [0u32; 5];
    for _ in 0..200 {
        let case = case().new_tree(&mut runner).unwrap().current();
        let stats = stats(&case.body);
        for (s, n) in seen.iter_mut().zip(stats) {
            *s += n;
        }
        assert!(run_case(&case).is_empty());
    }
    let [calls, retries, hedges, fans, hops] = seen;
    assert!(
        calls > 500 && retries > 50 && hedges > 30 && fans > 30 && hops > 30,
        "calls {calls}, retries {retries}, hedges {hedges}, fan-outs {fans}, hops {hops}"
    );
}

/// Counts calls, retries, hedges, fan-outs and hops in a body.
fn stats(body: &[Op]) -> [u32; 5] {
    let mut s = [0u32; 5];
    let mut add = |t: [u32; 5]| {
        for (a, b) in s.iter_mut().zip(t) {
            *a += b;
        }
    };
    for op in body {
        match op {
            Op::Call { .. } => add([1, 0, 0, 0, 0]),
            Op::Sleep(_) => {}
            Op::Child { body, .. } | Op::Spawn(body) => add(stats(body)),
            Op::Retry { body, .. } => {
                add([0, 1, 0, 0, 0]);
                add(stats(body));
            }
            Op::Hedge { body, .. } => {
                add([0, 0, 1, 0, 0]);
                add(stats(body));
            }
            Op::FanOut { branches, .. } => {
                add([0, 0, 0, 1, 0]);
                for (_, b) in branches {
                    add(stats(b));
                }
            }
            Op::Hop { body, .. } => {
                add([0, 0, 0, 0, 1]);
                add(stats(body));
            }
        }
    }
    s
}
