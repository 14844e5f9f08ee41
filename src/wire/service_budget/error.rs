//! Why a `service-budget` header was rejected.

use std::fmt;

use super::decode::Member;
use super::{MAX_HEADER_LEN, MAX_OPERATION_ID_LEN, VERSION};

/// Why a `service-budget` header was rejected, or a [`ServiceBudget`](super::ServiceBudget) could
/// not be built.
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
    pub(super) kind: ServiceBudgetErrorKind,
    pub(super) member: Option<&'static str>,
    pub(super) source: Option<sfv::Error>,
}

impl ServiceBudgetError {
    pub(super) fn new(kind: ServiceBudgetErrorKind, member: Member) -> Self {
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
    /// A value is over its maximum: `rem` over [`MAX_REMAINING`](super::MAX_REMAINING), `prio` over
    /// [`MAX_PRIORITY`](super::MAX_PRIORITY), `gen`/`dl` over [`MAX_INTEGER`](super::MAX_INTEGER),
    /// or `op` longer than [`MAX_OPERATION_ID_LEN`].
    OverMaximum,
    /// The operation id is empty or not printable ASCII.
    InvalidOperationId,
}
