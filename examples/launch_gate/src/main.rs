//! The launch gate: random call trees on virtual time, then real load on loopback servers,
//! then one verdict per gate (the figure, the threshold, pass or fail), a JSON copy of the
//! report and an SVG histogram of cancel-to-quiet latencies. The exit status is non-zero when
//! a gate fails.
//!
//! ```sh
//! cargo run --release --example launch_gate -- \
//!     --trees 1000000 --requests 20000 --concurrency 32
//! ```
//!
//! Options: `--trees N` (phase 1, default 100000), `--requests N` and `--concurrency N`
//! (phase 2, defaults 5000 and 32), `--seed S` (default: from the clock; printed either way),
//! `--out DIR` (where the JSON and the SVG go, default `target/launch_gate`), `--exit-on
//! trees` (only phase 1's rows decide the exit status; the load's rows are still printed: CI
//! runs it so, on a shared machine whose real clock the load gates are not about).

mod gates;
mod grpc;
mod hop;
mod iolog;
mod load;
mod report;
mod trees;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::gates::{Phase, Rollout};
use crate::load::LoadConfig;
use crate::trees::{Sabotage, TreeConfig};

/// The run's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// Phase 1's trees.
    pub trees: u64,
    /// Phase 2's client requests.
    pub requests: u64,
    /// Phase 2's concurrent clients.
    pub concurrency: u64,
    /// The seed of both phases.
    pub seed: u64,
    /// Where the JSON and the SVG go.
    pub out: PathBuf,
    /// Whose rows decide the exit status: every phase's, or only the trees' (`--exit-on
    /// trees`: a CI machine's real clock is not the one the load gates are about).
    pub exit_on: Option<Phase>,
}

fn usage() -> ! {
    eprintln!(
        "usage: launch_gate [--trees N] [--requests N] [--concurrency N] [--seed S] [--out DIR] \
         [--exit-on all|trees]"
    );
    std::process::exit(2)
}

fn parse() -> Params {
    let mut p = Params {
        trees: 100_000,
        requests: 5_000,
        concurrency: 32,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        out: PathBuf::from("target/launch_gate"),
        exit_on: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let Some(value) = args.next() else { usage() };
        let number = || {
            value
                .replace('_', "")
                .parse::<u64>()
                .unwrap_or_else(|_| usage())
        };
        match flag.as_str() {
            "--trees" => p.trees = number(),
            "--requests" => p.requests = number(),
            "--concurrency" => p.concurrency = number().max(1),
            "--seed" => p.seed = number(),
            "--out" => p.out = PathBuf::from(value),
            "--exit-on" => {
                p.exit_on = match value.as_str() {
                    "all" => None,
                    "trees" => Some(Phase::Trees),
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    p
}

/// A progress bar of `len` steps, drawn only when stdout is a terminal.
pub fn progress(len: u64, what: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if std::io::stdout().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg:>10} {wide_bar} {pos}/{len} {elapsed}/{duration}")
                .expect("a valid template"),
        );
        bar.set_message(what);
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

fn main() -> ExitCode {
    let params = parse();
    println!("launch gate, seed {}", params.seed);
    let started = Instant::now();

    let bar = progress(params.trees, "trees");
    let tree_cfg = TreeConfig {
        trees: params.trees,
        seed: params.seed,
        sabotage: Sabotage::None,
    };
    let t = Instant::now();
    let trees = trees::run_trees(&tree_cfg, &|n| bar.set_position(n));
    bar.finish_and_clear();
    let trees_took = t.elapsed();

    let bar = progress(params.requests, "requests");
    let load_cfg = LoadConfig {
        requests: params.requests,
        concurrency: params.concurrency,
        seed: params.seed,
        sabotage: Sabotage::None,
    };
    let t = Instant::now();
    let load = load::run_load(&load_cfg, &|n| bar.set_position(n));
    bar.finish_and_clear();
    let load_took = t.elapsed();

    let mut rows = gates::phase_rows(Phase::Trees, &trees);
    rows.extend(gates::phase_rows(Phase::Load, &load.observations));
    // Every endpoint policy of both phases enforces (`Mode::Enforce`, the default): no request
    // of this run is shadowed. Phase 2's edge has a rejection cap, which lets some of the
    // malformed budgets through.
    rows.extend(gates::rollout_rows(Rollout {
        shadow: Some(0),
        over_rejection_cap: Some(load.observations.over_rejection_cap),
    }));
    let run = report::Run {
        params: &params,
        took: started.elapsed(),
        phases: [
            (Phase::Trees, &trees, trees_took),
            (Phase::Load, &load.observations, load_took),
        ],
        database: load.database,
        rows: &rows,
    };
    print!("{}", report::text(&run));
    match report::write(&run) {
        Ok((json, svg)) => println!("\nJSON: {}\nhistogram: {}", json.display(), svg.display()),
        Err(e) => {
            eprintln!("could not write the report files: {e}");
            return ExitCode::FAILURE;
        }
    }
    let passed = gates::passed(&rows);
    println!(
        "\nverdict: {} ({:.1} s)",
        if passed { "PASS" } else { "FAIL" },
        started.elapsed().as_secs_f64()
    );
    let passed = match params.exit_on {
        None => passed,
        Some(phase) => {
            println!("exit status from the rows of {} only", phase.name());
            gates::passed_in(&rows, phase)
        }
    };
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
