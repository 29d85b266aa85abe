//! This replica's member Lease: created on start, renewed every retry period, deleted on
//! shutdown. Each successful renewal extends the [`ShardView`] fence deadline to
//! "request sent + renew deadline"; a replica that cannot renew stops writing on its own.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::member_lease_name;
use crate::metrics::ShardMetrics;
use crate::sharding::lease::new_member;
use crate::sharding::{ShardView, Timing};

/// Renews the member Lease until `token` is cancelled, then deletes it.
pub async fn run(
    api: Api<Lease>,
    identity: String,
    view: ShardView,
    timing: Timing,
    metrics: ShardMetrics,
    token: CancellationToken,
) {
    let namespace = api.namespace().unwrap_or_default().to_owned();
    let mut was_fenced = true;
    loop {
        let sent = Instant::now();
        match renew(&api, &identity, &namespace, timing).await {
            Ok(()) => {
                view.renewed(sent, timing.renew_deadline);
                metrics.renewals.with_label_values(&["success"]).inc();
            }
            Err(error) => {
                metrics.renewals.with_label_values(&["error"]).inc();
                warn!(error = &error as &dyn std::error::Error, "Failed to renew member Lease");
            }
        }
        let fenced = view.is_fenced();
        metrics.fenced.set(i64::from(fenced));
        if fenced != was_fenced {
            if fenced {
                warn!("Member Lease not renewed within the renew deadline: stopped all SKR writes");
            } else {
                info!("Member Lease renewed: SKR writes allowed");
            }
            was_fenced = fenced;
        }
        tokio::select! {
            () = tokio::time::sleep(timing.retry_period) => {}
            () = token.cancelled() => break,
        }
    }
    match api.delete(&member_lease_name(&identity), &DeleteParams::default()).await {
        Ok(_) => info!("Deleted member Lease"),
        Err(error) => warn!(error = &error as &dyn std::error::Error, "Failed to delete member Lease"),
    }
}

async fn renew(api: &Api<Lease>, identity: &str, namespace: &str, timing: Timing) -> Result<(), kube::Error> {
    let name = member_lease_name(identity);
    let now = Timestamp::now();
    // Only this replica writes its member Lease, so a merge patch without precondition is
    // enough: one request per renewal.
    let patch = json!({"spec": {"holderIdentity": identity, "renewTime": MicroTime(now), "leaseDurationSeconds": timing.lease_secs()}});
    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            api.create(&PostParams::default(), &new_member(identity, namespace, timing.lease_secs(), now)).await?;
            info!(lease = %name, "Created member Lease");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
