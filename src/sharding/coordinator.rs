//! The coordinator: one replica, elected through a Lease (`kube-leader-election`), keeps
//! every shard Lease's desired holder equal to the consistent-hash assignment over the live
//! members, and releases shards whose holder's member Lease expired. It resumes from the
//! Leases alone: a new coordinator computes the same assignment and moves nothing that is
//! well placed.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use kube_leader_election::{LeaseLock, LeaseLockResult};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{Kyma, member_lease_name};
use crate::metrics::ShardMetrics;
use crate::sharding::handover::may_force_release;
use crate::sharding::lease::{self, is_shard, live_members, new_shard, shard_number, with_desired, with_holder};
use crate::sharding::ring::assign;
use crate::sharding::{ShardView, Timing};

/// The coordinator's inputs.
pub struct Coordinator {
    /// Election lock.
    pub lock: LeaseLock,
    /// Lease API in the lease namespace.
    pub api: Api<Lease>,
    /// Lease cache.
    pub leases: Store<Lease>,
    /// Kyma cache (for the unowned-SKR figures).
    pub kymas: Store<Kyma>,
    /// Ownership gate (for the shard mapping).
    pub view: ShardView,
    /// Timings.
    pub timing: Timing,
    /// Metrics.
    pub metrics: ShardMetrics,
}

impl Coordinator {
    /// Campaigns and coordinates until `token` is cancelled, then steps down if leading.
    pub async fn run(self, mut changed: watch::Receiver<()>, token: CancellationToken) {
        let mut leading_until: Option<Instant> = None;
        let mut next_renew = Instant::now();
        let mut unowned_since: BTreeMap<u32, Instant> = BTreeMap::new();
        loop {
            if Instant::now() >= next_renew {
                let sent = Instant::now();
                next_renew = sent + self.timing.retry_period;
                match self.lock.try_acquire_or_renew().await {
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
            // Like the member Lease: leadership not renewed within the renew deadline is lost.
            let leading = leading_until.is_some_and(|until| Instant::now() < until);
            self.metrics.is_coordinator.set(i64::from(leading));
            if leading {
                self.pass(&mut unowned_since).await;
            } else {
                self.metrics.unowned_clusters.set(0);
                self.metrics.unowned_oldest.set(0.0);
                unowned_since.clear();
            }
            let wait = next_renew.saturating_duration_since(Instant::now());
            tokio::select! {
                r = changed.changed() => if r.is_err() { break },
                () = tokio::time::sleep(wait) => {}
                () = token.cancelled() => break,
            }
        }
        if leading_until.is_some() {
            match self.lock.step_down().await {
                Ok(()) => info!("Stepped down as coordinator"),
                Err(error) => warn!(error = &error as &dyn std::error::Error, "Failed to step down as coordinator"),
            }
        }
        self.metrics.is_coordinator.set(0);
    }

    /// One coordination pass over the cached Leases.
    async fn pass(&self, unowned_since: &mut BTreeMap<u32, Instant>) {
        let now = Timestamp::now();
        let all = self.leases.state();
        let live = live_members(all.iter().map(|l| &**l), now);
        self.metrics.live_members.set(live.len() as i64);
        let shard_leases: BTreeMap<u32, Arc<Lease>> =
            all.iter().filter(|l| is_shard(l)).filter_map(|l| Some((shard_number(l)?, Arc::clone(l)))).collect();
        for shard in (0..self.view.shards()).filter(|s| !shard_leases.contains_key(s)) {
            let ns = self.api.namespace().unwrap_or_default().to_owned();
            match self.api.create(&PostParams::default(), &new_shard(shard, &ns)).await {
                Ok(_) => info!(shard, "Created shard Lease"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(error) => warn!(shard, error = &error as &dyn std::error::Error, "Failed to create shard Lease"),
            }
        }
        if live.is_empty() {
            return;
        }
        let current: BTreeMap<u32, String> = shard_leases
            .iter()
            .filter_map(|(shard, l)| {
                let st = lease::state(l);
                let pick = [st.desired, st.holder].into_iter().find(|m| live.contains(m))?;
                Some((*shard, pick))
            })
            .collect();
        let target = assign(self.view.shards(), &live, &current);
        for (shard, l) in &shard_leases {
            let st = lease::state(l);
            let want = target.get(shard).cloned().unwrap_or_default();
            let reassign = st.desired != want;
            let force =
                may_force_release(&st.holder, live.contains(&st.holder)) && self.confirmed_dead(&st.holder, now).await;
            if !reassign && !force {
                continue;
            }
            let mut next = if reassign { with_desired(l, &want, now) } else { (**l).clone() };
            if force {
                next = with_holder(&next, "", now);
            }
            match lease::write(&self.api, &next).await {
                Ok(_) => {
                    if reassign {
                        self.metrics.assignments.inc();
                        info!(shard, from = %st.desired, to = %want, "Assigned shard");
                    }
                    if force {
                        self.metrics.forced_takeovers.inc();
                        warn!(shard, holder = %st.holder, "Released shard of a replica whose member Lease expired");
                    }
                }
                Err(error) => warn!(shard, error = &error as &dyn std::error::Error, "Failed to update shard Lease"),
            }
        }
        self.record_unowned(&shard_leases, &live, unowned_since);
    }

    /// Re-reads a holder's member Lease before its shards are taken: the cache may lag.
    async fn confirmed_dead(&self, holder: &str, now: Timestamp) -> bool {
        match self.api.get_opt(&member_lease_name(holder)).await {
            Ok(Some(member)) => lease::expiry(&member).is_none_or(|e| e <= now),
            Ok(None) => true,
            Err(error) => {
                warn!(holder, error = &error as &dyn std::error::Error, "Failed to confirm that a holder is gone");
                false
            }
        }
    }

    fn record_unowned(
        &self,
        shard_leases: &BTreeMap<u32, Arc<Lease>>,
        live: &[String],
        unowned_since: &mut BTreeMap<u32, Instant>,
    ) {
        let now = Instant::now();
        let unowned: Vec<u32> = (0..self.view.shards())
            .filter(|s| shard_leases.get(s).is_none_or(|l| !live.contains(&lease::state(l).holder)))
            .collect();
        unowned_since.retain(|s, _| unowned.contains(s));
        for s in &unowned {
            unowned_since.entry(*s).or_insert(now);
        }
        let clusters = self
            .kymas
            .state()
            .iter()
            .filter(|k| unowned.contains(&self.view.shard_of(&k.namespace().unwrap_or_default(), &k.name_any())))
            .count();
        self.metrics.unowned_clusters.set(clusters as i64);
        let oldest = unowned_since.values().map(|t| now.duration_since(*t).as_secs_f64()).fold(0.0, f64::max);
        self.metrics.unowned_oldest.set(oldest);
    }
}
