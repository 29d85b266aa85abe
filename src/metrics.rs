//! Prometheus metrics: one [`Metrics`] struct owns the registry; every label is bounded
//! (kinds, operations, results, reasons), never an object name. Documented in
//! `docs/metrics.md`, which `tests/metrics_doc.rs` checks against this registry.

use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Buckets of the sync duration histogram: a warm no-op sync is a few milliseconds, a cold
/// sync of a large catalog a few seconds, a timeout tens of seconds.
const SYNC_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

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

/// Buckets of the handover duration histogram: a graceful handover takes well under two
/// seconds, a takeover after a crash about a member lease duration.
const HANDOVER_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0];

/// Metrics of membership, shard ownership and the coordinator.
#[derive(Clone)]
pub struct ShardMetrics {
    /// `catalogsync_shard_owned_clusters{shard}`.
    pub owned_clusters: IntGaugeVec,
    /// `catalogsync_shards_held`.
    pub held: IntGauge,
    /// `catalogsync_shard_drain_oldest_seconds`.
    pub drain_oldest: prometheus::Gauge,
    /// `catalogsync_shard_handovers_total{op}`.
    pub handovers: IntCounterVec,
    /// `catalogsync_shard_handover_duration_seconds`.
    pub handover_duration: Histogram,
    /// `catalogsync_shard_assignments_total`.
    pub assignments: IntCounter,
    /// `catalogsync_shard_forced_takeovers_total`.
    pub forced_takeovers: IntCounter,
    /// `catalogsync_unowned_clusters`.
    pub unowned_clusters: IntGauge,
    /// `catalogsync_unowned_oldest_seconds`.
    pub unowned_oldest: prometheus::Gauge,
    /// `catalogsync_is_coordinator`.
    pub is_coordinator: IntGauge,
    /// `catalogsync_member_fenced`.
    pub fenced: IntGauge,
    /// `catalogsync_member_identity_conflict`.
    pub identity_conflict: IntGauge,
    /// `catalogsync_shard_count_mismatch`.
    pub shard_count_mismatch: IntGauge,
    /// `catalogsync_member_renewals_total{result}`.
    pub renewals: IntCounterVec,
    /// `catalogsync_live_members`.
    pub live_members: IntGauge,
}

impl ShardMetrics {
    /// Registers the sharding metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let handover_duration = Histogram::with_opts(
            HistogramOpts::new(
                "catalogsync_shard_handover_duration_seconds",
                "Time from the coordinator naming a new holder of a shard to that holder claiming it, in seconds.",
            )
            .buckets(HANDOVER_BUCKETS.to_vec()),
        )?;
        r.register(Box::new(handover_duration.clone()))?;
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let drain_oldest = prometheus::Gauge::new(
            "catalogsync_shard_drain_oldest_seconds",
            "How long the longest-draining shard of this replica has been draining, in seconds (0 when none drains).",
        )?;
        r.register(Box::new(drain_oldest.clone()))?;
        let unowned_oldest = prometheus::Gauge::new(
            "catalogsync_unowned_oldest_seconds",
            "Age of the oldest shard without a live holder, in seconds (coordinator only; 0 elsewhere).",
        )?;
        r.register(Box::new(unowned_oldest.clone()))?;
        Ok(Self {
            owned_clusters: gauge_vec(
                r,
                "catalogsync_shard_owned_clusters",
                "SKRs (Kymas) in each shard this replica holds.",
                &["shard"],
            )?,
            held: gauge(r, "catalogsync_shards_held", "Shards this replica holds and works on.")?,
            drain_oldest,
            handovers: counter_vec(
                r,
                "catalogsync_shard_handovers_total",
                "Shard ownership changes made by this replica, by operation (claimed, resumed, drained, released, dropped).",
                &["op"],
            )?,
            handover_duration,
            assignments: counter(
                "catalogsync_shard_assignments_total",
                "Desired-holder changes the coordinator wrote to shard Leases.",
            )?,
            forced_takeovers: counter(
                "catalogsync_shard_forced_takeovers_total",
                "Shards the coordinator released because their holder's member Lease had expired.",
            )?,
            unowned_clusters: gauge(
                r,
                "catalogsync_unowned_clusters",
                "SKRs whose shard has no live holder (coordinator only; 0 elsewhere).",
            )?,
            unowned_oldest,
            is_coordinator: gauge(r, "catalogsync_is_coordinator", "1 when this replica is the coordinator, else 0.")?,
            fenced: gauge(
                r,
                "catalogsync_member_fenced",
                "1 when this replica stopped SKR writes because its member Lease was not renewed in time.",
            )?,
            shard_count_mismatch: gauge(
                r,
                "catalogsync_shard_count_mismatch",
                "1 while this replica's --shards differs from the shard count recorded in the config Lease, so it stays fenced.",
            )?,
            identity_conflict: gauge(
                r,
                "catalogsync_member_identity_conflict",
                "1 while another process renews the member Lease of this replica's identity, so this one stays fenced.",
            )?,
            renewals: counter_vec(
                r,
                "catalogsync_member_renewals_total",
                "Renewals of this replica's member Lease, by result (success, error).",
                &["result"],
            )?,
            live_members: gauge(
                r,
                "catalogsync_live_members",
                "Replicas with an unexpired member Lease, as seen here.",
            )?,
        })
    }
}

/// Metrics of SKR syncs.
#[derive(Clone)]
pub struct SyncMetrics {
    /// `catalogsync_sync_runs_total{shard,result}`.
    pub runs: IntCounterVec,
    /// `catalogsync_sync_errors_total{shard,reason}`.
    pub errors: IntCounterVec,
    /// `catalogsync_sync_duration_seconds{shard}`.
    pub duration: prometheus::HistogramVec,
    /// `catalogsync_sync_objects_total{kind,op}`.
    pub objects: IntCounterVec,
    /// `catalogsync_syncs_in_flight`.
    pub in_flight: IntGauge,
    /// `catalogsync_queue_depth{shard}`.
    pub queue_depth: IntGaugeVec,
    /// `catalogsync_kyma_condition_writes_total{status}`.
    pub condition_writes: IntCounterVec,
    /// `catalogsync_kymas_skipped_total{reason}`.
    pub skipped: IntCounterVec,
}

/// Metrics of the SKR clients.
#[derive(Clone)]
pub struct SkrClientMetrics {
    /// `catalogsync_skr_requests_total{verb,result}`.
    pub requests: IntCounterVec,
    /// `catalogsync_skr_clients`.
    pub clients: IntGauge,
    /// `catalogsync_skr_client_evictions_total{reason}`.
    pub evictions: IntCounterVec,
    /// `catalogsync_skr_insecure_tls_allowed`.
    pub insecure_tls_allowed: IntGauge,
}

/// Metrics of the KCP catalog.
#[derive(Clone)]
pub struct CatalogMetrics {
    /// `catalogsync_catalog_objects{kind}`.
    pub objects: IntGaugeVec,
    /// `catalogsync_catalog_malformed_objects{kind}`.
    pub malformed: IntGaugeVec,
    /// `catalogsync_catalog_skipped_release_metas{reason}`.
    pub skipped_release_metas: IntGaugeVec,
    /// `catalogsync_catalog_changes_total`.
    pub changes: IntCounter,
    /// `catalogsync_catalog_requeued_kymas_total`.
    pub requeued: IntCounter,
    /// `catalogsync_catalog_reachable_objects{kind,state}`.
    pub reachable: IntGaugeVec,
    /// `catalogsync_catalog_shrink_held`.
    pub shrink_held: IntGauge,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl SyncMetrics {
    /// Registers the sync metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let duration = prometheus::HistogramVec::new(
            HistogramOpts::new("catalogsync_sync_duration_seconds", "Duration of one sync of one SKR, in seconds.")
                .buckets(SYNC_BUCKETS.to_vec()),
            &["shard"],
        )?;
        r.register(Box::new(duration.clone()))?;
        Ok(Self {
            runs: counter_vec(
                r,
                "catalogsync_sync_runs_total",
                "Syncs of one SKR, by shard and result (success, error).",
                &["shard", "result"],
            )?,
            errors: counter_vec(
                r,
                "catalogsync_sync_errors_total",
                "Failed syncs, by shard and ModuleCatalog condition reason.",
                &["shard", "reason"],
            )?,
            duration,
            objects: counter_vec(
                r,
                "catalogsync_sync_objects_total",
                "Catalog objects handled in SKRs, by kind and operation (applied, unchanged, pruned).",
                &["kind", "op"],
            )?,
            in_flight: gauge(r, "catalogsync_syncs_in_flight", "SKR syncs running now.")?,
            queue_depth: gauge_vec(
                r,
                "catalogsync_queue_depth",
                "Kymas requeued for a catalog change whose sync has not finished yet, by shard.",
                &["shard"],
            )?,
            condition_writes: counter_vec(
                r,
                "catalogsync_kyma_condition_writes_total",
                "Writes of a Kyma's ModuleCatalog condition, by condition status.",
                &["status"],
            )?,
            skipped: counter_vec(
                r,
                "catalogsync_kymas_skipped_total",
                "Reconciles that left a Kyma alone, by reason (deleting, skip_reconciliation).",
                &["reason"],
            )?,
        })
    }

    /// Creates the series of `shard` at zero (runs by result, duration, queue depth), so that
    /// a shard's rates and latencies are scraped from the moment this replica takes it.
    /// Error series (by condition reason) appear with the first error.
    pub fn init_shard(&self, shard: u32) {
        let shard = shard.to_string();
        for result in known::RESULTS {
            self.runs.with_label_values(&[shard.as_str(), result]);
        }
        self.duration.with_label_values(&[shard.as_str()]);
        self.queue_depth.with_label_values(&[shard.as_str()]);
    }

    /// Starts timing a sync of a Kyma in `shard`; the returned guard records the duration
    /// when dropped.
    pub fn measure(&self, shard: u32) -> SyncTimer {
        self.in_flight.inc();
        SyncTimer { start: Instant::now(), shard: shard.to_string(), metrics: self.clone() }
    }
}

/// Records a sync's duration and in-flight count when dropped.
pub struct SyncTimer {
    start: Instant,
    shard: String,
    metrics: SyncMetrics,
}

impl SyncTimer {
    /// The shard label value.
    pub fn shard(&self) -> &str {
        &self.shard
    }
}

impl Drop for SyncTimer {
    fn drop(&mut self) {
        self.metrics.duration.with_label_values(&[self.shard.as_str()]).observe(self.start.elapsed().as_secs_f64());
        self.metrics.in_flight.dec();
    }
}

impl SkrClientMetrics {
    /// Registers the SKR client metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            requests: counter_vec(
                r,
                "catalogsync_skr_requests_total",
                "Requests to SKR apiservers, by verb (get, list, apply, replace, delete) and result (success, not_found, conflict, error).",
                &["verb", "result"],
            )?,
            clients: gauge(
                r,
                "catalogsync_skr_clients",
                "SKRs whose access (parsed kubeconfig and sync state) this replica caches; a client exists only during a sync.",
            )?,
            evictions: counter_vec(
                r,
                "catalogsync_skr_client_evictions_total",
                "Cached SKR accesses dropped, by reason (secret_changed, error, released, deleted).",
                &["reason"],
            )?,
            insecure_tls_allowed: gauge(
                r,
                "catalogsync_skr_insecure_tls_allowed",
                "1 while --allow-insecure-skr-tls lets SKR kubeconfigs switch TLS verification off (local development only), else 0.",
            )?,
        })
    }

    /// Counts one SKR request.
    pub fn record<T>(&self, verb: &'static str, result: &Result<T, kube::Error>) {
        let label = match result {
            Ok(_) => "success",
            Err(kube::Error::Api(s)) if s.code == 404 => "not_found",
            Err(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Err(_) => "error",
        };
        self.requests.with_label_values(&[verb, label]).inc();
    }
}

impl CatalogMetrics {
    /// Registers the catalog metrics.
    ///
    /// # Errors
    /// Fails when a metric is registered twice.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            objects: gauge_vec(
                r,
                "catalogsync_catalog_objects",
                "Catalog objects in the KCP snapshot, by kind.",
                &["kind"],
            )?,
            malformed: gauge_vec(
                r,
                "catalogsync_catalog_malformed_objects",
                "KCP catalog objects left out because they do not parse, by kind.",
                &["kind"],
            )?,
            skipped_release_metas: gauge_vec(
                r,
                "catalogsync_catalog_skipped_release_metas",
                "ModuleReleaseMetas of the KCP snapshot skipped for every Kyma because of their kymaSelector, by reason.",
                &["reason"],
            )?,
            changes: IntCounter::new(
                "catalogsync_catalog_changes_total",
                "Catalog snapshots rebuilt after KCP changes (after debouncing).",
            )
            .and_then(|c| r.register(Box::new(c.clone())).map(|()| c))?,
            requeued: IntCounter::new(
                "catalogsync_catalog_requeued_kymas_total",
                "Kymas requeued because a catalog change altered their desired catalog.",
            )
            .and_then(|c| r.register(Box::new(c.clone())).map(|()| c))?,
            reachable: gauge_vec(
                r,
                "catalogsync_catalog_reachable_objects",
                "Catalog objects some SKR gets, by kind, of the published and of the latest KCP catalog state.",
                &["kind", "state"],
            )?,
            shrink_held: gauge(
                r,
                "catalogsync_catalog_shrink_held",
                "1 while this replica holds back a catalog state that lost more than --catalog-shrink-threshold.",
            )?,
        })
    }
}

/// The values of the bounded labels that are known up front, by metric. [`Metrics::new`]
/// creates these series at zero, so that they are scraped before their first event: an
/// alert on `rate(…{result="error"}[5m])` then sees a 0, not an absent series, and every
/// documented metric is in `/metrics` of a fresh replica. (Series labelled by shard are
/// created when the shard is taken, see [`SyncMetrics::init_shard`].)
mod known {
    /// `catalogsync_sync_objects_total` `kind` (the two catalog kinds) and `op`.
    pub const OBJECT_KINDS: &[&str] = &["ModuleTemplate", "ModuleReleaseMeta"];
    pub const OBJECT_OPS: &[&str] = &["applied", "unchanged", "pruned"];
    /// `catalogsync_kyma_condition_writes_total` `status`.
    pub const CONDITION_STATUSES: &[&str] = &["True", "False"];
    /// `catalogsync_kymas_skipped_total` `reason`.
    pub const SKIP_REASONS: &[&str] = &["deleting", "skip_reconciliation"];
    /// `catalogsync_skr_requests_total` `verb` and `result`.
    pub const SKR_VERBS: &[&str] = &["get", "list", "apply", "replace", "delete"];
    pub const SKR_RESULTS: &[&str] = &["success", "not_found", "conflict", "error"];
    /// `catalogsync_skr_client_evictions_total` `reason`.
    pub const EVICTION_REASONS: &[&str] = &["secret_changed", "error", "released", "deleted"];
    /// `catalogsync_shard_handovers_total` `op`.
    pub const HANDOVER_OPS: &[&str] = &["claimed", "resumed", "drained", "released", "dropped"];
    /// `catalogsync_member_renewals_total` and `catalogsync_sync_runs_total` `result`.
    pub const RESULTS: &[&str] = &["success", "error"];
    /// `catalogsync_catalog_skipped_release_metas` `reason`.
    pub const SKIPPED_RELEASE_META_REASONS: &[&str] = &crate::catalog::Warning::REASONS;
    /// `catalogsync_catalog_reachable_objects` `state`.
    pub const REACHABLE_STATES: &[&str] = &["published", "latest"];
}

impl Metrics {
    /// Creates and registers all metrics in a fresh registry, with the series of every
    /// known label value at zero.
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
        metrics.init_known_series();
        Ok(metrics)
    }

    fn init_known_series(&self) {
        use known::*;
        let Self { sync, skr, catalog, shard, .. } = self;
        for kind in OBJECT_KINDS {
            for op in OBJECT_OPS {
                sync.objects.with_label_values(&[kind, op]);
            }
            catalog.objects.with_label_values(&[kind]);
            catalog.malformed.with_label_values(&[kind]);
            for state in REACHABLE_STATES {
                catalog.reachable.with_label_values(&[kind, state]);
            }
        }
        for reason in SKIPPED_RELEASE_META_REASONS {
            catalog.skipped_release_metas.with_label_values(&[reason]);
        }
        for status in CONDITION_STATUSES {
            sync.condition_writes.with_label_values(&[status]);
        }
        for reason in SKIP_REASONS {
            sync.skipped.with_label_values(&[reason]);
        }
        for verb in SKR_VERBS {
            for result in SKR_RESULTS {
                skr.requests.with_label_values(&[verb, result]);
            }
        }
        for reason in EVICTION_REASONS {
            skr.evictions.with_label_values(&[reason]);
        }
        for op in HANDOVER_OPS {
            shard.handovers.with_label_values(&[op]);
        }
        for result in RESULTS {
            shard.renewals.with_label_values(&[result]);
        }
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
