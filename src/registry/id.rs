//! Operation ids: validated once, shared cheaply, issued at random by the edge.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use super::error::RegistryError;

/// The longest operation id, in bytes (all ASCII, so also in characters): the limit of the
/// `service-budget` header's `op` member, so that every id the header can carry is an id the
/// registry can hold.
///
/// # Examples
///
/// ```
/// use cancel_scope::registry::{OperationId, MAX_ID_LEN};
/// assert!(OperationId::new("x".repeat(MAX_ID_LEN)).is_ok());
/// ```
pub const MAX_ID_LEN: usize = 128;

/// The id of an operation: 1 to [`MAX_ID_LEN`] printable ASCII characters (`0x20..=0x7E`).
///
/// Validated when it is made, so that a store never sees a control character, a byte that
/// would split a key or a pub/sub message, or an unbounded key. Cloning is cheap (the text is
/// shared). Compares and hashes as its text, and borrows as a `str` (a map keyed by
/// `OperationId` can be looked up with a `&str`).
///
/// # Examples
///
/// ```
/// use cancel_scope::registry::OperationId;
///
/// let id = OperationId::new("checkout-7f3a")?;
/// assert_eq!(id.as_str(), "checkout-7f3a");
/// assert!(OperationId::new("").unwrap_err().is_invalid());
/// assert!(OperationId::new("bad\nid").unwrap_err().is_invalid());
/// # Ok::<(), cancel_scope::registry::RegistryError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperationId(Arc<str>);

impl OperationId {
    /// Validates `id`.
    ///
    /// # Errors
    ///
    /// [`RegistryError::is_invalid`] if it is empty, longer than [`MAX_ID_LEN`] bytes, or has a
    /// character outside printable ASCII.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::{OperationId, MAX_ID_LEN};
    /// assert!(OperationId::new("a".repeat(MAX_ID_LEN)).is_ok());
    /// assert!(OperationId::new("a".repeat(MAX_ID_LEN + 1)).is_err());
    /// assert!(OperationId::new("ordre-é").is_err());
    /// ```
    pub fn new(id: impl AsRef<str>) -> Result<OperationId, RegistryError> {
        let id = id.as_ref();
        validate(id)?;
        Ok(OperationId(Arc::from(id)))
    }

    /// Validates a shared id without copying it.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use cancel_scope::registry::OperationId;
    /// let shared: Arc<str> = Arc::from("op-1");
    /// let id = OperationId::from_shared(shared.clone())?;
    /// assert_eq!(id.as_str(), &*shared);
    /// # Ok::<(), cancel_scope::registry::RegistryError>(())
    /// ```
    pub fn from_shared(id: Arc<str>) -> Result<OperationId, RegistryError> {
        validate(&id)?;
        Ok(OperationId(id))
    }

    /// Whether `id` is a valid operation id, without making one.
    #[cfg(feature = "tower")]
    pub(crate) fn check(id: &str) -> Result<(), RegistryError> {
        validate(id)
    }

    /// A fresh id of 128 random bits from the operating system's random source, as 32
    /// lowercase hex digits: what an edge issues to a new operation, so that nobody can guess
    /// another client's id (and cancel, or shorten, its operation).
    ///
    /// The bits are the operating system's own, read 256 ids' worth (4 KiB) at a time per
    /// thread (one `getrandom` call per that many ids: a call for one id's 16 bytes takes
    /// about half a microsecond, several times the rest of an id's cost) and used once each.
    /// A process that forks (without exec) after issuing ids shares what is left of the
    /// calling thread's pool with its child; tokio programs do not fork.
    ///
    /// # Panics
    ///
    /// If the operating system's random source fails (`getrandom`), which on the platforms
    /// tokio supports happens only when it is not available at all.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::OperationId;
    /// let a = OperationId::random();
    /// assert_eq!(a.as_str().len(), 32);
    /// assert_ne!(a, OperationId::random());
    /// ```
    pub fn random() -> OperationId {
        let bytes = random_bits();
        let mut hex = [0u8; 32];
        for (i, b) in bytes.into_iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        let hex = std::str::from_utf8(&hex).unwrap_or_else(|_| unreachable!("hex digits"));
        OperationId(Arc::from(hex))
    }

    /// The id's text.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::OperationId;
    /// assert_eq!(OperationId::new("op-1")?.as_str(), "op-1");
    /// # Ok::<(), cancel_scope::registry::RegistryError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's text, shared.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::registry::OperationId;
    /// let id = OperationId::new("op-1")?;
    /// assert_eq!(&**id.as_shared(), "op-1");
    /// # Ok::<(), cancel_scope::registry::RegistryError>(())
    /// ```
    pub fn as_shared(&self) -> &Arc<str> {
        &self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// How many ids' worth of random bits [`OperationId::random`] reads from the operating system
/// at a time, per thread.
const POOLED_IDS: usize = 256;

/// 128 bits from the operating system's random source, each used once: taken from this
/// thread's pool, refilled by one `getrandom` call when it is used up.
fn random_bits() -> [u8; 16] {
    use std::cell::RefCell;
    struct Pool {
        bytes: [u8; 16 * POOLED_IDS],
        /// Bytes used (and zeroed) from the start of `bytes`.
        used: usize,
    }
    thread_local! {
        static POOL: RefCell<Pool> = const {
            RefCell::new(Pool { bytes: [0; 16 * POOLED_IDS], used: 16 * POOLED_IDS })
        };
    }
    fn fill(bytes: &mut [u8]) {
        if let Err(e) = getrandom::getrandom(bytes) {
            panic!("the operating system's random source failed: {e}");
        }
    }
    POOL.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.used == pool.bytes.len() {
            fill(&mut pool.bytes);
            pool.used = 0;
        }
        let at = pool.used;
        let mut out = [0u8; 16];
        out.copy_from_slice(&pool.bytes[at..at + 16]);
        // Used once: not left in the pool.
        pool.bytes[at..at + 16].fill(0);
        pool.used = at + 16;
        out
    })
    // The thread is exiting (its thread-locals are being destroyed): straight from the source.
    .unwrap_or_else(|_| {
        let mut out = [0u8; 16];
        fill(&mut out);
        out
    })
}

fn validate(id: &str) -> Result<(), RegistryError> {
    if id.is_empty() {
        return Err(RegistryError::invalid("an operation id must not be empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(RegistryError::invalid(
            "an operation id must be at most 128 bytes",
        ));
    }
    if !id.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(RegistryError::invalid(
            "an operation id must be printable ASCII",
        ));
    }
    Ok(())
}

impl fmt::Debug for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for OperationId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for OperationId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for OperationId {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OperationId::new(s)
    }
}
