//! The `metrics` handles of the crate, cached per thread and per recorder.
//!
//! `metrics` 0.24 binds a handle to the recorder that registered it: a handle made before a
//! recorder was installed (or under another thread-local one) records into the old one. So
//! each thread keeps its handles with the address of the recorder they came from and makes
//! them anew when the current recorder is another one; within one recorder every label set
//! is registered once, the first time it is used, and after that recording is a lookup in a
//! small table (the dependency names of calls: a short list compared by value).

use std::cell::RefCell;
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Metadata, Recorder};

use super::{Attempt, CancelCause, Refused, Rejected, Source};

/// What the crate's metrics say of where they come from.
static METADATA: Metadata<'static> =
    Metadata::new("cancel_scope", metrics::Level::INFO, Some(module_path!()));

/// The handles of one dependency's calls.
struct CallHandles {
    dependency: &'static str,
    budget: Option<Histogram>,
    refused: [Option<Counter>; 4],
}

/// The handles registered on one thread under one recorder.
#[derive(Default)]
struct Handles {
    /// The address of the recorder that made them.
    recorder: usize,
    budget: [[Option<Histogram>; 2]; 4],
    queue_wait: Option<Histogram>,
    rejected: [Option<Counter>; 5],
    cancelled: [Option<Counter>; 4],
    cancel_to_quiet: Option<Histogram>,
    orphan_work: Option<Histogram>,
    receipts: [Option<Counter>; 5],
    attempts: [Option<Counter>; 5],
    budget_exhausted: Option<Counter>,
    calls: Vec<CallHandles>,
}

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::new(Handles::default());
}

/// Runs `f` with this thread's handles for the current recorder (and the recorder, to
/// register what is missing).
fn with(f: impl FnOnce(&mut Handles, &dyn Recorder)) {
    metrics::with_recorder(|recorder| {
        // The data pointer: the same recorder has the same one, whatever its vtable.
        let address = std::ptr::from_ref(recorder).cast::<()>() as usize;
        // Not during the thread's exit (a request's report made by a task dropped then), and
        // not from a recorder's own code recording into ours: then nothing is recorded.
        let _ = HANDLES.try_with(|handles| {
            let Ok(mut handles) = handles.try_borrow_mut() else {
                return;
            };
            if handles.recorder != address {
                *handles = Handles {
                    recorder: address,
                    ..Handles::default()
                };
            }
            f(&mut handles, recorder);
        });
    });
}

fn counter<'a>(
    slot: &'a mut Option<Counter>,
    recorder: &dyn Recorder,
    key: impl FnOnce() -> Key,
) -> &'a Counter {
    slot.get_or_insert_with(|| recorder.register_counter(&key(), &METADATA))
}

fn histogram<'a>(
    slot: &'a mut Option<Histogram>,
    recorder: &dyn Recorder,
    key: impl FnOnce() -> Key,
) -> &'a Histogram {
    slot.get_or_insert_with(|| recorder.register_histogram(&key(), &METADATA))
}

fn labelled(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|&(k, v)| Label::from_static_parts(k, v))
        .collect();
    Key::from_parts(name, labels)
}

fn plain(name: &'static str) -> Key {
    Key::from_static_name(name)
}

fn index<T: PartialEq + Copy, const N: usize>(all: &[T; N], value: T) -> usize {
    all.iter().position(|&v| v == value).unwrap_or(0)
}

pub(super) fn admitted(source: Source, clamped: bool, granted: Duration, queued: Duration) {
    with(|h, r| {
        let slot = &mut h.budget[index(&Source::ALL, source)][usize::from(clamped)];
        histogram(slot, r, || {
            labelled(
                super::ADMISSION_BUDGET,
                &[
                    ("source", source.label()),
                    ("clamped", if clamped { "true" } else { "false" }),
                ],
            )
        })
        .record(granted.as_secs_f64());
        histogram(&mut h.queue_wait, r, || plain(super::ADMISSION_QUEUE_WAIT))
            .record(queued.as_secs_f64());
    });
}

pub(super) fn rejected(reason: Rejected) {
    with(|h, r| {
        let slot = &mut h.rejected[index(&Rejected::ALL, reason)];
        counter(slot, r, || {
            labelled(super::ADMISSION_REJECTED, &[("reason", reason.label())])
        })
        .increment(1);
    });
}

/// The handles of `dependency`'s calls, made on first use.
fn call_handles<'h>(h: &'h mut Handles, dependency: &'static str) -> &'h mut CallHandles {
    let at = match h.calls.iter().position(|c| c.dependency == dependency) {
        Some(at) => at,
        None => {
            h.calls.push(CallHandles {
                dependency,
                budget: None,
                refused: Default::default(),
            });
            h.calls.len() - 1
        }
    };
    &mut h.calls[at]
}

pub(super) fn call_budget(dependency: &'static str, budget: Duration) {
    with(|h, r| {
        let c = call_handles(h, dependency);
        histogram(&mut c.budget, r, || {
            labelled(super::CALL_BUDGET, &[("dependency", dependency)])
        })
        .record(budget.as_secs_f64());
    });
}

pub(super) fn call_refused(dependency: &'static str, reason: Refused) {
    with(|h, r| {
        let c = call_handles(h, dependency);
        let slot = &mut c.refused[index(&Refused::ALL, reason)];
        counter(slot, r, || {
            labelled(
                super::CALL_REFUSED,
                &[("dependency", dependency), ("reason", reason.label())],
            )
        })
        .increment(1);
    });
}

pub(super) fn cancelled(cause: CancelCause) {
    with(|h, r| {
        let slot = &mut h.cancelled[index(&CancelCause::ALL, cause)];
        counter(slot, r, || {
            labelled(super::SCOPE_CANCELLED, &[("cause", cause.label())])
        })
        .increment(1);
    });
}

pub(super) fn report(receipts: [u64; 5], cancel_to_quiet: Option<Duration>, orphan: Duration) {
    with(|h, r| {
        for (i, n) in receipts.into_iter().enumerate() {
            if n > 0 {
                let kind = super::RECEIPT_KINDS[i];
                counter(&mut h.receipts[i], r, || {
                    labelled(super::RECEIPTS, &[("kind", kind)])
                })
                .increment(n);
            }
        }
        if let Some(d) = cancel_to_quiet {
            histogram(&mut h.cancel_to_quiet, r, || {
                plain(super::SCOPE_CANCEL_TO_QUIET)
            })
            .record(d.as_secs_f64());
        }
        histogram(&mut h.orphan_work, r, || plain(super::SCOPE_ORPHAN_WORK))
            .record(orphan.as_secs_f64());
    });
}

pub(super) fn attempt(outcome: Attempt) {
    with(|h, r| {
        let slot = &mut h.attempts[index(&Attempt::ALL, outcome)];
        counter(slot, r, || {
            labelled(super::RETRY_ATTEMPTS, &[("outcome", outcome.label())])
        })
        .increment(1);
    });
}

pub(super) fn retry_budget_exhausted() {
    with(|h, r| {
        counter(&mut h.budget_exhausted, r, || {
            plain(super::RETRY_BUDGET_EXHAUSTED)
        })
        .increment(1);
    });
}

/// A decision that shadow mode did not enforce, counted under `name` (cold: registered at
/// each use, no cached handle).
pub(super) fn shadow(name: &'static str, labels: &[(&'static str, &'static str)]) {
    metrics::with_recorder(|r| {
        r.register_counter(&labelled(name, labels), &METADATA)
            .increment(1)
    });
}
