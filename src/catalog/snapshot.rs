//! Trimmed, comparable views of the KCP catalog, each KCP object read and rendered once (pure).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use serde::Deserialize;
use serde_json::Value;

use crate::api::{BETA_LABEL, ChannelVersion, INTERNAL_LABEL, is_flag_on};
use crate::catalog::render::{CopyDigest, render_copy};
use crate::catalog::selector::KymaSelector;
use crate::catalog::{CatalogKind, CopyBody, serialize_copy};

crate::label_enum! {
    /// Why a ModuleTemplate is not allowed for a Kyma (R2.1, R2.2), in the order checked.
    pub enum Disallowed {
        /// `spec.mandatory: true`.
        Mandatory => "mandatory",
        /// Labelled beta, and the Kyma is not.
        Beta => "beta",
        /// Labelled internal, and the Kyma is not.
        Internal => "internal",
    }
}

/// A ModuleTemplate, reduced to what the filter needs, plus its rendered SKR copy.
#[derive(Debug, Clone, PartialEq)]
pub struct MtView {
    /// `metadata.name`, by convention `<moduleName>-<version>`.
    pub name: String,
    /// `spec.moduleName`.
    pub module_name: String,
    /// `spec.version` (may be empty).
    pub version: String,
    /// Label `operator.kyma-project.io/beta` is `"true"`.
    pub beta: bool,
    /// Label `operator.kyma-project.io/internal` is `"true"`.
    pub internal: bool,
    /// `spec.mandatory`.
    pub mandatory: bool,
    /// What decides whether an SKR object holds the copy. The copy itself is kept only
    /// serialized (`body`): as a `serde_json` value, a ~30 KB descriptor takes several times
    /// its size, in every replica.
    pub digest: Arc<CopyDigest>,
    /// The SKR copy, serialized: the apply body.
    pub body: CopyBody,
    /// [`content_hash`](crate::catalog::content_hash) of the copy.
    pub hash: u64,
}

impl MtView {
    /// Why a Kyma with these flags may not see this version, or `None` when it may (R2.1, R2.2
    /// in docs/catalog-rules.md). Checked in this order: mandatory, beta, internal.
    pub fn disallowed_for(&self, kyma_beta: bool, kyma_internal: bool) -> Option<Disallowed> {
        if self.mandatory {
            Some(Disallowed::Mandatory)
        } else if self.beta && !kyma_beta {
            Some(Disallowed::Beta)
        } else if self.internal && !kyma_internal {
            Some(Disallowed::Internal)
        } else {
            None
        }
    }

    /// Whether a Kyma with these flags may see this version (R2.2 in docs/catalog-rules.md).
    pub fn is_allowed_for(&self, kyma_beta: bool, kyma_internal: bool) -> bool {
        self.disallowed_for(kyma_beta, kyma_internal).is_none()
    }
}

/// A ModuleReleaseMeta, reduced to what the filter needs, plus its rendered SKR copy (with
/// all channels; the desired set cuts them per Kyma).
#[derive(Debug, Clone, PartialEq)]
pub struct MrmView {
    /// `metadata.name`, by convention the module name.
    pub name: String,
    /// `spec.moduleName`.
    pub module_name: String,
    /// `spec.channels`.
    pub channels: Vec<ChannelVersion>,
    /// `spec.mandatory` is set.
    pub mandatory: bool,
    /// `spec.kymaSelector`, validated as Kubernetes validates label selectors, or the reason
    /// it does not parse or is invalid (bounded in length).
    pub kyma_selector: Option<Result<KymaSelector, String>>,
    /// The SKR copy with every channel (small: the desired set cuts channels out of it).
    pub payload: Arc<Value>,
    /// What decides whether an SKR object holds the copy with every channel.
    pub digest: Arc<CopyDigest>,
    /// `payload` serialized: the apply body when a Kyma may see every channel.
    pub body: CopyBody,
    /// [`content_hash`](crate::catalog::content_hash) of `payload`.
    pub hash: u64,
}

/// A KCP object that could not be read into a view, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// Kind of the object.
    pub kind: CatalogKind,
    /// Its name.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The whole KCP catalog at one moment, keyed by object name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// ModuleTemplates by name.
    pub templates: BTreeMap<String, Arc<MtView>>,
    /// ModuleReleaseMetas by name.
    pub release_metas: BTreeMap<String, Arc<MrmView>>,
    /// Objects left out because they could not be read.
    pub malformed: Vec<Malformed>,
    /// Names of old-style ModuleTemplates: a `spec` without `moduleName`. lifecycle-manager
    /// tolerates them and never syncs them; neither does catalogsync, and they are not
    /// malformed.
    pub unnamed_templates: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MtSpecView {
    module_name: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    mandatory: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MrmSpecView {
    module_name: String,
    #[serde(default)]
    channels: Option<Vec<ChannelVersion>>,
    #[serde(default)]
    mandatory: Option<Value>,
    #[serde(default)]
    kyma_selector: Option<Value>,
}

/// One KCP catalog object as the snapshot takes it in, read and rendered once.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A ModuleTemplate.
    Template(Arc<MtView>),
    /// An old-style ModuleTemplate (a `spec` without `moduleName`), by name.
    OldStyleTemplate(String),
    /// A ModuleReleaseMeta.
    ReleaseMeta(Arc<MrmView>),
    /// An object that could not be read.
    Malformed(Malformed),
}

impl Entry {
    /// Reads a KCP ModuleTemplate and renders its copy for `sync_namespace`.
    pub fn template(obj: &DynamicObject, sync_namespace: &str) -> Entry {
        if is_old_style(obj) {
            return Entry::OldStyleTemplate(obj.metadata.name.clone().unwrap_or_default());
        }
        match MtView::from_object(obj, sync_namespace) {
            Ok(view) => Entry::Template(Arc::new(view)),
            Err(reason) => Entry::malformed(CatalogKind::ModuleTemplate, obj, reason),
        }
    }

    fn malformed(kind: CatalogKind, obj: &DynamicObject, reason: String) -> Entry {
        Entry::Malformed(Malformed { kind, name: obj.metadata.name.clone().unwrap_or_default(), reason })
    }

    /// Reads a KCP ModuleReleaseMeta and renders its copy for `sync_namespace`.
    pub fn release_meta(obj: &DynamicObject, sync_namespace: &str) -> Entry {
        match MrmView::from_object(obj, sync_namespace) {
            Ok(view) => Entry::ReleaseMeta(Arc::new(view)),
            Err(reason) => Entry::malformed(CatalogKind::ModuleReleaseMeta, obj, reason),
        }
    }
}

impl Snapshot {
    /// Builds a snapshot from the KCP objects, rendering each copy for `sync_namespace`.
    /// Objects that do not parse are recorded in [`Snapshot::malformed`] and left out.
    pub fn build<'a>(
        templates: impl IntoIterator<Item = &'a DynamicObject>,
        release_metas: impl IntoIterator<Item = &'a DynamicObject>,
        sync_namespace: &str,
    ) -> Snapshot {
        let templates = templates.into_iter().map(|obj| Entry::template(obj, sync_namespace));
        let release_metas = release_metas.into_iter().map(|obj| Entry::release_meta(obj, sync_namespace));
        Snapshot::from_entries(templates.chain(release_metas))
    }

    /// The label keys the valid `kymaSelector`s of its ModuleReleaseMetas read (of every
    /// MRM, restricted module or not; repeated keys repeat).
    pub fn selector_keys(&self) -> impl Iterator<Item = &str> {
        self.release_metas
            .values()
            .filter_map(|mrm| match &mrm.kyma_selector {
                Some(Ok(selector)) => Some(selector),
                _ => None,
            })
            .flat_map(|selector| selector.keys())
    }

    /// Builds a snapshot from objects already read ([`Entry::template`],
    /// [`Entry::release_meta`]): nothing is parsed or rendered again.
    pub fn from_entries(entries: impl IntoIterator<Item = Entry>) -> Snapshot {
        let mut snap = Snapshot::default();
        for entry in entries {
            match entry {
                Entry::Template(view) => {
                    snap.templates.insert(view.name.clone(), view);
                }
                Entry::OldStyleTemplate(name) => snap.unnamed_templates.push(name),
                Entry::ReleaseMeta(view) => {
                    snap.release_metas.insert(view.name.clone(), view);
                }
                Entry::Malformed(malformed) => snap.malformed.push(malformed),
            }
        }
        snap
    }
}

/// Whether a ModuleTemplate is old-style: it has a `spec`, without `moduleName` (missing or
/// null).
fn is_old_style(obj: &DynamicObject) -> bool {
    obj.data
        .get("spec")
        .and_then(Value::as_object)
        .is_some_and(|spec| spec.get("moduleName").is_none_or(Value::is_null))
}

fn spec_of<T: for<'de> Deserialize<'de>>(obj: &DynamicObject) -> Result<T, String> {
    let spec = obj.data.get("spec").ok_or_else(|| "has no spec".to_owned())?;
    T::deserialize(spec).map_err(|e| format!("spec does not parse: {e}"))
}

/// Longest reason kept for a `kymaSelector` that does not parse: serde's message may quote
/// what the KCP object holds.
const SELECTOR_REASON_CHARS: usize = 256;

/// Parses and validates a `kymaSelector` once, so that per-Kyma matching only ever sees valid
/// selectors.
fn kyma_selector_of(raw: &Value) -> Result<KymaSelector, String> {
    let parsed = LabelSelector::deserialize(raw).map_err(|e| {
        format!("kymaSelector does not parse: {}", crate::text::bounded(&e.to_string(), SELECTOR_REASON_CHARS))
    })?;
    KymaSelector::parse(&parsed).map_err(|e| format!("kymaSelector is invalid: {e}"))
}

impl MtView {
    /// Reads a KCP ModuleTemplate.
    ///
    /// # Errors
    /// Returns a human-readable reason when the object has no name or its spec does not parse.
    pub fn from_object(obj: &DynamicObject, sync_namespace: &str) -> Result<MtView, String> {
        let name = obj.metadata.name.clone().ok_or_else(|| "has no name".to_owned())?;
        let spec: MtSpecView = spec_of(obj)?;
        let labels = obj.metadata.labels.as_ref();
        let payload = render_copy(obj, CatalogKind::ModuleTemplate, sync_namespace);
        let (body, hash) = serialize_copy(&payload);
        Ok(MtView {
            name,
            module_name: spec.module_name,
            version: spec.version.unwrap_or_default(),
            beta: is_flag_on(labels.and_then(|l| l.get(BETA_LABEL))),
            internal: is_flag_on(labels.and_then(|l| l.get(INTERNAL_LABEL))),
            mandatory: spec.mandatory.unwrap_or(false),
            digest: Arc::new(CopyDigest::of(&payload)),
            body,
            hash,
        })
    }
}

impl MrmView {
    /// Reads a KCP ModuleReleaseMeta.
    ///
    /// # Errors
    /// Returns a human-readable reason when the object has no name or its spec does not parse.
    /// A `kymaSelector` that does not parse, or is not a valid Kubernetes label selector, is
    /// not an error here: it is kept as the reason, and the desired set skips that MRM for
    /// every Kyma with a warning.
    pub fn from_object(obj: &DynamicObject, sync_namespace: &str) -> Result<MrmView, String> {
        let name = obj.metadata.name.clone().ok_or_else(|| "has no name".to_owned())?;
        let spec: MrmSpecView = spec_of(obj)?;
        let kyma_selector = spec.kyma_selector.filter(|v| !v.is_null()).map(|v| kyma_selector_of(&v));
        let payload = render_copy(obj, CatalogKind::ModuleReleaseMeta, sync_namespace);
        let (body, hash) = serialize_copy(&payload);
        Ok(MrmView {
            name,
            module_name: spec.module_name,
            channels: spec.channels.unwrap_or_default(),
            mandatory: spec.mandatory.is_some_and(|m| !m.is_null()),
            kyma_selector,
            digest: Arc::new(CopyDigest::of(&payload)),
            payload: Arc::new(payload),
            body,
            hash,
        })
    }
}
