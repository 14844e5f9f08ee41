//! tokio-util [`CancellationToken`] interop, both ways (feature `tokio-util`): a token that is
//! cancelled with its scope, for the libraries that take one (tonic's client cancellation,
//! grpc-rust #2791), and a child scope that a token cancels.
//!
//! Neither way runs a task. A scope's token is one token per scope, made on the first ask and
//! cancelled by one `on_cancel` callback (every call hands out a child token of it, which
//! goes when dropped); a scope that a token cancels has that token's wait polled once, with a
//! waker that cancels the scope, and the wait goes with the scope (its cancel or its end).
//! What the token holds never holds the scope: neither keeps the other alive.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc as Shared;
use std::task::{Context, Wake, Waker};

use once_cell::race::OnceBox;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::{ChildBuilder, Core, Scope};
use crate::cause::Cause;
use crate::error::Error;
use crate::panic::Caught;
use crate::sync::{downgrade, Mutex, Weak};
use crate::time::now_stamp;
use crate::tree;

/// The reason of the cause a token gives the scope it cancels, unless another cause was given
/// ([`ChildBuilder::cancelled_by_because`]).
pub(crate) const TOKEN_REASON: &str = "cancellation token cancelled";

/// A scope's own token ([`Scope::cancellation_token`]), in its tree node: made on the first
/// ask, cancelled by the scope's cancel and, at the latest, when the node goes.
#[derive(Debug)]
pub(crate) struct TokenSlot(OnceBox<CancellationToken>);

impl TokenSlot {
    pub(crate) const fn new() -> Self {
        TokenSlot(OnceBox::new())
    }
}

impl Drop for TokenSlot {
    fn drop(&mut self) {
        // The scope is gone (no handle, no child: nothing of it can run any more), so work
        // that holds its token stops too. A waker of the token's waiters that panics does not
        // unwind out of a drop that runs during another panic (see `Caught::resume`).
        if let Some(token) = self.0.get() {
            let mut caught = Caught::default();
            caught.run(|| token.cancel());
            caught.resume();
        }
    }
}

impl Scope {
    /// A tokio-util [`CancellationToken`] that is cancelled when this scope is: by its own
    /// cancel, an ancestor's, or its deadline — and, at the latest, when the scope is gone
    /// (its last handle dropped with no child left: nothing of it can run any more, so neither
    /// should work that holds its token). For libraries that take a token instead of a scope.
    ///
    /// Cheap: the scope makes one token on the first call and registers one callback for it;
    /// each call returns a [child token](CancellationToken::child_token) of it, so cancelling
    /// a token handed out stops only its holder (never the scope or the other holders), and
    /// dropping it leaves nothing behind. No task runs for it, and the token does not keep the
    /// scope alive.
    ///
    /// A token asked of a cancelled scope is cancelled already. A scope that completed (closed
    /// and quiet: a later cancel does not reach it) cancels its token only when it is gone.
    /// The token has no cause: ask the scope ([`Scope::cause`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use cancel_scope::Scope;
    ///
    /// let request = Scope::with_timeout(Duration::from_millis(100));
    /// let token = request.cancellation_token();
    /// // A library that takes a token stops at the request's deadline.
    /// let library_call = tokio::spawn(async move {
    ///     token.run_until_cancelled(tokio::time::sleep(Duration::from_secs(5))).await
    /// });
    /// assert_eq!(library_call.await.unwrap(), None); // cut off at 100 ms
    /// assert!(request.cause().unwrap().is_deadline_exceeded());
    /// # }
    /// ```
    pub fn cancellation_token(&self) -> CancellationToken {
        self.own_token().child_token()
    }

    /// The scope's own token, made (and its callback registered) on the first call.
    fn own_token(&self) -> &CancellationToken {
        let slot = &self.node.ext.token.0;
        if let Some(token) = slot.get() {
            return token;
        }
        let token = CancellationToken::new();
        let cancel = token.clone();
        // Registered before the token is published, so that a cancel that begins after any
        // caller got the token reaches it; on a cancelled scope it runs at once (invariant
        // 1: the first cause is set before the callbacks are taken).
        let key = tree::on_cancel(&self.node, Box::new(move |_| cancel.cancel()));
        if slot.set(Box::new(token)).is_err() {
            // Another first call won: its token (whose callback is registered) is the one.
            if let Some(key) = key {
                tree::stop_callback(&self.node, key);
            }
        }
        match slot.get() {
            Some(token) => token,
            None => unreachable!("the slot was set"),
        }
    }
}

impl ChildBuilder<'_> {
    /// The child is cancelled when `token` is, with [`Cause::Cancelled`] and the reason
    /// `"cancellation token cancelled"` (its descendants see it as
    /// [`Cause::ParentCancelled`]); the parent is not. For a server's shutdown token, or a
    /// library's cancellation handle, bounding work in a scope. Set twice (or with
    /// [`cancelled_by_because`](Self::cancelled_by_because)), any of the tokens cancels it.
    ///
    /// No task runs for it: the token's cancel cancels the child on the thread that cancels
    /// the token (as a callback of it would). The child's link to the token goes with the
    /// child (its cancel, or the end of the scope), and the token does not keep the child
    /// alive.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) fails with [`Error::is_cancelled`](crate::Error::is_cancelled),
    /// that cause, if `token` is already cancelled: nothing is started.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use tokio_util::sync::CancellationToken;
    /// use cancel_scope::Scope;
    ///
    /// let shutdown = CancellationToken::new();
    /// let server = Scope::new();
    /// let job = server.child().cancelled_by(&shutdown).build().unwrap();
    /// let work = job.spawn(tokio::time::sleep(Duration::from_secs(60))).unwrap();
    ///
    /// shutdown.cancel();
    /// assert_eq!(job.cause().unwrap().reason(), Some("cancellation token cancelled"));
    /// assert!(work.await.unwrap_err().is_cancelled());
    /// assert!(!server.is_cancelled());
    /// # }
    /// ```
    pub fn cancelled_by(self, token: &CancellationToken) -> Self {
        self.cancelled_by_because(token, Cause::cancelled(TOKEN_REASON))
    }

    /// [`cancelled_by`](Self::cancelled_by), with `cause` as the child's cause (for a token
    /// that means the client went away, say [`Cause::ClientGone`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use tokio_util::sync::CancellationToken;
    /// use cancel_scope::{Cause, Scope};
    ///
    /// let disconnected = CancellationToken::new();
    /// let request = Scope::new()
    ///     .child()
    ///     .cancelled_by_because(&disconnected, Cause::ClientGone)
    ///     .build()
    ///     .unwrap();
    /// disconnected.cancel();
    /// assert!(request.cause().unwrap().is_client_gone());
    /// ```
    pub fn cancelled_by_because(mut self, token: &CancellationToken, cause: Cause) -> Self {
        self.tokens.push((token.clone(), cause));
        self
    }
}

/// [`ChildBuilder::build`] of a builder given tokens: refused if one is cancelled already,
/// otherwise the child, linked to each.
#[track_caller]
pub(super) fn build_cancelled_by(mut builder: ChildBuilder<'_>) -> Result<Scope, Error> {
    let tokens = std::mem::take(&mut builder.tokens);
    if let Some((_, cause)) = tokens.iter().find(|(t, _)| t.is_cancelled()) {
        return Err(Error::cancelled(cause.clone()));
    }
    let child = builder.build()?;
    for (token, cause) in tokens {
        Link::make(&child, token, cause);
    }
    Ok(child)
}

/// A scope cancelled by a token: the token's wait, polled with this as its waker, whose wake
/// cancels the scope. The wait holds a waker, so a clone of this: the wait is taken out (the
/// cycle broken) when the token fires, when the scope is cancelled, or when the scope's
/// callback holding an [`Unlink`] is dropped with the scope's node.
struct Link {
    /// Weak: the token's waiters must not keep the scope alive.
    scope: Weak<Core>,
    cause: Cause,
    /// `None` once the token fired or the link was undone.
    wait: Mutex<Option<Pin<Box<WaitForCancellationFutureOwned>>>>,
}

impl Link {
    fn make(scope: &Scope, token: CancellationToken, cause: Cause) {
        let link = Shared::new(Link {
            scope: downgrade(&scope.node),
            cause,
            wait: Mutex::new(Some(Box::pin(token.cancelled_owned()))),
        });
        // First the callback, so that a cancel of the scope from here on undoes the link (at
        // once if the scope is cancelled already); then the first poll, which cancels the
        // scope if the token is cancelled by now, or registers the waker.
        let unlink = Unlink(link.clone());
        tree::on_cancel(&scope.node, Box::new(move |_| drop(unlink)));
        link.poll_wait();
    }

    /// Polls the token's wait; cancels the scope if the token fired.
    fn poll_wait(self: &Shared<Self>) {
        let waker = Waker::from(self.clone());
        let fired = {
            let mut wait = self.wait.lock();
            // The poll wakes nobody (it registers `waker`, or finds the token cancelled), so
            // holding the lock over it cannot deadlock with a wake.
            let ready = wait
                .as_mut()
                .is_some_and(|w| w.as_mut().poll(&mut Context::from_waker(&waker)).is_ready());
            if ready {
                wait.take()
            } else {
                None
            }
        };
        if fired.is_some() {
            // With no lock held: the cancel runs the scope's wakers and callbacks (among them
            // the `Unlink`, which finds the wait gone).
            drop(fired);
            if let Some(node) = self.scope.upgrade() {
                super::deadline::cancel_node(&node, self.cause.clone(), now_stamp());
            }
        }
    }
}

impl Wake for Link {
    fn wake(self: Shared<Self>) {
        self.poll_wait();
    }

    fn wake_by_ref(self: &Shared<Self>) {
        self.poll_wait();
    }
}

/// Undoes a [`Link`] when dropped: held by the scope's `on_cancel` callback, which is dropped
/// when it runs (the scope's cancel) or with the scope's node.
struct Unlink(Shared<Link>);

impl Drop for Unlink {
    fn drop(&mut self) {
        // Dropped with no lock held: it leaves the token's waiters.
        let wait = self.0.wait.lock().take();
        drop(wait);
    }
}
