//! What every child of a scope is: its spec (name, [`Effect`]) and the record an unknown
//! effect is reported with. Stored by every tree record (a ticket, a quarantined child), below
//! the scope layer.

use std::fmt;
use std::sync::Arc;

/// What running a child may do to the world outside this process.
///
/// Decides what happens when a child is dropped without a receipt: read-only work is recorded
/// as [`Receipt::Cancelled`](crate::Receipt::Cancelled); anything else that was dispatched
/// as [`Receipt::EffectUnknown`](crate::Receipt::EffectUnknown) — an unknown effect is never
/// counted as "no effect".
///
/// # Examples
///
/// ```
/// use cancel_scope::Effect;
/// assert!(!Effect::ReadOnly.may_have_effect());
/// assert!(Effect::idempotent("order-42").may_have_effect());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Effect {
    /// Reads only; safe to drop and to retry.
    ReadOnly,
    /// Has an effect, but repeating it with the same key has the same effect once.
    Idempotent {
        /// The idempotency key every attempt reuses.
        key: Arc<str>,
    },
    /// Has an effect and must not be repeated blindly.
    SideEffecting,
}

impl Effect {
    /// An idempotent effect with its key.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Effect;
    /// assert_eq!(Effect::idempotent("k").key(), Some("k"));
    /// ```
    pub fn idempotent(key: impl Into<Arc<str>>) -> Self {
        Effect::Idempotent { key: key.into() }
    }

    /// The idempotency key, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Effect;
    /// assert_eq!(Effect::ReadOnly.key(), None);
    /// ```
    pub fn key(&self) -> Option<&str> {
        match self {
            Effect::Idempotent { key } => Some(key),
            _ => None,
        }
    }

    /// Whether the work may change something outside the process.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Effect;
    /// assert!(Effect::SideEffecting.may_have_effect());
    /// ```
    pub fn may_have_effect(&self) -> bool {
        !matches!(self, Effect::ReadOnly)
    }
}

/// Identifies an effect whose outcome is unknown, for reconciliation.
///
/// Besides the effect's id, a record carries what is known of the attempt: a digest of what was
/// sent, the handle the provider gave it, the status the other side answered (an outgoing call
/// that got an error it cannot tell was a refusal: `HTTP 503`, `gRPC UNAVAILABLE`), and where a
/// redirect took the call (its effect may have happened at the first address or there).
///
/// # Examples
///
/// ```
/// use cancel_scope::EffectRecord;
/// let r = EffectRecord::new("payment-7").payload_digest("sha256:ab12").provider_handle("psp-99");
/// assert_eq!(r.effect_id(), "payment-7");
/// assert_eq!(r.provider_handle_str(), Some("psp-99"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EffectRecord {
    effect_id: Arc<str>,
    payload_digest: Option<Arc<str>>,
    provider_handle: Option<Arc<str>>,
    status: Option<Arc<str>>,
    redirected_to: Option<Arc<str>>,
}

impl EffectRecord {
    /// A record with its effect id.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("e1").effect_id(), "e1");
    /// ```
    pub fn new(effect_id: impl Into<Arc<str>>) -> Self {
        EffectRecord {
            effect_id: effect_id.into(),
            payload_digest: None,
            provider_handle: None,
            status: None,
            redirected_to: None,
        }
    }

    /// With a digest of what was sent.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("e").payload_digest("d").payload_digest_str(), Some("d"));
    /// ```
    pub fn payload_digest(mut self, digest: impl Into<Arc<str>>) -> Self {
        self.payload_digest = Some(digest.into());
        self
    }

    /// With the handle the provider gave the effect (request id, transaction id).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("e").provider_handle("h").provider_handle_str(), Some("h"));
    /// ```
    pub fn provider_handle(mut self, handle: impl Into<Arc<str>>) -> Self {
        self.provider_handle = Some(handle.into());
        self
    }

    /// The effect id.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("x").effect_id(), "x");
    /// ```
    pub fn effect_id(&self) -> &str {
        &self.effect_id
    }

    /// With the status the other side answered (`HTTP 503`, `gRPC UNAVAILABLE`): an answer
    /// that does not say whether the effect happened.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("e").status("HTTP 503").status_str(), Some("HTTP 503"));
    /// ```
    pub fn status(mut self, status: impl Into<Arc<str>>) -> Self {
        self.status = Some(status.into());
        self
    }

    /// With the address a redirect took the call to: its effect may have happened at the first
    /// address or at this one.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// let r = EffectRecord::new("e").redirected_to("http://127.0.0.1:8081/orders");
    /// assert_eq!(r.redirected_to_str(), Some("http://127.0.0.1:8081/orders"));
    /// ```
    pub fn redirected_to(mut self, to: impl Into<Arc<str>>) -> Self {
        self.redirected_to = Some(to.into());
        self
    }

    /// Takes from `other`, a record of the same effect, what this one does not know.
    pub(crate) fn absorb(&mut self, other: &EffectRecord) {
        for (mine, theirs) in self.details_mut().into_iter().zip(other.details()) {
            if mine.is_none() {
                mine.clone_from(theirs);
            }
        }
    }

    /// What the record knows besides the effect id, field by field (`absorb` and the report's
    /// merging of records go through the same list).
    pub(crate) fn details(&self) -> [&Option<Arc<str>>; 4] {
        [
            &self.payload_digest,
            &self.provider_handle,
            &self.status,
            &self.redirected_to,
        ]
    }

    fn details_mut(&mut self) -> [&mut Option<Arc<str>>; 4] {
        [
            &mut self.payload_digest,
            &mut self.provider_handle,
            &mut self.status,
            &mut self.redirected_to,
        ]
    }

    /// The payload digest, if known.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("x").payload_digest_str(), None);
    /// ```
    pub fn payload_digest_str(&self) -> Option<&str> {
        self.payload_digest.as_deref()
    }

    /// The provider handle, if known.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("x").provider_handle_str(), None);
    /// ```
    pub fn provider_handle_str(&self) -> Option<&str> {
        self.provider_handle.as_deref()
    }

    /// The status the other side answered, if known.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("x").status_str(), None);
    /// ```
    pub fn status_str(&self) -> Option<&str> {
        self.status.as_deref()
    }

    /// Where a redirect took the call, if it was redirected.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::EffectRecord;
    /// assert_eq!(EffectRecord::new("x").redirected_to_str(), None);
    /// ```
    pub fn redirected_to_str(&self) -> Option<&str> {
        self.redirected_to.as_deref()
    }
}

/// Describes a child before it is registered: its name and its [`Effect`].
///
/// # Examples
///
/// ```
/// use cancel_scope::{ChildSpec, Effect};
/// let spec = ChildSpec::side_effecting("charge-card", "payment-7").payload_digest("sha256:ab");
/// assert_eq!(spec.name(), "charge-card");
/// assert_eq!(spec.effect(), &Effect::SideEffecting);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildSpec {
    name: Name,
    effect: Effect,
    record: Option<EffectRecord>,
}

impl ChildSpec {
    /// Read-only work.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::ChildSpec;
    /// assert!(!ChildSpec::read_only("get-user").effect().may_have_effect());
    /// ```
    pub fn read_only(name: impl Into<Arc<str>>) -> Self {
        ChildSpec {
            name: Name::Shared(name.into()),
            effect: Effect::ReadOnly,
            record: None,
        }
    }

    /// Idempotent work; `key` is reused by every attempt and names the effect.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::ChildSpec;
    /// let s = ChildSpec::idempotent("put-order", "order-42");
    /// assert_eq!(s.effect().key(), Some("order-42"));
    /// ```
    pub fn idempotent(name: impl Into<Arc<str>>, key: impl Into<Arc<str>>) -> Self {
        let key: Arc<str> = key.into();
        ChildSpec {
            name: Name::Shared(name.into()),
            effect: Effect::Idempotent { key: key.clone() },
            record: Some(EffectRecord::new(key)),
        }
    }

    /// Side-effecting work with the id its effect is known by.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::ChildSpec;
    /// let s = ChildSpec::side_effecting("send-mail", "mail-1");
    /// assert_eq!(s.effect_record().unwrap().effect_id(), "mail-1");
    /// ```
    pub fn side_effecting(name: impl Into<Arc<str>>, effect_id: impl Into<Arc<str>>) -> Self {
        ChildSpec {
            name: Name::Shared(name.into()),
            effect: Effect::SideEffecting,
            record: Some(EffectRecord::new(effect_id)),
        }
    }

    /// Adds a payload digest to the effect record (no effect on read-only work).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::ChildSpec;
    /// let s = ChildSpec::side_effecting("w", "e").payload_digest("d");
    /// assert_eq!(s.effect_record().unwrap().payload_digest_str(), Some("d"));
    /// ```
    pub fn payload_digest(mut self, digest: impl Into<Arc<str>>) -> Self {
        self.record = self.record.map(|r| r.payload_digest(digest));
        self
    }

    /// The child's name.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::ChildSpec;
    /// assert_eq!(ChildSpec::read_only("n").name(), "n");
    /// ```
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The name as a shared string: a clone, unless the name is static (then allocated).
    pub(crate) fn shared_name(&self) -> Arc<str> {
        match &self.name {
            Name::Static(s) => Arc::from(*s),
            Name::Shared(s) => s.clone(),
        }
    }

    /// Read-only work with a name that costs nothing to clone (the crate's own tasks).
    pub(crate) const fn read_only_static(name: &'static str) -> Self {
        ChildSpec {
            name: Name::Static(name),
            effect: Effect::ReadOnly,
            record: None,
        }
    }

    /// The child's effect kind.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::{ChildSpec, Effect};
    /// assert_eq!(ChildSpec::read_only("n").effect(), &Effect::ReadOnly);
    /// ```
    pub fn effect(&self) -> &Effect {
        &self.effect
    }

    /// The record an unknown outcome is reported with (`None` for read-only work).
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::ChildSpec;
    /// assert!(ChildSpec::read_only("n").effect_record().is_none());
    /// ```
    pub fn effect_record(&self) -> Option<&EffectRecord> {
        self.record.as_ref()
    }

    /// Replaces the effect record (what a receipt that knows more lists, see `listed_by`).
    pub(crate) fn set_effect_record(&mut self, record: EffectRecord) {
        self.record = Some(record);
    }

    pub(crate) fn set_provider_handle(&mut self, handle: Arc<str>) {
        self.record = self.record.take().map(|r| r.provider_handle(handle));
    }
}

/// The spec every spawned task is listed with (and recorded with, if quarantined).
pub(crate) fn task_spec() -> ChildSpec {
    ChildSpec::read_only_static("task")
}

/// A child's name: static for the crate's own children (no reference count to touch on the
/// spawn path), shared otherwise.
#[derive(Clone)]
enum Name {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Name {
    fn as_str(&self) -> &str {
        match self {
            Name::Static(s) => s,
            Name::Shared(s) => s,
        }
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
