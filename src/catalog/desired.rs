//! The desired catalog of one Kyma (pure): docs/catalog-rules.md section 2, whose rules
//! R2.1 to R2.6 are the six steps below.
//!
//! 1. Mandatory MRMs and MTs are skipped.
//! 2. An MT is allowed unless it is beta and the Kyma is not, or internal and the Kyma is not.
//! 3. An MRM keeps a channel only if an allowed MT named `<moduleName>-<version>` exists.
//! 4. A restricted module's MRM needs a non-empty `kymaSelector` that matches the Kyma. An MRM
//!    whose selector does not parse or is not a valid Kubernetes label selector (validated once,
//!    when the [`Snapshot`] is built) is skipped for every Kyma with a warning, whether its
//!    module is restricted or not: a restricted module fails closed. An MRM with a valid
//!    selector whose module is not restricted is skipped with a warning too.
//! 5. An MRM with a surviving channel is desired, its `spec.channels` cut to the survivors.
//! 6. The desired MTs are the allowed MTs referenced by a surviving channel.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::api::{BETA_LABEL, ChannelVersion, INTERNAL_LABEL, is_flag_on};
use crate::catalog::render::CopyDigest;
use crate::catalog::{CatalogKind, CopyBody, Snapshot, serialize_copy};

/// One object an SKR should hold.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredObject {
    /// Object name in the SKR sync namespace.
    pub name: String,
    /// What decides whether an SKR object holds the copy (shared with the snapshot).
    pub digest: Arc<CopyDigest>,
    /// The copy, serialized: the apply body.
    pub body: CopyBody,
    /// [`content_hash`](crate::catalog::content_hash) of the copy.
    pub hash: u64,
}

/// Everything one SKR should hold, by kind and name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredSet {
    /// ModuleTemplates by name.
    pub templates: BTreeMap<String, DesiredObject>,
    /// ModuleReleaseMetas by name.
    pub release_metas: BTreeMap<String, DesiredObject>,
}

impl DesiredSet {
    /// The objects of one kind.
    pub fn of(&self, kind: CatalogKind) -> &BTreeMap<String, DesiredObject> {
        match kind {
            CatalogKind::ModuleTemplate => &self.templates,
            CatalogKind::ModuleReleaseMeta => &self.release_metas,
        }
    }

    /// A stable fingerprint of the whole set: equal fingerprints mean equal sets.
    pub fn fingerprint(&self) -> u64 {
        let mut acc = xxhash_rust::xxh3::Xxh3::new();
        for (kind, objects) in [("mt", &self.templates), ("mrm", &self.release_metas)] {
            for (name, obj) in objects {
                acc.update(kind.as_bytes());
                acc.update(name.as_bytes());
                acc.update(&obj.hash.to_le_bytes());
            }
        }
        acc.digest()
    }

    /// Total number of objects.
    pub fn len(&self) -> usize {
        self.templates.len() + self.release_metas.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Something the filter skipped that an operator should hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// A non-restricted module's MRM carries a `kymaSelector`.
    SelectorOnUnrestrictedModule {
        /// MRM name.
        release_meta: String,
    },
    /// An MRM's `kymaSelector` does not parse or is not a valid Kubernetes label selector.
    InvalidSelector {
        /// MRM name.
        release_meta: String,
        /// Why (bounded in length).
        reason: String,
    },
}

crate::label_enum! {
    /// The kind of a [`Warning`]: the `reason` label of
    /// `catalogsync_catalog_skipped_release_metas`.
    pub enum WarningReason {
        /// [`Warning::InvalidSelector`].
        InvalidSelector => "invalid_selector",
        /// [`Warning::SelectorOnUnrestrictedModule`].
        SelectorOnUnrestrictedModule => "selector_on_unrestricted_module",
    }
}

impl Warning {
    /// The kind of warning, as a bounded metric label value.
    pub fn reason(&self) -> WarningReason {
        match self {
            Warning::InvalidSelector { .. } => WarningReason::InvalidSelector,
            Warning::SelectorOnUnrestrictedModule { .. } => WarningReason::SelectorOnUnrestrictedModule,
        }
    }
}

/// What of a Kyma the filter reads: its beta and internal flags and, for each restricted
/// module's MRM with a valid, non-empty `kymaSelector`, whether the selector matches it (an
/// invalid one is never evaluated). The desired set is a function of the catalog and the
/// profile alone, so Kymas with equal profiles (nearly all of a fleet: a handful of profiles
/// for thousands of Kymas) share one desired set ([`ProfileCache`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Profile {
    beta: bool,
    internal: bool,
    /// By MRM name.
    selections: BTreeMap<String, bool>,
}

impl Profile {
    /// The profile of a Kyma with `kyma_labels` under `snapshot`.
    pub fn of(
        snapshot: &Snapshot,
        kyma_labels: &BTreeMap<String, String>,
        restricted_modules: &BTreeSet<String>,
    ) -> Self {
        let selections = selectable(snapshot, restricted_modules)
            .map(|(name, sel)| (name.to_owned(), sel.matches(kyma_labels)))
            .collect();
        Self {
            beta: is_flag_on(kyma_labels.get(BETA_LABEL)),
            internal: is_flag_on(kyma_labels.get(INTERNAL_LABEL)),
            selections,
        }
    }

    /// The profile that sees everything a Kyma can see: beta, internal, and matched by every
    /// valid, non-empty selector of a restricted module. The desired set only grows with each
    /// flag and each matched selector, so this profile's set is the union of every Kyma's.
    pub fn widest(snapshot: &Snapshot, restricted_modules: &BTreeSet<String>) -> Self {
        let selections = selectable(snapshot, restricted_modules).map(|(name, _)| (name.to_owned(), true)).collect();
        Self { beta: true, internal: true, selections }
    }
}

/// The restricted, non-mandatory MRMs whose `kymaSelector` is valid and not empty: the ones a
/// [`Profile`] records a selection for.
fn selectable<'a>(
    snapshot: &'a Snapshot,
    restricted_modules: &'a BTreeSet<String>,
) -> impl Iterator<Item = (&'a str, &'a crate::catalog::selector::KymaSelector)> {
    snapshot
        .release_metas
        .values()
        .filter(|mrm| !mrm.mandatory && restricted_modules.contains(&mrm.module_name))
        .filter_map(|mrm| match &mrm.kyma_selector {
            Some(Ok(sel)) if !sel.is_empty() => Some((mrm.name.as_str(), sel)),
            _ => None,
        })
}

/// The union of the desired sets of every Kyma: what [`Profile::widest`] gets. The shrink
/// guard counts it to tell how much of the catalog the fleet would lose.
pub fn widest_desired_set(snapshot: &Snapshot, restricted_modules: &BTreeSet<String>) -> DesiredSet {
    filter_profile(snapshot, &Profile::widest(snapshot, restricted_modules), restricted_modules).0
}

/// Computes the desired catalog of a Kyma with `kyma_labels`, given the KCP catalog and the
/// configured restricted module names. Pure; the second value lists what was skipped with a
/// warning.
pub fn desired_set(
    snapshot: &Snapshot,
    kyma_labels: &BTreeMap<String, String>,
    restricted_modules: &BTreeSet<String>,
) -> (DesiredSet, Vec<Warning>) {
    filter_profile(snapshot, &Profile::of(snapshot, kyma_labels, restricted_modules), restricted_modules)
}

/// The desired catalog of every Kyma with `profile`.
fn filter_profile(
    snapshot: &Snapshot,
    profile: &Profile,
    restricted_modules: &BTreeSet<String>,
) -> (DesiredSet, Vec<Warning>) {
    let (kyma_beta, kyma_internal) = (profile.beta, profile.internal);
    let mut out = DesiredSet::default();
    let mut warnings = Vec::new();
    let mut wanted_templates = BTreeSet::new();

    for mrm in snapshot.release_metas.values() {
        if mrm.mandatory {
            continue;
        }
        let restricted = restricted_modules.contains(&mrm.module_name);
        match (&mrm.kyma_selector, restricted) {
            // Checked first: an invalid selector never reaches a match (fail closed).
            (Some(Err(reason)), _) => {
                warnings.push(Warning::InvalidSelector { release_meta: mrm.name.clone(), reason: reason.clone() });
                continue;
            }
            (Some(Ok(_)), false) => {
                warnings.push(Warning::SelectorOnUnrestrictedModule { release_meta: mrm.name.clone() });
                continue;
            }
            (None, true) => continue,
            (Some(Ok(sel)), true) => {
                // An empty selector selects no Kyma (and is not in the profile).
                if sel.is_empty() {
                    continue;
                }
                if profile.selections.get(&mrm.name) != Some(&true) {
                    continue;
                }
            }
            (None, false) => {}
        }

        let survivors: Vec<ChannelVersion> = mrm
            .channels
            .iter()
            .filter(|c| {
                let mt_name = format!("{}-{}", mrm.module_name, c.version);
                snapshot.templates.get(&mt_name).is_some_and(|mt| mt.is_allowed_for(kyma_beta, kyma_internal))
            })
            .cloned()
            .collect();
        if survivors.is_empty() {
            continue;
        }
        for c in &survivors {
            wanted_templates.insert(format!("{}-{}", mrm.module_name, c.version));
        }
        let object = if survivors.len() == mrm.channels.len() {
            DesiredObject {
                name: mrm.name.clone(),
                digest: Arc::clone(&mrm.digest),
                body: mrm.body.clone(),
                hash: mrm.hash,
            }
        } else {
            let mut copy = (*mrm.payload).clone();
            if let Some(spec) = copy.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("channels".into(), serde_json::to_value(&survivors).unwrap_or_default());
            }
            let (body, hash) = serialize_copy(&copy);
            DesiredObject { name: mrm.name.clone(), digest: Arc::new(CopyDigest::of(&copy)), body, hash }
        };
        out.release_metas.insert(mrm.name.clone(), object);
    }

    for mt in snapshot.templates.values() {
        // By `<spec.moduleName>-<spec.version>`, not by name (R2.6 in docs/catalog-rules.md, as
        // KLM does), so that catalogsync syncs exactly what KLM synced and a fleet moves over
        // unchanged.
        let key = format!("{}-{}", mt.module_name, mt.version);
        if mt.is_allowed_for(kyma_beta, kyma_internal) && wanted_templates.contains(&key) {
            out.templates.insert(
                mt.name.clone(),
                DesiredObject {
                    name: mt.name.clone(),
                    digest: Arc::clone(&mt.digest),
                    body: mt.body.clone(),
                    hash: mt.hash,
                },
            );
        }
    }
    (out, warnings)
}

/// What the filter gives for one profile: the desired set, the warnings of what it skipped, and
/// the set's fingerprint.
#[derive(Debug)]
pub struct Filtered {
    /// The objects.
    pub set: DesiredSet,
    /// What the filter skipped with a warning.
    pub warnings: Vec<Warning>,
    /// [`DesiredSet::fingerprint`] of `set`.
    pub fingerprint: u64,
}

impl Filtered {
    fn new((set, warnings): (DesiredSet, Vec<Warning>)) -> Self {
        let fingerprint = set.fingerprint();
        Self { set, warnings, fingerprint }
    }
}

/// The desired sets of one catalog snapshot, computed once per [`Profile`] and shared by the
/// Kymas that have it. A catalog change otherwise costs every Kyma two computations of its
/// set (to decide whether it is affected, then in its sync), each cloning and re-serializing
/// the MRMs whose channels it cuts. Holds at most [`ProfileCache::MAX_PROFILES`] sets (about
/// 10 KB each); Kymas with further profiles get theirs computed each time.
///
/// Valid for one snapshot and one set of restricted modules: the catalog state that holds it
/// is rebuilt on every catalog change, and the restricted modules are fixed at start.
#[derive(Debug, Default)]
pub struct ProfileCache {
    by_profile: std::sync::Mutex<std::collections::HashMap<Profile, Arc<Filtered>>>,
}

impl ProfileCache {
    /// Most profiles kept.
    pub const MAX_PROFILES: usize = 128;

    /// The desired set of a Kyma with `kyma_labels`: [`desired_set`], shared.
    pub fn get(
        &self,
        snapshot: &Snapshot,
        kyma_labels: &BTreeMap<String, String>,
        restricted_modules: &BTreeSet<String>,
    ) -> Arc<Filtered> {
        let profile = Profile::of(snapshot, kyma_labels, restricted_modules);
        if let Some(found) = self.lock().get(&profile) {
            return Arc::clone(found);
        }
        // Computed outside the lock; two syncs racing for a new profile compute it twice.
        let desired = Arc::new(Filtered::new(filter_profile(snapshot, &profile, restricted_modules)));
        let mut cache = self.lock();
        if cache.len() < Self::MAX_PROFILES {
            cache.insert(profile, Arc::clone(&desired));
        }
        desired
    }

    /// Number of profiles held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no profile is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Profile, Arc<Filtered>>> {
        // Inserts are single operations: a panic elsewhere cannot leave the map inconsistent.
        self.by_profile.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
