//! The shrink guard (pure): whether a new catalog state may replace the published one when it
//! has lost much of the catalog, so that a mistaken `kubectl delete mrm --all` in the KCP (or
//! a deleted catalog CRD) does not prune every SKR within seconds.
//!
//! ```text
//!  counts published last ─────────┐
//!  Lease notes (record, confirm) ─┼──decide()──▶ Verdict::Publish | Verdict::Hold
//!  new state's CatalogCounts ─────┘
//! ```
//!
//! What is counted is what the fleet would lose: the objects of the union of every Kyma's
//! desired set ([`CatalogCounts::reachable`]), ModuleReleaseMetas and ModuleTemplates
//! separately. Together they would hide the headline case: a catalog has several templates
//! (versions) per module, so deleting every ModuleReleaseMeta of a catalog with 25 modules
//! and 150 templates loses 25 of 175 catalog objects, yet leaves every SKR without a
//! single module. Counting what is reachable rather than what is in the KCP makes both kinds
//! fall to zero in that case (no template is referenced any more), and keeps the clean-up of
//! unreferenced old templates from counting as a loss.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::catalog::desired::widest_desired_set;
use crate::catalog::{CatalogKind, Snapshot};

/// Objects of a catalog state that some SKR gets, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatalogCounts {
    /// ModuleReleaseMetas: modules.
    pub release_metas: usize,
    /// ModuleTemplates: module versions.
    pub templates: usize,
}

impl CatalogCounts {
    /// What the fleet gets from `snapshot` at most: the objects of the desired set of a Kyma
    /// that may see everything (beta, internal, and selected by every valid `kymaSelector` of
    /// a restricted module), which is the union of every Kyma's desired set. Mandatory
    /// modules, templates no channel references and ModuleReleaseMetas skipped for their
    /// selector are not counted: no SKR holds a copy of them.
    pub fn reachable(snapshot: &Snapshot, restricted_modules: &BTreeSet<String>) -> Self {
        let set = widest_desired_set(snapshot, restricted_modules);
        Self { release_metas: set.release_metas.len(), templates: set.templates.len() }
    }

    /// The count of one kind.
    pub fn of(&self, kind: CatalogKind) -> usize {
        match kind {
            CatalogKind::ModuleTemplate => self.templates,
            CatalogKind::ModuleReleaseMeta => self.release_metas,
        }
    }

    /// The largest share of a kind's objects in `baseline` that `self` lacks, between 0 (as
    /// many or more of each kind) and 1 (none left of a kind `baseline` has).
    pub fn shrink_from(&self, baseline: &CatalogCounts) -> f64 {
        CatalogKind::ALL
            .into_iter()
            .map(|kind| {
                let (before, now) = (baseline.of(kind), self.of(kind));
                if before == 0 || now >= before { 0.0 } else { (before - now) as f64 / before as f64 }
            })
            .fold(0.0, f64::max)
    }

    /// Whether `self` has fewer objects of some kind than `published`.
    pub fn is_smaller_than(&self, published: &CatalogCounts) -> bool {
        CatalogKind::ALL.into_iter().any(|kind| self.of(kind) < published.of(kind))
    }
}

impl fmt::Display for CatalogCounts {
    /// `mrm=<ModuleReleaseMetas>,mt=<ModuleTemplates>`: the form of the Lease annotations
    /// (`kubectl` knows the two kinds by these short names).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mrm={},mt={}", self.release_metas, self.templates)
    }
}

impl FromStr for CatalogCounts {
    type Err = String;

    /// Parses the [`Display`](fmt::Display) form; the order of the two entries and spaces
    /// around them do not matter, each must be there exactly once.
    fn from_str(text: &str) -> Result<Self, String> {
        let err = || "expected mrm=<count>,mt=<count>".to_owned();
        let (mut release_metas, mut templates) = (None, None);
        for entry in text.split(',') {
            let (key, value) = entry.split_once('=').ok_or_else(err)?;
            let slot = match key.trim() {
                "mrm" => &mut release_metas,
                "mt" => &mut templates,
                _ => return Err(err()),
            };
            let value = value.trim();
            if slot.is_some() || value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            *slot = Some(value.parse::<usize>().map_err(|_| err())?);
        }
        match (release_metas, templates) {
            (Some(release_metas), Some(templates)) => Ok(CatalogCounts { release_metas, templates }),
            _ => Err(err()),
        }
    }
}

/// What the replicas keep on the coordinator Lease, as far as this replica read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseNotes {
    /// The counts of the state published last by any replica (annotation
    /// [`PUBLISHED_CATALOG_ANNOTATION`](crate::api::PUBLISHED_CATALOG_ANNOTATION)): the
    /// baseline of a replica that has published nothing yet.
    pub recorded: Option<CatalogCounts>,
    /// The counts a human confirmed (annotation
    /// [`CONFIRM_SHRINK_ANNOTATION`](crate::api::CONFIRM_SHRINK_ANNOTATION)).
    pub confirmed: Option<CatalogCounts>,
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// `--catalog-shrink-threshold`: the largest share of a kind a new state may lose without
    /// a confirmation; 1 switches the guard off.
    pub threshold: f64,
    /// The counts of the state this replica published last; `None` before its first publish.
    pub published: Option<CatalogCounts>,
    /// The Lease notes; `None` when the Lease could not be read.
    pub notes: Option<LeaseNotes>,
    /// The counts of the new state.
    pub new: CatalogCounts,
}

/// Why a new state may be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// The guard is off (`--catalog-shrink-threshold 1`).
    GuardOff,
    /// The new state loses no more than the threshold of any kind.
    WithinThreshold,
    /// A human confirmed exactly the new state's counts.
    Confirmed,
}

/// Why a new state is held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// It loses more than the threshold of a kind compared with the baseline.
    Shrink,
    /// This replica has published nothing yet, no replica recorded a catalog on the Lease, and
    /// the new state gives no SKR a single module.
    EmptyAtStart,
    /// This replica has published nothing yet and cannot read the Lease, so it does not know
    /// what the SKRs hold.
    LeaseUnreadable,
}

impl HoldReason {
    /// The reason as a log field value.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::Shrink => "shrink",
            HoldReason::EmptyAtStart => "empty_at_start",
            HoldReason::LeaseUnreadable => "lease_unreadable",
        }
    }
}

/// What the guard decided about a new state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Publish the new state.
    Publish(Publish),
    /// Keep the published state (before a replica's first publish: publish nothing).
    Hold {
        /// Why.
        reason: HoldReason,
        /// What the new state was compared with: the baseline, else the recorded counts.
        baseline: Option<CatalogCounts>,
        /// [`CatalogCounts::shrink_from`] the baseline (1 when there is none).
        fraction: f64,
    },
}

/// Decides whether the state with `check.new` may be published.
///
/// - The guard is off when the threshold is 1 (or more).
/// - The baseline is the state this replica published last; a replica that has published
///   nothing yet uses the counts recorded on the Lease, and holds if it cannot read the Lease.
/// - With a baseline, the state is published when it loses no more than the threshold of
///   either kind, or when a human confirmed exactly its counts; otherwise it is held.
/// - Without one (a cold start with nothing recorded), the state is published unless it holds
///   no reachable ModuleReleaseMeta and is not confirmed.
///
/// # Guarantees
/// Pure: replicas with equal inputs decide alike. A confirmation approves only a state with
/// exactly the counts it names.
pub fn decide(check: &Check) -> Verdict {
    let Check { threshold, published, notes, new } = check;
    if *threshold >= 1.0 {
        return Verdict::Publish(Publish::GuardOff);
    }
    // A replica that has published knows its baseline; without the Lease it only lacks a
    // confirmation.
    let unread = LeaseNotes::default();
    let notes = match (notes, published) {
        (Some(notes), _) => notes,
        (None, Some(_)) => &unread,
        (None, None) => return Verdict::Hold { reason: HoldReason::LeaseUnreadable, baseline: None, fraction: 1.0 },
    };
    let confirmed = notes.confirmed.as_ref() == Some(new);
    match published.or(notes.recorded) {
        Some(baseline) => {
            let fraction = new.shrink_from(&baseline);
            if fraction <= *threshold {
                Verdict::Publish(Publish::WithinThreshold)
            } else if confirmed {
                Verdict::Publish(Publish::Confirmed)
            } else {
                Verdict::Hold { reason: HoldReason::Shrink, baseline: Some(baseline), fraction }
            }
        }
        None if new.release_metas > 0 => Verdict::Publish(Publish::WithinThreshold),
        None if confirmed => Verdict::Publish(Publish::Confirmed),
        None => Verdict::Hold { reason: HoldReason::EmptyAtStart, baseline: None, fraction: 1.0 },
    }
}

#[cfg(test)]
mod tests;
