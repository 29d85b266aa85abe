//! The shard agent: applies the [`handover`](crate::sharding::handover) rules to every shard
//! Lease: claims shards the coordinator assigned here, drains and releases shards assigned
//! elsewhere, drops shards taken away, and on shutdown releases everything it holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::Kyma;
use crate::metrics::{HandoverOp, Metrics};
use crate::sharding::handover::{Action, Facts, Local, decide};
use crate::sharding::lease::{self, claimed, handover_started, holder_nonce, is_shard, released, shard_number};
use crate::sharding::{ShardView, Timing};

/// What the rest of the replica does when a shard changes hands here. Owned by `sharding`,
/// implemented by the sync layer (`sync::handoff`), so the agent knows nothing of syncs.
pub trait ShardWork: Send + Sync {
    /// `shard` was taken; its Kymas are `kymas`. Called before they are requeued.
    fn taken<'a>(&'a self, shard: u32, kymas: &'a [ObjectRef<Kyma>]) -> BoxFuture<'a, ()>;
    /// `shard` is about to be released: no sync of it runs any more. `complete`: the Kyma
    /// cache has finished its first list, so a Kyma missing from `kymas` is gone.
    fn leaving<'a>(&'a self, shard: u32, kymas: &'a [ObjectRef<Kyma>], complete: bool) -> BoxFuture<'a, ()>;
    /// A shard holding `kymas` was given up (released, or taken away).
    fn released(&self, kymas: &[ObjectRef<Kyma>]);
}

crate::label_enum! {
    /// What this replica does with a shard, as `/debug/shards` shows it.
    #[derive(Serialize)]
    #[serde(rename_all = "lowercase")]
    pub enum ShardState {
        /// Not held here.
        Idle => "idle",
        /// Held and worked on.
        Active => "active",
        /// Assigned elsewhere; in-flight syncs are ending.
        Draining => "draining",
        /// Offered here; waiting before the first write.
        Pending => "pending",
    }
}

/// One row of the shard view served at `/debug/shards`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ShardRow {
    /// Shard number.
    pub shard: u32,
    /// Holder in the Lease.
    pub holder: String,
    /// Desired holder set by the coordinator.
    pub desired: String,
    /// This replica's state: idle, active, draining or pending.
    pub state: ShardState,
    /// Since when the shard drains, while it does (not served).
    #[serde(skip)]
    pub draining_since: Option<Instant>,
    /// Syncs in flight here.
    pub in_flight: usize,
    /// Kymas in the shard.
    pub clusters: usize,
}

/// The shard view of one replica.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct ShardsDebug {
    /// Replica identity.
    pub identity: String,
    /// Whether this replica is the coordinator.
    pub is_coordinator: bool,
    /// Whether SKR writes are fenced.
    pub fenced: bool,
    /// Number of shards.
    pub shards: u32,
    /// Per shard.
    pub rows: Vec<ShardRow>,
}

/// The agent's inputs and state.
pub struct Agent {
    /// Lease API in the lease namespace.
    pub api: Api<Lease>,
    /// This replica.
    pub identity: String,
    /// This process's nonce, written into the shard Leases it claims.
    pub nonce: String,
    /// Earlier processes of this identity, gone for a lease duration: their shard Leases are
    /// clean for this one.
    pub predecessors: crate::sharding::membership::Predecessors,
    /// Ownership gate.
    pub view: ShardView,
    /// Timings.
    pub timing: Timing,
    /// Lease cache.
    pub leases: Store<Lease>,
    /// Kyma cache.
    pub kymas: Store<Kyma>,
    /// Where Kymas of a claimed shard are requeued.
    pub requeue: mpsc::Sender<ObjectRef<Kyma>>,
    /// What the replica does with the Kymas of a shard taken, leaving and given up.
    pub work: Arc<dyn ShardWork>,
    /// Metrics; the per-shard series of a shard are created when it is taken and removed
    /// when it leaves.
    pub metrics: Metrics,
    /// Published shard view.
    pub debug: watch::Sender<ShardsDebug>,
    /// What the coordinator of this replica publishes (whether it leads, for the view).
    pub coordinator: watch::Receiver<crate::sharding::coordinator::CoordinatorView>,
    /// Beaten every round and before every Lease write.
    pub heartbeat: crate::health::Heartbeat,
}

struct Written {
    /// resourceVersion of the Lease the write replaced.
    base: String,
    lease: Lease,
}

impl Agent {
    /// Runs until `token` is cancelled, then releases every shard it holds and cancels
    /// `released`.
    pub async fn run(self, mut changed: watch::Receiver<()>, token: CancellationToken, released: CancellationToken) {
        let shards = self.view.shards() as usize;
        let mut local = vec![Local::Idle; shards];
        let mut written: HashMap<u32, Written> = HashMap::new();
        let mut uids: HashMap<u32, String> = HashMap::new();
        // A shard is taken with its Kymas (requeued, and handed what the last holder kept of
        // their SKRs), so not before the Kyma cache holds them.
        let filled = tokio::time::timeout(self.timing.lease_duration, crate::kcp::until_ready(&self.kymas));
        tokio::select! {
            r = filled => if r.is_err() { warn!("Kyma cache not filled within a lease duration; taking shards anyway") },
            () = token.cancelled() => {}
        }
        // Stopped before the Kyma cache filled: take nothing (a shard taken now would be
        // given up at once with an empty list of Kymas).
        while !token.is_cancelled() {
            self.tick(&mut local, &mut written, &mut uids).await;
            // A sync ending matters only to a drain; otherwise thousands of syncs would each
            // cost a pass over every shard and Kyma.
            let draining = local.iter().any(|l| matches!(l, Local::Draining(_)));
            tokio::select! {
                r = changed.changed() => if r.is_err() { break },
                () = self.view.sync_ended(), if draining => {}
                () = tokio::time::sleep(self.timing.retry_period) => {}
                () = token.cancelled() => break,
            }
        }
        self.release_all(&mut local, &mut written).await;
        released.cancel();
    }

    /// The freshest known Lease of each shard: the cache, or what this replica wrote when the
    /// cache has not caught up with it yet.
    fn current(&self, written: &mut HashMap<u32, Written>) -> BTreeMap<u32, Lease> {
        let mut out: BTreeMap<u32, Lease> = self
            .leases
            .state()
            .iter()
            .filter(|l| is_shard(l))
            .filter_map(|l| Some((shard_number(l)?, (**l).clone())))
            .collect();
        written.retain(|shard, w| match out.get(shard) {
            Some(cached) if cached.resource_version().as_deref() == Some(w.base.as_str()) => {
                out.insert(*shard, w.lease.clone());
                true
            }
            _ => false,
        });
        out
    }

    async fn tick(&self, local: &mut [Local], written: &mut HashMap<u32, Written>, uids: &mut HashMap<u32, String>) {
        // A lapse (fenced, then renewed before this tick) counts as fenced for this tick.
        let fenced = self.view.take_lapse() || self.view.is_fenced() || self.view.is_stopping();
        if fenced {
            // What this replica wrote may have been overwritten while it could not see it.
            written.clear();
        }
        let leases = self.current(written);
        let now = Instant::now();
        for shard in 0..self.view.shards() {
            self.heartbeat.beat();
            let idx = shard as usize;
            let Some(lease) = leases.get(&shard) else {
                if local[idx] != Local::Idle {
                    self.drop_shard(shard, local, HandoverOp::Dropped);
                }
                continue;
            };
            // A shard Lease replaced since this replica claimed it (deleted and recreated by
            // hand) is not the one it holds, whatever it says.
            let held = matches!(local[idx], Local::Active | Local::Draining(_));
            if held && uids.get(&shard).is_some_and(|uid| lease.uid().as_deref() != Some(uid.as_str())) {
                warn!(shard, "Shard Lease was replaced since it was claimed; stopped working on the shard");
                self.drop_shard(shard, local, HandoverOp::Dropped);
                continue;
            }
            let st = lease::state(lease);
            let clean = match st.holder.as_str() {
                "" => holder_nonce(lease).is_empty(),
                holder if holder == self.identity => {
                    holder_nonce(lease) == self.nonce || self.predecessors.contains(holder_nonce(lease))
                }
                _ => false,
            };
            let facts = Facts {
                me: &self.identity,
                now,
                fenced,
                in_flight: self.view.in_flight(shard),
                drain_timeout: self.timing.drain_timeout,
                writes_settled: self.writes_settled(shard),
                clean,
                settle: self.timing.drain_timeout + self.timing.request_timeout,
            };
            match decide(&st, local[idx], facts) {
                Action::None => {}
                Action::Wait => {
                    local[idx] = Local::Pending(now);
                    info!(
                        shard,
                        settle_seconds = facts.settle.as_secs_f64(),
                        "Shard offered by a Lease another process may have written last; waiting before the first write"
                    );
                }
                Action::Forget => local[idx] = Local::Idle,
                Action::Claim => {
                    let next = claimed(lease, &self.identity, &self.nonce, Timestamp::now());
                    match self.write(shard, lease, next, written, uids).await {
                        Ok(()) => {
                            if let Some(started) = handover_started(lease) {
                                let secs = Timestamp::now().duration_since(started).as_secs_f64();
                                self.metrics.shard.handover_took(secs);
                            }
                            self.activate(shard, local, HandoverOp::Claimed).await;
                        }
                        Err(error) => {
                            debug!(shard, error = &error as &dyn std::error::Error, "Lost the race to claim a shard")
                        }
                    }
                }
                Action::Resume => {
                    // Confirm with a write: the cache may be stale (after a fence).
                    let next = claimed(lease, &self.identity, &self.nonce, Timestamp::now());
                    match self.write(shard, lease, next, written, uids).await {
                        Ok(()) => self.activate(shard, local, HandoverOp::Resumed).await,
                        Err(error) => {
                            debug!(shard, error = &error as &dyn std::error::Error, "Could not resume a shard")
                        }
                    }
                }
                Action::StartDrain => {
                    self.view.set_active(shard, false);
                    local[idx] = Local::Draining(now);
                    self.metrics.shard_handover(shard, HandoverOp::Drained);
                    info!(shard, in_flight = facts.in_flight, "Draining shard");
                }
                Action::Release => {
                    // Drained: no sync of the shard runs any more.
                    self.work.leaving(shard, &self.kymas_of(shard), self.kymas_complete()).await;
                    let next = released(lease, Timestamp::now());
                    match self.write(shard, lease, next, written, uids).await {
                        Ok(()) => self.drop_shard(shard, local, HandoverOp::Released),
                        Err(error) => warn!(shard, error = &error as &dyn std::error::Error, "Failed to release shard"),
                    }
                }
                Action::Drop => self.drop_shard(shard, local, HandoverOp::Dropped),
            }
        }
        self.publish(&leases, local);
    }

    async fn write(
        &self,
        shard: u32,
        base: &Lease,
        next: Lease,
        written: &mut HashMap<u32, Written>,
        uids: &mut HashMap<u32, String>,
    ) -> Result<(), kube::Error> {
        let result = lease::write(&self.api, &next, self.timing.kcp_request_timeout).await?;
        uids.insert(shard, result.uid().unwrap_or_default());
        written.insert(shard, Written { base: base.resource_version().unwrap_or_default(), lease: result });
        Ok(())
    }

    async fn activate(&self, shard: u32, local: &mut [Local], op: HandoverOp) {
        local[shard as usize] = Local::Active;
        self.view.set_active(shard, true);
        self.metrics.shard_handover(shard, op);
        let kymas = self.kymas_of(shard);
        self.work.taken(shard, &kymas).await;
        info!(shard, clusters = kymas.len(), op = op.as_str(), "Took over shard");
        // Sync every SKR of the shard now: a previous holder may have been interrupted.
        for kyma in kymas {
            if self.requeue.send(kyma).await.is_err() {
                break;
            }
        }
    }

    /// Whether the last SKR write of `shard` allowed here was allowed at least the request
    /// timeout ago (or none was).
    fn writes_settled(&self, shard: u32) -> bool {
        self.view.since_last_write(shard).is_none_or(|since| since >= self.timing.request_timeout)
    }

    fn drop_shard(&self, shard: u32, local: &mut [Local], op: HandoverOp) {
        local[shard as usize] = Local::Idle;
        self.view.set_active(shard, false);
        // Counts the change and removes the shard's series here (`Metrics::shard_left`).
        self.metrics.shard_handover(shard, op);
        self.work.released(&self.kymas_of(shard));
        info!(shard, op = op.as_str(), "Gave up shard");
    }

    /// Whether the Kyma cache has finished its first list, so that a Kyma it lacks is gone.
    fn kymas_complete(&self) -> bool {
        self.kymas.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
    }

    fn kymas_of(&self, shard: u32) -> Vec<ObjectRef<Kyma>> {
        self.kymas.state().iter().filter(|k| self.shard_of(k) == shard).map(|k| ObjectRef::from_obj(&**k)).collect()
    }

    fn shard_of(&self, kyma: &Kyma) -> u32 {
        let meta = &kyma.metadata;
        self.view.shard_of(meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
    }

    fn publish(&self, leases: &BTreeMap<u32, Lease>, local: &[Local]) {
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        for k in self.kymas.state() {
            *counts.entry(self.shard_of(&k)).or_default() += 1;
        }
        let rows = (0..self.view.shards())
            .map(|shard| {
                let st = leases.get(&shard).map(lease::state).unwrap_or_default();
                let clusters = counts.get(&shard).copied().unwrap_or(0);
                let (state, draining_since) = match local[shard as usize] {
                    Local::Idle => (ShardState::Idle, None),
                    Local::Active => (ShardState::Active, None),
                    Local::Draining(since) => (ShardState::Draining, Some(since)),
                    Local::Pending(_) => (ShardState::Pending, None),
                };
                ShardRow {
                    shard,
                    holder: st.holder,
                    desired: st.desired,
                    state,
                    draining_since,
                    in_flight: self.view.in_flight(shard),
                    clusters,
                }
            })
            .collect();
        // The gauges of held shards, their clusters and the oldest drain are computed from
        // this view at scrape time (`metrics::shards`).
        self.debug.send_replace(ShardsDebug {
            identity: self.identity.clone(),
            is_coordinator: self.coordinator.borrow().leading,
            fenced: self.view.is_fenced(),
            shards: self.view.shards(),
            rows,
        });
    }

    async fn release_all(&self, local: &mut [Local], written: &mut HashMap<u32, Written>) {
        self.view.stop();
        // Like a drain: no new SKR write starts after `stop`; give the running syncs up to the
        // drain timeout to end before another replica may claim their shards.
        let drained = async {
            while (0..self.view.shards()).any(|s| self.view.in_flight(s) > 0) {
                tokio::select! {
                    () = self.view.sync_ended() => {}
                    () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                }
            }
        };
        if tokio::time::timeout(self.timing.drain_timeout, drained).await.is_err() {
            warn!("Syncs still running at the drain timeout; releasing shards anyway");
        }
        // A write sent last may still land until the request timeout after it was allowed.
        let last = (0..self.view.shards()).filter_map(|s| self.view.since_last_write(s)).min();
        if let Some(wait) = last.map(|since| self.timing.request_timeout.saturating_sub(since)) {
            tokio::time::sleep(wait).await;
        }
        let leases = self.current(written);
        let held: Vec<(u32, &Lease)> = (0..self.view.shards())
            .filter(|&shard| matches!(local[shard as usize], Local::Active | Local::Draining(_)))
            .filter_map(|shard| Some((shard, leases.get(&shard)?)))
            .filter(|(_, lease)| lease::state(lease).holder == self.identity)
            .collect();
        let kymas: Vec<_> = held.iter().map(|(shard, _)| (*shard, self.kymas_of(*shard))).collect();
        let complete = self.kymas_complete();
        futures::future::join_all(kymas.iter().map(|(shard, kymas)| self.work.leaving(*shard, kymas, complete))).await;
        for (shard, lease) in held {
            match lease::write(&self.api, &released(lease, Timestamp::now()), self.timing.kcp_request_timeout).await {
                Ok(_) => self.drop_shard(shard, local, HandoverOp::Released),
                Err(error) => {
                    warn!(shard, error = &error as &dyn std::error::Error, "Failed to release shard on shutdown")
                }
            }
        }
        info!("Released all shards");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt as _;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::api::shard_lease_name;
    use crate::sharding::lease::{new_shard, with_desired};

    /// Nothing to do with the Kymas of a shard.
    struct NoWork;

    impl ShardWork for NoWork {
        fn taken<'a>(&'a self, _: u32, _: &'a [ObjectRef<Kyma>]) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn leaving<'a>(&'a self, _: u32, _: &'a [ObjectRef<Kyma>], _: bool) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn released(&self, _: &[ObjectRef<Kyma>]) {}
    }

    const NAMESPACE: &str = "kcp-system";
    const RETRY: Duration = Duration::from_secs(2);

    /// One request the KCP saw: when, its method and its path.
    type Seen = (Instant, http::Method, String);

    /// A KCP that accepts every Lease write (echoing it with a new resourceVersion) and
    /// reports each request.
    fn kcp() -> (kube::Client, mpsc::UnboundedReceiver<Seen>) {
        let (seen, requests) = mpsc::unbounded_channel();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                let _ = seen.send((Instant::now(), request.method().clone(), request.uri().path().to_owned()));
                let body = request.into_body().collect().await?.to_bytes();
                let mut lease: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                lease["metadata"]["resourceVersion"] = "2".into();
                let response = http::Response::builder()
                    .status(200)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(kube::client::Body::from(lease.to_string().into_bytes()))
                    .expect("a response");
                Ok::<_, kube::Error>(response)
            }
        });
        (kube::Client::new(service, NAMESPACE), requests)
    }

    /// An unheld shard Lease the coordinator assigned to `desired`.
    fn offered(shard: u32, desired: &str) -> Lease {
        let mut lease = with_desired(&new_shard(shard, NAMESPACE), desired, Timestamp::now());
        lease.metadata.uid = Some(format!("uid-{shard}"));
        lease.metadata.resource_version = Some("1".to_owned());
        lease
    }

    #[tokio::test(start_paused = true)]
    async fn the_agent_acts_every_retry_period_and_at_once_on_a_lease_change() {
        let (client, mut requests) = kcp();
        let (leases, mut lease_writer) = reflector::store::<Lease>();
        let (kymas, mut kyma_writer) = reflector::store::<Kyma>();
        kyma_writer.apply_watcher_event(&Event::InitDone);
        let view = ShardView::new(2);
        view.renewed(Instant::now(), Duration::from_secs(3600));
        let timing = Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: RETRY,
            drain_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(3),
            kcp_request_timeout: Duration::from_secs(5),
        };
        let (requeue, _requeued) = mpsc::channel(16);
        let agent = Agent {
            api: Api::namespaced(client, NAMESPACE),
            identity: "a".to_owned(),
            nonce: "n-1".to_owned(),
            predecessors: crate::sharding::membership::Predecessors::default(),
            view: view.clone(),
            timing,
            leases,
            kymas,
            requeue,
            work: Arc::new(NoWork),
            metrics: Metrics::new().expect("metrics"),
            debug: watch::channel(ShardsDebug::default()).0,
            coordinator: watch::channel(crate::sharding::coordinator::CoordinatorView::default()).1,
            heartbeat: crate::health::Heartbeat::new("shard agent", Duration::from_secs(60)),
        };
        let (changed, lease_changes) = watch::channel(());
        let token = CancellationToken::new();
        let start = Instant::now();
        tokio::spawn(agent.run(lease_changes, token.clone(), CancellationToken::new()));

        // A shard offered here while the agent waits, with no Lease change announced: it is
        // claimed at the next retry period.
        tokio::task::yield_now().await;
        lease_writer.apply_watcher_event(&Event::Apply(offered(0, "a")));
        let (at, method, path) = requests.recv().await.expect("a claim");
        assert_eq!(
            (at - start, method, path.rsplit('/').next()),
            (RETRY, http::Method::PUT, Some("catalogsync-shard-0"))
        );
        assert!(path.starts_with(&format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/")), "{path}");
        assert!(view.is_active(0));

        // A Lease change mid-period: acted on at once, not at the next period.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let announced = Instant::now();
        lease_writer.apply_watcher_event(&Event::Apply(offered(1, "a")));
        changed.send_replace(());
        let (at, method, path) = requests.recv().await.expect("a claim");
        assert_eq!((at, method), (announced, http::Method::PUT));
        assert_eq!(path.rsplit('/').next(), Some(shard_lease_name(1).as_str()));
        assert!(view.is_active(1));

        // Nothing left to do: the periodic ticks write nothing.
        let more = tokio::time::timeout(RETRY * 5, requests.recv()).await;
        assert!(more.is_err(), "an unexpected request: {more:?}");
        token.cancel();
    }
}
