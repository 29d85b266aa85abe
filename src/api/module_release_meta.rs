//! `ModuleReleaseMeta`: which version of a module each channel offers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Spec of a ModuleReleaseMeta (lifecycle-manager `api/v1beta2/modulereleasemeta_types.go`).
///
/// By convention `metadata.name` is the module name. Exactly one of `channels` and
/// `mandatory` is set.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.kyma-project.io",
    version = "v1beta2",
    kind = "ModuleReleaseMeta",
    plural = "modulereleasemetas",
    shortname = "mrm",
    namespaced,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = kube::core::Rule::new("has(self.spec.mandatory) != has(self.spec.channels)").message("exactly one of 'mandatory' or 'channels' must be specified")
)]
#[serde(rename_all = "camelCase")]
pub struct ModuleReleaseMetaSpec {
    /// Name of the module.
    #[schemars(length(max = 64), regex(pattern = r"^([a-z]{3,}(-[a-z]{3,})*)?$"))]
    pub module_name: String,
    /// Name of the module's OCM component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 255))]
    pub ocm_component_name: Option<String>,
    /// Channel to version assignments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["channel"]))]
    pub channels: Option<Vec<ChannelVersion>>,
    /// The version of a mandatory module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mandatory: Option<Mandatory>,
    /// Deprecated and ignored: beta is set per version by ModuleTemplate labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta: Option<bool>,
    /// Deprecated and ignored: internal is set per version by ModuleTemplate labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal: Option<bool>,
    /// Experimental: Kymas that may see a restricted module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::schema::label_selector")]
    pub kyma_selector: Option<LabelSelector>,
}

/// One channel and the version it offers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ChannelVersion {
    /// Channel name.
    #[schemars(length(min = 3, max = 32), regex(pattern = r"^[a-z]+$"))]
    pub channel: String,
    /// Semantic version offered in the channel.
    #[schemars(
        length(max = 32),
        regex(pattern = r"^((0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[a-zA-Z-][0-9a-zA-Z-]*)?)?$")
    )]
    pub version: String,
}

/// The version of a mandatory module.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Mandatory {
    /// Semantic version.
    pub version: String,
}
