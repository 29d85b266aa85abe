//! `Kyma`: one managed runtime (SKR). catalogsync reads its labels and writes only its
//! `ModuleCatalog` status condition.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Spec of a Kyma (lifecycle-manager `api/v1beta2/kyma_types.go`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.kyma-project.io",
    version = "v1beta2",
    kind = "Kyma",
    plural = "kymas",
    namespaced,
    status = "KymaStatus",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KymaSpec {
    /// Default channel of the Kyma's modules. It does not filter the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 32), regex(pattern = r"^[a-z]+$"))]
    pub channel: Option<String>,
    /// Whether module upgrades may ignore maintenance windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_maintenance_windows: Option<bool>,
    /// Modules enabled in the runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub modules: Option<Vec<Module>>,
}

/// A module enabled in a Kyma.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Module {
    /// Module name.
    pub name: String,
    /// Channel of this module, overriding the Kyma's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Controller name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
    /// `CreateAndDelete` or `Ignore`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_resource_policy: Option<String>,
    /// Whether KLM manages the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<bool>,
}

/// Status of a Kyma. catalogsync owns only the `ModuleCatalog` entry of `conditions`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KymaStatus {
    /// Overall state: Ready, Processing, Warning, Error, Deleting or Unmanaged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Conditions, a list-map keyed by `type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::conditions")]
    pub conditions: Option<Vec<Condition>>,
    /// Per-module status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<Vec<ModuleStatus>>,
    /// Last operation KLM performed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// Active channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_channel: Option<String>,
}

/// Status of one module of a Kyma.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleStatus {
    /// Module name.
    pub name: String,
    /// Fully qualified name of the module's component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// OCM component name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocm_component_name: Option<String>,
    /// Channel in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Version in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Message about the module's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Module state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Tracking reference to the Manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<TrackingObject>,
    /// Tracking reference to the module CR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<TrackingObject>,
    /// Tracking reference to the ModuleTemplate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TrackingObject>,
    /// Whether the module waits for a maintenance window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<bool>,
}

/// A reference to a tracked object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackingObject {
    /// API version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Identifying metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TrackingMetadata>,
}

/// Identifying metadata of a tracked object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct TrackingMetadata {
    /// Name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// KLM's last operation on a Kyma.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastOperation {
    /// What was done.
    pub operation: String,
    /// When.
    pub last_update_time: Option<Time>,
}
