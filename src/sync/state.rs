//! The published catalog: what every sync reads ([`CatalogState`]), the KCP stores it is built
//! from ([`CatalogStores`]), and the fingerprint a successful sync establishes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::{self, Store};

use crate::catalog::{Filtered, ProfileCache, Snapshot};
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
}

impl CatalogStores {
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
