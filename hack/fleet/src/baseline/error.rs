//! Why a pass failed: one SKR request, one kind's apply-and-prune, or the whole pass.

use std::time::Duration;

/// Why one SKR request failed.
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
