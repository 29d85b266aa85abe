//! Why a pass failed: one request, one kind's apply-and-prune, or the whole pass.

use std::time::Duration;

/// Why one request (to an SKR or the KCP) failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum RequestError {
    /// The API call failed.
    #[error("request failed")]
    Kube(#[source] kube::Error),
    /// The API call did not finish in time.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
}

impl RequestError {
    /// Whether the API answered 404 (NotFound, or no such resource).
    pub fn is_not_found(&self) -> bool {
        matches!(self, RequestError::Kube(kube::Error::Api(s)) if s.code == 404)
    }
}

/// Why one kind's sync failed in a pass.
#[derive(Debug, thiserror::Error)]
pub(super) enum KindError {
    /// At least one apply failed (the first cause is kept); no deletion ran.
    #[error("failed to apply {kind} ({total} desired)")]
    Apply {
        kind: &'static str,
        total: usize,
        #[source]
        source: RequestError,
    },
    /// Listing the kind failed.
    #[error("failed to list {kind}")]
    List {
        kind: &'static str,
        #[source]
        source: RequestError,
    },
    /// At least one deletion failed.
    #[error("failed to delete {failed} of {total} obsolete {kind}")]
    Delete {
        kind: &'static str,
        failed: usize,
        total: usize,
        #[source]
        source: RequestError,
    },
}

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum PassError {
    /// No SKR client (Secret missing, ambiguous or invalid).
    #[error("failed to get the SKR client")]
    Access(#[source] catalogsync::error::SyncError),
    /// One or both kinds failed.
    #[error("failed to sync the catalog: {}", errors.iter().map(|e| chain(e)).collect::<Vec<_>>().join("; "))]
    Sync { errors: Vec<KindError> },
    /// The SKR namespace could not be applied (KLM's connectivity probe).
    #[error("failed to apply the SKR namespace")]
    ApplyNamespace(#[source] RequestError),
    /// The KCP Kyma could not be given its finalizer.
    #[error("failed to add the finalizer to the KCP Kyma")]
    PatchKcpKyma(#[source] RequestError),
    /// A CRD to sync is not in the KCP cache.
    #[error("KCP CRD {name} not found")]
    KcpCrdMissing { name: String },
    /// At least one CRD apply failed (the first cause is kept); the others were still applied.
    #[error("failed to apply {failed} of the CRDs to the SKR")]
    ApplyCrds {
        failed: usize,
        #[source]
        source: RequestError,
    },
    /// The SKR Kyma could not be read.
    #[error("failed to get the SKR Kyma")]
    GetSkrKyma(#[source] RequestError),
    /// The SKR Kyma could not be created.
    #[error("failed to create the SKR Kyma")]
    CreateSkrKyma(#[source] RequestError),
    /// The KCP Kyma's status could not be applied.
    #[error("failed to apply the KCP Kyma status")]
    ApplyKcpKymaStatus(#[source] RequestError),
    /// The SKR Kyma's labels and annotations could not be applied.
    #[error("failed to apply the SKR Kyma metadata")]
    ApplySkrKyma(#[source] RequestError),
    /// The SKR Kyma's status could not be updated.
    #[error("failed to update the SKR Kyma status")]
    ReplaceSkrKymaStatus(#[source] RequestError),
}

/// An error with its whole source chain.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
