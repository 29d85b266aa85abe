//! The parts of KLM's Kyma reconcile around its catalog sync, for `--reconcile full` and
//! `without-catalog`: the SKR and KCP requests of `internal/controller/kyma/controller.go`
//! and `internal/remote/skr_context.go` (lifecycle-manager at commit `c5b83f1b`), in their
//! order, for a Kyma in state Ready without modules. What is left out is listed in
//! `docs/performance.md` (run R).
//!
//! ```text
//!  Reconcile   SSA of the SKR namespace kyma-system (kyma-sync-context, force)
//!  reconcile   KCP update adding the finalizer, when the Kyma lacks it (once per Kyma)
//!              SSA of the Kyma, MT and MRM CRDs in turn (lifecycle-manager, force, no read
//!                first; the KCP CRDs come from the cache)
//!              get of the SKR Kyma kyma-system/default, create when absent
//!  [the catalog sync, when selected]
//!              KCP: SSA of the Kyma's status (lifecycle-manager, force)
//!              get of the SKR Kyma again; SSA of its labels and annotations only when they
//!                differ (kyma-sync-context, force); update of its status
//! ```
//!
//! Every status write changes the object: KLM resets every condition to Unknown at the start
//! of a reconcile, so each one's `lastTransitionTime`, like `lastOperation`'s time, is the
//! reconcile's.

use catalogsync::api::{Kyma, MANAGED_BY_LABEL, MANAGED_BY_VALUE, ModuleReleaseMeta, ModuleTemplate};
use catalogsync::sync::executor::SkrCrds;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{CustomResourceExt, ResourceExt};
use serde_json::{Map, Value, json};

use super::Ctx;
use super::error::{PassError, RequestError};
use super::pass::{call, counted};
use super::skr::Skr;
use super::stats::Request;

/// Namespace and name of the SKR Kyma (KLM's `DefaultRemoteNamespace`, `DefaultRemoteKymaName`);
/// the namespace is also the one KLM applies on every reconcile, whatever `--sync-namespace`.
const SKR_KYMA_NAMESPACE: &str = "kyma-system";
const SKR_KYMA_NAME: &str = "default";
/// Field manager of KLM's SKR namespace apply and SKR Kyma metadata apply.
const SYNC_CONTEXT_MANAGER: &str = "kyma-sync-context";
/// Field manager of KLM's CRD applies and KCP status apply.
const LIFECYCLE_MANAGER: &str = "lifecycle-manager";
/// The finalizer KLM puts on KCP Kymas.
const KYMA_FINALIZER: &str = "operator.kyma-project.io/Kyma";
/// Labels KLM puts on the SKR namespace besides managed-by, both `enabled`.
const NAMESPACE_LABELS: [&str; 2] = ["istio-injection", "namespaces.warden.kyma-project.io/validate"];
/// Label KLM puts on the SKR Kyma for the runtime watcher, value `kyma`.
const WATCHED_BY_LABEL: &str = "operator.kyma-project.io/watched-by";
/// Annotation KLM puts on the SKR Kyma, `<namespace>/<name>` of the KCP Kyma.
const OWNED_BY_ANNOTATION: &str = "deprecated-operator.kyma-project.io/owned-by";
/// KCP Kyma labels KLM copies to the SKR Kyma when present.
const COPIED_LABELS: [&str; 3] =
    ["kyma-project.io/runtime-id", "kyma-project.io/global-account-id", "kyma-project.io/subaccount-id"];
/// The conditions of a Ready Kyma with the watcher enabled (as `cmd/main.go` always has it),
/// in KLM's order, with their True messages.
const CONDITIONS: [(&str, &str); 4] = [
    ("CRDsSync", "CRDs are synchronized to the SKR"),
    ("Modules", "all modules are in ready state"),
    (CATALOG_CONDITION, "module templates are synchronized"),
    ("SKRWebhook", "skrwebhook is synchronized"),
];
/// The condition of the catalog part, left out without it.
const CATALOG_CONDITION: &str = "ModuleCatalog";

/// The steps before the catalog sync: the SKR namespace, the KCP Kyma's finalizer, the CRDs
/// and the SKR Kyma.
///
/// # Errors
/// The first step that failed; the CRDs are all tried before their failure counts.
pub(super) async fn before_catalog(kyma: &Kyma, ctx: &Ctx, skr: &Skr) -> Result<(), PassError> {
    apply_namespace(ctx, skr).await?;
    add_finalizer(kyma, ctx).await?;
    apply_crds(ctx, skr).await?;
    fetch_skr_kyma(kyma, ctx, skr).await.map(drop)
}

/// The steps after the catalog sync: the KCP Kyma's status, then the SKR Kyma's metadata
/// (when it differs) and status.
///
/// # Errors
/// The first step that failed.
pub(super) async fn after_catalog(kyma: &Kyma, ctx: &Ctx, skr: &Skr) -> Result<(), PassError> {
    let status = status(kyma, ctx.pass.reconcile.has_catalog(), &now());
    let kcp: Api<Kyma> = Api::namespaced(ctx.kcp.clone(), &kyma.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "Kyma",
        "metadata": {"name": kyma.name_any(), "namespace": kyma.namespace()},
        "status": status,
    });
    let params = PatchParams::apply(LIFECYCLE_MANAGER).force();
    counted(ctx, Request::ApplyKcpKymaStatus, kcp.patch_status(&kyma.name_any(), &params, &Patch::Apply(&body)))
        .await
        .map_err(PassError::ApplyKcpKymaStatus)?;

    let api = skr_kymas(skr);
    let mut skr_kyma = fetch_skr_kyma(kyma, ctx, skr).await?;
    if let Some(metadata) = metadata_apply(kyma, &skr_kyma) {
        let (params, patch) = (PatchParams::apply(SYNC_CONTEXT_MANAGER).force(), Patch::Apply(&metadata));
        let applied = call(ctx, skr, Request::ApplySkrKyma, api.patch(SKR_KYMA_NAME, &params, &patch)).await;
        skr_kyma = applied.map_err(PassError::ApplySkrKyma)?;
    }
    skr_kyma.data["status"] = status;
    let params = PostParams::default();
    let replace = api.replace_status(SKR_KYMA_NAME, &params, &skr_kyma);
    call(ctx, skr, Request::ReplaceSkrKymaStatus, replace).await.map_err(PassError::ReplaceSkrKymaStatus).map(drop)
}

/// SSA of the SKR namespace, KLM's connectivity probe.
async fn apply_namespace(ctx: &Ctx, skr: &Skr) -> Result<(), PassError> {
    let mut labels = Map::new();
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.into());
    for label in NAMESPACE_LABELS {
        labels.insert(label.to_owned(), "enabled".into());
    }
    let body =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SKR_KYMA_NAMESPACE, "labels": labels}});
    let api: Api<Namespace> = Api::all(skr.client.clone());
    let params = PatchParams::apply(SYNC_CONTEXT_MANAGER).force();
    call(ctx, skr, Request::ApplyNamespace, api.patch(SKR_KYMA_NAMESPACE, &params, &Patch::Apply(&body)))
        .await
        .map(drop)
        .map_err(PassError::ApplyNamespace)
}

/// KLM's `EnsureLabelsAndFinalizers`: an update of the KCP Kyma when it lacks the finalizer
/// (the managed-by label the bench's Kymas carry already). KLM then ends the reconcile and
/// comes back after its rate limiter's delay; here the pass goes on, so a first round stays
/// one pass per Kyma.
async fn add_finalizer(kyma: &Kyma, ctx: &Ctx) -> Result<(), PassError> {
    if kyma.finalizers().iter().any(|f| f == KYMA_FINALIZER) {
        return Ok(());
    }
    let mut finalizers = kyma.finalizers().to_vec();
    finalizers.push(KYMA_FINALIZER.to_owned());
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": kyma.resource_version()}});
    let api: Api<Kyma> = Api::namespaced(ctx.kcp.clone(), &kyma.namespace().unwrap_or_default());
    counted(ctx, Request::PatchKcpKyma, api.patch(&kyma.name_any(), &PatchParams::default(), &Patch::Merge(&patch)))
        .await
        .map(drop)
        .map_err(PassError::PatchKcpKyma)
}

/// KLM's `SyncCRDs`: the Kyma, MT and MRM CRDs of the KCP, each applied to the SKR in turn
/// with `conversion: None` and the managed-by label (catalogsync's rendering of an SKR CRD is
/// the same); a failure does not stop the others.
async fn apply_crds(ctx: &Ctx, skr: &Skr) -> Result<(), PassError> {
    let api: Api<CustomResourceDefinition> = Api::all(skr.client.clone());
    let params = PatchParams::apply(LIFECYCLE_MANAGER).force();
    let mut failed: Vec<RequestError> = Vec::new();
    for name in [Kyma::crd_name(), ModuleTemplate::crd_name(), ModuleReleaseMeta::crd_name()] {
        let kcp_crd =
            ctx.crds.get(&ObjectRef::new(name)).ok_or_else(|| PassError::KcpCrdMissing { name: name.to_owned() })?;
        let body = SkrCrds::render(&kcp_crd);
        if let Err(error) = call(ctx, skr, Request::ApplyCrd, api.patch(name, &params, &Patch::Apply(&body))).await {
            failed.push(error);
        }
    }
    let count = failed.len();
    match failed.into_iter().next() {
        Some(source) => Err(PassError::ApplyCrds { failed: count, source }),
        None => Ok(()),
    }
}

/// KLM's `CreateOrFetchKyma`: the SKR Kyma, created with the KCP Kyma's spec when absent.
async fn fetch_skr_kyma(kyma: &Kyma, ctx: &Ctx, skr: &Skr) -> Result<DynamicObject, PassError> {
    let api = skr_kymas(skr);
    match call(ctx, skr, Request::GetSkrKyma, api.get(SKR_KYMA_NAME)).await {
        Ok(found) => return Ok(found),
        Err(error) if error.is_not_found() => {}
        Err(error) => return Err(PassError::GetSkrKyma(error)),
    }
    let object =
        DynamicObject::new(SKR_KYMA_NAME, &kyma_resource()).within(SKR_KYMA_NAMESPACE).data(json!({"spec": kyma.spec}));
    call(ctx, skr, Request::CreateSkrKyma, api.create(&PostParams::default(), &object))
        .await
        .map_err(PassError::CreateSkrKyma)
}

/// The SKR Kymas.
fn skr_kymas(skr: &Skr) -> Api<DynamicObject> {
    Api::namespaced_with(skr.client.clone(), SKR_KYMA_NAMESPACE, &kyma_resource())
}

fn kyma_resource() -> ApiResource {
    ApiResource::erase::<Kyma>(&())
}

/// KLM's `SynchronizeKymaMetadata`: the apply body of the SKR Kyma's labels and annotations
/// with the watcher's labels, the copied KCP labels and the owner annotation merged in, or
/// `None` when they are all there already (KLM then sends nothing).
fn metadata_apply(kcp: &Kyma, skr_kyma: &DynamicObject) -> Option<Value> {
    let mut wanted =
        vec![(WATCHED_BY_LABEL, MANAGED_BY_VALUE.to_owned()), (MANAGED_BY_LABEL, MANAGED_BY_VALUE.to_owned())];
    wanted.extend(COPIED_LABELS.iter().filter_map(|l| kcp.labels().get(*l).map(|v| (*l, v.clone()))));
    let owner = format!("{}/{}", kcp.namespace().unwrap_or_default(), kcp.name_any());
    let (mut labels, mut annotations) = (skr_kyma.labels().clone(), skr_kyma.annotations().clone());
    let missing =
        wanted.iter().any(|(k, v)| labels.get(*k) != Some(v)) || annotations.get(OWNED_BY_ANNOTATION) != Some(&owner);
    if !missing {
        return None;
    }
    labels.extend(wanted.into_iter().map(|(k, v)| (k.to_owned(), v)));
    annotations.insert(OWNED_BY_ANNOTATION.to_owned(), owner);
    Some(json!({
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "Kyma",
        "metadata": {"name": SKR_KYMA_NAME, "namespace": SKR_KYMA_NAMESPACE, "labels": labels, "annotations": annotations},
    }))
}

/// The status KLM writes for a Ready Kyma without modules at time `now` (the catalog's
/// condition only when the catalog part runs).
fn status(kyma: &Kyma, catalog: bool, now: &str) -> Value {
    let conditions: Vec<Value> = CONDITIONS
        .iter()
        .filter(|(kind, _)| catalog || *kind != CATALOG_CONDITION)
        .map(|(kind, message)| {
            json!({
                "type": kind,
                "status": "True",
                "reason": "Ready",
                "message": message,
                "observedGeneration": kyma.metadata.generation.unwrap_or_default(),
                "lastTransitionTime": now,
            })
        })
        .collect();
    let mut status = json!({
        "state": "Ready",
        "conditions": conditions,
        "lastOperation": {"operation": "kyma is ready", "lastUpdateTime": now},
    });
    if let Some(channel) = &kyma.spec.channel {
        status["activeChannel"] = json!(channel);
    }
    status
}

/// Now, as Kubernetes renders a `metav1.Time` (whole seconds).
fn now() -> String {
    Timestamp::from_second(Timestamp::now().as_second()).map(|t| t.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kyma() -> Kyma {
        let mut kyma =
            Kyma::new("k1", catalogsync::api::KymaSpec { channel: Some("regular".into()), ..Default::default() });
        kyma.metadata.namespace = Some("kcp-system".into());
        kyma.metadata.generation = Some(3);
        kyma.metadata.labels = Some([("kyma-project.io/runtime-id".to_owned(), "k1".to_owned())].into());
        kyma
    }

    #[test]
    fn the_status_is_ready_with_every_condition_true_at_the_reconciles_time() {
        let with = status(&kyma(), true, "2026-12-01T10:00:00Z");
        let types: Vec<&str> =
            with["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["CRDsSync", "Modules", "ModuleCatalog", "SKRWebhook"]);
        let first = &with["conditions"][0];
        assert_eq!((first["status"].as_str(), first["observedGeneration"].as_i64()), (Some("True"), Some(3)));
        assert_eq!(first["lastTransitionTime"], "2026-12-01T10:00:00Z");
        assert_eq!((with["state"].as_str(), with["activeChannel"].as_str()), (Some("Ready"), Some("regular")));
        let without = status(&kyma(), false, "2026-12-01T10:00:00Z");
        assert_eq!(without["conditions"].as_array().unwrap().len(), 3, "no catalog condition without the catalog");
    }

    #[test]
    fn the_skr_kyma_metadata_is_applied_only_while_something_is_missing() {
        let mut skr_kyma = DynamicObject::new(SKR_KYMA_NAME, &kyma_resource());
        skr_kyma.metadata.labels = Some([("user".to_owned(), "kept".to_owned())].into());
        let body = metadata_apply(&kyma(), &skr_kyma).expect("labels are missing");
        assert_eq!(body["metadata"]["labels"]["user"], "kept");
        assert_eq!(body["metadata"]["labels"]["kyma-project.io/runtime-id"], "k1");
        assert_eq!(body["metadata"]["labels"][WATCHED_BY_LABEL], "kyma");
        assert_eq!(body["metadata"]["annotations"][OWNED_BY_ANNOTATION], "kcp-system/k1");
        let applied: DynamicObject = serde_json::from_value(body).unwrap();
        assert!(metadata_apply(&kyma(), &applied).is_none());
    }
}
