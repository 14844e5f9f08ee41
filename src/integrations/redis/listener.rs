//! The pub/sub listener: hears the cancels other processes announce and cancels this
//! process's scopes of those operations; catches up on what it missed after every
//! (re)subscription.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use redis::aio::ConnectionManager;
use redis::Client;
use tokio::sync::watch;
use tokio::time::Instant;

use super::scripts::{parse_announcement, Keys, Scripts};
use crate::registry::LocalScopes;
use crate::time::deadline_after;

/// What a [`RedisRegistry`](super::RedisRegistry)'s listener has done so far, for health
/// checks.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), cancel_scope::registry::RegistryError> {
/// use cancel_scope::integrations::redis::RedisRegistry;
/// let client = redis::Client::open("redis://127.0.0.1/").unwrap();
/// let registry = RedisRegistry::builder(client).connect().await?;
/// let status = registry.listener().unwrap();
/// println!("subscribed: {} ({} times)", status.is_connected(), status.subscriptions());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenerStatus {
    connected: bool,
    subscriptions: u64,
    heard: u64,
    caught_up: u64,
}

impl ListenerStatus {
    /// Whether it is subscribed now.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::redis::ListenerStatus;
    /// assert!(!ListenerStatus::default().is_connected());
    /// ```
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// How many times it subscribed (the first time, and once per reconnection).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::redis::ListenerStatus;
    /// assert_eq!(ListenerStatus::default().subscriptions(), 0);
    /// ```
    pub fn subscriptions(&self) -> u64 {
        self.subscriptions
    }

    /// Cancel announcements it heard.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::redis::ListenerStatus;
    /// assert_eq!(ListenerStatus::default().cancels_heard(), 0);
    /// ```
    pub fn cancels_heard(&self) -> u64 {
        self.heard
    }

    /// Cancelled operations it found by reading the store after a subscription (cancels whose
    /// announcement it had missed while it was not subscribed).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::integrations::redis::ListenerStatus;
    /// assert_eq!(ListenerStatus::default().cancels_caught_up(), 0);
    /// ```
    pub fn cancels_caught_up(&self) -> u64 {
        self.caught_up
    }
}

/// What the listener needs.
pub(super) struct Listener {
    pub(super) client: Client,
    pub(super) conn: ConnectionManager,
    pub(super) keys: Keys,
    pub(super) scripts: Arc<Scripts>,
    pub(super) scopes: LocalScopes,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) min_delay: Duration,
    pub(super) max_delay: Duration,
}

/// The listener task, stopped when this is dropped (with the registry).
#[derive(Debug)]
pub(super) struct Running {
    task: tokio::task::JoinHandle<()>,
    pub(super) status: watch::Receiver<ListenerStatus>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Spawns the listener on the current runtime.
    pub(super) fn spawn(self) -> Running {
        let (tx, status) = watch::channel(ListenerStatus::default());
        Running {
            task: tokio::spawn(self.run(tx)),
            status,
        }
    }

    async fn run(self, status: watch::Sender<ListenerStatus>) {
        let mut delay = self.min_delay;
        loop {
            if let Some(pubsub) = self.subscribe().await {
                delay = self.min_delay;
                status.send_modify(|s| {
                    s.connected = true;
                    s.subscriptions += 1;
                });
                // Subscribed first, then read: a cancel announced from now on is heard, one
                // made before is in the store.
                self.catch_up(&status).await;
                let mut messages = pubsub.into_on_message();
                while let Some(msg) =
                    std::future::poll_fn(|cx| Pin::new(&mut messages).poll_next(cx)).await
                {
                    if let Some((_, ttl, id)) = parse_announcement(msg.get_payload_bytes()) {
                        let until = deadline_after(Instant::now(), ttl);
                        // Counted first: whoever sees the scopes cancelled sees the count.
                        status.send_modify(|s| s.heard += 1);
                        self.scopes.cancel_contained(&id, Some(until));
                    }
                }
                status.send_modify(|s| s.connected = false);
            }
            tokio::time::sleep(delay).await;
            delay = delay.saturating_mul(2).min(self.max_delay);
        }
    }

    async fn subscribe(&self) -> Option<redis::aio::PubSub> {
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(self.keys.channel()).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        tokio::time::timeout(self.connect_timeout, subscribe)
            .await
            .ok()?
            .ok()
    }

    /// Reads every operation that has live scopes here and cancels those the store says are
    /// cancelled, counting them. Stops at the first read that fails (the next subscription
    /// tries again).
    async fn catch_up(&self, status: &watch::Sender<ListenerStatus>) {
        let mut conn = self.conn.clone();
        for id in self.scopes.operations() {
            let started = Instant::now();
            let key = self.keys.operation(&id);
            let read = self.scripts.get(&mut conn, &key);
            let Ok(Ok(state)) = tokio::time::timeout(self.response_timeout, read).await else {
                break;
            };
            if let Some(state) = state.filter(|s| s.is_cancelled()) {
                let until = deadline_after(started, state.remaining());
                status.send_modify(|s| s.caught_up += 1);
                self.scopes.cancel_contained(&id, Some(until));
            }
        }
    }
}
