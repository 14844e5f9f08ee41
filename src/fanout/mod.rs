//! Fan-out: parallel branches that share one budget, required and optional.
//!
//! An aggregation page asks price, stock, recommendations and reviews at once. Giving each
//! branch "500 ms" and aggregating afterwards overruns the request; waiting for every branch
//! lets the slowest optional one set the latency. Here:
//!
//! * **One budget.** Every branch is a child scope of the same fan-out scope, whose deadline is
//!   the parent's minus the [`reserve`](FanOut::reserve) kept for the response. Deadlines are
//!   fixed when the branches start: a branch that finishes early gives no time to the others.
//! * **Required branches** must succeed: the first failure (error, deadline, panic) cancels the
//!   siblings and fails the fan-out.
//! * **Optional branches** end earlier, [`aggregate_reserve`](FanOut::aggregate_reserve) before
//!   the required ones, and yield "absent" (`None`) instead of failing: the time kept for
//!   aggregating stays untouched.
//! * **A concurrency limit** ([`limit`](FanOut::limit)) bounds the branches running at once (a
//!   queued branch starts when another ends, with what is left of the same budget).
//! * **A minimum useful budget per branch** ([`min_useful`](FanOut::min_useful)): a branch
//!   that would get less is not started (a required one fails the fan-out, an optional one is
//!   absent), as a child scope with too little is not built.
//! * **Rules only tighten.** [`reserve`](FanOut::reserve),
//!   [`aggregate_reserve`](FanOut::aggregate_reserve) and [`min_useful`](FanOut::min_useful)
//!   set twice keep the larger value, as the scope builder's rules do.
//! * **No orphans.** Every started branch is a registered child with a receipt, and
//!   [`join`](FanOut::join) returns only after all of them ended.
//!
//! # Examples
//!
//! The aggregation page of `docs/design.md`: a common deadline of 500 ms, price and stock
//! required, recommendations and reviews optional and cut at 350 ms, 150 ms left to aggregate.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::time::Duration;
//! use cancel_scope::{fanout::FanOut, Scope};
//!
//! let ms = Duration::from_millis;
//! async fn answer<T>(after: Duration, value: T) -> Result<T, std::io::Error> {
//!     tokio::time::sleep(after).await;
//!     Ok(value)
//! }
//!
//! let request = Scope::with_timeout(ms(500));
//! let mut fan = FanOut::new(&request).aggregate_reserve(ms(150));
//! let price = fan.required("price", move |_| answer(ms(120), 1999_u32));
//! let stock = fan.required("stock", move |_| answer(ms(200), 7_u32));
//! let recs = fan.optional("recommendations", move |_| answer(ms(400), vec!["socks"]));
//! let reviews = fan.optional("reviews", move |_| answer(ms(300), 4.5_f32));
//!
//! let mut page = fan.join().await.unwrap();
//! assert_eq!((page.required(price), page.required(stock)), (1999, 7));
//! assert_eq!(page.optional(recs), None); // cut at 350 ms: absent, not an error
//! assert_eq!(page.optional(reviews), Some(4.5));
//! assert_eq!(request.remaining(), Some(ms(150))); // the aggregation reserve is untouched
//! # }
//! ```

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::budget::Rules;
use crate::scope::Scope;

mod error;
mod join;

pub use error::{BoxError, FanOutError};
pub use join::Join;

type Value = Box<dyn Any + Send>;
type BranchFuture = Pin<Box<dyn Future<Output = Result<Value, BoxError>> + Send>>;
type Start = Box<dyn FnOnce(Scope) -> BranchFuture + Send>;

struct Branch {
    name: Arc<str>,
    required: bool,
    start: Option<Start>,
}

/// Identifies fan-outs, so that a handle cannot read another fan-out's results.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    // Relaxed: only makes ids unique.
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Parallel branches sharing one scope's budget; see the [module docs](self).
///
/// Branches are declared with [`required`](Self::required) and [`optional`](Self::optional)
/// (nothing runs yet) and run by [`join`](Self::join). Each branch's closure receives the
/// branch's own scope (also [`Scope::current`] inside it), which is registered and dispatched
/// in the fan-out's scope, read-only under the branch's name. The branch is part of that
/// scope's work: the scope is not quiet, even once closed, until the branch has ended (work a
/// branch must wait for goes into a child of its scope).
///
/// # Examples
///
/// A required branch that fails cancels its siblings:
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use cancel_scope::{fanout::FanOut, Scope};
///
/// let request = Scope::with_timeout(Duration::from_millis(500));
/// let mut fan = FanOut::new(&request);
/// fan.required("stock", |_| async { Err::<u32, _>("inventory unavailable") });
/// fan.required("price", |_| async {
///     tokio::time::sleep(Duration::from_millis(300)).await;
///     Ok::<_, std::io::Error>(1999_u32)
/// });
/// let err = fan.join().await.unwrap_err();
/// assert_eq!(err.branch(), Some("stock"));
/// assert_eq!(request.remaining(), Some(Duration::from_millis(500))); // failed at once
///
/// request.close();
/// let report = request.quiesce().await;
/// assert_eq!((report.failed(), report.cancelled()), (1, 1));
/// # }
/// ```
pub struct FanOut<'s> {
    scope: &'s Scope,
    id: u64,
    reserve: Duration,
    aggregate: Duration,
    min_useful: Duration,
    limit: usize,
    branches: Vec<Branch>,
}

impl<'s> FanOut<'s> {
    /// A fan-out in `scope`: no reserve, no aggregation reserve, no minimum useful budget, no
    /// concurrency limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let scope = Scope::new();
    /// let fan = FanOut::new(&scope);
    /// # drop(fan);
    /// ```
    pub fn new(scope: &'s Scope) -> Self {
        FanOut {
            scope,
            id: next_id(),
            reserve: Duration::ZERO,
            aggregate: Duration::ZERO,
            min_useful: Duration::ZERO,
            limit: usize::MAX,
            branches: Vec::new(),
        }
    }

    /// Time kept for the response after the fan-out: every branch ends this long before the
    /// scope's deadline. Set twice, the larger reserve holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let scope = Scope::with_timeout(Duration::from_millis(500));
    /// let mut fan = FanOut::new(&scope).reserve(Duration::from_millis(50));
    /// let left = fan.required("a", |s| async move { Ok::<_, std::io::Error>(s.remaining()) });
    /// assert_eq!(fan.join().await.unwrap().required(left), Some(Duration::from_millis(450)));
    /// # }
    /// ```
    pub fn reserve(mut self, reserve: Duration) -> Self {
        self.reserve = self.reserve.max(reserve);
        self
    }

    /// Time kept for aggregating: optional branches end this long before the required ones
    /// (their earlier sub-deadline), and yield "absent" if they have not answered by then.
    /// Set twice, the larger reserve holds.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub fn aggregate_reserve(mut self, reserve: Duration) -> Self {
        self.aggregate = self.aggregate.max(reserve);
        self
    }

    /// The least budget that makes a branch worth starting (e.g. its dependency's p95
    /// latency), checked when the branch starts (a queued branch starts with what is left):
    /// a required branch that would get less fails the fan-out, not started
    /// ([`FanOutError::branch`] names it, [`FanOutError::is_deadline_exceeded`]); an optional
    /// one is absent. Set twice, the larger minimum holds.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let ms = Duration::from_millis;
    /// let scope = Scope::with_timeout(ms(100));
    /// let mut fan = FanOut::new(&scope).aggregate_reserve(ms(60)).min_useful(ms(50));
    /// let price = fan.required("price", |_| async { Ok::<_, std::io::Error>(1999_u32) });
    /// let recs = fan.optional("recommendations", |_| async { Ok::<_, std::io::Error>(3_u32) });
    /// let mut page = fan.join().await.unwrap();
    /// assert_eq!(page.required(price), 1999);
    /// assert_eq!(page.optional(recs), None); // 40 ms after the aggregation reserve: not started
    /// # }
    /// ```
    pub fn min_useful(mut self, min_useful: Duration) -> Self {
        self.min_useful = self.min_useful.max(min_useful);
        self
    }

    /// The reserve and minimum useful budget of `rules` at once: the same as
    /// [`reserve`](Self::reserve) and [`min_useful`](Self::min_useful), each only tightening.
    /// The rules' cap is ignored: a fan-out's branches share its budget, and a branch that
    /// needs a cap of its own builds it on the branch's scope.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::{budget::Rules, fanout::FanOut, Scope};
    /// let ms = Duration::from_millis;
    /// let scope = Scope::with_timeout(ms(100));
    /// let mut fan = FanOut::new(&scope).rules(Rules::new().min_useful(ms(150)));
    /// let slow = fan.required("slow", |_| async { Ok::<_, std::io::Error>(()) });
    /// assert!(fan.join().await.is_err()); // 100 ms is below the branches' minimum
    /// # let _ = slow;
    /// # }
    /// ```
    pub fn rules(self, rules: Rules) -> Self {
        self.reserve(rules.reserve).min_useful(rules.min_useful)
    }

    /// The most branches running at once (0 is taken as 1); the others wait in declaration
    /// order.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use tokio::time::Instant;
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let scope = Scope::new();
    /// let t0 = Instant::now();
    /// let mut fan = FanOut::new(&scope).limit(2);
    /// for name in ["a", "b", "c", "d"] {
    ///     fan.required(name, |_| async {
    ///         tokio::time::sleep(Duration::from_millis(100)).await;
    ///         Ok::<_, std::io::Error>(())
    ///     });
    /// }
    /// fan.join().await.unwrap();
    /// assert_eq!(t0.elapsed(), Duration::from_millis(200)); // two waves of two
    /// # }
    /// ```
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.max(1);
        self
    }

    /// Declares a required branch: it must succeed, or the fan-out fails.
    ///
    /// # Examples
    ///
    /// See [`FanOut`].
    pub fn required<T, E, F, Fut>(&mut self, name: impl Into<Arc<str>>, f: F) -> Required<T>
    where
        F: FnOnce(Scope) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Into<BoxError>,
    {
        let index = self.push(name.into(), true, f);
        Required {
            fan: self.id,
            index,
            _t: PhantomData,
        }
    }

    /// Declares an optional branch: cut at the earlier sub-deadline, and "absent" instead of
    /// failing.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub fn optional<T, E, F, Fut>(&mut self, name: impl Into<Arc<str>>, f: F) -> Optional<T>
    where
        F: FnOnce(Scope) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Into<BoxError>,
    {
        let index = self.push(name.into(), false, f);
        Optional {
            fan: self.id,
            index,
            _t: PhantomData,
        }
    }

    fn push<T, E, F, Fut>(&mut self, name: Arc<str>, required: bool, f: F) -> usize
    where
        F: FnOnce(Scope) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Into<BoxError>,
    {
        let start: Start = Box::new(move |scope| {
            let fut = f(scope);
            Box::pin(async move {
                match fut.await {
                    Ok(v) => Ok(Box::new(v) as Value),
                    Err(e) => Err(e.into()),
                }
            })
        });
        self.branches.push(Branch {
            name,
            required,
            start: Some(start),
        });
        self.branches.len() - 1
    }

    /// Runs the branches and waits until each has ended (or was cut off and has its receipt).
    ///
    /// # Errors
    ///
    /// [`FanOutError`]: a required branch failed, ran out of time, panicked or could not start
    /// (its siblings were cancelled and have their receipts), or the scope was cancelled (at
    /// the scope's deadline, the error names the first required branch it cut off). An
    /// optional branch left without budget is absent, not an error, also when the
    /// [`reserve`](Self::reserve) leaves none for the whole fan-out.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future ([`Join`]) cancels the running branches; each records its receipt
    /// when it has stopped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (branches are tasks). A branch's constructor that panics, or a
    /// waker or `on_cancel` callback that panics at a receipt or cancel run here, ends the
    /// fan-out as a failed required branch would (the other branches are cancelled and have
    /// their receipts), and then its panic comes out of `join`. (A panic inside a branch's
    /// future is that branch's failure: [`FanOutError`] if it is required, absent if not.)
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub fn join(self) -> Join<'s> {
        Join::new(self)
    }
}

impl fmt::Debug for FanOut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.branches.iter().map(|b| &*b.name).collect();
        f.debug_struct("FanOut")
            .field("scope", self.scope)
            .field("reserve", &self.reserve)
            .field("aggregate_reserve", &self.aggregate)
            .field("min_useful", &self.min_useful)
            .field("limit", &self.limit)
            .field("branches", &names)
            .finish()
    }
}

/// The handle of a required branch: read its value from [`Joined::required`].
///
/// # Examples
///
/// See [`FanOut`].
#[must_use = "the handle is how the branch's value is read"]
pub struct Required<T> {
    fan: u64,
    index: usize,
    _t: PhantomData<fn() -> T>,
}

/// The handle of an optional branch: read its value (or its absence) from
/// [`Joined::optional`].
///
/// # Examples
///
/// See the [module docs](crate::fanout).
#[must_use = "the handle is how the branch's value is read"]
pub struct Optional<T> {
    fan: u64,
    index: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Required<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Required")
            .field("index", &self.index)
            .finish()
    }
}

impl<T> fmt::Debug for Optional<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Optional")
            .field("index", &self.index)
            .finish()
    }
}

/// The results of a fan-out whose required branches all succeeded.
///
/// # Examples
///
/// See the [module docs](crate::fanout).
pub struct Joined {
    fan: u64,
    values: Vec<Option<Value>>,
    absent: Vec<Arc<str>>,
}

impl Joined {
    /// The value of a required branch.
    ///
    /// # Panics
    ///
    /// If `handle` comes from another fan-out (a programming error, like a wrong index).
    ///
    /// # Examples
    ///
    /// See the [module docs](crate::fanout).
    #[track_caller]
    pub fn required<T: 'static>(&mut self, handle: Required<T>) -> T {
        match self.take(handle.fan, handle.index) {
            Some(v) => v,
            None => panic!("the handle of a required branch is from another fan-out"),
        }
    }

    /// The value of an optional branch, or `None` if it was absent (cut off, failed or not
    /// started for lack of budget).
    ///
    /// # Panics
    ///
    /// If `handle` comes from another fan-out.
    ///
    /// # Examples
    ///
    /// See the [module docs](crate::fanout).
    #[track_caller]
    pub fn optional<T: 'static>(&mut self, handle: Optional<T>) -> Option<T> {
        assert!(
            handle.fan == self.fan,
            "the handle of an optional branch is from another fan-out"
        );
        self.take(handle.fan, handle.index)
    }

    fn take<T: 'static>(&mut self, fan: u64, index: usize) -> Option<T> {
        if fan != self.fan {
            return None;
        }
        let v = self.values.get_mut(index)?.take()?;
        v.downcast::<T>().ok().map(|b| *b)
    }

    /// The names of the optional branches that were absent.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use cancel_scope::{fanout::FanOut, Scope};
    /// let scope = Scope::new();
    /// let mut fan = FanOut::new(&scope);
    /// let _ = fan.optional("reviews", |_| async { Err::<(), _>("down") });
    /// assert_eq!(fan.join().await.unwrap().absent().collect::<Vec<_>>(), ["reviews"]);
    /// # }
    /// ```
    pub fn absent(&self) -> impl Iterator<Item = &str> {
        self.absent.iter().map(|n| &**n)
    }
}

impl fmt::Debug for Joined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Joined")
            .field("branches", &self.values.len())
            .field("absent", &self.absent)
            .finish()
    }
}
