//! Performs the sync of one SKR: ensures its namespace and CRDs when needed, then per kind
//! lists, plans, applies (server-side apply, field manager `catalog-sync`, force) and prunes
//! managed orphans. Each object is handled on its own; a kind is pruned only when every apply
//! of that kind succeeded.
//!
//! A prune is a DELETE with the orphan's listed UID and `resourceVersion` as preconditions.
//! A copy recreated or changed since the list makes the SKR answer 409 Conflict: that orphan
//! is not pruned this time (counted in [`SyncReport::prune_conflicts`]), and the sync does not
//! fail for it; the next sync lists it again and decides anew (a resync at the latest). A 404
//! (already gone) counts as pruned.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, GetParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Request;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::api::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, ModuleReleaseMeta, ModuleTemplate, SKR_FIELD_MANAGER};
use crate::catalog::plan::needs_content;
use crate::catalog::render::CopyDigest;
use crate::catalog::verify::{AfterApply, CrdCheck, CrdState, after_apply, crd_check, crd_state};
use crate::catalog::{
    CatalogKind, Comparison, DesiredObject, DesiredSet, KindComparison, KindMemory, Observed, Orphan, Plan, plan,
};
use crate::error::{Result, SyncError};
use crate::metrics::{SkrClientMetrics, SkrVerb};
use crate::skr::SkrState;
use crate::skr::request::{InvalidAnswer, SkrClient, TooManyObjects, bounded_serde_error};
use crate::sync::wire::{
    APPLIED, Expect, Labelled, MetaOnly, MetaOnlyList, PARTIAL_OBJECT_METADATA, Page, PageError,
    check_resource_version, digest_list,
};

/// Copies per page of a full list: 50 ModuleTemplates of up to 160 KB each fit the default
/// `--skr-max-response-size` (8 MiB); real ones are 3-50 KB.
pub const FULL_LIST_PAGE: u32 = 50;

/// Objects per page of a metadata-only list (about 1 KB each).
pub const METADATA_LIST_PAGE: u32 = 500;

/// Most copies of one kind an SKR may list: a catalog has a few hundred. More is a broken or
/// hostile SKR (a list that never ends), and fails the sync as too large.
pub const MAX_LISTED: usize = 10_000;

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
    /// Orphans not deleted because they were recreated or changed since they were listed
    /// (the DELETE's preconditions failed with 409); the next sync looks at them again.
    pub prune_conflicts: usize,
    /// Whether the namespace or a CRD was written.
    pub setup_writes: usize,
    /// When the SKR is due to be listed again: the time left until its memory is no longer
    /// trusted (`None`: it was never verified, or trust is off).
    pub verify_in: Option<Duration>,
}

impl SyncReport {
    /// Total writes made.
    pub fn writes(&self) -> usize {
        self.applied.values().sum::<usize>() + self.pruned.values().sum::<usize>() + self.setup_writes
    }
}

/// One SKR, as seen by the executor.
pub struct SkrTarget<'a> {
    /// Client of the SKR; every request goes through it, within its size bounds.
    pub client: &'a SkrClient,
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
    /// [`SyncError::OwnershipLost`].
    pub may_write: &'a (dyn Fn() -> bool + Send + Sync),
    /// Permits for full lists, shared by all syncs of the replica: a full list holds every
    /// copy of a kind in memory (about 2 MB of JSON for a catalog of 25 modules).
    pub full_lists: &'a tokio::sync::Semaphore,
    /// Permits for applies, shared by all syncs of the replica: each apply in flight holds
    /// its body. A sync takes the permits for its applies of one kind at once (up to
    /// `concurrency`) and keeps them until they are done.
    pub applies: &'a tokio::sync::Semaphore,
    /// How long after a sync that listed every kind the syncs of the warm SKR trust its
    /// memory and do not list (the resync period; zero: list on every sync). See
    /// [`crate::catalog::plan_from_memory`].
    pub trust_memory_for: Duration,
}

fn apply_params() -> PatchParams {
    PatchParams::apply(SKR_FIELD_MANAGER).force()
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409)
}

/// The DELETE of a managed orphan, on the condition that it still has the UID and
/// `resourceVersion` it was listed with (each only when the list had one).
fn prune_request(kind: CatalogKind, namespace: &str, orphan: &Orphan) -> Result<http::Request<Vec<u8>>> {
    let known = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let preconditions = Preconditions { uid: known(&orphan.uid), resource_version: known(&orphan.resource_version) };
    let has_any = preconditions.uid.is_some() || preconditions.resource_version.is_some();
    let params = DeleteParams { preconditions: has_any.then_some(preconditions), ..DeleteParams::default() };
    copies(kind, namespace).delete(&orphan.name, &params).map_err(|e| SyncError::PruneSkrObject {
        kind,
        name: orphan.name.clone(),
        source: Box::new(kube::Error::BuildRequest(e)),
    })
}

/// What became of one orphan.
enum Pruned {
    /// Deleted, or already gone.
    Deleted(String),
    /// Recreated or changed since the list: left for the next sync.
    Conflict(String),
}

/// Requests for the copies of `kind` in `namespace`.
fn copies(kind: CatalogKind, namespace: &str) -> Request {
    Request::new(DynamicObject::url_path(&kind.api_resource(), Some(namespace)))
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
        if (self.may_write)() { Ok(()) } else { Err(SyncError::OwnershipLost) }
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
            state.verified_at = None;
            state.setup_verified_at = None;
        }
        result.map(|mut report| {
            report.verify_in = state.verify_in(self.trust_memory_for);
            report
        })
    }

    async fn sync_inner(&self, desired: &DesiredSet, crds: &SkrCrds, state: &mut SkrState) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        // A record kept across a restart stands in for a successful last sync as far as the
        // copies go: metadata-only lists, whose resourceVersions must match it. Used once: a
        // sync that fails after it is cold again.
        let recalled = if state.warm { None } else { state.recalled.take() };
        let warm = state.warm || recalled.is_some();
        // Memory a record gave is trusted until the next verification, which reads the copies
        // in full: a stale or forged record costs that one full list, never a repair.
        let content_due = recalled.is_none() && state.content_unverified;
        let mut used_record = false;
        // The namespace and the CRDs are checked on every sync that is not warm (a recalled
        // record never stands in for them) and at least once per resync period; else only
        // when the KCP's CRDs changed since they were last ensured here.
        let setup_due = !state.trusts_setup(self.trust_memory_for);
        if setup_due {
            report.setup_writes += self.ensure_namespace().await?;
        }
        if crd_check(!setup_due, state.crd_hash, crds.hash) != CrdCheck::Skip {
            report.setup_writes += self.ensure_crds(crds).await?;
            state.crd_hash = Some(crds.hash);
        }
        if setup_due {
            state.setup_verified_at = Some(tokio::time::Instant::now());
        }
        let mut first_error = None;
        let trusted = state.trusts_memory(self.trust_memory_for);
        let mut listed_all = true;
        for kind in CatalogKind::ALL {
            let memory = state.memory.entry(kind).or_default();
            if let Some(plan) = trusted.then(|| crate::catalog::plan_from_memory(desired.of(kind), memory)).flatten() {
                listed_all = false;
                if let Err(err) = self.execute(kind, &plan, memory, &mut report).await {
                    first_error.get_or_insert(err);
                }
                memory.shrink();
                continue;
            }
            let observed = match self.list(kind, !warm || content_due, Some(desired.of(kind))).await {
                Ok(o) => o,
                Err(err) if matches!(&err, SyncError::ListSkrObjects { source, .. } if is_not_found(source)) => {
                    // The CRD vanished since we last looked (an SKR admin deleted it).
                    report.setup_writes += self.ensure_crds(crds).await?;
                    self.list(kind, true, Some(desired.of(kind))).await?
                }
                Err(err) => return Err(err),
            };
            let digest = recalled.as_ref().and_then(|r| r.kinds.get(&kind));
            if let Some(recalled) = digest.and_then(|d| KindMemory::recall(desired.of(kind), &observed, *d)) {
                *memory = recalled;
                used_record = true;
            }
            memory.retain_names(observed.iter().map(|o| o.name.as_str()));
            let mut plan = plan(desired.of(kind), &observed, memory);
            if needs_content(&plan, &observed, memory) {
                let observed = self.list(kind, true, Some(desired.of(kind))).await?;
                plan = crate::catalog::plan(desired.of(kind), &observed, memory);
            }
            if let Err(err) = self.execute(kind, &plan, memory, &mut report).await {
                first_error.get_or_insert(err);
            }
            memory.shrink();
        }
        match first_error {
            Some(err) => Err(err),
            None => {
                if listed_all {
                    state.verified_at = Some(tokio::time::Instant::now());
                    state.content_unverified = used_record;
                }
                Ok(report)
            }
        }
    }

    async fn execute(
        &self,
        kind: CatalogKind,
        plan: &Plan,
        memory: &mut KindMemory,
        report: &mut SyncReport,
    ) -> Result<()> {
        for (name, rv, hash) in &plan.unchanged {
            memory.remember(name, rv, *hash);
        }
        *report.unchanged.entry(kind).or_default() += plan.unchanged.len() + plan.kept;

        // Taken at once, so the applies of one sync run at its full concurrency (on the
        // connections it opened) instead of each waiting for a permit of its own. A closed
        // semaphore (it never closes) would only mean no bound.
        // `--apply-concurrency` is at least `--skr-concurrency` (checked at start-up).
        let wanted = plan.apply.len().min(self.concurrency);
        let _permits = match u32::try_from(wanted) {
            Ok(n) if n > 0 => self.applies.acquire_many(n).await.ok(),
            _ => None,
        };
        // A catalog change mostly applies one copy per SKR: awaited as it is, without the
        // allocations of a stream of concurrent applies.
        let results: Vec<Result<(String, String, u64)>> = match plan.apply.as_slice() {
            [] => Vec::new(),
            [one] => vec![self.apply_remembered(kind, one).await],
            all => {
                stream::iter(all.to_vec())
                    .map(|obj: DesiredObject| async move { self.apply_remembered(kind, &obj).await })
                    .buffer_unordered(self.concurrency)
                    .collect()
                    .await
            }
        };
        let mut first_error = None;
        for r in results {
            match r {
                Ok((name, rv, hash)) => {
                    memory.remember(&name, &rv, hash);
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

        let outcomes: Vec<Pruned> = if plan.prune.is_empty() {
            Vec::new()
        } else {
            stream::iter(plan.prune.clone())
                .map(|orphan: Orphan| async move {
                    let request = prune_request(kind, self.namespace, &orphan)?;
                    self.check_ownership()?;
                    let res = self.bounded(self.client.bytes(request)).await;
                    self.metrics.request(SkrVerb::Delete, &res);
                    let name = orphan.name;
                    match res {
                        Ok(_) => Ok(Pruned::Deleted(name)),
                        Err(e) if is_not_found(&e) => Ok(Pruned::Deleted(name)),
                        Err(e) if is_conflict(&e) => Ok(Pruned::Conflict(name)),
                        Err(source) => Err(SyncError::PruneSkrObject { kind, name, source: Box::new(source) }),
                    }
                })
                .buffer_unordered(self.concurrency)
                .try_collect()
                .await?
        };
        report.pruned.entry(kind).or_default();
        for outcome in outcomes {
            match outcome {
                Pruned::Deleted(name) => {
                    memory.forget(&name);
                    *report.pruned.entry(kind).or_default() += 1;
                }
                Pruned::Conflict(name) => {
                    tracing::debug!(kind = kind.as_str(), %name, "Orphan changed since it was listed; left for the next sync");
                    report.prune_conflicts += 1;
                }
            }
        }
        Ok(())
    }

    /// [`Self::apply_one`], with what the memory keeps of the applied copy: its name, new
    /// resourceVersion and content hash.
    async fn apply_remembered(&self, kind: CatalogKind, obj: &DesiredObject) -> Result<(String, String, u64)> {
        let rv = self.apply_one(kind, obj).await?;
        Ok((obj.name.clone(), rv, obj.hash))
    }

    /// Applies one copy. Server-side apply resets every field catalogsync owns, but fields an
    /// SKR admin added under another field manager survive it. The apply asks for the result's
    /// metadata only (the copy itself is about 30 KB): when `catalog-sync` is its only field
    /// manager, it holds exactly the desired copy. Otherwise the object is read in full, and
    /// when it still differs from the desired copy it is replaced to drop the foreign fields
    /// ([`after_apply`] decides). Returns the new resourceVersion.
    async fn apply_one(&self, kind: CatalogKind, obj: &DesiredObject) -> Result<String> {
        let wrap = |source| SyncError::ApplySkrObject { kind, name: obj.name.clone(), source: Box::new(source) };
        let build = |e| wrap(kube::Error::BuildRequest(e));
        let copies = copies(kind, self.namespace);
        // The body goes out as serialized once per catalog change, shared by every apply of
        // it (the request is built around an empty body, then given the copy's bytes); the
        // answer is decoded only as far as the resourceVersion and the field managers.
        let request = copies
            .patch_metadata(&obj.name, &apply_params(), &Patch::Apply(()))
            .map_err(build)?
            .map(|_| kube::client::Body::from(obj.body.bytes()));
        self.check_ownership()?;
        let res = self.bounded(self.client.json_of::<MetaOnly>(request)).await;
        self.metrics.request(SkrVerb::Apply, &res);
        let expect = Expect::new(self.namespace, PARTIAL_OBJECT_METADATA);
        let applied = res.map_err(wrap)?.applied(&obj.name, expect).map_err(|e| wrap(e.into_kube()))?;
        let managers = || applied.managers.iter().map(String::as_str);
        if after_apply(managers(), None, &obj.digest) == AfterApply::OnlyOurs {
            return Ok(applied.resource_version);
        }
        // What the SKR answers for an object read or replaced in full: its resourceVersion is
        // kept, so it is checked as a listed one is.
        let version_of = |object: &DynamicObject| {
            let rv = object.resource_version().unwrap_or_default();
            check_resource_version(&rv, APPLIED.resource_version).map(|()| rv).map_err(|e| wrap(e.into_kube()))
        };
        let request = copies.get(&obj.name, &GetParams::default()).map_err(build)?;
        let res = self.bounded(self.client.json::<DynamicObject>(request)).await;
        self.metrics.request(SkrVerb::Get, &res);
        let current = res.map_err(wrap)?;
        let current_version = version_of(&current)?;
        let observed = serde_json::to_value(&current).unwrap_or_default();
        if after_apply(managers(), Some(&CopyDigest::of(&observed)), &obj.digest) != AfterApply::Replace {
            return Ok(current_version);
        }
        self.check_ownership()?;
        let mut body = obj.body.value().map_err(|e| wrap(kube::Error::SerdeError(e)))?;
        for field in ["labels", "annotations"] {
            let mut merged = observed["metadata"][field].as_object().cloned().unwrap_or_default();
            if let Some(want) = body["metadata"][field].as_object() {
                merged.extend(want.clone());
            }
            body["metadata"][field] = Value::Object(merged);
        }
        body["metadata"]["resourceVersion"] = json!(current_version);
        let replacement = serde_json::to_vec(&body).map_err(|e| wrap(kube::Error::SerdeError(e)))?;
        let params = PostParams { field_manager: Some(SKR_FIELD_MANAGER.to_owned()), ..PostParams::default() };
        let request = copies.replace(&obj.name, &params, replacement).map_err(build)?;
        let res = self.bounded(self.client.json::<DynamicObject>(request)).await;
        self.metrics.request(SkrVerb::Replace, &res);
        version_of(&res.map_err(wrap)?)
    }

    /// Shadow mode's sync: compares `desired` with what the SKR holds and writes nothing. It
    /// reads as an active sync would (metadata-only lists while `state` is warm, a full list
    /// of a kind when a copy it does not remember is in the way) and remembers the copies it
    /// found in agreement, so a fleet in agreement costs two metadata-only lists per SKR per
    /// resync. A kind whose CRD the SKR does not serve holds nothing.
    ///
    /// # Errors
    /// A list that fails otherwise; `state` is left cold then.
    pub async fn compare(&self, desired: &DesiredSet, state: &mut SkrState) -> Result<Comparison> {
        let result = self.compare_inner(desired, state).await;
        state.warm = result.is_ok();
        result
    }

    async fn compare_inner(&self, desired: &DesiredSet, state: &mut SkrState) -> Result<Comparison> {
        let mut out = Comparison::default();
        for kind in CatalogKind::ALL {
            let memory = state.memory.entry(kind).or_default();
            let mut observed = self.list_served(kind, !state.warm, Some(desired.of(kind))).await?;
            memory.retain_names(observed.iter().map(|o| o.name.as_str()));
            let mut planned = plan(desired.of(kind), &observed, memory);
            if !planned.apply.is_empty() && observed.iter().any(|o| o.content.is_none()) {
                observed = self.list_served(kind, true, Some(desired.of(kind))).await?;
                planned = plan(desired.of(kind), &observed, memory);
            }
            for (name, rv, hash) in &planned.unchanged {
                memory.remember(name, rv, *hash);
            }
            *out.of_mut(kind) = KindComparison::of_plan(&planned, &observed);
        }
        Ok(out)
    }

    /// [`list`](Self::list), with a kind the SKR does not serve (404) as empty.
    async fn list_served(
        &self,
        kind: CatalogKind,
        full: bool,
        desired: Option<&BTreeMap<String, DesiredObject>>,
    ) -> Result<Vec<Observed>> {
        match self.list(kind, full, desired).await {
            Err(SyncError::ListSkrObjects { source, .. }) if is_not_found(&source) => Ok(Vec::new()),
            other => other,
        }
    }

    /// Reads, without writing anything, what the SKR holds of both kinds, in full (each item
    /// digested): the input of a [`Comparison`]. A kind whose CRD the SKR does not serve (404)
    /// holds nothing.
    ///
    /// # Errors
    /// A list that fails otherwise.
    pub async fn observe(&self) -> Result<BTreeMap<CatalogKind, Vec<Observed>>> {
        let mut out = BTreeMap::new();
        for kind in CatalogKind::ALL {
            out.insert(kind, self.list_served(kind, true, None).await?);
        }
        Ok(out)
    }

    /// Lists the copies of `kind` page by page: in full (each item digested) when `full`,
    /// else their metadata only. Every item is checked as it is decoded
    /// ([`crate::sync::wire`]); a page with more items than asked for, or a `continue` token
    /// that repeats, fails the list as an invalid answer.
    ///
    /// Of a full list, only the `desired` objects' content is kept (`None`: every object's).
    async fn list(
        &self,
        kind: CatalogKind,
        full: bool,
        desired: Option<&BTreeMap<String, DesiredObject>>,
    ) -> Result<Vec<Observed>> {
        let wrap = |source| SyncError::ListSkrObjects { kind, source: Box::new(source) };
        let invalid = |answer: InvalidAnswer| wrap(answer.into_kube());
        let copies = copies(kind, self.namespace);
        // A full page is read as bytes and digested one item at a time, so only one page and
        // one object are in memory at once; the permit bounds how many full lists a replica
        // reads at once (cold starts and shard takeovers sync many SKRs cold at once).
        let _permit = if full { self.full_lists.acquire().await.ok() } else { None };
        let (limit, expect) = if full {
            (FULL_LIST_PAGE, Expect { content_of: desired, ..Expect::new(self.namespace, kind.as_str()) })
        } else {
            (METADATA_LIST_PAGE, Expect::new(self.namespace, PARTIAL_OBJECT_METADATA))
        };
        let mut listed = Vec::new();
        let mut token: Option<String> = None;
        let mut tokens_seen = std::collections::HashSet::new();
        loop {
            let mut lp = ListParams::default().limit(limit);
            if let Some(token) = &token {
                lp = lp.continue_token(token);
            }
            let page: Page = if full {
                let request = copies.list(&lp).map_err(|e| wrap(kube::Error::BuildRequest(e)))?;
                let res = self.bounded(self.client.bytes(request)).await;
                self.metrics.request(SkrVerb::List, &res);
                match digest_list(&res.map_err(wrap)?, expect) {
                    Ok(page) => page,
                    Err(PageError::Parse(e)) => return Err(wrap(bounded_serde_error(e))),
                    Err(PageError::Invalid(answer)) => return Err(invalid(answer)),
                }
            } else {
                let request = copies.list_metadata(&lp).map_err(|e| wrap(kube::Error::BuildRequest(e)))?;
                let res = self.bounded(self.client.json::<MetaOnlyList>(request)).await;
                self.metrics.request(SkrVerb::List, &res);
                res.map_err(wrap)?.checked(expect).map_err(invalid)?
            };
            if page.items.len() > limit as usize {
                return Err(invalid(InvalidAnswer {
                    field: "items",
                    problem: "holds more objects than the page asked for",
                }));
            }
            listed.extend(page.items);
            if listed.len() > MAX_LISTED {
                return Err(wrap(kube::Error::Service(Box::new(TooManyObjects { limit: MAX_LISTED }))));
            }
            match page.next {
                Some(next) => {
                    if !tokens_seen.insert(xxhash_rust::xxh3::xxh3_64(next.as_bytes())) {
                        return Err(invalid(InvalidAnswer {
                            field: "metadata.continue",
                            problem: "repeats the token of an earlier page",
                        }));
                    }
                    token = Some(next);
                }
                None => return Ok(listed),
            }
        }
    }

    /// Creates the sync namespace when missing, and gives it the managed-by label when it
    /// lacks it (nothing else of an existing namespace is changed). Returns the number of
    /// writes (0 or 1).
    async fn ensure_namespace(&self) -> Result<usize> {
        let namespaces = Request::new(Namespace::url_path(&(), None));
        let wrap =
            |source| SyncError::EnsureSkrNamespace { namespace: self.namespace.to_owned(), source: Box::new(source) };
        let build = |e| wrap(kube::Error::BuildRequest(e));
        let request = namespaces.get_metadata(self.namespace, &GetParams::default()).map_err(build)?;
        let res = self.bounded(self.client.json::<Labelled>(request)).await;
        self.metrics.request(SkrVerb::Get, &res);
        match res {
            // A namespace being deleted still answers, labelled, with its copies, until the
            // namespace controller has emptied it: the SKR is not in sync until it is gone
            // and created again.
            Ok(held) if held.is_deleting() => {
                return Err(SyncError::SkrNamespaceDeleting { namespace: self.namespace.to_owned() });
            }
            Ok(held) if held.has(MANAGED_BY_LABEL, MANAGED_BY_VALUE) => return Ok(0),
            Ok(_) => {}
            Err(err) if is_not_found(&err) => {}
            Err(err) => return Err(wrap(err)),
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
        });
        let request = namespaces.patch(self.namespace, &apply_params(), &Patch::Apply(&body)).map_err(build)?;
        self.check_ownership()?;
        let res = self.bounded(self.client.bytes(request)).await;
        self.metrics.request(SkrVerb::Apply, &res);
        res.map_err(wrap)?;
        Ok(1)
    }

    /// Writes each catalog CRD that is missing in the SKR or differs from the KCP's
    /// ([`crd_state`]). Returns the number of writes.
    async fn ensure_crds(&self, crds: &SkrCrds) -> Result<usize> {
        let definitions = Request::new(CustomResourceDefinition::url_path(&(), None));
        let mut writes = 0;
        for (name, body) in &crds.bodies {
            let body = body.as_ref().ok_or_else(|| SyncError::KcpCrdMissing { name: name.clone() })?;
            let wrap = |source| SyncError::EnsureSkrCrd { name: name.clone(), source: Box::new(source) };
            let build = |e| wrap(kube::Error::BuildRequest(e));
            let request = definitions.get(name, &GetParams::default()).map_err(build)?;
            let res = self.bounded(self.client.json::<Value>(request)).await;
            self.metrics.request(SkrVerb::Get, &res);
            let current = match res {
                Ok(crd) => Some(crd),
                Err(err) if is_not_found(&err) => None,
                Err(err) => return Err(wrap(err)),
            };
            if crd_state(body, current.as_ref()) == CrdState::Current {
                continue;
            }
            let request = definitions.patch(name, &apply_params(), &Patch::Apply(&**body)).map_err(build)?;
            self.check_ownership()?;
            let res = self.bounded(self.client.bytes(request)).await;
            self.metrics.request(SkrVerb::Apply, &res);
            res.map_err(wrap)?;
            writes += 1;
            self.await_established(&definitions, name).await;
        }
        Ok(writes)
    }

    /// Waits (bounded) until a freshly written CRD is served. Not established in time: the
    /// following list fails with a clear error if it matters.
    async fn await_established(&self, definitions: &Request, name: &str) {
        const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(10);
        const POLL: Duration = Duration::from_millis(100);
        let deadline = tokio::time::Instant::now() + ESTABLISH_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            let Ok(request) = definitions.get(name, &GetParams::default()) else { return };
            if let Ok(crd) = self.bounded(self.client.json::<CustomResourceDefinition>(request)).await {
                let established = crd.status.and_then(|s| s.conditions).into_iter().flatten();
                if established.into_iter().any(|c| c.type_ == "Established" && c.status == "True") {
                    return;
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RequestResult;

    fn orphan(name: &str, uid: &str, rv: &str) -> Orphan {
        Orphan { name: name.to_owned(), uid: uid.to_owned(), resource_version: rv.to_owned() }
    }

    #[test]
    fn prune_request_carries_the_listed_uid_and_version_as_preconditions() {
        let kind = CatalogKind::ModuleTemplate;
        let request = prune_request(kind, "kyma-system", &orphan("old-0.1.0", "u-1", "42")).expect("a request");
        assert_eq!(request.method(), http::Method::DELETE);
        assert_eq!(
            request.uri().path(),
            "/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates/old-0.1.0"
        );
        let body: Value = serde_json::from_slice(request.body()).expect("a JSON body");
        assert_eq!(body, json!({"preconditions": {"uid": "u-1", "resourceVersion": "42"}}));

        // Only what the list had (a hostile SKR may send neither).
        let request = prune_request(kind, "kyma-system", &orphan("old-0.1.0", "", "42")).expect("a request");
        let body: Value = serde_json::from_slice(request.body()).expect("a JSON body");
        assert_eq!(body, json!({"preconditions": {"resourceVersion": "42"}}));
        let request = prune_request(kind, "kyma-system", &orphan("old-0.1.0", "", "")).expect("a request");
        let body: Value = serde_json::from_slice(request.body()).expect("a JSON body");
        assert_eq!(body, json!({}));
    }

    /// What a mock SKR saw: per request, the object name and the JSON body.
    type Seen = Arc<std::sync::Mutex<Vec<(String, Value)>>>;

    /// A mock SKR that answers every request for object `name` with `answers[name]` (500 for
    /// any other), and records what it got.
    fn mock_skr(answers: &[(&str, u16)]) -> (SkrClient, Seen) {
        use http_body_util::BodyExt as _;
        let answers: BTreeMap<String, u16> = answers.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect();
        let seen = Seen::default();
        let record = Arc::clone(&seen);
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (record, answers) = (Arc::clone(&record), answers.clone());
            async move {
                let name = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
                let body = request.into_body().collect().await?.to_bytes();
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                record.lock().expect("not poisoned").push((name.clone(), body));
                let code = answers.get(&name).copied().unwrap_or(500);
                let status = json!({"kind": "Status", "apiVersion": "v1", "code": code,
                                    "status": if code < 300 { "Success" } else { "Failure" }, "message": "mock"});
                let response = http::Response::builder()
                    .status(code)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(kube::client::Body::from(status.to_string().into_bytes()))
                    .expect("a response");
                Ok::<_, kube::Error>(response)
            }
        });
        (SkrClient::new(kube::Client::new(service, "default"), 1 << 20, 1 << 24), seen)
    }

    /// Runs the prunes of `plan` against `client`; returns the result, the report, the memory
    /// (every orphan remembered beforehand) and the request counter.
    async fn prune_with(
        client: &SkrClient,
        plan: &Plan,
    ) -> (Result<()>, SyncReport, crate::catalog::KindMemory, SkrClientMetrics) {
        let metrics = SkrClientMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let full_lists = tokio::sync::Semaphore::new(1);
        let applies = tokio::sync::Semaphore::new(4);
        let may_write = || true;
        let target = SkrTarget {
            client,
            namespace: "kyma-system",
            concurrency: 2,
            request_timeout: Duration::from_secs(5),
            metrics: &metrics,
            may_write: &may_write,
            full_lists: &full_lists,
            applies: &applies,
            trust_memory_for: Duration::ZERO,
        };
        let mut memory = crate::catalog::KindMemory::new();
        for o in &plan.prune {
            memory.remember(&o.name, "1", 7);
        }
        let mut report = SyncReport::default();
        let result = target.execute(CatalogKind::ModuleTemplate, plan, &mut memory, &mut report).await;
        (result, report, memory, metrics)
    }

    #[tokio::test]
    async fn a_changed_orphan_is_left_for_the_next_sync_and_a_gone_one_counts_as_pruned() {
        let (client, seen) = mock_skr(&[("stale", 200), ("gone", 404), ("changed", 409)]);
        let prune = vec![orphan("stale", "u-s", "11"), orphan("gone", "u-g", "12"), orphan("changed", "u-c", "13")];
        let (result, report, memory, metrics) = prune_with(&client, &Plan { prune, ..Plan::default() }).await;

        assert!(result.is_ok(), "a precondition conflict must not fail the sync: {result:?}");
        assert_eq!(report.pruned.get(&CatalogKind::ModuleTemplate), Some(&2));
        assert_eq!(report.prune_conflicts, 1);
        assert_eq!(report.writes(), 2);
        assert!(memory.matches("changed", "1", 7), "the changed orphan is still remembered");
        assert!(!memory.matches("stale", "1", 7) && !memory.matches("gone", "1", 7));
        let count = |result: &str| {
            let result = RequestResult::ALL.iter().find(|r| r.as_str() == result).expect("a request result");
            metrics.requests(SkrVerb::Delete, *result)
        };
        assert_eq!((count("success"), count("not_found"), count("conflict"), count("error")), (1, 1, 1, 0));

        // Every DELETE carried the preconditions of its own listing, and nothing else was sent.
        let mut seen = seen.lock().expect("not poisoned").clone();
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        let expected = |name: &str, uid: &str, rv: &str| {
            (name.to_owned(), json!({"preconditions": {"uid": uid, "resourceVersion": rv}}))
        };
        assert_eq!(
            seen,
            [expected("changed", "u-c", "13"), expected("gone", "u-g", "12"), expected("stale", "u-s", "11")]
        );
    }

    #[tokio::test]
    async fn a_failed_prune_still_fails_the_sync() {
        let (client, _) = mock_skr(&[("stale", 200), ("broken", 500)]);
        let prune = vec![orphan("stale", "u-s", "11"), orphan("broken", "u-b", "12")];
        let (result, _, _, metrics) = prune_with(&client, &Plan { prune, ..Plan::default() }).await;
        assert!(matches!(&result, Err(SyncError::PruneSkrObject { name, .. }) if name == "broken"), "{result:?}");
        assert_eq!(metrics.requests(SkrVerb::Delete, RequestResult::Error), 1);
    }

    /// The desired copy of a KCP ModuleTemplate, as a snapshot renders it.
    fn desired_copy() -> (DesiredObject, Value) {
        let kcp = crate::fixtures::MtBuilder::new("btp-operator", "1.1.0").label("team", "sap").build();
        let copy = crate::catalog::render::render_copy(&kcp, CatalogKind::ModuleTemplate, "kyma-system");
        let (body, hash) = crate::catalog::serialize_copy(&copy);
        let digest = Arc::new(CopyDigest::of(&copy));
        (DesiredObject { name: "btp-operator-1.1.0".to_owned(), digest, body, hash }, copy)
    }

    #[tokio::test]
    async fn an_apply_is_a_forced_server_side_apply_of_the_copy_asking_for_metadata_only() {
        use http_body_util::BodyExt as _;

        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = SkrClient::new(kube::Client::new(service, "default"), 1 << 20, 1 << 24);
        let metrics = SkrClientMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let full_lists = tokio::sync::Semaphore::new(1);
        let applies = tokio::sync::Semaphore::new(4);
        let may_write = || true;
        let target = SkrTarget {
            client: &client,
            namespace: "kyma-system",
            concurrency: 1,
            request_timeout: Duration::from_secs(5),
            metrics: &metrics,
            may_write: &may_write,
            full_lists: &full_lists,
            applies: &applies,
            trust_memory_for: Duration::ZERO,
        };
        let (object, copy) = desired_copy();

        // The SKR answers as an apiserver does to an apply of an object only catalog-sync
        // manages, so no other request follows.
        let skr = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("an apply");
            let answer = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {
                "name": "btp-operator-1.1.0", "namespace": "kyma-system", "resourceVersion": "7",
                "managedFields": [{"manager": SKR_FIELD_MANAGER, "operation": "Apply"}]}});
            respond.send_response(
                http::Response::builder()
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(kube::client::Body::from(answer.to_string().into_bytes()))
                    .expect("a response"),
            );
            let (parts, body) = request.into_parts();
            let body = body.collect().await.expect("the body").to_bytes();
            (parts, body, handle)
        });
        let resource_version = target.apply_one(CatalogKind::ModuleTemplate, &object).await.expect("applied");
        assert_eq!(resource_version, "7");
        let (request, body, mut handle) = skr.await.expect("the SKR");

        assert_eq!(request.method, http::Method::PATCH);
        assert_eq!(
            request.uri.path(),
            "/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates/btp-operator-1.1.0"
        );
        let query: BTreeMap<String, String> = request
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                (key.to_owned(), value.to_owned())
            })
            .collect();
        let expected = [("fieldManager", "catalog-sync"), ("force", "true")];
        assert_eq!(query, expected.map(|(k, v)| (k.to_owned(), v.to_owned())).into(), "{:?}", request.uri);
        let header = |name: http::header::HeaderName| request.headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(header(http::header::CONTENT_TYPE), Some("application/apply-patch+yaml"));
        assert_eq!(
            header(http::header::ACCEPT),
            Some("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
            "the answer's metadata only"
        );
        assert_eq!(&body[..], &object.body.bytes()[..], "the copy's bytes as serialized once");
        assert_eq!(serde_json::from_slice::<Value>(&body).expect("JSON"), copy);

        // Nothing else was sent.
        drop(client);
        let more = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
        assert!(matches!(more, Ok(None)), "an unexpected request");
    }
}
