//! Why a Kyma gets what it gets (pure): every catalog entry with the filter's verdict on it
//! (docs/catalog-rules.md section 2), the answer of `catalogsync explain`.
//!
//! The verdicts are told by the walk that computes the desired set (`filter_profile`, the one
//! [`desired_set`](super::desired_set) makes), so an explanation's desired entries are the
//! desired set: [`Explanation::desired`] is that set, computed alongside.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Serialize, Serializer};

use super::{
    ChannelCut, DesiredSet, Disallowed, Profile, ReleaseMetaSkip, TemplateSkip, Verdicts, Warning, filter_profile,
};
use crate::api::ChannelVersion;
use crate::catalog::{MrmView, MtView, Snapshot};

/// Longest text of a KCP object kept in a reason or detail (a `kymaSelector` problem, why an
/// object is malformed, a module name): objects are written by people and tools, not by
/// catalogsync, and what they hold reaches a terminal.
pub const DETAIL_CHARS: usize = 256;

/// The filter's verdict on every catalog entry for one Kyma.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The Kyma may see beta versions (its label `operator.kyma-project.io/beta`).
    #[serde(skip)]
    pub beta: bool,
    /// The Kyma may see internal versions (its label `operator.kyma-project.io/internal`).
    #[serde(skip)]
    pub internal: bool,
    /// Every ModuleReleaseMeta of the catalog, by name.
    #[serde(rename = "moduleReleaseMetas")]
    pub release_metas: Vec<ReleaseMetaVerdict>,
    /// Every ModuleTemplate of the catalog (old-style ones aside), by name.
    #[serde(rename = "moduleTemplates")]
    pub templates: Vec<TemplateVerdict>,
    /// Old-style ModuleTemplates (a `spec` without `moduleName`): never synced (R1.6).
    pub old_style_templates: Vec<String>,
    /// Objects that do not parse: left out of the catalog (R1.6).
    pub malformed: Vec<MalformedObject>,
    /// The desired set, as [`desired_set`](super::desired_set) computes it.
    #[serde(skip)]
    pub desired: DesiredSet,
    /// The warnings of [`desired_set`](super::desired_set).
    #[serde(skip)]
    pub warnings: Vec<Warning>,
}

impl Explanation {
    /// Names of the ModuleReleaseMetas the verdicts call desired.
    pub fn desired_release_metas(&self) -> BTreeSet<&str> {
        self.release_metas.iter().filter(|v| v.desired).map(|v| v.name.as_str()).collect()
    }

    /// Names of the ModuleTemplates the verdicts call desired.
    pub fn desired_templates(&self) -> BTreeSet<&str> {
        self.templates.iter().filter(|v| v.desired).map(|v| v.name.as_str()).collect()
    }
}

/// The verdict on one ModuleReleaseMeta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseMetaVerdict {
    /// `metadata.name`.
    pub name: String,
    /// `spec.moduleName` (at most [`DETAIL_CHARS`] characters, control characters replaced).
    pub module: String,
    /// Whether the Kyma's SKR gets it.
    pub desired: bool,
    /// Why not, when not desired.
    pub reason: Option<ReleaseMetaSkip>,
    /// More on the reason, for people: why the selector is invalid. Not a stable format.
    pub detail: Option<String>,
    /// The verdict on each channel entry, in `spec.channels` order; empty when the
    /// ModuleReleaseMeta was skipped before its channels were looked at.
    pub channels: Vec<ChannelVerdict>,
}

/// The verdict on one channel entry of a ModuleReleaseMeta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelVerdict {
    /// `channel`.
    pub channel: String,
    /// `version`.
    pub version: String,
    /// The ModuleTemplate name it is looked up by: `<spec.moduleName>-<version>`.
    pub template: String,
    /// Whether it stays in the SKR's copy.
    pub survives: bool,
    /// Why it is cut, when it is.
    pub reason: Option<ChannelCut>,
}

/// The verdict on one ModuleTemplate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateVerdict {
    /// `metadata.name`.
    pub name: String,
    /// `spec.moduleName` (bounded as [`ReleaseMetaVerdict::module`]).
    pub module: String,
    /// `spec.version` (bounded likewise).
    pub version: String,
    /// Whether the Kyma's SKR gets it.
    pub desired: bool,
    /// Why not, when not desired.
    pub reason: Option<TemplateSkip>,
    /// More on `not_referenced`, for people: whether its module has a ModuleReleaseMeta,
    /// whether that is desired, whether a channel offers this version. Not a stable format.
    pub detail: Option<String>,
}

/// A catalog object that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MalformedObject {
    /// `ModuleTemplate` or `ModuleReleaseMeta`.
    pub kind: &'static str,
    /// Its name (empty when it has none).
    pub name: String,
    /// Why (bounded).
    pub reason: String,
}

/// The filter's verdict on every catalog entry for a Kyma with `kyma_labels`, and its desired
/// set, from one walk over the catalog.
pub fn explain(
    snapshot: &Snapshot,
    kyma_labels: &BTreeMap<String, String>,
    restricted_modules: &BTreeSet<String>,
) -> Explanation {
    let profile = Profile::of(snapshot, kyma_labels, restricted_modules);
    let mut recorder = Recorder::default();
    let (desired, warnings) = filter_profile(snapshot, &profile, restricted_modules, &mut recorder);
    let Recorder { release_metas, mut templates, .. } = recorder;
    for template in &mut templates {
        if template.reason == Some(TemplateSkip::NotReferenced) {
            template.detail = Some(unreferenced_detail(template, &release_metas));
        }
    }
    Explanation {
        beta: profile.beta,
        internal: profile.internal,
        release_metas,
        templates,
        old_style_templates: snapshot.unnamed_templates.clone(),
        malformed: snapshot
            .malformed
            .iter()
            .map(|m| MalformedObject { kind: m.kind.as_str(), name: shown(&m.name), reason: shown(&m.reason) })
            .collect(),
        desired,
        warnings,
    }
}

/// KCP text as an explanation shows it.
fn shown(text: &str) -> String {
    crate::text::bounded(text, DETAIL_CHARS)
}

/// Keeps every verdict of the walk.
#[derive(Default)]
struct Recorder {
    /// Channel verdicts of the ModuleReleaseMeta whose own verdict comes next.
    channels: Vec<ChannelVerdict>,
    release_metas: Vec<ReleaseMetaVerdict>,
    templates: Vec<TemplateVerdict>,
}

impl Verdicts for Recorder {
    fn channel(&mut self, _: &MrmView, entry: &ChannelVersion, template: &str, verdict: Result<(), ChannelCut>) {
        self.channels.push(ChannelVerdict {
            channel: shown(&entry.channel),
            version: shown(&entry.version),
            template: shown(template),
            survives: verdict.is_ok(),
            reason: verdict.err(),
        });
    }

    fn release_meta(&mut self, mrm: &MrmView, verdict: Result<(), ReleaseMetaSkip>) {
        let detail = match (verdict, &mrm.kyma_selector) {
            (Err(ReleaseMetaSkip::InvalidSelector), Some(Err(reason))) => Some(shown(reason)),
            _ => None,
        };
        self.release_metas.push(ReleaseMetaVerdict {
            name: mrm.name.clone(),
            module: shown(&mrm.module_name),
            desired: verdict.is_ok(),
            reason: verdict.err(),
            detail,
            channels: std::mem::take(&mut self.channels),
        });
    }

    fn template(&mut self, mt: &MtView, verdict: Result<(), TemplateSkip>) {
        self.templates.push(TemplateVerdict {
            name: mt.name.clone(),
            module: shown(&mt.module_name),
            version: shown(&mt.version),
            desired: verdict.is_ok(),
            reason: verdict.err(),
            detail: None,
        });
    }
}

/// Why no surviving channel references an allowed ModuleTemplate, as far as the verdicts on
/// the ModuleReleaseMetas of its module tell.
fn unreferenced_detail(template: &TemplateVerdict, release_metas: &[ReleaseMetaVerdict]) -> String {
    let of_module: Vec<&ReleaseMetaVerdict> = release_metas.iter().filter(|m| m.module == template.module).collect();
    if of_module.is_empty() {
        return format!("no ModuleReleaseMeta has spec.moduleName {}", template.module);
    }
    let desired: Vec<&&ReleaseMetaVerdict> = of_module.iter().filter(|m| m.desired).collect();
    if desired.is_empty() {
        let names: Vec<String> = of_module
            .iter()
            .map(|m| format!("{} ({})", m.name, m.reason.map_or("", ReleaseMetaSkip::as_str)))
            .collect();
        return format!("the module's ModuleReleaseMeta is not desired: {}", names.join(", "));
    }
    let cut: Vec<String> = desired
        .iter()
        .flat_map(|m| m.channels.iter().map(move |c| (m, c)))
        .filter(|(_, c)| c.version == template.version && !c.survives)
        .map(|(m, c)| format!("{}/{} ({})", m.name, c.channel, c.reason.map_or("", ChannelCut::as_str)))
        .collect();
    if cut.is_empty() {
        format!("no channel offers version {}", template.version)
    } else {
        format!("the channels offering version {} are cut: {}", template.version, cut.join(", "))
    }
}

macro_rules! serialize_as_str {
    ($($ty:ty),+) => {$(
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    )+};
}

serialize_as_str!(ReleaseMetaSkip, ChannelCut, TemplateSkip, Disallowed);

#[cfg(test)]
mod tests;
