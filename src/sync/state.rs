//! The published catalog: what every sync reads ([`CatalogState`]), the KCP stores it is built
//! from ([`CatalogStores`]), and the fingerprint a successful sync establishes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
#[cfg(test)]
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use crate::catalog::{CatalogKind, Entry, Filtered, ProfileCache, Snapshot};
use crate::sync::executor::{SkrCrds, skr_crd_names};

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
    desired: Arc<ProfileCache>,
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
    ) -> Arc<Filtered> {
        self.desired.get(&self.snapshot, kyma_labels, restricted_modules)
    }
}

/// What a successful sync of an SKR established: its desired set and the CRDs. A Kyma whose
/// fingerprint under a new catalog differs from the one last synced needs a sync.
pub fn sync_fingerprint(desired: &Filtered, state: &CatalogState) -> u64 {
    desired.fingerprint ^ state.crds.hash.rotate_left(1)
}

/// The KCP caches the catalog is built from.
#[derive(Clone)]
pub struct CatalogStores {
    /// ModuleTemplates, read and rendered.
    pub templates: EntryStore,
    /// ModuleReleaseMetas, read and rendered.
    pub release_metas: EntryStore,
    /// The two catalog CRDs, one store each (each is watched by name, and a watcher's
    /// re-list replaces the whole content of its store).
    pub crds: Vec<Store<CustomResourceDefinition>>,
}

impl CatalogStores {
    /// Waits until every store has finished its first list.
    ///
    /// # Errors
    /// Fails when a store's writer was dropped before it became ready.
    pub async fn wait_until_ready(&self) -> Result<(), WriterGone> {
        // Only this function waits on these stores, so each readiness signal has one waiter.
        self.templates.wait_until_ready().await?;
        self.release_metas.wait_until_ready().await?;
        for store in &self.crds {
            store.wait_until_ready().await.map_err(|_| WriterGone)?;
        }
        Ok(())
    }

    /// Builds the current catalog state.
    pub fn state(&self) -> CatalogState {
        let snapshot = Snapshot::from_entries(self.templates.entries().into_iter().chain(self.release_metas.entries()));
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

/// The catalog objects of one kind, kept as the snapshot takes them in ([`Entry`]): each KCP
/// object is read and its SKR copy rendered once, when the watch delivers it. The objects
/// themselves are not kept: as `serde_json` values, about 90 ModuleTemplates of ~30 KB took
/// about 13 MB in every replica, several times what their rendered copies take.
///
/// Fed by [`EntryWriter`] with a watcher's events, with a reflector's semantics: a re-list
/// replaces the whole content once it is complete.
#[derive(Clone)]
pub struct EntryStore {
    entries: Arc<Mutex<Entries>>,
    ready: tokio::sync::watch::Receiver<bool>,
}

/// A store's writer was dropped before the store became ready: its watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the watch filling the store ended before its first list was complete")]
pub struct WriterGone;

/// Fills an [`EntryStore`].
pub struct EntryWriter {
    entries: Arc<Mutex<Entries>>,
    ready: tokio::sync::watch::Sender<bool>,
    read: fn(&DynamicObject, &str) -> Entry,
    sync_namespace: String,
}

#[derive(Default)]
struct Entries {
    /// By object name.
    current: BTreeMap<String, Entry>,
    /// A re-list in progress.
    relisted: Option<BTreeMap<String, Entry>>,
}

fn lock(entries: &Mutex<Entries>) -> std::sync::MutexGuard<'_, Entries> {
    // Each critical section is one map operation, so a poisoned map is consistent.
    entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl EntryWriter {
    /// A writer for `kind`, rendering copies for `sync_namespace`, and its store.
    pub fn new(kind: CatalogKind, sync_namespace: &str) -> (EntryWriter, EntryStore) {
        let entries = Arc::new(Mutex::new(Entries::default()));
        let (ready, ready_rx) = tokio::sync::watch::channel(false);
        let read = match kind {
            CatalogKind::ModuleTemplate => Entry::template,
            CatalogKind::ModuleReleaseMeta => Entry::release_meta,
        };
        let writer =
            EntryWriter { entries: Arc::clone(&entries), ready, read, sync_namespace: sync_namespace.to_owned() };
        (writer, EntryStore { entries, ready: ready_rx })
    }

    /// Applies one watcher event.
    pub fn apply(&mut self, event: &watcher::Event<DynamicObject>) {
        let read = |obj: &DynamicObject| (obj.name_any(), (self.read)(obj, &self.sync_namespace));
        match event {
            watcher::Event::Init => lock(&self.entries).relisted = Some(BTreeMap::new()),
            watcher::Event::InitApply(obj) => {
                let (name, entry) = read(obj);
                lock(&self.entries).relisted.get_or_insert_default().insert(name, entry);
            }
            watcher::Event::InitDone => {
                let mut entries = lock(&self.entries);
                if let Some(relisted) = entries.relisted.take() {
                    entries.current = relisted;
                }
                drop(entries);
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(obj) => {
                let (name, entry) = read(obj);
                lock(&self.entries).current.insert(name, entry);
            }
            watcher::Event::Delete(obj) => {
                lock(&self.entries).current.remove(&obj.name_any());
            }
        }
    }
}

impl EntryStore {
    /// Every entry, by object name.
    pub fn entries(&self) -> Vec<Entry> {
        lock(&self.entries).current.values().cloned().collect()
    }

    /// Waits until the first list is complete.
    ///
    /// # Errors
    /// Fails when the writer was dropped before.
    pub async fn wait_until_ready(&self) -> Result<(), WriterGone> {
        let mut ready = self.ready.clone();
        ready.wait_for(|r| *r).await.map(drop).map_err(|_| WriterGone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{MrmBuilder, MtBuilder, SYNC_NAMESPACE};

    fn names(store: &EntryStore) -> Vec<String> {
        Snapshot::from_entries(store.entries()).templates.into_keys().collect()
    }

    #[tokio::test]
    async fn a_relist_replaces_the_content_once_complete() {
        let (mut writer, store) = EntryWriter::new(CatalogKind::ModuleTemplate, SYNC_NAMESPACE);
        let (a, b) = (MtBuilder::new("btp", "1.0.0").build(), MtBuilder::new("btp", "1.1.0").build());
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(a.clone()));
        assert!(tokio::time::timeout(Duration::from_millis(10), store.wait_until_ready()).await.is_err());
        writer.apply(&watcher::Event::InitDone);
        store.wait_until_ready().await.expect("ready");
        assert_eq!(names(&store), ["btp-1.0.0"]);
        writer.apply(&watcher::Event::Apply(b.clone()));
        assert_eq!(names(&store), ["btp-1.0.0", "btp-1.1.0"]);
        // A re-list that no longer holds a: the old content stays until it is complete.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(b.clone()));
        assert_eq!(names(&store), ["btp-1.0.0", "btp-1.1.0"]);
        writer.apply(&watcher::Event::InitDone);
        assert_eq!(names(&store), ["btp-1.1.0"]);
        writer.apply(&watcher::Event::Delete(b));
        assert!(names(&store).is_empty());
    }

    #[test]
    fn entries_are_the_snapshot_the_objects_build() {
        let mts = [MtBuilder::new("btp", "1.0.0").build(), MtBuilder::new("keda", "2.0.0").build()];
        let mrms = [MrmBuilder::new("btp").channel("regular", "1.0.0").build()];
        let (mut mt_writer, mt_store) = EntryWriter::new(CatalogKind::ModuleTemplate, SYNC_NAMESPACE);
        let (mut mrm_writer, mrm_store) = EntryWriter::new(CatalogKind::ModuleReleaseMeta, SYNC_NAMESPACE);
        for obj in &mts {
            mt_writer.apply(&watcher::Event::Apply(obj.clone()));
        }
        for obj in &mrms {
            mrm_writer.apply(&watcher::Event::Apply(obj.clone()));
        }
        let from_entries = Snapshot::from_entries(mt_store.entries().into_iter().chain(mrm_store.entries()));
        assert_eq!(from_entries, Snapshot::build(&mts, &mrms, SYNC_NAMESPACE));
    }

    #[tokio::test]
    async fn waiting_on_a_store_whose_writer_is_gone_fails() {
        let (writer, store) = EntryWriter::new(CatalogKind::ModuleReleaseMeta, SYNC_NAMESPACE);
        drop(writer);
        assert!(store.wait_until_ready().await.is_err());
    }
}
