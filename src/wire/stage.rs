//! Staged enforcement: which requests an enforcing policy enforces, by the class of their work
//! and by a fraction of operations; the others are shadowed.

/// What an incoming request does, as its server layer tells admission
/// ([`Incoming::class`](super::Incoming::class)): what staged enforcement
/// ([`EndpointPolicyBuilder::enforce_for`](crate::wire::EndpointPolicyBuilder::enforce_for)) goes by. A request
/// whose class is not given counts as [`SideEffecting`](RequestClass::SideEffecting), the last
/// to be enforced.
///
/// The tower layer takes it from the method, as the client integrations do for calls: `GET`,
/// `HEAD`, `OPTIONS`, `TRACE` read-only; `PUT`, `DELETE` or an `Idempotency-Key` header
/// idempotent; anything else (and gRPC) side-effecting.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::{Incoming, RequestClass};
/// let incoming = Incoming::new().class(RequestClass::ReadOnly);
/// # let _ = incoming;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestClass {
    /// Changes nothing.
    ReadOnly,
    /// Safe to repeat: the same effect once.
    Idempotent,
    /// May have any effect (also: not known).
    #[default]
    SideEffecting,
}

/// Which classes of requests an enforcing policy enforces (the rest are shadowed, see
/// [`Mode::Shadow`](super::Mode::Shadow)): the stages of a rollout, read-only work first.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::{RequestClass, Stage};
/// assert!(Stage::Idempotent.covers(RequestClass::ReadOnly));
/// assert!(!Stage::Idempotent.covers(RequestClass::SideEffecting));
/// assert!(Stage::All.covers(RequestClass::SideEffecting));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// Read-only requests only.
    ReadOnly,
    /// Read-only and idempotent requests.
    Idempotent,
    /// Every request (the default).
    #[default]
    All,
}

impl Stage {
    /// Whether a request of `class` is enforced at this stage.
    ///
    /// # Examples
    ///
    /// See [`Stage`].
    pub const fn covers(self, class: RequestClass) -> bool {
        match self {
            Stage::All => true,
            Stage::Idempotent => !matches!(class, RequestClass::SideEffecting),
            Stage::ReadOnly => matches!(class, RequestClass::ReadOnly),
        }
    }
}

/// The bucket, `0..100`, of an operation id for the enforced fraction
/// ([`EndpointPolicyBuilder::enforced_percent`](crate::wire::EndpointPolicyBuilder::enforced_percent)): the
/// FNV-1a 64-bit hash of the id's bytes (offset basis `0xcbf29ce484222325`, prime
/// `0x100000001b3`) modulo 100. An operation is enforced where its bucket is below the
/// percentage, so every operation enforced at 10 % is enforced at 50 %. The hash is fixed
/// here, not `std`'s `DefaultHasher` (whose output may change between Rust versions) nor a
/// randomly seeded one: every process and every version of this crate puts an operation in
/// the same bucket, so one operation is enforced or shadowed alike on every hop that runs it
/// under its id (a hop that does not trust its caller's operation id runs it under a fresh
/// one, decided afresh). The bucket comes from the operation id the hop settled on, never
/// from a bit the caller sends.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::fraction_bucket;
/// assert_eq!(u64::from(fraction_bucket("")), 0xcbf2_9ce4_8422_2325_u64 % 100);
/// assert_eq!(u64::from(fraction_bucket("a")), 0xaf63_dc4c_8601_ec8c_u64 % 100);
/// assert!(fraction_bucket("checkout-7f3a") < 100);
/// ```
pub fn fraction_bucket(operation_id: &str) -> u8 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in operation_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Below 100: fits.
    u8::try_from(hash % 100).unwrap_or(0)
}
