//! Prometheus metrics: one [`Metrics`] struct owns the registry; every label is bounded
//! (kinds, operations, results, reasons, each an enum of [`labels`] or next to what it
//! classifies), never an object name. Documented in `docs/metrics.md`, which
//! `tests/metrics_doc.rs` checks against this registry.
//!
//! Every metric is registered one way (`register`); the fields are private, and the
//! components record through methods named after what happened
//! (`metrics.sync.finished(shard, outcome)`, `metrics.skr.request(verb, &result)`,
//! `metrics.shard_handover(shard, op)`). Gauges that only restate the shard agent's state
//! are computed at scrape time by collectors that live beside the state they read and register
//! themselves on [`Metrics::registry`] (`sharding::shard_gauges`, `sharding::coordinator_gauges`,
//! `sync::kyma_gauges`): this module imports none of its users.

pub mod labels;

use std::time::Instant;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub use labels::{
    EvictionReason, HandoverOp, ObjectOp, ReachableState, RenewalResult, RequestResult, SkipReason, SkrVerb, SyncResult,
};

use crate::api::ConditionStatus;
use crate::catalog::{CatalogKind, WarningReason};
use crate::error::ConditionReason;
use crate::label::Label;

/// Buckets of the sync duration histogram: a warm no-op sync is a few milliseconds, a cold
/// sync of a large catalog a few seconds, a timeout tens of seconds.
const SYNC_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Buckets of the handover duration histogram: a graceful handover takes well under two
/// seconds, a takeover after a crash about a member lease duration.
const HANDOVER_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0];

/// Registers `metric` in `registry` and returns it: the one way every metric of this crate
/// is registered (`register(r, IntCounter::new(..))`, `register(r, IntCounterVec::new(..))`).
fn register<M: Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<M>,
) -> prometheus::Result<M> {
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// Creates the series of every value of `A` at zero.
fn precreate<T: MetricVecBuilder, A: Label>(vec: &MetricVec<T>) {
    for a in A::ALL {
        vec.with_label_values(&[a.as_str()]);
    }
}

/// Creates the series of every pair of values of `A` and `B` at zero.
fn precreate2<T: MetricVecBuilder, A: Label, B: Label>(vec: &MetricVec<T>) {
    for a in A::ALL {
        for b in B::ALL {
            vec.with_label_values(&[a.as_str(), b.as_str()]);
        }
    }
}

/// A gauge value from a count.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// All metrics of a replica.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Sync metrics.
    pub sync: SyncMetrics,
    /// SKR client metrics.
    pub skr: SkrClientMetrics,
    /// Catalog (KCP side) metrics.
    pub catalog: CatalogMetrics,
    /// Sharding metrics.
    pub shard: ShardMetrics,
}

impl Metrics {
    /// Creates and registers all metrics in a fresh registry, with the series of every
    /// known label value at zero: an alert on `rate(…{result="error"}[5m])` then sees a 0,
    /// not an absent series, and every documented metric is in `/metrics` of a fresh
    /// replica. Series labelled by shard are created when the shard is taken and removed
    /// when it leaves ([`Metrics::shard_handover`]).
    ///
    /// # Errors
    /// Fails when a metric is registered twice, a bug.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let metrics = Self {
            sync: SyncMetrics::register(&registry)?,
            skr: SkrClientMetrics::register(&registry)?,
            catalog: CatalogMetrics::register(&registry)?,
            shard: ShardMetrics::register(&registry)?,
            registry,
        };
        metrics.sync.init_known_series();
        metrics.skr.init_known_series();
        metrics.catalog.init_known_series();
        metrics.shard.init_known_series();
        Ok(metrics)
    }

    /// Counts a shard ownership change of `shard`. A shard taken (`claimed`, `resumed`) gets
    /// its per-shard series at zero; a shard that leaves (`released`, `dropped`) loses them
    /// ([`Metrics::shard_left`]).
    pub fn shard_handover(&self, shard: u32, op: HandoverOp) {
        self.shard.handover(op);
        match op {
            HandoverOp::Claimed | HandoverOp::Resumed => self.sync.shard_taken(shard),
            HandoverOp::Released | HandoverOp::Dropped => self.shard_left(shard),
            HandoverOp::Drained => {}
        }
    }

    /// Removes every series labelled with `shard`, now that this replica no longer holds it:
    /// a replica reports only the shards it works on, so a shard's series are on one replica
    /// at a time.
    pub fn shard_left(&self, shard: u32) {
        self.sync.shard_left(shard);
    }

    /// The registry, for scrape-time collectors registered by other components.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Renders every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = &error as &dyn std::error::Error, "Failed to encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// How a sync of one SKR ended, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The SKR holds the desired catalog.
    Synced,
    /// The sync failed for this reason.
    Failed(ConditionReason),
}

/// Metrics of SKR syncs.
#[derive(Clone)]
pub struct SyncMetrics {
    /// `catalogsync_sync_runs_total{shard,result}`.
    runs: IntCounterVec,
    /// `catalogsync_sync_errors_total{shard,reason}`.
    errors: IntCounterVec,
    /// `catalogsync_sync_duration_seconds{shard}`.
    duration: HistogramVec,
    /// `catalogsync_sync_objects_total{kind,op}`.
    objects: IntCounterVec,
    /// `catalogsync_syncs_in_flight`.
    in_flight: IntGauge,
    /// `catalogsync_queue_depth{shard}`.
    queue_depth: IntGaugeVec,
    /// `catalogsync_kyma_condition_writes_total{status}`.
    condition_writes: IntCounterVec,
    /// `catalogsync_kymas_skipped_total{reason}`.
    skipped: IntCounterVec,
}

impl SyncMetrics {
    /// Registers the sync metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            runs: register(
                r,
                IntCounterVec::new(
                    Opts::new("catalogsync_sync_runs_total", "Syncs of one SKR, by shard and result (success, error)."),
                    &["shard", "result"],
                ),
            )?,
            errors: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_sync_errors_total",
                        "Failed syncs, by shard and ModuleCatalog condition reason.",
                    ),
                    &["shard", "reason"],
                ),
            )?,
            duration: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "catalogsync_sync_duration_seconds",
                        "Duration of one sync of one SKR, in seconds.",
                    )
                    .buckets(SYNC_BUCKETS.to_vec()),
                    &["shard"],
                ),
            )?,
            objects: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_sync_objects_total",
                        "Catalog objects handled in SKRs, by kind and operation (applied, unchanged, pruned).",
                    ),
                    &["kind", "op"],
                ),
            )?,
            in_flight: register(r, IntGauge::new("catalogsync_syncs_in_flight", "SKR syncs running now."))?,
            queue_depth: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "catalogsync_queue_depth",
                        "Kymas requeued for a catalog change whose sync has not finished yet, by shard.",
                    ),
                    &["shard"],
                ),
            )?,
            condition_writes: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_kyma_condition_writes_total",
                        "Writes of a Kyma's ModuleCatalog condition, by condition status.",
                    ),
                    &["status"],
                ),
            )?,
            skipped: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_kymas_skipped_total",
                        "Reconciles that left a Kyma alone, by reason (deleting, skip_reconciliation).",
                    ),
                    &["reason"],
                ),
            )?,
        })
    }

    fn init_known_series(&self) {
        precreate2::<_, CatalogKind, ObjectOp>(&self.objects);
        precreate::<_, ConditionStatus>(&self.condition_writes);
        precreate::<_, SkipReason>(&self.skipped);
    }

    /// Creates the series of `shard` at zero (runs by result, duration, queue depth), so that
    /// a shard's rates and latencies are scraped from the moment this replica takes it.
    /// Error series (by condition reason) appear with the first error.
    pub fn shard_taken(&self, shard: u32) {
        let shard = shard.to_string();
        for result in SyncResult::ALL {
            self.runs.with_label_values(&[shard.as_str(), result.as_str()]);
        }
        self.duration.with_label_values(&[shard.as_str()]);
        self.queue_depth.with_label_values(&[shard.as_str()]);
    }

    /// Removes every series of `shard`.
    fn shard_left(&self, shard: u32) {
        let shard = shard.to_string();
        // A series that was never created is not there to remove; that is fine.
        for result in SyncResult::ALL {
            let _ = self.runs.remove_label_values(&[shard.as_str(), result.as_str()]);
        }
        for reason in ConditionReason::ALL {
            let _ = self.errors.remove_label_values(&[shard.as_str(), reason.as_str()]);
        }
        let _ = self.duration.remove_label_values(&[shard.as_str()]);
        let _ = self.queue_depth.remove_label_values(&[shard.as_str()]);
    }

    /// Starts timing a sync of a Kyma in `shard`; the returned guard records the duration
    /// when dropped.
    pub fn measure(&self, shard: u32) -> SyncTimer {
        self.in_flight.inc();
        SyncTimer { start: Instant::now(), shard: shard.to_string(), metrics: self.clone() }
    }

    /// Counts a finished sync of a Kyma in `shard` (its duration is the [`SyncTimer`]'s).
    pub fn finished(&self, shard: u32, outcome: SyncOutcome) {
        let shard = shard.to_string();
        match outcome {
            SyncOutcome::Synced => self.runs.with_label_values(&[shard.as_str(), SyncResult::Success.as_str()]).inc(),
            SyncOutcome::Failed(reason) => {
                self.runs.with_label_values(&[shard.as_str(), SyncResult::Error.as_str()]).inc();
                self.errors.with_label_values(&[shard.as_str(), reason.as_str()]).inc();
            }
        }
    }

    /// Counts a failed write of the `ModuleCatalog` condition of a Kyma in `shard`, after its
    /// sync was counted.
    pub fn condition_write_failed(&self, shard: u32) {
        let reason = ConditionReason::ConditionWriteFailed;
        self.errors.with_label_values(&[shard.to_string().as_str(), reason.as_str()]).inc();
    }

    /// Counts `n` catalog objects that a successful sync handled with `op`.
    pub fn synced_objects(&self, kind: CatalogKind, op: ObjectOp, n: usize) {
        self.objects.with_label_values(&[kind.as_str(), op.as_str()]).inc_by(n as u64);
    }

    /// Sets the number of requeued Kymas of `shard` whose sync has not finished yet.
    pub fn queue_depth(&self, shard: u32, depth: usize) {
        self.queue_depth.with_label_values(&[shard.to_string().as_str()]).set(count(depth));
    }

    /// Counts a write of a Kyma's `ModuleCatalog` condition.
    pub fn condition_written(&self, status: ConditionStatus) {
        self.condition_writes.with_label_values(&[status.as_str()]).inc();
    }

    /// Counts a reconcile that left a Kyma alone.
    pub fn skipped(&self, reason: SkipReason) {
        self.skipped.with_label_values(&[reason.as_str()]).inc();
    }
}

/// Records a sync's duration and in-flight count when dropped.
pub struct SyncTimer {
    start: Instant,
    shard: String,
    metrics: SyncMetrics,
}

impl Drop for SyncTimer {
    fn drop(&mut self) {
        self.metrics.duration.with_label_values(&[self.shard.as_str()]).observe(self.start.elapsed().as_secs_f64());
        self.metrics.in_flight.dec();
    }
}

/// Metrics of the SKR clients.
#[derive(Clone)]
pub struct SkrClientMetrics {
    /// `catalogsync_skr_requests_total{verb,result}`.
    requests: IntCounterVec,
    /// `catalogsync_skr_clients`.
    clients: IntGauge,
    /// `catalogsync_skr_client_evictions_total{reason}`.
    evictions: IntCounterVec,
    /// `catalogsync_skr_insecure_tls_allowed`.
    insecure_tls_allowed: IntGauge,
}

impl SkrClientMetrics {
    /// Registers the SKR client metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            requests: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_skr_requests_total",
                        "Requests to SKR apiservers, by verb (get, list, apply, replace, delete) and result (success, not_found, conflict, error).",
                    ),
                    &["verb", "result"],
                ),
            )?,
            clients: register(
                r,
                IntGauge::new(
                    "catalogsync_skr_clients",
                    "SKRs whose access (parsed kubeconfig and sync state) this replica caches; a client exists only during a sync.",
                ),
            )?,
            evictions: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_skr_client_evictions_total",
                        "Cached SKR accesses dropped, by reason (secret_changed, error, released, deleted).",
                    ),
                    &["reason"],
                ),
            )?,
            insecure_tls_allowed: register(
                r,
                IntGauge::new(
                    "catalogsync_skr_insecure_tls_allowed",
                    "1 while --allow-insecure-skr-tls lets SKR kubeconfigs switch TLS verification off (local development only), else 0.",
                ),
            )?,
        })
    }

    fn init_known_series(&self) {
        precreate2::<_, SkrVerb, RequestResult>(&self.requests);
        precreate::<_, EvictionReason>(&self.evictions);
    }

    /// Counts one SKR request and how it ended.
    pub fn request<T>(&self, verb: SkrVerb, result: &Result<T, kube::Error>) {
        self.requests.with_label_values(&[verb.as_str(), RequestResult::of(result).as_str()]).inc();
    }

    /// Sets the number of cached SKR accesses.
    pub fn cached_clients(&self, n: usize) {
        self.clients.set(count(n));
    }

    /// Counts a cached SKR access dropped.
    pub fn evicted(&self, reason: EvictionReason) {
        self.evictions.with_label_values(&[reason.as_str()]).inc();
    }

    /// Reports that `--allow-insecure-skr-tls` is on.
    pub fn insecure_tls_allowed(&self) {
        self.insecure_tls_allowed.set(1);
    }

    /// The count of SKR requests of `verb` that ended with `result`.
    #[cfg(test)]
    pub fn requests(&self, verb: SkrVerb, result: RequestResult) -> u64 {
        self.requests.with_label_values(&[verb.as_str(), result.as_str()]).get()
    }
}

/// Metrics of the KCP catalog.
#[derive(Clone)]
pub struct CatalogMetrics {
    /// `catalogsync_catalog_objects{kind}`.
    objects: IntGaugeVec,
    /// `catalogsync_catalog_malformed_objects{kind}`.
    malformed: IntGaugeVec,
    /// `catalogsync_catalog_old_style_templates`.
    old_style_templates: IntGauge,
    /// `catalogsync_catalog_skipped_release_metas{reason}`.
    skipped_release_metas: IntGaugeVec,
    /// `catalogsync_catalog_changes_total`.
    changes: IntCounter,
    /// `catalogsync_catalog_requeued_kymas_total`.
    requeued: IntCounter,
    /// `catalogsync_catalog_reachable_objects{kind,state}`.
    reachable: IntGaugeVec,
    /// `catalogsync_catalog_shrink_held`.
    shrink_held: IntGauge,
}

impl CatalogMetrics {
    /// Registers the catalog metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            objects: register(
                r,
                IntGaugeVec::new(
                    Opts::new("catalogsync_catalog_objects", "Catalog objects in the KCP snapshot, by kind."),
                    &["kind"],
                ),
            )?,
            old_style_templates: register(
                r,
                IntGauge::new(
                    "catalogsync_catalog_old_style_templates",
                    "ModuleTemplates without spec.moduleName (old-style): never synced, not malformed.",
                ),
            )?,
            malformed: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "catalogsync_catalog_malformed_objects",
                        "KCP catalog objects left out because they do not parse, by kind.",
                    ),
                    &["kind"],
                ),
            )?,
            skipped_release_metas: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "catalogsync_catalog_skipped_release_metas",
                        "ModuleReleaseMetas of the KCP snapshot skipped for every Kyma because of their kymaSelector, by reason.",
                    ),
                    &["reason"],
                ),
            )?,
            changes: register(
                r,
                IntCounter::new(
                    "catalogsync_catalog_changes_total",
                    "Catalog snapshots rebuilt after KCP changes (after debouncing).",
                ),
            )?,
            requeued: register(
                r,
                IntCounter::new(
                    "catalogsync_catalog_requeued_kymas_total",
                    "Kymas requeued because a catalog change altered their desired catalog.",
                ),
            )?,
            reachable: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "catalogsync_catalog_reachable_objects",
                        "Catalog objects some SKR gets, by kind, of the published and of the latest KCP catalog state.",
                    ),
                    &["kind", "state"],
                ),
            )?,
            shrink_held: register(
                r,
                IntGauge::new(
                    "catalogsync_catalog_shrink_held",
                    "1 while this replica holds back a catalog state that lost more than --catalog-shrink-threshold.",
                ),
            )?,
        })
    }

    fn init_known_series(&self) {
        precreate::<_, CatalogKind>(&self.objects);
        precreate::<_, CatalogKind>(&self.malformed);
        precreate2::<_, CatalogKind, ReachableState>(&self.reachable);
        precreate::<_, WarningReason>(&self.skipped_release_metas);
    }

    /// Sets the number of objects of `kind` in the published snapshot.
    pub fn objects(&self, kind: CatalogKind, n: usize) {
        self.objects.with_label_values(&[kind.as_str()]).set(count(n));
    }

    /// Sets the number of objects of `kind` left out of the snapshot because they do not parse.
    pub fn malformed(&self, kind: CatalogKind, n: usize) {
        self.malformed.with_label_values(&[kind.as_str()]).set(count(n));
    }

    /// Sets the number of old-style ModuleTemplates (without `spec.moduleName`), which are never
    /// synced.
    pub fn old_style_templates(&self, n: usize) {
        self.old_style_templates.set(count(n));
    }

    /// Sets the number of ModuleReleaseMetas no Kyma gets, for `reason`.
    pub fn skipped_release_metas(&self, reason: WarningReason, n: usize) {
        self.skipped_release_metas.with_label_values(&[reason.as_str()]).set(count(n));
    }

    /// Counts a catalog snapshot published after KCP changes.
    pub fn changed(&self) {
        self.changes.inc();
    }

    /// Counts `n` Kymas requeued by a catalog change.
    pub fn requeued(&self, n: usize) {
        self.requeued.inc_by(n as u64);
    }

    /// Sets the number of reachable objects of `kind` in the catalog `state`.
    pub fn reachable(&self, kind: CatalogKind, state: ReachableState, n: usize) {
        self.reachable.with_label_values(&[kind.as_str(), state.as_str()]).set(count(n));
    }

    /// Reports whether a catalog state is held back.
    pub fn shrink_held(&self, held: bool) {
        self.shrink_held.set(i64::from(held));
    }
}

/// Metrics of membership, shard ownership and the coordinator. The gauges of the shard
/// agent's state are computed at scrape time (`sharding::shard_gauges`).
#[derive(Clone)]
pub struct ShardMetrics {
    /// `catalogsync_shard_handovers_total{op}`.
    handovers: IntCounterVec,
    /// `catalogsync_shard_handover_duration_seconds`.
    handover_duration: Histogram,
    /// `catalogsync_shard_assignments_total`.
    assignments: IntCounter,
    /// `catalogsync_shard_forced_takeovers_total`.
    forced_takeovers: IntCounter,
    /// `catalogsync_member_fenced`.
    fenced: IntGauge,
    /// `catalogsync_member_identity_conflict`.
    identity_conflict: IntGauge,
    /// `catalogsync_shard_count_mismatch`.
    shard_count_mismatch: IntGauge,
    /// `catalogsync_member_renewals_total{result}`.
    renewals: IntCounterVec,
    /// `catalogsync_live_members`.
    live_members: IntGauge,
}

impl ShardMetrics {
    /// Registers the sharding metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            handovers: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_shard_handovers_total",
                        "Shard ownership changes made by this replica, by operation (claimed, resumed, drained, released, dropped).",
                    ),
                    &["op"],
                ),
            )?,
            handover_duration: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "catalogsync_shard_handover_duration_seconds",
                        "Time from the coordinator naming a new holder of a shard to that holder claiming it, in seconds.",
                    )
                    .buckets(HANDOVER_BUCKETS.to_vec()),
                ),
            )?,
            assignments: register(
                r,
                IntCounter::new(
                    "catalogsync_shard_assignments_total",
                    "Desired-holder changes the coordinator wrote to shard Leases.",
                ),
            )?,
            forced_takeovers: register(
                r,
                IntCounter::new(
                    "catalogsync_shard_forced_takeovers_total",
                    "Shards the coordinator released because their holder's member Lease had expired.",
                ),
            )?,
            fenced: register(
                r,
                IntGauge::new(
                    "catalogsync_member_fenced",
                    "1 when this replica stopped SKR writes because its member Lease was not renewed in time.",
                ),
            )?,
            identity_conflict: register(
                r,
                IntGauge::new(
                    "catalogsync_member_identity_conflict",
                    "1 while another process renews the member Lease of this replica's identity, so this one stays fenced.",
                ),
            )?,
            shard_count_mismatch: register(
                r,
                IntGauge::new(
                    "catalogsync_shard_count_mismatch",
                    "1 while this replica's --shards differs from the shard count recorded in the config Lease, so it stays fenced.",
                ),
            )?,
            renewals: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "catalogsync_member_renewals_total",
                        "Renewals of this replica's member Lease, by result (success, error).",
                    ),
                    &["result"],
                ),
            )?,
            live_members: register(
                r,
                IntGauge::new("catalogsync_live_members", "Replicas with an unexpired member Lease, as seen here."),
            )?,
        })
    }

    fn init_known_series(&self) {
        precreate::<_, HandoverOp>(&self.handovers);
        precreate::<_, RenewalResult>(&self.renewals);
    }

    /// Counts a shard ownership change; see [`Metrics::shard_handover`], which also keeps
    /// the per-shard series.
    fn handover(&self, op: HandoverOp) {
        self.handovers.with_label_values(&[op.as_str()]).inc();
    }

    /// Records the time from the coordinator naming this replica the holder of a shard to
    /// this replica claiming it.
    pub fn handover_took(&self, seconds: f64) {
        self.handover_duration.observe(seconds.max(0.0));
    }

    /// Counts a desired-holder change the coordinator wrote.
    pub fn assigned(&self) {
        self.assignments.inc();
    }

    /// Counts a shard the coordinator released because its holder's member Lease expired.
    pub fn forced_takeover(&self) {
        self.forced_takeovers.inc();
    }

    /// Reports whether this replica's SKR writes are fenced.
    pub fn fenced(&self, fenced: bool) {
        self.fenced.set(i64::from(fenced));
    }

    /// Reports whether another process renews this identity's member Lease.
    pub fn identity_conflict(&self, conflict: bool) {
        self.identity_conflict.set(i64::from(conflict));
    }

    /// Reports whether this replica's shard count differs from the recorded one.
    pub fn shard_count_mismatch(&self, mismatch: bool) {
        self.shard_count_mismatch.set(i64::from(mismatch));
    }

    /// Counts a renewal of this replica's member Lease.
    pub fn renewal(&self, result: RenewalResult) {
        self.renewals.with_label_values(&[result.as_str()]).inc();
    }

    /// Reports the number of replicas with an unexpired member Lease (coordinator only).
    pub fn live_members(&self, n: usize) {
        self.live_members.set(count(n));
    }
}

#[cfg(test)]
mod tests;
