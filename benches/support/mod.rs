//! Bench fixtures: a realistic KCP catalog and what an SKR holds of it.
//!
//! `src/fixtures.rs` is `#[cfg(test)]` and so out of reach of benches; this module rebuilds the
//! parts the benches need. Everything is deterministic.
//!
//! The catalog is 25 modules x 3 channels (`regular`, `fast`, `experimental`): 75 ModuleTemplates
//! shaped like those lifecycle-manager serves (KCP identity metadata, `info`, `manager`,
//! `resources`, `associatedResources`, `data`, an OCM descriptor of about 30 KB) and 25
//! ModuleReleaseMetas. Of these:
//!
//! - the `experimental` version of [`BETA_MODULES`] modules is beta;
//! - the `fast` version of [`INTERNAL_MODULES`] modules is internal;
//! - the last module is mandatory (its 3 MTs and its MRM);
//! - one module, [`RESTRICTED_MODULE`], is restricted and its MRM has a `kymaSelector` that the
//!   bench Kymas match.

use std::collections::{BTreeMap, BTreeSet};

use catalogsync::api::{BETA_LABEL, INTERNAL_LABEL, LAST_APPLIED_ANNOTATION, ModuleReleaseMeta, ModuleTemplate};
use catalogsync::catalog::render::CopyDigest;
use catalogsync::catalog::{DesiredObject, KindMemory, Observed};
use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use serde_json::{Value, json};

/// Namespace of the catalog (and the Kymas) in the KCP.
pub const KCP_NAMESPACE: &str = "kcp-system";
/// Namespace the copies land in, in every SKR.
pub const SYNC_NAMESPACE: &str = "kyma-system";

/// The 25 modules, by name.
pub const MODULES: [&str; 25] = [
    "api-gateway",
    "application-connector",
    "btp-operator",
    "cap-operator",
    "cloud-manager",
    "connectivity-proxy",
    "docker-registry",
    "eventing",
    "istio",
    "keda",
    "nats",
    "serverless",
    "telemetry",
    "transparent-proxy",
    "busola",
    "kyma-dashboard",
    "cluster-network",
    "sap-btp-audit",
    "logging",
    "monitoring",
    "tracing",
    "ory",
    "rafter",
    "compass-runtime-agent",
    "warden",
];
/// Channels, each offering its own version of every module.
pub const CHANNELS: [&str; 3] = ["regular", "fast", "experimental"];
/// Modules whose `experimental` version is beta.
pub const BETA_MODULES: [usize; 5] = [0, 5, 10, 15, 20];
/// Modules whose `fast` version is internal.
pub const INTERNAL_MODULES: [usize; 2] = [3, 17];
/// The mandatory module (all its MTs and its MRM).
pub const MANDATORY_MODULE: usize = 24;
/// The restricted module; its MRM selects Kymas of [`GLOBAL_ACCOUNT`].
pub const RESTRICTED_MODULE: &str = "cloud-manager";
/// Global account of the bench Kymas.
pub const GLOBAL_ACCOUNT: &str = "2b5d5c3e-8f0a-4b9c-9d7e-1a2b3c4d5e6f";

/// The version of module `m` offered on channel `c`.
pub fn version(m: usize, c: usize) -> String {
    format!("{}.{}.{}", 1 + m % 3, 4 + c, m)
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

/// An OCM component descriptor of about 30 KB of JSON, as `modulectl` produces them.
pub fn descriptor(module: &str, version: &str) -> Value {
    let registry = "europe-docker.pkg.dev/kyma-project/prod";
    let blob = |name: &str| {
        json!({
            "name": name,
            "type": "yaml",
            "version": version,
            "relation": "local",
            "access": {
                "type": "localBlob",
                "localReference": format!("sha256:{}", fake_digest(&format!("{module}/{version}/{name}"))),
                "mediaType": "application/x-tar",
                "referenceName": name,
            },
            "digest": {
                "hashAlgorithm": "SHA-256",
                "normalisationAlgorithm": "genericBlobDigest/v1",
                "value": fake_digest(&format!("{module}/{version}/{name}-digest")),
            },
        })
    };
    let mut resources = vec![blob("raw-manifest"), blob("default-cr")];
    for i in 0..40 {
        let image = format!("{module}-sidecar-{i:02}");
        let digest = fake_digest(&format!("{image}:{version}"));
        resources.push(json!({
            "name": image,
            "type": "ociArtifact",
            "version": format!("{version}-{i}"),
            "relation": "external",
            "access": {"type": "ociArtifact", "imageReference": format!("{registry}/{image}:{version}@sha256:{digest}")},
            "digest": {"hashAlgorithm": "SHA-256", "normalisationAlgorithm": "ociArtifactDigest/v1", "value": digest},
            "labels": [
                {"name": "scan.security.kyma-project.io/type", "value": "third-party-image", "version": "v1"},
                {"name": "scan.security.kyma-project.io/rc-tag", "value": format!("{version}-{i}"), "version": "v1"},
            ],
        }));
    }
    json!({
        "meta": {"schemaVersion": "v2"},
        "component": {
            "name": format!("kyma-project.io/module/{module}"),
            "version": version,
            "provider": "{\"name\":\"kyma-project.io\",\"labels\":[{\"name\":\"kyma-project.io/built-by\",\"value\":\"modulectl\",\"version\":\"v1\"}]}",
            "repositoryContexts": [{"baseUrl": registry, "componentNameMapping": "urlPath", "type": "OCIRegistry"}],
            "labels": [
                {"name": "security.kyma-project.io/scan", "value": "enabled", "version": "v1"},
                {"name": "operator.kyma-project.io/module-version", "value": version, "version": "v1"},
            ],
            "resources": resources,
            "sources": [{
                "name": "module-sources",
                "type": "Github",
                "version": version,
                "access": {
                    "type": "gitHub",
                    "repoUrl": format!("https://github.com/kyma-project/{module}"),
                    "commit": fake_digest(&format!("{module}/{version}/commit"))[..40].to_owned(),
                },
            }],
            "componentReferences": [],
        },
        "signatures": [{
            "name": "kyma-module-signature",
            "digest": {
                "hashAlgorithm": "SHA-256",
                "normalisationAlgorithm": "jsonNormalisation/v1",
                "value": fake_digest(&format!("{module}/{version}/signature")),
            },
            "signature": {
                "algorithm": "RSASSA-PKCS1-V1_5",
                "mediaType": "application/vnd.ocm.signature.rsa",
                "value": (0..8).map(|i| fake_digest(&format!("{module}/{version}/signature-{i}"))).collect::<String>(),
            },
        }],
    })
}

/// Metadata of a KCP object as the apiserver returns it: identity, history, owner reference,
/// finalizer, `managedFields` and the last-applied annotation.
fn kcp_meta(name: &str, labels: BTreeMap<String, String>, mut annotations: BTreeMap<String, String>) -> ObjectMeta {
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
        "managedFields": [{
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:descriptor": {}, "f:moduleName": {}, "f:version": {}}},
            "manager": "modulectl",
            "operation": "Apply",
            "time": "2025-06-02T08:15:30Z",
        }],
    });
    serde_json::from_value(meta).expect("bench KCP metadata is a valid ObjectMeta")
}

/// The ModuleTemplate of module `m` on channel `c`.
pub fn module_template(m: usize, c: usize) -> DynamicObject {
    let module = MODULES[m];
    let version = version(m, c);
    let name = format!("{module}-{version}");
    let mut labels: BTreeMap<String, String> = [
        ("operator.kyma-project.io/module-name", module.to_owned()),
        ("operator.kyma-project.io/controller-name", "klm-controller-manager".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if c == 2 && BETA_MODULES.contains(&m) {
        labels.insert(BETA_LABEL.to_owned(), "true".to_owned());
    }
    if c == 1 && INTERNAL_MODULES.contains(&m) {
        labels.insert(INTERNAL_LABEL.to_owned(), "true".to_owned());
    }
    // A label value cannot hold a `/`, so the OCM component name is an annotation.
    let annotations = [
        ("operator.kyma-project.io/is-cluster-scoped".to_owned(), "false".to_owned()),
        ("operator.kyma-project.io/module-version".to_owned(), version.clone()),
        ("ocm.software/component-name".to_owned(), format!("kyma-project.io/module/{module}")),
    ]
    .into();
    let mut obj = DynamicObject::new(&name, &ApiResource::erase::<ModuleTemplate>(&()));
    obj.metadata = kcp_meta(&name, labels, annotations);
    let mut spec = json!({
        "moduleName": module,
        "version": version,
        "channel": "",
        "requiresDowntime": false,
        "info": {
            "repository": format!("https://github.com/kyma-project/{module}"),
            "documentation": format!("https://kyma-project.io/#/{module}/user/README"),
            "icons": [{"name": "module-icon", "link": "https://raw.githubusercontent.com/kyma-project/kyma/main/docs/assets/logo_icon.svg"}],
        },
        "manager": {"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "kyma-system", "name": format!("{module}-controller-manager")},
        "resources": [{"name": "rawManifest", "link": format!("https://github.com/kyma-project/{module}/releases/download/{version}/{module}.yaml")}],
        "associatedResources": [{"group": "operator.kyma-project.io", "version": "v1alpha1", "kind": "Managed"}],
        "descriptor": descriptor(module, &version),
        "data": {
            "apiVersion": "operator.kyma-project.io/v1alpha1",
            "kind": "ModuleCr",
            "metadata": {"name": module, "namespace": "kyma-system"},
            "spec": {"resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "10m", "memory": "64Mi"}}},
        },
    });
    if m == MANDATORY_MODULE {
        spec["mandatory"] = json!(true);
    }
    obj.data = json!({ "spec": spec });
    obj
}

/// The ModuleReleaseMeta of module `m`.
pub fn module_release_meta(m: usize) -> DynamicObject {
    let module = MODULES[m];
    let mut obj = DynamicObject::new(module, &ApiResource::erase::<ModuleReleaseMeta>(&()));
    obj.metadata = ObjectMeta {
        name: Some(module.to_owned()),
        namespace: Some(KCP_NAMESPACE.to_owned()),
        labels: Some([("operator.kyma-project.io/module-name".to_owned(), module.to_owned())].into()),
        resource_version: Some("918273646".to_owned()),
        uid: Some("6c1b4f5a-8d2e-4f3a-9b0c-1d2e3f4a5b6c".to_owned()),
        ..ObjectMeta::default()
    };
    let mut spec = json!({"moduleName": module, "ocmComponentName": format!("kyma-project.io/module/{module}")});
    if m == MANDATORY_MODULE {
        spec["mandatory"] = json!({"version": version(m, 0)});
    } else {
        let channels: Vec<Value> =
            CHANNELS.iter().enumerate().map(|(c, ch)| json!({"channel": ch, "version": version(m, c)})).collect();
        spec["channels"] = Value::Array(channels);
    }
    if module == RESTRICTED_MODULE {
        spec["kymaSelector"] = json!({"matchLabels": {"kyma-project.io/global-account-id": GLOBAL_ACCOUNT}});
    }
    obj.data = json!({ "spec": spec });
    obj
}

/// The whole catalog: 75 MTs and 25 MRMs.
pub fn catalog() -> (Vec<DynamicObject>, Vec<DynamicObject>) {
    let mts = (0..MODULES.len()).flat_map(|m| (0..CHANNELS.len()).map(move |c| module_template(m, c))).collect();
    let mrms = (0..MODULES.len()).map(module_release_meta).collect();
    (mts, mrms)
}

/// The configured restricted modules.
pub fn restricted_modules() -> BTreeSet<String> {
    [RESTRICTED_MODULE.to_owned()].into()
}

/// The labels of a Kyma as KCP holds them, with the beta and internal flags as given.
pub fn kyma_labels(beta: bool, internal: bool) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("kyma-project.io/runtime-id", "b6f1a2c4-0d8e-4f5e-9a1b-2c3d4e5f6a7b"),
        ("kyma-project.io/instance-id", "c7e2b3d5-1e9f-4a6b-8c2d-3e4f5a6b7c8d"),
        ("kyma-project.io/global-account-id", GLOBAL_ACCOUNT),
        ("kyma-project.io/subaccount-id", "d8f3c4e6-2fa0-4b7c-9d3e-4f5a6b7c8d9e"),
        ("kyma-project.io/broker-plan-id", "4deee563-e5ec-4731-b9b1-53b42d855f0c"),
        ("kyma-project.io/broker-plan-name", "azure"),
        ("kyma-project.io/region", "westeurope"),
        ("kyma-project.io/platform-region", "cf-eu20"),
        ("kyma-project.io/shoot-name", "c-7a1b2c3"),
        ("operator.kyma-project.io/managed-by", "lifecycle-manager"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    if beta {
        labels.insert(BETA_LABEL.to_owned(), "true".to_owned());
    }
    if internal {
        labels.insert(INTERNAL_LABEL.to_owned(), "true".to_owned());
    }
    labels
}

/// The resourceVersion the bench SKR gives object number `i`.
fn resource_version(i: usize) -> String {
    (48_213_377 + i).to_string()
}

/// The UID of the `i`-th object of a simulated SKR.
fn uid(i: usize) -> String {
    format!("0a1b2c3d-4e5f-4a6b-8c7d-{i:012x}")
}

/// What a warm sync observes of `desired` in an SKR that holds exactly it (a metadata-only list),
/// and what the replica remembers of its last write there: every object unchanged.
pub fn warm_skr(desired: &BTreeMap<String, DesiredObject>) -> (Vec<Observed>, KindMemory) {
    let mut observed = Vec::with_capacity(desired.len());
    let mut memory = KindMemory::new();
    for (i, (name, want)) in desired.iter().enumerate() {
        let rv = resource_version(i);
        memory.remember(name, &rv, want.hash);
        observed.push(Observed { name: name.clone(), uid: uid(i), resource_version: rv, managed: true, content: None });
    }
    (observed, memory)
}

/// What a cold sync observes of `desired` in an SKR that holds exactly it (a full list: each
/// object as the SKR apiserver returns it, with identity and `managedFields`), with nothing
/// remembered: every object matches field by field.
pub fn cold_skr(desired: &BTreeMap<String, DesiredObject>) -> (Vec<Observed>, KindMemory) {
    let observed = desired
        .iter()
        .enumerate()
        .map(|(i, (name, want))| {
            let rv = resource_version(i);
            // A fresh value, as a list response would be: nothing shared with the desired set.
            let mut content: Value = want.body.value().expect("the body is JSON");
            let meta = &mut content["metadata"];
            meta["resourceVersion"] = json!(rv);
            meta["uid"] = json!(uid(i));
            meta["generation"] = json!(1);
            meta["creationTimestamp"] = json!("2025-06-03T10:00:00Z");
            meta["managedFields"] = json!([{
                "apiVersion": "operator.kyma-project.io/v1beta2",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {}}, "f:spec": {}},
                "manager": "catalog-sync",
                "operation": "Apply",
                "time": "2025-06-03T10:00:00Z",
            }]);
            Observed {
                name: name.clone(),
                uid: uid(i),
                resource_version: rv,
                managed: true,
                content: Some(CopyDigest::of(&content)),
            }
        })
        .collect();
    (observed, KindMemory::new())
}
