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
//!
//! One walk over the catalog (`filter_profile`) applies the rules and tells each verdict, with
//! its reason, to a `Verdicts` observer: [`desired_set`] passes one that keeps nothing, and
//! [`explain()`] one that keeps everything, so `catalogsync explain` cannot tell a different
//! story than the filter the controller runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::api::{BETA_LABEL, ChannelVersion, INTERNAL_LABEL, is_flag_on};
use crate::catalog::render::CopyDigest;
pub use crate::catalog::snapshot::Disallowed;
use crate::catalog::{CatalogKind, CopyBody, MrmView, MtView, Snapshot, serialize_copy};

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
    filter_profile(snapshot, &Profile::widest(snapshot, restricted_modules), restricted_modules, &mut ()).0
}

/// Computes the desired catalog of a Kyma with `kyma_labels`, given the KCP catalog and the
/// configured restricted module names. Pure; the second value lists what was skipped with a
/// warning.
pub fn desired_set(
    snapshot: &Snapshot,
    kyma_labels: &BTreeMap<String, String>,
    restricted_modules: &BTreeSet<String>,
) -> (DesiredSet, Vec<Warning>) {
    filter_profile(snapshot, &Profile::of(snapshot, kyma_labels, restricted_modules), restricted_modules, &mut ())
}

crate::label_enum! {
    /// Why a ModuleReleaseMeta is not desired for a Kyma (R2.1, R2.4, R2.5), in the order
    /// checked.
    pub enum ReleaseMetaSkip {
        /// `spec.mandatory` is set (R2.1).
        Mandatory => "mandatory",
        /// Its `kymaSelector` does not parse or is not a valid label selector (R2.4 1, with the
        /// warning of the same name).
        InvalidSelector => "invalid_selector",
        /// A valid `kymaSelector` on a module that is not restricted (R2.4 2, with the warning
        /// of the same name).
        SelectorOnUnrestrictedModule => "selector_on_unrestricted_module",
        /// A restricted module's MRM without a `kymaSelector` (or a null one): it matches no
        /// Kyma (R2.4 3).
        RestrictedWithoutSelector => "restricted_without_selector",
        /// A restricted module's MRM with an empty `kymaSelector`: it matches no Kyma (R2.4 3).
        RestrictedEmptySelector => "restricted_empty_selector",
        /// A restricted module's `kymaSelector` does not match the Kyma's labels (R2.4 4).
        SelectorDoesNotMatch => "selector_does_not_match",
        /// It has no channels (R2.5).
        NoChannels => "no_channels",
        /// Every channel entry was cut (R2.3, R2.5); the channels say why.
        NoChannelSurvives => "no_channel_survives",
    }
}

/// Why a channel entry of a considered ModuleReleaseMeta is cut (R2.3): the lookup is by the
/// name `<spec.moduleName>-<version>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelCut {
    /// No ModuleTemplate has that name.
    NoTemplate,
    /// The ModuleTemplate of that name is not allowed for the Kyma.
    TemplateDisallowed(Disallowed),
}

impl ChannelCut {
    /// Every value.
    pub const ALL: [ChannelCut; 4] = [
        ChannelCut::NoTemplate,
        ChannelCut::TemplateDisallowed(Disallowed::Mandatory),
        ChannelCut::TemplateDisallowed(Disallowed::Beta),
        ChannelCut::TemplateDisallowed(Disallowed::Internal),
    ];

    /// The reason code, as `catalogsync explain` prints it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ChannelCut::NoTemplate => "no_template",
            ChannelCut::TemplateDisallowed(Disallowed::Mandatory) => "template_mandatory",
            ChannelCut::TemplateDisallowed(Disallowed::Beta) => "template_beta",
            ChannelCut::TemplateDisallowed(Disallowed::Internal) => "template_internal",
        }
    }
}

/// Why a ModuleTemplate is not desired for a Kyma (R2.2, R2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TemplateSkip {
    /// It is not allowed for the Kyma (checked first).
    Disallowed(Disallowed),
    /// It is allowed, but no surviving channel of a desired ModuleReleaseMeta offers its
    /// `<spec.moduleName>-<spec.version>` (R2.6).
    NotReferenced,
}

impl TemplateSkip {
    /// Every value.
    pub const ALL: [TemplateSkip; 4] = [
        TemplateSkip::Disallowed(Disallowed::Mandatory),
        TemplateSkip::Disallowed(Disallowed::Beta),
        TemplateSkip::Disallowed(Disallowed::Internal),
        TemplateSkip::NotReferenced,
    ];

    /// The reason code, as `catalogsync explain` prints it.
    pub const fn as_str(self) -> &'static str {
        match self {
            TemplateSkip::Disallowed(d) => d.as_str(),
            TemplateSkip::NotReferenced => "not_referenced",
        }
    }
}

/// What the filter decides for each object, told as it decides it. [`desired_set`] passes
/// `()`, which keeps nothing (and compiles to nothing); [`explain()`] keeps every verdict. One
/// walk over the catalog decides both, so an explanation cannot disagree with the desired set.
trait Verdicts {
    /// The verdict on one channel entry of a ModuleReleaseMeta that passed its gates (told
    /// before the verdict on the ModuleReleaseMeta itself).
    fn channel(&mut self, mrm: &MrmView, entry: &ChannelVersion, template: &str, verdict: Result<(), ChannelCut>);
    /// The verdict on a ModuleReleaseMeta.
    fn release_meta(&mut self, mrm: &MrmView, verdict: Result<(), ReleaseMetaSkip>);
    /// The verdict on a ModuleTemplate.
    fn template(&mut self, mt: &MtView, verdict: Result<(), TemplateSkip>);
}

impl Verdicts for () {
    #[inline(always)]
    fn channel(&mut self, _: &MrmView, _: &ChannelVersion, _: &str, _: Result<(), ChannelCut>) {}
    #[inline(always)]
    fn release_meta(&mut self, _: &MrmView, _: Result<(), ReleaseMetaSkip>) {}
    #[inline(always)]
    fn template(&mut self, _: &MtView, _: Result<(), TemplateSkip>) {}
}

/// Whether a ModuleReleaseMeta is considered for a Kyma with `profile` (R2.1, R2.4), before its
/// channels are looked at.
fn release_meta_gate(
    mrm: &MrmView,
    profile: &Profile,
    restricted_modules: &BTreeSet<String>,
) -> Result<(), ReleaseMetaSkip> {
    if mrm.mandatory {
        return Err(ReleaseMetaSkip::Mandatory);
    }
    let restricted = restricted_modules.contains(&mrm.module_name);
    match (&mrm.kyma_selector, restricted) {
        // Checked first: an invalid selector never reaches a match (fail closed).
        (Some(Err(_)), _) => Err(ReleaseMetaSkip::InvalidSelector),
        (Some(Ok(_)), false) => Err(ReleaseMetaSkip::SelectorOnUnrestrictedModule),
        (None, true) => Err(ReleaseMetaSkip::RestrictedWithoutSelector),
        // An empty selector selects no Kyma (and is not in the profile).
        (Some(Ok(sel)), true) if sel.is_empty() => Err(ReleaseMetaSkip::RestrictedEmptySelector),
        (Some(Ok(_)), true) if profile.selections.get(&mrm.name) != Some(&true) => {
            Err(ReleaseMetaSkip::SelectorDoesNotMatch)
        }
        (Some(Ok(_)), true) | (None, false) => Ok(()),
    }
}

/// The warning a skipped ModuleReleaseMeta is reported with, if any (R2.4).
fn warning_of(mrm: &MrmView, skip: ReleaseMetaSkip) -> Option<Warning> {
    match (skip, &mrm.kyma_selector) {
        (ReleaseMetaSkip::InvalidSelector, Some(Err(reason))) => {
            Some(Warning::InvalidSelector { release_meta: mrm.name.clone(), reason: reason.clone() })
        }
        (ReleaseMetaSkip::SelectorOnUnrestrictedModule, _) => {
            Some(Warning::SelectorOnUnrestrictedModule { release_meta: mrm.name.clone() })
        }
        _ => None,
    }
}

/// Whether a channel entry survives (R2.3): an allowed ModuleTemplate named `template` exists.
fn channel_gate(snapshot: &Snapshot, template: &str, kyma_beta: bool, kyma_internal: bool) -> Result<(), ChannelCut> {
    match snapshot.templates.get(template) {
        None => Err(ChannelCut::NoTemplate),
        Some(mt) => {
            mt.disallowed_for(kyma_beta, kyma_internal).map_or(Ok(()), |d| Err(ChannelCut::TemplateDisallowed(d)))
        }
    }
}

/// The desired catalog of every Kyma with `profile`; tells `verdicts` every decision.
fn filter_profile(
    snapshot: &Snapshot,
    profile: &Profile,
    restricted_modules: &BTreeSet<String>,
    verdicts: &mut impl Verdicts,
) -> (DesiredSet, Vec<Warning>) {
    let (kyma_beta, kyma_internal) = (profile.beta, profile.internal);
    let mut out = DesiredSet::default();
    let mut warnings = Vec::new();
    let mut wanted_templates = BTreeSet::new();

    for mrm in snapshot.release_metas.values() {
        if let Err(skip) = release_meta_gate(mrm, profile, restricted_modules) {
            warnings.extend(warning_of(mrm, skip));
            verdicts.release_meta(mrm, Err(skip));
            continue;
        }

        let survivors: Vec<ChannelVersion> = mrm
            .channels
            .iter()
            .filter(|c| {
                let mt_name = format!("{}-{}", mrm.module_name, c.version);
                let verdict = channel_gate(snapshot, &mt_name, kyma_beta, kyma_internal);
                verdicts.channel(mrm, c, &mt_name, verdict);
                verdict.is_ok()
            })
            .cloned()
            .collect();
        if survivors.is_empty() {
            let skip =
                if mrm.channels.is_empty() { ReleaseMetaSkip::NoChannels } else { ReleaseMetaSkip::NoChannelSurvives };
            verdicts.release_meta(mrm, Err(skip));
            continue;
        }
        verdicts.release_meta(mrm, Ok(()));
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
        let verdict = match mt.disallowed_for(kyma_beta, kyma_internal) {
            Some(d) => Err(TemplateSkip::Disallowed(d)),
            None if wanted_templates.contains(&format!("{}-{}", mt.module_name, mt.version)) => Ok(()),
            None => Err(TemplateSkip::NotReferenced),
        };
        verdicts.template(mt, verdict);
        if verdict.is_ok() {
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
        let desired = Arc::new(Filtered::new(filter_profile(snapshot, &profile, restricted_modules, &mut ())));
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

pub mod explain;

pub use explain::{ChannelVerdict, Explanation, ReleaseMetaVerdict, TemplateVerdict, explain};

#[cfg(test)]
mod tests;
