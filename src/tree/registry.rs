//! The children registry: linking a child into a shard of its parent, public handles, and
//! retiring finished nodes (invariants 7, 8).

use slab::Slab;

use super::receipts::roll_up;
use super::units::{release_unit, take_unit};
use super::{
    refusal, shard_for_this_thread, Node, Refused, RollUp, State, GEN_SHIFT, SHARDS, STARTED,
};
use crate::sync::{arc_in_place, Arc, Mutex, Ordering};

/// One shard of a node's children registry, allocated by its first child. Padded so that the
/// hot start (lock, slab header, link) of two shards never shares a cache line, without an
/// over-aligned allocation.
pub(super) struct Shard<X, R> {
    pub(super) data: Mutex<ShardData<X, R>>,
    _pad: [u8; 64],
}

pub(super) struct ShardData<X, R> {
    pub(super) children: Slab<Arc<Node<X, R>>>,
    /// The link that children of this shard hold to reach the parent, made by the first of them
    /// and kept while the parent has handles (invariant 8).
    pub(super) link: Option<Arc<Link<X, R>>>,
}

impl<X, R> Default for Shard<X, R> {
    fn default() -> Self {
        Shard {
            data: Mutex::new(ShardData {
                children: Slab::new(),
                link: None,
            }),
            _pad: [0; 64],
        }
    }
}

/// How a child reaches its parent: one per (parent, registry shard), shared by the children
/// linked in that shard, so that creating one does not write the parent (invariant 8).
pub(super) struct Link<X, R> {
    pub(super) parent: Arc<Node<X, R>>,
    pub(super) shard: usize,
}

/// `Node::retire`: the node has a public handle (or is being dropped by its last one).
pub(super) const LIVE: u8 = 0;
/// The last handle is gone but children are still linked: the last of them to unlink retires
/// the node.
const ORPHANED: u8 = 1;
/// Unlinked from its parent by a child's unlink (invariant 7).
const RETIRED: u8 = 2;
/// The bits of `Node::retire` that hold `LIVE`, `ORPHANED` or `RETIRED`.
const STATE_BITS: u8 = 3;
/// Flag in `Node::retire`: a registry shard exists (set by the first child of each shard).
const HAS_SHARDS: u8 = 4;

/// Creates a child of `parent` and links it into the parent's registry.
///
/// Fails if the parent's watermark is closed: no live child ever sits under a cancelled or
/// closed parent. The check happens under the registry shard lock that `cancel` also takes
/// after setting `CANCELLED`, so either the child is linked before the cancel walks that shard
/// (and gets cancelled by it) or the creation sees the bit (invariant 1, 3).
pub(crate) fn new_child<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    link_child(parent, None, None, ext)
}

/// Creates a boundary child of `parent` (see the module docs: a request's scope under a
/// server's), linked as [`new_child`] links any child.
pub(crate) fn new_boundary_child<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    link_child(parent, None, Some(roll_up::<X, R>), ext)
}

/// Creates a child of `parent` that is also a registered and dispatched child (a ticket) of
/// `parent`, described by `info`: one node instead of a node and a ticket (a retry attempt).
///
/// The ticket is the child's first work unit, which, as every first unit of a node, holds a
/// unit of `parent`: the child is born with it (`STARTED`, one unit), so it is not quiet, and
/// a cancel of `parent` reaches it, until the ticket has its receipt — its work (the attempt
/// itself) is part of it, as the body of a Trio cancel scope is.
///
/// The unit of `parent` is taken by the CAS that requires an open watermark in the generation the
/// state word has, which is the dispatch CAS's condition (invariant 2, as for
/// [`register_task`](super::register_task)). The child is then linked only if the watermark is
/// still open under the registry shard lock (otherwise the unit is given back and the creation
/// refused): a quarantine, which walks the registry under the same locks after the watermark
/// closed, either finds the child linked, or took the lock first, and then the creation sees the
/// close and is refused. Its receipt is [`record_own_receipt`](super::record_own_receipt)'s or a
/// quarantine's, decided by one CAS of `Node::own` (invariant 5); it is counted in `parent` and its
/// ancestors (the ticket is `parent`'s child), and releases the child's unit, and so `parent`'s
/// once the child has no other.
///
/// The owner keeps a handle of the child until the receipt: a node with handles stays linked,
/// so that the parent's quarantine finds it (invariant 7).
pub(crate) fn new_child_dispatched<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    info: &R,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    link_child(parent, Some(info), None, ext)
}

// Always inlined: `own` is then a constant at each call site, and a plain child is built
// exactly as before (the node's parts written straight into its allocation).
#[inline(always)]
fn link_child<X, R: Clone>(
    parent: &Arc<Node<X, R>>,
    // Cloned into the node as it is built in its allocation (not moved in: a moved value
    // would make the node be assembled on the stack and copied).
    own: Option<&R>,
    boundary: Option<RollUp<X, R>>,
    ext: impl FnOnce(State) -> X,
) -> Result<Arc<Node<X, R>>, Refused> {
    if own.is_some() {
        // The ticket's unit, dispatched by its CAS (see `new_child_dispatched`). Taken before
        // the registry lock (a failed CAS may give back a unit of an ancestor and wake its
        // waiters, which happens under no lock).
        take_unit(parent)?;
    }
    let shard = shard_for_this_thread();
    let mut data = parent.registry[shard].get_or_init().data.lock();
    // The caller holds a handle of `parent`, so the parent has not dropped its links: no link
    // means the first child of this shard.
    let link = match &data.link {
        Some(link) => link.clone(),
        None => {
            // Announce the shard under `inner` before reading the state word: a cancel or
            // close that marks the parent under `inner` after this sees the shard and walks
            // it; one before it is seen by the state read below. (Without the lock,
            // "announce, load state" against "write state, load announcements" is the
            // store-buffering pattern, which acquire/release alone allows to miss both ways.)
            // Lock order: this node's shard, then its own `inner`; nothing takes them the
            // other way round.
            parent.inner.lock().shards_in_use |= 1 << shard;
            // Relaxed: read by the drop of the parent's last handle, which synchronizes with
            // this thread through the handle count.
            parent.retire.fetch_or(HAS_SHARDS, Ordering::Relaxed);
            let link = Arc::new(Link {
                parent: parent.clone(),
                shard,
            });
            data.link = Some(link.clone());
            link
        }
    };
    let state = parent.state();
    if state.is_closed() {
        drop(data);
        if own.is_some() {
            // Taken, but nothing was linked: nothing can have started.
            release_unit(parent);
        }
        return Err(refusal(parent, state));
    }
    let entry = data.children.vacant_entry();
    // A child starts at its parent's generation (so a ticket that recorded the parent's
    // generation compares equal), with its own flags clear.
    let key = entry.key();
    // A child that is a ticket is born with that ticket's unit (see `new_child_dispatched`).
    let units = if own.is_some() { 1 | STARTED } else { 0 };
    let child = arc_in_place(|| {
        Node::new(
            Some(link),
            key,
            state.generation() << GEN_SHIFT | units,
            ext(state),
            own.cloned(),
            boundary,
        )
    });
    entry.insert(child.clone());
    Ok(child)
}

/// Another public handle to `node`.
pub(crate) fn add_handle<X, R>(node: &Node<X, R>) {
    // Relaxed: a new handle can only be made from an existing one, which keeps the count > 0.
    node.handles.fetch_add(1, Ordering::Relaxed);
}

/// Drops a public handle. When the last one goes, the node retires (`gone` is called with it
/// and it is unlinked from its parent) if it has no linked child; otherwise it is marked
/// orphaned and the last child to unlink retires it (invariant 7). A retiring child may so
/// retire its orphaned parent, and so on up.
///
/// A node whose handles are all dropped stays linked while it has a linked child: otherwise a
/// cancel of an ancestor could not reach that child any more (invariant 1).
pub(crate) fn drop_handle<X, R>(node: &Node<X, R>, mut gone: impl FnMut(&Node<X, R>)) {
    // Acquire: sees every write made through the other handles, whose drops (Release) made
    // the count 1. With the count at 1 the caller's handle is the only one, and a handle is
    // only made from a handle, so nobody can raise it again: no read-modify-write is needed.
    if node.handles.load(Ordering::Acquire) == 1 {
        node.handles.store(0, Ordering::Relaxed);
    } else if node.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    if !orphan_if_parent(node) {
        retire(node, &mut gone);
    }
}

/// For a node that just lost its last handle (so no child can be added any more): drops its
/// links, and marks it orphaned if it still has children. Decided under all of its shard locks
/// at once, so that no child unlinks in between: either no child is left (the caller retires
/// the node), or the node is marked orphaned before any of them can look.
fn orphan_if_parent<X, R>(node: &Node<X, R>) -> bool {
    if node.retire.load(Ordering::Relaxed) & HAS_SHARDS == 0 {
        // Never had a child (most nodes). Relaxed: the bit was set through a handle, whose
        // drop (Release) the caller's handle count (Acquire) synchronized with.
        return false;
    }
    let mut links: [Option<Arc<Link<X, R>>>; SHARDS] = Default::default();
    let orphaned = {
        // Every shard that exists: none can be created any more (that takes a handle).
        let mut shards: [_; SHARDS] =
            std::array::from_fn(|i| node.registry[i].get().map(|s| s.data.lock()));
        for (shard, link) in shards.iter_mut().zip(links.iter_mut()) {
            if let Some(shard) = shard {
                // Break the parent-link cycle (invariant 8): links now live as long as the
                // children that hold them.
                *link = shard.link.take();
            }
        }
        let orphaned = shards.iter().flatten().any(|s| !s.children.is_empty());
        if orphaned {
            // Relaxed: read only under one of these locks, or by the CAS in `retire`.
            node.retire.fetch_or(ORPHANED, Ordering::Relaxed);
        }
        orphaned
    };
    // Dropped with no lock held. The last link may hold the last reference the node has on
    // itself through them; the caller still holds `node`.
    drop(links);
    orphaned
}

/// Unlinks a retired node from its parent; if that was the last child of an orphaned parent,
/// retires the parent too, and so on up.
fn retire<X, R>(node: &Node<X, R>, gone: &mut impl FnMut(&Node<X, R>)) {
    let mut n = node;
    // Every ancestor stays alive while `node` does (each node holds a link, which holds its
    // parent), and the caller holds `node`.
    loop {
        gone(n);
        let Some(link) = &n.up else { return };
        let parent = &*link.parent;
        // The parent has this shard: `n` is in it.
        let Some(shard) = parent.registry[link.shard].get() else {
            return;
        };
        let (removed, last) = {
            let mut data = shard.data.lock();
            let removed = data.children.try_remove(n.key);
            let last = data.children.is_empty()
                && parent.retire.load(Ordering::Relaxed) & STATE_BITS == ORPHANED;
            (removed, last)
        };
        // The slab's `Arc` of `n` is dropped with no lock held.
        drop(removed);
        if !last || !all_shards_empty(parent) {
            return;
        }
        // Orphaned and childless: of the children that found it so, one retires it. AcqRel:
        // the winner sees the other unlinks (also ordered by the shard locks).
        let retired = parent
            .retire
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
                (r & STATE_BITS == ORPHANED).then_some((r & !STATE_BITS) | RETIRED)
            });
        if retired.is_err() {
            return;
        }
        n = parent;
    }
}

/// Whether no shard has a child, looking at one shard at a time (used once the node has no
/// handle, when children can only leave).
fn all_shards_empty<X, R>(node: &Node<X, R>) -> bool {
    node.shards().all(|s| s.data.lock().children.is_empty())
}

/// Clones the children of `node` onto `work`, one registry shard lock at a time.
pub(crate) fn push_children<X, R>(node: &Node<X, R>, work: &mut Vec<Arc<Node<X, R>>>) {
    for shard in node.shards() {
        let data = shard.data.lock();
        work.extend(data.children.iter().map(|(_, c)| c.clone()));
    }
}
