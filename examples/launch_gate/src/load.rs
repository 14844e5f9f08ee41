//! Phase 2: real load on loopback. Four axum services and a tonic one, each behind the real
//! `AdmitLayer`: `frontend` calls `orders`, which calls at once `inventory` (a SQLite
//! statement through the sqlx guard), `stubborn` (a dependency that ignores cancellation: its
//! work runs on a plain task the request's scope knows nothing of), both through the reqwest
//! integration (`send_scoped`), and `pricing`, a gRPC service, through `PropagateLayer`
//! around a tonic channel (see `grpc`); every call holds a permit of the hop's connection
//! limit.
//!
//! Many concurrent clients send requests with random budgets (`service-budget`, as a caller
//! without the library writes it); some cancel at a random moment (dropping the request,
//! which closes its connection), some disconnect a raw socket after sending. An outermost
//! layer of every service (`iolog`) logs, per request, each request that arrives and each
//! part of each answer sent (head and body frames), and each SQL statement started: the last
//! of them after a client's cancel is that request's cancel-to-no-new-I/O time, on the real
//! clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use cancel_scope::integrations::reqwest::RequestBuilderExt as _;
use cancel_scope::integrations::sqlx::GuardedPool;
use cancel_scope::integrations::tower::{AdmitLayer, Propagate};
use cancel_scope::wire::service_budget::{self, ServiceBudget};
use cancel_scope::wire::{Admission, EndpointPolicy, RejectionCap};
use cancel_scope::{Lifecycle, Scope};
use http::StatusCode;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Pool, Sqlite};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::gates::Observations;
use crate::grpc;
use crate::hop::Sabotage;
use crate::iolog::{
    self, header_u64, io, CallRec, IoLogLayer, Log, Shared, CALL, HOP, PARENT, REQ,
};

/// Phase 2's parameters.
#[derive(Clone, Copy, Debug)]
pub struct LoadConfig {
    /// Client requests.
    pub requests: u64,
    /// Clients at once.
    pub concurrency: u64,
    /// The seed of the clients' random choices.
    pub seed: u64,
    /// A deliberate bug in the hops, to show that the gate it breaks fails.
    pub sabotage: Sabotage,
}

/// What phase 2 found.
#[derive(Debug)]
pub struct LoadResult {
    /// Its observations.
    pub observations: Observations,
    /// The database its SQL statements ran on.
    pub database: &'static str,
}

/// What a service does.
#[derive(Clone, Debug)]
struct Service {
    log: Shared,
    next: Vec<String>,
    limit: Arc<Semaphore>,
    client: reqwest::Client,
    db: Option<GuardedPool<Sqlite>>,
    /// The gRPC hop it calls besides `next`.
    pricing: Option<Propagate<Channel>>,
    stubborn: bool,
    sabotage: Sabotage,
    /// Whether [`Sabotage::LeakPermit`] forgot its permit yet (once per run).
    leaked: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
}

/// Counts to `n` inside SQLite (well under a millisecond for the n used here: the load is
/// the services', not the database's).
const COUNT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?) \
                     SELECT count(*) FROM c";

async fn handler(State(s): State<Service>, req: Request) -> (StatusCode, &'static str) {
    let key = header_u64(&req, HOP).expect("the log layer names the hop");
    let scope = Scope::current();
    let id = iolog::enter(&s.log, key, req.extensions().get::<Admission>());
    if s.stubborn {
        // Work that ignores cancellation: the scope does not know this task.
        let work = id.wrapping_mul(7919) % 300 + 20;
        let _ = tokio::spawn(tokio::time::sleep(Duration::from_millis(work))).await;
        return (StatusCode::OK, "done anyway");
    }
    if let Some(db) = &s.db {
        io(&s.log, id, "a SQL statement");
        let n = 100 + (id % 50) as i64 * 40;
        let counted = db
            .fetch_one(None, "count", sqlx::query_scalar::<_, i64>(COUNT).bind(n))
            .await;
        return match counted {
            Ok(_) => (StatusCode::OK, "counted"),
            Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "stopped"),
        };
    }
    if s.sabotage == Sabotage::SendAfterCancel {
        send_after_cancel(&s, &scope, id, key);
    }
    // Each dependency: an HTTP URL, or (`None`) the gRPC hop.
    let targets = s
        .next
        .iter()
        .map(Some)
        .chain(s.pricing.iter().map(|_| None));
    let calls = targets.map(|url| {
        let s = s.clone();
        let scope = scope.clone();
        async move {
            let Ok(permit) = scope.acquire(&s.limit).await else {
                return false;
            };
            // Held until the call is done (unless the sabotage forgets the first one).
            let _permit =
                if s.sabotage == Sabotage::LeakPermit && !s.leaked.swap(true, Ordering::SeqCst) {
                    std::mem::forget(permit);
                    None
                } else {
                    Some(permit)
                };
            let seq = s.calls.fetch_add(1, Ordering::Relaxed);
            s.log.lock().unwrap().calls.insert(
                (key, seq),
                CallRec {
                    before: Instant::now(),
                    deadline: scope.deadline(),
                    cancelled: scope.is_cancelled(),
                    live: !scope.is_cancelled() && scope.lifecycle() == Lifecycle::Running,
                },
            );
            let Some(url) = url else {
                let client = s.pricing.clone().expect("a gRPC hop to call");
                return grpc::call(client, &scope, id, key, seq).await;
            };
            let request = s
                .client
                .get(url)
                .header(REQ, id)
                .header(PARENT, key)
                .header(CALL, seq);
            match scope.remaining() {
                // A budget 50 ms longer than the library's, written by hand.
                Some(left) if s.sabotage == Sabotage::GrowBudget => {
                    let longer = ServiceBudget::new(left + ms(50)).to_header_value();
                    match request.header(service_budget::HEADER, longer).send().await {
                        Ok(res) => res.status().is_success() && res.text().await.is_ok(),
                        Err(_) => false,
                    }
                }
                _ => match request.send_scoped().await {
                    Ok(res) => res.status().is_success() && res.text().await.is_ok(),
                    Err(_) => false,
                },
            }
        }
    });
    if futures::future::join_all(calls)
        .await
        .into_iter()
        .all(|ok| ok)
    {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::BAD_GATEWAY, "a dependency failed")
    }
}

/// The sabotage of [`Sabotage::SendAfterCancel`]: a fire-and-forget task that sends one more
/// request to the hop's first dependency, bypassing the library, once the hop is cancelled.
fn send_after_cancel(s: &Service, scope: &Scope, id: u64, key: u64) {
    let Some(url) = s.next.first().cloned() else {
        return;
    };
    let (s, scope) = (s.clone(), scope.clone());
    tokio::spawn(async move {
        scope.cancelled().await;
        let seq = s.calls.fetch_add(1, Ordering::Relaxed);
        s.log.lock().unwrap().calls.insert(
            (key, seq),
            CallRec {
                before: Instant::now(),
                deadline: scope.deadline(),
                cancelled: true,
                live: false,
            },
        );
        let _ = s
            .client
            .get(url)
            .header(service_budget::HEADER, "v=1, rem=50")
            .header(REQ, id)
            .header(PARENT, key)
            .header(CALL, seq)
            .send()
            .await;
    });
}

/// The server layer of a hop with `policy`: its reports go to the hop's entry in `log`.
fn admit(log: &Shared, policy: EndpointPolicy) -> AdmitLayer {
    let reports = log.clone();
    AdmitLayer::new(policy).on_report(move |admission, report| {
        let mut l = reports.lock().unwrap();
        match l.ops.get(admission.operation_id()).copied() {
            Some(key) => l.hops[key as usize].report = Some(report.clone()),
            None => {
                l.early_reports
                    .insert(admission.operation_id().to_owned(), report.clone());
            }
        }
    })
}

/// Serves one service on a loopback port; returns its URL. The `edge` has a rejection cap;
/// with [`Sabotage::LateAnswer`], its answers take 20 ms more on the way back (outside its
/// server layer).
async fn serve(s: Service, policy: EndpointPolicy, edge: bool) -> String {
    let log = s.log.clone();
    let late = edge && s.sabotage == Sabotage::LateAnswer;
    let app = Router::new()
        .route("/", any(handler))
        .with_state(s)
        .layer(if edge {
            // At the edge, the default cap (as Finagle's: 20 % over 10 s) of refusals.
            admit(&log, policy).rejection_cap(&RejectionCap::default())
        } else {
            admit(&log, policy)
        })
        .layer(axum::middleware::map_response(
            move |res: Response| async move {
                if late {
                    tokio::time::sleep(ms(20)).await;
                }
                res
            },
        ))
        .layer(IoLogLayer(log));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// How one client request ended.
enum Ended {
    Answered {
        late_by: Option<Duration>,
    },
    Cancelled(Instant),
    /// A request with a malformed budget header: refused (`400`), or let through by the
    /// edge's rejection cap.
    Hostile {
        refused: bool,
    },
}

/// The share of client requests that send a malformed `service-budget`: more than the edge's
/// rejection cap (20 % over 10 s) lets it refuse, so that the cap decides some of them.
const HOSTILE: f64 = 0.25;

async fn client(
    http: &reqwest::Client,
    url: &str,
    addr: &str,
    id: u64,
    rng: &mut SmallRng,
) -> Ended {
    if rng.random_bool(HOSTILE) {
        let res = http
            .get(url)
            .header(service_budget::HEADER, "v=1, rem=-5")
            .header(REQ, id)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        let refused = res.is_ok_and(|r| r.status() == StatusCode::BAD_REQUEST);
        return Ended::Hostile { refused };
    }
    let budget = ms(rng.random_range(30..=500));
    let header = ServiceBudget::new(budget).to_header_value();
    let cancel = rng
        .random_bool(0.3)
        .then(|| ms(rng.random_range(0..budget.as_millis() as u64)));
    let start = Instant::now();
    if let Some(after) = cancel.filter(|_| rng.random_bool(0.5)) {
        // A raw socket that sends the request and goes away.
        if let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await {
            let raw = format!(
                "GET / HTTP/1.1\r\nhost: {addr}\r\n{}: {header}\r\n{REQ}: {id}\r\n\r\n",
                service_budget::HEADER
            );
            let _ = tcp.write_all(raw.as_bytes()).await;
            tokio::time::sleep_until(start + after).await;
            let at = Instant::now();
            drop(tcp);
            return Ended::Cancelled(at);
        }
    }
    let call = async {
        let res = http
            .get(url)
            .header(service_budget::HEADER, &header)
            .header(REQ, id)
            .timeout(budget + Duration::from_secs(2))
            .send()
            .await;
        if let Ok(res) = res {
            let _ = res.bytes().await;
        }
        Instant::now()
    };
    let answered = |at: Instant| Ended::Answered {
        late_by: (at > start + budget).then(|| at - (start + budget)),
    };
    match cancel {
        None => answered(call.await),
        Some(after) => tokio::select! {
            a = call => answered(a),
            _ = tokio::time::sleep_until(start + after) => Ended::Cancelled(Instant::now()),
        },
    }
}

/// A database file in `dir` (every connection of an in-memory pool would get a database of
/// its own).
async fn database(dir: &std::path::Path) -> Result<Pool<Sqlite>, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("gate.db"))
        .create_if_missing(true);
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
}

/// Runs the load (calling `progress` with how many requests are done) and judges it.
pub fn run_load(cfg: &LoadConfig, progress: &(dyn Fn(u64) + Sync)) -> LoadResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let observations = runtime.block_on(load(cfg, progress));
    LoadResult {
        observations,
        database: "SQLite (bundled, a file in a temporary directory)",
    }
}

async fn load(cfg: &LoadConfig, progress: &(dyn Fn(u64) + Sync)) -> Observations {
    let log: Shared = Arc::default();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let pool = database(dir.path()).await.expect("a SQLite database");
    let limits: Vec<Arc<Semaphore>> = (0..3).map(|_| Arc::new(Semaphore::new(64))).collect();
    let leaked = Arc::new(AtomicBool::new(false));
    let service = |next: Vec<String>, limit: usize| Service {
        log: log.clone(),
        next,
        limit: limits[limit].clone(),
        client: reqwest::Client::new(),
        db: None,
        pricing: None,
        stubborn: false,
        sabotage: cfg.sabotage,
        leaked: leaked.clone(),
        calls: Arc::default(),
    };
    let policy = |reserve| {
        EndpointPolicy::builder(ms(2_000))
            .default_budget(ms(1_000))
            .reserve(ms(reserve))
            .transport_pad(ms(2))
            .min_useful(ms(2))
            .build()
    };
    let inventory = serve(
        Service {
            db: Some(GuardedPool::new(pool.clone())),
            ..service(vec![], 2)
        },
        policy(2),
        false,
    )
    .await;
    let stubborn = serve(
        Service {
            stubborn: true,
            ..service(vec![], 2)
        },
        policy(2),
        false,
    )
    .await;
    let pricing = grpc::serve(log.clone(), admit(&log, policy(2))).await;
    let orders = serve(
        Service {
            pricing: Some(grpc::client(&pricing)),
            ..service(vec![inventory, stubborn], 1)
        },
        policy(5),
        false,
    )
    .await;
    let frontend = serve(service(vec![orders], 0), policy(10), true).await;
    let addr = frontend
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();

    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let ended: Arc<Mutex<Vec<(u64, Ended)>>> = Arc::default();
    let http = reqwest::Client::new();
    let clients: Vec<_> = (0..cfg.concurrency)
        .map(|_| {
            let (next, done, ended, http, url, addr) = (
                next.clone(),
                done.clone(),
                ended.clone(),
                http.clone(),
                frontend.clone(),
                addr.clone(),
            );
            let (requests, seed) = (cfg.requests, cfg.seed);
            tokio::spawn(async move {
                loop {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id >= requests {
                        return;
                    }
                    let mut rng =
                        SmallRng::seed_from_u64(seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let e = client(&http, &url, &addr, id, &mut rng).await;
                    ended.lock().unwrap().push((id, e));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let watch = async {
        loop {
            progress(done.load(Ordering::Relaxed));
            tokio::time::sleep(ms(100)).await;
        }
    };
    tokio::select! {
        _ = futures::future::join_all(clients) => {}
        _ = watch => {}
    }
    progress(cfg.requests);

    // Everything quiet: every admitted request has its report (a bound only, for a request
    // that never goes quiet: it then counts as not quiet).
    let patience = Instant::now() + Duration::from_secs(30);
    while Instant::now() < patience {
        let quiet = log
            .lock()
            .unwrap()
            .hops
            .iter()
            .all(|h| !h.entered || h.report.is_some());
        if quiet {
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    // Connections of the pool go back to it when their statement's guard releases them.
    let held_db = pool.size() as u64 - pool.num_idle() as u64;
    let held_permits: u64 = limits
        .iter()
        .map(|l| 64 - l.available_permits() as u64)
        .sum();
    let observations = judge(
        &log.lock().unwrap(),
        &ended.lock().unwrap(),
        held_db + held_permits,
        cfg.requests,
    );
    pool.close().await;
    observations
}

fn judge(log: &Log, ended: &[(u64, Ended)], orphans: u64, requests: u64) -> Observations {
    let mut o = Observations {
        requests,
        orphans,
        ..Observations::default()
    };
    let mut sends_from: HashMap<u64, u64> = HashMap::new();
    for h in &log.hops {
        o.admitted += u64::from(h.entered);
        o.over_rejection_cap += u64::from(h.over_cap);
        let Some((parent, seq)) = h.parent else {
            continue;
        };
        o.sent += 1;
        let Some(call) = log.calls.get(&(parent, seq)) else {
            // A request no call of its sender's was about to send: not covered.
            continue;
        };
        if call.live {
            *sends_from.entry(parent).or_default() += 1;
        }
        let grew = match (call.deadline, h.carried) {
            (Some(d), Some(c)) => call.before + c > d,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let admitted_later = match (h.ingress, h.deadline, h.carried) {
            (Some(i), Some(d), Some(c)) => d > i + c,
            _ => false,
        };
        o.expanded += u64::from(grew || admitted_later);
        if let (Some(d), Some(i), Some(c)) = (call.deadline, h.ingress, h.carried) {
            if i + c > d {
                o.outlived += 1;
                o.outlived_max = o.outlived_max.max(i + c - d);
            }
        }
        let expired = call.deadline.is_some_and(|d| call.before >= d);
        if h.entered && (call.cancelled || expired) {
            o.late_accepts += 1;
        }
    }
    for (key, h) in log.hops.iter().enumerate() {
        if let Some(r) = &h.report {
            o.quiet += 1;
            let sends = sends_from.get(&(key as u64)).copied().unwrap_or(0);
            o.registered_sends += sends.min(r.total());
            o.cancelled_receipts += r.cancelled();
            o.quarantined += r.quarantined();
            o.pending_effects += r.pending_effects().len() as u64;
        }
    }
    for (id, e) in ended {
        match e {
            Ended::Answered { late_by } => {
                o.answered += 1;
                o.missed += u64::from(late_by.is_some());
                o.late_by.extend(*late_by);
            }
            Ended::Hostile { refused } => {
                o.hostile += 1;
                o.hostile_refused += u64::from(*refused);
            }
            Ended::Cancelled(at) => {
                o.client_cancels += 1;
                let (last, what) = log.last_io.get(id).copied().unwrap_or((*at, "nothing"));
                o.cancel_to_quiet.push(last.saturating_duration_since(*at));
                o.last_io.push(if last > *at {
                    what
                } else {
                    "nothing after the cancel"
                });
            }
        }
    }
    o
}

/// Each sabotage of the hops makes phase 2's report fail its row: no load gate passes by
/// construction. (Only the sabotaged row is asserted: the others are about the machine's
/// real clock, which a loaded test machine may fail as well.)
#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::{phase_rows, Phase, Verdict};

    fn failing(sabotage: Sabotage) -> Vec<&'static str> {
        let cfg = LoadConfig {
            requests: 200,
            concurrency: 8,
            seed: 27,
            sabotage,
        };
        let o = run_load(&cfg, &|_| {}).observations;
        phase_rows(Phase::Load, &o)
            .into_iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| r.gate)
            .collect()
    }

    /// The edge's rejection cap refuses malformed budgets up to 20 % of the requests and lets
    /// the rest through: counted apart, none of them in the miss figures.
    #[test]
    fn the_edges_rejection_cap_lets_through_what_it_does_not_refuse() {
        let cfg = LoadConfig {
            requests: 200,
            concurrency: 8,
            seed: 27,
            sabotage: Sabotage::None,
        };
        let o = run_load(&cfg, &|_| {}).observations;
        assert!(o.hostile > cfg.requests / 5, "{o:?}");
        assert!(100 * o.hostile_refused <= 20 * (cfg.requests + 1), "{o:?}");
        assert_eq!(o.hostile_refused + o.over_rejection_cap, o.hostile, "{o:?}");
        assert!(o.over_rejection_cap > 0, "{o:?}");
        assert_eq!(o.answered + o.client_cancels + o.hostile, cfg.requests);
    }

    #[test]
    fn a_hop_that_writes_a_larger_budget_fails_budget_expansion() {
        let failed = failing(Sabotage::GrowBudget);
        assert!(failed.contains(&"budget expansion"), "{failed:?}");
    }

    #[test]
    fn a_request_sent_after_cancel_fails_late_accepts_and_pre_registration() {
        let failed = failing(Sabotage::SendAfterCancel);
        assert!(
            failed.contains(&"downstream accepts after deadline or cancel"),
            "{failed:?}"
        );
        assert!(
            failed.contains(&"child pre-registration coverage"),
            "{failed:?}"
        );
    }

    #[test]
    fn a_permit_never_released_fails_orphans() {
        let failed = failing(Sabotage::LeakPermit);
        assert!(
            failed.contains(&"orphan connections and permits"),
            "{failed:?}"
        );
    }

    #[test]
    fn a_late_answer_fails_deadline_miss() {
        let failed = failing(Sabotage::LateAnswer);
        assert!(failed.contains(&"end-to-end deadline miss"), "{failed:?}");
    }
}
