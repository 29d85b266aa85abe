//! Errors of one SKR sync, and how each maps to a `ModuleCatalog` condition reason and a
//! bounded metric label.

use crate::catalog::CatalogKind;

/// Why a sync of one SKR failed. Each variant names the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No Secret in the KCP carries the Kyma's `kyma-name` label.
    #[error("found no access secret labelled operator.kyma-project.io/kyma-name={kyma} in namespace {namespace}")]
    AccessSecretMissing {
        /// Kyma name.
        kyma: String,
        /// KCP namespace searched.
        namespace: String,
    },
    /// More than one Secret carries the Kyma's `kyma-name` label.
    #[error(
        "found {count} access secrets labelled operator.kyma-project.io/kyma-name={kyma} ({names}); keep exactly one"
    )]
    AccessSecretAmbiguous {
        /// Kyma name.
        kyma: String,
        /// How many were found.
        count: usize,
        /// Their names, comma-separated.
        names: String,
    },
    /// The access Secret could not be read from the KCP.
    #[error("failed to read access secret {name}")]
    ReadAccessSecret {
        /// Secret name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// The access Secret has no usable kubeconfig.
    #[error("access secret {name} holds no usable kubeconfig in data key \"config\": {reason}")]
    AccessSecretInvalid {
        /// Secret name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Checking or writing the SKR's namespace failed.
    #[error("failed to ensure namespace {namespace} in the SKR")]
    EnsureSkrNamespace {
        /// Namespace name.
        namespace: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Checking or writing a catalog CRD in the SKR failed.
    #[error("failed to ensure CRD {name} in the SKR")]
    EnsureSkrCrd {
        /// CRD name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// The KCP CRD of a catalog kind is not known yet.
    #[error("the KCP has no CRD {name} to copy to the SKR")]
    KcpCrdMissing {
        /// CRD name.
        name: String,
    },
    /// Listing the copies of a kind in the SKR failed.
    #[error("failed to list {} objects in the SKR", kind.as_str())]
    ListSkrObjects {
        /// Kind listed.
        kind: CatalogKind,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Applying a copy to the SKR failed.
    #[error("failed to apply {} {name} to the SKR", kind.as_str())]
    ApplySkrObject {
        /// Kind applied.
        kind: CatalogKind,
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Deleting an orphaned copy from the SKR failed.
    #[error("failed to delete orphaned {} {name} from the SKR", kind.as_str())]
    PruneSkrObject {
        /// Kind deleted.
        kind: CatalogKind,
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// The whole sync took longer than `--sync-timeout`.
    #[error("sync did not finish within {0:?}")]
    SyncTimeout(std::time::Duration),
    /// This replica lost the right to write to the SKR during the sync.
    #[error("lost ownership of the SKR during the sync")]
    OwnershipLost,
    /// Writing the Kyma's `ModuleCatalog` condition failed.
    #[error("failed to write the ModuleCatalog condition of the Kyma")]
    WriteCondition(#[source] Box<kube::Error>),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What an SKR API error says about the SKR, independent of the operation.
fn skr_api_reason(err: &kube::Error) -> Option<&'static str> {
    match err {
        kube::Error::Api(status) if status.code == 401 => Some("SkrUnauthorized"),
        kube::Error::Api(status) if status.code == 403 => Some("SkrForbidden"),
        kube::Error::Api(_) | kube::Error::SerdeError(_) => None,
        // Connection refused, TLS failures, timeouts: the SKR cannot be reached.
        _ => Some("SkrUnreachable"),
    }
}

impl Error {
    /// The `ModuleCatalog` condition reason for this failure: one of a small documented set
    /// (see `docs/metrics.md` and the README).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::AccessSecretMissing { .. } => "AccessSecretMissing",
            Error::AccessSecretAmbiguous { .. } => "AccessSecretAmbiguous",
            Error::ReadAccessSecret { .. } => "AccessSecretUnreadable",
            Error::AccessSecretInvalid { .. } => "AccessSecretInvalid",
            Error::EnsureSkrNamespace { source, .. } | Error::EnsureSkrCrd { source, .. } => {
                skr_api_reason(source).unwrap_or("CrdSyncFailed")
            }
            Error::KcpCrdMissing { .. } => "CrdSyncFailed",
            Error::ListSkrObjects { source, .. } => skr_api_reason(source).unwrap_or("ListFailed"),
            Error::ApplySkrObject { source, .. } => skr_api_reason(source).unwrap_or("ApplyFailed"),
            Error::PruneSkrObject { source, .. } => skr_api_reason(source).unwrap_or("PruneFailed"),
            Error::SyncTimeout(_) => "SkrUnreachable",
            Error::OwnershipLost => "OwnershipLost",
            Error::WriteCondition(_) => "ConditionWriteFailed",
        }
    }

    /// Whether the cached SKR client must be dropped, so the next attempt re-reads the Secret
    /// and connects anew (rotated credentials, changed endpoint).
    pub fn evicts_client(&self) -> bool {
        matches!(self.reason(), "SkrUnauthorized" | "SkrUnreachable" | "AccessSecretInvalid")
    }

    /// Whether a human must act (a Kubernetes Event is emitted on the Kyma).
    pub fn needs_human(&self) -> bool {
        matches!(
            self.reason(),
            "AccessSecretMissing"
                | "AccessSecretAmbiguous"
                | "AccessSecretInvalid"
                | "SkrUnauthorized"
                | "SkrForbidden"
                | "SkrUnreachable"
        )
    }

    /// The message of the `ModuleCatalog` condition: this error and its causes.
    pub fn condition_message(&self) -> String {
        let mut msg = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            msg.push_str(": ");
            msg.push_str(&c.to_string());
            cause = c.source();
        }
        msg.chars().take(1024).collect()
    }
}
