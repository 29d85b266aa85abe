//! lifecycle-manager (KLM) as it writes today, for tests of running beside it: its catalog
//! sync's apply of a copy ([`KlmCatalogWriter`]) and its forced write of a Kyma's whole status
//! ([`KlmStatusWriter`]), each reproduced from the facts in the lifecycle-manager reference
//! (sections 2.4, 2.5 and 11), not from catalogsync's code.
//!
//! The copy body comes from typed structs whose serde attributes mirror the JSON tags of KLM's
//! Go types (`api/v1beta2`): a field without `omitempty` is always encoded, an empty
//! `omitempty` field never. The preparation is KLM's `prepare...ForSSA`: `resourceVersion`,
//! `uid` and `managedFields` cleared, the label `operator.kyma-project.io/managed-by=kyma`
//! merged in, the namespace rewritten, everything else (annotations with
//! `last-applied-configuration`, owner references, finalizers, `creationTimestamp`,
//! `generation`) kept. The write is a forced server-side apply under `catalog-sync`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::scenario::{MRM, MT, catalog_resource};

/// KLM's field manager of catalog copies.
pub const KLM_CATALOG_MANAGER: &str = "catalog-sync";

/// KLM's field manager of the Kyma status.
pub const KLM_STATUS_MANAGER: &str = "lifecycle-manager";

fn is_empty_str(s: &str) -> bool {
    s.is_empty()
}

/// A catalog object as KLM's Go types hold it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GoObject<S> {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: S,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct GoMtSpec {
    channel: String,
    version: String,
    module_name: String,
    mandatory: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
    descriptor: Value,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    custom_state_check: Vec<GoCustomStateCheck>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    resources: Vec<GoNameLink>,
    #[serde(skip_serializing_if = "Option::is_none")]
    info: Option<GoInfo>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    associated_resources: Vec<GoGvk>,
    #[serde(skip_serializing_if = "Option::is_none")]
    manager: Option<GoManager>,
    requires_downtime: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct GoCustomStateCheck {
    json_path: String,
    value: String,
    mapped_state: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct GoNameLink {
    name: String,
    link: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct GoInfo {
    repository: String,
    documentation: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    icons: Vec<GoNameLink>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct GoGvk {
    group: String,
    version: String,
    kind: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct GoManager {
    group: String,
    version: String,
    kind: String,
    #[serde(skip_serializing_if = "is_empty_str")]
    namespace: String,
    name: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct GoMrmSpec {
    module_name: String,
    #[serde(skip_serializing_if = "is_empty_str")]
    ocm_component_name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    channels: Vec<GoChannel>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mandatory: Option<GoMandatory>,
    beta: bool,
    internal: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    kyma_selector: Option<GoLabelSelector>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct GoChannel {
    channel: String,
    version: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct GoMandatory {
    version: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct GoLabelSelector {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    match_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    match_expressions: Vec<LabelSelectorRequirement>,
}

/// KLM's `prepare...ForSSA` of a KCP object, encoded as its Go types encode it.
///
/// # Panics
/// When `kcp` is not a catalog object.
pub fn klm_body(kcp: &DynamicObject, sync_namespace: &str) -> Value {
    let raw = serde_json::to_value(kcp).expect("a KCP object encodes");
    fn prepare(meta: &mut ObjectMeta, sync_namespace: &str) {
        meta.resource_version = None;
        meta.uid = None;
        meta.managed_fields = None;
        meta.namespace = Some(sync_namespace.to_owned());
        meta.labels.get_or_insert_default().insert("operator.kyma-project.io/managed-by".into(), "kyma".into());
    }
    match raw["kind"].as_str() {
        Some("ModuleTemplate") => {
            let mut obj: GoObject<GoMtSpec> = serde_json::from_value(raw).expect("a ModuleTemplate decodes");
            prepare(&mut obj.metadata, sync_namespace);
            serde_json::to_value(obj).expect("encodes")
        }
        Some("ModuleReleaseMeta") => {
            let mut obj: GoObject<GoMrmSpec> = serde_json::from_value(raw).expect("a ModuleReleaseMeta decodes");
            prepare(&mut obj.metadata, sync_namespace);
            serde_json::to_value(obj).expect("encodes")
        }
        other => panic!("not a catalog kind: {other:?}"),
    }
}

/// What one pass of [`KlmCatalogWriter`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KlmPass {
    /// Applies sent.
    pub applied: usize,
    /// Orphans deleted.
    pub deleted: usize,
}

/// KLM's catalog sync of one SKR: every pass applies every named KCP object (MTs, then MRMs)
/// and then deletes, cluster-wide, the `catalog-sync`-managed objects of that kind that are
/// not named. The caller names the desired objects (KLM's filter is catalogsync's, proven
/// elsewhere).
pub struct KlmCatalogWriter {
    /// Admin client of the KCP.
    pub kcp: Client,
    /// KCP namespace of the catalog.
    pub catalog_namespace: String,
    /// Client of the SKR.
    pub skr: Client,
    /// Sync namespace in the SKR.
    pub sync_namespace: String,
    /// Desired ModuleTemplate names.
    pub templates: BTreeSet<String>,
    /// Desired ModuleReleaseMeta names.
    pub release_metas: BTreeSet<String>,
    /// `spec.channels` of the desired ModuleReleaseMetas whose channels KLM's filter cut, by
    /// name (the others are applied with the KCP's channels).
    pub channels: BTreeMap<String, Value>,
}

impl KlmCatalogWriter {
    /// The writer of one Kyma's SKR, with the desired objects of a Kyma labelled
    /// `kyma_labels`: KLM's filter is catalogsync's (docs/catalog-rules.md section 2, checked
    /// against KLM's own samples elsewhere), so it is computed with catalogsync's
    /// [`desired_set`](catalogsync::catalog::desired_set) from the KCP catalog as it is now.
    ///
    /// # Errors
    /// A failed list of the KCP catalog.
    pub async fn for_kyma(
        kcp: Client,
        catalog_namespace: &str,
        skr: Client,
        sync_namespace: &str,
        kyma_labels: &BTreeMap<String, String>,
        restricted_modules: &BTreeSet<String>,
    ) -> Result<Self> {
        let list = |plural: &str| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(kcp.clone(), catalog_namespace, &catalog_resource(plural));
            async move { api.list(&ListParams::default()).await.map(|l| l.items) }
        };
        let (mts, mrms) = (list(MT).await.context("list MTs")?, list(MRM).await.context("list MRMs")?);
        let snapshot = catalogsync::catalog::Snapshot::build(mts.iter(), mrms.iter(), sync_namespace);
        let (desired, _) = catalogsync::catalog::desired_set(&snapshot, kyma_labels, restricted_modules);
        let channels = desired
            .release_metas
            .iter()
            .filter_map(|(name, obj)| Some((name.clone(), obj.body.value().ok()?["spec"]["channels"].clone())))
            .collect();
        Ok(Self {
            kcp,
            catalog_namespace: catalog_namespace.to_owned(),
            skr,
            sync_namespace: sync_namespace.to_owned(),
            templates: desired.templates.keys().cloned().collect(),
            release_metas: desired.release_metas.keys().cloned().collect(),
            channels,
        })
    }

    /// What KLM writes to an SKR before its catalog sync on every reconcile: the sync
    /// namespace (labels `managed-by=kyma` and `istio-injection=enabled`, owner
    /// `kyma-sync-context`) and the catalog CRDs from the KCP (`spec` only, conversion `None`,
    /// label `managed-by=kyma`, owner `lifecycle-manager`, forced, no read first).
    ///
    /// # Errors
    /// A failed read or apply.
    pub async fn setup(&self) -> Result<()> {
        use k8s_openapi::api::core::v1::Namespace;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let namespace = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": self.sync_namespace, "labels": {
                "operator.kyma-project.io/managed-by": "kyma", "istio-injection": "enabled",
            }},
        });
        Api::<Namespace>::all(self.skr.clone())
            .patch(&self.sync_namespace, &PatchParams::apply("kyma-sync-context").force(), &Patch::Apply(&namespace))
            .await
            .context("KLM: apply the sync namespace")?;
        let kcp_crds = Api::<CustomResourceDefinition>::all(self.kcp.clone());
        let skr_crds = Api::<CustomResourceDefinition>::all(self.skr.clone());
        for plural in [MT, MRM] {
            let name = format!("{plural}.operator.kyma-project.io");
            let crd = kcp_crds.get(&name).await.with_context(|| format!("KLM: read CRD {name}"))?;
            let mut spec = serde_json::to_value(&crd.spec)?;
            spec["conversion"] = json!({"strategy": "None"});
            let body = json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": name, "labels": {"operator.kyma-project.io/managed-by": "kyma"}},
                "spec": spec,
            });
            skr_crds
                .patch(&name, &PatchParams::apply(KLM_STATUS_MANAGER).force(), &Patch::Apply(&body))
                .await
                .with_context(|| format!("KLM: apply CRD {name}"))?;
        }
        Ok(())
    }

    /// One pass.
    ///
    /// # Errors
    /// A failed KCP read, apply, list or delete.
    pub async fn pass(&self) -> Result<KlmPass> {
        let mut out = KlmPass::default();
        for (plural, names) in [(MT, &self.templates), (MRM, &self.release_metas)] {
            let ar = catalog_resource(plural);
            let kcp: Api<DynamicObject> = Api::namespaced_with(self.kcp.clone(), &self.catalog_namespace, &ar);
            let skr: Api<DynamicObject> = Api::namespaced_with(self.skr.clone(), &self.sync_namespace, &ar);
            let params = PatchParams::apply(KLM_CATALOG_MANAGER).force();
            for name in names {
                let obj = kcp.get(name).await.with_context(|| format!("KLM: read {plural}/{name} from the KCP"))?;
                let mut body = klm_body(&obj, &self.sync_namespace);
                if let (MRM, Some(channels)) = (plural, self.channels.get(name)) {
                    body["spec"]["channels"] = channels.clone();
                }
                skr.patch(name, &params, &Patch::Apply(&body))
                    .await
                    .with_context(|| format!("KLM: apply {plural}/{name}"))?;
                out.applied += 1;
            }
            let all: Api<DynamicObject> = Api::all_with(self.skr.clone(), &ar);
            for held in all.list(&ListParams::default()).await.context("KLM: list copies")? {
                let managed = held.managed_fields().iter().any(|f| f.manager.as_deref() == Some(KLM_CATALOG_MANAGER));
                let here = held.namespace().as_deref() == Some(self.sync_namespace.as_str());
                if managed && !(here && names.contains(&held.name_any())) {
                    let ns: Api<DynamicObject> =
                        Api::namespaced_with(self.skr.clone(), &held.namespace().unwrap_or_default(), &ar);
                    ns.delete(&held.name_any(), &DeleteParams::default()).await.context("KLM: delete an orphan")?;
                    out.deleted += 1;
                }
            }
        }
        Ok(out)
    }
}

/// The Kyma status KLM force-applies on every reconcile: every condition reset and set again
/// (reason `Ready`, a new `lastTransitionTime` each time), `ModuleCatalog` among them.
pub fn klm_status_body(kyma: &str, namespace: &str, generation: i64, catalog_ok: bool) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str, ok: bool, message: &str| {
        json!({
            "type": type_, "status": if ok { "True" } else { "False" }, "reason": "Ready",
            "message": message, "observedGeneration": generation, "lastTransitionTime": now,
        })
    };
    json!({
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "Kyma",
        "metadata": {"name": kyma, "namespace": namespace},
        "status": {
            "state": if catalog_ok { "Ready" } else { "Processing" },
            "conditions": [
                condition("CRDsSync", true, "CRDs are synchronized to the SKR"),
                condition("Modules", true, "modules are ready"),
                condition(
                    "ModuleCatalog",
                    catalog_ok,
                    if catalog_ok { "module templates are synchronized" } else { "module templates are out of sync and need to be resynchronized" },
                ),
                condition("SKRWebhook", true, "skrwebhook is synchronized"),
            ],
            "lastOperation": {"operation": "kyma is ready", "lastUpdateTime": now},
        },
    })
}

/// KLM's status write, repeated: every `period` it force-applies [`klm_status_body`] to each
/// Kyma's status subresource as `lifecycle-manager`, until stopped.
pub struct KlmStatusWriter {
    stop: CancellationToken,
    task: JoinHandle<usize>,
}

impl KlmStatusWriter {
    /// Starts writing the status of `kymas` in `namespace` every `period`.
    pub fn start(kcp: Client, namespace: &str, kymas: Vec<String>, period: Duration) -> Self {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let ar = kube::api::ApiResource::erase::<catalogsync::api::Kyma>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(kcp, namespace, &ar);
        let namespace = namespace.to_owned();
        let task = tokio::spawn(async move {
            let params = PatchParams::apply(KLM_STATUS_MANAGER).force();
            let mut writes = 0;
            loop {
                for kyma in &kymas {
                    let generation = api.get(kyma).await.ok().and_then(|k| k.metadata.generation).unwrap_or_default();
                    let body = klm_status_body(kyma, &namespace, generation, true);
                    if api.patch_status(kyma, &params, &Patch::Apply(&body)).await.is_ok() {
                        writes += 1;
                    }
                }
                tokio::select! {
                    () = token.cancelled() => return writes,
                    () = tokio::time::sleep(period) => {}
                }
            }
        });
        Self { stop, task }
    }

    /// Stops writing; returns how many status writes were made.
    ///
    /// # Errors
    /// The writer task panicked.
    pub async fn stop(self) -> Result<usize> {
        self.stop.cancel();
        self.task.await.context("the KLM status writer failed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klm_body_sends_go_zero_values_and_keeps_what_klm_keeps() {
        let kcp: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "operator.kyma-project.io/v1beta2", "kind": "ModuleTemplate",
            "metadata": {
                "name": "m-1.0.0", "namespace": "kcp-system", "uid": "u", "resourceVersion": "5", "generation": 2,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "kcp-uid"}],
                "finalizers": ["f"],
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            },
            "spec": {"moduleName": "m", "version": "1.0.0", "descriptor": {"x": 1}, "resources": []},
        }))
        .expect("an object");
        let body = klm_body(&kcp, "kyma-system");
        assert_eq!(
            body["spec"],
            json!({"channel": "", "version": "1.0.0", "moduleName": "m", "mandatory": false, "descriptor": {"x": 1}, "requiresDowntime": false})
        );
        let meta = &body["metadata"];
        assert_eq!(meta["namespace"], "kyma-system");
        assert_eq!(meta["labels"]["operator.kyma-project.io/managed-by"], "kyma");
        assert_eq!(meta["ownerReferences"][0]["uid"], "kcp-uid");
        assert_eq!(meta["finalizers"], json!(["f"]));
        assert_eq!(meta["generation"], 2);
        assert!(
            meta.get("uid").is_none() && meta.get("resourceVersion").is_none() && meta.get("managedFields").is_none()
        );
    }
}
