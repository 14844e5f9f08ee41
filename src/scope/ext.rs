//! What the scope layer keeps in each tree node ([`ScopeExt`]): the deadline, the name, and
//! what a scope shares with its parent (grace period, request context, timers).

use std::time::Duration;

use tokio::time::Instant;

use super::note::Notes;
use super::{Core, EffectFlag, Timers, DEFAULT_GRACE};
use crate::spec::ChildSpec;
use crate::sync::{Arc, AtomicU8, LazyBox, Mutex};
use crate::tree;

/// Request-wide data of a root scope, inherited by its descendants (see `ScopeExt::context`).
pub(crate) type Context = std::sync::Arc<dyn RequestContext>;

/// What the scope layer reads of a request's context (the `wire` layer's operation, opaque
/// here): the request's shadow state, set at admission, so that the layers above the scope
/// (children, retries) shadow their own decisions by reading the scope, never the policy.
pub(crate) trait RequestContext: std::any::Any + Send + Sync + std::fmt::Debug {
    /// The context, to downcast to what the layer that set it put there.
    fn as_any(&self) -> &dyn std::any::Any;

    /// `Some` if the request runs in shadow mode: its would-be deadline (`None` inside:
    /// admission would have refused it). `None` when its decisions are enforced.
    fn shadow(&self) -> Option<Option<Instant>>;
}

/// A request's context with its shadow state left out: for a root that is the request's but
/// not bounded by its budget (a shielded cleanup, detached work), whose children are judged
/// against its own deadline in every mode.
#[derive(Debug)]
struct Unshadowed(Context);

impl RequestContext for Unshadowed {
    fn as_any(&self) -> &dyn std::any::Any {
        self.0.as_any()
    }

    fn shadow(&self) -> Option<Option<Instant>> {
        None
    }
}

/// `context` without its shadow state (see [`Unshadowed`]).
pub(crate) fn unshadowed(context: &Context) -> Context {
    std::sync::Arc::new(Unshadowed(context.clone()))
}

/// A shadowed request's context under a child with a would-be deadline of its own (shorter
/// than its parent's): the child and its descendants read that deadline as their shadow state,
/// so that their own would-be decisions are bounded by it, as enforced ones are by the child's
/// deadline.
#[derive(Debug)]
struct ChildShadow {
    context: Context,
    would_be: Instant,
}

impl RequestContext for ChildShadow {
    fn as_any(&self) -> &dyn std::any::Any {
        self.context.as_any()
    }

    fn shadow(&self) -> Option<Option<Instant>> {
        Some(Some(self.would_be))
    }
}

/// [`ScopeExt::timer`]: the scope has an entry in its tree's timers.
pub(super) const ARMED: u8 = 1;

/// What the scope layer keeps in each tree node. Kept small: a node is allocated (and
/// initialised) for every child scope, so what most scopes share with their parent sits behind
/// one shared pointer.
#[derive(Debug)]
pub(crate) struct ScopeExt {
    pub(crate) deadline: Option<Instant>,
    pub(crate) name: Option<std::sync::Arc<str>>,
    /// Grace period, request context and the tree's timers, shared with the parent
    /// unless this scope changed one of them; `None`: all defaults.
    pub(super) shared: Option<std::sync::Arc<Shared>>,
    /// [`ARMED`] if this scope has an entry in the timers (it tightened the deadline).
    pub(super) timer: AtomicU8,
    /// Whether the scope's name (its own, or its ticket's: see `name_of`) is also a mark (see
    /// [`Scope::has_mark`](super::Scope::has_mark)).
    pub(super) marked: bool,
    /// Whether the scope has a would-be deadline of its own (a child of a shadowed request
    /// that enforcing would have given a shorter deadline than its parent's, in front of the
    /// request's context: see [`ChildShadow`]), checked when it retires.
    pub(super) own_would_be: bool,
    /// Immutable values attached for this scope's [`Report`](crate::Report) (retry ledgers,
    /// failures) here or below, oldest first, at most [`MAX_NOTES`](super::note::MAX_NOTES);
    /// allocated by the first.
    pub(super) notes: LazyBox<Mutex<Notes>>,
    /// The scope's own tokio-util token, made on the first ask (see `token`).
    #[cfg(feature = "tokio-util")]
    pub(super) token: super::token::TokenSlot,
}

/// The part of [`ScopeExt`] that descendants inherit as it is.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) grace: Duration,
    /// Request-wide data set on a root (by `wire` admission: operation id, priority, egress
    /// defaults) and shared by every descendant. Opaque to the core.
    pub(super) context: Option<Context>,
    /// The timers of this tree (shared with every descendant, and with the other trees made
    /// on the same thread: see `timer`), if any scope of it has a deadline; a descendant that
    /// tightens its deadline in another runtime has its own (see `Timers::for_child_of`).
    pub(super) timers: Option<Arc<Timers>>,
    /// The request's "a possibly-effectful child was dispatched" flag (see `effect`), set on
    /// an admitted request's scope and shared by every descendant (and a shielded cleanup).
    pub(super) effect: Option<Arc<EffectFlag>>,
}

impl Shared {
    pub(super) const DEFAULT: Shared = Shared {
        grace: DEFAULT_GRACE,
        context: None,
        timers: None,
        effect: None,
    };
}

impl ScopeExt {
    pub(super) fn shared(&self) -> &Shared {
        self.shared.as_deref().unwrap_or(&Shared::DEFAULT)
    }

    pub(crate) fn grace(&self) -> Duration {
        self.shared().grace
    }

    pub(super) fn timers(&self) -> Option<&Arc<Timers>> {
        self.shared().timers.as_ref()
    }
}

/// A scope's name: its own, or, for a child that is its parent's ticket too (a retry
/// attempt), the name of that ticket (kept once, in the node's ticket information).
pub(super) fn name_of(node: &Core) -> Option<&str> {
    node.ext
        .name
        .as_deref()
        .or_else(|| tree::own_info(node).map(ChildSpec::name))
}

impl ScopeExt {
    /// The data of a root scope with `deadline`, `name`, request-wide `context` and the
    /// request's `effect` flag, which every descendant shares (a root with a deadline gets the
    /// timers of this thread).
    pub(super) fn root(
        deadline: Option<Instant>,
        name: Option<std::sync::Arc<str>>,
        context: Option<Context>,
        effect: Option<Arc<EffectFlag>>,
    ) -> ScopeExt {
        let shared = (deadline.is_some() || context.is_some() || effect.is_some()).then(|| {
            std::sync::Arc::new(Shared {
                context,
                timers: deadline.map(|_| Timers::for_this_thread()),
                effect,
                ..Shared::DEFAULT
            })
        });
        ScopeExt {
            deadline,
            name,
            shared,
            timer: AtomicU8::new(0),
            marked: false,
            own_would_be: false,
            notes: LazyBox::new(),
            #[cfg(feature = "tokio-util")]
            token: super::token::TokenSlot::new(),
        }
    }

    /// The data of a child that inherits everything from `parent` (no deadline of its own, no
    /// name, no mark): what `child_of(parent, parent.deadline, false, None, None, false, None)`
    /// gives, kept apart because every plain child creation runs it (calling `child_of` there
    /// measured about 15 % slower on `child_create_drop`).
    pub(crate) fn plain_child_of(parent: &ScopeExt) -> ScopeExt {
        ScopeExt {
            deadline: parent.deadline,
            name: None,
            shared: parent.shared.clone(),
            timer: AtomicU8::new(0),
            marked: false,
            own_would_be: false,
            notes: LazyBox::new(),
            #[cfg(feature = "tokio-util")]
            token: super::token::TokenSlot::new(),
        }
    }

    /// Whether a child with `deadline` tightens its parent's (and so needs a timer).
    pub(crate) fn tightens(parent: &ScopeExt, deadline: Option<Instant>) -> bool {
        match (deadline, parent.deadline) {
            (Some(d), Some(p)) => d < p,
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// The data of a child; `tightens`: [`tightens`](Self::tightens) for `deadline` (then the
    /// child needs a timer, and the tree its timers); `marked`: its name is a mark (see
    /// [`Scope::has_mark`](super::Scope::has_mark)); `would_be`: in shadow mode, the child's
    /// own would-be deadline (see [`ChildShadow`]).
    ///
    /// Returns the data alone: a node built in its allocation then gets it written in place.
    #[inline]
    pub(crate) fn child_of(
        parent: &ScopeExt,
        deadline: Option<Instant>,
        tightens: bool,
        name: Option<std::sync::Arc<str>>,
        grace: Option<Duration>,
        marked: bool,
        would_be: Option<Instant>,
    ) -> ScopeExt {
        let inherited = parent.shared();
        // Timers of its own for a child that tightens the deadline of a tree with none, or of
        // a tree made in another runtime (see `Timers::for_child_of`).
        let new_timers = tightens
            .then(|| Timers::for_child_of(inherited.timers.as_ref()))
            .flatten();
        let changed = new_timers.is_some() || grace.is_some_and(|g| g != inherited.grace);
        let own_would_be = would_be.is_some();
        let shared = if changed || own_would_be {
            let mut shared = Shared {
                grace: grace.unwrap_or(inherited.grace),
                context: inherited.context.clone(),
                timers: new_timers.or_else(|| inherited.timers.clone()),
                effect: inherited.effect.clone(),
            };
            if let Some(w) = would_be {
                shared.context = shared.context.map(|c| with_would_be(c, w));
            }
            Some(std::sync::Arc::new(shared))
        } else {
            parent.shared.clone()
        };
        ScopeExt {
            deadline,
            name,
            shared,
            timer: AtomicU8::new(0),
            marked,
            own_would_be,
            notes: LazyBox::new(),
            #[cfg(feature = "tokio-util")]
            token: super::token::TokenSlot::new(),
        }
    }
}

/// `context` under a child whose own would-be deadline is `would_be` (a [`ChildShadow`]): its
/// descendants' shadow decisions are bounded by it, and the child, when it retires, is checked
/// against it (see `shadow::child_retired`). Out of line: only the children of a shadowed
/// request come here.
#[cold]
#[inline(never)]
fn with_would_be(context: Context, would_be: Instant) -> Context {
    std::sync::Arc::new(ChildShadow { context, would_be })
}
