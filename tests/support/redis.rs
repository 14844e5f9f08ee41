//! A throwaway `redis-server` for one test: a free loopback port, no persistence, a temporary
//! working directory, killed on drop.
//!
//! Binary: `$REDIS_SERVER`, else `redis-server` on the `PATH` (Debian's `redis-server`
//! package). Without it a test says loudly that it was skipped — unless `CI=true`, where a
//! missing server is a failure, not a skip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server for `test`, or returns `None` after printing a SKIPPED line when no
    /// `redis-server` is installed (panics instead under `CI=true`).
    pub fn start(test: &str) -> Option<RedisServer> {
        let Some(bin) = find_bin() else {
            let msg = "redis-server not found (looked at $REDIS_SERVER and the PATH); \
                       install it with `apt-get install -y redis-server`";
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{test}: {msg} (CI=true: a missing server fails the test)");
            }
            eprintln!("\n*** SKIPPED {test}: {msg} ***\n");
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("cs-redis-")
            .tempdir()
            .expect("create temp dir");
        // A port another process takes between our probe and the server's bind: try again.
        for _ in 0..10 {
            let port = free_port();
            if let Some(child) = spawn(&bin, port, dir.path()) {
                return Some(RedisServer {
                    child: Some(child),
                    port,
                    bin,
                    dir,
                });
            }
        }
        panic!("{test}: redis-server did not start on any of 10 free ports");
    }

    /// A client for the server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).expect("redis url")
    }

    /// Runs one command on a fresh connection of its own (no pool, no pub/sub).
    pub fn command(&self, cmd: &redis::Cmd) -> redis::Value {
        let mut conn = self.client().get_connection().expect("connect to redis");
        cmd.query(&mut conn).expect("redis command")
    }

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = spawn(&self.bin, self.port, self.dir.path()) {
                self.child = Some(child);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (SIGSTOP) until the returned guard is dropped (SIGCONT, also when
    /// the test panics): connections stay open and nothing answers, as on a hung host.
    pub fn freeze(&self) -> Frozen {
        let pid = self.child.as_ref().expect("server running").id();
        signal(pid, "-STOP");
        Frozen(pid)
    }
}

/// Spawns a server on `port` and waits until it answers PING; `None` if it exited first (the
/// port was taken).
fn spawn(bin: &Path, port: u16, dir: &Path) -> Option<Child> {
    let mut child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--loglevel", "warning", "--dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run redis-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if child.try_wait().expect("poll redis-server").is_some() {
            return None;
        }
        if ping(port) {
            return Some(child);
        }
        assert!(
            Instant::now() < deadline,
            "redis-server did not answer on {port}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Resumes a frozen server when dropped.
pub struct Frozen(u32);

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

fn find_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("REDIS_SERVER") {
        let bin = PathBuf::from(bin);
        return bin.is_file().then_some(bin);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}
