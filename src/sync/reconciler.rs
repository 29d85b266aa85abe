//! The Kyma controller: one reconcile syncs one SKR and reports the result in the Kyma's
//! `ModuleCatalog` condition, the only KCP write catalogsync makes.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use rand::Rng;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::ConditionStatus;
use crate::api::{KCP_FIELD_MANAGER, Kyma, MODULE_CATALOG_CONDITION, SKIP_RECONCILIATION_LABEL, is_flag_on};
use crate::catalog::CatalogKind;
use crate::config::Mode;
use crate::error::ConditionReason;
use crate::error::{Result, SyncError};
use crate::metrics::{EvictionReason, Metrics, ObjectOp, SkipReason, SyncOutcome};
use crate::sharding::ShardView;
use crate::skr::{AccessSecrets, SkrConnector, SkrState};
use crate::sync::condition::{self, Wanted};
use crate::sync::executor::{SkrTarget, SyncReport};
use crate::sync::kymas::{KymaRecords, ShadowCounts};
use crate::sync::label_keys::KymaLabelKeys;
use crate::sync::state::{CatalogState, sync_fingerprint};

/// Sync settings taken from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Sync, or only compare.
    pub mode: crate::config::Mode,
    /// SKR namespace of the copies.
    pub sync_namespace: String,
    /// Restricted module names.
    pub restricted_modules: BTreeSet<String>,
    /// Periodic resync.
    pub resync_period: Duration,
    /// Jitter fraction of the resync.
    pub resync_jitter: f64,
    /// Requests in flight per SKR.
    pub skr_concurrency: usize,
    /// Bound of one SKR request.
    pub skr_request_timeout: Duration,
    /// Timeout of one whole sync.
    pub sync_timeout: Duration,
    /// First backoff delay.
    pub backoff_min: Duration,
    /// Longest backoff delay.
    pub backoff_max: Duration,
    /// Bound of one KCP request (the condition write, an Event).
    pub kcp_request_timeout: Duration,
}

/// Everything a reconcile needs.
pub struct Context {
    /// KCP client.
    pub kcp: Client,
    /// Settings.
    pub settings: Settings,
    /// Builds the access to an SKR from its access Secret.
    pub connector: SkrConnector,
    /// Metrics.
    pub metrics: Metrics,
    /// The latest catalog snapshot.
    pub catalog: watch::Receiver<Arc<CatalogState>>,
    /// Metadata of the access Secrets, indexed by Kyma.
    pub secrets: AccessSecrets,
    /// Event recorder.
    pub recorder: Recorder,
    /// Ownership gate.
    pub shards: ShardView,
    /// Permits for full lists of SKR copies (`--full-list-concurrency`).
    pub full_lists: tokio::sync::Semaphore,
    /// Permits for SKR applies in flight (`--apply-concurrency`).
    pub applies: tokio::sync::Semaphore,
    /// Permits for syncs that list the SKR (`--listing-concurrency`).
    pub listing: tokio::sync::Semaphore,
    /// What is known of each Kyma, shared with the catalog publisher.
    pub kymas: Arc<KymaRecords>,
    /// The Kyma cache, read again once it holds the labels a catalog's selectors need.
    pub kyma_cache: Store<Kyma>,
    /// Which labels the Kyma cache keeps and has listed.
    pub label_keys: KymaLabelKeys,
}

impl Context {
    /// Forgets a Kyma that is gone from the KCP: drops its cached SKR access (parsed
    /// kubeconfig, credentials and sync state; counted as an eviction with reason `deleted`),
    /// its bookkeeping (failures, synced fingerprint, pending entry) and its share of its
    /// shard's queue depth. Called for every Delete event of the Kyma watch, so a Kyma
    /// deleted without finalizers (never seen with a `deletionTimestamp`) leaves nothing
    /// behind, and for every requeue that finds its Kyma gone.
    ///
    /// Its access Secrets are not touched: [`AccessSecrets`] follows the Secrets themselves,
    /// and forgets one when it is deleted.
    ///
    /// # Caveats
    /// A sync of the Kyma that is running when it is deleted may record it again as it ends.
    /// Its requeue (backoff or resync) then finds the Kyma gone and forgets it again.
    pub fn forget_kyma(&self, kyma: &ObjectRef<Kyma>) {
        self.kymas.forget(&kyma.name, EvictionReason::Deleted);
        debug!(%kyma, "Forgot a deleted Kyma");
    }
}

/// Why a Kyma is left alone, if it is.
fn skip_reason(kyma: &Kyma) -> Option<SkipReason> {
    if kyma.metadata.deletion_timestamp.is_some() {
        Some(SkipReason::Deleting)
    } else if is_flag_on(kyma.labels().get(SKIP_RECONCILIATION_LABEL)) {
        Some(SkipReason::SkipReconciliation)
    } else {
        None
    }
}

/// Keeps only what the controller needs of a Kyma in the cache: identity (name, namespace,
/// uid, resourceVersion for Events), the labels of `label_keys` (see
/// [`label_keys`](crate::sync::label_keys)), generation, deletion timestamp, the
/// `ModuleCatalog` condition and which field managers own it. Every replica caches every Kyma
/// of the fleet, held or not; a Kyma's status, annotations, finalizers, managed fields and
/// other labels would otherwise dominate its memory.
pub fn trim(kyma: &mut Kyma, label_keys: &BTreeSet<String>) {
    let meta = std::mem::take(&mut kyma.metadata);
    // Of the managed fields, only who owns the `ModuleCatalog` condition.
    let owners = meta.managed_fields.as_deref().map(condition::condition_owners).unwrap_or_default();
    kyma.metadata = kube::api::ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        generation: meta.generation,
        labels: meta.labels.map(|mut labels| {
            labels.retain(|key, _| label_keys.contains(key));
            labels
        }),
        deletion_timestamp: meta.deletion_timestamp,
        managed_fields: (!owners.is_empty()).then_some(owners),
        ..kube::api::ObjectMeta::default()
    };
    kyma.spec = Default::default();
    let condition = condition::current(kyma).cloned();
    kyma.status = Some(crate::api::KymaStatus { conditions: condition.map(|c| vec![c]), ..Default::default() });
}

/// What of a Kyma should trigger a reconcile: labels (beta, internal, skip, selectors),
/// deletion, identity. Status writes (ours and KLM's) do not.
pub fn trigger_hash(kyma: &Kyma) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    kyma.metadata.uid.hash(&mut h);
    kyma.metadata.labels.hash(&mut h);
    kyma.metadata.deletion_timestamp.is_some().hash(&mut h);
    Some(h.finish())
}

/// Runs the Kyma controller until `shutdown`: reconciles every Kyma `changes` yields and every
/// Kyma `requeue` names, at most `concurrency` at once, from the store `kymas`. A requeued Kyma
/// that is gone from the store is forgotten ([`Context::forget_kyma`]).
pub async fn run(
    changes: impl Stream<Item = std::result::Result<Kyma, watcher::Error>> + Send + 'static,
    kymas: Store<Kyma>,
    requeue: impl Stream<Item = ObjectRef<Kyma>> + Send + 'static,
    concurrency: u16,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) {
    let vanished = Arc::clone(&ctx);
    Controller::for_stream(changes, kymas)
        .reconcile_on(requeue)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(controller::Error::ObjectNotFound(obj)) = &res {
                debug!(kyma = %obj, "Kyma vanished before its reconcile");
                // A requeue (catalog or Secret change, backoff, resync) of a deleted Kyma.
                let ns = obj.namespace.as_deref().unwrap_or_default();
                vanished.forget_kyma(&ObjectRef::new(&obj.name).within(ns));
            }
            futures::future::ready(())
        })
        .await;
}

/// Syncs the SKR of one Kyma.
///
/// kube's `Controller` polls all running reconciles inside its own task, so their CPU work
/// (decoding lists, encoding apply bodies, TLS) would share one core. Each reconcile runs on
/// a task of its own instead, so up to `--concurrency` syncs use every core. A sync keeps
/// its in-flight guard inside that task, so shard handovers still wait for it.
///
/// # Errors
/// Any [`SyncError`]; the Kyma's condition already says what went wrong.
pub async fn reconcile(kyma: Arc<Kyma>, ctx: Arc<Context>) -> Result<Action> {
    use tracing::Instrument as _;
    let task = tokio::spawn(reconcile_on_task(kyma, ctx).instrument(tracing::Span::current()));
    match task.await {
        Ok(result) => result,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // Cancelled: the runtime is shutting down.
        Err(_) => Ok(Action::await_change()),
    }
}

async fn reconcile_on_task(kyma: Arc<Kyma>, ctx: Arc<Context>) -> Result<Action> {
    let name = kyma.name_any();
    let namespace = kyma.namespace().unwrap_or_default();
    if let Some(reason) = skip_reason(&kyma) {
        ctx.metrics.sync.skipped(reason);
        ctx.kymas.forget(&name, EvictionReason::Released);
        debug!(reason = reason.as_str(), "Leaving Kyma alone");
        return Ok(Action::await_change());
    }
    if !ctx.shards.owns(&namespace, &name) {
        // Every replica reconciles every Kyma; the ones of other shards end here. Its SKR
        // access and state stay: a shard that is draining, or a replica that is stopping,
        // keeps them for the next holder before it releases the shard, which drops them
        // (`Agent::on_release`).
        ctx.kymas.forget_progress(&name);
        return Ok(Action::await_change());
    }
    // Taken before the sync counts as in flight (a handover does not wait for syncs that
    // wait for a permit; ownership is checked again after the wait) and before its timeout
    // starts. A sync whose SKR stops being trusted after this check lists without a permit;
    // that is rare and still bounded by --concurrency.
    let _listing = if ctx.settings.mode == Mode::Active && ctx.kymas.trusts_memory(&name, ctx.settings.resync_period) {
        None
    } else {
        ctx.listing.acquire().await.ok()
    };
    // Counted as in flight until the end of the sync, so a shard handover waits for it.
    let Some(in_flight) = ctx.shards.begin(&namespace, &name) else {
        ctx.kymas.forget_progress(&name);
        return Ok(Action::await_change());
    };

    let shard = in_flight.shard();
    let contested = condition::contested_by(&kyma, Timestamp::now());
    if let Some(manager) = contested {
        if ctx.kymas.set_contested(&name, shard, true) {
            info!(
                %manager,
                condition = MODULE_CATALOG_CONDITION,
                "Another field manager keeps applying the condition; leaving it to that manager"
            );
        }
        if ctx.settings.mode == Mode::Active && condition::owned_by_us(&kyma) {
            release_condition(&kyma, &ctx).await;
        }
    } else {
        ctx.kymas.set_contested(&name, shard, false);
    }
    if ctx.settings.mode == Mode::Shadow {
        return shadow(&kyma, shard, &ctx).await;
    }
    let Some((kyma, catalog)) = labelled(&kyma, &ctx) else {
        return Ok(labels_pending());
    };
    let timer = ctx.metrics.sync.measure(shard);
    let desired = catalog.desired(kyma.labels(), &ctx.settings.restricted_modules);
    let result = match tokio::time::timeout(
        ctx.settings.sync_timeout,
        visit_skr(&kyma, &ctx, async |target, state| target.sync(&desired.set, &catalog.crds, state).await),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(SyncError::SyncTimeout(ctx.settings.sync_timeout)),
    };
    drop(timer);

    match result {
        Ok(report) => {
            record_report(&ctx.metrics, &report);
            ctx.metrics.sync.finished(shard, SyncOutcome::Synced);
            ctx.kymas.finish(&name, Some(sync_fingerprint(&desired, &catalog)));
            if report.writes() > 0 || report.prune_conflicts > 0 {
                info!(
                    applied = ?report.applied,
                    pruned = ?report.pruned,
                    prune_conflicts = report.prune_conflicts,
                    setup_writes = report.setup_writes,
                    "Synced catalog"
                );
            } else {
                debug!(objects = desired.set.len(), "Catalog already in sync");
            }
            let wanted = Wanted {
                status: ConditionStatus::True,
                reason: ConditionReason::CatalogSynced,
                message: "the SKR holds the desired module catalog".into(),
                observed_generation: kyma.metadata.generation,
            };
            write_condition(&kyma, &wanted, contested.is_some(), &ctx).await?;
            // The resync lists the SKR again once its memory is no longer trusted, so drift
            // is repaired within a resync period of the last list however often the catalog
            // changes in between.
            let resync = jittered(ctx.settings.resync_period, ctx.settings.resync_jitter);
            Ok(Action::requeue(report.verify_in.map_or(resync, |due| resync.min(due))))
        }
        Err(SyncError::OwnershipLost) => {
            ctx.kymas.forget_progress(&name);
            info!("Stopped sync: the SKR is no longer ours");
            Ok(Action::await_change())
        }
        Err(err) => {
            finish_failed(&ctx, &name, shard, &err);
            // The error and its causes as the condition says them: SKR text bounded and without
            // control characters (a cause's own text, a TLS error naming the certificate's
            // names for one, could be long).
            warn!(reason = err.reason().as_str(), error = %err.condition_message(), "Failed to sync catalog");
            let wanted = Wanted {
                status: ConditionStatus::False,
                reason: err.reason(),
                message: err.condition_message(),
                observed_generation: kyma.metadata.generation,
            };
            let changed = write_condition(&kyma, &wanted, contested.is_some(), &ctx).await?;
            // While another manager holds the condition, it may not say this: the first
            // failure in a row still gets its Event.
            let unsaid = contested.is_some() && ctx.kymas.failures(&name) == 0;
            if (changed || unsaid) && err.needs_human() {
                publish_event(&kyma, &wanted, &ctx).await;
            }
            Err(err)
        }
    }
}

/// Shadow mode's reconcile: compares what the SKR holds with the desired catalog, records
/// the verdict for the `catalogsync_shadow_*` gauges, and writes nothing anywhere.
async fn shadow(kyma: &Kyma, shard: u32, ctx: &Context) -> Result<Action> {
    let name = kyma.name_any();
    let Some((kyma, catalog)) = labelled(kyma, ctx) else {
        return Ok(labels_pending());
    };
    let timer = ctx.metrics.sync.measure(shard);
    let desired = catalog.desired(kyma.labels(), &ctx.settings.restricted_modules);
    let result = match tokio::time::timeout(
        ctx.settings.sync_timeout,
        visit_skr(&kyma, ctx, async |target, state| target.compare(&desired.set, state).await),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(SyncError::SyncTimeout(ctx.settings.sync_timeout)),
    };
    drop(timer);
    match result {
        Ok(comparison) => {
            ctx.metrics.sync.finished(shard, SyncOutcome::Synced);
            ctx.kymas.finish(&name, Some(sync_fingerprint(&desired, &catalog)));
            let counts = ShadowCounts::of(&comparison);
            if ctx.kymas.set_shadow(&name, shard, counts) && !counts.agrees() {
                // Counts and the first few names only: the extra names are the SKR's own.
                let differ = |list: fn(&crate::catalog::KindComparison) -> &Vec<String>| {
                    CatalogKind::ALL.map(|k| crate::text::sample(list(comparison.of(k)))).join("; ")
                };
                info!(
                    missing = %differ(|c| &c.missing),
                    different = %differ(|c| &c.different),
                    extra = %differ(|c| &c.extra),
                    "Shadow: the SKR does not hold the desired catalog (ModuleTemplates; ModuleReleaseMetas)"
                );
            } else {
                debug!(agrees = counts.agrees(), "Shadow: compared the SKR with the desired catalog");
            }
            Ok(Action::requeue(jittered(ctx.settings.resync_period, ctx.settings.resync_jitter)))
        }
        Err(err) => {
            finish_failed(ctx, &name, shard, &err);
            warn!(
                reason = err.reason().as_str(),
                error = %err.condition_message(),
                "Shadow: failed to read the SKR"
            );
            Err(err)
        }
    }
}

/// How soon a Kyma whose cached labels lack a key of the catalog's selectors is tried again
/// (the Kyma watch is listing them).
const LABELS_PENDING_RETRY: Duration = Duration::from_secs(1);

/// The catalog to sync against and the Kyma to read its labels from, once the Kyma cache
/// keeps every label key that catalog's selectors read: the Kyma as the cache holds it now
/// (the one this reconcile started with may have been trimmed before the keys grew), or
/// `None` while the Kyma watch still lists with the larger set of keys.
fn labelled(kyma: &Kyma, ctx: &Context) -> Option<(Arc<Kyma>, Arc<CatalogState>)> {
    let catalog = Arc::clone(&ctx.catalog.borrow());
    if !ctx.label_keys.covers(catalog.snapshot.selector_keys()) {
        return None;
    }
    let kyma = ctx.kyma_cache.get(&ObjectRef::from_obj(kyma))?;
    Some((kyma, catalog))
}

/// The reconcile of a Kyma that [`labelled`] put off: no sync, no condition, tried again soon
/// (it stays queued).
fn labels_pending() -> Action {
    debug!("Waiting for the Kyma cache to keep the labels the catalog's selectors read");
    Action::requeue(LABELS_PENDING_RETRY)
}

/// The bookkeeping of a failed visit, in either mode: counted, no catalog fingerprint kept,
/// and the SKR's client and memory dropped when the error says they cannot be trusted.
fn finish_failed(ctx: &Context, name: &str, shard: u32, err: &SyncError) {
    ctx.metrics.sync.finished(shard, SyncOutcome::Failed(err.reason()));
    ctx.kymas.finish(name, None);
    if err.evicts_client() {
        ctx.kymas.evict_skr(name, EvictionReason::Error);
    }
}

/// Backoff after a failed reconcile: exponential per Kyma, with jitter, capped.
pub fn error_policy(kyma: Arc<Kyma>, err: &SyncError, ctx: Arc<Context>) -> Action {
    if let SyncError::WriteCondition(_) = err {
        // Sync failures were logged and counted in reconcile; this one happens after it.
        let shard = ctx.shards.shard_of(&kyma.namespace().unwrap_or_default(), &kyma.name_any());
        ctx.metrics.sync.condition_write_failed(shard);
        warn!(error = err as &dyn std::error::Error, "Failed to write the ModuleCatalog condition");
    }
    let name = kyma.name_any();
    let failures = ctx.kymas.record_failure(&name);
    let delay = backoff(failures, ctx.settings.backoff_min, ctx.settings.backoff_max);
    // A sync that succeeded but whose condition write failed left its SKR verified: the next
    // reconcile must come no later than the end of that trust, or a drift in the SKR would
    // wait for the backoff (up to --backoff-max) on top of the resync period.
    Action::requeue(retry_delay(delay, ctx.kymas.verify_in(&name, ctx.settings.resync_period)))
}

/// The delay before the next reconcile after a failure: the backoff, but no later than the
/// end of the trust in the SKR's memory (`verify_in`), when the SKR is verified.
fn retry_delay(backoff: Duration, verify_in: Option<Duration>) -> Duration {
    verify_in.map_or(backoff, |due| backoff.min(due))
}

/// The delay after `failures` failures in a row: `min * 2^(failures-1)`, capped at `max`,
/// then scaled by a random factor in [0.5, 1.0] so failing SKRs do not retry in lockstep.
pub fn backoff(failures: u32, min: Duration, max: Duration) -> Duration {
    let exp = min.saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(20)));
    let capped = exp.min(max);
    capped.mul_f64(rand::rng().random_range(0.5..=1.0))
}

fn jittered(period: Duration, jitter: f64) -> Duration {
    period + period.mul_f64(rand::rng().random_range(0.0..=jitter))
}

fn record_report(metrics: &Metrics, report: &SyncReport) {
    for kind in CatalogKind::ALL {
        for (op, map) in [
            (ObjectOp::Applied, &report.applied),
            (ObjectOp::Unchanged, &report.unchanged),
            (ObjectOp::Pruned, &report.pruned),
        ] {
            let n = map.get(&kind).copied().unwrap_or(0);
            if n > 0 {
                metrics.sync.synced_objects(kind, op, n);
            }
        }
    }
}

/// Builds the target of one visit to the SKR of `kyma` and runs `work` on it with the SKR's
/// sync state: a sync in active mode, a comparison in shadow mode, where the target never
/// may write.
async fn visit_skr<T>(
    kyma: &Kyma,
    ctx: &Context,
    work: impl AsyncFnOnce(&SkrTarget<'_>, &mut SkrState) -> Result<T>,
) -> Result<T> {
    let name = kyma.name_any();
    let namespace = kyma.namespace().unwrap_or_default();
    let secret = ctx.secrets.find(&name, &namespace)?;
    let entry = ctx.kymas.skr(&name, &secret, &ctx.connector).await?;
    // Built per sync and dropped with it: connections and TLS state last one sync.
    let client = entry.access.client().await?;
    let mut state = entry.state.lock().await;
    let active = ctx.settings.mode == Mode::Active;
    let may_write = || active && ctx.shards.may_write(&namespace, &name);
    let target = SkrTarget {
        client: &client,
        namespace: &ctx.settings.sync_namespace,
        concurrency: ctx.settings.skr_concurrency,
        request_timeout: ctx.settings.skr_request_timeout,
        metrics: &ctx.metrics.skr,
        may_write: &may_write,
        full_lists: &ctx.full_lists,
        applies: &ctx.applies,
        trust_memory_for: ctx.settings.resync_period,
    };
    work(&target, &mut state).await
}

/// Writes the `ModuleCatalog` condition when it differs from the cached one and no other
/// field manager keeps applying it (`contested`, [`condition::contested_by`]). Returns
/// whether it wrote.
async fn write_condition(kyma: &Kyma, wanted: &Wanted, contested: bool, ctx: &Context) -> Result<bool> {
    let current = condition::current(kyma);
    // Another manager keeps applying it: writing would start a war (counted and reported
    // once, when the reconcile began).
    if condition::is_current(current, wanted) || contested {
        return Ok(false);
    }
    let body = condition::apply_body(kyma, current, wanted, Timestamp::now());
    let api: Api<Kyma> = Api::namespaced(ctx.kcp.clone(), &kyma.namespace().unwrap_or_default());
    let (name, params, patch) = (kyma.name_any(), PatchParams::apply(KCP_FIELD_MANAGER).force(), Patch::Apply(&body));
    crate::kcp::bounded(ctx.settings.kcp_request_timeout, api.patch_status(&name, &params, &patch))
        .await
        .map_err(|e| SyncError::WriteCondition(Box::new(e)))?;
    ctx.metrics.sync.condition_written(wanted.status);
    info!(
        condition = MODULE_CATALOG_CONDITION,
        status = wanted.status.as_str(),
        reason = wanted.reason.as_str(),
        "Updated Kyma condition"
    );
    Ok(true)
}

/// Gives up catalogsync's share of a condition another manager keeps applying (one status
/// apply without it). A failure is logged; the next reconcile tries again.
async fn release_condition(kyma: &Kyma, ctx: &Context) {
    let api: Api<Kyma> = Api::namespaced(ctx.kcp.clone(), &kyma.namespace().unwrap_or_default());
    let (name, body) = (kyma.name_any(), condition::release_body(kyma));
    let (params, patch) = (PatchParams::apply(KCP_FIELD_MANAGER).force(), Patch::Apply(&body));
    let release = api.patch_status(&name, &params, &patch);
    match crate::kcp::bounded(ctx.settings.kcp_request_timeout, release).await {
        Ok(_) => info!(condition = MODULE_CATALOG_CONDITION, "Gave up catalogsync's share of the condition"),
        Err(error) => {
            warn!(error = &error as &dyn std::error::Error, "Failed to give up catalogsync's share of the condition");
        }
    }
}

async fn publish_event(kyma: &Kyma, wanted: &Wanted, ctx: &Context) {
    let event = Event {
        type_: EventType::Warning,
        reason: wanted.reason.as_str().to_owned(),
        note: Some(wanted.message.chars().take(1000).collect()),
        action: "SyncModuleCatalog".into(),
        secondary: None,
    };
    let regarding = kyma.object_ref(&());
    let publish = crate::kcp::bounded(ctx.settings.kcp_request_timeout, ctx.recorder.publish(&event, &regarding));
    if let Err(error) = publish.await {
        warn!(error = &error as &dyn std::error::Error, "Failed to publish event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let min = Duration::from_secs(5);
        let max = Duration::from_secs(300);
        for _ in 0..100 {
            let first = backoff(1, min, max);
            assert!(first >= Duration::from_millis(2500) && first <= min, "{first:?}");
            let late = backoff(30, min, max);
            assert!(late >= Duration::from_secs(150) && late <= max, "{late:?}");
        }
        assert!(backoff(3, min, max) <= Duration::from_secs(20));
    }

    #[test]
    fn a_retry_comes_no_later_than_the_end_of_the_trust_in_the_skr() {
        let (backoff, due) = (Duration::from_secs(300), Duration::from_secs(12));
        assert_eq!(retry_delay(backoff, Some(due)), due, "a verified SKR is listed again when its trust ends");
        assert_eq!(retry_delay(backoff, None), backoff, "an SKR not verified waits for the backoff");
        assert_eq!(retry_delay(Duration::from_secs(5), Some(due)), Duration::from_secs(5));
    }

    #[test]
    fn trim_keeps_only_what_the_controller_reads() {
        let mut k = Kyma::new("k", Default::default());
        k.metadata.labels = Some([("a".to_owned(), "b".to_owned()), ("id".to_owned(), "x".repeat(36))].into());
        k.metadata.annotations = Some([("big".to_owned(), "x".repeat(1000))].into());
        k.metadata.finalizers = Some(vec!["operator.kyma-project.io/Kyma".into()]);
        k.metadata.uid = Some("u".into());
        k.metadata.generation = Some(3);
        k.spec.channel = Some("regular".into());
        k.status = Some(crate::api::KymaStatus { state: Some("Ready".into()), ..Default::default() });
        trim(&mut k, &["a".to_owned(), "z".to_owned()].into());
        assert!(k.metadata.annotations.is_none());
        assert!(k.metadata.finalizers.is_none());
        assert_eq!((k.metadata.uid.as_deref(), k.metadata.generation), (Some("u"), Some(3)));
        assert_eq!(k.spec, Default::default());
        assert_eq!(k.status, Some(Default::default()));
        assert_eq!(
            k.labels(),
            &std::collections::BTreeMap::from([("a".to_owned(), "b".to_owned())]),
            "only the wanted keys"
        );
    }

    #[test]
    fn skip_rules() {
        let mut k = Kyma::new("k", Default::default());
        assert_eq!(skip_reason(&k), None);
        k.metadata.labels = Some([(SKIP_RECONCILIATION_LABEL.to_owned(), "TRUE".to_owned())].into());
        assert_eq!(skip_reason(&k).map(SkipReason::as_str), Some("skip_reconciliation"));
        k.metadata.labels = None;
        k.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
        assert_eq!(skip_reason(&k).map(SkipReason::as_str), Some("deleting"));
    }
}
