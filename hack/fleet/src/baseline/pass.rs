//! One pass over one Kyma, as KLM's `handleProcessingState` runs its catalog part: the
//! desired set, then per kind (MTs, then MRMs) a server-side apply of every desired object
//! and, only if all succeeded, a cluster-wide list and the deletion of managed orphans. With
//! `--reconcile full` or `without-catalog`, the rest of the Kyma reconcile ([`super::kyma`])
//! runs around it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use catalogsync::api::{Kyma, SKIP_RECONCILIATION_LABEL, SKR_FIELD_MANAGER, is_flag_on};
use catalogsync::catalog::{CatalogKind, DesiredObject, desired_set};
use futures::future;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use tracing::debug;

use super::args::Reconcile;
use super::error::{KindError, PassError, RequestError, chain};
use super::kcp::key_of;
use super::skr::Skr;
use super::stats::{Op, Request};
use super::{Ctx, kyma, lock};

/// What every pass reads.
pub(super) struct PassSettings {
    /// The SKR namespace of the copies.
    pub sync_namespace: String,
    /// Restricted module names.
    pub restricted: BTreeSet<String>,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// Which parts of the Kyma reconcile a pass reproduces.
    pub reconcile: Reconcile,
}

/// One Kyma reconcile: the parts of KLM's that `--reconcile` selects, with its queue lag,
/// duration and outcome recorded.
pub(super) async fn reconcile(kyma: Arc<Kyma>, ctx: &Ctx) -> Result<(), PassError> {
    let key = key_of(&kyma);
    let started = Instant::now();
    ctx.stats.queue_lag.push(ctx.schedule.queue_lag(&key, started));
    if is_flag_on(kyma.labels().get(SKIP_RECONCILIATION_LABEL)) {
        ctx.stats.skipped_passes.fetch_add(1, Ordering::Relaxed);
        ctx.schedule.complete(&key);
        return Ok(());
    }
    ctx.stats.in_flight.fetch_add(1, Ordering::Relaxed);
    let result = pass(&kyma, ctx).await;
    ctx.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    ctx.stats.pass_seconds.push(started.elapsed());
    ctx.stats.passes.fetch_add(1, Ordering::Relaxed);
    ctx.schedule.complete(&key);
    match result {
        Ok(()) => {
            debug!(kyma = %key, seconds = started.elapsed().as_secs_f64(), "Reconciled Kyma");
            Ok(())
        }
        Err(error) => {
            ctx.stats.failed_passes.fetch_add(1, Ordering::Relaxed);
            *lock(&ctx.stats.last_error) = Some(format!("{key}: {}", chain(&error)));
            debug!(kyma = %key, error = &error as &dyn std::error::Error, "Kyma reconcile failed");
            Err(error)
        }
    }
}

/// One pass: the SKR client, then the reconcile's steps before the catalog, the catalog, and
/// its steps after the catalog, each as `--reconcile` selects them. A failed step ends the
/// pass.
async fn pass(kyma: &Kyma, ctx: &Ctx) -> Result<(), PassError> {
    let reconcile = ctx.pass.reconcile;
    let skr = ctx.skrs.client_for(kyma).await?;
    if reconcile.has_rest() {
        kyma::before_catalog(kyma, ctx, &skr).await?;
    }
    if reconcile.has_catalog() {
        sync_catalog(kyma, ctx, &skr).await?;
    }
    if reconcile.has_rest() {
        kyma::after_catalog(kyma, ctx, &skr).await?;
    }
    Ok(())
}

/// The catalog part: desired set, then apply-and-prune per kind (MTs, then MRMs).
async fn sync_catalog(kyma: &Kyma, ctx: &Ctx, skr: &Skr) -> Result<(), PassError> {
    let snapshot = ctx.catalog.snapshot(&ctx.pass.sync_namespace);
    let labels = kyma.metadata.labels.clone().unwrap_or_default();
    let (desired, _warnings) = desired_set(&snapshot, &labels, &ctx.pass.restricted);
    let mut errors = Vec::new();
    for kind in CatalogKind::ALL {
        // KLM: an MT failure does not stop the MRM pass.
        if let Err(error) = sync_kind(ctx, skr, kind, desired.of(kind)).await {
            errors.push(error);
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(PassError::Sync { errors }) }
}

/// Applies every desired object of `kind` concurrently; only if all succeeded, lists the
/// kind cluster-wide and deletes the catalog-sync-managed objects that are not desired.
async fn sync_kind(
    ctx: &Ctx,
    skr: &Skr,
    kind: CatalogKind,
    desired: &BTreeMap<String, DesiredObject>,
) -> Result<(), KindError> {
    let ar = kind.api_resource();
    let sync_ns = ctx.pass.sync_namespace.as_str();
    let api = Api::<DynamicObject>::namespaced_with(skr.client.clone(), sync_ns, &ar);
    let params = PatchParams::apply(SKR_FIELD_MANAGER).force();
    let applies = desired.values().map(|object| {
        let (api, params) = (&api, &params);
        call(ctx, skr, Request::catalog(kind, Op::Apply), async move {
            // What `Api::patch` sends, with the copy's serialized bytes (copied into the
            // request, as kube's encoding of the copy did).
            let request = kube::core::Request::new(api.resource_url())
                .patch(&object.name, params, &Patch::Apply(()))
                .map_err(kube::Error::BuildRequest)?
                .map(|_| object.body.bytes().to_vec());
            skr.client.request::<DynamicObject>(request).await.map(drop)
        })
    });
    let failed: Vec<RequestError> = future::join_all(applies).await.into_iter().filter_map(Result::err).collect();
    if let Some(first) = failed.into_iter().next() {
        return Err(KindError::Apply { kind: kind.plural(), total: desired.len(), source: first });
    }

    let all = Api::<DynamicObject>::all_with(skr.client.clone(), &ar);
    let list = call(ctx, skr, Request::catalog(kind, Op::List), async { all.list(&ListParams::default()).await });
    let listed = match list.await {
        Ok(list) => list.items,
        // KLM: a no-match (CRD absent) counts as success.
        Err(error) if error.is_not_found() => Vec::new(),
        Err(source) => return Err(KindError::List { kind: kind.plural(), source }),
    };
    let obsolete: Vec<(String, String)> = listed
        .iter()
        .filter(|o| is_ours(o))
        .filter_map(|o| {
            let ns = o.metadata.namespace.clone().unwrap_or_default();
            let name = o.metadata.name.clone()?;
            let desired_here = ns == sync_ns && desired.contains_key(&name);
            (!desired_here).then_some((ns, name))
        })
        .collect();
    let deletes = obsolete.iter().map(|(ns, name)| {
        let api = Api::<DynamicObject>::namespaced_with(skr.client.clone(), ns, &ar);
        call(ctx, skr, Request::catalog(kind, Op::Delete), async move {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e),
            }
        })
    });
    let failed: Vec<RequestError> = future::join_all(deletes).await.into_iter().filter_map(Result::err).collect();
    let failed_count = failed.len();
    match failed.into_iter().next() {
        Some(source) => {
            Err(KindError::Delete { kind: kind.plural(), failed: failed_count, total: obsolete.len(), source })
        }
        None => Ok(()),
    }
}

/// Performs one SKR request: in-flight bound, rate limit, then [`counted`].
pub(super) async fn call<T>(
    ctx: &Ctx,
    skr: &Skr,
    request: Request,
    future: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, RequestError> {
    // Held until the response is read, as a connection is.
    let _permit = match &skr.in_flight {
        Some(gate) => gate.acquire().await.ok(),
        None => None,
    };
    if let Some(limiter) = &skr.limiter {
        limiter.acquire().await;
    }
    counted(ctx, request, future).await
}

/// Performs one request (SKR or KCP): count, timeout, and the failure counted unless it is a
/// 404 the request expects.
pub(super) async fn counted<T>(
    ctx: &Ctx,
    request: Request,
    future: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, RequestError> {
    ctx.stats.count(request);
    let timeout = ctx.pass.request_timeout;
    let result = match tokio::time::timeout(timeout, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(RequestError::Kube(error)),
        Err(_) => Err(RequestError::Timeout(timeout)),
    };
    if result.as_ref().is_err_and(|e| !(request.expects_not_found() && e.is_not_found())) {
        ctx.stats.count_error(request);
    }
    result
}

/// Whether an SKR object carries a `catalog-sync` managedFields entry (KLM's ownership test).
fn is_ours(obj: &DynamicObject) -> bool {
    obj.metadata.managed_fields.iter().flatten().any(|m| m.manager.as_deref() == Some(SKR_FIELD_MANAGER))
}
