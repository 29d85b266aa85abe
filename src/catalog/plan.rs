//! What to do in one SKR for one kind (pure): compare the desired objects with what the SKR
//! holds and with what this replica remembers writing there.
//!
//! How catalogsync knows a copy already matches without rewriting it (spec section 3):
//!
//! - **Cold** (first sync of an SKR by this replica, or after any failure): the SKR is listed
//!   in full and each copy is compared with the desired body
//!   ([`crate::catalog::render::CopyDigest`]: equal `spec`, desired labels and annotations
//!   present). Matching copies are not written.
//! - **Warm**: the SKR is listed metadata-only. A copy is unchanged when its
//!   `resourceVersion` is the one this replica last saw for it *and* the desired body has the
//!   content hash it had then. Any edit in the SKR changes the resourceVersion; any KCP change
//!   changes the hash. Either leads to an apply.
//!
//! Orphans are copies carrying a `catalog-sync` managed-fields entry that are not desired.

use std::collections::{BTreeMap, HashMap};

use crate::catalog::DesiredObject;
use crate::catalog::render::CopyDigest;

/// An object of one kind found in the SKR sync namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// Object name.
    pub name: String,
    /// Its `resourceVersion`.
    pub resource_version: String,
    /// Whether a `catalog-sync` managed-fields entry exists, that is, whether it is ours to prune.
    pub managed: bool,
    /// What a full list (cold sync) showed of it; `None` after a metadata-only list.
    pub content: Option<CopyDigest>,
}

/// What this replica remembers of one kind in one SKR: per object name, the
/// `resourceVersion` it saw after its last write or verification, and the content hash of the
/// desired body at that time.
pub type KindMemory = HashMap<String, (String, u64)>;

/// The work for one kind in one SKR.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Objects to apply.
    pub apply: Vec<DesiredObject>,
    /// Names of managed orphans to delete.
    pub prune: Vec<String>,
    /// Objects already right: name, resourceVersion and desired hash to remember.
    pub unchanged: Vec<(String, String, u64)>,
}

impl Plan {
    /// Whether the plan makes no write.
    pub fn is_noop(&self) -> bool {
        self.apply.is_empty() && self.prune.is_empty()
    }
}

/// Plans one kind: apply what is missing or differs, prune managed orphans, keep the rest.
/// Unmanaged objects that are not desired are never touched.
pub fn plan(desired: &BTreeMap<String, DesiredObject>, observed: &[Observed], memory: &KindMemory) -> Plan {
    let mut out = Plan::default();
    let observed_by_name: HashMap<&str, &Observed> = observed.iter().map(|o| (o.name.as_str(), o)).collect();
    for (name, want) in desired {
        let Some(have) = observed_by_name.get(name.as_str()) else {
            out.apply.push(want.clone());
            continue;
        };
        let remembered = memory.get(name).is_some_and(|(rv, hash)| *rv == have.resource_version && *hash == want.hash);
        let verified = have.content.as_ref().is_some_and(|digest| digest.matches(&want.payload));
        if remembered || verified {
            out.unchanged.push((name.clone(), have.resource_version.clone(), want.hash));
        } else {
            out.apply.push(want.clone());
        }
    }
    for have in observed {
        if have.managed && !desired.contains_key(&have.name) {
            out.prune.push(have.name.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests;
