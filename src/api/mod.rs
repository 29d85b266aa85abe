//! Kubernetes API types of the three kinds catalogsync reads or writes, and the names
//! (labels, field managers, condition types) that make up its contract with the KCP and SKRs.
//!
//! The types mirror lifecycle-manager's `api/v1beta2` schemas closely enough that objects
//! written through KLM's CRDs are accepted by ours and round-trip without losing fields
//! (`data` and `descriptor` preserve unknown fields).

mod kyma;
mod module_release_meta;
mod module_template;

pub use kyma::{Kyma, KymaSpec, KymaStatus, LastOperation, Module, ModuleStatus, TrackingMetadata, TrackingObject};
pub use module_release_meta::{ChannelVersion, Mandatory, ModuleReleaseMeta, ModuleReleaseMetaSpec};
pub use module_template::{
    AssociatedResource, CustomStateCheck, Link, Manager, ModuleInfo, ModuleTemplate, ModuleTemplateSpec,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of all three kinds.
pub const GROUP: &str = "operator.kyma-project.io";
/// Served and stored API version of all three kinds.
pub const VERSION: &str = "v1beta2";

/// MT label that marks a beta version, and Kyma label that allows beta entries (`"true"`).
pub const BETA_LABEL: &str = "operator.kyma-project.io/beta";
/// MT label that marks an internal version, and Kyma label that allows internal entries.
pub const INTERNAL_LABEL: &str = "operator.kyma-project.io/internal";
/// Kyma label that makes catalogsync leave the Kyma (and its SKR) alone when `"true"`.
pub const SKIP_RECONCILIATION_LABEL: &str = "operator.kyma-project.io/skip-reconciliation";
/// Label on an access Secret naming the Kyma whose SKR its kubeconfig reaches.
pub const KYMA_NAME_LABEL: &str = "operator.kyma-project.io/kyma-name";
/// Data key of the kubeconfig in an access Secret.
pub const KUBECONFIG_KEY: &str = "config";
/// Label added to every SKR copy and SKR CRD (the Kyma CLI and Busola select on it).
pub const MANAGED_BY_LABEL: &str = "operator.kyma-project.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on SKR copies.
pub const MANAGED_BY_VALUE: &str = "kyma";

/// Field manager of every SKR write. It is the one lifecycle-manager uses, so copies written
/// by KLM are adopted, repaired and pruned without a migration step.
pub const SKR_FIELD_MANAGER: &str = "catalog-sync";
/// Field manager of catalogsync's only KCP write, the `ModuleCatalog` condition of a Kyma.
pub const KCP_FIELD_MANAGER: &str = "catalogsync";
/// Type of the Kyma status condition catalogsync owns.
pub const MODULE_CATALOG_CONDITION: &str = "ModuleCatalog";
crate::label_enum! {
    /// The status of the `ModuleCatalog` condition; also the `status` label of
    /// `catalogsync_kyma_condition_writes_total`.
    pub enum ConditionStatus {
        /// The SKR holds the desired catalog.
        True => "True",
        /// The last sync failed.
        False => "False",
    }
}

/// Annotation a copy must not carry into an SKR (it would restore KCP history there).
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Returns true when a label value turns a flag on: `"true"`, compared case-insensitively.
pub fn is_flag_on(value: Option<&String>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The CRDs of the three kinds, generated from the Rust types.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Kyma::crd(), ModuleTemplate::crd(), ModuleReleaseMeta::crd()]
}

/// The CRDs of the three kinds as one multi-document YAML stream, as committed under
/// `deploy/crds/`.
///
/// # Errors
/// Fails only if a CRD cannot be serialised, which would be a bug in the types.
pub fn crds_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

/// Schema helpers shared by the three kinds.
pub(crate) mod schema {
    use schemars::{Schema, SchemaGenerator, json_schema};

    /// An object whose fields the apiserver keeps as they are (`descriptor`).
    pub fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        })
    }

    /// An embedded Kubernetes object with unknown fields kept (`data`).
    pub fn embedded_resource(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "nullable": true,
            "x-kubernetes-embedded-resource": true,
            "x-kubernetes-preserve-unknown-fields": true,
        })
    }

    /// A list of `metav1.Condition`, as a list-map keyed by `type`.
    pub fn conditions(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {
                "type": "object",
                "required": ["lastTransitionTime", "message", "reason", "status", "type"],
                "properties": {
                    "type": {"type": "string", "maxLength": 316},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "reason": {"type": "string", "maxLength": 1024, "minLength": 1},
                    "message": {"type": "string", "maxLength": 32768},
                },
            },
        })
    }

    /// A `metav1.LabelSelector`.
    pub fn label_selector(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "nullable": true,
            "x-kubernetes-map-type": "atomic",
            "properties": {
                "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                "matchExpressions": {
                    "type": "array",
                    "x-kubernetes-list-type": "atomic",
                    "items": {
                        "type": "object",
                        "required": ["key", "operator"],
                        "properties": {
                            "key": {"type": "string"},
                            "operator": {"type": "string"},
                            "values": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {"type": "string"}},
                        },
                    },
                },
            },
        })
    }
}

/// Label on catalogsync's Leases saying what each is: [`LEASE_TYPE_MEMBER`] or
/// [`LEASE_TYPE_SHARD`].
pub const LEASE_TYPE_LABEL: &str = "catalogsync.kyma-project.io/lease-type";
/// [`LEASE_TYPE_LABEL`] value of a replica's member Lease.
pub const LEASE_TYPE_MEMBER: &str = "member";
/// [`LEASE_TYPE_LABEL`] value of a shard Lease.
pub const LEASE_TYPE_SHARD: &str = "shard";
/// [`LEASE_TYPE_LABEL`] value of the [`CONFIG_LEASE`].
pub const LEASE_TYPE_CONFIG: &str = "config";
/// Name of the Lease that records settings every replica must share: the shard count.
pub const CONFIG_LEASE: &str = "catalogsync-config";
/// Annotation on the [`CONFIG_LEASE`]: the shard count of the deployment. A replica started
/// with another `--shards` stays fenced; changing it is a procedure (docs/operations.md).
pub const SHARDS_ANNOTATION: &str = "catalogsync.kyma-project.io/shards";
/// Annotation on a shard Lease naming the replica the coordinator wants to hold it.
pub const DESIRED_HOLDER_ANNOTATION: &str = "catalogsync.kyma-project.io/desired-holder";
/// Annotation on a shard Lease: when the coordinator last changed the desired holder
/// (RFC 3339), the start of a handover.
pub const HANDOVER_STARTED_ANNOTATION: &str = "catalogsync.kyma-project.io/handover-started";

/// Annotation of a member Lease, and of a shard Lease it holds: a random value of the process
/// that holds it, so that two processes running under one identity notice each other, and a
/// replica knows whether a shard Lease was last written by this process (see
/// `sharding::handover`).
pub const MEMBER_NONCE_ANNOTATION: &str = "catalogsync.kyma-project.io/process-nonce";

/// Annotation a replica sets on its member Lease, with its process nonce, when it shut down
/// after releasing its shards: the coordinator counts it as gone at once instead of a lease
/// duration after the Lease disappeared.
pub const MEMBER_LEFT_ANNOTATION: &str = "catalogsync.kyma-project.io/left";

/// Annotation of a member Lease: the replica's `--mode`, `active` or `shadow` (absent: active).
/// A shadow replica stays out of a Lease namespace in which an active replica lives, so that
/// no shard is held by a replica that does not sync it.
pub const MEMBER_MODE_ANNOTATION: &str = "catalogsync.kyma-project.io/mode";
/// Name of the coordinator election Lease.
pub const COORDINATOR_LEASE: &str = "catalogsync-coordinator";
/// Annotation on the [`COORDINATOR_LEASE`] a human sets to let a catalog state through that
/// the shrink guard holds back: the state's reachable counts, `mrm=<n>,mt=<n>`.
pub const CONFIRM_SHRINK_ANNOTATION: &str = "catalogsync.kyma-project.io/confirm-shrink";
/// Annotation on the [`COORDINATOR_LEASE`] where replicas record the reachable counts of the
/// catalog state they published last, `mrm=<n>,mt=<n>`: the shrink guard's baseline of a
/// replica that has published nothing yet.
pub const PUBLISHED_CATALOG_ANNOTATION: &str = "catalogsync.kyma-project.io/published-catalog";

/// Name prefix of member Leases: `catalogsync-member-<identity>`.
pub const MEMBER_LEASE_PREFIX: &str = "catalogsync-member-";
/// Name prefix of shard Leases: `catalogsync-shard-<shard>`.
pub const SHARD_LEASE_PREFIX: &str = "catalogsync-shard-";

/// Name of the member Lease of replica `identity`.
pub fn member_lease_name(identity: &str) -> String {
    format!("{MEMBER_LEASE_PREFIX}{identity}")
}

/// Name of the Lease of shard `shard`.
pub fn shard_lease_name(shard: u32) -> String {
    format!("{SHARD_LEASE_PREFIX}{shard}")
}

/// The shard a Lease named `name` is the Lease of, if it is a shard Lease.
pub fn shard_of_lease_name(name: &str) -> Option<u32> {
    name.strip_prefix(SHARD_LEASE_PREFIX)?.parse().ok()
}

/// The replica identity a Lease named `name` is the member Lease of, if it is one.
pub fn member_of_lease_name(name: &str) -> Option<&str> {
    name.strip_prefix(MEMBER_LEASE_PREFIX).filter(|identity| !identity.is_empty())
}
