//! The `service-budget` header, version 1: this crate's budget envelope between services.
//!
//! `grpc-timeout` carries only a duration. Between our own services we also want the
//! operation the budget belongs to, the cancel generation it was cut from, and an audit trail,
//! so the budget travels as an [RFC 8941] Structured Field Values *Dictionary*:
//!
//! ```text
//! service-budget: v=1, rem=250, gen=3, op="checkout-7f3a", prio=2, dl=1767225600000
//! ```
//!
//! # Members
//!
//! | key | meaning | type and range | required |
//! |---|---|---|---|
//! | `v` | format version | Integer, must be `1` | yes |
//! | `rem` | remaining budget in milliseconds | Integer, `0..=86_400_000` (24 h, [`MAX_REMAINING`]) | yes |
//! | `gen` | cancel generation of the sender's scope | Integer, `0..=999_999_999_999_999` ([`MAX_INTEGER`]); absent means `0` | no |
//! | `op` | operation id | String or Token, 1 to 128 ([`MAX_OPERATION_ID_LEN`]) printable ASCII characters | no |
//! | `prio` | priority, the RFC 9218 urgency scale: `0` most urgent, `7` least | Integer, `0..=7` ([`MAX_PRIORITY`]) | no |
//! | `dl` | audit deadline, wall-clock Unix milliseconds | Integer, `0..=MAX_INTEGER` | no |
//!
//! Rules of the format:
//!
//! - **Remaining, not deadline.** `rem` is what the sender had left when it sent the request
//!   (already minus its transport pad). The receiver adds it to its own monotonic clock. `dl` is
//!   for logs and audits only and never enters budget arithmetic: clocks on two machines differ.
//! - **Whole milliseconds, rounded down.** [`ServiceBudget::new`] truncates to the millisecond
//!   and clamps to [`MAX_REMAINING`]; neither can make a budget longer.
//! - **Integers are Integers.** A decimal (`rem=1.5`) is rejected with
//!   [`ServiceBudgetErrorKind::NonInteger`], not rounded.
//! - **Duplicate members are rejected.** RFC 8941 says a later duplicate key silently overwrites
//!   an earlier one; for a budget that would let `rem=10, rem=99999` smuggle a larger value past
//!   a proxy that looked at the first one, so a repeated `v`, `rem`, `gen`, `op`, `prio` or `dl`
//!   is a [`ServiceBudgetErrorKind::DuplicateMember`] error.
//! - **Unknown keys are ignored** (forward compatibility: a v1 reader accepts a v1 header with
//!   members added later), though they must still be valid RFC 8941 syntax. Parameters on
//!   members are ignored likewise.
//! - **Unknown versions are rejected** with [`ServiceBudgetErrorKind::UnsupportedVersion`],
//!   which carries the version, so that the caller can fall back to its local default.
//! - **Bounded input.** Values longer than [`MAX_HEADER_LEN`] bytes are rejected before any
//!   parsing.
//! - **Priority is only parsed here.** Whether a caller's `prio` is honoured is the ingress
//!   policy's decision; by default an untrusted caller's priority is ignored.
//!
//! If a request carries the header on several lines, join them with `", "` before calling
//! [`ServiceBudget::parse`] (as RFC 9110 combines field lines) so that a member repeated across
//! lines is caught as a duplicate too — or reject such requests outright.
//!
//! [RFC 8941]: https://www.rfc-editor.org/rfc/rfc8941
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use cancel_scope::wire::service_budget::{ServiceBudget, ServiceBudgetErrorKind};
//!
//! let budget = ServiceBudget::parse("v=1, rem=250, gen=3, op=\"checkout-7f3a\"")?;
//! assert_eq!(budget.remaining(), Duration::from_millis(250));
//! assert_eq!(budget.generation(), 3);
//! assert_eq!(budget.operation_id(), Some("checkout-7f3a"));
//!
//! let err = ServiceBudget::parse("v=2, rem=250").unwrap_err();
//! assert_eq!(err.kind(), ServiceBudgetErrorKind::UnsupportedVersion(2));
//! # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
//! ```

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use sfv::visitor::{
    DictionaryVisitor, EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ParameterVisitor,
};
use sfv::{BareItemFromInput, DictSerializer, Integer, KeyRef, Parser, RefBareItem, Version};

/// The header name, `service-budget`.
///
/// # Examples
///
/// ```
/// assert_eq!(cancel_scope::wire::service_budget::HEADER, "service-budget");
/// ```
pub const HEADER: &str = "service-budget";

/// The only format version this module reads and writes (the `v` member).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::service_budget::{ServiceBudget, VERSION};
///
/// assert_eq!(ServiceBudget::new(Duration::ZERO).version(), VERSION);
/// ```
pub const VERSION: u32 = 1;

/// The longest header value [`ServiceBudget::parse`] looks at, in bytes; longer input is
/// rejected before parsing.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::service_budget::{ServiceBudget, ServiceBudgetErrorKind, MAX_HEADER_LEN};
///
/// let long = format!("v=1, rem=1, pad=\"{}\"", "x".repeat(MAX_HEADER_LEN));
/// assert_eq!(ServiceBudget::parse(&long).unwrap_err().kind(), ServiceBudgetErrorKind::TooLong);
/// ```
pub const MAX_HEADER_LEN: usize = 1024;

/// The largest remaining budget the header may carry (`rem`): 24 hours.
///
/// [`ServiceBudget::new`] clamps down to it; [`ServiceBudget::parse`] rejects anything larger.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::service_budget::{ServiceBudget, MAX_REMAINING};
///
/// assert_eq!(MAX_REMAINING, Duration::from_secs(24 * 60 * 60));
/// assert_eq!(ServiceBudget::new(Duration::MAX).remaining(), MAX_REMAINING);
/// ```
pub const MAX_REMAINING: Duration = Duration::from_secs(24 * 60 * 60);

/// [`MAX_REMAINING`] in milliseconds, as it appears on the wire.
const MAX_REMAINING_MS: u64 = 24 * 60 * 60 * 1000;

/// The longest operation id (`op`), in characters (all ASCII, so also in bytes).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::service_budget::{ServiceBudget, MAX_OPERATION_ID_LEN};
///
/// let budget = ServiceBudget::new(Duration::ZERO);
/// assert!(budget.clone().with_operation_id(&"a".repeat(MAX_OPERATION_ID_LEN)).is_ok());
/// assert!(budget.with_operation_id(&"a".repeat(MAX_OPERATION_ID_LEN + 1)).is_err());
/// ```
pub const MAX_OPERATION_ID_LEN: usize = 128;

/// The largest priority (`prio`): the least urgent on the RFC 9218 urgency scale.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::service_budget::{ServiceBudget, MAX_PRIORITY};
///
/// assert!(ServiceBudget::new(Duration::ZERO).with_priority(MAX_PRIORITY).is_ok());
/// assert!(ServiceBudget::new(Duration::ZERO).with_priority(MAX_PRIORITY + 1).is_err());
/// ```
pub const MAX_PRIORITY: u8 = 7;

/// The largest value of the `gen` and `dl` members: the largest RFC 8941 Integer
/// (15 digits).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::service_budget::{ServiceBudget, MAX_INTEGER};
///
/// assert!(ServiceBudget::new(Duration::ZERO).with_generation(MAX_INTEGER).is_ok());
/// assert!(ServiceBudget::new(Duration::ZERO).with_generation(MAX_INTEGER + 1).is_err());
/// ```
pub const MAX_INTEGER: u64 = 999_999_999_999_999;

/// A decoded `service-budget` header (version 1): a remaining budget and what it belongs to.
///
/// Every value of this type is valid on the wire: constructors validate (or, for the remaining
/// budget, clamp down), so [`to_header_value`](Self::to_header_value) cannot fail and
/// `ServiceBudget::parse(&b.to_header_value()) == Ok(b)` for every `b`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use cancel_scope::wire::service_budget::ServiceBudget;
///
/// let budget = ServiceBudget::new(Duration::from_millis(250))
///     .with_operation_id("checkout-7f3a")?
///     .with_generation(3)?;
/// let header = budget.to_header_value();
/// assert_eq!(header, r#"v=1, rem=250, gen=3, op="checkout-7f3a""#);
/// assert_eq!(ServiceBudget::parse(&header)?, budget);
/// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceBudget {
    /// Whole milliseconds, at most `MAX_REMAINING`.
    remaining: Duration,
    /// At most `MAX_INTEGER`.
    generation: u64,
    /// 1 to `MAX_OPERATION_ID_LEN` characters; `sfv::String` guarantees printable ASCII.
    operation_id: Option<sfv::String>,
    /// At most `MAX_PRIORITY`.
    priority: Option<u8>,
    /// At most `MAX_INTEGER`.
    audit_deadline_unix_ms: Option<u64>,
}

impl ServiceBudget {
    /// Creates a version 1 budget with `remaining` time left, generation 0 and no optional
    /// members.
    ///
    /// `remaining` is truncated to whole milliseconds and clamped to [`MAX_REMAINING`]: both
    /// only ever shorten it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::from_micros(1_999));
    /// assert_eq!(budget.remaining(), Duration::from_millis(1));
    /// assert_eq!(budget.generation(), 0);
    /// ```
    #[must_use]
    pub fn new(remaining: Duration) -> Self {
        let remaining = if remaining >= MAX_REMAINING {
            MAX_REMAINING
        } else {
            // Below 24 h, so the millisecond count fits in a u64 and the nanosecond
            // remainder is simply dropped (rounded down).
            Duration::from_millis(u64::try_from(remaining.as_millis()).unwrap_or(0))
        };
        Self {
            remaining,
            generation: 0,
            operation_id: None,
            priority: None,
            audit_deadline_unix_ms: None,
        }
    }

    /// Sets the operation id (`op`).
    ///
    /// # Errors
    ///
    /// [`ServiceBudgetErrorKind::OverMaximum`] if `id` is longer than
    /// [`MAX_OPERATION_ID_LEN`]; [`ServiceBudgetErrorKind::InvalidOperationId`] if it is empty
    /// or contains anything but printable ASCII (`0x20..=0x7E`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::ZERO).with_operation_id("order-42")?;
    /// assert_eq!(budget.operation_id(), Some("order-42"));
    /// assert!(budget.with_operation_id("ordre-é").is_err());
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    pub fn with_operation_id(mut self, id: &str) -> Result<Self, ServiceBudgetError> {
        self.operation_id = Some(operation_id(Cow::Borrowed(id))?);
        Ok(self)
    }

    /// Sets the cancel generation (`gen`).
    ///
    /// # Errors
    ///
    /// [`ServiceBudgetErrorKind::OverMaximum`] if `generation` is above [`MAX_INTEGER`], the
    /// largest RFC 8941 Integer.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::ZERO).with_generation(7)?;
    /// assert_eq!(budget.generation(), 7);
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    pub fn with_generation(mut self, generation: u64) -> Result<Self, ServiceBudgetError> {
        self.generation = at_most(Member::Generation, generation, MAX_INTEGER)?;
        Ok(self)
    }

    /// Sets the priority (`prio`, `0` most urgent to [`MAX_PRIORITY`] least urgent).
    ///
    /// # Errors
    ///
    /// [`ServiceBudgetErrorKind::OverMaximum`] if `priority` is above [`MAX_PRIORITY`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::ZERO).with_priority(3)?;
    /// assert_eq!(budget.priority(), Some(3));
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    pub fn with_priority(mut self, priority: u8) -> Result<Self, ServiceBudgetError> {
        if priority > MAX_PRIORITY {
            return Err(ServiceBudgetError::new(
                ServiceBudgetErrorKind::OverMaximum,
                Member::Priority,
            ));
        }
        self.priority = Some(priority);
        Ok(self)
    }

    /// Sets the audit deadline (`dl`): wall-clock Unix time in milliseconds, for logs only.
    ///
    /// # Errors
    ///
    /// [`ServiceBudgetErrorKind::OverMaximum`] if `unix_ms` is above [`MAX_INTEGER`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::ZERO)
    ///     .with_audit_deadline_unix_ms(1_767_225_600_000)?;
    /// assert_eq!(budget.audit_deadline_unix_ms(), Some(1_767_225_600_000));
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    pub fn with_audit_deadline_unix_ms(mut self, unix_ms: u64) -> Result<Self, ServiceBudgetError> {
        self.audit_deadline_unix_ms = Some(at_most(Member::AuditDeadline, unix_ms, MAX_INTEGER)?);
        Ok(self)
    }

    /// The format version (`v`); always [`VERSION`] for values of this type.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// assert_eq!(ServiceBudget::new(Duration::ZERO).version(), 1);
    /// ```
    #[must_use]
    pub fn version(&self) -> u32 {
        VERSION
    }

    /// The remaining budget (`rem`): whole milliseconds, at most [`MAX_REMAINING`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::parse("v=1, rem=1500")?;
    /// assert_eq!(budget.remaining(), Duration::from_millis(1500));
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.remaining
    }

    /// The cancel generation (`gen`); `0` when the header had none.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1")?.generation(), 0);
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1, gen=9")?.generation(), 9);
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The operation id (`op`), if any: 1 to [`MAX_OPERATION_ID_LEN`] printable ASCII
    /// characters.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// // A String and a Token read the same.
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1, op=\"a b\"")?.operation_id(), Some("a b"));
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1, op=ab")?.operation_id(), Some("ab"));
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1")?.operation_id(), None);
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn operation_id(&self) -> Option<&str> {
        self.operation_id.as_ref().map(|id| id.as_str())
    }

    /// The caller's priority (`prio`), if any. Untrusted callers' priorities are for the
    /// ingress policy to ignore; this is only what the header said.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1, prio=0")?.priority(), Some(0));
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn priority(&self) -> Option<u8> {
        self.priority
    }

    /// The audit deadline (`dl`) in wall-clock Unix milliseconds, if any. For logs only:
    /// never use it to compute a budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::parse("v=1, rem=1, dl=1767225600000")?;
    /// assert_eq!(budget.audit_deadline_unix_ms(), Some(1_767_225_600_000));
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn audit_deadline_unix_ms(&self) -> Option<u64> {
        self.audit_deadline_unix_ms
    }

    /// Parses a `service-budget` header value (a `&str`, `&[u8]`, or anything that is
    /// `AsRef<[u8]>`, such as `http::HeaderValue`).
    ///
    /// See the [module docs](self) for the members and rules. Never panics; the work done is
    /// bounded by [`MAX_HEADER_LEN`].
    ///
    /// # Errors
    ///
    /// A [`ServiceBudgetError`] whose [`kind`](ServiceBudgetError::kind) says why: too long,
    /// not an RFC 8941 dictionary, a duplicate member, an unsupported version, a missing
    /// required member, a member of the wrong type, a decimal where an integer belongs, a
    /// negative value, a value over its maximum, or an invalid operation id. The length is
    /// checked first; syntax errors and duplicates are found while parsing, whichever comes
    /// first in the input; only then is `v` checked, then the other members one by one. So a
    /// `v=2` header is reported as unsupported even if its other members would be invalid in
    /// version 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::{ServiceBudget, ServiceBudgetErrorKind};
    ///
    /// let budget = ServiceBudget::parse(b"v=1, rem=100, future-member=?1")?;
    /// assert_eq!(budget.remaining(), Duration::from_millis(100));
    ///
    /// let err = ServiceBudget::parse("v=1, rem=10, rem=99999").unwrap_err();
    /// assert_eq!(err.kind(), ServiceBudgetErrorKind::DuplicateMember);
    /// assert_eq!(err.member(), Some("rem"));
    ///
    /// let err = ServiceBudget::parse("v=1, rem=-5").unwrap_err();
    /// assert_eq!(err.kind(), ServiceBudgetErrorKind::Negative);
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    pub fn parse(input: impl AsRef<[u8]>) -> Result<Self, ServiceBudgetError> {
        let input = input.as_ref();
        if input.len() > MAX_HEADER_LEN {
            return Err(ServiceBudgetError {
                kind: ServiceBudgetErrorKind::TooLong,
                member: None,
                source: None,
            });
        }

        let mut members = Members::default();
        let parsed = Parser::new(input)
            .with_version(Version::Rfc8941)
            .parse_dictionary_with_visitor(&mut members);
        if let Some(err) = members.rejected {
            // The visitor stopped the parse; its typed error beats sfv's stringified copy.
            return Err(err);
        }
        if let Err(err) = parsed {
            return Err(ServiceBudgetError {
                kind: ServiceBudgetErrorKind::Syntax,
                member: None,
                source: Some(err),
            });
        }
        members.validate()
    }

    /// Serializes this budget as a `service-budget` header value.
    ///
    /// Members are written in the order `v`, `rem`, `gen`, then `op`, `prio` and `dl` when set;
    /// `op` is always written as an RFC 8941 String. The result is at most a few hundred bytes,
    /// well under [`MAX_HEADER_LEN`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::from_millis(80)).with_priority(1)?;
    /// assert_eq!(budget.to_header_value(), "v=1, rem=80, gen=0, prio=1");
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn to_header_value(&self) -> String {
        // The fields are validated on construction, so every conversion to an RFC 8941
        // Integer below succeeds; the fallbacks only exist so that this function cannot
        // panic, and for `rem` the fallback is the shortest budget, never a longer one.
        let rem_ms = u64::try_from(self.remaining.as_millis()).unwrap_or(0);
        let mut dict = DictSerializer::new();
        put(&mut dict, Member::Version, VERSION);
        put(
            &mut dict,
            Member::Remaining,
            Integer::try_from(rem_ms).unwrap_or(Integer::ZERO),
        );
        put(
            &mut dict,
            Member::Generation,
            Integer::try_from(self.generation).unwrap_or(Integer::MAX),
        );
        if let Some(id) = &self.operation_id {
            put(&mut dict, Member::OperationId, &**id);
        }
        if let Some(priority) = self.priority {
            put(&mut dict, Member::Priority, priority);
        }
        if let Some(unix_ms) = self.audit_deadline_unix_ms {
            put(
                &mut dict,
                Member::AuditDeadline,
                Integer::try_from(unix_ms).unwrap_or(Integer::MAX),
            );
        }
        // `finish` returns `None` only for an empty dictionary, and `v` is always there.
        dict.finish().unwrap_or_default()
    }
}

/// Writes one member, without parameters.
fn put<'b>(dict: &mut DictSerializer<String>, member: Member, value: impl Into<RefBareItem<'b>>) {
    // The returned serializer would add parameters; dropping it ends the member.
    let _no_parameters = dict.bare_item(member.key(), value);
}

/// The members this version knows, in the order they are validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Version,
    Remaining,
    Generation,
    OperationId,
    Priority,
    AuditDeadline,
}

impl Member {
    const COUNT: usize = 6;

    fn from_key(key: &str) -> Option<Self> {
        Some(match key {
            "v" => Self::Version,
            "rem" => Self::Remaining,
            "gen" => Self::Generation,
            "op" => Self::OperationId,
            "prio" => Self::Priority,
            "dl" => Self::AuditDeadline,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Version => "v",
            Self::Remaining => "rem",
            Self::Generation => "gen",
            Self::OperationId => "op",
            Self::Priority => "prio",
            Self::AuditDeadline => "dl",
        }
    }

    fn key(self) -> &'static KeyRef {
        // Const-evaluated: an invalid key would fail to compile, not panic at run time.
        const V: &KeyRef = sfv::key_ref("v");
        const REM: &KeyRef = sfv::key_ref("rem");
        const GEN: &KeyRef = sfv::key_ref("gen");
        const OP: &KeyRef = sfv::key_ref("op");
        const PRIO: &KeyRef = sfv::key_ref("prio");
        const DL: &KeyRef = sfv::key_ref("dl");
        match self {
            Self::Version => V,
            Self::Remaining => REM,
            Self::Generation => GEN,
            Self::OperationId => OP,
            Self::Priority => PRIO,
            Self::AuditDeadline => DL,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A member's value as read from the wire, before validation.
#[derive(Debug)]
enum Raw<'de> {
    Integer(i64),
    Decimal,
    /// A String or a Token.
    Text(Cow<'de, str>),
    /// A Boolean, Byte Sequence or Inner List: never valid for a known member.
    Other,
}

/// Collects the known members while sfv parses, rejecting duplicates on the spot.
#[derive(Debug, Default)]
struct Members<'de> {
    values: [Option<Raw<'de>>; Member::COUNT],
    /// Set when the visitor stopped the parse; sfv only keeps a visitor error's text.
    rejected: Option<ServiceBudgetError>,
}

impl<'de> Members<'de> {
    fn take(&mut self, member: Member) -> Option<Raw<'de>> {
        self.values[member.index()].take()
    }

    fn require(&mut self, member: Member) -> Result<Raw<'de>, ServiceBudgetError> {
        self.take(member)
            .ok_or_else(|| ServiceBudgetError::new(ServiceBudgetErrorKind::MissingMember, member))
    }

    /// Turns the raw members into a budget; called only after the whole input parsed.
    fn validate(mut self) -> Result<ServiceBudget, ServiceBudgetError> {
        // The version first: other members only mean something once we know it.
        let version = integer(Member::Version, self.require(Member::Version)?)?;
        if version != i64::from(VERSION) {
            return Err(ServiceBudgetError::new(
                ServiceBudgetErrorKind::UnsupportedVersion(version),
                Member::Version,
            ));
        }

        let rem_ms = non_negative(
            Member::Remaining,
            self.require(Member::Remaining)?,
            MAX_REMAINING_MS,
        )?;
        let generation = match self.take(Member::Generation) {
            Some(raw) => non_negative(Member::Generation, raw, MAX_INTEGER)?,
            None => 0,
        };
        let operation_id = match self.take(Member::OperationId) {
            Some(Raw::Text(text)) => Some(operation_id(text)?),
            Some(_) => {
                return Err(ServiceBudgetError::new(
                    ServiceBudgetErrorKind::WrongType,
                    Member::OperationId,
                ))
            }
            None => None,
        };
        let priority = match self.take(Member::Priority) {
            Some(raw) => {
                let priority = non_negative(Member::Priority, raw, u64::from(MAX_PRIORITY))?;
                // At most MAX_PRIORITY, so it fits.
                Some(u8::try_from(priority).unwrap_or(MAX_PRIORITY))
            }
            None => None,
        };
        let audit_deadline_unix_ms = match self.take(Member::AuditDeadline) {
            Some(raw) => Some(non_negative(Member::AuditDeadline, raw, MAX_INTEGER)?),
            None => None,
        };

        Ok(ServiceBudget {
            remaining: Duration::from_millis(rem_ms),
            generation,
            operation_id,
            priority,
            audit_deadline_unix_ms,
        })
    }
}

/// The error a visitor hands back to sfv to stop the parse; the typed error is kept in
/// [`Members::rejected`].
#[derive(Debug)]
struct Stop;

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("service-budget member rejected")
    }
}

impl std::error::Error for Stop {}

impl<'de> DictionaryVisitor<'de> for Members<'de> {
    type Error = Stop;

    fn entry(&mut self, key: &'de KeyRef) -> Result<impl EntryVisitor<'de>, Self::Error> {
        let Some(member) = Member::from_key(key.as_str()) else {
            // Unknown keys are skipped (forward compatibility); sfv still checks their syntax.
            return Ok(None);
        };
        let slot = &mut self.values[member.index()];
        if slot.is_some() {
            // RFC 8941 would let the later value win; for a budget that is a way to smuggle a
            // different value past whoever read the first one, so refuse.
            self.rejected = Some(ServiceBudgetError::new(
                ServiceBudgetErrorKind::DuplicateMember,
                member,
            ));
            return Err(Stop);
        }
        // Mark the member as seen now; `bare_item` or `inner_list` fill in the value.
        *slot = Some(Raw::Other);
        Ok(Some(Slot(slot)))
    }
}

/// Receives the value of one known member.
struct Slot<'a, 'de>(&'a mut Option<Raw<'de>>);

impl<'de> ItemVisitor<'de> for Slot<'_, 'de> {
    type Error = Stop;

    fn bare_item(
        self,
        bare_item: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de>, Self::Error> {
        *self.0 = Some(match bare_item {
            BareItemFromInput::Integer(value) => Raw::Integer(i64::from(value)),
            BareItemFromInput::Decimal(_) => Raw::Decimal,
            BareItemFromInput::String(Cow::Borrowed(text)) => {
                Raw::Text(Cow::Borrowed(text.as_str()))
            }
            BareItemFromInput::String(Cow::Owned(text)) => Raw::Text(Cow::Owned(text.into())),
            BareItemFromInput::Token(token) => Raw::Text(Cow::Borrowed(token.as_str())),
            _ => Raw::Other,
        });
        // Parameters on a member are ignored, like unknown keys.
        Ok(Ignored)
    }
}

impl<'de> EntryVisitor<'de> for Slot<'_, 'de> {
    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Self::Error> {
        // The slot already says `Other`: an inner list is the wrong type for every member.
        Ok(Ignored)
    }
}

/// Reads an Integer member.
fn integer(member: Member, raw: Raw<'_>) -> Result<i64, ServiceBudgetError> {
    match raw {
        Raw::Integer(value) => Ok(value),
        Raw::Decimal => Err(ServiceBudgetError::new(
            ServiceBudgetErrorKind::NonInteger,
            member,
        )),
        Raw::Text(_) | Raw::Other => Err(ServiceBudgetError::new(
            ServiceBudgetErrorKind::WrongType,
            member,
        )),
    }
}

/// Reads an Integer member that must lie in `0..=max`.
fn non_negative(member: Member, raw: Raw<'_>, max: u64) -> Result<u64, ServiceBudgetError> {
    let value = integer(member, raw)?;
    let value = u64::try_from(value)
        .map_err(|_| ServiceBudgetError::new(ServiceBudgetErrorKind::Negative, member))?;
    at_most(member, value, max)
}

fn at_most(member: Member, value: u64, max: u64) -> Result<u64, ServiceBudgetError> {
    if value > max {
        return Err(ServiceBudgetError::new(
            ServiceBudgetErrorKind::OverMaximum,
            member,
        ));
    }
    Ok(value)
}

/// Validates an operation id: 1 to `MAX_OPERATION_ID_LEN` printable ASCII characters.
fn operation_id(id: Cow<'_, str>) -> Result<sfv::String, ServiceBudgetError> {
    if id.len() > MAX_OPERATION_ID_LEN {
        return Err(ServiceBudgetError::new(
            ServiceBudgetErrorKind::OverMaximum,
            Member::OperationId,
        ));
    }
    if id.is_empty() {
        return Err(ServiceBudgetError::new(
            ServiceBudgetErrorKind::InvalidOperationId,
            Member::OperationId,
        ));
    }
    sfv::String::from_string(id.into_owned()).map_err(|_| {
        ServiceBudgetError::new(
            ServiceBudgetErrorKind::InvalidOperationId,
            Member::OperationId,
        )
    })
}

/// Why a `service-budget` header was rejected, or a [`ServiceBudget`] could not be built.
///
/// Look at [`kind`](Self::kind) to decide what to do and [`member`](Self::member) to say which
/// member was at fault. For [`ServiceBudgetErrorKind::Syntax`],
/// [`source`](std::error::Error::source) holds the RFC 8941 parser's error (with the byte
/// index). The `Display` text is for humans and logs, not API.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::service_budget::{ServiceBudget, ServiceBudgetErrorKind};
///
/// let err = ServiceBudget::parse("v=1").unwrap_err();
/// assert_eq!(err.kind(), ServiceBudgetErrorKind::MissingMember);
/// assert_eq!(err.member(), Some("rem"));
/// println!("bad service-budget header: {err}");
/// ```
#[derive(Debug)]
pub struct ServiceBudgetError {
    kind: ServiceBudgetErrorKind,
    member: Option<&'static str>,
    source: Option<sfv::Error>,
}

impl ServiceBudgetError {
    fn new(kind: ServiceBudgetErrorKind, member: Member) -> Self {
        Self {
            kind,
            member: Some(member.name()),
            source: None,
        }
    }

    /// What went wrong.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_budget::{ServiceBudget, ServiceBudgetErrorKind};
    ///
    /// let err = ServiceBudget::parse("v=1, rem=1.5").unwrap_err();
    /// assert_eq!(err.kind(), ServiceBudgetErrorKind::NonInteger);
    /// ```
    #[must_use]
    pub fn kind(&self) -> ServiceBudgetErrorKind {
        self.kind
    }

    /// The key of the member at fault (`"v"`, `"rem"`, `"gen"`, `"op"`, `"prio"` or `"dl"`),
    /// or `None` when the error is about the whole value.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1, prio=8").unwrap_err().member(), Some("prio"));
    /// assert_eq!(ServiceBudget::parse("v=1, rem=").unwrap_err().member(), None);
    /// ```
    #[must_use]
    pub fn member(&self) -> Option<&'static str> {
        self.member
    }
}

impl fmt::Display for ServiceBudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let member = self.member.unwrap_or("?");
        match self.kind {
            ServiceBudgetErrorKind::TooLong => write!(
                f,
                "service-budget header is longer than {MAX_HEADER_LEN} bytes"
            ),
            ServiceBudgetErrorKind::Syntax => {
                f.write_str("service-budget header is not a valid RFC 8941 dictionary")
            }
            ServiceBudgetErrorKind::DuplicateMember => {
                write!(f, "service-budget member `{member}` appears more than once")
            }
            ServiceBudgetErrorKind::UnsupportedVersion(version) => write!(
                f,
                "service-budget version {version} is not supported (expected {VERSION})"
            ),
            ServiceBudgetErrorKind::MissingMember => {
                write!(f, "service-budget member `{member}` is missing")
            }
            ServiceBudgetErrorKind::WrongType => {
                write!(f, "service-budget member `{member}` has the wrong type")
            }
            ServiceBudgetErrorKind::NonInteger => {
                write!(f, "service-budget member `{member}` must be an integer")
            }
            ServiceBudgetErrorKind::Negative => {
                write!(f, "service-budget member `{member}` is negative")
            }
            ServiceBudgetErrorKind::OverMaximum => {
                write!(f, "service-budget member `{member}` is over its maximum")
            }
            ServiceBudgetErrorKind::InvalidOperationId => write!(
                f,
                "service-budget member `{member}` must be 1 to {MAX_OPERATION_ID_LEN} printable ASCII characters"
            ),
        }
    }
}

impl std::error::Error for ServiceBudgetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|err| err as &(dyn std::error::Error + 'static))
    }
}

/// The kinds of [`ServiceBudgetError`].
///
/// Variants may be added in later versions.
///
/// # Examples
///
/// ```
/// use cancel_scope::wire::service_budget::{ServiceBudget, ServiceBudgetErrorKind};
///
/// match ServiceBudget::parse("v=1, rem=90000000") {
///     Err(err) if err.kind() == ServiceBudgetErrorKind::OverMaximum => { /* answer 400 */ }
///     other => panic!("unexpected: {other:?}"),
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServiceBudgetErrorKind {
    /// The value is longer than [`MAX_HEADER_LEN`] bytes; it was not parsed.
    TooLong,
    /// The value is not a valid RFC 8941 Dictionary.
    Syntax,
    /// A known member appears more than once.
    DuplicateMember,
    /// The `v` member is an Integer other than [`VERSION`]; carries that version.
    UnsupportedVersion(i64),
    /// A required member (`v` or `rem`) is absent.
    MissingMember,
    /// A member has the wrong RFC 8941 type (e.g. a String where an Integer belongs, a
    /// Boolean, a Byte Sequence or an Inner List).
    WrongType,
    /// A Decimal where an Integer belongs (e.g. `rem=1.5`): never rounded, always rejected.
    NonInteger,
    /// An Integer member is negative.
    Negative,
    /// A value is over its maximum: `rem` over [`MAX_REMAINING`], `prio` over
    /// [`MAX_PRIORITY`], `gen`/`dl` over [`MAX_INTEGER`], or `op` longer than
    /// [`MAX_OPERATION_ID_LEN`].
    OverMaximum,
    /// The operation id is empty or not printable ASCII.
    InvalidOperationId,
}
