//! Values the layers above attach to a scope for its report (retry ledgers, failures): kept
//! in the scope and each of its ancestors, the newest [`MAX_NOTES`] of them.

use std::fmt;

use super::{Core, Scope};
use crate::tree;

/// The most notes a scope keeps: a long-lived scope drops its oldest notes rather than grow
/// (invariant 7), and counts them.
pub(crate) const MAX_NOTES: usize = 64;

/// The notes of a scope: the newest [`MAX_NOTES`], and how many older ones were dropped.
#[derive(Debug, Default)]
pub(super) struct Notes {
    kept: std::collections::VecDeque<Note>,
    dropped: u64,
}

impl Notes {
    fn push(&mut self, note: Note) {
        if self.kept.len() == MAX_NOTES {
            self.kept.pop_front();
            self.dropped = self.dropped.saturating_add(1);
        }
        self.kept.push_back(note);
    }
}

/// A value that a layer above attached to a scope for its report. Compares by identity.
///
/// A note made with [`shown`](Note::shown) also appears in the report's `Display`, as its
/// value's own `Display` says it: the layer that attaches it decides the text, and the report
/// need not know its type.
#[derive(Clone)]
pub(crate) struct Note(std::sync::Arc<dyn NoteValue>, Option<ShowFn>);

/// Writes a note's value (given as `Any`) for the report's `Display`.
type ShowFn = fn(&dyn std::any::Any, &mut fmt::Formatter<'_>) -> fmt::Result;

/// What a note can hold: any immutable `Debug` value (unwind safe, so that
/// [`Report`](crate::Report) keeps its auto traits).
pub(crate) trait NoteValue:
    std::any::Any + fmt::Debug + Send + Sync + std::panic::RefUnwindSafe
{
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: std::any::Any + fmt::Debug + Send + Sync + std::panic::RefUnwindSafe> NoteValue for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Note {
    /// A note sharing `value` (no copy: the attaching layer may keep its own handle).
    pub(crate) fn new<T: NoteValue>(value: std::sync::Arc<T>) -> Note {
        Note(value, None)
    }

    /// A note sharing `value` that the report's `Display` shows, as `value`'s `Display`.
    pub(crate) fn shown<T: NoteValue + fmt::Display>(value: std::sync::Arc<T>) -> Note {
        fn show<T: fmt::Display + 'static>(
            v: &dyn std::any::Any,
            f: &mut fmt::Formatter<'_>,
        ) -> fmt::Result {
            match v.downcast_ref::<T>() {
                Some(v) => fmt::Display::fmt(v, f),
                None => Ok(()),
            }
        }
        Note(value, Some(show::<T>))
    }

    /// The note as the report's `Display` shows it, if it is shown.
    pub(crate) fn shown_as(&self) -> Option<impl fmt::Display + '_> {
        struct Shown<'a>(&'a dyn std::any::Any, ShowFn);
        impl fmt::Display for Shown<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                (self.1)(self.0, f)
            }
        }
        self.1.map(|show| Shown((*self.0).as_any(), show))
    }

    /// The value, if it is a `T`.
    pub(crate) fn get<T: std::any::Any>(&self) -> Option<&T> {
        // Deref first: `Arc<dyn NoteValue>` is itself a `NoteValue` (blanket impl), and its
        // `as_any` would name the `Arc`, not the value.
        (*self.0).as_any().downcast_ref()
    }
}

impl PartialEq for Note {
    fn eq(&self, other: &Note) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Note {}

impl fmt::Debug for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Scope {
    /// Attaches `note` for the report of this scope and of each of its ancestors, as receipts
    /// are counted in each (a request's report has the notes of the work below it); in each,
    /// the oldest note goes, counted, once it has [`MAX_NOTES`]. The caller holds a unit of
    /// this scope (the work the note is about has no receipt yet), so that no scope on the
    /// way is quiet yet: its report, made once it is, has the note (invariant 6).
    pub(crate) fn add_note(&self, note: Note) {
        add_note_at(&self.node, note);
    }

    /// The notes attached so far, oldest first, and how many older ones were dropped.
    pub(crate) fn notes(&self) -> (Vec<Note>, u64) {
        self.node.ext.notes.get().map_or_else(
            || (Vec::new(), 0),
            |n| {
                let n = n.lock();
                (n.kept.iter().cloned().collect(), n.dropped)
            },
        )
    }
}

/// [`Scope::add_note`] on `node` (held by the caller, a unit of it too, or not closed yet).
pub(super) fn add_note_at(node: &Core, note: Note) {
    // A request's scope under a server's is the root of its report (see `request`).
    for node in tree::report_ancestors(node) {
        node.ext.notes.get_or_init().lock().push(note.clone());
    }
}
