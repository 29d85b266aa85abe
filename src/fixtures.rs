//! Test fixtures: chainable builders for KCP catalog objects, Kyma label sets, snapshots, and
//! one realistic, large ModuleTemplate shaped like those lifecycle-manager (KLM) serves.
//!
//! Tests should read like the rules (`docs/catalog-rules.md`), so a catalog is written as
//!
//! ```text
//! let mts = [MtBuilder::new("btp-operator", "1.1.0").beta().build()];
//! let mrms = [MrmBuilder::new("btp-operator").channel("regular", "1.1.0").build()];
//! let snap = snapshot(&mts, &mrms);
//! ```
//!
//! Everything here is deterministic: the same calls always produce byte-identical objects,
//! so content hashes and fingerprints are stable across test runs.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use serde_json::{Map, Value, json};

use crate::api::{BETA_LABEL, INTERNAL_LABEL, LAST_APPLIED_ANNOTATION, ModuleReleaseMeta, ModuleTemplate};
use crate::catalog::{CatalogKind, Snapshot};

/// Namespace of the catalog in the KCP.
pub const KCP_NAMESPACE: &str = "kcp-system";
/// Namespace the copies land in, in every SKR.
pub const SYNC_NAMESPACE: &str = "kyma-system";

/// The `ApiResource` of a catalog kind.
pub fn api_resource(kind: CatalogKind) -> ApiResource {
    match kind {
        CatalogKind::ModuleTemplate => ApiResource::erase::<ModuleTemplate>(&()),
        CatalogKind::ModuleReleaseMeta => ApiResource::erase::<ModuleReleaseMeta>(&()),
    }
}

/// A KCP object of `kind` named `name` in [`KCP_NAMESPACE`] whose top-level fields other than
/// `apiVersion`, `kind` and `metadata` are exactly `data` (for malformed objects).
pub fn raw_object(kind: CatalogKind, name: &str, data: Value) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &api_resource(kind)).within(KCP_NAMESPACE);
    obj.data = data;
    obj
}

/// Kyma labels from `(key, value)` pairs.
pub fn kyma_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// Labels of a Kyma with the beta and internal flags as given (`"true"` when on, absent when
/// off).
pub fn kyma_flags(beta: bool, internal: bool) -> BTreeMap<String, String> {
    let mut labels = kyma_labels(&[("kyma-project.io/runtime-id", "b6f1a2c4-0d8e-4f5e-9a1b-2c3d4e5f6a7b")]);
    if beta {
        labels.insert(BETA_LABEL.to_owned(), "true".to_owned());
    }
    if internal {
        labels.insert(INTERNAL_LABEL.to_owned(), "true".to_owned());
    }
    labels
}

/// The snapshot of the given KCP objects, rendered for [`SYNC_NAMESPACE`].
pub fn snapshot(mts: &[DynamicObject], mrms: &[DynamicObject]) -> Snapshot {
    Snapshot::build(mts, mrms, SYNC_NAMESPACE)
}

/// Metadata a real KCP object carries and an SKR copy must not: identity, history, owner
/// references, finalizers, `managedFields` and the last-applied annotation.
fn kcp_identity(name: &str, labels: &BTreeMap<String, String>, annotations: &BTreeMap<String, String>) -> ObjectMeta {
    let mut annotations = annotations.clone();
    annotations.insert(LAST_APPLIED_ANNOTATION.to_owned(), format!("{{\"metadata\":{{\"name\":\"{name}\"}}}}"));
    let meta = json!({
        "name": name,
        "namespace": KCP_NAMESPACE,
        "uid": "5b0a3f4e-7c1d-4e2f-8a9b-0c1d2e3f4a5b",
        "resourceVersion": "918273645",
        "generation": 7,
        "creationTimestamp": "2025-06-02T08:15:30Z",
        "labels": labels,
        "annotations": annotations,
        "finalizers": ["operator.kyma-project.io/mandatory-module"],
        "ownerReferences": [{
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "kind": "Kyma",
            "name": "kyma-sample",
            "uid": "0f9e8d7c-6b5a-4938-2716-05f4e3d2c1b0",
        }],
        "managedFields": [{
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:descriptor": {}, "f:moduleName": {}, "f:version": {}}},
            "manager": "modulectl",
            "operation": "Apply",
            "time": "2025-06-02T08:15:30Z",
        }],
    });
    serde_json::from_value(meta).expect("fixture KCP metadata is a valid ObjectMeta")
}

/// Plain metadata: name, namespace, labels and annotations only.
fn plain_meta(name: &str, labels: &BTreeMap<String, String>, annotations: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(KCP_NAMESPACE.to_owned()),
        labels: (!labels.is_empty()).then(|| labels.clone()),
        annotations: (!annotations.is_empty()).then(|| annotations.clone()),
        ..ObjectMeta::default()
    }
}

/// Builds a KCP ModuleTemplate, named `<module>-<version>` in [`KCP_NAMESPACE`] unless
/// [`MtBuilder::name`] says otherwise.
#[derive(Debug, Clone)]
pub struct MtBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    spec: Map<String, Value>,
    identity: bool,
}

impl MtBuilder {
    /// A plain (neither beta nor internal, not mandatory) version `version` of `module`, with
    /// a small descriptor naming its OCM component.
    pub fn new(module: &str, version: &str) -> Self {
        let mut spec = Map::new();
        spec.insert("moduleName".into(), json!(module));
        spec.insert("version".into(), json!(version));
        spec.insert(
            "descriptor".into(),
            json!({
                "meta": {"schemaVersion": "v2"},
                "component": {"name": format!("kyma-project.io/module/{module}"), "version": version},
            }),
        );
        MtBuilder {
            name: format!("{module}-{version}"),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            spec,
            identity: false,
        }
    }

    /// Overrides `metadata.name` (by default `<module>-<version>`).
    pub fn name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// Marks the version beta (label `operator.kyma-project.io/beta: "true"`).
    pub fn beta(self) -> Self {
        self.label(BETA_LABEL, "true")
    }

    /// Marks the version internal (label `operator.kyma-project.io/internal: "true"`).
    pub fn internal(self) -> Self {
        self.label(INTERNAL_LABEL, "true")
    }

    /// Sets `spec.mandatory: true`.
    pub fn mandatory(self) -> Self {
        self.spec_field("mandatory", json!(true))
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Replaces `spec.descriptor`.
    pub fn descriptor(self, descriptor: Value) -> Self {
        self.spec_field("descriptor", descriptor)
    }

    /// Sets `spec.data`, the default module CR.
    pub fn data(self, data: Value) -> Self {
        self.spec_field("data", data)
    }

    /// Sets any `spec` field, known or not (for example the deprecated `channel`).
    pub fn spec_field(mut self, key: &str, value: Value) -> Self {
        self.spec.insert(key.to_owned(), value);
        self
    }

    /// Removes a `spec` field (for malformed objects, for example without `moduleName`).
    pub fn without_spec_field(mut self, key: &str) -> Self {
        self.spec.remove(key);
        self
    }

    /// Gives the object the metadata a real KCP object has (uid, resourceVersion, generation,
    /// creationTimestamp, finalizers, ownerReferences, managedFields, last-applied annotation),
    /// none of which may reach an SKR.
    pub fn with_kcp_identity(mut self) -> Self {
        self.identity = true;
        self
    }

    /// The KCP object.
    pub fn build(self) -> DynamicObject {
        let mut obj = DynamicObject::new(&self.name, &api_resource(CatalogKind::ModuleTemplate));
        obj.metadata = if self.identity {
            kcp_identity(&self.name, &self.labels, &self.annotations)
        } else {
            plain_meta(&self.name, &self.labels, &self.annotations)
        };
        obj.data = json!({ "spec": Value::Object(self.spec) });
        obj
    }
}

/// Builds a KCP ModuleReleaseMeta named after its module in [`KCP_NAMESPACE`].
///
/// `spec.channels` is written whenever `spec.mandatory` is not set (possibly empty), so the
/// object passes the CRD's "exactly one of" rule when applied in integration tests.
#[derive(Debug, Clone)]
pub struct MrmBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    channels: Vec<Value>,
    spec: Map<String, Value>,
    top_level: Map<String, Value>,
}

impl MrmBuilder {
    /// A release meta for `module` with no channels yet.
    pub fn new(module: &str) -> Self {
        let mut spec = Map::new();
        spec.insert("moduleName".into(), json!(module));
        spec.insert("ocmComponentName".into(), json!(format!("kyma-project.io/module/{module}")));
        MrmBuilder {
            name: module.to_owned(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            channels: Vec::new(),
            spec,
            top_level: Map::new(),
        }
    }

    /// Overrides `metadata.name` (by default the module name).
    pub fn name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// Adds a channel entry offering `version`.
    pub fn channel(mut self, channel: &str, version: &str) -> Self {
        self.channels.push(json!({"channel": channel, "version": version}));
        self
    }

    /// Adds a raw channel entry (for example one with fields unknown to catalogsync).
    pub fn raw_channel(mut self, entry: Value) -> Self {
        self.channels.push(entry);
        self
    }

    /// Sets `spec.mandatory.version`, which makes the module mandatory.
    pub fn mandatory(self, version: &str) -> Self {
        self.spec_field("mandatory", json!({ "version": version }))
    }

    /// Sets `spec.kymaSelector`.
    pub fn selector(self, selector: LabelSelector) -> Self {
        let raw = serde_json::to_value(selector).expect("a LabelSelector always serialises");
        self.raw_selector(raw)
    }

    /// Sets `spec.kymaSelector` to any JSON, including JSON that is not a LabelSelector.
    pub fn raw_selector(self, selector: Value) -> Self {
        self.spec_field("kymaSelector", selector)
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets any `spec` field, known or not.
    pub fn spec_field(mut self, key: &str, value: Value) -> Self {
        self.spec.insert(key.to_owned(), value);
        self
    }

    /// Sets a top-level field next to `spec` (a field a future CRD version might add).
    pub fn top_level_field(mut self, key: &str, value: Value) -> Self {
        self.top_level.insert(key.to_owned(), value);
        self
    }

    /// The KCP object.
    pub fn build(self) -> DynamicObject {
        let mut obj = DynamicObject::new(&self.name, &api_resource(CatalogKind::ModuleReleaseMeta));
        obj.metadata = plain_meta(&self.name, &self.labels, &self.annotations);
        let mut spec = self.spec;
        if !self.channels.is_empty() || !spec.contains_key("mandatory") {
            spec.insert("channels".into(), Value::Array(self.channels));
        }
        let mut data = self.top_level;
        data.insert("spec".into(), Value::Object(spec));
        obj.data = Value::Object(data);
        obj
    }
}

/// A 64-hex-digit pseudo digest derived from `seed` (deterministic, not cryptographic).
fn fake_digest(seed: &str) -> String {
    (0u8..4)
        .map(|i| {
            let mut bytes = seed.as_bytes().to_vec();
            bytes.push(i);
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
        })
        .collect()
}

/// Module name of [`klm_module_template`].
pub const KLM_MODULE: &str = "btp-operator";
/// Version of [`klm_module_template`].
pub const KLM_VERSION: &str = "1.1.0";

/// The OCM component descriptor of [`klm_module_template`]: about 30 KB of JSON with
/// provider, repository contexts, labels, local and external resources, sources, and a
/// signature, as `modulectl` produces them.
pub fn klm_descriptor() -> Value {
    let component = format!("kyma-project.io/module/{KLM_MODULE}");
    let registry = "europe-docker.pkg.dev/kyma-project/prod";
    let mut resources = vec![
        json!({
            "name": "raw-manifest",
            "type": "yaml",
            "version": KLM_VERSION,
            "relation": "local",
            "access": {
                "type": "localBlob",
                "localReference": format!("sha256:{}", fake_digest("raw-manifest")),
                "mediaType": "application/x-tar",
                "referenceName": "raw-manifest",
            },
            "digest": {
                "hashAlgorithm": "SHA-256",
                "normalisationAlgorithm": "genericBlobDigest/v1",
                "value": fake_digest("raw-manifest-digest"),
            },
        }),
        json!({
            "name": "default-cr",
            "type": "yaml",
            "version": KLM_VERSION,
            "relation": "local",
            "access": {
                "type": "localBlob",
                "localReference": format!("sha256:{}", fake_digest("default-cr")),
                "mediaType": "application/x-tar",
                "referenceName": "default-cr",
            },
            "digest": {
                "hashAlgorithm": "SHA-256",
                "normalisationAlgorithm": "genericBlobDigest/v1",
                "value": fake_digest("default-cr-digest"),
            },
        }),
    ];
    for i in 0..40 {
        let image = format!("btp-manager-sidecar-{i:02}");
        let digest = fake_digest(&image);
        resources.push(json!({
            "name": image,
            "type": "ociArtifact",
            "version": format!("{KLM_VERSION}-{i}"),
            "relation": "external",
            "access": {
                "type": "ociArtifact",
                "imageReference": format!("{registry}/{image}:{KLM_VERSION}@sha256:{digest}"),
            },
            "digest": {
                "hashAlgorithm": "SHA-256",
                "normalisationAlgorithm": "ociArtifactDigest/v1",
                "value": digest,
            },
            "labels": [
                {"name": "scan.security.kyma-project.io/type", "value": "third-party-image", "version": "v1"},
                {"name": "scan.security.kyma-project.io/rc-tag", "value": format!("{KLM_VERSION}-{i}"), "version": "v1"},
            ],
        }));
    }
    json!({
        "meta": {"schemaVersion": "v2"},
        "component": {
            "name": component,
            "version": KLM_VERSION,
            "provider": "{\"name\":\"kyma-project.io\",\"labels\":[{\"name\":\"kyma-project.io/built-by\",\"value\":\"modulectl\",\"version\":\"v1\"}]}",
            "repositoryContexts": [{
                "baseUrl": registry,
                "componentNameMapping": "urlPath",
                "type": "OCIRegistry",
            }],
            "labels": [
                {"name": "security.kyma-project.io/scan", "value": "enabled", "version": "v1"},
                {"name": "operator.kyma-project.io/module-version", "value": KLM_VERSION, "version": "v1"},
                {"name": "operator.kyma-project.io/security-scan-config", "value": {
                    "devBranch": "main",
                    "rcTag": KLM_VERSION,
                    "whiteSource": {"language": "golang-mod", "exclude": ["**/test/**", "**/*_test.go"]},
                }, "version": "v1"},
            ],
            "resources": resources,
            "sources": [{
                "name": "module-sources",
                "type": "Github",
                "version": KLM_VERSION,
                "access": {
                    "type": "gitHub",
                    "repoUrl": "https://github.com/kyma-project/btp-manager",
                    "commit": fake_digest("commit")[..40].to_owned(),
                },
                "labels": [
                    {"name": "git.kyma-project.io/ref", "value": "refs/heads/main", "version": "v1"},
                    {"name": "scan.security.kyma-project.io/language", "value": "golang-mod", "version": "v1"},
                    {"name": "scan.security.kyma-project.io/dev-branch", "value": "main", "version": "v1"},
                    {"name": "scan.security.kyma-project.io/subprojects", "value": "false", "version": "v1"},
                    {"name": "scan.security.kyma-project.io/exclude", "value": "**/test/**,**/*_test.go", "version": "v1"},
                ],
            }],
            "componentReferences": [],
        },
        "signatures": [{
            "name": "kyma-module-signature",
            "digest": {
                "hashAlgorithm": "SHA-256",
                "normalisationAlgorithm": "jsonNormalisation/v1",
                "value": fake_digest("signature-digest"),
            },
            "signature": {
                "algorithm": "RSASSA-PKCS1-V1_5",
                "mediaType": "application/vnd.ocm.signature.rsa",
                "value": (0..8).map(|i| fake_digest(&format!("signature-{i}"))).collect::<String>(),
            },
        }],
    })
}

/// The default module CR of [`klm_module_template`], with fields no schema knows about at
/// several depths (they must survive the sync untouched).
pub fn klm_data() -> Value {
    json!({
        "apiVersion": "operator.kyma-project.io/v1alpha1",
        "kind": "BtpOperator",
        "metadata": {"name": "btpoperator", "namespace": "kyma-system", "labels": {"app.kubernetes.io/part-of": "btp"}},
        "spec": {
            "futureSwitch": {"nested": {"deeper": [1, {"x": null, "y": [true, 2.5, "z"]}], "enabled": false}},
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "10m", "memory": "64Mi"}},
            "emptyObject": {},
            "emptyList": [],
        },
        "unknownTopLevel": {"annotationsLike": {"a/b": "c"}, "number": 18_446_744_073_709_551_615_u64},
    })
}

/// A ModuleTemplate as KLM's catalog holds it: `btp-operator-1.1.0`, beta-free and
/// non-internal, with KCP identity metadata, typical labels and annotations, `info`,
/// `manager`, `resources`, `associatedResources`, a deprecated `channel`, a ~30 KB OCM
/// descriptor ([`klm_descriptor`]) and a `data` object with unknown nested fields
/// ([`klm_data`]). Deterministic.
pub fn klm_module_template() -> DynamicObject {
    MtBuilder::new(KLM_MODULE, KLM_VERSION)
        .label("operator.kyma-project.io/module-name", KLM_MODULE)
        .label("operator.kyma-project.io/controller-name", "klm-controller-manager")
        .label("ocm.software/component-name", &format!("kyma-project.io/module/{KLM_MODULE}"))
        .annotation("operator.kyma-project.io/is-cluster-scoped", "false")
        .annotation("operator.kyma-project.io/module-version", KLM_VERSION)
        .with_kcp_identity()
        .spec_field("channel", json!(""))
        .spec_field("requiresDowntime", json!(false))
        .spec_field(
            "info",
            json!({
                "repository": "https://github.com/kyma-project/btp-manager",
                "documentation": "https://kyma-project.io/#/btp-manager/user/README",
                "icons": [{"name": "module-icon", "link": "https://raw.githubusercontent.com/kyma-project/kyma/main/docs/assets/logo_icon.svg"}],
            }),
        )
        .spec_field(
            "manager",
            json!({"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "kyma-system", "name": "btp-manager-controller-manager"}),
        )
        .spec_field(
            "resources",
            json!([{"name": "rawManifest", "link": format!("https://github.com/kyma-project/btp-manager/releases/download/{KLM_VERSION}/btp-manager.yaml")}]),
        )
        .spec_field(
            "associatedResources",
            json!([
                {"group": "services.cloud.sap.com", "version": "v1", "kind": "ServiceInstance"},
                {"group": "services.cloud.sap.com", "version": "v1", "kind": "ServiceBinding"},
            ]),
        )
        .descriptor(klm_descriptor())
        .data(klm_data())
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klm_descriptor_is_about_thirty_kilobytes_and_deterministic() {
        let bytes = serde_json::to_vec(&klm_descriptor()).expect("serialises");
        assert!((25_000..40_000).contains(&bytes.len()), "descriptor is {} bytes", bytes.len());
        assert_eq!(klm_module_template(), klm_module_template());
    }

    #[test]
    fn klm_module_template_parses_as_a_typed_module_template() {
        let mt: ModuleTemplate = klm_module_template().try_parse().expect("parses as a ModuleTemplate");
        assert_eq!(mt.spec.module_name.as_deref(), Some(KLM_MODULE));
        assert_eq!(mt.spec.descriptor, klm_descriptor());
        assert_eq!(mt.spec.data, Some(klm_data()));
    }

    #[test]
    fn builders_follow_naming_conventions() {
        let mt = MtBuilder::new("keda", "1.0.0").beta().internal().mandatory().build();
        assert_eq!(mt.metadata.name.as_deref(), Some("keda-1.0.0"));
        assert_eq!(mt.metadata.namespace.as_deref(), Some(KCP_NAMESPACE));
        assert_eq!(mt.data["spec"]["mandatory"], json!(true));
        let mrm = MrmBuilder::new("keda").channel("regular", "1.0.0").build();
        assert_eq!(mrm.metadata.name.as_deref(), Some("keda"));
        assert_eq!(mrm.data["spec"]["channels"], json!([{"channel": "regular", "version": "1.0.0"}]));
        let mandatory = MrmBuilder::new("istio").mandatory("1.2.0").build();
        assert_eq!(mandatory.data["spec"].get("channels"), None);
    }
}
