//! A throwaway PostgreSQL cluster for one test: `initdb` + `pg_ctl` on a temporary directory,
//! reachable only through a unix socket in that directory, stopped and removed on drop.
//!
//! Binaries: `$PG_BIN`, else `/usr/lib/postgresql/15/bin` (Debian's `postgresql-15`), else the
//! newest `/usr/lib/postgresql/*/bin`. As root the server runs as `postgres` through
//! `runuser`, since PostgreSQL refuses to run as root.
//!
//! Without binaries a test says loudly that it was skipped — unless `CI=true`, where a
//! missing server is a failure, not a skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use std::time::Duration;

use cancel_scope::integrations::sqlx::{GuardedConnection, GuardedPool};
use cancel_scope::ChildSpec;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, Postgres, Row};
use tokio::time::Instant;

/// The port only names the socket file (`.s.PGSQL.<port>`); no TCP listener is opened.
const PORT: u16 = 5432;

pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_postgres: bool,
}

impl PgCluster {
    /// Starts a cluster for `test`, or returns `None` after printing a SKIPPED line when no
    /// PostgreSQL binaries are installed (panics instead under `CI=true`).
    pub fn start(test: &str) -> Option<PgCluster> {
        Self::start_with(test, &[])
    }

    /// Like [`start`](Self::start), with extra `postgresql.conf` lines.
    pub fn start_with(test: &str, conf: &[&str]) -> Option<PgCluster> {
        let Some(bin) = find_bin() else {
            let msg = "PostgreSQL binaries not found (looked at $PG_BIN and \
                       /usr/lib/postgresql/*/bin); install them with `apt-get install -y postgresql`";
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{test}: {msg} (CI=true: a missing server fails the test)");
            }
            eprintln!("\n*** SKIPPED {test}: {msg} ***\n");
            return None;
        };
        let as_postgres = effective_uid() == Some(0);
        // Short path: the socket path must fit in sockaddr_un (~107 bytes).
        let dir = tempfile::Builder::new()
            .prefix("cs-pg-")
            .tempdir_in("/tmp")
            .expect("create temp dir");
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        let cluster = PgCluster {
            dir,
            bin,
            as_postgres,
        };
        let data = cluster.data();
        cluster.pg(
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        let mut settings = format!(
            "listen_addresses = ''\n\
             unix_socket_directories = '{}'\n\
             port = {PORT}\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n\
             log_statement = 'all'\n\
             log_line_prefix = '%m [%p] '\n\
             logging_collector = off\n",
            path_str(cluster.dir.path())
        );
        for line in conf {
            settings.push_str(line);
            settings.push('\n');
        }
        let conf_path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).expect("read postgresql.conf");
        text.push_str(&settings);
        std::fs::write(&conf_path, text).expect("write postgresql.conf");
        let log = cluster.log_path();
        cluster.pg(
            "pg_ctl",
            &[
                "-D",
                path_str(&data),
                "-l",
                path_str(&log),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        Some(cluster)
    }

    /// Connect options for the cluster's `postgres` database as the `postgres` superuser.
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(self.dir.path())
            .port(PORT)
            .username("postgres")
            .database("postgres")
    }

    /// The pid of the server's postmaster (the process that accepts new connections).
    pub fn postmaster_pid(&self) -> i32 {
        let pidfile = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .expect("read postmaster.pid");
        pidfile
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid on the first line of postmaster.pid")
    }

    /// The server log so far (every statement, `log_statement = 'all'`, lines prefixed with
    /// the timestamp and `[pid]`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn pg(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args);
        run(&mut cmd);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data();
        let exe = self.bin.join("pg_ctl");
        let args = ["-D", path_str(&data), "-m", "immediate", "-w", "stop"];
        let status = if self.as_postgres {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&exe)
                .args(args)
                .output()
        } else {
            Command::new(&exe).args(args).output()
        };
        if let Ok(out) = status {
            if !out.status.success() {
                eprintln!(
                    "pg_ctl stop failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

fn find_bin() -> Option<PathBuf> {
    let has_tools = |p: &Path| p.join("initdb").is_file() && p.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN") {
        let dir = PathBuf::from(dir);
        return has_tools(&dir).then_some(dir);
    }
    let preferred = PathBuf::from("/usr/lib/postgresql/15/bin");
    if has_tools(&preferred) {
        return Some(preferred);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// The effective uid, from `/proc/self/status` (no libc needed).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

// Steps the PostgreSQL tests share.

pub const SLACK: Duration = Duration::from_millis(500);
pub const IDLE_WITHIN: Duration = Duration::from_secs(2);

pub async fn guarded(pg: &PgCluster, max: u32) -> GuardedPool<Postgres> {
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .connect_with(pg.options())
        .await
        .expect("connect pool");
    GuardedPool::new(pool).cleanup_budget(Duration::from_secs(5))
}

pub async fn observer(pg: &PgCluster) -> PgConnection {
    PgConnection::connect_with(&pg.options())
        .await
        .expect("connect observer")
}

pub async fn create_orders(db: &GuardedPool<Postgres>) {
    sqlx::query("CREATE TABLE orders (id text)")
        .execute(db.pool())
        .await
        .unwrap();
}

pub async fn count_orders(db: &GuardedPool<Postgres>) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// The state of backend `pid` (`None`: no such backend). Read with the function behind
/// `pg_stat_activity`, so that a test holding a lock on the view can still watch.
pub async fn backend_state(obs: &mut PgConnection, pid: i32) -> Option<String> {
    sqlx::query_scalar::<_, Option<String>>("SELECT state FROM pg_catalog.pg_stat_get_activity($1)")
        .bind(pid)
        .fetch_optional(&mut *obs)
        .await
        .expect("read pg_stat_activity")
        .flatten()
}

/// Polls every 10 ms until backend `pid` is no longer `active`; returns how long that took.
/// Panics if it is still active after `within`.
pub async fn wait_not_active(
    obs: &mut PgConnection,
    pid: i32,
    within: Duration,
) -> (Duration, String) {
    let start = Instant::now();
    loop {
        let state = backend_state(obs, pid).await;
        match state.as_deref() {
            Some("active") => {}
            other => {
                return (
                    start.elapsed(),
                    other.unwrap_or("gone (connection closed)").to_owned(),
                )
            }
        }
        assert!(
            start.elapsed() < within,
            "backend {pid} still active {within:?} after the call returned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls every 10 ms until backend `pid` runs the statement whose text contains `needle`.
/// Not just any statement: the guard's own short statement before it (which arms
/// `statement_timeout`) can be seen active too, on a loaded machine, and the backend is idle
/// again right after it.
pub async fn wait_active(obs: &mut PgConnection, pid: i32, needle: &str) {
    let start = Instant::now();
    loop {
        let running: Option<(Option<String>, Option<String>)> =
            sqlx::query_as("SELECT state, query FROM pg_catalog.pg_stat_get_activity($1)")
                .bind(pid)
                .fetch_optional(&mut *obs)
                .await
                .expect("read pg_stat_activity");
        if let Some((Some(state), Some(query))) = running {
            if state == "active" && query.contains(needle) {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "statement never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn pid_of(conn: &mut GuardedConnection<Postgres>) -> i32 {
    conn.fetch_one(
        ChildSpec::read_only("pid"),
        sqlx::query("SELECT pg_catalog.pg_backend_pid()"),
    )
    .await
    .expect("read pid")
    .get(0)
}

/// Resumes a stopped process when dropped (also when the test panics).
pub struct Stopped(i32);

impl Stopped {
    pub fn stop(pid: i32) -> Stopped {
        signal_process("-STOP", pid);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal_process("-CONT", self.0);
    }
}

pub fn signal_process(signal: &str, pid: i32) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}
