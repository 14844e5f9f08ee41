//! The operation registry on Redis: one operation's remaining time and generation shared by
//! every process that points at the same Redis, and its cancels announced on pub/sub.
//!
//! # The store
//!
//! | what | where |
//! |---|---|
//! | one operation | a hash at `{prefix}op:{id}` with fields `gen` and `closed`, and a `PX` expiry of the operation's budget |
//! | remaining time | the key's `PTTL`: the store's clock, never compared with another machine's wall clock |
//! | begin | a Lua script: create if absent (`HSET` + `PEXPIRE`), else read — one atomic step |
//! | cancel | a Lua script: `HINCRBY gen` and set `closed` unless closed already (the key keeps its expiry), then `PUBLISH {prefix}cancels "{gen} {pttl} {id}"` — one atomic step |
//!
//! # Cancels across processes
//!
//! * **Fast path: pub/sub.** Every registry (unless built with
//!   [`listen(false)`](RedisRegistryBuilder::listen)) runs a listener subscribed to
//!   `{prefix}cancels`; an announcement cancels this process's scopes of that operation (its
//!   [`LocalScopes`]) and is remembered there, so the operation's later requests are
//!   refused without a round trip.
//! * **Correctness: the generation check.** A pub/sub message can be lost (the listener was
//!   disconnected). Every hop reads the operation at admission
//!   ([`Operations::join`](crate::registry::Operations::join)), so a request of a cancelled
//!   operation, or of an older generation, is refused at its next hop, and that read cancels
//!   the hop's local stragglers too.
//! * **Catching up.** After every (re)subscription the listener reads each operation that
//!   has live scopes here and cancels those the store says are cancelled: a cancel announced
//!   while it was disconnected still stops the scopes it would have stopped.
//!
//! # Faults
//!
//! Every call is bounded (the connection's response timeout here, and the caller's bound in
//! [`Operations`](crate::registry::Operations)); an unreachable or slow Redis is a fault
//! ([`RegistryError::is_fault`]): admission goes on with the endpoint's cap. The connection
//! ([`redis::aio::ConnectionManager`]) reconnects by itself.
//!
//! # Examples
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cancel_scope::integrations::redis::RedisRegistry;
//! use cancel_scope::registry::{Join, OperationId, Operations};
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let registry = RedisRegistry::builder(client).prefix("checkout:").connect().await?;
//! let ops = Operations::new(Arc::new(registry)).timeout(Duration::from_millis(20));
//!
//! let id = OperationId::random();
//! let joined = ops.join(Join::new(id.clone(), Duration::from_secs(2)).create(true)).await?;
//! // ... another process joins `id` and gets what is left; a cancel here stops its scopes.
//! ops.cancel(&id).await?;
//! # let _ = joined; Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Client;
use tokio::sync::watch;
use tokio::time::Instant;

mod listener;
mod scripts;

pub use listener::ListenerStatus;

use crate::registry::{
    Begun, BoxFuture, CancelOutcome, LocalScopes, OperationId, OperationRegistry, OperationState,
    RegistryError, MAX_LIFETIME, MIN_BUDGET,
};
use crate::time::deadline_after;
use listener::{Listener, Running};
use scripts::{Keys, Scripts};

/// The default key prefix.
///
/// # Examples
///
/// ```
/// use cancel_scope::integrations::redis::DEFAULT_PREFIX;
/// assert_eq!(DEFAULT_PREFIX, "cancel-scope:");
/// ```
pub const DEFAULT_PREFIX: &str = "cancel-scope:";

/// An [`OperationRegistry`] on Redis (see the [module docs](self)).
///
/// Made by [`RedisRegistry::builder`]. Dropping it stops its listener.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use cancel_scope::integrations::redis::RedisRegistry;
/// use cancel_scope::registry::{OperationId, OperationRegistry};
///
/// let registry = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
///     .connect()
///     .await?;
/// let id = OperationId::new("op-1")?;
/// registry.begin(&id, Duration::from_secs(1)).await?;
/// let state = registry.get(&id).await?.unwrap();
/// assert!(state.remaining() <= Duration::from_secs(1));
/// # Ok(()) }
/// ```
pub struct RedisRegistry {
    conn: ConnectionManager,
    keys: Keys,
    scripts: Arc<Scripts>,
    scopes: LocalScopes,
    announce: bool,
    listener: Option<Running>,
}

/// Settings of a [`RedisRegistry`], then [`connect`](Self::connect).
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use cancel_scope::integrations::redis::RedisRegistry;
///
/// let registry = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
///     .prefix("orders:")
///     .connect_timeout(Duration::from_millis(500))
///     .response_timeout(Duration::from_millis(200))
///     .connect()
///     .await?;
/// # let _ = registry; Ok(()) }
/// ```
#[must_use = "a builder does nothing until `connect` is called"]
pub struct RedisRegistryBuilder {
    client: Client,
    prefix: String,
    announce: bool,
    listen: bool,
    connect_timeout: Duration,
    response_timeout: Duration,
    reconnect_min: Duration,
    reconnect_max: Duration,
    scopes: LocalScopes,
}

impl RedisRegistry {
    /// Starts building a registry on `client`'s Redis, with the prefix [`DEFAULT_PREFIX`],
    /// announcing and listening to cancels, 1 s to connect and 1 s for a reply.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let registry = RedisRegistry::builder(client).connect().await?;
    /// # let _ = registry; Ok(()) }
    /// ```
    pub fn builder(client: Client) -> RedisRegistryBuilder {
        RedisRegistryBuilder {
            client,
            prefix: DEFAULT_PREFIX.to_owned(),
            announce: true,
            listen: true,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            scopes: LocalScopes::new(),
        }
    }

    /// The listener's status, or `None` if it was built with
    /// [`listen(false)`](RedisRegistryBuilder::listen).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let registry = RedisRegistry::builder(client).connect().await?;
    /// assert!(registry.listener().is_some());
    /// # Ok(()) }
    /// ```
    pub fn listener(&self) -> Option<ListenerStatus> {
        self.listener.as_ref().map(|l| *l.status.borrow())
    }

    /// Waits until the listener's status satisfies `until` (for health checks: e.g. until it
    /// is subscribed) and returns it; `None` at once if there is no listener.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let registry = RedisRegistry::builder(client).connect().await?;
    /// registry.listener_until(|s| s.is_connected()).await;
    /// # Ok(()) }
    /// ```
    pub async fn listener_until(
        &self,
        mut until: impl FnMut(&ListenerStatus) -> bool,
    ) -> Option<ListenerStatus> {
        let mut status: watch::Receiver<ListenerStatus> = self.listener.as_ref()?.status.clone();
        let seen = status.wait_for(|s| until(s)).await.ok()?;
        Some(*seen)
    }

    async fn begin_in_store(
        &self,
        id: &OperationId,
        budget: Duration,
    ) -> Result<Begun, RegistryError> {
        if budget < MIN_BUDGET {
            return Err(RegistryError::invalid(
                "an operation cannot begin with less than 1 ms",
            ));
        }
        // Whole milliseconds, rounded down: never longer than the budget.
        let ttl_ms = u64::try_from(budget.min(MAX_LIFETIME).as_millis()).unwrap_or(u64::MAX);
        let mut conn = self.conn.clone();
        let key = self.keys.operation(id);
        self.scripts.begin(&mut conn, &key, ttl_ms).await
    }

    async fn get_in_store(
        &self,
        id: &OperationId,
    ) -> Result<Option<OperationState>, RegistryError> {
        let mut conn = self.conn.clone();
        self.scripts.get(&mut conn, &self.keys.operation(id)).await
    }

    async fn cancel_in_store(&self, id: &OperationId) -> Result<CancelOutcome, RegistryError> {
        let started = Instant::now();
        let mut conn = self.conn.clone();
        let out = self
            .scripts
            .cancel(&mut conn, &self.keys, id, self.announce)
            .await?;
        Ok(match out {
            None => CancelOutcome::Unknown,
            Some((state, was_cancelled)) => {
                // Now the deadline is known: the record of the cancel lasts as long.
                self.scopes
                    .cancel(id, Some(deadline_after(started, state.remaining())));
                if was_cancelled {
                    CancelOutcome::AlreadyCancelled(state)
                } else {
                    CancelOutcome::Cancelled(state)
                }
            }
        })
    }
}

impl RedisRegistryBuilder {
    /// Puts every key under `prefix` (default [`DEFAULT_PREFIX`]; at most 64 printable ASCII
    /// characters, no spaces): registries share operations only under the same prefix.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let builder = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .prefix("tenant-7:");
    /// # let _ = builder; Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> RedisRegistryBuilder {
        self.prefix = prefix.into();
        self
    }

    /// Whether cancels are announced on pub/sub (default `true`). Without, other processes
    /// learn of a cancel only at their next read of the operation (the generation check at
    /// admission, or their listener's catching up).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let quiet = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .announce(false);
    /// # let _ = quiet; Ok(()) }
    /// ```
    pub fn announce(mut self, announce: bool) -> RedisRegistryBuilder {
        self.announce = announce;
        self
    }

    /// Whether this registry listens to the cancels other processes announce (default
    /// `true`). Without, this process's scopes of an operation cancelled elsewhere run on until
    /// their own deadline or their next hop's refusal.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let deaf = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .listen(false);
    /// # let _ = deaf; Ok(()) }
    /// ```
    pub fn listen(mut self, listen: bool) -> RedisRegistryBuilder {
        self.listen = listen;
        self
    }

    /// The most a connection attempt (and a subscription) may take (default 1 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let b = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .connect_timeout(Duration::from_millis(300));
    /// # let _ = b; Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> RedisRegistryBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// The most a reply may take (default 1 s); callers bound their calls further
    /// ([`Operations::timeout`](crate::registry::Operations::timeout)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let b = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .response_timeout(Duration::from_millis(100));
    /// # let _ = b; Ok(()) }
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> RedisRegistryBuilder {
        self.response_timeout = timeout;
        self
    }

    /// How long the listener waits before it subscribes again after losing its connection:
    /// `min` first, doubling up to `max` while it keeps failing (defaults 50 ms and 2 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let b = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .reconnect_delay(Duration::from_millis(10), Duration::from_secs(1));
    /// # let _ = b; Ok(()) }
    /// ```
    pub fn reconnect_delay(mut self, min: Duration, max: Duration) -> RedisRegistryBuilder {
        self.reconnect_min = min;
        self.reconnect_max = max.max(min);
        self
    }

    /// Uses `scopes` as this process's index of scopes per operation (to set its bounds).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// use cancel_scope::registry::LocalScopes;
    /// let b = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .scopes(LocalScopes::new().max_closed(1000));
    /// # let _ = b; Ok(()) }
    /// ```
    pub fn scopes(mut self, scopes: LocalScopes) -> RedisRegistryBuilder {
        self.scopes = scopes;
        self
    }

    /// Connects (waiting at most the connect timeout) and starts the listener on the current
    /// tokio runtime.
    ///
    /// # Errors
    ///
    /// [`RegistryError::is_invalid`] for a bad prefix; a fault if Redis cannot be reached.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use cancel_scope::integrations::redis::RedisRegistry;
    /// let registry = RedisRegistry::builder(redis::Client::open("redis://127.0.0.1/")?)
    ///     .connect()
    ///     .await?;
    /// # let _ = registry; Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisRegistry, RegistryError> {
        let keys = Keys::new(&self.prefix)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_min_delay(self.reconnect_min)
            .set_max_delay(self.reconnect_max);
        let connect = ConnectionManager::new_with_config(self.client.clone(), config);
        let conn = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| RegistryError::timeout(self.connect_timeout))?
            .map_err(|e| scripts::fault(e, self.response_timeout))?;
        let scripts = Arc::new(Scripts::new(self.response_timeout));
        let listener = self.listen.then(|| {
            Listener {
                client: self.client,
                conn: conn.clone(),
                keys: keys.clone(),
                scripts: scripts.clone(),
                scopes: self.scopes.clone(),
                connect_timeout: self.connect_timeout,
                response_timeout: self.response_timeout,
                min_delay: self.reconnect_min,
                max_delay: self.reconnect_max,
            }
            .spawn()
        });
        Ok(RedisRegistry {
            conn,
            keys,
            scripts,
            scopes: self.scopes,
            announce: self.announce,
            listener,
        })
    }
}

impl OperationRegistry for RedisRegistry {
    fn begin<'a>(
        &'a self,
        id: &'a OperationId,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Begun, RegistryError>> {
        Box::pin(self.begin_in_store(id, budget))
    }

    fn get<'a>(
        &'a self,
        id: &'a OperationId,
    ) -> BoxFuture<'a, Result<Option<OperationState>, RegistryError>> {
        Box::pin(self.get_in_store(id))
    }

    fn cancel<'a>(
        &'a self,
        id: &'a OperationId,
    ) -> BoxFuture<'a, Result<CancelOutcome, RegistryError>> {
        // This process's scopes first, at the call: they stop even if Redis does not answer.
        self.scopes.cancel(id, None);
        Box::pin(self.cancel_in_store(id))
    }

    fn scopes(&self) -> &LocalScopes {
        &self.scopes
    }
}

impl fmt::Debug for RedisRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRegistry")
            .field("keys", &self.keys)
            .field("announce", &self.announce)
            .field("listener", &self.listener())
            .field("scopes", &self.scopes)
            .finish()
    }
}

impl fmt::Debug for RedisRegistryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRegistryBuilder")
            .field("prefix", &self.prefix)
            .field("announce", &self.announce)
            .field("listen", &self.listen)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}
