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
/// entries are compact: 24 bytes each in a vector sorted by the xxh3 hash of the name (a hash
/// map took about 2.5 times that), with the resourceVersion as a number when it is one (as
/// etcd's always are) and, rarely, as text kept aside. A name-hash collision could only make
/// two names share an entry, whose resourceVersion then matches neither object's
/// (resourceVersions are unique within an apiserver): the copy is applied, never wrongly
/// skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindMemory {
    /// Sorted by `key`, one entry per key.
    entries: Vec<Remembered>,
    /// The resourceVersions that are not canonical numbers, sorted by key; their entries'
    /// `number` means nothing.
    texts: Vec<(u64, Box<str>)>,
}

/// One remembered copy: the hash of its name, its `resourceVersion` as a number, and the
/// desired content hash.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Remembered {
    key: u64,
    number: u64,
    hash: u64,
}

/// The number `rv` is the canonical decimal form of (no sign, no leading zero), if any.
fn rv_number(rv: &str) -> Option<u64> {
    let canonical = !rv.is_empty() && rv.bytes().all(|b| b.is_ascii_digit()) && (rv == "0" || !rv.starts_with('0'));
    canonical.then(|| rv.parse().ok()).flatten()
}

/// Longest resourceVersion remembered: a copy whose version is longer is not remembered (its
/// next sync verifies it from a list), so no SKR can park more than this per copy. The
/// executor refuses longer ones anyway ([`crate::sync::wire`]).
pub const MAX_REMEMBERED_VERSION: usize = 64;

/// Most heap bytes one remembered copy takes: its 24-byte entry, and for a resourceVersion
/// that is not a number, its text (a 24-byte slot and at most [`MAX_REMEMBERED_VERSION`]
/// bytes). A replica remembers only desired copies, so an SKR's memory holds at most this
/// times the catalog entries its Kyma may see, whatever the SKR sends.
pub const MAX_BYTES_PER_COPY: usize = size_of::<Remembered>() + size_of::<(u64, Box<str>)>() + MAX_REMEMBERED_VERSION;

fn name_key(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

impl KindMemory {
    /// Empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    fn find(&self, key: u64) -> std::result::Result<usize, usize> {
        self.entries.binary_search_by_key(&key, |e| e.key)
    }

    fn text(&self, key: u64) -> Option<&str> {
        let i = self.texts.binary_search_by_key(&key, |(k, _)| *k).ok()?;
        Some(&self.texts[i].1)
    }

    /// Whether the entry remembers exactly `resource_version`.
    fn is(&self, entry: &Remembered, resource_version: &str) -> bool {
        match self.text(entry.key) {
            Some(text) => text == resource_version,
            None => rv_number(resource_version) == Some(entry.number),
        }
    }

    /// Remembers that `name` had `resource_version` when its desired body hashed to `hash`
    /// (forgets `name` when the version is longer than [`MAX_REMEMBERED_VERSION`]).
    pub fn remember(&mut self, name: &str, resource_version: &str, hash: u64) {
        if resource_version.len() > MAX_REMEMBERED_VERSION {
            self.forget(name);
            return;
        }
        let key = name_key(name);
        let text = self.texts.binary_search_by_key(&key, |(k, _)| *k);
        let number = match (rv_number(resource_version), text) {
            (Some(number), Ok(i)) => {
                self.texts.remove(i);
                number
            }
            (Some(number), Err(_)) => number,
            (None, Ok(i)) => {
                self.texts[i].1 = resource_version.into();
                0
            }
            (None, Err(i)) => {
                self.texts.insert(i, (key, resource_version.into()));
                0
            }
        };
        let entry = Remembered { key, number, hash };
        match self.find(key) {
            Ok(i) => self.entries[i] = entry,
            Err(i) => self.entries.insert(i, entry),
        }
    }

    /// Forgets `name`.
    pub fn forget(&mut self, name: &str) {
        let key = name_key(name);
        if let Ok(i) = self.find(key) {
            self.entries.remove(i);
            self.texts.retain(|(k, _)| *k != key);
        }
    }

    /// The content hash remembered for `name`.
    fn remembered_hash(&self, name: &str) -> Option<u64> {
        self.find(name_key(name)).ok().map(|i| self.entries[i].hash)
    }

    fn rv_text(&self, entry: &Remembered) -> String {
        self.text(entry.key).map_or_else(|| entry.number.to_string(), str::to_owned)
    }

    /// Whether `name` is remembered with exactly this `resource_version`, whatever the hash.
    pub fn saw(&self, name: &str, resource_version: &str) -> bool {
        self.find(name_key(name)).is_ok_and(|i| self.is(&self.entries[i], resource_version))
    }

    /// Whether `name` is remembered with exactly this `resource_version` and desired `hash`.
    pub fn matches(&self, name: &str, resource_version: &str, hash: u64) -> bool {
        self.find(name_key(name))
            .is_ok_and(|i| self.entries[i].hash == hash && self.is(&self.entries[i], resource_version))
    }

    /// Keeps only the names in `names` (what the SKR holds now).
    pub fn retain_names<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let keep: std::collections::HashSet<u64> = names.into_iter().map(name_key).collect();
        self.entries.retain(|e| keep.contains(&e.key));
        self.texts.retain(|(k, _)| keep.contains(k));
    }

    /// Gives back the room the vectors grew beyond what they hold: called when a sync is done
    /// with the memory, which then waits for the next sync with no spare capacity.
    pub fn shrink(&mut self) {
        self.entries.shrink_to_fit();
        self.texts.shrink_to_fit();
    }

    /// A digest of everything remembered (each name's key, resourceVersion and content
    /// hash), independent of insertion order: what a replica keeps of this memory across
    /// restarts ([`KindMemory::recall`]).
    pub fn digest(&self) -> u128 {
        let mut bytes = Vec::with_capacity(self.entries.len() * 40);
        for entry in &self.entries {
            let rv = self.rv_text(entry);
            bytes.extend_from_slice(&entry.key.to_le_bytes());
            bytes.extend_from_slice(&(rv.len() as u64).to_le_bytes());
            bytes.extend_from_slice(rv.as_bytes());
            bytes.extend_from_slice(&entry.hash.to_le_bytes());
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

    /// Heap bytes this memory holds (its vectors' capacity and the texts).
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Remembered>()
            + self.texts.capacity() * size_of::<(u64, Box<str>)>()
            + self.texts.iter().map(|(_, text)| text.len()).sum::<usize>()
    }

    /// Number of remembered names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
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
    /// Objects already right, as a list showed them: name, resourceVersion and desired hash
    /// to remember.
    pub unchanged: Vec<(String, String, u64)>,
    /// Objects already right as the memory holds them (a plan from memory): their entries
    /// stand as they are.
    pub kept: usize,
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
        // What a full list read decides; memory stands in for content only where none was
        // read (a metadata-only list), so a memory that pairs a resourceVersion with content
        // never read here (a shard record) cannot hide a drifted copy from a full list.
        let unchanged = match &have.content {
            Some(digest) => digest.holds(&want.digest),
            None => memory.matches(name, &have.resource_version, want.hash),
        };
        if unchanged {
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
/// unchanged (its memory entry stays), every other one is applied. `None` when
/// memory remembers a copy that is no longer desired: pruning it needs a list.
///
/// A catalog change runs this for every SKR, so it allocates only for what it applies: the
/// copies memory already holds right are counted ([`Plan::kept`]), not listed.
pub fn plan_from_memory(desired: &BTreeMap<String, DesiredObject>, memory: &KindMemory) -> Option<Plan> {
    let mut wanted: Vec<u64> = desired.keys().map(|name| name_key(name)).collect();
    wanted.sort_unstable();
    if memory.entries.iter().any(|e| wanted.binary_search(&e.key).is_err()) {
        return None;
    }
    let mut out = Plan::default();
    for (name, want) in desired {
        if memory.remembered_hash(name) == Some(want.hash) {
            out.kept += 1;
        } else {
            out.apply.push(want.clone());
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
