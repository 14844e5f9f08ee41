//! How a child ended (its receipt), and what a receipt lists of the child's spec.

use std::fmt;

use crate::scope::Scope;
use crate::spec::{ChildSpec, EffectRecord};
use crate::tree;

/// How a registered child ended. Every registered child gets exactly one.
///
/// # Examples
///
/// ```
/// use cancel_scope::{EffectRecord, Receipt};
/// let r = Receipt::EffectUnknown(EffectRecord::new("payment-7"));
/// assert!(r.needs_reconciliation());
/// assert!(!Receipt::Succeeded.needs_reconciliation());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Receipt {
    /// Finished and did what it should.
    Succeeded,
    /// Finished with an error (or panicked); it stopped.
    Failed,
    /// Confirmed stopped (or never started) because of a cancel.
    Cancelled,
    /// Did not stop within the grace period; isolated, still listed.
    Quarantined,
    /// Crossed an external side-effect point and its outcome is unknown.
    EffectUnknown(EffectRecord),
}

impl Receipt {
    /// Whether someone must reconcile this child's effect.
    ///
    /// # Examples
    ///
    /// ```
    /// use cancel_scope::Receipt;
    /// assert!(!Receipt::Cancelled.needs_reconciliation());
    /// ```
    pub fn needs_reconciliation(&self) -> bool {
        matches!(self, Receipt::EffectUnknown(_))
    }

    pub(crate) fn kind(&self) -> crate::tree::Kind {
        use crate::tree::Kind;
        match self {
            Receipt::Succeeded => Kind::Succeeded,
            Receipt::Failed => Kind::Failed,
            Receipt::Cancelled => Kind::Cancelled,
            Receipt::Quarantined => Kind::Quarantined,
            Receipt::EffectUnknown(_) => Kind::EffectUnknown,
        }
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Receipt::Succeeded => f.write_str("succeeded"),
            Receipt::Failed => f.write_str("failed"),
            Receipt::Cancelled => f.write_str("cancelled"),
            Receipt::Quarantined => f.write_str("quarantined"),
            Receipt::EffectUnknown(r) => write!(f, "effect unknown ({})", r.effect_id()),
        }
    }
}

/// What a receipt makes of the spec of the child it is given to.
impl ChildSpec {
    /// What `receipt`, given to a child with this spec, lists in its scope's report: the child,
    /// with the record of its unknown effect, for `EffectUnknown`; the child as it is for
    /// `Quarantined` (whether given by the scope's quarantine or by the child's owner, and
    /// counted as an unknown effect when the child may have had one); nothing otherwise.
    pub(crate) fn listed_by(&self, receipt: &Receipt) -> Option<ChildSpec> {
        match receipt {
            Receipt::EffectUnknown(rec) => {
                let mut spec = self.clone();
                spec.set_effect_record(rec.clone());
                Some(spec)
            }
            Receipt::Quarantined => Some(self.clone()),
            _ => None,
        }
    }

    /// The receipt of a child with this spec that ends without one (its ticket dropped):
    /// `EffectUnknown` if it was dispatched and may have had an effect, `Failed` while
    /// unwinding, `Cancelled` otherwise.
    pub(crate) fn default_receipt(&self, dispatched: bool) -> Receipt {
        match self.effect_record() {
            Some(rec) if dispatched && self.effect().may_have_effect() => {
                Receipt::EffectUnknown(rec.clone())
            }
            _ if std::thread::panicking() => Receipt::Failed,
            _ => Receipt::Cancelled,
        }
    }
}

impl Scope {
    /// The children of this scope's subtree whose effect is unknown so far: `EffectUnknown`
    /// receipts and quarantined children that may have had an effect (what makes a quiet
    /// scope `NeedsReconciliation`).
    pub(crate) fn unknown_effects(&self) -> Vec<ChildSpec> {
        self.node.with_records(|r| unknown_in(r).cloned().collect())
    }
}

/// The children whose effect is unknown: `EffectUnknown` receipts, and quarantined children
/// that may have had an effect.
pub(crate) fn unknown_in(r: &tree::Records<ChildSpec>) -> impl Iterator<Item = &ChildSpec> {
    let quarantined = r.quarantined.iter();
    r.effects
        .iter()
        .chain(quarantined.filter(|c| c.effect().may_have_effect()))
}
