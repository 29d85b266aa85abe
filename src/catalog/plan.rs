//! What to do in one SKR for one kind (pure): compare the desired objects with what the SKR
//! holds and with what this replica remembers writing there.
//!
//! How catalogsync knows a copy already matches without rewriting it (R3.5 in
//! docs/catalog-rules.md):
//!
//! - **Cold** (first sync of an SKR by this replica, or after any failure): the SKR is listed
//!   in full and each copy is compared with the desired body
//!   ([`crate::catalog::render::CopyDigest`]: equal `spec`, desired labels and annotations
//!   present). Matching copies are not written.
//! - **Warm**: the SKR is listed metadata-only. A copy is unchanged when its
//!   `resourceVersion` is the one this replica last saw for it *and* the desired body has the
//!   content hash it had then. A KCP change changes the hash and leads to an apply. A write in
//!   the SKR changes the resourceVersion ([`needs_content`]): that kind is listed in full
//!   and planned as in a cold sync, so a copy that still holds the desired one (someone added
//!   a label, or lifecycle-manager, running beside catalogsync, applied its body) is not
//!   rewritten.
//!
//! - **Trusted** (a warm SKR listed in full or metadata-only within the resync period): no
//!   list at all ([`plan_from_memory`]). A copy whose desired body still has the content hash
//!   remembered for it is unchanged, any other is applied: a catalog change costs one write
//!   per changed copy. What memory cannot tell (a remembered copy no longer desired, whose
//!   prune needs the UID and resourceVersion of a list) falls back to a list. Drift in the
//!   SKR is found by the next list, at the latest one resync period after the last one.
//!
//! Orphans are copies carrying a `catalog-sync` managed-fields entry that are not desired.
//! Each is planned with the UID and `resourceVersion` it was listed with ([`Orphan`]), and
//! deleted only if it still has both: a copy recreated or changed since the list is judged
//! again by the next sync, not deleted on the strength of an old list.

use std::collections::{BTreeMap, HashMap};

use crate::catalog::DesiredObject;
use crate::catalog::render::CopyDigest;

/// An object of one kind found in the SKR sync namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// Object name.
    pub name: String,
    /// Its `metadata.uid` ("" when the SKR sent none).
    pub uid: String,
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
///
/// A replica holds one per kind for each of its SKRs (thousands, about 90 names each), so the
/// entries are compact: keyed by the xxh3 hash of the name, with the resourceVersion as a
/// number when it is one (as etcd's always are) and the text otherwise. A name-hash collision
/// could only make two names share an entry, whose resourceVersion then matches neither
/// object's (resourceVersions are unique within an apiserver): the copy is applied, never
/// wrongly skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindMemory(HashMap<u64, Remembered>);

/// One remembered copy: its `resourceVersion` and the desired content hash.
#[derive(Debug, Clone, PartialEq)]
struct Remembered {
    resource_version: ResourceVersion,
    hash: u64,
}

/// A `resourceVersion`, stored exactly: as a number when it is the canonical decimal form of
/// one (no sign, no leading zero), else as its text.
#[derive(Debug, Clone, PartialEq)]
enum ResourceVersion {
    Number(u64),
    Text(Box<str>),
}

impl ResourceVersion {
    fn of(rv: &str) -> Self {
        Self::number(rv).map_or_else(|| ResourceVersion::Text(rv.into()), ResourceVersion::Number)
    }

    /// The number `rv` is the canonical decimal form of, if any.
    fn number(rv: &str) -> Option<u64> {
        let canonical = !rv.is_empty() && rv.bytes().all(|b| b.is_ascii_digit()) && (rv == "0" || !rv.starts_with('0'));
        canonical.then(|| rv.parse().ok()).flatten()
    }

    fn text(&self) -> String {
        match self {
            ResourceVersion::Number(n) => n.to_string(),
            ResourceVersion::Text(text) => text.to_string(),
        }
    }

    fn is(&self, rv: &str) -> bool {
        match self {
            ResourceVersion::Number(n) => Self::number(rv) == Some(*n),
            ResourceVersion::Text(text) => **text == *rv,
        }
    }
}

fn name_key(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

impl KindMemory {
    /// Empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers that `name` had `resource_version` when its desired body hashed to `hash`.
    pub fn remember(&mut self, name: &str, resource_version: &str, hash: u64) {
        self.0.insert(name_key(name), Remembered { resource_version: ResourceVersion::of(resource_version), hash });
    }

    /// Forgets `name`.
    pub fn forget(&mut self, name: &str) {
        self.0.remove(&name_key(name));
    }

    /// Whether `name` is remembered with exactly this `resource_version`, whatever the hash.
    pub fn saw(&self, name: &str, resource_version: &str) -> bool {
        self.0.get(&name_key(name)).is_some_and(|r| r.resource_version.is(resource_version))
    }

    /// Whether `name` is remembered with exactly this `resource_version` and desired `hash`.
    pub fn matches(&self, name: &str, resource_version: &str, hash: u64) -> bool {
        self.0.get(&name_key(name)).is_some_and(|r| r.hash == hash && r.resource_version.is(resource_version))
    }

    /// Keeps only the names in `names` (what the SKR holds now).
    pub fn retain_names<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let keep: std::collections::HashSet<u64> = names.into_iter().map(name_key).collect();
        self.0.retain(|key, _| keep.contains(key));
    }

    /// A digest of everything remembered (each name's key, resourceVersion and content
    /// hash), independent of insertion order: what a replica keeps of this memory across
    /// restarts ([`KindMemory::recall`]).
    pub fn digest(&self) -> u128 {
        let mut entries: Vec<(&u64, &Remembered)> = self.0.iter().collect();
        entries.sort_unstable_by_key(|(key, _)| **key);
        let mut bytes = Vec::with_capacity(entries.len() * 32);
        for (key, remembered) in entries {
            let rv = remembered.resource_version.text();
            bytes.extend_from_slice(&key.to_le_bytes());
            bytes.extend_from_slice(&(rv.len() as u64).to_le_bytes());
            bytes.extend_from_slice(rv.as_bytes());
            bytes.extend_from_slice(&remembered.hash.to_le_bytes());
        }
        xxhash_rust::xxh3::xxh3_128(&bytes)
    }

    /// The memory a replica had when its [`digest`](Self::digest) was `digest`, rebuilt from
    /// a metadata-only list: every desired copy with the resourceVersion it is `observed`
    /// with and the content hash desired now. `None` unless that memory has exactly the
    /// digest, which holds only when every desired copy still has the resourceVersion it had
    /// when this replica last verified or wrote it (so the copy still holds what it held),
    /// the desired content is still what it was then, and no other name was remembered.
    pub fn recall(desired: &BTreeMap<String, DesiredObject>, observed: &[Observed], digest: u128) -> Option<Self> {
        let versions: HashMap<&str, &str> =
            observed.iter().map(|o| (o.name.as_str(), o.resource_version.as_str())).collect();
        let mut memory = Self::new();
        for (name, want) in desired {
            memory.remember(name, versions.get(name.as_str())?, want.hash);
        }
        (memory.digest() == digest).then_some(memory)
    }

    /// Number of remembered names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A managed orphan to delete, as it was listed. The delete carries its UID and
/// `resourceVersion` as preconditions, so a copy recreated (new UID) or changed (new
/// `resourceVersion`) since the list is not deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Object name.
    pub name: String,
    /// Its `metadata.uid` when listed ("" when the SKR sent none: no UID precondition then).
    pub uid: String,
    /// Its `resourceVersion` when listed ("" when the SKR sent none: no version precondition).
    pub resource_version: String,
}

/// The work for one kind in one SKR.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Objects to apply.
    pub apply: Vec<DesiredObject>,
    /// Managed orphans to delete.
    pub prune: Vec<Orphan>,
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
        let remembered = memory.matches(name, &have.resource_version, want.hash);
        let verified = have.content.as_ref().is_some_and(|digest| digest.holds(&want.digest));
        if remembered || verified {
            out.unchanged.push((name.clone(), have.resource_version.clone(), want.hash));
        } else {
            out.apply.push(want.clone());
        }
    }
    for have in observed {
        if have.managed && !desired.contains_key(&have.name) {
            out.prune.push(Orphan {
                name: have.name.clone(),
                uid: have.uid.clone(),
                resource_version: have.resource_version.clone(),
            });
        }
    }
    out
}

/// Plans one kind from memory alone, without a list, for an SKR whose memory is trusted (see
/// the module docs): every desired copy remembered with the content hash it has now is
/// unchanged (with its remembered resourceVersion), every other one is applied. `None` when
/// memory remembers a copy that is no longer desired: pruning it needs a list.
pub fn plan_from_memory(desired: &BTreeMap<String, DesiredObject>, memory: &KindMemory) -> Option<Plan> {
    let wanted: std::collections::HashSet<u64> = desired.keys().map(|name| name_key(name)).collect();
    if memory.0.keys().any(|key| !wanted.contains(key)) {
        return None;
    }
    let mut out = Plan::default();
    for (name, want) in desired {
        match memory.0.get(&name_key(name)) {
            Some(r) if r.hash == want.hash => out.unchanged.push((name.clone(), r.resource_version.text(), want.hash)),
            _ => out.apply.push(want.clone()),
        }
    }
    Some(out)
}

/// Whether a plan made from a metadata-only list would apply a copy that was written in the
/// SKR since this replica last saw it (a resourceVersion it does not remember): then the
/// copies must be read in full before deciding, since the write may have left the desired
/// copy in place.
pub fn needs_content(plan: &Plan, observed: &[Observed], memory: &KindMemory) -> bool {
    let unread: HashMap<&str, &str> = observed
        .iter()
        .filter(|o| o.content.is_none())
        .map(|o| (o.name.as_str(), o.resource_version.as_str()))
        .collect();
    plan.apply.iter().any(|want| unread.get(want.name.as_str()).is_some_and(|rv| !memory.saw(&want.name, rv)))
}

#[cfg(test)]
mod tests;
