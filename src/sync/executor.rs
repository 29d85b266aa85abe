//! Performs the sync of one SKR: ensures its namespace and CRDs when needed, then per kind
//! lists, plans, applies (server-side apply, field manager `catalog-sync`, force) and prunes
//! managed orphans. Each object is handled on its own; a kind is pruned only when every apply
//! of that kind succeeded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::api::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, ModuleReleaseMeta, ModuleTemplate, SKR_FIELD_MANAGER};
use crate::catalog::render::{CopyDigest, copy_matches, is_subset};
use crate::catalog::{CatalogKind, DesiredObject, DesiredSet, Observed, Plan, plan};
use crate::error::{Error, Result};
use crate::metrics::SkrClientMetrics;
use crate::skr::SkrState;

/// The SKR CRDs of both catalog kinds, copied from the KCP (`conversion: None`, managed-by
/// label), with a combined hash so a KCP CRD change is noticed per SKR.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SkrCrds {
    /// Apply bodies by CRD name; `None` while the KCP CRD is not known.
    pub bodies: BTreeMap<String, Option<Arc<Value>>>,
    /// Hash over all bodies.
    pub hash: u64,
}

impl SkrCrds {
    /// Renders the SKR copy of a KCP CRD.
    pub fn render(kcp: &CustomResourceDefinition) -> Value {
        let mut spec = serde_json::to_value(&kcp.spec).unwrap_or_default();
        spec["conversion"] = json!({"strategy": "None"});
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": kcp.name_any(), "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "spec": spec,
        })
    }

    /// Builds the set from the KCP CRDs found for each wanted name.
    pub fn from_kcp(found: BTreeMap<String, Option<CustomResourceDefinition>>) -> Self {
        let bodies: BTreeMap<String, Option<Arc<Value>>> =
            found.into_iter().map(|(name, crd)| (name, crd.map(|c| Arc::new(Self::render(&c))))).collect();
        let all: serde_json::Map<String, Value> =
            bodies.iter().map(|(name, body)| (name.clone(), body.as_deref().cloned().unwrap_or(Value::Null))).collect();
        let hash = crate::catalog::content_hash(&Value::Object(all));
        Self { bodies, hash }
    }
}

/// The names of the CRDs an SKR needs.
pub fn skr_crd_names() -> [String; 2] {
    use kube::CustomResourceExt;
    [ModuleTemplate::crd_name().to_owned(), ModuleReleaseMeta::crd_name().to_owned()]
}

/// Counts of one sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Objects applied, per kind.
    pub applied: BTreeMap<CatalogKind, usize>,
    /// Objects already right, per kind.
    pub unchanged: BTreeMap<CatalogKind, usize>,
    /// Orphans deleted, per kind.
    pub pruned: BTreeMap<CatalogKind, usize>,
    /// Whether the namespace or a CRD was written.
    pub setup_writes: usize,
}

impl SyncReport {
    /// Total writes made.
    pub fn writes(&self) -> usize {
        self.applied.values().sum::<usize>() + self.pruned.values().sum::<usize>() + self.setup_writes
    }
}

/// One SKR, as seen by the executor.
pub struct SkrTarget<'a> {
    /// Client of the SKR.
    pub client: &'a Client,
    /// Sync namespace.
    pub namespace: &'a str,
    /// Most requests in flight at once.
    pub concurrency: usize,
    /// Bound of every single request, from the ownership check to the response. A request
    /// that is cut off is dropped, so nothing is sent later than this after the check.
    pub request_timeout: Duration,
    /// Request metrics.
    pub metrics: &'a SkrClientMetrics,
    /// Checked right before every write; false aborts the sync with
    /// [`Error::OwnershipLost`].
    pub may_write: &'a (dyn Fn() -> bool + Send + Sync),
    /// Permits for full lists, shared by all syncs of the replica: a full list holds every
    /// copy of a kind in memory (about 2 MB of JSON for a catalog of 25 modules).
    pub full_lists: &'a tokio::sync::Semaphore,
}

fn api_resource(kind: CatalogKind) -> ApiResource {
    match kind {
        CatalogKind::ModuleTemplate => ApiResource::erase::<ModuleTemplate>(&()),
        CatalogKind::ModuleReleaseMeta => ApiResource::erase::<ModuleReleaseMeta>(&()),
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(SKR_FIELD_MANAGER).force()
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

impl SkrTarget<'_> {
    /// Bounds one SKR request by the request timeout.
    async fn bounded<T>(&self, request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.request_timeout),
            )))),
        }
    }

    fn check_ownership(&self) -> Result<()> {
        if (self.may_write)() { Ok(()) } else { Err(Error::OwnershipLost) }
    }

    /// Syncs `desired` to the SKR, updating `state`. On error the state is left cold, so the
    /// next sync lists in full and verifies everything.
    ///
    /// # Errors
    /// The first failed operation; other objects were still attempted.
    pub async fn sync(&self, desired: &DesiredSet, crds: &SkrCrds, state: &mut SkrState) -> Result<SyncReport> {
        let result = self.sync_inner(desired, crds, state).await;
        state.warm = result.is_ok();
        if result.is_err() {
            state.crd_hash = None;
        }
        result
    }

    async fn sync_inner(&self, desired: &DesiredSet, crds: &SkrCrds, state: &mut SkrState) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        if !state.warm {
            report.setup_writes += self.ensure_namespace().await?;
        }
        if !state.warm || state.crd_hash != Some(crds.hash) {
            report.setup_writes += self.ensure_crds(crds).await?;
            state.crd_hash = Some(crds.hash);
        }
        let mut first_error = None;
        for kind in CatalogKind::ALL {
            let memory = state.memory.entry(kind).or_default();
            let observed = match self.list(kind, !state.warm).await {
                Ok(o) => o,
                Err(err) if matches!(&err, Error::ListSkrObjects { source, .. } if is_not_found(source)) => {
                    // The CRD vanished since we last looked (an SKR admin deleted it).
                    report.setup_writes += self.ensure_crds(crds).await?;
                    self.list(kind, true).await?
                }
                Err(err) => return Err(err),
            };
            memory.retain(|name, _| observed.iter().any(|o| &o.name == name));
            let plan = plan(desired.of(kind), &observed, memory);
            if let Err(err) = self.execute(kind, &plan, memory, &mut report).await {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(report),
        }
    }

    async fn execute(
        &self,
        kind: CatalogKind,
        plan: &Plan,
        memory: &mut crate::catalog::KindMemory,
        report: &mut SyncReport,
    ) -> Result<()> {
        for (name, rv, hash) in &plan.unchanged {
            memory.insert(name.clone(), (rv.clone(), *hash));
        }
        *report.unchanged.entry(kind).or_default() += plan.unchanged.len();

        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), self.namespace, &api_resource(kind));
        let results: Vec<Result<(String, String, u64)>> = stream::iter(plan.apply.clone())
            .map(|obj: crate::catalog::DesiredObject| {
                let api = api.clone();
                async move {
                    let rv = self.apply_one(&api, kind, &obj).await?;
                    Ok((obj.name.clone(), rv, obj.hash))
                }
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        let mut first_error = None;
        for r in results {
            match r {
                Ok((name, rv, hash)) => {
                    memory.insert(name, (rv, hash));
                    *report.applied.entry(kind).or_default() += 1;
                }
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if let Some(err) = first_error {
            // Never prune a kind after a failed apply: the failure may hide a desired object.
            return Err(err);
        }

        let pruned: Vec<String> = stream::iter(plan.prune.clone())
            .map(|name: String| {
                let api = api.clone();
                async move {
                    self.check_ownership()?;
                    let res = self.bounded(api.delete(&name, &DeleteParams::default())).await;
                    self.metrics.record("delete", &res);
                    match res {
                        Ok(_) => Ok(name),
                        Err(e) if is_not_found(&e) => Ok(name),
                        Err(source) => Err(Error::PruneSkrObject { kind, name, source: Box::new(source) }),
                    }
                }
            })
            .buffer_unordered(self.concurrency)
            .try_collect()
            .await?;
        for name in &pruned {
            memory.remove(name);
        }
        *report.pruned.entry(kind).or_default() += pruned.len();
        Ok(())
    }

    /// Applies one copy. Server-side apply resets every field catalogsync owns, but fields an
    /// SKR admin added under another field manager survive it. The apply asks for the result's
    /// metadata only (the copy itself is about 30 KB): when `catalog-sync` is its only field
    /// manager, it holds exactly the desired copy. Otherwise the object is read in full, and
    /// when it still differs from the desired copy it is replaced to drop the foreign fields.
    /// Returns the new resourceVersion.
    async fn apply_one(&self, api: &Api<DynamicObject>, kind: CatalogKind, obj: &DesiredObject) -> Result<String> {
        let wrap = |source| Error::ApplySkrObject { kind, name: obj.name.clone(), source: Box::new(source) };
        self.check_ownership()?;
        let meta_api: Api<PartialObjectMeta<DynamicObject>> =
            Api::namespaced_with(self.client.clone(), self.namespace, &api_resource(kind));
        let res = self.bounded(meta_api.patch(&obj.name, &apply_params(), &Patch::Apply(&*obj.payload))).await;
        self.metrics.record("apply", &res);
        let applied = res.map_err(wrap)?;
        let foreign =
            applied.metadata.managed_fields.iter().flatten().any(|f| f.manager.as_deref() != Some(SKR_FIELD_MANAGER));
        if !foreign {
            return Ok(applied.metadata.resource_version.unwrap_or_default());
        }
        let res = self.bounded(api.get(&obj.name)).await;
        self.metrics.record("get", &res);
        let current = res.map_err(wrap)?;
        let observed = serde_json::to_value(&current).unwrap_or_default();
        if copy_matches(&obj.payload, &observed) {
            return Ok(current.resource_version().unwrap_or_default());
        }
        self.check_ownership()?;
        let mut body = (*obj.payload).clone();
        for field in ["labels", "annotations"] {
            let mut merged = observed["metadata"][field].as_object().cloned().unwrap_or_default();
            if let Some(want) = obj.payload["metadata"][field].as_object() {
                merged.extend(want.clone());
            }
            body["metadata"][field] = Value::Object(merged);
        }
        body["metadata"]["resourceVersion"] = json!(current.resource_version());
        let replacement: DynamicObject = serde_json::from_value(body).map_err(|e| wrap(kube::Error::SerdeError(e)))?;
        let params = PostParams { field_manager: Some(SKR_FIELD_MANAGER.to_owned()), ..PostParams::default() };
        let res = self.bounded(api.replace(&obj.name, &params, &replacement)).await;
        self.metrics.record("replace", &res);
        Ok(res.map_err(wrap)?.resource_version().unwrap_or_default())
    }

    async fn list(&self, kind: CatalogKind, full: bool) -> Result<Vec<Observed>> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), self.namespace, &api_resource(kind));
        let lp = ListParams::default();
        let wrap = |source| Error::ListSkrObjects { kind, source: Box::new(source) };
        if !full {
            let res = self.bounded(api.list_metadata(&lp)).await;
            self.metrics.record("list", &res);
            return Ok(res.map_err(wrap)?.items.into_iter().map(|o| observed(&o.metadata, None)).collect());
        }
        // A full list is read as text and digested one item at a time, so only the response
        // text and one object are in memory at once; the permit bounds how many such lists a
        // replica holds (cold starts and shard takeovers sync many SKRs cold at once).
        let _permit = self.full_lists.acquire().await.ok();
        let request =
            kube::core::Request::new(api.resource_url()).list(&lp).map_err(|e| wrap(kube::Error::BuildRequest(e)))?;
        let res = self.bounded(self.client.request_text(request)).await;
        self.metrics.record("list", &res);
        let text = res.map_err(wrap)?;
        digest_list(&text).map_err(|e| wrap(kube::Error::SerdeError(e)))
    }

    /// Creates the sync namespace when missing. Returns the number of writes (0 or 1).
    async fn ensure_namespace(&self) -> Result<usize> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let wrap =
            |source| Error::EnsureSkrNamespace { namespace: self.namespace.to_owned(), source: Box::new(source) };
        let res = self.bounded(api.get_metadata_opt(self.namespace)).await;
        self.metrics.record("get", &res);
        if res.map_err(wrap)?.is_some() {
            return Ok(0);
        }
        self.check_ownership()?;
        let body = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
        });
        let res = self.bounded(api.patch(self.namespace, &apply_params(), &Patch::Apply(&body))).await;
        self.metrics.record("apply", &res);
        res.map_err(wrap)?;
        Ok(1)
    }

    /// Writes each catalog CRD that is missing in the SKR or differs from the KCP's. Returns
    /// the number of writes.
    async fn ensure_crds(&self, crds: &SkrCrds) -> Result<usize> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut writes = 0;
        for (name, body) in &crds.bodies {
            let body = body.as_ref().ok_or_else(|| Error::KcpCrdMissing { name: name.clone() })?;
            let wrap = |source| Error::EnsureSkrCrd { name: name.clone(), source: Box::new(source) };
            let res = self.bounded(api.get_opt(name)).await;
            self.metrics.record("get", &res);
            let current = res.map_err(wrap)?;
            let up_to_date = current.as_ref().is_some_and(|c| {
                let have = serde_json::to_value(c).unwrap_or_default();
                is_subset(&body["spec"], &have["spec"])
                    && is_subset(&body["metadata"]["labels"], &have["metadata"]["labels"])
            });
            if up_to_date {
                continue;
            }
            self.check_ownership()?;
            let res = self.bounded(api.patch(name, &apply_params(), &Patch::Apply(&**body))).await;
            self.metrics.record("apply", &res);
            res.map_err(wrap)?;
            writes += 1;
            self.await_established(&api, name).await?;
        }
        Ok(writes)
    }

    /// Waits (bounded) until a freshly written CRD is served.
    async fn await_established(&self, api: &Api<CustomResourceDefinition>, name: &str) -> Result<()> {
        const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(10);
        let cond = kube::runtime::conditions::is_crd_established();
        let wait = kube::runtime::wait::await_condition(api.clone(), name, cond);
        match tokio::time::timeout(ESTABLISH_TIMEOUT, wait).await {
            Ok(Ok(_)) => Ok(()),
            // Not established in time: the following list fails with a clear error if it matters.
            Ok(Err(_)) | Err(_) => Ok(()),
        }
    }
}

/// Reads a full list response (`{"items": [...]}`), keeping of each item what a plan needs:
/// name, resourceVersion, whether it is managed, and its [`CopyDigest`].
fn digest_list(text: &str) -> serde_json::Result<Vec<Observed>> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

    struct Items;
    impl<'de> DeserializeSeed<'de> for Items {
        type Value = Vec<Observed>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for Items {
        type Value = Vec<Observed>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of objects")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<Value>()? {
                let meta: kube::api::ObjectMeta =
                    serde_json::from_value(item["metadata"].clone()).map_err(serde::de::Error::custom)?;
                out.push(observed(&meta, Some(CopyDigest::of(&item))));
            }
            Ok(out)
        }
    }
    struct List;
    impl<'de> Visitor<'de> for List {
        type Value = Vec<Observed>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list response")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "items" {
                    items = map.next_value_seed(Items)?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(items)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let items = de.deserialize_map(List)?;
    de.end()?;
    Ok(items)
}

fn observed(meta: &kube::api::ObjectMeta, content: Option<CopyDigest>) -> Observed {
    Observed {
        name: meta.name.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        managed: is_managed(meta.managed_fields.as_deref()),
        content,
    }
}

fn is_managed(fields: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry]>) -> bool {
    fields.into_iter().flatten().any(|f| f.manager.as_deref() == Some(SKR_FIELD_MANAGER))
}
