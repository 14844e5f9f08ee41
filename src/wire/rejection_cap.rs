//! The rejection cap: admission refuses at most a fraction of requests over a sliding window;
//! beyond it, a refusal becomes a shadow decision.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::{Arc, AtomicU64, AtomicU8, Mutex, Ordering};

/// The slices a window is counted in (as Finagle's `WindowedAdder`): the count drops a slice
/// at a time, so a request counts for at least nine tenths of the window and at most all of
/// it.
const SLICES: usize = 10;

/// One slice's word: its epoch (the slice number since the cap was made, modulo 2^24) in the
/// top 24 bits, then the requests decided and the requests refused in it, 20 bits each
/// (saturating at 1,048,575 a slice). One word per slice, so a slice is reset and counted in
/// one compare-and-swap: no count is lost to a concurrent reset.
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << 24) - 1;

const fn pack(epoch: u64, decided: u64, refused: u64) -> u64 {
    ((epoch & EPOCH_MASK) << (2 * COUNT_BITS)) | (decided << COUNT_BITS) | refused
}

const fn unpack(word: u64) -> (u64, u64, u64) {
    (
        word >> (2 * COUNT_BITS),
        (word >> COUNT_BITS) & COUNT_MAX,
        word & COUNT_MAX,
    )
}

/// An endpoint's rejection cap: admission refuses at most `percent` % of the requests it
/// decides over a sliding `window`; a refusal beyond that becomes a shadow decision. The
/// default is Finagle's `DeadlineFilter`'s: at most 20 % of requests over 10 s.
///
/// A request the cap lets through is admitted with
///
/// ```text
/// remaining = min(declared or default, default, maximum − queued)
/// ```
///
/// — never longer than the caller declared, nor than the endpoint's default, and within the
/// hard cap — and runs as a shadowed request does: the refusal is a [`WouldBe`] in its
/// [`Admission`] and [`Report`](crate::Report) ([`WouldBe::is_over_rejection_cap`]), counted as
/// `cancel_scope.shadow.admission.rejected` and `cancel_scope.admission.rejection_capped`
/// (feature `metrics`), and said on its span (feature `tracing`). The time it queued and the
/// reserve are not taken off the declared budget (that is what refused it), so it is not
/// refused again for want of the minimum useful budget. A request left no time at all (a
/// declared `0`, or a queue as long as the hard cap) is refused whatever the cap says.
///
/// **What counts.** Every request whose budget admission decides (admitted, shadowed or
/// refused) counts in the window; a refusal is enforced only while the refusals, this one
/// included, stay within `percent` % of the requests, this one included:
/// `100 × (refused + 1) ≤ percent × (decided + 1)`. So a server that has seen nothing yet
/// refuses nothing for its first few requests (at 20 %, the 5th request is the first that can
/// be refused). Finagle counts the same way in kind — every request, whatever its deadline,
/// adds to its token bucket and each rejection takes from it — but its ratio is of the requests
/// served (`rejected ≤ 20 % × served`); this one is of all requests, as the cap is stated.
///
/// **Which refusals it caps**: those of the budget rules — a malformed, repeated or
/// unknown-version budget header (hostile input counts as Finagle counts every rejection: a
/// flood of bad headers cannot make the endpoint refuse more than the cap, and a bad header
/// beyond it gets at most the endpoint's default, as a request that declares nothing does, so
/// it never lengthens a budget), a budget over a rejecting maximum
/// ([`OverCap::Reject`](super::OverCap::Reject)), and too little budget left. Always enforced,
/// and not counted: the hard cap, a server's shutdown, an operation's cancel or older
/// generation, and the registry's term (a budget the operation registry shortened below the
/// minimum useful one).
///
/// **Shared state.** The window is shared by every clone of the cap and every layer it is given
/// to ([`AdmitLayer::rejection_cap`](crate::integrations::tower::AdmitLayer::rejection_cap),
/// [`Incoming::rejection_cap`](super::Incoming::rejection_cap)): give each endpoint its own.
/// It belongs to the layer, not to a policy version: a [`PolicyHandle`] swap or rollback
/// keeps its history (feature `rollout`). A layer without a cap of its own whose policy (or a
/// version of it) brings settings makes one, and gives it the settings of the policy that
/// admits each request
/// ([`EndpointPolicyBuilder::rejection_cap`](super::EndpointPolicyBuilder::rejection_cap), from
/// configuration too): a new percentage holds from the next decision, a new window length
/// keeps the counts of the slices it reaches back to; [`percent`](Self::percent) and
/// [`window`](Self::window) say the settings in force. Each request costs one
/// compare-and-swap on the word of the current slice (a refusal also reads the other nine):
/// no lock. Concurrent refusals are serialised by that word, so the cap holds exactly within
/// a slice; at the turn of a slice it may be passed by the requests decided at that instant.
///
/// [`WouldBe`]: super::WouldBe
/// [`WouldBe::is_over_rejection_cap`]: super::WouldBe::is_over_rejection_cap
/// [`Admission`]: super::Admission
/// [`PolicyHandle`]: super::PolicyHandle
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::wire::{EndpointPolicy, Incoming, RejectionCap};
///
/// let ms = Duration::from_millis;
/// let policy = EndpointPolicy::builder(ms(5_000)).default_budget(ms(1_000)).build();
/// let cap = RejectionCap::default(); // 20 % over 10 s
/// let now = tokio::time::Instant::now();
/// for _ in 0..8 {
///     policy.admit(Incoming::new().rejection_cap(&cap), now).unwrap();
/// }
/// // 2 refusals of 10 requests are within 20 %; the third would not be.
/// let bad = || Incoming::new().grpc_timeout(b"-1S").rejection_cap(&cap);
/// assert!(policy.admit(bad(), now).unwrap_err().is_invalid());
/// assert!(policy.admit(bad(), now).unwrap_err().is_invalid());
/// let (scope, a) = policy.admit(bad(), now).unwrap();
/// assert!(a.is_over_rejection_cap() && a.would_be()[0].is_refusal());
/// assert_eq!(scope.remaining(), Some(ms(1_000))); // the endpoint's default
/// assert_eq!((cap.refused(), cap.let_through()), (2, 1));
/// # }
/// ```
#[derive(Clone)]
pub struct RejectionCap {
    inner: Arc<Window>,
}

struct Window {
    percent: AtomicU8,
    /// The window's length in nanoseconds (at least [`SLICES`]).
    window: AtomicU64,
    /// A slice's length in nanoseconds (at least 1).
    slice: AtomicU64,
    /// Taken to change the window's length (see [`Window::resize`]).
    #[cfg_attr(not(all(feature = "tower", feature = "rollout")), allow(dead_code))]
    resizing: Mutex<()>,
    /// Where slice 0 begins.
    origin: Instant,
    slices: [AtomicU64; SLICES],
    /// Refusals enforced, and refusals let through, since the cap was made.
    refused: AtomicU64,
    let_through: AtomicU64,
}

impl Default for RejectionCap {
    /// Finagle's `DeadlineFilter` default: at most 20 % of requests over 10 s.
    fn default() -> Self {
        RejectionCap::new(20, Duration::from_secs(10))
    }
}

impl RejectionCap {
    /// A cap of `percent` % (`0` to `100`; larger values are `100`) of the requests over
    /// `window` (at least 10 ns). At `100` every refusal is enforced, at `0` none is (every
    /// refusal runs as a shadow decision).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (the window runs on tokio's clock, virtual in tests).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::RejectionCap;
    /// let cap = RejectionCap::new(120, Duration::from_secs(30));
    /// assert_eq!((cap.percent(), cap.window()), (100, Duration::from_secs(30)));
    /// # }
    /// ```
    pub fn new(percent: u8, window: Duration) -> Self {
        let window = window_nanos(window);
        RejectionCap {
            inner: Arc::new(Window {
                percent: AtomicU8::new(percent.min(100)),
                window: AtomicU64::new(window),
                slice: AtomicU64::new(window / SLICES as u64),
                resizing: Mutex::new(()),
                origin: Instant::now(),
                slices: std::array::from_fn(|_| AtomicU64::new(0)),
                refused: AtomicU64::new(0),
                let_through: AtomicU64::new(0),
            }),
        }
    }

    /// The percentage of requests that may be refused.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// assert_eq!(cancel_scope::wire::RejectionCap::default().percent(), 20);
    /// # }
    /// ```
    pub fn percent(&self) -> u8 {
        self.inner.percent.load(Ordering::Relaxed)
    }

    /// The window the percentage holds over.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// assert_eq!(cancel_scope::wire::RejectionCap::default().window(), Duration::from_secs(10));
    /// # }
    /// ```
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.inner.window.load(Ordering::Relaxed))
    }

    /// Takes the settings of the policy version that admits a request (a layer's own window,
    /// see `EndpointPolicyBuilder::rejection_cap`): `percent` for the decisions from now on, and
    /// `window` for the length the counts are kept. Called per request, so a change takes
    /// effect at the first request under the new settings. A new length keeps the counts of
    /// the slices it reaches back to from `now` (see [`Window::resize`]: they go into the
    /// slice of `now`, and leave the window a whole new length later); a request decided at
    /// the very instant of the change may go uncounted.
    #[cfg_attr(not(all(feature = "tower", feature = "rollout")), allow(dead_code))]
    pub(crate) fn apply(&self, percent: u8, window: Duration, now: Instant) {
        let w = &*self.inner;
        let percent = percent.min(100);
        if w.percent.load(Ordering::Relaxed) != percent {
            w.percent.store(percent, Ordering::Relaxed);
        }
        let window = window_nanos(window);
        if w.window.load(Ordering::Relaxed) != window {
            w.resize(window, now);
        }
    }

    /// The refusals enforced since the cap was made.
    ///
    /// # Examples
    ///
    /// See [`RejectionCap`].
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// The refusals the cap let through (run as shadow decisions) since it was made.
    ///
    /// # Examples
    ///
    /// See [`RejectionCap`].
    pub fn let_through(&self) -> u64 {
        self.inner.let_through.load(Ordering::Relaxed)
    }

    /// The requests decided and refused in the window that ends at `now` (nothing is counted
    /// at 100 %, where every refusal is enforced).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::wire::{EndpointPolicy, Incoming, RejectionCap};
    /// let cap = RejectionCap::new(50, Duration::from_secs(1));
    /// let p = EndpointPolicy::builder(Duration::from_secs(1)).build();
    /// p.admit(Incoming::new().rejection_cap(&cap), tokio::time::Instant::now()).unwrap();
    /// assert_eq!(cap.in_window(tokio::time::Instant::now()), (1, 0));
    /// tokio::time::advance(Duration::from_secs(1)).await;
    /// assert_eq!(cap.in_window(tokio::time::Instant::now()), (0, 0)); // it left the window
    /// # }
    /// ```
    pub fn in_window(&self, now: Instant) -> (u64, u64) {
        let epoch = self.inner.epoch(now);
        self.inner.live(epoch, None)
    }

    /// Counts a request admission decided without a refusal.
    pub(crate) fn admitted(&self, now: Instant) {
        let w = &*self.inner;
        if w.percent.load(Ordering::Relaxed) == 100 {
            // Every refusal is enforced: nothing to count for.
            return;
        }
        w.count(w.epoch(now), |_| false);
    }

    /// Counts a refusal decided at `now`; whether it is enforced (within the cap, or `force`:
    /// a request left no time at all) or let through.
    pub(crate) fn refuse(&self, now: Instant, force: bool) -> bool {
        let w = &*self.inner;
        let percent = u64::from(w.percent.load(Ordering::Relaxed));
        let refused = if percent == 100 {
            // Every refusal is enforced: nothing to count for.
            true
        } else if force {
            w.count(w.epoch(now), |_| true);
            true
        } else {
            let epoch = w.epoch(now);
            let (decided, refused) = w.live(epoch, Some(epoch));
            w.count(epoch, |(here_decided, here_refused)| {
                100 * (refused + here_refused + 1) <= percent * (decided + here_decided + 1)
            })
        };
        let counter = if refused { &w.refused } else { &w.let_through };
        counter.fetch_add(1, Ordering::Relaxed);
        refused
    }
}

/// A window's length in nanoseconds: at least one per slice, at most `u64::MAX`.
fn window_nanos(window: Duration) -> u64 {
    u64::try_from(window.as_nanos())
        .unwrap_or(u64::MAX)
        .max(SLICES as u64)
}

impl Window {
    /// The slice number of `now`.
    fn epoch(&self, now: Instant) -> u64 {
        let slice = u128::from(self.slice.load(Ordering::Relaxed).max(1));
        let since = now.saturating_duration_since(self.origin).as_nanos() / slice;
        u64::try_from(since).unwrap_or(u64::MAX) & EPOCH_MASK
    }

    /// Changes the window's length to `window` nanoseconds at `now`, keeping its counts: the
    /// requests decided and refused in the slices that began within the new length before
    /// `now` (as far back as the slices still hold) go into the slice of `now` in the new
    /// length, the other slices are emptied.
    #[cold]
    #[cfg_attr(not(all(feature = "tower", feature = "rollout")), allow(dead_code))]
    fn resize(&self, window: u64, now: Instant) {
        let _one_at_a_time = self.resizing.lock();
        if self.window.load(Ordering::Relaxed) == window {
            return;
        }
        let slice = u128::from(self.slice.load(Ordering::Relaxed).max(1));
        let current = self.epoch(now);
        let (mut decided, mut refused) = (0, 0);
        for slot in &self.slices {
            let (e, d, r) = unpack(slot.load(Ordering::Relaxed));
            let age = u128::from(current.wrapping_sub(e) & EPOCH_MASK);
            if age * slice < u128::from(window) {
                decided += d;
                refused += r;
            }
        }
        self.slice.store(window / SLICES as u64, Ordering::Relaxed);
        self.window.store(window, Ordering::Relaxed);
        let epoch = self.epoch(now);
        let here = usize::try_from(epoch % SLICES as u64).unwrap_or(0);
        for (i, slot) in self.slices.iter().enumerate() {
            let word = if i == here {
                pack(epoch, decided.min(COUNT_MAX), refused.min(COUNT_MAX))
            } else {
                0
            };
            slot.store(word, Ordering::Relaxed);
        }
    }

    /// The requests decided and refused in the slices of the window that ends in slice
    /// `epoch`, without slice `skip`.
    fn live(&self, epoch: u64, skip: Option<u64>) -> (u64, u64) {
        let mut sum = (0, 0);
        for slot in &self.slices {
            let (e, decided, refused) = unpack(slot.load(Ordering::Relaxed));
            // A slice last written `SLICES` or more slices ago has left the window. (An epoch
            // wraps after 2^24 slices: a slice untouched for exactly a multiple of that
            // would count again, with what it held then.)
            let age = epoch.wrapping_sub(e) & EPOCH_MASK;
            if age < SLICES as u64 && Some(e) != skip {
                sum.0 += decided;
                sum.1 += refused;
            }
        }
        sum
    }

    /// Counts one request in slice `epoch`; `refuse` says, from that slice's counts so far,
    /// whether it is a refusal. Returns what `refuse` said last.
    fn count(&self, epoch: u64, refuse: impl Fn((u64, u64)) -> bool) -> bool {
        // `epoch` is below 2^24: its index fits.
        let slot = &self.slices[usize::try_from(epoch % SLICES as u64).unwrap_or(0)];
        let mut decided_refusal = false;
        // `Relaxed`: the word orders nothing else, and each update is one CAS on it alone.
        let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
            let (e, decided, refused) = unpack(word);
            let (decided, refused) = if e == epoch {
                (decided, refused)
            } else {
                (0, 0) // a slice of an older window, reused
            };
            let refusal = refuse((decided, refused));
            decided_refusal = refusal;
            Some(pack(
                epoch,
                (decided + 1).min(COUNT_MAX),
                (refused + u64::from(refusal)).min(COUNT_MAX),
            ))
        });
        decided_refusal
    }
}

impl fmt::Debug for RejectionCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RejectionCap")
            .field("percent", &self.percent())
            .field("window", &self.window())
            .field("refused", &self.refused())
            .field("let_through", &self.let_through())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_keeps_its_epoch_and_counts() {
        let w = pack(EPOCH_MASK, COUNT_MAX, 7);
        assert_eq!(unpack(w), (EPOCH_MASK, COUNT_MAX, 7));
    }
}
