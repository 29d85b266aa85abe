//! The coordinator: one replica, elected through a Lease (`kube-leader-election`), keeps
//! every shard Lease's desired holder equal to the consistent-hash assignment over the live
//! members, and releases shards whose holder's member Lease expired. It resumes from the
//! Leases alone: a new coordinator computes the same assignment and moves nothing that is
//! well placed. What to write is decided by the pure [`updates`]; this module observes the
//! Leases, confirms each forced takeover with a fresh read, and writes.
//!
//! Liveness is judged by [`Liveness`]: by when this replica observed member Leases change, on
//! its own monotonic clock, never by comparing another node's wall clock with its own. For a
//! member counts as dead before this replica observed it for a lease duration, and for a lease
//! duration after a lapse of its own member Lease it moves no held shard: its cache may not
//! hold the others' renewals yet (after a KCP outage, say), so it only assigns shards nobody
//! holds. It observes whether it leads or not, so a replica elected after the coordinator
//! died already knows who renewed lately. A shard Lease that was deleted and
//! recreated (by hand) is not assigned before the drain timeout plus the SKR request timeout
//! have passed, so whatever its old holder still had in flight has ended.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use kube_leader_election::{LeaseLock, LeaseLockResult};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::member_lease_name;
use crate::metrics::ShardMetrics;
use crate::sharding::handover::LeaseState;
use crate::sharding::lease::{self, is_member, is_shard, new_shard, released, shard_number, with_desired};
use crate::sharding::liveness::Liveness;
use crate::sharding::placement::{Assignment, Observation, updates};
use crate::sharding::{ShardView, Timing};

/// The shard Leases among `all` of shards below `shards`, by shard number (Leases of higher
/// numbers are left over from a larger shard count and are not touched).
fn shard_leases(all: &[Arc<Lease>], shards: u32) -> BTreeMap<u32, Arc<Lease>> {
    all.iter()
        .filter(|l| is_shard(l))
        .filter_map(|l| Some((shard_number(l)?, Arc::clone(l))))
        .filter(|(n, _)| *n < shards)
        .collect()
}

/// The coordinator's inputs.
pub struct Coordinator {
    /// Election lock.
    pub lock: LeaseLock,
    /// Lease API in the lease namespace.
    pub api: Api<Lease>,
    /// Lease cache.
    pub leases: Store<Lease>,
    /// Ownership gate (for the shard mapping).
    pub view: ShardView,
    /// Timings.
    pub timing: Timing,
    /// Metrics.
    pub metrics: ShardMetrics,
    /// Where the coordinator publishes whether it leads and which shards it sees without a live
    /// holder: read by the shard agent (`/debug/shards`) and, at scrape time, by the coordinator
    /// gauges.
    pub published: watch::Sender<CoordinatorView>,
}

/// What the coordinator of this replica last saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorView {
    /// Whether this replica leads.
    pub leading: bool,
    /// While it leads, the shards without a live holder, each with the instant it was first
    /// seen without one (empty while it does not lead).
    pub unowned_since: BTreeMap<u32, Instant>,
}

/// The member Leases marked as left at least `after` before `now`, each with the
/// resourceVersion seen: the ones to delete.
fn left_to_delete(
    left_since: &BTreeMap<String, (Instant, String)>,
    now: Instant,
    after: std::time::Duration,
) -> Vec<(String, String)> {
    left_since
        .iter()
        .filter(|(_, (since, _))| now.saturating_duration_since(*since) >= after)
        .map(|(name, (_, version))| (name.clone(), version.clone()))
        .collect()
}

/// What the coordinator loop observes of the Leases, whether it leads or not, so that a
/// replica elected coordinator already knows which members renewed lately. Started afresh
/// when the replica starts and after a lapse of its own member Lease (its cache may have
/// missed changes meanwhile).
struct Observed {
    /// Observed member Lease changes.
    liveness: Liveness,
    /// Until when no held shard is moved: a lease duration after a lapse of this replica's
    /// member Lease (its cache may be stale); at start, when the cache comes from a fresh
    /// list, at once.
    settling_until: Instant,
    /// The UID of each shard Lease as first seen, and until when a shard Lease recreated
    /// meanwhile is left unassigned.
    shard_uids: BTreeMap<u32, String>,
    cooling_until: BTreeMap<u32, Instant>,
    /// Member Leases marked as left: since when, and the resourceVersion last seen.
    left_since: BTreeMap<String, (Instant, String)>,
}

impl Observed {
    /// Starts observing; held shards move only after `settle`.
    fn new(timing: Timing, settle: std::time::Duration) -> Self {
        Self {
            liveness: Liveness::new(timing.lease_duration),
            settling_until: Instant::now() + settle,
            shard_uids: BTreeMap::new(),
            cooling_until: BTreeMap::new(),
            left_since: BTreeMap::new(),
        }
    }

    /// Notes the UID of each shard Lease; one that changed (deleted and recreated) cools down
    /// for `cool` before it may be assigned.
    fn note_shard_uids(&mut self, shard_leases: &BTreeMap<u32, Arc<Lease>>, now: Instant, cool: std::time::Duration) {
        for (shard, l) in shard_leases {
            let uid = l.uid().unwrap_or_default();
            match self.shard_uids.insert(*shard, uid.clone()) {
                Some(before) if before != uid => {
                    warn!(
                        shard,
                        "Shard Lease was recreated; leaving it unassigned while its old holder's requests end"
                    );
                    self.cooling_until.insert(*shard, now + cool);
                }
                _ => {}
            }
        }
        self.cooling_until.retain(|_, until| now < *until);
    }
}

impl Coordinator {
    /// Campaigns and coordinates until `token` is cancelled, then steps down if leading.
    pub async fn run(self, mut changed: watch::Receiver<()>, token: CancellationToken) {
        let mut leading_until: Option<Instant> = None;
        let mut next_renew = Instant::now();
        let mut observed = Observed::new(self.timing, std::time::Duration::ZERO);
        let mut lapses = self.view.lapses();
        loop {
            // A fenced replica does not campaign: its view of the KCP may be stale, and a
            // second process with its identity must not lead.
            if Instant::now() >= next_renew && !self.view.is_fenced() {
                let sent = Instant::now();
                next_renew = sent + self.timing.retry_period;
                let renewal = tokio::time::timeout(self.timing.kcp_request_timeout, self.lock.try_acquire_or_renew());
                match renewal.await.unwrap_or_else(|_| {
                    Err(kube_leader_election::Error::RenewLease(crate::kcp::timed_out(self.timing.kcp_request_timeout)))
                }) {
                    Ok(LeaseLockResult::Acquired(_)) => {
                        if leading_until.is_none() {
                            info!("Became coordinator");
                        }
                        leading_until = Some(sent + self.timing.renew_deadline);
                    }
                    Ok(LeaseLockResult::NotAcquired(_)) => {
                        if leading_until.take().is_some() {
                            info!("No longer coordinator");
                        }
                    }
                    Err(error) => warn!(error = &error as &dyn std::error::Error, "Failed to renew coordinator Lease"),
                }
            }
            // Like the member Lease: leadership not renewed within the renew deadline is lost,
            // and so is everything learned while this replica was fenced.
            let leading = leading_until.is_some_and(|until| Instant::now() < until) && !self.view.is_fenced();
            if self.view.lapses() != lapses {
                lapses = self.view.lapses();
                info!("Member Lease lapsed: observing the other members anew before moving any held shard");
                observed = Observed::new(self.timing, self.timing.lease_duration);
            }
            let all = self.observe(&mut observed);
            self.publish_leading(leading);
            if leading {
                self.pass(&all, &mut observed).await;
            } else {
                self.published.send_if_modified(|v| !std::mem::take(&mut v.unowned_since).is_empty());
            }
            let wait = next_renew.saturating_duration_since(Instant::now()).max(std::time::Duration::from_millis(10));
            tokio::select! {
                r = changed.changed() => if r.is_err() { break },
                () = tokio::time::sleep(wait) => {}
                () = token.cancelled() => break,
            }
        }
        if leading_until.is_some() {
            let step_down = tokio::time::timeout(self.timing.kcp_request_timeout, self.lock.step_down());
            match step_down.await.unwrap_or_else(|_| {
                Err(kube_leader_election::Error::RenewLease(crate::kcp::timed_out(self.timing.kcp_request_timeout)))
            }) {
                Ok(()) => info!("Stepped down as coordinator"),
                Err(error) => warn!(error = &error as &dyn std::error::Error, "Failed to step down as coordinator"),
            }
        }
        self.publish_leading(false);
        self.published.send_if_modified(|v| !std::mem::take(&mut v.unowned_since).is_empty());
    }

    fn publish_leading(&self, leading: bool) {
        self.published.send_if_modified(|v| std::mem::replace(&mut v.leading, leading) != leading);
    }

    /// Records what the Lease cache shows now; returns the cached Leases.
    fn observe(&self, observed: &mut Observed) -> Vec<Arc<Lease>> {
        let clock = Instant::now();
        let all = self.leases.state();
        // A process marks its Lease as left only after it released its shards. A Lease marked
        // while its member still holds a shard (by hand, say, while the process lives) is not
        // believed: that member is judged by its renewals like any other, so its shards move
        // only once it is gone, never to a second writer while it still writes.
        let holding: BTreeSet<String> =
            all.iter().filter(|l| is_shard(l)).map(|l| lease::state(l).holder).filter(|h| !h.is_empty()).collect();
        let left_clean =
            |l: &Arc<Lease>| lease::member_left(l) && !lease::member_identity(l).is_some_and(|id| holding.contains(id));
        let (left, present): (Vec<&Arc<Lease>>, Vec<&Arc<Lease>>) =
            all.iter().filter(|l| is_member(l)).partition(|l| left_clean(l));
        observed.liveness.observe(
            present.iter().filter_map(|l| Some((lease::member_identity(l)?, lease::member_version(l)))),
            clock,
        );
        for identity in left.iter().filter_map(|l| lease::member_identity(l)) {
            observed.liveness.left(identity);
        }
        let left_now: BTreeMap<String, String> =
            left.iter().map(|l| (l.name_any(), l.resource_version().unwrap_or_default())).collect();
        observed.left_since.retain(|name, _| left_now.contains_key(name));
        for (name, version) in left_now {
            let entry = observed.left_since.entry(name).or_insert((clock, String::new()));
            entry.1 = version;
        }
        let shard_leases = shard_leases(&all, self.view.shards());
        observed.note_shard_uids(&shard_leases, clock, self.timing.drain_timeout + self.timing.request_timeout);
        all
    }

    /// One coordination pass over the cached Leases: [`updates`] decides, this writes.
    async fn pass(&self, all: &[Arc<Lease>], observed: &mut Observed) {
        let now = Timestamp::now();
        let clock = Instant::now();
        let live = observed.liveness.live(clock);
        self.metrics.live_members(live.len());
        let shard_leases = shard_leases(all, self.view.shards());
        let states: BTreeMap<u32, LeaseState> = shard_leases.iter().map(|(s, l)| (*s, lease::state(l))).collect();
        let cooling: BTreeSet<u32> = observed.cooling_until.keys().copied().collect();
        let plan = updates(
            &Observation {
                shards: self.view.shards(),
                leases: &states,
                live: &live,
                settling_until: observed.settling_until,
                cooling: &cooling,
            },
            clock,
        );
        for shard in plan.create {
            let ns = self.api.namespace().unwrap_or_default().to_owned();
            let (params, lease) = (PostParams::default(), new_shard(shard, &ns));
            match crate::kcp::bounded(self.timing.kcp_request_timeout, self.api.create(&params, &lease)).await {
                Ok(_) => info!(shard, "Created shard Lease"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(error) => warn!(shard, error = &error as &dyn std::error::Error, "Failed to create shard Lease"),
            }
        }
        if live.is_empty() {
            return;
        }
        for update in plan.leases {
            let Some(l) = shard_leases.get(&update.shard) else { continue };
            let shard = update.shard;
            // A forced takeover needs a fresh read of the holder's member Lease (the cache may
            // lag). A read earlier in this pass may already have shown that holder alive.
            let force = match &update.release {
                Some(holder) => {
                    !observed.liveness.is_alive(holder, clock)
                        && self.confirmed_dead(holder, &mut observed.liveness).await
                }
                None => false,
            };
            if update.assign.is_none() && !force {
                continue;
            }
            let mut next = match &update.assign {
                Some(assignment) => with_desired(l, &assignment.to, now),
                None => (**l).clone(),
            };
            if force {
                next = released(&next, now);
            }
            match lease::write(&self.api, &next, self.timing.kcp_request_timeout).await {
                Ok(_) => {
                    if let Some(Assignment { from, to }) = &update.assign {
                        self.metrics.assigned();
                        info!(shard, from = %from, to = %to, "Assigned shard");
                    }
                    if let (true, Some(holder)) = (force, &update.release) {
                        self.metrics.forced_takeover();
                        warn!(shard, holder = %holder, "Released shard of a replica whose member Lease expired");
                    }
                }
                Err(error) => warn!(shard, error = &error as &dyn std::error::Error, "Failed to update shard Lease"),
            }
        }
        self.record_unowned(&shard_leases, &live);
        self.delete_left(observed, clock).await;
    }

    /// Deletes the member Leases that have been marked as left for a lease duration: every
    /// replica's coordinator loop has seen them by then. Each delete applies only to the
    /// version seen, so a Lease taken over meanwhile by a new process of that identity stays.
    async fn delete_left(&self, observed: &mut Observed, now: Instant) {
        for (name, version) in left_to_delete(&observed.left_since, now, self.timing.lease_duration) {
            let params = DeleteParams {
                preconditions: Some(Preconditions { resource_version: Some(version), uid: None }),
                ..DeleteParams::default()
            };
            match crate::kcp::bounded(self.timing.kcp_request_timeout, self.api.delete(&name, &params)).await {
                Ok(_) => info!(lease = %name, "Deleted the member Lease of a replica that left"),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(error) => {
                    warn!(lease = %name, error = &error as &dyn std::error::Error, "Failed to delete a member Lease");
                    continue;
                }
            }
            observed.left_since.remove(&name);
        }
    }

    /// Re-reads a holder's member Lease before its shards are taken (the cache may lag):
    /// dead only if the read shows no change since the last one observed, for a lease
    /// duration.
    async fn confirmed_dead(&self, holder: &str, liveness: &mut Liveness) -> bool {
        match crate::kcp::bounded(self.timing.kcp_request_timeout, self.api.get_opt(&member_lease_name(holder))).await {
            Ok(member) => {
                match &member {
                    Some(m) if lease::member_left(m) => liveness.left(holder),
                    _ => liveness.record(holder, member.as_ref().map(lease::member_version).as_deref(), Instant::now()),
                }
                !liveness.is_alive(holder, Instant::now())
            }
            Err(error) => {
                warn!(holder, error = &error as &dyn std::error::Error, "Failed to confirm that a holder is gone");
                false
            }
        }
    }

    /// Publishes the shards without a live holder, each keeping the instant it was first seen
    /// so.
    fn record_unowned(&self, shard_leases: &BTreeMap<u32, Arc<Lease>>, live: &[String]) {
        let now = Instant::now();
        let unowned: BTreeSet<u32> = (0..self.view.shards())
            .filter(|s| shard_leases.get(s).is_none_or(|l| !live.contains(&lease::state(l).holder)))
            .collect();
        self.published.send_if_modified(|v| {
            let before = v.unowned_since.clone();
            v.unowned_since.retain(|s, _| unowned.contains(s));
            for s in &unowned {
                v.unowned_since.entry(*s).or_insert(now);
            }
            v.unowned_since != before
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_left_member_lease_is_deleted_a_lease_duration_after_it_was_first_seen_left() {
        let lease_duration = Duration::from_secs(15);
        let first = Instant::now();
        let left: BTreeMap<String, (Instant, String)> = [
            ("catalogsync-member-a".to_owned(), (first, "7".to_owned())),
            ("catalogsync-member-b".to_owned(), (first + Duration::from_secs(10), "9".to_owned())),
        ]
        .into();
        assert!(left_to_delete(&left, first + Duration::from_secs(14), lease_duration).is_empty());
        assert_eq!(
            left_to_delete(&left, first + lease_duration, lease_duration),
            [("catalogsync-member-a".to_owned(), "7".to_owned())],
            "the version seen goes with it, as the delete's precondition"
        );
        assert_eq!(left_to_delete(&left, first + Duration::from_secs(30), lease_duration).len(), 2);
    }
}
