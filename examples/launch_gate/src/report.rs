//! The report: a table of the gates, the counts the gates leave out (known cancels, effects
//! pending reconciliation), the parameters and durations; the same as JSON, and a histogram of
//! cancel-to-quiet latencies as SVG (plotters' SVG backend, no fonts needed).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use plotters::prelude::*;
use serde_json::json;

use crate::gates::{quantile, Observations, Phase, Row};
use crate::Params;

/// Everything the report shows.
#[derive(Debug)]
pub struct Run<'a> {
    /// The parameters.
    pub params: &'a Params,
    /// The whole run's duration.
    pub took: Duration,
    /// Each phase's observations and duration.
    pub phases: [(Phase, &'a Observations, Duration); 2],
    /// The database phase 2's SQL calls ran on.
    pub database: &'static str,
    /// The gates' rows.
    pub rows: &'a [Row],
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The report as text.
pub fn text(run: &Run<'_>) -> String {
    let mut s = String::new();
    let p = run.params;
    let _ = writeln!(
        s,
        "parameters: --trees {} --requests {} --concurrency {} --seed {}",
        p.trees, p.requests, p.concurrency, p.seed
    );
    let _ = writeln!(s, "phase 2 database: {}", run.database);
    let _ = writeln!(
        s,
        "\n{:<44} {:<21} {:<14} {:<8} figure",
        "gate", "phase", "threshold", "verdict"
    );
    for r in run.rows {
        let _ = writeln!(
            s,
            "{:<44} {:<21} {:<14} {:<8} {}",
            r.gate,
            r.phase.map_or("-", Phase::name),
            r.threshold,
            r.verdict.name(),
            r.figure
        );
    }
    let _ = writeln!(s, "\nreported apart (not gated):");
    for (phase, o, took) in &run.phases {
        let _ = writeln!(
            s,
            "  {:<21} {} requests in {:.1} s; {} client cancels, {} cancelled receipts, \
             {} quarantined, {} effects pending reconciliation",
            phase.name(),
            o.requests,
            took.as_secs_f64(),
            o.client_cancels,
            o.cancelled_receipts,
            o.quarantined,
            o.pending_effects
        );
        if o.hostile > 0 {
            let _ = writeln!(
                s,
                "  {:<21} {} requests with a malformed budget: {} refused, {} admitted past the \
                 edge's rejection cap (20 % over 10 s) with the endpoint's default budget",
                "", o.hostile, o.hostile_refused, o.over_rejection_cap
            );
        }
        if let (Some(p50), Some(p99), Some(max)) = (
            quantile(&o.cancel_to_quiet, 0.5),
            quantile(&o.cancel_to_quiet, 0.99),
            quantile(&o.cancel_to_quiet, 1.0),
        ) {
            let _ = writeln!(
                s,
                "  {:<21} cancel to quiet: P50 {:.3} ms, P99 {:.3} ms, max {:.3} ms",
                "",
                ms(p50),
                ms(p99),
                ms(max)
            );
            let _ = writeln!(
                s,
                "  {:<21} the last I/O of the slowest 1 %: {}",
                "",
                tail(o)
            );
        }
        if let (Some(p50), Some(max)) = (quantile(&o.late_by, 0.5), quantile(&o.late_by, 1.0)) {
            let _ = writeln!(
                s,
                "  {:<21} missed answers late by: P50 {:.3} ms, max {:.3} ms",
                "",
                ms(p50),
                ms(max)
            );
        }
    }
    let _ = writeln!(s, "duration: {:.1} s", run.took.as_secs_f64());
    s
}

/// What the last I/O was, for the slowest 1 % of the cancels (at least one).
fn tail(o: &Observations) -> String {
    let mut by_time: Vec<(Duration, &str)> = o
        .cancel_to_quiet
        .iter()
        .copied()
        .zip(o.last_io.iter().copied())
        .collect();
    by_time.sort_unstable_by_key(|t| std::cmp::Reverse(t.0));
    let n = by_time.len().div_ceil(100);
    let mut kinds: Vec<(&str, usize)> = Vec::new();
    for (_, what) in &by_time[..n] {
        match kinds.iter_mut().find(|(k, _)| k == what) {
            Some((_, c)) => *c += 1,
            None => kinds.push((what, 1)),
        }
    }
    kinds
        .iter()
        .map(|(k, c)| format!("{c}x {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn json(run: &Run<'_>) -> serde_json::Value {
    let p = run.params;
    let rows: Vec<_> = run
        .rows
        .iter()
        .map(|r| {
            json!({
                "gate": r.gate,
                "phase": r.phase.map(Phase::name),
                "figure": r.figure,
                "value": r.value,
                "threshold": r.threshold,
                "verdict": r.verdict.name(),
            })
        })
        .collect();
    let phases: Vec<_> = run
        .phases
        .iter()
        .map(|(phase, o, took)| {
            let q = |x| quantile(&o.cancel_to_quiet, x).map(ms);
            json!({
                "phase": phase.name(),
                "seconds": took.as_secs_f64(),
                "requests": o.requests,
                "sent": o.sent,
                "admitted": o.admitted,
                "answered": o.answered,
                "missed": o.missed,
                "client_cancels": o.client_cancels,
                "cancelled_receipts": o.cancelled_receipts,
                "quarantined": o.quarantined,
                "pending_effects": o.pending_effects,
                "malformed_budget_requests": o.hostile,
                "malformed_budget_refused": o.hostile_refused,
                "over_rejection_cap": o.over_rejection_cap,
                "outlived_by_connection_waits": o.outlived,
                "cancel_to_quiet_ms": { "p50": q(0.5), "p99": q(0.99), "max": q(1.0) },
                "missed_late_by_ms": {
                    "p50": quantile(&o.late_by, 0.5).map(ms),
                    "max": quantile(&o.late_by, 1.0).map(ms),
                },
            })
        })
        .collect();
    json!({
        "parameters": {
            "trees": p.trees,
            "requests": p.requests,
            "concurrency": p.concurrency,
            "seed": p.seed,
            "exit_on": p.exit_on.map_or("all", Phase::name),
        },
        "database": run.database,
        "seconds": run.took.as_secs_f64(),
        "passed": crate::gates::passed(run.rows),
        "rows": rows,
        "phases": phases,
    })
}

/// Writes `report.json` and `cancel_to_quiet.svg` into the output folder; returns their paths.
pub fn write(run: &Run<'_>) -> Result<(PathBuf, PathBuf), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&run.params.out)?;
    let json_path = run.params.out.join("report.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&json(run))?)?;
    let svg_path = run.params.out.join("cancel_to_quiet.svg");
    let load = run
        .phases
        .iter()
        .find(|(p, _, _)| *p == Phase::Load)
        .map(|(_, o, _)| *o);
    histogram(&svg_path, load.map_or(&[][..], |o| &o.cancel_to_quiet))?;
    Ok((json_path, svg_path))
}

/// The histogram of `samples` in milliseconds: 40 bins up to the largest sample (at least
/// 1 ms), on a logarithmic count axis (most cancels leave no I/O after them: a linear axis
/// would show only the first bin).
fn histogram(
    path: &std::path::Path,
    samples: &[Duration],
) -> Result<(), Box<dyn std::error::Error>> {
    const BINS: usize = 40;
    let max = samples.iter().copied().max().map_or(1.0, ms).max(1.0);
    let width = max / BINS as f64;
    let mut counts = [0u64; BINS];
    for s in samples {
        let bin = ((ms(*s) / width) as usize).min(BINS - 1);
        counts[bin] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(0).max(1);
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "cancel to no new I/O, real clock ({} cancels; gate P99 < 100 ms)",
                samples.len()
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max, (0.5..top as f64 * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("milliseconds from the cancel to the last byte sent")
        .y_desc("requests (logarithmic)")
        .draw()?;
    chart.draw_series(
        counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| {
                let x0 = i as f64 * width;
                Rectangle::new([(x0, 0.5), (x0 + width, *c as f64)], BLUE.mix(0.6).filled())
            }),
    )?;
    root.present()?;
    Ok(())
}
