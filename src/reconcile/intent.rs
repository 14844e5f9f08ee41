//! The intent record: what a possibly-effectful call was about to do, written before it was
//! sent.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use super::error::IntentError;
use crate::spec::{ChildSpec, Effect};

/// The longest effect id, name, payload digest, provider handle or operation id an intent
/// holds, in bytes.
///
/// # Examples
///
/// ```
/// use cancel_scope::reconcile::{EffectClass, Intent, MAX_FIELD_LEN};
/// let long = "x".repeat(MAX_FIELD_LEN + 1);
/// assert!(Intent::new(long, "n", EffectClass::Idempotent).validate().is_err());
/// ```
pub const MAX_FIELD_LEN: usize = 1024;

/// The classes of effect an intent can be recorded for (read-only work has none).
///
/// # Examples
///
/// ```
/// use cancel_scope::reconcile::EffectClass;
/// assert_eq!(EffectClass::SideEffecting.as_str(), "side-effecting");
/// assert_eq!("idempotent".parse().ok(), Some(EffectClass::Idempotent));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EffectClass {
    /// [`Effect::Idempotent`]: repeating it with the same key has the same effect once.
    Idempotent,
    /// [`Effect::SideEffecting`]: must not be repeated blindly.
    SideEffecting,
}

impl EffectClass {
    /// The class of `effect`, if it may have one.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Effect;
    /// use cancel_scope::reconcile::EffectClass;
    /// assert_eq!(EffectClass::of(&Effect::ReadOnly), None);
    /// assert_eq!(EffectClass::of(&Effect::SideEffecting), Some(EffectClass::SideEffecting));
    /// ```
    pub fn of(effect: &Effect) -> Option<EffectClass> {
        match effect {
            Effect::Idempotent { .. } => Some(EffectClass::Idempotent),
            Effect::SideEffecting => Some(EffectClass::SideEffecting),
            _ => None,
        }
    }

    /// Its name in a store: `idempotent` or `side-effecting`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::EffectClass;
    /// assert_eq!(EffectClass::Idempotent.as_str(), "idempotent");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            EffectClass::Idempotent => "idempotent",
            EffectClass::SideEffecting => "side-effecting",
        }
    }
}

impl std::str::FromStr for EffectClass {
    type Err = IntentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "idempotent" => Ok(EffectClass::Idempotent),
            "side-effecting" => Ok(EffectClass::SideEffecting),
            _ => Err(IntentError::invalid("unknown effect class")),
        }
    }
}

/// How an intent was resolved: whether its effect happened.
///
/// # Examples
///
/// ```
/// use cancel_scope::reconcile::Resolution;
/// assert_eq!(Resolution::NotApplied.as_str(), "not-applied");
/// assert_eq!("applied".parse().ok(), Some(Resolution::Applied));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resolution {
    /// The effect happened (the call succeeded, or the provider confirms it).
    Applied,
    /// The effect did not happen (the call was refused unprocessed, never sent, or the
    /// provider has no trace of it).
    NotApplied,
}

impl Resolution {
    /// Its name in a store: `applied` or `not-applied`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::Resolution;
    /// assert_eq!(Resolution::Applied.as_str(), "applied");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Resolution::Applied => "applied",
            Resolution::NotApplied => "not-applied",
        }
    }
}

impl std::str::FromStr for Resolution {
    type Err = IntentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "applied" => Ok(Resolution::Applied),
            "not-applied" => Ok(Resolution::NotApplied),
            _ => Err(IntentError::invalid("unknown resolution")),
        }
    }
}

/// What a resolve did.
///
/// # Examples
///
/// ```
/// use cancel_scope::reconcile::{Resolution, Resolved};
/// assert!(Resolved::Now.is_now());
/// assert!(!Resolved::Already(Resolution::Applied).is_now());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolved {
    /// This call resolved the intent.
    Now,
    /// It was resolved before, as this says; nothing changed.
    Already(Resolution),
    /// No intent with that effect id.
    Unknown,
}

impl Resolved {
    /// Whether this call resolved it.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::Resolved;
    /// assert!(!Resolved::Unknown.is_now());
    /// ```
    pub fn is_now(&self) -> bool {
        matches!(self, Resolved::Now)
    }
}

/// What a possibly-effectful call is about to do, recorded before it is dispatched so that a
/// process killed after sending it leaves a trace: the effect id (the store's key), the
/// child's name, its [`EffectClass`], the payload digest, the provider's handle once known,
/// and the operation it belongs to.
///
/// # Examples
///
/// ```
/// use cancel_scope::ChildSpec;
/// use cancel_scope::reconcile::{EffectClass, Intent};
///
/// let spec = ChildSpec::side_effecting("charge-card", "payment-7").payload_digest("sha256:ab12");
/// let intent = Intent::of(&spec, Some("checkout-7f3a")).unwrap();
/// assert_eq!(intent.effect_id(), "payment-7");
/// assert_eq!(intent.class(), EffectClass::SideEffecting);
/// assert_eq!(intent.operation_id(), Some("checkout-7f3a"));
/// assert!(Intent::of(&ChildSpec::read_only("lookup"), None).is_none());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Intent {
    effect_id: Arc<str>,
    name: Arc<str>,
    class: EffectClass,
    payload_digest: Option<Arc<str>>,
    provider_handle: Option<Arc<str>>,
    operation_id: Option<Arc<str>>,
}

impl Intent {
    /// An intent for effect `effect_id` of class `class`, made by a child named `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// let i = Intent::new("mail-1", "send-mail", EffectClass::SideEffecting);
    /// assert_eq!(i.name(), "send-mail");
    /// ```
    pub fn new(
        effect_id: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        class: EffectClass,
    ) -> Intent {
        Intent {
            effect_id: effect_id.into(),
            name: name.into(),
            class,
            payload_digest: None,
            provider_handle: None,
            operation_id: None,
        }
    }

    /// The intent of a child registered with `spec` under `operation`: `None` for read-only
    /// work.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::ChildSpec;
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// let i = Intent::of(&ChildSpec::idempotent("put-order", "order-42"), None).unwrap();
    /// assert_eq!((i.effect_id(), i.class()), ("order-42", EffectClass::Idempotent));
    /// ```
    pub fn of(spec: &ChildSpec, operation: Option<&str>) -> Option<Intent> {
        let class = EffectClass::of(spec.effect())?;
        let record = spec.effect_record()?;
        let mut intent = Intent::new(record.effect_id(), spec.name(), class);
        intent.payload_digest = record.payload_digest_str().map(Arc::from);
        intent.provider_handle = record.provider_handle_str().map(Arc::from);
        intent.operation_id = operation.map(Arc::from);
        Some(intent)
    }

    /// With a digest of what is sent.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// let i = Intent::new("e", "n", EffectClass::SideEffecting).payload_digest("d");
    /// assert_eq!(i.payload_digest_str(), Some("d"));
    /// ```
    pub fn payload_digest(mut self, digest: impl Into<Arc<str>>) -> Intent {
        self.payload_digest = Some(digest.into());
        self
    }

    /// With the provider's handle for the effect.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// let i = Intent::new("e", "n", EffectClass::SideEffecting).provider_handle("psp-9");
    /// assert_eq!(i.provider_handle_str(), Some("psp-9"));
    /// ```
    pub fn provider_handle(mut self, handle: impl Into<Arc<str>>) -> Intent {
        self.provider_handle = Some(handle.into());
        self
    }

    /// With the operation it belongs to.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// let i = Intent::new("e", "n", EffectClass::SideEffecting).operation("op-1");
    /// assert_eq!(i.operation_id(), Some("op-1"));
    /// ```
    pub fn operation(mut self, id: impl Into<Arc<str>>) -> Intent {
        self.operation_id = Some(id.into());
        self
    }

    /// The effect id: the key the store is idempotent by.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// assert_eq!(Intent::new("e", "n", EffectClass::SideEffecting).effect_id(), "e");
    /// ```
    pub fn effect_id(&self) -> &str {
        &self.effect_id
    }

    /// The name of the child that makes the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// assert_eq!(Intent::new("e", "n", EffectClass::SideEffecting).name(), "n");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The class of effect.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// let i = Intent::new("e", "n", EffectClass::Idempotent);
    /// assert_eq!(i.class(), EffectClass::Idempotent);
    /// ```
    pub fn class(&self) -> EffectClass {
        self.class
    }

    /// The payload digest, if given.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// assert_eq!(Intent::new("e", "n", EffectClass::Idempotent).payload_digest_str(), None);
    /// ```
    pub fn payload_digest_str(&self) -> Option<&str> {
        self.payload_digest.as_deref()
    }

    /// The provider's handle, if known.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// assert_eq!(Intent::new("e", "n", EffectClass::Idempotent).provider_handle_str(), None);
    /// ```
    pub fn provider_handle_str(&self) -> Option<&str> {
        self.provider_handle.as_deref()
    }

    /// The operation id, if given.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// assert_eq!(Intent::new("e", "n", EffectClass::Idempotent).operation_id(), None);
    /// ```
    pub fn operation_id(&self) -> Option<&str> {
        self.operation_id.as_deref()
    }

    /// Checks that every field fits a store: the effect id and name not empty, and nothing
    /// longer than [`MAX_FIELD_LEN`] bytes.
    ///
    /// # Errors
    ///
    /// [`IntentError::is_invalid`] otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::reconcile::{EffectClass, Intent};
    /// assert!(Intent::new("", "n", EffectClass::Idempotent).validate().unwrap_err().is_invalid());
    /// assert!(Intent::new("e", "n", EffectClass::Idempotent).validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), IntentError> {
        if self.effect_id.is_empty() || self.name.is_empty() {
            return Err(IntentError::invalid(
                "an intent needs an effect id and a name",
            ));
        }
        check_len(&self.effect_id)?;
        check_len(&self.name)?;
        for field in [
            &self.payload_digest,
            &self.provider_handle,
            &self.operation_id,
        ]
        .into_iter()
        .flatten()
        {
            check_len(field)?;
        }
        Ok(())
    }
}

/// Checks a field given on its own (an effect id to resolve, a provider handle).
pub(crate) fn check_len(field: &str) -> Result<(), IntentError> {
    if field.len() > MAX_FIELD_LEN {
        return Err(IntentError::invalid(
            "an intent field is longer than 1024 bytes",
        ));
    }
    Ok(())
}

impl fmt::Debug for Intent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intent")
            .field("effect_id", &self.effect_id)
            .field("name", &self.name)
            .field("class", &self.class)
            .field("payload_digest", &self.payload_digest)
            .field("provider_handle", &self.provider_handle)
            .field("operation_id", &self.operation_id)
            .finish()
    }
}

/// An intent as a store holds it: when it was recorded (by the store's clock), how many times
/// (an idempotent effect's every attempt records it again), and how it was resolved.
///
/// # Examples
///
/// ```
/// use std::time::SystemTime;
/// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord};
/// let r = IntentRecord::new(Intent::new("e", "n", EffectClass::Idempotent), SystemTime::now(), 1, None);
/// assert!(r.is_pending());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntentRecord {
    intent: Intent,
    recorded_at: SystemTime,
    attempts: u32,
    resolution: Option<(Resolution, SystemTime)>,
}

impl IntentRecord {
    /// A stored intent (for implementations of [`IntentStore`](super::IntentStore)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord, Resolution};
    /// let now = SystemTime::now();
    /// let r = IntentRecord::new(
    ///     Intent::new("e", "n", EffectClass::Idempotent), now, 2, Some((Resolution::Applied, now)),
    /// );
    /// assert_eq!(r.resolution(), Some(Resolution::Applied));
    /// ```
    pub fn new(
        intent: Intent,
        recorded_at: SystemTime,
        attempts: u32,
        resolution: Option<(Resolution, SystemTime)>,
    ) -> IntentRecord {
        IntentRecord {
            intent,
            recorded_at,
            attempts,
            resolution,
        }
    }

    /// The intent.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord};
    /// let i = Intent::new("e", "n", EffectClass::Idempotent);
    /// assert_eq!(IntentRecord::new(i.clone(), SystemTime::now(), 1, None).intent(), &i);
    /// ```
    pub fn intent(&self) -> &Intent {
        &self.intent
    }

    /// When the store recorded it first (wall clock: for audits and the reconciler's "older
    /// than", never for budgets).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord};
    /// let at = SystemTime::UNIX_EPOCH;
    /// let r = IntentRecord::new(Intent::new("e", "n", EffectClass::Idempotent), at, 1, None);
    /// assert_eq!(r.recorded_at(), at);
    /// ```
    pub fn recorded_at(&self) -> SystemTime {
        self.recorded_at
    }

    /// How many times it was recorded (dispatches of the same effect id).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord};
    /// let r = IntentRecord::new(Intent::new("e", "n", EffectClass::Idempotent), SystemTime::now(), 3, None);
    /// assert_eq!(r.attempts(), 3);
    /// ```
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How it was resolved, if it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord};
    /// let r = IntentRecord::new(Intent::new("e", "n", EffectClass::Idempotent), SystemTime::now(), 1, None);
    /// assert_eq!(r.resolution(), None);
    /// ```
    pub fn resolution(&self) -> Option<Resolution> {
        self.resolution.map(|(r, _)| r)
    }

    /// When it was resolved, if it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord};
    /// let r = IntentRecord::new(Intent::new("e", "n", EffectClass::Idempotent), SystemTime::now(), 1, None);
    /// assert_eq!(r.resolved_at(), None);
    /// ```
    pub fn resolved_at(&self) -> Option<SystemTime> {
        self.resolution.map(|(_, at)| at)
    }

    /// Whether it still waits for a resolution.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use cancel_scope::reconcile::{EffectClass, Intent, IntentRecord};
    /// let r = IntentRecord::new(Intent::new("e", "n", EffectClass::Idempotent), SystemTime::now(), 1, None);
    /// assert!(r.is_pending());
    /// ```
    pub fn is_pending(&self) -> bool {
        self.resolution.is_none()
    }
}
