//! The KCP watches of a replica: Kymas, access Secrets, Leases and the catalog. Each function
//! returns what the rest of the replica reads (a store, an index) and the stream that fills it;
//! the stream must be polled for the store to fill, and the caller decides where.

use std::sync::{Arc, Mutex, PoisonError};

use futures::{Stream, StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::warn;

use crate::api::{KYMA_NAME_LABEL, Kyma, LEASE_TYPE_LABEL};
use crate::catalog::CatalogKind;
use crate::skr::AccessSecrets;
use crate::sync::executor::skr_crd_names;
use crate::sync::label_keys::{Keys, KymaLabelKeys};
use crate::sync::reconciler;
use crate::sync::state::{CatalogStores, EntryWriter};

/// The Kymas of `namespace`, for the store `writer` fills: the stream of Kymas whose trigger
/// fields changed ([`reconciler::trigger_hash`]), which drives the controller. Each Kyma is
/// trimmed to what the controller reads, of its labels those `label_keys` wants
/// ([`label_keys`](crate::sync::label_keys)); the watch starts once keys are wanted and lists
/// again whenever they grow, and `label_keys` hears when a list is complete. `on_delete` hears
/// of every deleted Kyma: deletes never reach the controller, and a Kyma deleted without
/// finalizers shows no deletionTimestamp first.
pub fn kymas(
    kcp: &Client,
    namespace: &str,
    writer: reflector::store::Writer<Kyma>,
    label_keys: KymaLabelKeys,
    on_delete: impl Fn(ObjectRef<Kyma>) + Send + 'static,
) -> impl Stream<Item = Result<Kyma, watcher::Error>> + Send + 'static {
    let api = Api::<Kyma>::namespaced(kcp.clone(), namespace);
    // The keys of the generation being listed: set before its watch starts, read once the
    // store took in a complete list.
    let listing: Arc<Mutex<Option<Keys>>> = Arc::default();
    let started = Arc::clone(&listing);
    label_keys
        .generations()
        .flat_map(move |(keys, grown)| {
            *started.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&keys));
            watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .map_ok(move |event| event.modify(|kyma| reconciler::trim(kyma, &keys)))
                .take_until(grown)
        })
        .reflect(writer)
        .inspect_ok(move |event| match event {
            watcher::Event::InitDone => {
                if let Some(keys) = listing.lock().unwrap_or_else(PoisonError::into_inner).clone() {
                    label_keys.listed(keys);
                }
            }
            watcher::Event::Delete(kyma) => on_delete(ObjectRef::from_obj(kyma)),
            _ => {}
        })
        .applied_objects()
        .predicate_filter(reconciler::trigger_hash, PredicateConfig::default())
}

/// The access Secrets of `namespace` (metadata only; of each its name, Kyma label and version,
/// see [`AccessSecrets`]), and the stream of the Kymas whose Secret was listed or changed. A
/// failing watch is logged and retried with backoff.
pub fn access_secrets(
    kcp: &Client,
    namespace: &str,
) -> (AccessSecrets, impl Stream<Item = ObjectRef<Kyma>> + Send + 'static) {
    let secrets = AccessSecrets::new(namespace);
    let noted = secrets.clone();
    let namespace = namespace.to_owned();
    let kymas = watcher(
        Api::<PartialObjectMeta<Secret>>::namespaced(kcp.clone(), &namespace),
        watcher::Config::default().labels(KYMA_NAME_LABEL),
    )
    .default_backoff()
    .filter_map(move |event| {
        let kyma = match event {
            Ok(event) => noted.apply(&event),
            Err(error) => {
                warn!(error = &error as &dyn std::error::Error, "Secret watch failed; retrying");
                None
            }
        };
        futures::future::ready(kyma.map(|kyma| ObjectRef::<Kyma>::new(&kyma).within(&namespace)))
    });
    (secrets, kymas)
}

/// The member and shard Leases of `namespace` (one cache for the shard agent and the
/// coordinator), and a stream that yields once per change or watch error. A failing watch is
/// logged and retried with backoff.
pub fn leases(kcp: &Client, namespace: &str) -> (Store<Lease>, impl Stream<Item = ()> + Send + 'static) {
    let (store, writer) = reflector::store();
    let changes =
        watcher(Api::<Lease>::namespaced(kcp.clone(), namespace), watcher::Config::default().labels(LEASE_TYPE_LABEL))
            .default_backoff()
            .modify(|l: &mut Lease| l.metadata.managed_fields = None)
            .reflect(writer)
            .map(|event| {
                if let Err(error) = &event {
                    warn!(error = error as &dyn std::error::Error, "Lease watch failed; retrying");
                }
            });
    (store, changes)
}

/// The catalog of `namespace` (ModuleTemplates, ModuleReleaseMetas, each read and its copy
/// rendered for `sync_namespace` as it arrives) and the two catalog CRDs: their stores, and
/// one stream that yields once per change.
pub fn catalog(
    kcp: &Client,
    namespace: &str,
    sync_namespace: &str,
) -> (CatalogStores, impl Stream<Item = ()> + Send + 'static) {
    let kind_stream = |kind: CatalogKind| {
        let (mut writer, store) = EntryWriter::new(kind, sync_namespace);
        let changes = watcher(
            Api::<DynamicObject>::namespaced_with(kcp.clone(), namespace, &kind.api_resource()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map_ok(move |event| writer.apply(&event))
        .map(|_| ());
        (store, changes)
    };
    let (mt_store, mts) = kind_stream(CatalogKind::ModuleTemplate);
    let (mrm_store, mrms) = kind_stream(CatalogKind::ModuleReleaseMeta);
    let crd_api: Api<CustomResourceDefinition> = Api::all(kcp.clone());
    let mut crd_stores = Vec::new();
    // Each CRD is watched by name: a watcher's re-list replaces its whole store.
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
    (CatalogStores { templates: mt_store, release_metas: mrm_store, crds: crd_stores }, changes)
}
