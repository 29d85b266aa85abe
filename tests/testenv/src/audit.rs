//! The kube-apiserver audit log: the policy the harness installs and the parsed events.
//!
//! Every request is logged at level `Metadata` (who, what, which object, the response code;
//! no bodies; Leases with their bodies, deletes of catalog copies with their `DeleteOptions`,
//! see [`AUDIT_POLICY`]), once per stage after `RequestReceived` (so normally one
//! `ResponseComplete` event per request, plus `ResponseStarted` for watches). Each event
//! carries `requestReceivedTimestamp` and `stageTimestamp`; for `ResponseComplete` the latter
//! is when the apiserver was done with the request, so the two bound the moment a write took
//! effect. The log backend runs in `blocking` mode, so an event is in the file before its
//! response reaches the client.

use std::path::Path;

use anyhow::{Context as _, Result};
use serde::Deserialize;

/// The audit policy, without the `RequestReceived` stage: Leases (`coordination.k8s.io`) at
/// `RequestResponse`, so the log holds their bodies (holder, renew time, annotations; see
/// `invariants.rs`); deletes in `operator.kyma-project.io` at `Request`, so the log holds
/// their `DeleteOptions` (a prune's preconditions, in `requestObject`); everything else at
/// `Metadata`. Rules are first-match.
pub const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  resources:
  - group: coordination.k8s.io
    resources: [leases]
- level: Request
  verbs: [delete, deletecollection]
  resources:
  - group: operator.kyma-project.io
- level: Metadata
";

/// One audit event (the fields the tests use).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AuditEvent {
    /// Unique ID of the request; the same in every stage's event.
    #[serde(rename = "auditID")]
    pub audit_id: String,
    /// `ResponseComplete`, `ResponseStarted` or `Panic`.
    pub stage: String,
    /// The verb: get, list, watch, create, update, patch, delete, deletecollection, ...
    pub verb: String,
    /// The request URI, with query.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// The authenticated user.
    pub user: UserInfo,
    /// The impersonated user, if any.
    pub impersonated_user: Option<UserInfo>,
    /// The client's User-Agent header.
    pub user_agent: Option<String>,
    /// The object the request is about (absent for non-resource URLs such as `/readyz`).
    pub object_ref: Option<ObjectRef>,
    /// The response status.
    pub response_status: Option<ResponseStatus>,
    /// The request body, for requests logged at level `Request` or above (see
    /// [`AUDIT_POLICY`]): for a delete, its `DeleteOptions`.
    pub request_object: Option<serde_json::Value>,
    /// When the apiserver received the request (RFC 3339 with microseconds).
    pub request_received_timestamp: String,
    /// When this stage was reached: for `ResponseComplete`, when the response was complete.
    pub stage_timestamp: String,
}

/// The user of an audit event.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct UserInfo {
    /// User name (the client certificate's CN).
    pub username: String,
    /// Groups (the client certificate's O values plus `system:authenticated`).
    pub groups: Vec<String>,
}

/// The object of an audit event. `namespace` and `name` are absent for lists and for
/// cluster-scoped objects.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectRef {
    /// Plural resource name, e.g. `moduletemplates`.
    pub resource: String,
    /// Namespace.
    pub namespace: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// API group (absent for the core group).
    pub api_group: Option<String>,
    /// API version.
    pub api_version: Option<String>,
    /// Subresource, e.g. `status`.
    pub subresource: Option<String>,
}

/// The response status of an audit event.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct ResponseStatus {
    /// HTTP status code.
    pub code: u16,
}

impl AuditEvent {
    /// Whether the request may have changed state: create, update, patch, delete or
    /// deletecollection.
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }

    /// The response code, or 0 when the event has none.
    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }

    /// The object's resource, or "" for non-resource requests.
    pub fn resource(&self) -> &str {
        self.object_ref.as_ref().map_or("", |o| o.resource.as_str())
    }

    /// The object's name, if the request names one.
    pub fn name(&self) -> Option<&str> {
        self.object_ref.as_ref().and_then(|o| o.name.as_deref())
    }

    /// The object's namespace, if any.
    pub fn namespace(&self) -> Option<&str> {
        self.object_ref.as_ref().and_then(|o| o.namespace.as_deref())
    }
}

/// Parses an audit log (JSON lines). A last line without its newline (being written right
/// now) is skipped.
///
/// # Errors
/// Fails when the file cannot be read or a complete line is not an audit event.
pub fn read_audit_log(path: &Path) -> Result<Vec<AuditEvent>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(e).with_context(|| format!("failed to read the audit log {}", path.display()));
        }
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line)
                .with_context(|| format!("failed to parse an audit event in {}: {line}", path.display()))
        })
        .collect()
}
