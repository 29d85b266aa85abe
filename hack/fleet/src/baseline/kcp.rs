//! The KCP side of the baseline: the client, and the reflectors KLM's caches correspond to
//! (the catalog with a snapshot rebuilt after each change, the access Secrets, the CRDs, the
//! Kymas with KLM's event filter). No pass reads from the KCP; only `--reconcile full` and
//! `without-catalog` write to it.

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, Result};
use catalogsync::api::{KYMA_NAME_LABEL, Kyma};
use catalogsync::catalog::{CatalogKind, Snapshot};
use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Client, ResourceExt};
use tracing::warn;

use super::lock;

/// The KCP client, from `kubeconfig` or inferred.
///
/// # Errors
/// Fails when the kubeconfig cannot be read or no client can be built from it.
pub(super) async fn kcp_client(kubeconfig: Option<&Path>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).with_context(|| format!("failed to read {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .context("failed to load the KCP kubeconfig")?
        }
        None => kube::Config::infer().await.context("failed to infer the KCP config")?,
    };
    Client::try_from(config).context("failed to build the KCP client")
}

/// The KCP catalog reflectors and the snapshot built from them, rebuilt lazily after a change.
pub(super) struct Catalog {
    /// ModuleTemplates.
    pub templates: Store<DynamicObject>,
    /// ModuleReleaseMetas.
    pub release_metas: Store<DynamicObject>,
    /// Bumped after every catalog watch event (the store is updated before).
    generation: Arc<AtomicU64>,
    /// The snapshot and the generation it was built at.
    cached: Mutex<Option<(u64, Arc<Snapshot>)>>,
}

impl Catalog {
    /// The snapshot of the current catalog (built at most once per catalog change).
    pub fn snapshot(&self, sync_namespace: &str) -> Arc<Snapshot> {
        let mut cached = lock(&self.cached);
        let generation = self.generation.load(Ordering::Acquire);
        if let Some((built_at, snapshot)) = cached.as_ref()
            && *built_at == generation
        {
            return snapshot.clone();
        }
        let templates = self.templates.state();
        let release_metas = self.release_metas.state();
        let snapshot = Arc::new(Snapshot::build(
            templates.iter().map(AsRef::as_ref),
            release_metas.iter().map(AsRef::as_ref),
            sync_namespace,
        ));
        if !snapshot.malformed.is_empty() {
            warn!(malformed = snapshot.malformed.len(), "Some KCP catalog objects do not parse; left out");
        }
        *cached = Some((generation, snapshot.clone()));
        snapshot
    }
}

/// Starts the MT and MRM reflectors (managedFields stripped: KLM's copy clears them anyway).
pub(super) fn watch_catalog(kcp: &Client, namespace: &str) -> (Catalog, tokio::task::JoinHandle<()>) {
    let generation = Arc::new(AtomicU64::new(0));
    let (templates, mts) = watch_kind(kcp, namespace, CatalogKind::ModuleTemplate.api_resource(), generation.clone());
    let (release_metas, mrms) =
        watch_kind(kcp, namespace, CatalogKind::ModuleReleaseMeta.api_resource(), generation.clone());
    let task = tokio::spawn(async move {
        future::join(mts, mrms).await;
    });
    (Catalog { templates, release_metas, generation, cached: Mutex::new(None) }, task)
}

/// One catalog reflector; `generation` is bumped after each event.
fn watch_kind(
    kcp: &Client,
    namespace: &str,
    ar: ApiResource,
    generation: Arc<AtomicU64>,
) -> (Store<DynamicObject>, impl Future<Output = ()> + Send + 'static) {
    let writer = reflector::store::Writer::new(ar.clone());
    let store = writer.as_reader();
    let stream =
        watcher(Api::<DynamicObject>::namespaced_with(kcp.clone(), namespace, &ar), watcher::Config::default())
            .default_backoff()
            .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None)
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    Ok(_) => {
                        generation.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(error) => warn!(error = &error as &dyn std::error::Error, "Catalog watch failed; retrying"),
                }
                future::ready(())
            });
    (store, stream)
}

/// Starts the reflector of the access Secrets (full objects: KLM's Secret cache holds them).
pub(super) fn watch_secrets(kcp: &Client, namespace: &str) -> (Store<Secret>, tokio::task::JoinHandle<()>) {
    let config = watcher::Config::default().labels(KYMA_NAME_LABEL);
    reflect(Api::namespaced(kcp.clone(), namespace), config, "secrets")
}

/// Starts the reflector of the KCP's CRDs: KLM reads the three it copies to the SKRs through
/// its cached client.
pub(super) fn watch_crds(kcp: &Client) -> (Store<CustomResourceDefinition>, tokio::task::JoinHandle<()>) {
    reflect(Api::all(kcp.clone()), watcher::Config::default(), "customresourcedefinitions")
}

/// A reflector of `api` with managedFields stripped, its watch retried with backoff.
fn reflect<K>(api: Api<K>, config: watcher::Config, what: &'static str) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::<K>::default();
    let store = writer.as_reader();
    let stream =
        watcher(api, config).default_backoff().modify(|o| o.meta_mut().managed_fields = None).reflect(writer).for_each(
            move |event| {
                if let Err(error) = event {
                    warn!(watch = what, error = &error as &dyn std::error::Error, "KCP watch failed; retrying");
                }
                future::ready(())
            },
        );
    (store, tokio::spawn(stream))
}

/// The Kyma reflector and its events as KLM's Kyma watch passes them on: generation and label
/// changes only (status writes never); the initial list yields every Kyma in list order. The
/// stream must be polled for the store to fill.
pub(super) fn watch_kymas(
    kcp: &Client,
    namespace: &str,
) -> (Store<Kyma>, impl Stream<Item = Result<Kyma, watcher::Error>> + Send + 'static) {
    let writer = reflector::store::Writer::<Kyma>::default();
    let store = writer.as_reader();
    let events = watcher(Api::<Kyma>::namespaced(kcp.clone(), namespace), watcher::Config::default())
        .default_backoff()
        .modify(trim_kyma)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(trigger_hash, PredicateConfig::default());
    (store, events)
}

/// Keeps only what a pass reads of a Kyma (labels, finalizers, identity, generation, and the
/// spec a new SKR Kyma gets). Not catalogsync's `sync::reconciler::trim`: that one keeps the
/// `ModuleCatalog` condition catalogsync reads, which a KLM pass rewrites without reading.
fn trim_kyma(kyma: &mut Kyma) {
    kyma.metadata.managed_fields = None;
    kyma.metadata.annotations = None;
    kyma.status = None;
}

/// KLM's Kyma event filter: generation or label changes (plus identity). Not catalogsync's
/// `sync::reconciler::trigger_hash`, which leaves generation out: KLM's generation predicate
/// also passes spec changes on, which catalogsync does not react to.
fn trigger_hash(kyma: &Kyma) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    kyma.metadata.uid.hash(&mut h);
    kyma.metadata.generation.hash(&mut h);
    kyma.metadata.labels.hash(&mut h);
    Some(h.finish())
}

/// The work-queue key of a Kyma: `<namespace>/<name>`.
pub(super) fn key_of(kyma: &Kyma) -> String {
    format!("{}/{}", kyma.namespace().unwrap_or_default(), kyma.name_any())
}
