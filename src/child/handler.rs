//! The receipt of a request's handler: a child of the request's scope with no task of its own.

use std::sync::Arc;

use super::failure::Failure;
use crate::error::Error;
use crate::scope::Scope;
use crate::time::now_stamp;
use crate::tree::{self, Kind, TaskKey};

/// The handler of a request, counted as one child of the request's scope from its admission
/// until it answers: its unit keeps the scope from quiet (and, under a server, holds one of
/// the server's), and its receipt is in the request's report (a completed request reads "1
/// succeeded", not "0"). Registered and dispatched by one CAS, as a spawned task is; never
/// listed with a waker (the server layer polls the handler, not the tree): a quarantine takes
/// it from the unlisted count, and its late receipt is then ignored (invariant 5).
///
/// Dropped without a receipt, it records `Cancelled` (it was stopped).
pub(crate) struct HandlerTicket {
    scope: Scope,
    task: Option<TaskKey>,
}

impl Scope {
    /// Registers and dispatches the handler of the request this scope was admitted for.
    ///
    /// # Errors
    ///
    /// The scope (or, under a server, the server's) refuses new work: cancelled, or closed
    /// (a server whose shutdown began).
    pub(crate) fn handler_ticket(&self) -> Result<HandlerTicket, Error> {
        let task = tree::register_task(&self.node)?;
        Ok(HandlerTicket {
            scope: self.clone(),
            task: Some(task),
        })
    }
}

impl HandlerTicket {
    /// The handler answered.
    pub(crate) fn succeed(mut self) {
        self.finish(Kind::Succeeded);
    }

    /// The handler failed: it answered with a server error, or it panicked (`why` then goes
    /// in the report as a [`Failure`] of the `handler`).
    pub(crate) fn fail(mut self, why: Option<String>) {
        let Some(task) = self.task.take() else {
            return;
        };
        let scope = &self.scope;
        // Unless a quarantine took it first (invariant 5); the failure is noted before the
        // receipt releases the unit, so the report has it (invariant 6).
        tree::record_task_receipt_and(&scope.node, task, Kind::Failed, true, now_stamp, || {
            if let Some(why) = why {
                scope.add_note(Failure::note(scope, Arc::from("handler"), why));
            }
        });
    }

    fn finish(&mut self, kind: Kind) {
        if let Some(task) = self.task.take() {
            // Unless a quarantine took it first (invariant 5).
            tree::record_task_receipt(&self.scope.node, task, kind, true, now_stamp);
        }
    }
}

impl Drop for HandlerTicket {
    fn drop(&mut self) {
        self.finish(Kind::Cancelled);
    }
}

impl std::fmt::Debug for HandlerTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerTicket")
            .field("pending", &self.task.is_some())
            .finish()
    }
}
