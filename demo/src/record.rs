//! What the services did, per request id: every event is a structured log line and an entry
//! that the report and the checks read, and that the run waits on.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cancel_scope::{Cause, Report};
use tokio::sync::watch;
use tokio::time::Instant;

/// A service of the chain.
///
/// # Examples
///
/// ```
/// use cancel_scope_demo::Hop;
/// assert_eq!(Hop::External.to_string(), "external-stub");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hop {
    /// The edge: the client calls it.
    Frontend,
    /// Called by frontend; calls inventory, then (only if inventory succeeded) external-stub.
    Orders,
    /// Inventory v1: a read-only quote that takes a while.
    Inventory,
    /// A stand-in for a third party.
    External,
}

impl Hop {
    /// Every hop, in call order.
    pub const ALL: [Hop; 4] = [Hop::Frontend, Hop::Orders, Hop::Inventory, Hop::External];

    /// The service's name in logs and reports.
    pub const fn name(self) -> &'static str {
        match self {
            Hop::Frontend => "frontend",
            Hop::Orders => "orders",
            Hop::Inventory => "inventory",
            Hop::External => "external-stub",
        }
    }
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One thing a service did for a request.
#[derive(Clone, Debug)]
pub(crate) enum What {
    /// The hop's server read the request (before admission: also a request it refuses).
    Received,
    /// The hop's server is done with the request: it answered `status`, or (none) the
    /// connection went away first.
    Left { status: Option<u16> },
    /// The handler started; the budget and deadline of its scope (none in per-hop mode).
    Started {
        budget: Option<Duration>,
        deadline: Option<Instant>,
    },
    /// About to call another service.
    Calling { to: Hop },
    /// A call ended: the status, or why there is none.
    CallEnded { to: Hop, outcome: String },
    /// The handler answered.
    Answered { status: u16 },
    /// The handler was dropped before it answered: its caller hung up (per-hop), or its scope
    /// stopped it, with the scope's cause (scoped).
    Dropped { cause: Option<Cause> },
    /// Inventory's quote work started.
    WorkStarted { planned: Duration },
    /// Inventory's quote work ran to its end.
    WorkFinished { worked: Duration },
    /// Inventory's quote work was stopped before its end.
    WorkStopped {
        worked: Duration,
        cause: Option<Cause>,
    },
    /// The request's scope is quiet (scoped mode): the `Admit` layer's report, and (shadow
    /// mode) the deadline the request would have had, `None` inside if admission would have
    /// refused it.
    Quiet {
        report: Report,
        would_be_deadline: Option<Option<Instant>>,
    },
}

/// An event: when, which service, which request.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub(crate) at: Instant,
    pub(crate) hop: Hop,
    pub(crate) id: Arc<str>,
    pub(crate) what: What,
}

#[derive(Debug, Default)]
struct Log {
    events: Vec<Event>,
    /// Operation id (scoped mode) -> request id, for the layers' reports.
    operations: HashMap<String, Arc<str>>,
}

/// The event log of one chain, shared by its services; waiting on it is waiting on events.
#[derive(Clone, Debug)]
pub(crate) struct Recorder {
    log: Arc<watch::Sender<Log>>,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Recorder {
            log: Arc::new(watch::Sender::new(Log::default())),
        }
    }

    /// Logs `what` and keeps it.
    pub(crate) fn record(&self, hop: Hop, id: &Arc<str>, what: What) {
        trace(hop, id, &what);
        let event = Event {
            at: Instant::now(),
            hop,
            id: id.clone(),
            what,
        };
        self.log.send_modify(|log| log.events.push(event));
    }

    /// Remembers that `operation` (an admitted request's operation id) serves request `id`.
    pub(crate) fn operation(&self, operation: &str, id: &Arc<str>) {
        self.log.send_if_modified(|log| {
            if log.operations.contains_key(operation) {
                return false;
            }
            log.operations.insert(operation.to_owned(), id.clone());
            false // nobody waits on this
        });
    }

    /// The request id that `operation` serves (the operation id itself if unknown).
    pub(crate) fn request_of(&self, operation: &str) -> Arc<str> {
        self.log
            .borrow()
            .operations
            .get(operation)
            .cloned()
            .unwrap_or_else(|| format!("operation {operation}").into())
    }

    /// The events of request `id` so far, oldest first.
    pub(crate) fn events_of(&self, id: &str) -> Vec<Event> {
        let log = self.log.borrow();
        log.events
            .iter()
            .filter(|e| &*e.id == id)
            .cloned()
            .collect()
    }

    /// Waits until `done` holds for the events so far, at most `patience`; whether it did.
    pub(crate) async fn wait_until(
        &self,
        patience: Duration,
        mut done: impl FnMut(&[Event]) -> bool,
    ) -> bool {
        let mut rx = self.log.subscribe();
        let waited = tokio::time::timeout(patience, rx.wait_for(|log| done(&log.events))).await;
        matches!(waited, Ok(Ok(_)))
    }
}

/// The structured log line of an event.
fn trace(hop: Hop, id: &str, what: &What) {
    let hop = hop.name();
    match what {
        What::Received => tracing::debug!(%hop, request_id = %id, "request received"),
        What::Left {
            status: Some(status),
        } => {
            tracing::debug!(%hop, request_id = %id, status, "response sent")
        }
        What::Left { status: None } => {
            tracing::debug!(%hop, request_id = %id, "request dropped: the connection went away")
        }
        What::Started {
            budget: Some(b), ..
        } => {
            tracing::info!(%hop, request_id = %id, budget_ms = ms(*b), "started")
        }
        What::Started { budget: None, .. } => {
            tracing::info!(%hop, request_id = %id, "started without a budget")
        }
        What::Calling { to } => tracing::info!(%hop, request_id = %id, to = %to, "calling"),
        What::CallEnded { to, outcome } => tracing::info!(
            %hop,
            request_id = %id,
            to = %to,
            outcome = %outcome,
            "call ended"
        ),
        What::Answered { status } => tracing::info!(%hop, request_id = %id, status, "answered"),
        What::Dropped { cause: Some(cause) } => tracing::warn!(
            %hop,
            request_id = %id,
            %cause,
            "handler stopped by its request scope"
        ),
        What::Dropped { cause: None } => {
            tracing::warn!(%hop, request_id = %id, "handler dropped: its caller hung up")
        }
        What::WorkStarted { planned } => {
            tracing::info!(%hop, request_id = %id, planned_ms = ms(*planned), "quote work started")
        }
        What::WorkFinished { worked } => {
            tracing::info!(%hop, request_id = %id, worked_ms = ms(*worked), "quote work finished")
        }
        What::WorkStopped { worked, cause } => {
            let cause = cause
                .as_ref()
                .map_or_else(|| "none".to_owned(), ToString::to_string);
            tracing::warn!(
                %hop,
                request_id = %id,
                worked_ms = ms(*worked),
                %cause,
                "quote work stopped"
            )
        }
        What::Quiet { report, .. } => {
            tracing::info!(%hop, request_id = %id, %report, "request scope quiet")
        }
    }
}

/// Whole milliseconds, for log fields.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
