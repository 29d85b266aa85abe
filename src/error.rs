//! Errors of one SKR sync, and how each maps to a `ModuleCatalog` condition reason and a
//! bounded metric label.

use crate::catalog::CatalogKind;
use crate::skr::kubeconfig::KubeconfigProblem;
use crate::skr::request::{is_invalid_answer, is_over_budget, is_too_large};

/// Why a sync of one SKR failed. Each variant names the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
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
        "found {count} access secrets labelled operator.kyma-project.io/kyma-name={kyma} ({}); keep exactly one",
        names.join(", ")
    )]
    AccessSecretAmbiguous {
        /// Kyma name.
        kyma: String,
        /// How many were found.
        count: usize,
        /// Their names, sorted.
        names: Vec<String>,
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
    /// The access Secret holds no kubeconfig that catalogsync accepts (see
    /// [`crate::skr::kubeconfig`]), or its server is not an allowed destination.
    #[error("access secret {name} holds no acceptable kubeconfig: {problem}")]
    AccessSecretInvalid {
        /// Secret name.
        name: String,
        /// What is wrong with it, naming fields, never quoting values.
        problem: KubeconfigProblem,
    },
    /// The SKR server's name did not resolve.
    #[error("failed to resolve the SKR server's name")]
    ResolveSkr {
        /// Cause.
        #[source]
        source: std::io::Error,
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
    /// The SKR's sync namespace is being deleted: nothing can be written into it until it
    /// is gone, when the next sync creates it again.
    #[error("namespace {namespace} in the SKR is being deleted; it is created again once it is gone")]
    SkrNamespaceDeleting {
        /// Namespace name.
        namespace: String,
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

/// Longest `ModuleCatalog` condition message, in characters.
pub const MAX_CONDITION_MESSAGE: usize = 1024;

/// Result alias of this crate.
pub type Result<T, E = SyncError> = std::result::Result<T, E>;

/// One cause of an error, for a human: an API error as the answer it was, not kube's
/// `ApiError: .. (Status { .. })` debug text.
fn describe(cause: &(dyn std::error::Error + 'static)) -> String {
    match as_kube(cause) {
        Some(kube::Error::Api(status)) if status.reason.is_empty() => {
            format!("the server answered {}: {}", status.code, status.message)
        }
        Some(kube::Error::Api(status)) => {
            format!("the server answered {} {}: {}", status.code, status.reason, status.message)
        }
        Some(kube::Error::Service(inner)) => inner.to_string(),
        _ => cause.to_string(),
    }
}

/// `cause` as a kube error: the variants hold their cause boxed, and a box is an error type
/// of its own.
fn as_kube<'a>(cause: &'a (dyn std::error::Error + 'static)) -> Option<&'a kube::Error> {
    cause.downcast_ref::<kube::Error>().or_else(|| cause.downcast_ref::<Box<kube::Error>>().map(|b| &**b))
}

crate::label_enum! {
    /// A `ModuleCatalog` condition reason: [`ConditionReason::CatalogSynced`] for a `True`
    /// condition, else why a sync failed ([`SyncError::reason`]). Also the `reason` label of
    /// `catalogsync_sync_errors_total` and the reason of the Kyma's Events. `docs/metrics.md`
    /// lists them all; `tests/metrics_doc.rs` holds it to this list.
    pub enum ConditionReason {
        /// The SKR holds the desired catalog (the reason of a `True` condition).
        CatalogSynced => "CatalogSynced",
        /// No access Secret carries the Kyma's label.
        AccessSecretMissing => "AccessSecretMissing",
        /// More than one access Secret carries the Kyma's label.
        AccessSecretAmbiguous => "AccessSecretAmbiguous",
        /// Reading the access Secret from the KCP failed.
        AccessSecretUnreadable => "AccessSecretUnreadable",
        /// The access Secret holds no acceptable kubeconfig.
        AccessSecretInvalid => "AccessSecretInvalid",
        /// The SKR answered 401.
        SkrUnauthorized => "SkrUnauthorized",
        /// The SKR answered 403.
        SkrForbidden => "SkrForbidden",
        /// The SKR could not be reached, or the sync timed out.
        SkrUnreachable => "SkrUnreachable",
        /// An SKR answer was larger than allowed.
        SkrResponseTooLarge => "SkrResponseTooLarge",
        /// The SKR sent more than `--skr-sync-budget` in one sync.
        SkrBudgetExceeded => "SkrBudgetExceeded",
        /// An SKR answer had a field no real apiserver sends (a name that is no DNS
        /// subdomain, an over-long resourceVersion, a repeated continue token, ...).
        SkrAnswerInvalid => "SkrAnswerInvalid",
        /// Ensuring the namespace or a CRD failed, or the KCP has no CRD to copy.
        CrdSyncFailed => "CrdSyncFailed",
        /// Listing copies in the SKR failed.
        ListFailed => "ListFailed",
        /// Applying a copy failed.
        ApplyFailed => "ApplyFailed",
        /// Pruning an orphan failed.
        PruneFailed => "PruneFailed",
        /// This replica lost the SKR during the sync; never written to a condition nor counted.
        OwnershipLost => "OwnershipLost",
        /// Writing the condition itself failed; never written to a condition.
        ConditionWriteFailed => "ConditionWriteFailed",
    }
}

impl ConditionReason {
    /// Whether this reason can stand in a Kyma's `ModuleCatalog` condition.
    pub const fn reaches_condition(self) -> bool {
        !matches!(self, Self::OwnershipLost | Self::ConditionWriteFailed)
    }

    /// Whether a failure of this reason is counted in `catalogsync_sync_errors_total`: every
    /// failure but [`ConditionReason::OwnershipLost`] (the new owner syncs the SKR).
    pub const fn counts_as_sync_error(self) -> bool {
        !matches!(self, Self::CatalogSynced | Self::OwnershipLost)
    }

    /// Whether a failure of this reason drops the cached SKR client, so the next attempt
    /// re-reads the Secret and connects anew (rotated credentials, changed endpoint); and, for
    /// an access Secret that is gone or no longer the only one, so that its credentials and
    /// what was kept of the SKR leave the replica (and the shard record it writes).
    pub const fn evicts_client(self) -> bool {
        matches!(
            self,
            Self::SkrUnauthorized
                | Self::SkrUnreachable
                | Self::AccessSecretInvalid
                | Self::AccessSecretMissing
                | Self::AccessSecretAmbiguous
        )
    }

    /// Whether a failure of this reason needs a human (a Kubernetes Event is emitted on the
    /// Kyma).
    pub const fn needs_human(self) -> bool {
        matches!(
            self,
            Self::AccessSecretMissing
                | Self::AccessSecretAmbiguous
                | Self::AccessSecretInvalid
                | Self::SkrUnauthorized
                | Self::SkrForbidden
                | Self::SkrUnreachable
                | Self::SkrResponseTooLarge
                | Self::SkrBudgetExceeded
                | Self::SkrAnswerInvalid
        )
    }
}

/// What an SKR API error says about the SKR, independent of the operation.
fn skr_api_reason(err: &kube::Error) -> Option<ConditionReason> {
    match err {
        err if is_over_budget(err) => Some(ConditionReason::SkrBudgetExceeded),
        err if is_invalid_answer(err) => Some(ConditionReason::SkrAnswerInvalid),
        err if is_too_large(err) => Some(ConditionReason::SkrResponseTooLarge),
        kube::Error::Api(status) if status.code == 401 => Some(ConditionReason::SkrUnauthorized),
        kube::Error::Api(status) if status.code == 403 => Some(ConditionReason::SkrForbidden),
        kube::Error::Api(_) | kube::Error::SerdeError(_) => None,
        // Connection refused, TLS failures, timeouts: the SKR cannot be reached.
        _ => Some(ConditionReason::SkrUnreachable),
    }
}

impl SyncError {
    /// The `ModuleCatalog` condition reason for this failure; never
    /// [`ConditionReason::CatalogSynced`].
    pub fn reason(&self) -> ConditionReason {
        use ConditionReason as R;
        match self {
            SyncError::AccessSecretMissing { .. } => R::AccessSecretMissing,
            SyncError::AccessSecretAmbiguous { .. } => R::AccessSecretAmbiguous,
            SyncError::ReadAccessSecret { .. } => R::AccessSecretUnreadable,
            SyncError::AccessSecretInvalid { .. } => R::AccessSecretInvalid,
            SyncError::ResolveSkr { .. } => R::SkrUnreachable,
            SyncError::EnsureSkrNamespace { source, .. } | SyncError::EnsureSkrCrd { source, .. } => {
                skr_api_reason(source).unwrap_or(R::CrdSyncFailed)
            }
            SyncError::KcpCrdMissing { .. } | SyncError::SkrNamespaceDeleting { .. } => R::CrdSyncFailed,
            SyncError::ListSkrObjects { source, .. } => skr_api_reason(source).unwrap_or(R::ListFailed),
            SyncError::ApplySkrObject { source, .. } => skr_api_reason(source).unwrap_or(R::ApplyFailed),
            SyncError::PruneSkrObject { source, .. } => skr_api_reason(source).unwrap_or(R::PruneFailed),
            SyncError::SyncTimeout(_) => R::SkrUnreachable,
            SyncError::OwnershipLost => R::OwnershipLost,
            SyncError::WriteCondition(_) => R::ConditionWriteFailed,
        }
    }

    /// Whether the cached SKR client must be dropped, so the next attempt re-reads the Secret
    /// and connects anew (rotated credentials, changed endpoint).
    pub fn evicts_client(&self) -> bool {
        self.reason().evicts_client()
    }

    /// Whether a human must act (a Kubernetes Event is emitted on the Kyma).
    pub fn needs_human(&self) -> bool {
        self.reason().needs_human()
    }

    /// The message of the `ModuleCatalog` condition (and its Event): this error and its
    /// causes, at most [`MAX_CONDITION_MESSAGE`] characters, without control characters.
    /// SKR-sent text in the causes is already cut short where it entered
    /// ([`crate::skr::request`]); nothing of an access Secret is ever in it.
    pub fn condition_message(&self) -> String {
        let mut msg = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let text = describe(c);
            // kube's errors repeat their source in their own text; say each thing once.
            if !msg.contains(&text) {
                msg.push_str(": ");
                msg.push_str(&text);
            }
            // An API error was said in full: its `Status` below it says it again.
            if matches!(as_kube(c), Some(kube::Error::Api(_))) {
                break;
            }
            cause = c.source();
        }
        crate::text::bounded(&msg, MAX_CONDITION_MESSAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An API error in the cause chain reads as the answer it was, not as kube's debug text of
    /// the `Status`, and is said once.
    #[test]
    fn a_condition_message_says_what_the_server_answered_once() {
        let status = kube::core::Status::failure("you may not", "Forbidden").with_code(403);
        let err = SyncError::ListSkrObjects {
            kind: CatalogKind::ModuleTemplate,
            source: Box::new(kube::Error::Api(Box::new(status))),
        };
        assert_eq!(
            err.condition_message(),
            "failed to list ModuleTemplate objects in the SKR: the server answered 403 Forbidden: you may not"
        );
        assert_eq!(err.reason(), ConditionReason::SkrForbidden);
    }
}
