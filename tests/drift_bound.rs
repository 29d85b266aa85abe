//! The drift bound (docs/architecture.md, "The drift bound"): whatever a replica remembers, or
//! recalls from a shard record, every managed thing in an SKR (its copies, both catalog CRDs,
//! the sync namespace and its managed-by label) is verified at least once per resync period
//! and repaired when it differs: while the replica runs, and after a graceful stop (the shard
//! record in use), a crash and a restart. Real apiservers, catalogsync as a process; each
//! repair is timed and printed.
//!
//! The CRDs are cluster-scoped in the SKR, so this binary's tests run one scenario each and
//! edit only the SKR they own (`skr_b`).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::scenario::{MT, Scenario, mrm, mt};

/// The resync period of these tests.
const RESYNC: Duration = Duration::from_secs(10);

/// What a repair may take: one resync period, its jitter (at most 10%), and the time a sync
/// and the test's polling take on a busy machine.
const BOUND: Duration = Duration::from_secs(10 + 1 + 5);

/// A first sync after a start must be done well within this.
const PROMPT: Duration = Duration::from_secs(20);

const MANAGED_BY: &str = "operator.kyma-project.io/managed-by";
const MT_CRD: &str = "moduletemplates.operator.kyma-project.io";

fn catalog() -> Vec<Value> {
    vec![mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]
}

/// Takes the managed-by label and the printer columns off the SKR's ModuleTemplate CRD.
async fn drift_crd(crds: &Api<CustomResourceDefinition>) {
    let crd = crds.get(MT_CRD).await.expect("the CRD");
    let versions: Vec<Value> = crd
        .spec
        .versions
        .iter()
        .map(|v| {
            let mut v = serde_json::to_value(v).expect("a version");
            if let Some(o) = v.as_object_mut() {
                o.remove("additionalPrinterColumns");
            }
            v
        })
        .collect();
    let patch = json!({"metadata": {"labels": {MANAGED_BY: null}}, "spec": {"versions": versions}});
    crds.patch(MT_CRD, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("drift the CRD");
    let drifted = crds.get(MT_CRD).await.expect("the CRD");
    assert!(!crd_is_ours(&drifted), "the drift did not take");
}

fn crd_is_ours(crd: &CustomResourceDefinition) -> bool {
    let labelled = crd.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).is_some_and(|v| v == "kyma");
    let columns =
        crd.spec.versions.iter().all(|v| v.additional_printer_columns.as_ref().is_some_and(|c| !c.is_empty()));
    labelled && columns
}

/// Waits until the CRD is ours again; returns how long that took since `since`.
async fn await_crd_repaired(
    crds: &Api<CustomResourceDefinition>,
    since: Instant,
    bound: Duration,
    what: &str,
) -> Duration {
    testenv::await_condition(bound, &format!("{what}: the CRD repaired"), || async {
        crds.get(MT_CRD).await.is_ok_and(|c| crd_is_ours(&c))
    })
    .await;
    let took = since.elapsed();
    eprintln!("{what}: CRD repaired after {:.1}s (bound {:.0}s)", took.as_secs_f64(), bound.as_secs_f64());
    took
}

fn ns_labelled(ns: &Namespace) -> bool {
    ns.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).is_some_and(|v| v == "kyma")
}

/// The CRDs and the namespace drift while the replica runs with a warm memory, after a
/// graceful stop (the shard record is used by the restart), and after a crash: each is
/// repaired within one resync period.
#[tokio::test]
async fn crd_and_namespace_drift_is_repaired_within_one_resync_period() {
    let env = testenv::env();
    let skr = &env.skr_b;
    let crds: Api<CustomResourceDefinition> = Api::all(skr.admin_client());
    let namespaces: Api<Namespace> = Api::all(skr.admin_client());
    let mut s = Scenario::new("drift").await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma("k", skr, &[]).await.expect("kyma");
    let resync = format!("{}s", RESYNC.as_secs());
    let args = ["--resync-period", resync.as_str()];
    s.start(&args).expect("start");
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(skr, MT, &["keda-1.0.0"], PROMPT).await;
    assert!(crd_is_ours(&crds.get(MT_CRD).await.expect("crd")), "the CRD as catalogsync writes it");
    // One resync period passes, so the next drift meets a warm replica with a trusted memory.
    tokio::time::sleep(RESYNC).await;

    // While it runs.
    drift_crd(&crds).await;
    let took = await_crd_repaired(&crds, Instant::now(), BOUND, "running").await;
    assert!(took <= BOUND);
    let patch = json!({"metadata": {"labels": {MANAGED_BY: null}}});
    namespaces.patch(&s.sync_ns, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("unlabel");
    let since = Instant::now();
    testenv::await_condition(BOUND, "the namespace label restored", || async {
        namespaces.get(&s.sync_ns).await.is_ok_and(|ns| ns_labelled(&ns))
    })
    .await;
    eprintln!("running: namespace label restored after {:.1}s", since.elapsed().as_secs_f64());

    // After a graceful stop: the restart uses the shard record the replica wrote.
    let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");
    drift_crd(&crds).await;
    namespaces.patch(&s.sync_ns, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("unlabel");
    let since = Instant::now();
    s.start(&args).expect("restart");
    await_crd_repaired(&crds, since, BOUND, "graceful restart").await;
    testenv::await_condition(BOUND, "graceful restart: the namespace label restored", || async {
        namespaces.get(&s.sync_ns).await.is_ok_and(|ns| ns_labelled(&ns))
    })
    .await;
    eprintln!("graceful restart: namespace label restored after {:.1}s", since.elapsed().as_secs_f64());

    // After a crash: no record, and the restart waits for the crashed process's member
    // Lease (8 s in these scenarios) to expire before it takes shards.
    s.catalogsync.as_mut().expect("running").kill();
    drift_crd(&crds).await;
    let since = Instant::now();
    s.start(&args).expect("restart after a crash");
    await_crd_repaired(&crds, since, BOUND + Duration::from_secs(8 * 2), "restart after a crash").await;
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(skr, MT, &["keda-1.0.0"], PROMPT).await;
}
