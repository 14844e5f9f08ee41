//! Durable intents in PostgreSQL (`PgIntentStore`), on a throwaway cluster (see
//! `support/postgres.rs`): the table created if missing, idempotent by effect id, resolved
//! once — and a real child process killed after dispatching a write, whose intent other
//! processes list and resolve exactly once.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::support::postgres::PgCluster;
use cancel_scope::integrations::sqlx::PgIntentStore;
use cancel_scope::reconcile::{
    EffectClass, Intent, IntentStore, Journal, Reconciler, Resolution, Resolved,
};
use cancel_scope::registry::OperationId;
use cancel_scope::{ChildSpec, Scope};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

async fn pool(options: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("connect pool")
}

async fn store(pool: &PgPool) -> PgIntentStore {
    PgIntentStore::builder(pool.clone())
        .open()
        .await
        .expect("open the intent store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_is_created_if_missing_once_even_by_processes_starting_together() {
    let Some(pg) = PgCluster::start("intents_table_created") else {
        return;
    };
    let pool = pool(pg.options()).await;
    let open = || {
        PgIntentStore::builder(pool.clone())
            .schema("ops")
            .table("intents")
            .open()
    };
    let (a, b, c) = tokio::join!(open(), open(), open());
    let (a, _, _) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert_eq!(a.table(), r#""ops"."intents""#);
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'ops' AND tablename = 'intents'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 1);
    // Opening an existing table keeps its rows.
    a.record(&Intent::new("e-1", "write", EffectClass::SideEffecting))
        .await
        .unwrap();
    let again = open().await.unwrap();
    assert!(again.get("e-1").await.unwrap().unwrap().is_pending());

    for (schema, table) in [
        ("ops", "bad name"),
        ("x\"; DROP", "t"),
        ("ops", "1t"),
        ("", "t"),
    ] {
        let err = PgIntentStore::builder(pool.clone())
            .schema(schema)
            .table(table)
            .open()
            .await
            .unwrap_err();
        assert!(err.is_invalid(), "{schema:?}.{table:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_is_idempotent_by_effect_id_and_resolved_once_among_racing_resolvers() {
    let Some(pg) = PgCluster::start("intents_idempotent") else {
        return;
    };
    let pool = pool(pg.options()).await;
    let store = Arc::new(store(&pool).await);
    let intent = Intent::new("order-42", "put-order", EffectClass::Idempotent)
        .payload_digest("sha256:1")
        .operation("op-1");
    store.record(&intent).await.unwrap();
    // A second attempt of the same effect knows less; what the first wrote stays.
    store
        .record(&Intent::new(
            "order-42",
            "put-order",
            EffectClass::Idempotent,
        ))
        .await
        .unwrap();
    let rec = store.get("order-42").await.unwrap().unwrap();
    assert_eq!(rec.attempts(), 2);
    assert_eq!(rec.intent().payload_digest_str(), Some("sha256:1"));
    assert_eq!(rec.intent().operation_id(), Some("op-1"));
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", store.table()))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);

    let resolves = (0..8).map(|_| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .resolve("order-42", Resolution::Applied, Some("psp-1"))
                .await
                .unwrap()
        })
    });
    let mut outcomes = Vec::new();
    for r in resolves {
        outcomes.push(r.await.unwrap());
    }
    assert_eq!(
        outcomes.iter().filter(|o| o.is_now()).count(),
        1,
        "{outcomes:?}"
    );
    assert!(outcomes
        .iter()
        .all(|o| o.is_now() || *o == Resolved::Already(Resolution::Applied)));
    let rec = store.get("order-42").await.unwrap().unwrap();
    assert_eq!(rec.resolution(), Some(Resolution::Applied));
    assert_eq!(rec.intent().provider_handle_str(), Some("psp-1"));
    assert!(rec.resolved_at().unwrap() >= rec.recorded_at());
    assert_eq!(
        store
            .resolve("nope", Resolution::Applied, None)
            .await
            .unwrap(),
        Resolved::Unknown
    );
    assert!(store.pending(Duration::ZERO, 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_writes_the_intent_before_the_write_and_resolves_it_after() {
    let Some(pg) = PgCluster::start("intents_journal") else {
        return;
    };
    let pool = pool(pg.options()).await;
    create_payments(&pool).await;
    let store = Arc::new(store(&pool).await);
    let journal = Journal::new(store.clone());
    let scope = Scope::with_timeout(Duration::from_secs(10));

    let spec = ChildSpec::side_effecting("charge-card", "pay-1").payload_digest("sha256:ab");
    let mut call = journal
        .dispatch(scope.register(spec).unwrap(), Some("op-1"))
        .await
        .unwrap();
    // Before anything is sent, the row is there and pending.
    let pending = store.pending(Duration::ZERO, 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].intent().payload_digest_str(), Some("sha256:ab"));
    pay(&pool, "pay-1").await;
    call.set_provider_handle("txn-77");
    call.succeed().await.unwrap();

    let rec = store.get("pay-1").await.unwrap().unwrap();
    assert_eq!(rec.resolution(), Some(Resolution::Applied));
    assert_eq!(rec.intent().provider_handle_str(), Some("txn-77"));
    // Not yet old enough for a reconciler that leaves a minute's grace to calls in flight.
    let fresh = Intent::new("pay-2", "charge-card", EffectClass::SideEffecting);
    store.record(&fresh).await.unwrap();
    assert!(store
        .pending(Duration::from_secs(60), 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.pending(Duration::ZERO, 10).await.unwrap().len(), 1);
}

async fn create_payments(pool: &PgPool) {
    sqlx::query("CREATE TABLE IF NOT EXISTS payments (effect_id text PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
}

/// The write the test's "provider" receives.
async fn pay(pool: &PgPool, effect_id: &str) {
    sqlx::query("INSERT INTO payments (effect_id) VALUES ($1)")
        .bind(effect_id)
        .execute(pool)
        .await
        .unwrap();
}

const ROLE: &str = "CANCEL_SCOPE_INTENT_ROLE";
const MARK: &str = "cancel-scope-child> ";
const SOCKET: &str = "CANCEL_SCOPE_INTENT_PG_SOCKET";
const EFFECT: &str = "CANCEL_SCOPE_INTENT_EFFECT";
const OPERATION: &str = "CANCEL_SCOPE_INTENT_OPERATION";

/// Runs this test binary's `intent_child_process` with `role`.
fn child(pg: &PgCluster, role: &str, effect: &str, operation: &str) -> std::process::Child {
    let socket = pg.options().get_socket().expect("a socket dir").clone();
    // The test's path in the binary: this module's path without the binary's name.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &format!("{module}::intent_child_process"),
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env(ROLE, role)
        .env(SOCKET, socket)
        .env(EFFECT, effect)
        .env(OPERATION, operation)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a child process")
}

/// What a child printed after the [`MARK`], line by line (the test harness may have started a
/// line before it), until it exits or `until` matches.
fn lines_until(child: &mut std::process::Child, until: impl Fn(&str) -> bool) -> Vec<String> {
    let out = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut seen = Vec::new();
    for line in out.lines() {
        let line = line.expect("read the child's output");
        if let Some((_, marked)) = line.split_once(MARK) {
            seen.push(marked.to_owned());
            if until(marked) {
                break;
            }
        }
    }
    seen
}

/// Runs `talk` (reading the children `pids`) on a blocking thread; kills them and fails if it
/// takes longer than a minute.
async fn within<T: Send + 'static>(pids: &[u32], talk: impl FnOnce() -> T + Send + 'static) -> T {
    let talk = tokio::task::spawn_blocking(talk);
    match tokio::time::timeout(Duration::from_secs(60), talk).await {
        Ok(done) => done.expect("the children's reader panicked"),
        Err(_) => {
            for pid in pids {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            panic!("the child processes did not finish within a minute");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_after_dispatching_a_write_leaves_an_intent_resolved_once() {
    let Some(pg) = PgCluster::start("intents_killed_process") else {
        return;
    };
    let pool = pool(pg.options()).await;
    create_payments(&pool).await;
    let effect = format!("pay-{}", OperationId::random());
    let operation = OperationId::random().to_string();

    // A writer process: intent, dispatch, the write reaches the provider, then it is killed
    // before it learns (or records) anything more.
    let mut writer = child(&pg, "writer", &effect, &operation);
    let pids = [writer.id()];
    let (said, status) = within(&pids, move || {
        let said = lines_until(&mut writer, |l| l == "dispatched-and-sent");
        writer.kill().expect("kill the writer");
        (said, writer.wait().expect("wait for the writer"))
    })
    .await;
    assert_eq!(said, ["dispatched-and-sent"]);
    assert_eq!(
        status.signal(),
        Some(9),
        "the writer was killed: {status:?}"
    );

    // Two reconciler processes start together; each lists what is pending and resolves it.
    let reconcilers: Vec<_> = (0..2)
        .map(|_| child(&pg, "reconciler", &effect, &operation))
        .collect();
    let pids: Vec<u32> = reconcilers.iter().map(|c| c.id()).collect();
    let outputs = within(&pids, move || {
        reconcilers
            .into_iter()
            .map(|mut c| {
                let said = lines_until(&mut c, |_| false);
                assert!(c.wait().expect("wait").success(), "a reconciler failed");
                said
            })
            .collect::<Vec<_>>()
    })
    .await;
    let outcomes: Vec<&str> = outputs
        .iter()
        .map(|said| {
            let last = said.last().expect("a reconciler said nothing");
            last.strip_prefix("resolved ").expect("a resolve outcome")
        })
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == "now").count(),
        1,
        "{outputs:?}"
    );
    assert!(outcomes.contains(&"already applied"), "{outputs:?}");
    // The first to list found the writer's intent, as the writer wrote it.
    let found = outputs
        .iter()
        .flatten()
        .find(|l| l.starts_with("found "))
        .expect("no reconciler listed the intent");
    assert_eq!(
        found,
        &format!("found {effect} charge-card side-effecting op={operation} digest=sha256:ab12 attempts=1")
    );

    let store = store(&pool).await;
    let rec = store.get(&effect).await.unwrap().unwrap();
    assert_eq!(rec.resolution(), Some(Resolution::Applied));
    assert!(store.pending(Duration::ZERO, 10).await.unwrap().is_empty());
}

/// The entry point of the child processes of
/// `a_process_killed_after_dispatching_a_write_leaves_an_intent_resolved_once`, which runs
/// this binary with `--ignored --exact intent_child_process` and the role in the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_process_killed_after_dispatching_a_write_leaves_an_intent_resolved_once, run by it"]
async fn intent_child_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let socket = std::env::var(SOCKET).expect("socket dir");
    let effect = std::env::var(EFFECT).expect("effect id");
    let operation = std::env::var(OPERATION).expect("operation id");
    let options = PgConnectOptions::new()
        .socket(socket)
        .port(5432)
        .username("postgres")
        .database("postgres");
    let pool = pool(options).await;
    let store = Arc::new(store(&pool).await);
    let say = |line: &str| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{MARK}{line}").unwrap();
        out.flush().unwrap();
    };
    match role.as_str() {
        "writer" => {
            let journal = Journal::new(store);
            let scope = Scope::with_timeout(Duration::from_secs(60));
            let spec = ChildSpec::side_effecting("charge-card", effect.as_str())
                .payload_digest("sha256:ab12");
            let call = journal
                .dispatch(scope.register(spec).unwrap(), Some(&operation))
                .await
                .unwrap();
            pay(&pool, &effect).await;
            say("dispatched-and-sent");
            // Waiting for the provider's answer when the process is killed.
            std::future::pending::<()>().await;
            drop(call);
        }
        "reconciler" => {
            let reconciler = Reconciler::new(store);
            for rec in reconciler.pending(Duration::ZERO, 100).await.unwrap() {
                let i = rec.intent();
                say(&format!(
                    "found {} {} {} op={} digest={} attempts={}",
                    i.effect_id(),
                    i.name(),
                    i.class().as_str(),
                    i.operation_id().unwrap_or("-"),
                    i.payload_digest_str().unwrap_or("-"),
                    rec.attempts(),
                ));
            }
            // Ask the "provider": the payment is in its table.
            let applied: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM payments WHERE effect_id = $1)")
                    .bind(&effect)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            let resolution = if applied {
                Resolution::Applied
            } else {
                Resolution::NotApplied
            };
            match reconciler.resolve(&effect, resolution).await.unwrap() {
                Resolved::Now => say("resolved now"),
                Resolved::Already(Resolution::Applied) => say("resolved already applied"),
                other => say(&format!("resolved {other:?}")),
            }
        }
        other => panic!("unknown role {other}"),
    }
}
