//! The Redis operation registry against a real `redis-server`: two registries, each on a
//! runtime of its own, pointing at one server, as two processes would.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::redis::RedisServer;
use cancel_scope::integrations::redis::{RedisRegistry, RedisRegistryBuilder};
use cancel_scope::registry::{
    CancelOutcome, Join, OperationId, OperationRegistry, Operations, OPERATION_CANCELLED,
};
use cancel_scope::Scope;

const PREFIX: &str = "cs-test:";
/// The longest a test waits for an event (a pub/sub message, a reconnection).
pub(crate) const WITHIN: Duration = Duration::from_secs(10);
/// What a loaded machine may add to a bounded wait.
const SLACK: Duration = Duration::from_millis(500);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One "process": a runtime of its own, a registry on it, admission's view of it.
pub(crate) struct Instance {
    pub(crate) registry: Arc<RedisRegistry>,
    pub(crate) ops: Operations,
    pub(crate) rt: tokio::runtime::Runtime,
}

impl Instance {
    pub(crate) fn new(server: &RedisServer) -> Instance {
        Instance::with(server, |b| b)
    }

    pub(crate) fn with(
        server: &RedisServer,
        build: impl FnOnce(RedisRegistryBuilder) -> RedisRegistryBuilder,
    ) -> Instance {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let builder = build(RedisRegistry::builder(server.client()).prefix(PREFIX));
        let registry = Arc::new(rt.block_on(builder.connect()).expect("connect"));
        let ops = Operations::new(registry.clone()).timeout(Duration::from_secs(2));
        Instance { registry, ops, rt }
    }

    pub(crate) fn run<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Waits until the listener is subscribed (at least `n` times in all).
    pub(crate) fn subscribed(&self, n: u64) {
        let status = self.run(async {
            let subscribed = self
                .registry
                .listener_until(|s| s.is_connected() && s.subscriptions() >= n);
            tokio::time::timeout(WITHIN, subscribed).await
        });
        assert!(matches!(status, Ok(Some(_))), "listener not subscribed");
    }

    /// Begins a fresh operation of a minute (as its edge), and returns its id.
    fn begin(&self) -> OperationId {
        let id = OperationId::random();
        let join = Join::new(id.clone(), ms(60_000)).create(true);
        assert!(self.run(self.ops.join(join)).unwrap().created());
        id
    }

    /// A request scope of operation `id` on this instance, attached, with work running under
    /// it until it is cancelled; returns the scope and the work's handle.
    fn request(
        &self,
        id: &OperationId,
    ) -> (
        Scope,
        tokio::task::JoinHandle<Result<(), cancel_scope::Error>>,
    ) {
        let scope = self.run(async { Scope::with_timeout(Duration::from_secs(60)) });
        self.ops.attach(id, &scope).expect("attach");
        let work = self.rt.spawn({
            let scope = scope.clone();
            async move { scope.run(tokio::time::sleep(Duration::from_secs(60))).await }
        });
        (scope, work)
    }

    /// Waits for `work` to end and checks it was stopped by the operation's cancel.
    fn stopped_by_the_operations_cancel(
        &self,
        work: tokio::task::JoinHandle<Result<(), cancel_scope::Error>>,
    ) {
        let ended = self.run(async { tokio::time::timeout(WITHIN, work).await });
        let err = ended
            .expect("the work was not stopped")
            .expect("task")
            .expect_err("the work ran to its end");
        assert_eq!(err.cause().unwrap().reason(), Some(OPERATION_CANCELLED));
    }
}

/// An edge whose cancels are recorded in the store but never announced (every message is
/// lost), and a listening instance.
fn silent_edge_and_listener(server: &RedisServer) -> (Instance, Instance) {
    let a = Instance::with(server, |b| b.announce(false));
    let b = Instance::new(server);
    b.subscribed(1);
    (a, b)
}

fn key(id: &OperationId) -> String {
    format!("{PREFIX}op:{id}")
}

#[test]
fn two_registries_share_an_operations_remaining_time_and_generation() {
    let Some(server) = RedisServer::start("two_registries_share") else {
        return;
    };
    let a = Instance::new(&server);
    let b = Instance::new(&server);
    let id = OperationId::random();

    let edge = a
        .run(a.ops.join(Join::new(id.clone(), ms(2000)).create(true)))
        .unwrap();
    assert!(edge.created());
    let pttl: i64 =
        redis::from_redis_value(server.command(redis::cmd("PTTL").arg(key(&id)))).unwrap();
    assert!(pttl > 0 && pttl <= 2000, "PTTL {pttl}");

    // 300 ms later, the other process: a trusted hop asking for 30 s may create, but the
    // operation exists, so it gets what is left of the 2 s, by the store's clock.
    std::thread::sleep(ms(300));
    let hop = b
        .run(
            b.ops
                .join(Join::new(id.clone(), ms(30_000)).create(true).generation(0)),
        )
        .unwrap();
    assert!(!hop.created());
    assert!(hop.remaining() <= ms(1700), "{:?}", hop.remaining());
    assert_eq!(hop.generation(), 0);

    // A cancel on one is the generation both read.
    let cancelled = a.run(a.ops.cancel(&id)).unwrap();
    assert!(matches!(cancelled, CancelOutcome::Cancelled(s) if s.generation() == 1));
    let seen = b.run(b.registry.get(&id)).unwrap().unwrap();
    assert_eq!((seen.generation(), seen.is_cancelled()), (1, true));
    assert!(seen.remaining() <= ms(1700));
    let again = b.run(b.registry.cancel(&id)).unwrap();
    assert!(matches!(again, CancelOutcome::AlreadyCancelled(s) if s.generation() == 1));
}

#[test]
fn a_cancel_on_one_instance_stops_the_others_scopes_through_pub_sub() {
    let Some(server) = RedisServer::start("cancel_through_pub_sub") else {
        return;
    };
    let a = Instance::new(&server);
    let b = Instance::new(&server);
    b.subscribed(1);
    let id = a.begin();
    b.run(b.ops.join(Join::new(id.clone(), ms(60_000)).generation(0)))
        .unwrap();
    let (scope, work) = b.request(&id);
    let other = OperationId::random();
    let (bystander, _) = b.request(&other);

    a.run(a.ops.cancel(&id)).unwrap();
    b.stopped_by_the_operations_cancel(work);
    assert!(scope.is_cancelled());
    assert!(!bystander.is_cancelled());
    assert!(b.registry.listener().unwrap().cancels_heard() >= 1);
    // B remembers it: the operation's next request is refused without a round trip.
    assert!(b.ops.check(&id).unwrap_err().is_cancelled());
}

#[test]
fn a_lost_announcement_is_caught_at_the_next_generation_check() {
    let Some(server) = RedisServer::start("lost_announcement") else {
        return;
    };
    let (a, b) = silent_edge_and_listener(&server);
    let id = a.begin();
    let (straggler, _work) = b.request(&id);

    a.run(a.ops.cancel(&id)).unwrap();
    // Nothing reached B: its scope runs on.
    assert!(!straggler.is_cancelled());
    assert_eq!(b.registry.listener().unwrap().cancels_heard(), 0);
    assert!(b.ops.check(&id).is_ok());

    // The operation's next hop on B, cut before the cancel (generation 0), is refused by the
    // store's generation — and that read stops B's straggler too.
    let refused = b
        .run(b.ops.join(Join::new(id.clone(), ms(60_000)).generation(0)))
        .unwrap_err();
    assert!(refused.is_refused() && refused.is_cancelled());
    assert_eq!(refused.generation(), Some(1));
    assert_eq!(
        straggler.cause().unwrap().reason(),
        Some(OPERATION_CANCELLED)
    );

    // A third process that never listens refuses it as well.
    let c = Instance::with(&server, |b| b.listen(false));
    assert!(c.registry.listener().is_none());
    let refused = c
        .run(c.ops.join(Join::new(id, ms(60_000)).create(true)))
        .unwrap_err();
    assert!(refused.is_cancelled());
}

#[test]
fn a_listener_that_reconnects_catches_up_on_the_cancels_it_missed() {
    let Some(server) = RedisServer::start("listener_catches_up") else {
        return;
    };
    let (a, b) = silent_edge_and_listener(&server);
    let id = a.begin();
    let (_, work) = b.request(&id);
    let other = a.begin();
    let (open, _) = b.request(&other);

    a.run(a.ops.cancel(&id)).unwrap();
    // B's subscription is cut (as by a network blip, or the server's output-buffer limit);
    // when it subscribes again it reads the operations it has scopes of.
    server.command(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"));
    b.subscribed(2);
    b.stopped_by_the_operations_cancel(work);
    let status = b.registry.listener().unwrap();
    assert_eq!(status.cancels_caught_up(), 1);
    assert_eq!(status.cancels_heard(), 0);
    assert!(!open.is_cancelled());
}

#[test]
fn a_stopped_redis_is_a_fault_within_the_callers_bound() {
    let Some(mut server) = RedisServer::start("stopped_redis") else {
        return;
    };
    let b = Instance::new(&server);
    let ops = b.ops.clone().timeout(ms(300));
    let id = b.begin();

    // A hung server: connections stay open, nothing answers.
    let frozen = server.freeze();
    let (scope, _work) = b.request(&id);
    for (budget, bound) in [(ms(60_000), ms(300)), (ms(100), ms(100))] {
        let start = Instant::now();
        let err = b.run(ops.join(Join::new(id.clone(), budget))).unwrap_err();
        let took = start.elapsed();
        assert!(
            err.is_fault() && err.fault().unwrap().is_timeout(),
            "{err:?}"
        );
        assert!(
            took >= bound && took < bound + SLACK,
            "{took:?} for a bound of {bound:?}"
        );
    }
    assert_eq!(ops.counts().faults(), 2);
    // A cancel cannot reach the store, but stops this process's scopes at once.
    let start = Instant::now();
    assert!(b.run(ops.cancel(&id)).unwrap_err().is_timeout());
    assert!(start.elapsed() < ms(300) + SLACK);
    assert!(scope.is_cancelled());
    drop(frozen);

    // Killed: a fault too, within the bound, until it is back.
    server.kill();
    let id = OperationId::random();
    let start = Instant::now();
    let err = b
        .run(ops.join(Join::new(id.clone(), ms(60_000))))
        .unwrap_err();
    assert!(err.is_fault(), "{err:?}");
    assert!(start.elapsed() < ms(300) + SLACK);

    server.restart();
    let deadline = Instant::now() + WITHIN;
    let back = loop {
        let join = b.run(ops.join(Join::new(id.clone(), ms(60_000)).create(true)));
        match join {
            Ok(joined) => break joined,
            Err(e) => assert!(e.is_fault() && Instant::now() < deadline, "{e:?}"),
        }
        std::thread::sleep(ms(50));
    };
    // The restarted server is empty (no persistence): the operation begins anew.
    assert!(back.created());
}

#[test]
fn keys_live_under_the_prefix_with_the_operations_expiry() {
    let Some(server) = RedisServer::start("keys_under_prefix") else {
        return;
    };
    let a = Instance::new(&server);
    let other = Instance::with(&server, |b| b.prefix("cs-other:"));
    let id = OperationId::new("op with spaces").unwrap();
    a.run(a.registry.begin(&id, ms(5000))).unwrap();

    let fields: Vec<String> =
        redis::from_redis_value(server.command(redis::cmd("HGETALL").arg(key(&id)))).unwrap();
    assert_eq!(fields, ["gen", "0", "closed", "0"]);
    // Another prefix is another namespace.
    assert!(other.run(other.registry.get(&id)).unwrap().is_none());

    a.run(a.registry.cancel(&id)).unwrap();
    let fields: Vec<String> =
        redis::from_redis_value(server.command(redis::cmd("HGETALL").arg(key(&id)))).unwrap();
    assert_eq!(fields, ["gen", "1", "closed", "1"]);
    let pttl: i64 =
        redis::from_redis_value(server.command(redis::cmd("PTTL").arg(key(&id)))).unwrap();
    assert!(
        pttl > 0 && pttl <= 5000,
        "the cancel kept the expiry: PTTL {pttl}"
    );

    let err = a.run(
        RedisRegistry::builder(server.client())
            .prefix("bad prefix")
            .connect(),
    );
    assert!(err.unwrap_err().is_invalid());
}

#[test]
fn a_key_this_registry_did_not_write_is_a_store_fault() {
    let Some(server) = RedisServer::start("foreign_key") else {
        return;
    };
    let a = Instance::new(&server);
    let id = OperationId::new("taken").unwrap();
    server.command(redis::cmd("SET").arg(key(&id)).arg("not a hash"));
    let read = a.run(a.registry.get(&id)).unwrap_err();
    assert!(read.is_fault() && !read.is_unreachable() && !read.is_timeout());
    assert!(a
        .run(a.registry.begin(&id, ms(1000)))
        .unwrap_err()
        .is_fault());
    let hash = OperationId::new("someone-elses").unwrap();
    server.command(redis::cmd("HSET").arg(key(&hash)).arg("x").arg("1"));
    assert!(a.run(a.registry.get(&hash)).unwrap_err().is_fault());
    assert!(a.run(a.registry.cancel(&hash)).unwrap_err().is_fault());
}
