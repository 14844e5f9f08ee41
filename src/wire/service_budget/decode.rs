//! Decoding the dictionary: its members, the visitor that collects them (rejecting
//! duplicates) and the checks of each value.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use sfv::visitor::{
    DictionaryVisitor, EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ParameterVisitor,
};
use sfv::{BareItemFromInput, KeyRef};

use super::{
    ServiceBudget, ServiceBudgetError, ServiceBudgetErrorKind, MAX_INTEGER, MAX_OPERATION_ID_LEN,
    MAX_PRIORITY, MAX_REMAINING_MS, VERSION,
};

/// The members this version knows, in the order they are validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Member {
    Version,
    Remaining,
    Generation,
    OperationId,
    Priority,
    AuditDeadline,
    PolicyVersion,
    WouldBe,
}

impl Member {
    const COUNT: usize = 8;

    fn from_key(key: &str) -> Option<Self> {
        Some(match key {
            "v" => Self::Version,
            "rem" => Self::Remaining,
            "gen" => Self::Generation,
            "op" => Self::OperationId,
            "prio" => Self::Priority,
            "dl" => Self::AuditDeadline,
            "pv" => Self::PolicyVersion,
            "wb" => Self::WouldBe,
            _ => return None,
        })
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Version => "v",
            Self::Remaining => "rem",
            Self::Generation => "gen",
            Self::OperationId => "op",
            Self::Priority => "prio",
            Self::AuditDeadline => "dl",
            Self::PolicyVersion => "pv",
            Self::WouldBe => "wb",
        }
    }

    pub(super) fn key(self) -> &'static KeyRef {
        // Const-evaluated: an invalid key would fail to compile, not panic at run time.
        const V: &KeyRef = sfv::key_ref("v");
        const REM: &KeyRef = sfv::key_ref("rem");
        const GEN: &KeyRef = sfv::key_ref("gen");
        const OP: &KeyRef = sfv::key_ref("op");
        const PRIO: &KeyRef = sfv::key_ref("prio");
        const DL: &KeyRef = sfv::key_ref("dl");
        const PV: &KeyRef = sfv::key_ref("pv");
        const WB: &KeyRef = sfv::key_ref("wb");
        match self {
            Self::Version => V,
            Self::Remaining => REM,
            Self::Generation => GEN,
            Self::OperationId => OP,
            Self::Priority => PRIO,
            Self::AuditDeadline => DL,
            Self::PolicyVersion => PV,
            Self::WouldBe => WB,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A member's value as read from the wire, before validation.
#[derive(Debug)]
pub(super) enum Raw<'de> {
    Integer(i64),
    Decimal,
    /// A String or a Token.
    Text(Cow<'de, str>),
    /// A Boolean, Byte Sequence or Inner List: never valid for a known member.
    Other,
}

/// Collects the known members while sfv parses, rejecting duplicates on the spot.
#[derive(Debug, Default)]
pub(super) struct Members<'de> {
    values: [Option<Raw<'de>>; Member::COUNT],
    /// Set when the visitor stopped the parse; sfv only keeps a visitor error's text.
    pub(super) rejected: Option<ServiceBudgetError>,
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
    pub(super) fn validate(mut self) -> Result<ServiceBudget, ServiceBudgetError> {
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
        let policy_version = match self.take(Member::PolicyVersion) {
            // At most `u32::MAX`, so it fits.
            Some(raw) => Some(
                u32::try_from(non_negative(
                    Member::PolicyVersion,
                    raw,
                    u64::from(u32::MAX),
                )?)
                .unwrap_or(u32::MAX),
            ),
            None => None,
        };

        let would_be = match self.take(Member::WouldBe) {
            Some(raw) => Some(Duration::from_millis(non_negative(
                Member::WouldBe,
                raw,
                MAX_REMAINING_MS,
            )?)),
            None => None,
        };

        Ok(ServiceBudget {
            remaining: Duration::from_millis(rem_ms),
            generation,
            operation_id,
            priority,
            audit_deadline_unix_ms,
            policy_version,
            would_be,
        })
    }
}

/// The error a visitor hands back to sfv to stop the parse; the typed error is kept in
/// [`Members::rejected`].
#[derive(Debug)]
pub(super) struct Stop;

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
pub(super) struct Slot<'a, 'de>(&'a mut Option<Raw<'de>>);

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
pub(super) fn integer(member: Member, raw: Raw<'_>) -> Result<i64, ServiceBudgetError> {
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
pub(super) fn non_negative(
    member: Member,
    raw: Raw<'_>,
    max: u64,
) -> Result<u64, ServiceBudgetError> {
    let value = integer(member, raw)?;
    let value = u64::try_from(value)
        .map_err(|_| ServiceBudgetError::new(ServiceBudgetErrorKind::Negative, member))?;
    at_most(member, value, max)
}

pub(super) fn at_most(member: Member, value: u64, max: u64) -> Result<u64, ServiceBudgetError> {
    if value > max {
        return Err(ServiceBudgetError::new(
            ServiceBudgetErrorKind::OverMaximum,
            member,
        ));
    }
    Ok(value)
}

/// Validates an operation id: 1 to `MAX_OPERATION_ID_LEN` printable ASCII characters.
pub(super) fn operation_id(id: Cow<'_, str>) -> Result<sfv::String, ServiceBudgetError> {
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
