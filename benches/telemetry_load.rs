//! The cost of telemetry under real load: an axum server with `AdmitLayer` answering a small
//! handler, driven by `wrk` on loopback, with telemetry off (the same build, nothing
//! installed) and on (a Prometheus recorder and a `tracing` subscriber at INFO), alternating
//! the sides round by round. Each side is a process of its own (this binary with
//! `--serve off|on`), since the metrics recorder is process-wide; the server runs one runtime
//! worker pinned to core 0 and `wrk` runs on core 1 where `taskset` is there.
//!
//! ```sh
//! apt-get install -y wrk
//! cargo bench --bench telemetry_load --features __test-servers,tracing,metrics
//! ```
//!
//! Options after `--`: `--rounds N` (default 10), `--seconds N` (default 3), `--connections N`
//! (default 32). Prints requests per second and p99 latency per side and round, the ratio
//! (on / off) of each round's two sides, which ran back to back and so on the same machine
//! state, and the median of those ratios with their range. The median of the rounds' ratios
//! is the figure: a machine whose speed drifts over the run moves both sides of a round alike,
//! where it moves the medians of the sides apart.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use cancel_scope::integrations::tower::AdmitLayer;
use cancel_scope::wire::EndpointPolicy;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(args.get(i + 1).map(String::as_str) == Some("on"));
        return;
    }
    // `cargo test --benches` and `cargo bench` without a load generator: nothing to measure.
    if args.iter().any(|a| a == "--test" || a == "--list") {
        return;
    }
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!(
            "telemetry_load: `wrk` is not installed (apt-get install -y wrk); nothing measured"
        );
        return;
    }
    let (rounds, seconds, connections) = (
        value("--rounds", 10).max(1),
        value("--seconds", 3),
        value("--connections", 32),
    );
    let mut off = Vec::new();
    let mut on = Vec::new();
    for round in 0..rounds {
        // Alternate which side goes first, so that neither always runs on a warmer machine.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for telemetry in order {
            let m = measure(telemetry, seconds, connections);
            println!(
                "round {round} telemetry {:<3} {:>10.0} requests/s  p99 {:>8.1} µs",
                if telemetry { "on" } else { "off" },
                m.0,
                m.1
            );
            if telemetry { &mut on } else { &mut off }.push(m);
        }
    }
    // Each round's ratio, of its two sides' figures.
    let ratios = |k: fn(&(f64, f64)) -> f64| -> Vec<f64> {
        let mut r: Vec<f64> = on.iter().zip(&off).map(|(a, b)| k(a) / k(b)).collect();
        r.sort_by(f64::total_cmp);
        r
    };
    let median = |xs: &[f64]| xs[xs.len() / 2];
    let sides = |v: &[(f64, f64)], k: fn(&(f64, f64)) -> f64| -> f64 {
        let mut xs: Vec<f64> = v.iter().map(k).collect();
        xs.sort_by(f64::total_cmp);
        median(&xs)
    };
    println!(
        "median of the sides: off {:.0} requests/s, p99 {:.1} µs; on {:.0} requests/s, \
         p99 {:.1} µs",
        sides(&off, |m| m.0),
        sides(&off, |m| m.1),
        sides(&on, |m| m.0),
        sides(&on, |m| m.1)
    );
    let (rps, p99) = (ratios(|m| m.0), ratios(|m| m.1));
    println!(
        "ratio (on / off), median of {} rounds: requests/s {:.3}x ({:.3}x-{:.3}x), \
         p99 {:.3}x ({:.3}x-{:.3}x)",
        rps.len(),
        median(&rps),
        rps[0],
        rps[rps.len() - 1],
        median(&p99),
        p99[0],
        p99[p99.len() - 1]
    );
}

/// One side's round: starts the server process, loads it with `wrk`, returns (requests per
/// second, p99 latency in µs).
fn measure(telemetry: bool, seconds: u64, connections: u64) -> (f64, f64) {
    let exe = std::env::current_exe().expect("the bench's own path");
    let mut server = pinned("0", &exe)
        .args(["--serve", if telemetry { "on" } else { "off" }])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server process");
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("its stdout"))
        .read_line(&mut line)
        .expect("the server's address");
    let url = format!("http://{}/", line.trim());
    let out = pinned("1", std::path::Path::new("wrk"))
        .args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s")])
        .args(["--latency", &url])
        .output()
        .expect("run wrk");
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in wrk's output:\n{text}"));
    let p99 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("99%"))
        .map(|v| micros(v.trim()))
        .unwrap_or_else(|| panic!("no 99% latency in wrk's output:\n{text}"));
    (rps, p99)
}

/// `program` pinned to `core` with `taskset` where it is installed.
fn pinned(core: &str, program: &std::path::Path) -> Command {
    if Command::new("taskset").arg("-V").output().is_ok() {
        let mut c = Command::new("taskset");
        c.args(["-c", core]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// A `wrk` latency (`412.00us`, `1.20ms`, `2.00s`) in microseconds.
fn micros(v: &str) -> f64 {
    let split = v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n,
        "ms" => n * 1e3,
        "s" => n * 1e6,
        _ => f64::NAN,
    }
}

/// The server side: `AdmitLayer` around a hello handler on one runtime worker; with
/// `telemetry`, a Prometheus recorder and a subscriber at INFO (to a sink) installed first.
/// Prints its address on the first line of stdout, then serves until killed.
fn serve(telemetry: bool) {
    if telemetry {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.01, 0.1, 1.0, 10.0])
            .expect("buckets")
            .build_recorder();
        metrics::set_global_recorder(recorder).expect("the only recorder");
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let ms = Duration::from_millis;
        let app = Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(AdmitLayer::new(EndpointPolicy::new(ms(2_000), ms(1_000))));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        axum::serve(listener, app).await.unwrap();
    });
}
