//! The catalog publisher: from the KCP catalog stores (ModuleTemplates, ModuleReleaseMetas and
//! their CRDs, filled by [`crate::watches::catalog`]), rebuilds the
//! [`Snapshot`](crate::catalog::Snapshot) after a burst of changes has settled, publishes it,
//! and requeues exactly the owned Kymas whose desired catalog changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::api::Kyma;
use crate::catalog::{CatalogKind, Warning, WarningReason};
use crate::metrics::Metrics;
use crate::sharding::ShardView;
use crate::sync::guard::{Gate, ShrinkGuard};
use crate::sync::kymas::KymaRecords;
use crate::sync::label_keys::KymaLabelKeys;
use crate::sync::state::{CatalogState, CatalogStores, sync_fingerprint};

/// What the publisher reads and writes of the rest of the replica: the ownership gate, the
/// per-Kyma records (to requeue only owned Kymas whose synced catalog changed), the metrics, and
/// the two settings a catalog state depends on.
#[derive(Clone)]
pub struct PublisherContext {
    /// The ownership gate.
    pub view: ShardView,
    /// What is known of each Kyma.
    pub kymas: Arc<KymaRecords>,
    /// Metrics.
    pub metrics: Metrics,
    /// `--restricted-modules`.
    pub restricted_modules: BTreeSet<String>,
    /// The shrink guard applied before a state is published (`None`: every state is).
    pub guard: Option<ShrinkGuard>,
    /// `--catalog-debounce`.
    pub debounce: Duration,
    /// Which labels the Kyma cache keeps: grown by the keys each published state's selectors
    /// read.
    pub label_keys: KymaLabelKeys,
}

/// Rebuilds the catalog state after each settled burst of changes, publishes it, and sends
/// the owned Kymas whose desired set changed to `requeue`. Runs until `changes` ends.
///
/// With a shrink guard (see [`crate::catalog::guard`]) a state that lost too much
/// of the published catalog is held back instead: the published state stays, and the held one
/// is decided again every [`GUARD_RECHECK`](crate::sync::guard::GUARD_RECHECK) (to see a
/// confirmation) and after every further change (the objects may come back).
pub async fn run_catalog_loop(
    mut changes: impl Stream<Item = ()> + Unpin,
    stores: CatalogStores,
    kymas: Store<Kyma>,
    publish: watch::Sender<Arc<CatalogState>>,
    requeue: mpsc::Sender<ObjectRef<Kyma>>,
    ctx: PublisherContext,
) {
    // Publish nothing before every store finished its first list: an empty or partial catalog
    // would make every sync prune. A watch that keeps failing (a missing CRD, a denied list)
    // keeps the replica unready instead.
    {
        let ready = stores.wait_until_ready();
        tokio::pin!(ready);
        loop {
            tokio::select! {
                r = &mut ready => {
                    if r.is_err() {
                        return;
                    }
                    break;
                }
                more = changes.next() => if more.is_none() { return },
            }
        }
    }
    // The first state is decided at once; later ones after their burst of changes settled.
    let mut gate = Gate::new(ctx.guard.clone(), ctx.metrics.catalog.clone(), ctx.restricted_modules.clone());
    let mut first = true;
    loop {
        let state = if std::mem::take(&mut first) {
            stores.state()
        } else {
            match next_wake(&mut changes, ctx.debounce, gate.recheck_at()).await {
                Wake::Ended => return,
                Wake::Changed(mut settled) => {
                    let mut state = stores.state();
                    // A burst the debounce cap cut short that takes objects away (a long
                    // `kubectl delete --all`) is decided once it is over, as a whole: cut
                    // into parts, each part could stay within the shrink threshold.
                    while settled == Settled::Capped && gate.shrinks(&state) {
                        settled = settle(&mut changes, ctx.debounce).await;
                        if settled == Settled::Ended {
                            return;
                        }
                        state = stores.state();
                    }
                    state
                }
                Wake::Recheck => {
                    gate.retry_record().await;
                    // No change arrived since the held state was built: decide it again.
                    match gate.held_state() {
                        Some(held) => held,
                        None => continue,
                    }
                }
            }
        };
        if **publish.borrow() == state {
            gate.restored();
            continue;
        }
        let Some(mut approved) = gate.check(state).await else { continue };
        let state = std::mem::take(&mut approved.state);
        record_catalog(&ctx, &state);
        let state = Arc::new(state);
        // The keys this state's selectors read are wanted before it is published, so a
        // reconcile that sees it can tell whether the Kyma cache keeps them all. When they
        // grew, the Kyma watch lists again, and that list triggers every Kyma whose kept
        // labels changed: the ones the requeue below judges on too few labels.
        if ctx.label_keys.want(state.snapshot.selector_keys()) {
            debug!("The Kyma cache is to keep more labels; the Kyma watch lists with them");
        }
        publish.send_replace(Arc::clone(&state));
        ctx.metrics.catalog.changed();
        let requeued = requeue_affected(&state, &kymas, &requeue, &ctx).await;
        info!(
            templates = state.snapshot.templates.len(),
            release_metas = state.snapshot.release_metas.len(),
            requeued,
            "Catalog changed"
        );
        gate.published(approved).await;
    }
}

/// Why the catalog loop woke up.
enum Wake {
    /// A burst of changes settled (quiet or capped).
    Changed(Settled),
    /// `recheck` passed without a change.
    Recheck,
    /// The changes ended.
    Ended,
}

/// Waits for the next change or until `recheck`, whichever comes first; after a change,
/// [`settle`]s the burst. A recheck never cuts a burst short.
async fn next_wake(
    changes: &mut (impl Stream<Item = ()> + Unpin),
    debounce: Duration,
    recheck: Option<tokio::time::Instant>,
) -> Wake {
    let first = match recheck {
        Some(at) => tokio::select! {
            more = changes.next() => more,
            () = tokio::time::sleep_until(at) => return Wake::Recheck,
        },
        None => changes.next().await,
    };
    if first.is_none() {
        return Wake::Ended;
    }
    match settle(changes, debounce).await {
        Settled::Ended => Wake::Ended,
        settled => Wake::Changed(settled),
    }
}

/// How a burst of changes ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// No change came for a debounce period.
    Quiet,
    /// Changes kept coming for [`MAX_DEBOUNCE_FACTOR`] debounce periods.
    Capped,
    /// The changes ended.
    Ended,
}

/// After a change, waits until no change came for `debounce`, at most [`MAX_DEBOUNCE_FACTOR`]
/// debounce periods.
async fn settle(changes: &mut (impl Stream<Item = ()> + Unpin), debounce: Duration) -> Settled {
    let deadline = tokio::time::Instant::now() + debounce * MAX_DEBOUNCE_FACTOR;
    loop {
        tokio::select! {
            more = changes.next() => if more.is_none() { return Settled::Ended },
            () = tokio::time::sleep(debounce) => return Settled::Quiet,
        }
        if tokio::time::Instant::now() >= deadline {
            return Settled::Capped;
        }
    }
}

/// A burst never delays a rebuild by more than this many debounce periods.
const MAX_DEBOUNCE_FACTOR: u32 = 5;

fn record_catalog(ctx: &PublisherContext, state: &CatalogState) {
    let m = &ctx.metrics.catalog;
    let snap = &state.snapshot;
    m.objects(CatalogKind::ModuleTemplate, snap.templates.len());
    m.objects(CatalogKind::ModuleReleaseMeta, snap.release_metas.len());
    for kind in CatalogKind::ALL {
        m.malformed(kind, snap.malformed.iter().filter(|b| b.kind == kind).count());
    }
    for bad in &snap.malformed {
        warn!(kind = bad.kind.as_str(), name = %bad.name, reason = %bad.reason, "Skipping malformed catalog object");
    }
    m.old_style_templates(snap.unnamed_templates.len());
    if !snap.unnamed_templates.is_empty() {
        debug!(
            count = snap.unnamed_templates.len(),
            "Leaving out old-style ModuleTemplates (no spec.moduleName), as lifecycle-manager does"
        );
    }
    // Selector warnings do not depend on the Kyma (an invalid selector is never matched), so
    // one evaluation reports them all.
    let unlabelled = state.desired(&BTreeMap::new(), &ctx.restricted_modules);
    for &reason in WarningReason::ALL {
        m.skipped_release_metas(reason, unlabelled.warnings.iter().filter(|w| w.reason() == reason).count());
    }
    for w in &unlabelled.warnings {
        match w {
            Warning::SelectorOnUnrestrictedModule { release_meta } => {
                warn!(%release_meta, "Skipping ModuleReleaseMeta: it has a kymaSelector but its module is not restricted");
            }
            Warning::InvalidSelector { release_meta, reason } => {
                warn!(%release_meta, %reason, "Skipping ModuleReleaseMeta: its kymaSelector is invalid");
            }
        }
    }
}

async fn requeue_affected(
    state: &CatalogState,
    kymas: &Store<Kyma>,
    requeue: &mpsc::Sender<ObjectRef<Kyma>>,
    ctx: &PublisherContext,
) -> usize {
    let mut n = 0;
    for kyma in kymas.state() {
        let name = kyma.name_any();
        let namespace = kyma.namespace().unwrap_or_default();
        if !ctx.view.owns(&namespace, &name) {
            continue;
        }
        let desired = state.desired(kyma.labels(), &ctx.restricted_modules);
        if ctx.kymas.synced_fingerprint(&name) == Some(sync_fingerprint(&desired, state)) {
            continue;
        }
        ctx.kymas.mark_pending(&name, ctx.view.shard_of(&namespace, &name));
        if requeue.send(ObjectRef::from_obj(&*kyma)).await.is_err() {
            return n;
        }
        n += 1;
    }
    ctx.metrics.catalog.requeued(n);
    n
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::channel::mpsc::{UnboundedSender, unbounded};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::runtime::reflector;
    use tokio::time::Instant;

    use super::*;
    use crate::fixtures::SYNC_NAMESPACE;
    use crate::sync::state::EntryWriter;

    const DEBOUNCE: Duration = Duration::from_millis(500);

    /// Sends a change every `every`, `n` times, starting after `every`.
    fn changes_every(tx: UnboundedSender<()>, every: Duration, n: usize) {
        tokio::spawn(async move {
            for _ in 0..n {
                tokio::time::sleep(every).await;
                let _ = tx.unbounded_send(());
            }
            // Keep the stream open: the test decides when it ends.
            std::future::pending::<()>().await;
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_settles_when_it_has_been_quiet_for_a_debounce_period() {
        let (tx, mut rx) = unbounded();
        tx.unbounded_send(()).expect("send");
        changes_every(tx, Duration::from_millis(100), 3);
        let start = Instant::now();
        assert!(matches!(next_wake(&mut rx, DEBOUNCE, None).await, Wake::Changed(Settled::Quiet)));
        assert_eq!(start.elapsed(), Duration::from_millis(300) + DEBOUNCE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_that_goes_on_is_cut_after_five_debounce_periods() {
        let (tx, mut rx) = unbounded();
        tx.unbounded_send(()).expect("send");
        changes_every(tx, Duration::from_millis(100), 1000);
        let start = Instant::now();
        assert!(matches!(next_wake(&mut rx, DEBOUNCE, None).await, Wake::Changed(Settled::Capped)));
        assert_eq!(start.elapsed(), DEBOUNCE * MAX_DEBOUNCE_FACTOR);
        // Waiting on for the end of the burst: still going, cut again.
        assert_eq!(settle(&mut rx, DEBOUNCE).await, Settled::Capped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_wakes_the_loop_without_a_change() {
        let (_tx, mut rx) = unbounded::<()>();
        let at = Instant::now() + Duration::from_secs(2);
        assert!(matches!(next_wake(&mut rx, DEBOUNCE, Some(at)).await, Wake::Recheck));
        assert_eq!(Instant::now(), at);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_never_cuts_a_burst_short() {
        let (tx, mut rx) = unbounded();
        // The first change comes before the recheck, the burst goes on past it.
        changes_every(tx, Duration::from_millis(300), 5);
        let start = Instant::now();
        let wake = next_wake(&mut rx, DEBOUNCE, Some(start + Duration::from_millis(400))).await;
        assert!(matches!(wake, Wake::Changed(Settled::Quiet)));
        assert_eq!(start.elapsed(), Duration::from_millis(1500) + DEBOUNCE);
    }

    /// What the loop sees of a replica: no KCP at all, no shrink guard.
    fn offline_context() -> PublisherContext {
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        PublisherContext {
            view: crate::sharding::ShardView::single_replica(),
            kymas: Arc::new(KymaRecords::new(metrics.sync.clone(), metrics.skr.clone())),
            metrics,
            restricted_modules: BTreeSet::new(),
            guard: None,
            debounce: DEBOUNCE,
            label_keys: KymaLabelKeys::new(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn changes_within_the_debounce_window_publish_once_after_it() {
        use crate::fixtures::{MrmBuilder, MtBuilder};
        use kube::runtime::watcher::Event;

        // Catalog stores, listed (empty) as a watch would.
        let (mut templates, template_store) = EntryWriter::new(CatalogKind::ModuleTemplate, SYNC_NAMESPACE);
        let (mut release_metas, release_meta_store) = EntryWriter::new(CatalogKind::ModuleReleaseMeta, SYNC_NAMESPACE);
        let mut crd_writers: Vec<reflector::store::Writer<CustomResourceDefinition>> =
            (0..2).map(|_| reflector::store::Writer::default()).collect();
        for writer in [&mut templates, &mut release_metas] {
            writer.apply(&Event::Init);
            writer.apply(&Event::InitDone);
        }
        for writer in &mut crd_writers {
            writer.apply_watcher_event(&Event::Init);
            writer.apply_watcher_event(&Event::InitDone);
        }
        let stores = CatalogStores {
            templates: template_store,
            release_metas: release_meta_store,
            crds: crd_writers.iter().map(reflector::store::Writer::as_reader).collect(),
        };
        let (kymas, _kyma_writer) = reflector::store::<Kyma>();
        let (publish, mut published) = watch::channel(Arc::new(CatalogState::default()));
        let (requeue, _requeued) = mpsc::channel(16);
        let (tx, rx) = unbounded();
        tokio::spawn(run_catalog_loop(rx, stores, kymas, publish, requeue, offline_context()));

        // The first state (the empty catalog) is published at once.
        let start = Instant::now();
        published.changed().await.expect("a first state");
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(published.borrow_and_update().snapshot.templates.is_empty());

        // Three changes, 100 ms apart: within the debounce window of each other.
        let changes = [
            MtBuilder::new("btp", "1.0.0").build(),
            MtBuilder::new("btp", "1.1.0").build(),
            MrmBuilder::new("btp").channel("regular", "1.1.0").channel("fast", "1.0.0").build(),
        ];
        let burst = Instant::now();
        for (i, object) in changes.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let writer = if i < 2 { &mut templates } else { &mut release_metas };
            writer.apply(&Event::Apply(object.clone()));
            tx.unbounded_send(()).expect("the loop runs");
        }

        // One publish, a debounce period after the last change, with all three.
        published.changed().await.expect("a second state");
        assert_eq!(burst.elapsed(), Duration::from_millis(200) + DEBOUNCE);
        {
            let state = published.borrow_and_update();
            assert_eq!(state.snapshot.templates.len(), 2);
            assert_eq!(state.snapshot.release_metas.len(), 1);
        }
        // And nothing more.
        let more = tokio::time::timeout(Duration::from_secs(60), published.changed()).await;
        assert!(more.is_err(), "published again without a change");
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_ends_with_its_changes() {
        let (tx, mut rx) = unbounded::<()>();
        drop(tx);
        assert!(matches!(next_wake(&mut rx, DEBOUNCE, None).await, Wake::Ended));
    }
}
