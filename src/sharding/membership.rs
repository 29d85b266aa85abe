//! This replica's member Lease: created on start, renewed every retry period, marked as left
//! on shutdown after the shard Leases were released (the coordinator deletes it later). Each successful renewal extends the
//! [`ShardView`] fence deadline to "request sent + renew deadline"; a replica that cannot
//! renew stops writing on its own.
//!
//! The Lease carries a random nonce of the process that holds it, and every renewal is a
//! JSON patch that first tests that nonce. A second process with the same identity (a copied
//! manifest, `POD_NAME` unset on two replicas) therefore cannot renew the Lease the first one
//! holds: it stays fenced, not ready, and says why, and takes the Lease over only once it has
//! seen it unchanged for a lease duration (the first process is gone). A process restarted
//! after a crash waits the same way for its predecessor's Lease; one restarted after a clean
//! shutdown takes over a Lease marked as left at once.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::{
    CONFIG_LEASE, MEMBER_LEFT_ANNOTATION, MEMBER_MODE_ANNOTATION, MEMBER_NONCE_ANNOTATION, member_lease_name,
};
use crate::metrics::{RenewalResult, ShardMetrics};
use crate::sharding::lease::{
    expiry, is_member, member_identity, member_left, member_version, new_config, new_member, recorded_shards,
};
use crate::sharding::liveness::Liveness;
use crate::sharding::{ShardView, Timing};

/// This replica's member Lease.
pub struct Member {
    /// Lease API in the lease namespace.
    pub api: Api<Lease>,
    /// This replica's identity.
    pub identity: String,
    /// This process's nonce (random, new on every start).
    pub nonce: String,
    /// Ownership gate, fenced while the Lease is not renewed.
    pub view: ShardView,
    /// Timings.
    pub timing: Timing,
    /// Metrics.
    pub metrics: ShardMetrics,
    /// Beaten every round.
    pub heartbeat: crate::health::Heartbeat,
    /// The Lease cache, for the shard count recorded in the config Lease.
    pub leases: Store<Lease>,
    /// Filled with the nonce of a predecessor whose member Lease this process took over.
    pub predecessors: Predecessors,
    /// Whether this replica runs in shadow mode: it then takes part only while no active
    /// replica lives in its Lease namespace.
    pub shadow: bool,
}

/// The `--mode` a member Lease names ([`MEMBER_MODE_ANNOTATION`]; absent: active).
fn is_shadow_member(lease: &Lease) -> bool {
    lease.annotations().get(MEMBER_MODE_ANNOTATION).is_some_and(|m| m == MODE_SHADOW)
}

/// The value of [`MEMBER_MODE_ANNOTATION`] of a shadow replica.
const MODE_SHADOW: &str = "shadow";

/// The value of [`MEMBER_MODE_ANNOTATION`] of an active replica.
const MODE_ACTIVE: &str = "active";

/// What the config Lease says of this replica's `--shards`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardCount {
    /// The recorded count is this replica's.
    Agrees,
    /// Another count is recorded.
    Differs(u32),
    /// None is recorded, or the cache does not show the config Lease yet.
    Unknown,
}

/// The nonces of earlier processes of this identity whose member Lease this process took
/// over: they were gone for a lease duration, so they fenced themselves and their last SKR
/// requests ended long ago, and the shard Leases they hold are as good as released to this
/// process (see `sharding::handover`: clean).
#[derive(Debug, Clone, Default)]
pub struct Predecessors(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Predecessors {
    fn add(&self, nonce: &str) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(nonce.to_owned());
    }

    /// Whether `nonce` is that of a process this one took over from.
    pub fn contains(&self, nonce: &str) -> bool {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().any(|n| n == nonce)
    }
}

/// The result of one renewal attempt.
#[derive(Debug)]
enum Renewal {
    /// The Lease is ours and was renewed; its new resourceVersion.
    Renewed(String),
    /// Another process holds the Lease of this identity and renews it.
    HeldByAnother,
    /// Not attempted: the shard count is not (yet) known to agree, or this shadow replica
    /// stays out of a Lease namespace with active replicas.
    Skipped,
}

/// A random process nonce.
pub fn new_nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl Member {
    /// Renews the member Lease until `token` is cancelled; then waits (bounded) until
    /// `shards_released` is cancelled, and marks the Lease as left if it is still this
    /// process's.
    pub async fn run(self, token: CancellationToken, shards_released: CancellationToken) {
        let mut was_fenced = true;
        let mut conflict = false;
        let mut other = Liveness::new(self.timing.lease_duration);
        let mut version: Option<String> = None;
        let mut mismatch = false;
        let mut yielded = false;
        loop {
            self.heartbeat.beat();
            let sent = Instant::now();
            // A replica whose --shards differs from the recorded count must not write: it would
            // map Kymas to shards differently from the others. It stops renewing, so it fences
            // itself and its member Lease expires like that of a replica cut off.
            let count = self.shard_count().await;
            if let (ShardCount::Differs(recorded), false) = (count, mismatch) {
                error!(
                    shards = self.view.shards(),
                    recorded,
                    "This replica's --shards differs from the shard count recorded in the config Lease: staying fenced (see the procedure to change the shard count)"
                );
            }
            mismatch = matches!(count, ShardCount::Differs(_));
            self.metrics.shard_count_mismatch(mismatch);
            // A shadow replica among active ones would hold shards it never syncs.
            let beside_active = self.shadow && self.active_member_lives();
            if beside_active != yielded {
                if beside_active {
                    error!(
                        "An active replica lives in this Lease namespace: this shadow replica stays fenced and holds no shard; run shadow replicas with a --lease-namespace of their own"
                    );
                } else {
                    info!("No active replica lives in this Lease namespace any more: taking part again");
                }
                yielded = beside_active;
            }
            let renewal = match count {
                ShardCount::Agrees if !beside_active => self.renew(&mut other).await,
                ShardCount::Agrees | ShardCount::Differs(_) | ShardCount::Unknown => Ok(Renewal::Skipped),
            };
            match renewal {
                Ok(Renewal::Skipped) => {}
                Ok(Renewal::Renewed(rv)) => {
                    self.view.renewed(sent, self.timing.renew_deadline);
                    self.metrics.renewal(RenewalResult::Success);
                    version = Some(rv);
                    if conflict {
                        info!("The other process with this identity is gone; took over the member Lease");
                        conflict = false;
                    }
                }
                Ok(Renewal::HeldByAnother) => {
                    self.metrics.renewal(RenewalResult::Error);
                    if !conflict {
                        error!(
                            lease = %member_lease_name(&self.identity),
                            "Another process renews the member Lease of this identity: staying fenced until it is gone; give every replica its own --identity (POD_NAME)"
                        );
                        conflict = true;
                    }
                }
                Err(error) => {
                    self.metrics.renewal(RenewalResult::Error);
                    warn!(error = &error as &dyn std::error::Error, "Failed to renew member Lease");
                }
            }
            self.metrics.identity_conflict(conflict);
            let fenced = self.view.is_fenced();
            self.metrics.fenced(fenced);
            if fenced != was_fenced {
                if fenced {
                    warn!("Member Lease not renewed within the renew deadline: stopped all SKR writes");
                } else {
                    info!("Member Lease renewed: SKR writes allowed");
                }
                was_fenced = fenced;
            }
            tokio::select! {
                () = tokio::time::sleep(self.timing.retry_period) => {}
                () = token.cancelled() => break,
            }
        }
        // Leaving first would let the coordinator reassign shards whose syncs may still run; the
        // shard agent releases them (after their drain) first.
        let release_bound = self.timing.drain_timeout + self.timing.request_timeout + self.timing.retry_period;
        if tokio::time::timeout(release_bound, shards_released.cancelled()).await.is_err() {
            warn!("Shards not released in time; leaving the member Lease anyway");
        }
        self.leave(version).await;
    }

    /// Compares this replica's shard count with the one recorded in the config Lease, and
    /// records it there when the Lease does not exist yet.
    async fn shard_count(&self) -> ShardCount {
        let recorded = self.leases.state().iter().find_map(|l| recorded_shards(l));
        match recorded {
            Some(n) if n == self.view.shards() => ShardCount::Agrees,
            Some(n) => ShardCount::Differs(n),
            None => {
                let namespace = self.api.namespace().unwrap_or_default().to_owned();
                let config = new_config(self.view.shards(), &namespace);
                match self.bounded(self.api.create(&PostParams::default(), &config)).await {
                    Ok(_) => {
                        info!(shards = self.view.shards(), "Recorded the shard count in the config Lease");
                        ShardCount::Agrees
                    }
                    // It exists and the cache has not caught up yet (at start): read it.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        match self.bounded(self.api.get_opt(CONFIG_LEASE)).await {
                            Ok(Some(lease)) => match recorded_shards(&lease) {
                                Some(n) if n == self.view.shards() => ShardCount::Agrees,
                                Some(n) => ShardCount::Differs(n),
                                None => ShardCount::Unknown,
                            },
                            Ok(None) | Err(_) => ShardCount::Unknown,
                        }
                    }
                    // The KCP failed: next round.
                    Err(_) => ShardCount::Unknown,
                }
            }
        }
    }

    /// Whether the Lease cache shows a member Lease of an active replica (another identity)
    /// that has not left and has not expired by its own renewal time.
    fn active_member_lives(&self) -> bool {
        let now = Timestamp::now();
        self.leases.state().iter().any(|l| {
            is_member(l)
                && !is_shadow_member(l)
                && !member_left(l)
                && member_identity(l).is_some_and(|id| id != self.identity)
                && expiry(l).is_some_and(|at| at > now)
        })
    }

    fn mode(&self) -> &'static str {
        if self.shadow { MODE_SHADOW } else { MODE_ACTIVE }
    }

    async fn renew(&self, other: &mut Liveness) -> Result<Renewal, kube::Error> {
        let name = member_lease_name(&self.identity);
        let now = Timestamp::now();
        // One request per renewal: the patch applies only while the Lease carries this
        // process's nonce.
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": nonce_path(), "value": self.nonce},
            {"op": "add", "path": "/spec/holderIdentity", "value": self.identity},
            {"op": "add", "path": "/spec/renewTime", "value": MicroTime(now)},
            {"op": "add", "path": "/spec/leaseDurationSeconds", "value": self.timing.lease_secs()},
            {"op": "add", "path": annotation_path(MEMBER_MODE_ANNOTATION), "value": self.mode()},
        ]))
        .map_err(kube::Error::SerdeError)?;
        match self.bounded(self.api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))).await {
            Ok(lease) if member_left(&lease) => self.unmark_left(&name).await,
            Ok(lease) => Ok(Renewal::Renewed(lease.resource_version().unwrap_or_default())),
            Err(kube::Error::Api(s)) if s.code == 404 => self.create(now).await,
            // The test failed: the Lease carries another nonce (or none).
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => self.take_over_if_gone(other, now).await,
            Err(e) => Err(e),
        }
    }

    /// The Lease of this live process says it left (marked by hand): the mark is taken off
    /// again, so the coordinator keeps judging this member by its renewals.
    async fn unmark_left(&self, name: &str) -> Result<Renewal, kube::Error> {
        warn!(lease = %name, "The member Lease of this running process was marked as left by someone else; removing the mark");
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": nonce_path(), "value": self.nonce},
            {"op": "remove", "path": annotation_path(MEMBER_LEFT_ANNOTATION)},
        ]))
        .map_err(kube::Error::SerdeError)?;
        let lease = self.bounded(self.api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))).await?;
        Ok(Renewal::Renewed(lease.resource_version().unwrap_or_default()))
    }

    async fn create(&self, now: Timestamp) -> Result<Renewal, kube::Error> {
        let namespace = self.api.namespace().unwrap_or_default().to_owned();
        let mut lease = new_member(&self.identity, &namespace, self.timing.lease_secs(), now);
        lease.annotations_mut().insert(MEMBER_NONCE_ANNOTATION.to_owned(), self.nonce.clone());
        lease.annotations_mut().insert(MEMBER_MODE_ANNOTATION.to_owned(), self.mode().to_owned());
        match self.bounded(self.api.create(&PostParams::default(), &lease)).await {
            Ok(created) => {
                info!(lease = %created.name_any(), "Created member Lease");
                Ok(Renewal::Renewed(created.resource_version().unwrap_or_default()))
            }
            // Created by another process meanwhile.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Renewal::HeldByAnother),
            Err(e) => Err(e),
        }
    }

    /// The Lease carries another process's nonce: take it over (resourceVersion
    /// precondition) once it has not changed for a lease duration, as this process observed
    /// it; until then it belongs to a live process.
    async fn take_over_if_gone(&self, other: &mut Liveness, now: Timestamp) -> Result<Renewal, kube::Error> {
        let Some(mut lease) = self.bounded(self.api.get_opt(&member_lease_name(&self.identity))).await? else {
            return self.create(now).await;
        };
        // A process that left released its shards before it marked the Lease: nothing to wait for.
        if !member_left(&lease) {
            other.record(&self.identity, Some(&member_version(&lease)), Instant::now());
            if other.is_alive(&self.identity, Instant::now()) {
                return Ok(Renewal::HeldByAnother);
            }
        }
        let predecessor = lease.annotations().get(MEMBER_NONCE_ANNOTATION).cloned().unwrap_or_default();
        lease.annotations_mut().remove(MEMBER_LEFT_ANNOTATION);
        lease.annotations_mut().insert(MEMBER_NONCE_ANNOTATION.to_owned(), self.nonce.clone());
        lease.annotations_mut().insert(MEMBER_MODE_ANNOTATION.to_owned(), self.mode().to_owned());
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(self.identity.clone());
        spec.renew_time = Some(MicroTime(now));
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(self.timing.lease_secs());
        lease.metadata.managed_fields = None;
        match self.bounded(self.api.replace(&lease.name_any(), &PostParams::default(), &lease)).await {
            Ok(replaced) => {
                self.predecessors.add(&predecessor);
                info!(lease = %replaced.name_any(), "Took over the member Lease of a process that is gone");
                Ok(Renewal::Renewed(replaced.resource_version().unwrap_or_default()))
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Renewal::HeldByAnother),
            Err(e) => Err(e),
        }
    }

    /// Marks the member Lease as left, if this process wrote its latest version: the coordinator
    /// then reassigns this replica's shards at once, and deletes the Lease a lease duration later.
    /// The Lease is not deleted here: a coordinator that first looks at the Leases after a
    /// delete would not know this replica left, and would wait a lease duration for it.
    async fn leave(&self, version: Option<String>) {
        if version.is_none() {
            return;
        }
        let patch: Result<json_patch::Patch, _> = serde_json::from_value(json!([
            {"op": "test", "path": nonce_path(), "value": self.nonce},
            {"op": "add", "path": annotation_path(MEMBER_LEFT_ANNOTATION), "value": self.nonce},
        ]));
        let Ok(patch) = patch else { return };
        let name = member_lease_name(&self.identity);
        match self.bounded(self.api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))).await {
            Ok(_) => info!(lease = %name, "Marked the member Lease as left"),
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 || s.code == 404 => {
                info!("Member Lease was written by another process since; left in place");
            }
            Err(error) => warn!(error = &error as &dyn std::error::Error, "Failed to mark the member Lease as left"),
        }
    }
}

impl Member {
    async fn bounded<T>(&self, request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
        crate::kcp::bounded(self.timing.kcp_request_timeout, request).await
    }
}

/// JSON pointer of the nonce annotation.
fn nonce_path() -> String {
    annotation_path(MEMBER_NONCE_ANNOTATION)
}

/// JSON pointer of an annotation (`~` escaped as `~0`, `/` as `~1`).
fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nonce_path_escapes_the_annotation_key() {
        assert_eq!(nonce_path(), "/metadata/annotations/catalogsync.kyma-project.io~1process-nonce");
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(new_nonce(), new_nonce());
        assert_eq!(new_nonce().len(), 16);
    }
}
