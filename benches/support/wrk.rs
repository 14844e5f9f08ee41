//! Load from `wrk` against a server process of the bench's own, for the benches that measure
//! a real server (`telemetry_load`, `request_path`): each side runs as this binary with
//! `--serve <side>` on core 0 (one runtime worker), `wrk` on core 1, where `taskset` is there.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// What one round of one side measured.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Requests per second.
    pub rps: f64,
    /// p99 latency, µs.
    pub p99: f64,
}

/// The value of `--name N` in `args`, or `default`.
pub fn option(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether there is anything to measure: not under `cargo test --benches` or `--list`, and
/// `wrk` installed (`bench` names the bench in the message otherwise).
pub fn can_measure(args: &[String], bench: &str) -> bool {
    if args.iter().any(|a| a == "--test" || a == "--list") {
        return false;
    }
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("{bench}: `wrk` is not installed (apt-get install -y wrk); nothing measured");
        return false;
    }
    true
}

/// One round of the side `side`: starts this binary with `--serve <side>` (it prints its
/// address on its first line), loads it with `wrk -t1 -c<connections> -d<seconds>s`, stops it.
pub fn measure(side: &str, seconds: u64, connections: u64) -> Measured {
    let exe = std::env::current_exe().expect("the bench's own path");
    let mut server = pinned("0", &exe)
        .args(["--serve", side])
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
    if text.contains("Non-2xx") {
        panic!("the side {side} answered errors:\n{text}");
    }
    Measured { rps, p99 }
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

/// Runs `rounds` rounds of every side in `sides`, the order rotating round by round so that
/// no side always runs first on a warmer machine; prints each measurement. Returns each
/// side's measurements, in the order of `sides`.
pub fn rounds(sides: &[&str], rounds: u64, seconds: u64, connections: u64) -> Vec<Vec<Measured>> {
    let mut all = vec![Vec::new(); sides.len()];
    for round in 0..rounds {
        for k in 0..sides.len() {
            let i = (k + round as usize) % sides.len();
            let m = measure(sides[i], seconds, connections);
            println!(
                "round {round} {:<12} {:>10.0} requests/s  p99 {:>8.1} µs",
                sides[i], m.rps, m.p99
            );
            all[i].push(m);
        }
    }
    all
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Prints the median figures of a side.
pub fn print_side(name: &str, ms: &[Measured]) {
    println!(
        "median {name:<12} {:>10.0} requests/s  p99 {:>8.1} µs",
        median(ms.iter().map(|m| m.rps).collect()),
        median(ms.iter().map(|m| m.p99).collect())
    );
}

/// Prints the ratio of `side` to `anchor`: the median over the rounds of each round's ratio
/// (its two measurements ran minutes apart at most, on the same machine state), with the range.
pub fn print_ratio(side: (&str, &[Measured]), anchor: (&str, &[Measured])) {
    let per_round = |k: fn(&Measured) -> f64| -> Vec<f64> {
        let mut r: Vec<f64> = side
            .1
            .iter()
            .zip(anchor.1)
            .map(|(a, b)| k(a) / k(b))
            .collect();
        r.sort_by(f64::total_cmp);
        r
    };
    let (rps, p99) = (per_round(|m| m.rps), per_round(|m| m.p99));
    println!(
        "RATIO {} / {}, median of {} rounds: requests/s {:.3}x ({:.3}x-{:.3}x), p99 {:.3}x \
         ({:.3}x-{:.3}x)",
        side.0,
        anchor.0,
        rps.len(),
        rps[rps.len() / 2],
        rps[0],
        rps[rps.len() - 1],
        p99[p99.len() / 2],
        p99[0],
        p99[p99.len() - 1]
    );
}
