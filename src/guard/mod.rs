//! Resources held for a scope: semaphore permits and tethered values.
//!
//! A guard is counted in its scope while it lives, so [`Scope::quiesce`] waits until every
//! guard was released; dropping the guard releases it. Acquiring one takes a work unit first,
//! so no guard can be acquired after the scope was cancelled or closed.

use std::fmt;
use std::ops::{Deref, DerefMut};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::Error;
use crate::scope::Scope;
use crate::time::now_stamp;
use crate::tree;

/// One counted unit of a scope; released on drop.
struct Unit(Scope);

impl Unit {
    fn take(scope: &Scope) -> Result<Unit, Error> {
        tree::take_unit(&scope.node)?;
        Ok(Unit(scope.clone()))
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        tree::release_guard(&self.0.node, now_stamp);
    }
}

/// A semaphore permit counted against a scope: the former name of the
/// `Tethered<OwnedSemaphorePermit>` that [`Scope::acquire`] returns.
///
/// # Examples
///
/// ```
/// # #![allow(deprecated)]
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use tokio::sync::Semaphore;
/// use cancel_scope::{Permit, Scope};
///
/// let pool = Arc::new(Semaphore::new(1));
/// let permit: Permit = Scope::new().acquire(&pool).await.unwrap();
/// drop(permit);
/// assert_eq!(pool.available_permits(), 1);
/// # }
/// ```
#[deprecated(
    since = "0.1.0",
    note = "one guard type: `Scope::acquire` returns a `Tethered<OwnedSemaphorePermit>`"
)]
pub type Permit = Tethered<OwnedSemaphorePermit>;

impl Tethered<OwnedSemaphorePermit> {
    /// The underlying tokio permit (a `Tethered` dereferences to it).
    ///
    /// # Examples
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # use std::sync::Arc;
    /// # use tokio::sync::Semaphore;
    /// # use cancel_scope::Scope;
    /// let pool = Arc::new(Semaphore::new(3));
    /// let p = Scope::new().acquire(&pool).await.unwrap();
    /// assert_eq!(p.permit().num_permits(), p.num_permits());
    /// # }
    /// ```
    #[deprecated(since = "0.1.0", note = "a `Tethered` dereferences to its permit")]
    pub fn permit(&self) -> &OwnedSemaphorePermit {
        &self.value
    }
}

/// Any resource (a connection, a file, a lease, a semaphore permit) counted against a scope
/// while it lives; dropping it releases the resource and the count.
///
/// Made by [`Scope::tether`], and by [`Scope::acquire`] for a semaphore's permit.
/// Dereferences to the resource; [`Tethered::into_inner`] releases the count and hands the
/// resource back.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use tokio::sync::Semaphore;
/// use cancel_scope::Scope;
///
/// let s = Scope::new();
/// let conn = s.tether(String::from("conn-1")).unwrap();
/// assert_eq!(conn.len(), 6);
/// assert_eq!(conn.into_inner(), "conn-1");
///
/// let pool = Arc::new(Semaphore::new(1));
/// let permit = s.acquire(&pool).await.unwrap();
/// assert_eq!((pool.available_permits(), permit.num_permits()), (0, 1));
/// drop(permit);
/// assert_eq!(pool.available_permits(), 1);
/// # }
/// ```
#[must_use = "the resource is released when dropped"]
pub struct Tethered<T> {
    value: T,
    _unit: Unit,
}

impl<T> Tethered<T> {
    /// Releases the count and returns the resource.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// assert_eq!(Scope::new().tether(5).unwrap().into_inner(), 5);
    /// ```
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> Deref for Tethered<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Tethered<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: fmt::Debug> fmt::Debug for Tethered<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tethered")
            .field("value", &self.value)
            .finish()
    }
}

impl Scope {
    /// Waits for a permit of `semaphore`, for at most this scope's remaining budget (queueing
    /// pays from the budget), and counts it against the scope until dropped.
    ///
    /// # Errors
    ///
    /// * [`Error::is_cancelled`] (also [`Error::is_deadline_exceeded`]) if the scope is
    ///   cancelled or runs out of time while waiting, or already was — a deadline that has
    ///   passed counts even before its timer has fired, so no permit is granted at or after
    ///   it (one that came free too late goes back to the semaphore);
    /// * [`Error::is_closed`] if the scope's watermark is closed or the semaphore was closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future gives back the place in the queue and the count.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::{sync::Arc, time::Duration};
    /// use tokio::sync::Semaphore;
    /// use cancel_scope::Scope;
    ///
    /// let pool = Arc::new(Semaphore::new(0)); // exhausted pool
    /// let s = Scope::with_timeout(Duration::from_millis(200));
    /// let err = s.acquire(&pool).await.unwrap_err();
    /// assert!(err.is_deadline_exceeded());
    /// # }
    /// ```
    pub async fn acquire(
        &self,
        semaphore: &std::sync::Arc<Semaphore>,
    ) -> Result<Tethered<OwnedSemaphorePermit>, Error> {
        // A passed deadline is made the cancel now: it refuses the unit below.
        self.expire_if_passed();
        let unit = Unit::take(self)?;
        let permit = tokio::select! {
            biased;
            cause = self.cancelled_cause() => return Err(Error::cancelled(cause)),
            permit = semaphore.clone().acquire_owned() => permit.map_err(|_| Error::closed())?,
        };
        // Granted at or after the deadline, before its timer ran: the wait used up the whole
        // budget, so the permit goes back (dropped here) and the deadline is the cancel.
        if self.expire_if_passed() {
            return Err(Error::cancelled(self.cause_or_cancelled()));
        }
        Ok(Tethered {
            value: permit,
            _unit: unit,
        })
    }

    /// Counts `resource` against this scope until it is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::is_cancelled`] / [`Error::is_closed`]: the scope accepts no new work (a
    /// deadline that has passed counts even before its timer has fired, as for
    /// [`acquire`](Scope::acquire)).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Scope;
    /// let s = Scope::new();
    /// s.cancel();
    /// assert!(s.tether(()).unwrap_err().is_cancelled());
    /// ```
    pub fn tether<T>(&self, resource: T) -> Result<Tethered<T>, Error> {
        self.expire_if_passed();
        Ok(Tethered {
            value: resource,
            _unit: Unit::take(self)?,
        })
    }
}
