//! `ModuleTemplate`: one version of one module, with its OCM descriptor.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Spec of a ModuleTemplate (lifecycle-manager `api/v1beta2/moduletemplate_types.go`).
///
/// By convention `metadata.name` is `<moduleName>-<version>`; the sync relies on it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.kyma-project.io",
    version = "v1beta2",
    kind = "ModuleTemplate",
    plural = "moduletemplates",
    shortname = "mt",
    namespaced,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ModuleTemplateSpec {
    /// Deprecated release channel of this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^$|^[a-z]{3,}$"))]
    pub channel: Option<String>,
    /// Semantic version of the module, or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^((0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[a-zA-Z-][0-9a-zA-Z-]*)?)?$")
    )]
    pub version: Option<String>,
    /// Name of the module this template is a version of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), regex(pattern = r"^([a-z]{3,}(-[a-z]{3,})*)?$"))]
    pub module_name: Option<String>,
    /// Mandatory modules are installed everywhere by KLM and never synced to SKRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mandatory: Option<bool>,
    /// Default module CR: an embedded object whose unknown fields are preserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::embedded_resource")]
    pub data: Option<serde_json::Value>,
    /// The full OCM component descriptor: opaque here, and the bulk of the object.
    #[schemars(schema_with = "crate::api::schema::preserve_unknown_object")]
    pub descriptor: serde_json::Value,
    /// Deprecated custom state checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_state_check: Option<Vec<CustomStateCheck>>,
    /// Links to resources of the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub resources: Option<Vec<Link>>,
    /// Descriptive information about the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<ModuleInfo>,
    /// Resources the module brings along.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub associated_resources: Option<Vec<AssociatedResource>>,
    /// The module's manager workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<Manager>,
    /// Whether an upgrade of the module requires downtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_downtime: Option<bool>,
}

/// A named link.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Link {
    /// Name of the link.
    pub name: String,
    /// Target URL.
    pub link: String,
}

/// Descriptive information of a module.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ModuleInfo {
    /// Source repository.
    pub repository: String,
    /// Documentation URL.
    pub documentation: String,
    /// Icons of the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icons: Option<Vec<Link>>,
}

/// A group, version and kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AssociatedResource {
    /// API group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

/// The workload that manages a module.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Manager {
    /// API group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Namespace, for namespaced managers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// A deprecated custom state check.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomStateCheck {
    /// JSONPath to the checked field.
    pub json_path: String,
    /// Value the field has in this state.
    pub value: String,
    /// State mapped to.
    pub mapped_state: String,
}
