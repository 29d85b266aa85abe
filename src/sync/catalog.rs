//! Watches the KCP catalog (ModuleTemplates, ModuleReleaseMetas and their CRDs), rebuilds
//! the [`Snapshot`] after a burst of changes has settled, and requeues exactly the owned
//! Kymas whose desired catalog changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::api::Kyma;
use crate::catalog::{CatalogKind, Desired, DesiredSets, Snapshot, Warning, WarningReason};
use crate::sync::executor::{SkrCrds, skr_crd_names};
use crate::sync::guard::{Gate, ShrinkGuard};
use crate::sync::reconciler::Context;

/// What every sync reads: the catalog snapshot and the SKR CRDs.
#[derive(Debug, Clone, Default)]
pub struct CatalogState {
    /// The catalog.
    pub snapshot: Snapshot,
    /// The CRDs to ensure in SKRs.
    pub crds: SkrCrds,
    /// Whether this state was built from fully listed stores (the initial value is not).
    pub published: bool,
    /// The desired sets of `snapshot`, computed as Kymas ask for them.
    desired: Arc<DesiredSets>,
}

impl PartialEq for CatalogState {
    /// Equal catalogs; the desired sets follow from the snapshot.
    fn eq(&self, other: &Self) -> bool {
        self.snapshot == other.snapshot && self.crds == other.crds && self.published == other.published
    }
}

impl CatalogState {
    /// A state built from fully listed stores: `snapshot` and `crds`.
    pub fn published(snapshot: Snapshot, crds: SkrCrds) -> Self {
        Self { snapshot, crds, published: true, desired: Arc::default() }
    }

    /// The desired set of a Kyma with `kyma_labels`, shared with every Kyma of the same
    /// [`Profile`](crate::catalog::Profile).
    pub fn desired(
        &self,
        kyma_labels: &BTreeMap<String, String>,
        restricted_modules: &BTreeSet<String>,
    ) -> Arc<Desired> {
        self.desired.get(&self.snapshot, kyma_labels, restricted_modules)
    }
}

/// What a successful sync of an SKR established: its desired set and the CRDs. A Kyma whose
/// fingerprint under a new catalog differs from the one last synced needs a sync.
pub fn sync_fingerprint(desired: &Desired, state: &CatalogState) -> u64 {
    desired.fingerprint ^ state.crds.hash.rotate_left(1)
}

/// The KCP stores the catalog is built from.
#[derive(Clone)]
pub struct CatalogStores {
    /// ModuleTemplates.
    pub templates: Store<DynamicObject>,
    /// ModuleReleaseMetas.
    pub release_metas: Store<DynamicObject>,
    /// The two catalog CRDs, one store each (each is watched by name, and a watcher's
    /// re-list replaces the whole content of its store).
    pub crds: Vec<Store<CustomResourceDefinition>>,
    /// The shrink guard the catalog loop applies before it publishes a state (`None`: every
    /// state is published).
    pub guard: Option<ShrinkGuard>,
}

impl CatalogStores {
    /// These stores with `guard`: the catalog loop holds back a state that lost more than the
    /// guard's threshold of the published catalog (see [`crate::catalog::guard`]).
    pub fn with_shrink_guard(mut self, guard: ShrinkGuard) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Waits until every store has finished its first list.
    ///
    /// # Errors
    /// Fails when a store's writer was dropped before it became ready.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        // Only this function waits on these stores, so each readiness signal has one waiter.
        self.templates.wait_until_ready().await?;
        self.release_metas.wait_until_ready().await?;
        for store in &self.crds {
            store.wait_until_ready().await?;
        }
        Ok(())
    }

    /// Builds the current catalog state.
    pub fn state(&self, sync_namespace: &str) -> CatalogState {
        let mts = self.templates.state();
        let mrms = self.release_metas.state();
        let snapshot = Snapshot::build(mts.iter().map(AsRef::as_ref), mrms.iter().map(AsRef::as_ref), sync_namespace);
        let crds: Vec<Arc<CustomResourceDefinition>> = self.crds.iter().flat_map(Store::state).collect();
        let found: BTreeMap<String, Option<CustomResourceDefinition>> = skr_crd_names()
            .into_iter()
            .map(|name| {
                let crd = crds.iter().find(|c| c.name_any() == name).map(|c| (**c).clone());
                (name, crd)
            })
            .collect();
        CatalogState::published(snapshot, SkrCrds::from_kcp(found))
    }
}

/// Starts the KCP watches of the catalog. Returns the stores and one stream that yields
/// `()` per change; the stream must be polled for the stores to fill.
pub fn watch_catalog(kcp: &Client, namespace: &str) -> (CatalogStores, impl Stream<Item = ()> + Send + 'static) {
    let strip = |o: &mut DynamicObject| o.metadata.managed_fields = None;
    let mt_ar = CatalogKind::ModuleTemplate.api_resource();
    let mrm_ar = CatalogKind::ModuleReleaseMeta.api_resource();
    let mt_writer = reflector::store::Writer::new(mt_ar.clone());
    let mt_store = mt_writer.as_reader();
    let mrm_writer = reflector::store::Writer::new(mrm_ar.clone());
    let mrm_store = mrm_writer.as_reader();
    let mts =
        watcher(Api::<DynamicObject>::namespaced_with(kcp.clone(), namespace, &mt_ar), watcher::Config::default())
            .default_backoff()
            .modify(strip)
            .reflect(mt_writer)
            .map(|_| ());
    let mrms =
        watcher(Api::<DynamicObject>::namespaced_with(kcp.clone(), namespace, &mrm_ar), watcher::Config::default())
            .default_backoff()
            .modify(strip)
            .reflect(mrm_writer)
            .map(|_| ());
    let crd_api: Api<CustomResourceDefinition> = Api::all(kcp.clone());
    let mut crd_stores = Vec::new();
    let crd_streams = skr_crd_names().map(|name| {
        let (store, writer) = reflector::store();
        crd_stores.push(store);
        watcher(crd_api.clone(), watcher::Config::default().fields(&format!("metadata.name={name}")))
            .default_backoff()
            .modify(|c: &mut CustomResourceDefinition| {
                c.metadata.managed_fields = None;
                c.status = None;
            })
            .reflect(writer)
            .map(|_| ())
            .boxed()
    });
    let crds = stream::select_all(crd_streams);
    let changes = stream::select(stream::select(mts, mrms), crds);
    (CatalogStores { templates: mt_store, release_metas: mrm_store, crds: crd_stores, guard: None }, changes)
}

/// Rebuilds the catalog state after each settled burst of changes, publishes it, and sends
/// the owned Kymas whose desired set changed to `requeue`. Runs until `changes` ends.
///
/// With a shrink guard (see [`CatalogStores::with_shrink_guard`]) a state that lost too much
/// of the published catalog is held back instead: the published state stays, and the held one
/// is decided again every [`GUARD_RECHECK`](crate::sync::guard::GUARD_RECHECK) (to see a
/// confirmation) and after every further change (the objects may come back).
pub async fn run_catalog_loop(
    mut changes: impl Stream<Item = ()> + Unpin,
    stores: CatalogStores,
    kymas: Store<Kyma>,
    publish: watch::Sender<Arc<CatalogState>>,
    requeue: mpsc::Sender<ObjectRef<Kyma>>,
    ctx: Arc<Context>,
    debounce: Duration,
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
    let mut gate =
        Gate::new(stores.guard.clone(), ctx.metrics.catalog.clone(), ctx.settings.restricted_modules.clone());
    let mut first = true;
    loop {
        let state = if std::mem::take(&mut first) {
            stores.state(&ctx.settings.sync_namespace)
        } else {
            match next_wake(&mut changes, debounce, gate.recheck_at()).await {
                Wake::Ended => return,
                Wake::Changed(mut settled) => {
                    let mut state = stores.state(&ctx.settings.sync_namespace);
                    // A burst the debounce cap cut short that takes objects away (a long
                    // `kubectl delete --all`) is decided once it is over, as a whole: cut
                    // into parts, each part could stay within the shrink threshold.
                    while settled == Settled::Capped && gate.shrinks(&state) {
                        settled = settle(&mut changes, debounce).await;
                        if settled == Settled::Ended {
                            return;
                        }
                        state = stores.state(&ctx.settings.sync_namespace);
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

fn record_catalog(ctx: &Context, state: &CatalogState) {
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
    // Selector warnings do not depend on the Kyma (an invalid selector is never matched), so
    // one evaluation reports them all.
    let unlabelled = state.desired(&BTreeMap::new(), &ctx.settings.restricted_modules);
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
    ctx: &Context,
) -> usize {
    let mut n = 0;
    for kyma in kymas.state() {
        let name = kyma.name_any();
        let namespace = kyma.namespace().unwrap_or_default();
        if !ctx.shards.owns(&namespace, &name) {
            continue;
        }
        let desired = state.desired(kyma.labels(), &ctx.settings.restricted_modules);
        if ctx.book.synced_fingerprint(&name) == Some(sync_fingerprint(&desired, state)) {
            continue;
        }
        let depth = ctx.book.mark_pending(&name, ctx.shards.shard_of(&namespace, &name));
        crate::sync::reconciler::set_depth(ctx, Some(depth));
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
    use tokio::time::Instant;

    use super::*;

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

    /// A context whose KCP client answers nothing: the catalog loop without a shrink guard
    /// makes no KCP request.
    fn offline_context(catalog: watch::Receiver<Arc<CatalogState>>) -> Arc<Context> {
        use kube::runtime::events::{Recorder, Reporter};

        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("no KCP in this test"))
        });
        let kcp = Client::new(service, "default");
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let settings = crate::sync::reconciler::Settings {
            sync_namespace: crate::fixtures::SYNC_NAMESPACE.to_owned(),
            restricted_modules: BTreeSet::new(),
            resync_period: Duration::from_secs(600),
            resync_jitter: 0.1,
            skr_concurrency: 4,
            skr_request_timeout: Duration::from_secs(3),
            sync_timeout: Duration::from_secs(60),
            backoff_min: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
            kcp_request_timeout: Duration::from_secs(5),
        };
        let (secrets, _) = reflector::store();
        Arc::new(Context {
            pool: crate::skr::SkrPool::new(
                kcp.clone(),
                crate::fixtures::KCP_NAMESPACE.to_owned(),
                crate::skr::access::AccessSettings::new("catalogsync/test", Duration::from_secs(5)),
                Duration::from_secs(5),
                metrics.skr.clone(),
            ),
            recorder: Recorder::new(kcp.clone(), Reporter { controller: "catalogsync".into(), instance: None }),
            kcp,
            settings,
            metrics,
            catalog,
            secrets: crate::skr::AccessSecrets::new(secrets),
            shards: crate::sharding::ShardView::single_replica(),
            full_lists: tokio::sync::Semaphore::new(1),
            book: crate::sync::reconciler::Book::default(),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn changes_within_the_debounce_window_publish_once_after_it() {
        use crate::fixtures::{MrmBuilder, MtBuilder};
        use kube::runtime::watcher::Event;

        // Catalog stores, listed (empty) as a watch would.
        let mut templates = reflector::store::Writer::new(CatalogKind::ModuleTemplate.api_resource());
        let mut release_metas = reflector::store::Writer::new(CatalogKind::ModuleReleaseMeta.api_resource());
        let mut crd_writers: Vec<reflector::store::Writer<CustomResourceDefinition>> =
            (0..2).map(|_| reflector::store::Writer::default()).collect();
        for writer in [&mut templates, &mut release_metas] {
            writer.apply_watcher_event(&Event::Init);
            writer.apply_watcher_event(&Event::InitDone);
        }
        for writer in &mut crd_writers {
            writer.apply_watcher_event(&Event::Init);
            writer.apply_watcher_event(&Event::InitDone);
        }
        let stores = CatalogStores {
            templates: templates.as_reader(),
            release_metas: release_metas.as_reader(),
            crds: crd_writers.iter().map(reflector::store::Writer::as_reader).collect(),
            guard: None,
        };
        let (kymas, _kyma_writer) = reflector::store::<Kyma>();
        let (publish, mut published) = watch::channel(Arc::new(CatalogState::default()));
        let (requeue, _requeued) = mpsc::channel(16);
        let ctx = offline_context(publish.subscribe());
        let (tx, rx) = unbounded();
        tokio::spawn(run_catalog_loop(rx, stores, kymas, publish, requeue, ctx, DEBOUNCE));

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
            writer.apply_watcher_event(&Event::Apply(object.clone()));
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
