//! The sides of one benchmark group measured in the same iterations, so that their ratio does
//! not depend on the state the machine was in while each side ran.
//!
//! On the 2-core VMs these benches run on, a whole criterion measurement of one side can land
//! in a fast or a slow mode (seen in the 10,000-task groups: 7-10 ms or 13-18 ms per round on
//! both sides), and the ratio of two sides measured one after the other then swings by up to
//! 2x between runs. Here every sample of every side runs all the sides in turn, `chunk`
//! iterations each, the order rotating from one round to the next (across samples too); the
//! sample's time is its own side's, and each sample also gives the
//! ratio of every side to the anchor *in that sample*. The group ends with one line per side:
//! the median of those ratios and their middle half.
//!
//! Criterion's own figure for each side is unchanged in meaning (time per iteration of that
//! side) and the group takes no longer: criterion fills its measurement time with fewer
//! iterations of each side.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::BenchmarkGroup;

/// Runs `n` iterations of one side and returns how long they took.
pub type Side<'a> = Box<dyn FnMut(u64) -> Duration + 'a>;

/// The sides of a group, measured together. The first side is the anchor.
pub struct Paired<'a> {
    group: String,
    chunk: u64,
    sides: Vec<(&'static str, RefCell<Side<'a>>)>,
    /// Per side, the ratio to the anchor in each sample.
    ratios: RefCell<Vec<Vec<f64>>>,
    /// Rounds run so far: which side goes first in the next one.
    round: Cell<usize>,
}

impl<'a> Paired<'a> {
    /// A group whose sides alternate every `chunk` iterations.
    pub fn new(group: &str, chunk: u64) -> Self {
        Paired {
            group: group.to_owned(),
            chunk: chunk.max(1),
            sides: Vec::new(),
            ratios: RefCell::new(Vec::new()),
            round: Cell::new(0),
        }
    }

    /// Adds a side; the first one added is the anchor the ratios are taken against.
    pub fn side(mut self, name: &'static str, run: impl FnMut(u64) -> Duration + 'a) -> Self {
        self.sides.push((name, RefCell::new(Box::new(run))));
        self.ratios.borrow_mut().push(Vec::new());
        self
    }

    /// One sample of side `timed`: `iters` iterations of every side, interleaved.
    fn sample(&self, timed: usize, iters: u64) -> Duration {
        let n = self.sides.len();
        let mut totals = vec![Duration::ZERO; n];
        let mut done = 0;
        while done < iters {
            let k = self.chunk.min(iters - done);
            let round = self.round.get();
            for j in 0..n {
                let s = (j + round) % n;
                totals[s] += (self.sides[s].1.borrow_mut())(k);
            }
            done += k;
            self.round.set(round + 1);
        }
        let anchor = totals[0].as_secs_f64();
        if anchor > 0.0 {
            let mut ratios = self.ratios.borrow_mut();
            for (s, t) in totals.iter().enumerate().skip(1) {
                ratios[s].push(t.as_secs_f64() / anchor);
            }
        }
        totals[timed]
    }

    /// Registers every side with criterion (in order), runs the group and prints the ratios.
    pub fn run(self, mut g: BenchmarkGroup<'_, WallTime>) {
        for (i, (name, _)) in self.sides.iter().enumerate() {
            g.bench_function(*name, |b| b.iter_custom(|iters| self.sample(i, iters)));
        }
        g.finish();
        self.report();
    }

    fn report(&self) {
        let anchor = self.sides[0].0;
        let ratios = self.ratios.borrow();
        for (s, (name, _)) in self.sides.iter().enumerate().skip(1) {
            let mut r = ratios[s].clone();
            if r.is_empty() {
                continue;
            }
            r.sort_by(f64::total_cmp);
            let at = |q: f64| r[((r.len() - 1) as f64 * q).round() as usize];
            println!(
                "RATIO {}/{name}: {:.2}x {anchor} (median of {} interleaved samples; middle half {:.2}x-{:.2}x)",
                self.group,
                at(0.5),
                r.len(),
                at(0.25),
                at(0.75),
            );
        }
    }
}
