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
//! | `wb` | the would-be remaining budget of a sender in shadow mode, in milliseconds (`rem` carries the enforced one) | Integer, `0..=86_400_000` | no |
//! | `pv` | version of the endpoint policy that admitted the operation upstream | Integer, `0..=4_294_967_295` (`u32::MAX`); absent means `0` | no |
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
use std::time::Duration;

use sfv::{DictSerializer, Integer, Parser, RefBareItem, Version};

mod decode;
mod error;

pub use error::{ServiceBudgetError, ServiceBudgetErrorKind};

use decode::{at_most, operation_id, Member, Members};

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
    /// The admitting policy's version, if the sender wrote one.
    policy_version: Option<u32>,
    /// Whole milliseconds, at most `MAX_REMAINING`.
    would_be: Option<Duration>,
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
            policy_version: None,
            would_be: None,
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

    /// Sets the version of the endpoint policy that admitted the operation (`pv`): what the
    /// next hop records, and follows where it trusts its caller and holds that version (see
    /// [`PolicyHandle`](crate::wire::PolicyHandle)). A v1 reader that predates the member
    /// ignores it, like any unknown member.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::from_millis(80)).with_policy_version(7);
    /// assert_eq!(budget.to_header_value(), "v=1, rem=80, gen=0, pv=7");
    /// assert_eq!(ServiceBudget::parse("v=1, rem=80, pv=7")?.policy_version(), Some(7));
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn with_policy_version(mut self, version: u32) -> Self {
        self.policy_version = Some(version);
        self
    }

    /// The version of the policy that admitted the operation upstream (`pv`), if the sender
    /// wrote one.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::wire::service_budget::{ServiceBudget, ServiceBudgetErrorKind};
    ///
    /// assert_eq!(ServiceBudget::parse("v=1, rem=1")?.policy_version(), None);
    /// let err = ServiceBudget::parse("v=1, rem=1, pv=-1").unwrap_err();
    /// assert_eq!(err.kind(), ServiceBudgetErrorKind::Negative);
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn policy_version(&self) -> Option<u32> {
        self.policy_version
    }

    /// Sets the would-be remaining budget (`wb`) of a sender in shadow mode
    /// ([`Mode::Shadow`](crate::wire::Mode)): what `rem` would be if its policy enforced.
    /// Truncated to whole milliseconds and clamped to [`MAX_REMAINING`], like `rem`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use cancel_scope::wire::service_budget::ServiceBudget;
    ///
    /// let budget = ServiceBudget::new(Duration::from_secs(30)).with_would_be(Duration::from_millis(80));
    /// assert_eq!(budget.to_header_value(), "v=1, rem=30000, gen=0, wb=80");
    /// assert_eq!(ServiceBudget::parse("v=1, rem=9, wb=8")?.would_be(), Some(Duration::from_millis(8)));
    /// # Ok::<(), cancel_scope::wire::ServiceBudgetError>(())
    /// ```
    #[must_use]
    pub fn with_would_be(mut self, would_be: Duration) -> Self {
        self.would_be = Some(ServiceBudget::new(would_be).remaining);
        self
    }

    /// The sender's would-be remaining budget (`wb`), if it shadows.
    ///
    /// # Examples
    ///
    /// See [`with_would_be`](Self::with_would_be).
    #[must_use]
    pub fn would_be(&self) -> Option<Duration> {
        self.would_be
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
    /// Members are written in the order `v`, `rem`, `gen`, then `op`, `prio`, `dl`, `wb` and `pv` when set;
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
        if let Some(wb) = self.would_be {
            let wb_ms = u64::try_from(wb.as_millis()).unwrap_or(0);
            put(
                &mut dict,
                Member::WouldBe,
                Integer::try_from(wb_ms).unwrap_or(Integer::ZERO),
            );
        }
        if let Some(version) = self.policy_version {
            put(&mut dict, Member::PolicyVersion, Integer::from(version));
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
