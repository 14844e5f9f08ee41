//! Admission with the Redis registry over real loopback servers: two axum servers, each on a
//! runtime of its own with its own `RedisRegistry` handle on one throwaway `redis-server`,
//! as two processes would be, and a reqwest client. Real sockets run on the real clock:
//! the assertions are about outcomes and inequalities.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::registry::{OperationId, Operations};
use cancel_scope::wire::{Admission, EndpointPolicy, RegistryTerm, Trust};
use cancel_scope::Scope;

use super::redis::{Instance, WITHIN};
use crate::support::redis::RedisServer;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An edge: untrusted callers, at most 3 s.
fn edge() -> EndpointPolicy {
    EndpointPolicy::builder(ms(3000)).build()
}

/// An inner service: trusts its callers' operation ids and generations.
fn inner() -> EndpointPolicy {
    EndpointPolicy::builder(ms(30_000))
        .trust(Trust::Trusted)
        .build()
}

#[derive(Clone)]
struct App {
    /// Where `/wait` says it runs.
    arrived: mpsc::SyncSender<()>,
}

/// What the handler saw: its operation, the registry's term, its budget, its generation.
async fn seen(Extension(a): Extension<Admission>) -> String {
    let scope = Scope::current();
    format!(
        "op={} term={:?} rem_ms={} gen={}",
        a.operation_id(),
        a.registry(),
        scope.remaining().unwrap().as_millis(),
        scope.operation().unwrap().generation(),
    )
}

/// Runs until its request's scope is cancelled.
async fn wait(State(app): State<App>) -> &'static str {
    app.arrived.send(()).unwrap();
    Scope::current().cancelled().await;
    "stopped"
}

/// Serves `/seen` and `/wait` on `at`'s runtime, admitting through `ops`; returns the URL
/// and the arrivals of `/wait`.
fn serve(at: &Instance, policy: EndpointPolicy, ops: &Operations) -> (String, mpsc::Receiver<()>) {
    let (arrived, rx) = mpsc::sync_channel(8);
    let router = Router::new()
        .route("/seen", get(seen))
        .route("/wait", get(wait))
        .with_state(App { arrived })
        .layer(AdmitLayer::new(policy).operations(ops));
    let addr = at.run(crate::support::servers::serve(router));
    (format!("http://{addr}"), rx)
}

fn field<'a>(answer: &'a str, key: &str) -> &'a str {
    answer
        .split(' ')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {answer}"))
}

fn rem_ms(answer: &str) -> u64 {
    field(answer, "rem_ms").parse().unwrap()
}

/// The client, on a runtime of its own.
struct Client {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl Client {
    fn new() -> Client {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        Client {
            rt,
            http: reqwest::Client::new(),
        }
    }

    fn request(&self, url: &str, budget: Option<&str>) -> reqwest::RequestBuilder {
        let req = self.http.get(url);
        match budget {
            Some(b) => req.header("service-budget", b),
            None => req,
        }
    }

    /// The status and text of a GET of `url`, with a `service-budget` header if given.
    fn get(&self, url: &str, budget: Option<&str>) -> (u16, String) {
        let req = self.request(url, budget);
        self.rt.block_on(async {
            let res = tokio::time::timeout(WITHIN, req.send())
                .await
                .expect("no answer")
                .unwrap();
            (res.status().as_u16(), res.text().await.unwrap())
        })
    }

    /// A GET of `url` sent now, answered later.
    fn spawn(
        &self,
        url: &str,
        budget: Option<&str>,
    ) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
        self.rt.spawn(self.request(url, budget).send())
    }

    fn status_of(&self, call: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) -> u16 {
        self.rt.block_on(async {
            let res = tokio::time::timeout(WITHIN, call)
                .await
                .expect("the request was not stopped");
            res.unwrap().unwrap().status().as_u16()
        })
    }
}

fn claim(op: &str, gen: Option<u64>) -> String {
    match gen {
        Some(g) => format!("v=1, rem=10000, op=\"{op}\", gen={g}"),
        None => format!("v=1, rem=10000, op=\"{op}\""),
    }
}

#[test]
fn a_retry_at_another_server_never_gets_more_than_the_operation_has_left() {
    let Some(server) = RedisServer::start("servers_share_an_operation") else {
        return;
    };
    let (a, b) = (Instance::new(&server), Instance::new(&server));
    let (a_url, _) = serve(&a, edge(), &a.ops);
    let (b_url, _) = serve(&b, edge(), &b.ops);
    let client = Client::new();

    // The client's first request: 800 ms, which the edge begins the operation with.
    let first = client.get(&format!("{a_url}/seen"), Some("v=1, rem=800"));
    let answered = Instant::now();
    assert_eq!(first.0, 200, "{first:?}");
    assert_eq!(field(&first.1, "term"), "Created");
    let id = field(&first.1, "op").to_owned();

    // Its retry goes to the other server, under the id the edge issued, asking for 10 s:
    // the endpoint alone would give 3 s, the operation has less than 800 ms left.
    // (The store counts whole milliseconds: 1 ms of slack.)
    let waited = u64::try_from(answered.elapsed().as_millis()).unwrap();
    let (status, retry) = client.get(&format!("{b_url}/seen"), Some(&claim(&id, None)));
    assert_eq!(status, 200, "{retry}");
    assert_eq!(field(&retry, "op"), id);
    assert_eq!(field(&retry, "term"), "Joined");
    assert!(
        rem_ms(&retry) <= 801 - waited.min(800),
        "{retry} after {waited} ms"
    );
    assert_eq!(b.ops.counts().joined(), 1);
    assert_eq!(b.ops.counts().created(), 0);

    // An id neither server issued is not the client's to create, at either.
    let (_, victim) = client.get(&format!("{b_url}/seen"), Some(&claim("victim-op", None)));
    assert_ne!(field(&victim, "op"), "victim-op");
    assert_eq!(field(&victim, "term"), "Created");
    let exists = server.command(redis::cmd("EXISTS").arg("cs-test:op:victim-op"));
    assert_eq!(exists, redis::Value::Int(0));
}

/// An operation begun at edge A, a call of it in flight at inner service B (as the edge's
/// own outgoing call would carry it: its `op`, generation 0), then cancelled at A.
struct Cancelled {
    client: Client,
    a_url: String,
    b_url: String,
    id: String,
    in_flight: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
}

fn cancelled_in_flight(a: &Instance, b: &Instance) -> Cancelled {
    b.subscribed(1);
    let (a_url, _) = serve(a, edge(), &a.ops);
    let (b_url, b_arrived) = serve(b, inner(), &b.ops);
    let client = Client::new();
    let (_, first) = client.get(&format!("{a_url}/seen"), None);
    let id = field(&first, "op").to_owned();
    let in_flight = client.spawn(&format!("{b_url}/wait"), Some(&claim(&id, Some(0))));
    b_arrived
        .recv_timeout(WITHIN)
        .expect("B's handler never ran");
    a.run(a.ops.cancel(&OperationId::new(&id).unwrap()))
        .unwrap();
    Cancelled {
        client,
        a_url,
        b_url,
        id,
        in_flight,
    }
}

#[test]
fn a_cancel_on_one_server_stops_the_others_request_and_refuses_the_old_generation() {
    let Some(server) = RedisServer::start("servers_cancel") else {
        return;
    };
    let (a, b) = (Instance::new(&server), Instance::new(&server));
    let Cancelled {
        client,
        a_url,
        b_url,
        id,
        in_flight,
    } = cancelled_in_flight(&a, &b);
    // Heard on pub/sub: B's request is stopped by the cancel, answered 503.
    assert_eq!(client.status_of(in_flight), 503);
    assert!(b.registry.listener().unwrap().cancels_heard() >= 1);

    // A call cut before the cancel (generation 0) is refused at both (B, which trusts its
    // callers, shows them the detail), and so is any request of the cancelled operation.
    for url in [&b_url, &a_url] {
        let (status, text) = client.get(&format!("{url}/seen"), Some(&claim(&id, Some(0))));
        assert_eq!(status, 409, "{text}");
        assert!(text.starts_with("operation cancelled"), "{text}");
    }
}

#[test]
fn a_lost_announcement_is_caught_at_the_other_servers_next_admission() {
    let Some(server) = RedisServer::start("servers_lost_announcement") else {
        return;
    };
    // A's cancels reach the store and are never announced.
    let a = Instance::with(&server, |b| b.announce(false));
    let b = Instance::new(&server);
    let Cancelled {
        client,
        b_url,
        id,
        in_flight: straggler,
        ..
    } = cancelled_in_flight(&a, &b);
    assert_eq!(b.registry.listener().unwrap().cancels_heard(), 0);
    assert!(!straggler.is_finished());

    // The operation's next request at B reads the store's generation: refused, and B's
    // straggler is stopped by that read.
    let (status, text) = client.get(&format!("{b_url}/seen"), Some(&claim(&id, Some(0))));
    assert_eq!(status, 409, "{text}");
    assert_eq!(text, "operation cancelled: the operation was cancelled");
    assert_eq!(client.status_of(straggler), 503);
    assert_eq!(b.registry.listener().unwrap().cancels_heard(), 0);
}

#[test]
fn a_stopped_redis_leaves_admission_on_the_endpoints_cap_counted() {
    let Some(mut server) = RedisServer::start("servers_stopped_redis") else {
        return;
    };
    let b = Instance::new(&server);
    let ops = b.ops.clone().timeout(ms(300));
    let (b_url, _) = serve(&b, edge(), &ops);
    let client = Client::new();
    let (_, first) = client.get(&format!("{b_url}/seen"), None);
    assert_eq!(field(&first, "term"), "Created");
    let id = field(&first, "op").to_owned();

    // Hung: nothing answers; admission waits its 300 ms bound and goes on with the cap.
    let frozen = server.freeze();
    let start = Instant::now();
    let (status, hung) = client.get(&format!("{b_url}/seen"), Some(&claim(&id, None)));
    let took = start.elapsed();
    assert_eq!(status, 200, "{hung}");
    assert_eq!(field(&hung, "term"), format!("{:?}", RegistryTerm::Fault));
    assert!(took >= ms(300), "{took:?}");
    assert!(rem_ms(&hung) <= 3000 - 300, "{hung}");
    assert!(rem_ms(&hung) > 0, "{hung}");
    drop(frozen);

    // Killed: a fault too, still bounded by the cap.
    server.kill();
    let (status, down) = client.get(&format!("{b_url}/seen"), Some(&claim(&id, None)));
    assert_eq!(status, 200, "{down}");
    assert_eq!(field(&down, "term"), format!("{:?}", RegistryTerm::Fault));
    assert!(rem_ms(&down) <= 3000, "{down}");
    assert_eq!(ops.counts().faults(), 2);
}
