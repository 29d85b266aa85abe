//! The per-SKR access cache (parsed kubeconfig and sync state), keyed by Kyma and
//! access-Secret version. A changed Secret, an auth or connection error, or the loss of the
//! Kyma drops the entry, so rotated credentials are picked up on the next sync. Clients are
//! built per sync from the cached access ([`crate::skr::access::SkrAccess`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::{Api, Client};

use crate::catalog::{CatalogKind, KindMemory};
use crate::error::{Result, SyncError};
use crate::metrics::{EvictionReason, SkrClientMetrics};
use crate::skr::access::{AccessSettings, SkrAccess};

/// What this replica knows of one SKR between syncs.
#[derive(Debug, Default)]
pub struct SkrState {
    /// Whether the last sync succeeded, so the next one may trust [`SkrState::memory`] and
    /// list metadata only.
    pub warm: bool,
    /// Hash of the CRDs last ensured in this SKR.
    pub crd_hash: Option<u64>,
    /// Remembered resourceVersions and content hashes per kind.
    pub memory: BTreeMap<CatalogKind, KindMemory>,
}

/// A cached SKR access with its sync state.
pub struct SkrEntry {
    /// `uid/resourceVersion` of the Secret the access was read from.
    pub secret_version: String,
    /// The access; [`SkrAccess::client`] builds the client of one sync.
    pub access: SkrAccess,
    /// Sync state; locked for the duration of one sync (the controller never runs two syncs
    /// of one Kyma at once, so the lock is uncontended).
    pub state: tokio::sync::Mutex<SkrState>,
}

/// Cache of SKR clients, keyed by Kyma name.
pub struct SkrPool {
    entries: Mutex<HashMap<String, Arc<SkrEntry>>>,
    kcp: Client,
    namespace: String,
    settings: AccessSettings,
    kcp_timeout: std::time::Duration,
    metrics: SkrClientMetrics,
}

/// The version of a Secret that a client depends on.
fn secret_version(meta: &PartialObjectMeta<Secret>) -> String {
    format!(
        "{}/{}",
        meta.metadata.uid.as_deref().unwrap_or_default(),
        meta.metadata.resource_version.as_deref().unwrap_or_default()
    )
}

impl SkrPool {
    /// Creates an empty pool that reads access Secrets from `namespace` in the KCP.
    /// Every read of an access Secret is bounded by `kcp_timeout`.
    pub fn new(
        kcp: Client,
        namespace: String,
        settings: AccessSettings,
        kcp_timeout: std::time::Duration,
        metrics: SkrClientMetrics,
    ) -> Self {
        Self { entries: Mutex::default(), kcp, namespace, settings, kcp_timeout, metrics }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SkrEntry>>> {
        // A poisoned lock only means another thread panicked while holding it; the map itself
        // is always in a consistent state (single inserts and removes).
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Returns the client for `kyma`, reading the Secret and building a client when none is
    /// cached for this Secret version.
    ///
    /// # Errors
    /// [`SyncError::ReadAccessSecret`] or [`SyncError::AccessSecretInvalid`].
    pub async fn get(&self, kyma: &str, secret: &PartialObjectMeta<Secret>) -> Result<Arc<SkrEntry>> {
        let version = secret_version(secret);
        if let Some(entry) = self.lock().get(kyma).filter(|e| e.secret_version == version) {
            return Ok(Arc::clone(entry));
        }
        let name = secret.metadata.name.clone().unwrap_or_default();
        let secrets = Api::<Secret>::namespaced(self.kcp.clone(), &self.namespace);
        let full = crate::kcp::bounded(self.kcp_timeout, secrets.get(&name))
            .await
            .map_err(|source| SyncError::ReadAccessSecret { name: name.clone(), source: Box::new(source) })?;
        let access = SkrAccess::from_secret(&full, &self.settings)?;
        let entry = Arc::new(SkrEntry { secret_version: version, access, state: tokio::sync::Mutex::default() });
        let replaced = self.lock().insert(kyma.to_owned(), Arc::clone(&entry));
        if replaced.is_some() {
            self.metrics.evicted(EvictionReason::SecretChanged);
        }
        self.update_gauge();
        Ok(entry)
    }

    /// Drops the client of `kyma`, counting why.
    pub fn evict(&self, kyma: &str, reason: EvictionReason) {
        if self.lock().remove(kyma).is_some() {
            self.metrics.evicted(reason);
            self.update_gauge();
        }
    }

    /// Number of cached clients.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no client is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn update_gauge(&self) {
        self.metrics.cached_clients(self.len());
    }
}
