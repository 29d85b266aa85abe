//! The values of every bounded metric label that is not defined next to what it classifies
//! ([`CatalogKind`](crate::catalog::CatalogKind),
//! [`ConditionReason`](crate::error::ConditionReason),
//! [`ConditionStatus`](crate::api::ConditionStatus),
//! [`WarningReason`](crate::catalog::WarningReason)).

crate::label_enum! {
    /// How a sync of one SKR ended: the `result` label of `catalogsync_sync_runs_total`.
    pub enum SyncResult {
        /// The SKR holds the desired catalog.
        Success => "success",
        /// The sync failed.
        Error => "error",
    }
}

crate::label_enum! {
    /// What a successful sync did with one catalog object: the `op` label of
    /// `catalogsync_sync_objects_total`.
    pub enum ObjectOp {
        /// Written with server-side apply.
        Applied => "applied",
        /// Already right, not written.
        Unchanged => "unchanged",
        /// A managed orphan, deleted.
        Pruned => "pruned",
    }
}

crate::label_enum! {
    /// Why a reconcile left a Kyma alone: the `reason` label of
    /// `catalogsync_kymas_skipped_total`.
    pub enum SkipReason {
        /// The Kyma has a `deletionTimestamp`.
        Deleting => "deleting",
        /// The Kyma carries the skip-reconciliation label.
        SkipReconciliation => "skip_reconciliation",
    }
}

crate::label_enum! {
    /// The kind of an SKR request: the `verb` label of `catalogsync_skr_requests_total`.
    pub enum SkrVerb {
        /// A GET of one object.
        Get => "get",
        /// A LIST, in full or metadata only.
        List => "list",
        /// A server-side apply.
        Apply => "apply",
        /// A PUT.
        Replace => "replace",
        /// A DELETE.
        Delete => "delete",
    }
}

crate::label_enum! {
    /// How an SKR request ended: the `result` label of `catalogsync_skr_requests_total`.
    pub enum RequestResult {
        /// A 2xx answer.
        Success => "success",
        /// The SKR answered 404.
        NotFound => "not_found",
        /// The SKR answered 409.
        Conflict => "conflict",
        /// Any other failure, timeouts and refused connections included.
        Error => "error",
    }
}

impl RequestResult {
    /// Classifies the result of one request.
    pub fn of<T>(result: &Result<T, kube::Error>) -> Self {
        match result {
            Ok(_) => Self::Success,
            Err(kube::Error::Api(s)) if s.code == 404 => Self::NotFound,
            Err(kube::Error::Api(s)) if s.code == 409 => Self::Conflict,
            Err(_) => Self::Error,
        }
    }
}

crate::label_enum! {
    /// Why a cached SKR access was dropped: the `reason` label of
    /// `catalogsync_skr_client_evictions_total`.
    pub enum EvictionReason {
        /// The access Secret has a new version.
        SecretChanged => "secret_changed",
        /// A sync failed in a way that calls for a fresh read and connection.
        Error => "error",
        /// The Kyma is being deleted, is skipped, or its shard is not held here.
        Released => "released",
        /// The Kyma is gone from the KCP.
        Deleted => "deleted",
    }
}

crate::label_enum! {
    /// A shard ownership change made by this replica: the `op` label of
    /// `catalogsync_shard_handovers_total`.
    pub enum HandoverOp {
        /// Took an unheld shard assigned here.
        Claimed => "claimed",
        /// Went on working on a shard whose Lease already named this replica.
        Resumed => "resumed",
        /// The shard was assigned elsewhere; no new syncs of it start here.
        Drained => "drained",
        /// Cleared the shard Lease's holder (after a drain, or on shutdown).
        Released => "released",
        /// The Lease names another holder or is gone; stopped at once.
        Dropped => "dropped",
    }
}

crate::label_enum! {
    /// How a renewal of this replica's member Lease ended: the `result` label of
    /// `catalogsync_member_renewals_total`.
    pub enum RenewalResult {
        /// Renewed.
        Success => "success",
        /// Failed, or another process holds the Lease.
        Error => "error",
    }
}

crate::label_enum! {
    /// Which catalog state a count is of: the `state` label of
    /// `catalogsync_catalog_reachable_objects`.
    pub enum ReachableState {
        /// The state this replica publishes, which its syncs use.
        Published => "published",
        /// The newest state built from the KCP.
        Latest => "latest",
    }
}
