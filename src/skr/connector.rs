//! The access to one SKR (parsed kubeconfig and sync state), built from its access Secret.
//! The accesses are kept per Kyma and access-Secret version by
//! [`crate::sync::kymas::KymaRecords`]: a changed Secret, an auth or connection error, or the
//! loss of the Kyma drops one, so rotated credentials are picked up on the next sync. Clients
//! are built per sync from the kept access ([`crate::skr::access::SkrAccess`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::catalog::{CatalogKind, KindMemory};
use crate::error::{Result, SyncError};
use crate::skr::access::{AccessSettings, SecretRef, SkrAccess};

/// What this replica knows of one SKR between syncs.
#[derive(Debug, Default)]
pub struct SkrState {
    /// Whether the last sync succeeded, so the next one may trust [`SkrState::memory`] and
    /// list metadata only.
    pub warm: bool,
    /// Hash of the CRDs last ensured in this SKR.
    pub crd_hash: Option<u64>,
    /// When a successful sync last listed every kind (verified the SKR). Until one resync
    /// period after it, syncs of a warm SKR plan from [`SkrState::memory`] alone.
    pub verified_at: Option<tokio::time::Instant>,
    /// When a successful sync last checked the SKR's namespace (and its label) and CRDs. They
    /// are checked again at least once per resync period, whatever else is remembered.
    pub setup_verified_at: Option<tokio::time::Instant>,
    /// Remembered resourceVersions and content hashes per kind.
    pub memory: BTreeMap<CatalogKind, KindMemory>,
    /// What a replica that held this SKR before remembered of it (kept in the KCP across
    /// restarts and handovers, [`crate::sync::recall`]): used by the first sync, which then
    /// verifies the SKR with metadata-only lists where the record still holds.
    pub recalled: Option<Recalled>,
    /// Whether [`SkrState::memory`] came from a recalled record and no full list here has
    /// confirmed the content it stands for since. A record pairs resourceVersions with
    /// content digests that this replica never read; the next verification of the SKR (one
    /// resync period after the recall at the latest) lists it in full.
    pub content_unverified: bool,
}

/// What a replica keeps of one SKR's [`SkrState`] when it gives up its shard: enough to tell,
/// from metadata-only lists, that the SKR still holds exactly what it held then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recalled {
    /// [`KindMemory::digest`] per kind. (The namespace and the CRDs are checked by the first
    /// sync after a recall whatever a record says, so a record keeps nothing of them.)
    pub kinds: BTreeMap<CatalogKind, u128>,
}

/// How much sooner than the trust period a sync stops trusting memory: the resync that
/// [`crate::sync::executor::SyncReport::verify_in`] schedules always finds it expired and
/// lists.
pub const TRUST_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

impl SkrState {
    /// Whether a sync now may plan from memory alone: the SKR is warm and a sync listed
    /// every kind less than `trust_for` (minus [`TRUST_MARGIN`]) ago.
    pub fn trusts_memory(&self, trust_for: std::time::Duration) -> bool {
        self.warm && self.verified_at.is_some_and(|at| at.elapsed() + TRUST_MARGIN < trust_for)
    }

    /// Whether a sync now may skip the namespace and CRD checks: the SKR is warm and a sync
    /// checked them less than `trust_for` (minus [`TRUST_MARGIN`]) ago. A record recalled
    /// from a previous holder never stands in for them (the state is not warm then).
    pub fn trusts_setup(&self, trust_for: std::time::Duration) -> bool {
        self.warm && self.setup_verified_at.is_some_and(|at| at.elapsed() + TRUST_MARGIN < trust_for)
    }

    /// When the SKR is due to be verified again: the time left until its memory, or its
    /// namespace and CRD check, is no longer trusted, whichever comes first (`None`: it was
    /// never verified, or trust is off).
    pub fn verify_in(&self, trust_for: std::time::Duration) -> Option<std::time::Duration> {
        let left = |at: tokio::time::Instant| trust_for.saturating_sub(at.elapsed());
        let due = [self.verified_at, self.setup_verified_at].into_iter().flatten().map(left).min();
        due.filter(|_| !trust_for.is_zero())
    }

    /// What to keep of this state across a restart: `None` unless the last sync succeeded
    /// (a cold state is verified in full anyway).
    pub fn remembered(&self) -> Option<Recalled> {
        self.warm
            .then(|| Recalled { kinds: self.memory.iter().map(|(kind, memory)| (*kind, memory.digest())).collect() })
    }
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

/// Builds the access to an SKR from its access Secret. Holds no state of its own: the accesses
/// it builds are kept, per Kyma, by [`crate::sync::kymas::KymaRecords`].
pub struct SkrConnector {
    kcp: Client,
    namespace: String,
    settings: AccessSettings,
    kcp_timeout: std::time::Duration,
}

impl SkrConnector {
    /// A connector that reads access Secrets from `namespace` in the KCP, every read bounded by
    /// `kcp_timeout`, and builds accesses with `settings`.
    pub fn new(kcp: Client, namespace: String, settings: AccessSettings, kcp_timeout: std::time::Duration) -> Self {
        Self { kcp, namespace, settings, kcp_timeout }
    }

    /// Reads the access Secret `secret` names and builds the access it grants, with an empty
    /// sync state.
    ///
    /// # Errors
    /// [`SyncError::ReadAccessSecret`] or [`SyncError::AccessSecretInvalid`].
    pub async fn connect(&self, secret: &SecretRef) -> Result<SkrEntry> {
        let version = secret.version.clone();
        let name = secret.name.clone();
        let secrets = Api::<Secret>::namespaced(self.kcp.clone(), &self.namespace);
        let full = crate::kcp::bounded(self.kcp_timeout, secrets.get(&name))
            .await
            .map_err(|source| SyncError::ReadAccessSecret { name: name.clone(), source: Box::new(source) })?;
        let access = SkrAccess::from_secret(&full, &self.settings)?;
        Ok(SkrEntry { secret_version: version, access, state: tokio::sync::Mutex::default() })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The namespace and CRD check is trusted for one resync period and only in a warm state;
    /// the next verification is due when the copies' memory or that check expires, whichever
    /// comes first.
    #[tokio::test(start_paused = true)]
    async fn the_setup_check_is_trusted_for_one_period_and_never_in_a_cold_state() {
        let period = Duration::from_secs(300);
        let mut state = SkrState { warm: true, ..SkrState::default() };
        assert!(!state.trusts_setup(period), "never checked");
        state.setup_verified_at = Some(tokio::time::Instant::now());
        assert!(state.trusts_setup(period));
        state.warm = false;
        assert!(!state.trusts_setup(period), "a cold state (a recalled record included) checks again");
        state.warm = true;
        tokio::time::advance(Duration::from_secs(100)).await;
        state.verified_at = Some(tokio::time::Instant::now());
        assert_eq!(state.verify_in(period), Some(Duration::from_secs(200)), "the older of the two decides");
        tokio::time::advance(period - TRUST_MARGIN - Duration::from_secs(100)).await;
        assert!(!state.trusts_setup(period), "at most one period");
        assert!(state.trusts_memory(period));
        assert_eq!(state.verify_in(Duration::ZERO), None, "trust off");
    }
}
