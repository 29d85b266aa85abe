//! The shrink guard against real apiservers: a KCP catalog that suddenly loses most of its
//! modules is held back (every SKR keeps its copies) until the objects come back or a human
//! confirms the shrink on the coordinator Lease; a small shrink goes through at once; a
//! replica that starts during a hold holds too.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use testenv::scenario::{MRM, MT, Scenario, mrm, mt};

/// Catalog changes must arrive well within this.
const PROMPT: Duration = Duration::from_secs(15);
/// How long a hold must keep every copy: well beyond the debounce (200 ms in the tests) and a
/// sync of both SKRs, so a state that slipped through would have pruned by then.
const HOLD_OBSERVED: Duration = Duration::from_secs(5);
const HELD: &str = "catalogsync_catalog_shrink_held";
const PRUNED: [&str; 1] = ["op=\"pruned\""];
const COORDINATOR_LEASE: &str = "catalogsync-coordinator";
const CONFIRM: &str = "catalogsync.kyma-project.io/confirm-shrink";
const RECORD: &str = "catalogsync.kyma-project.io/published-catalog";

/// One version (1.0.0, on the regular channel) of each module: an MT and an MRM each.
fn catalog(modules: &[&str]) -> Vec<Value> {
    modules.iter().flat_map(|m| [mt(m, "1.0.0"), mrm(m, &[("regular", "1.0.0")])]).collect()
}

fn mt_names(modules: &[&str]) -> Vec<String> {
    modules.iter().map(|m| format!("{m}-1.0.0")).collect()
}

fn strs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// Asserts `check` at every poll for `duration` (the opposite of `await_condition`).
async fn assert_throughout<F, Fut>(duration: Duration, description: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        assert!(check().await, "{description} stopped holding before {}s", duration.as_secs_f64());
        tokio::time::sleep(testenv::wait::POLL_INTERVAL).await;
    }
}

/// Whether both SKRs hold exactly the copies of `modules`.
async fn skrs_hold(s: &Scenario, modules: &[&str]) -> bool {
    let env = testenv::env();
    let (mts, mrms): (Vec<String>, Vec<String>) =
        (mt_names(modules), modules.iter().map(|m| (*m).to_owned()).collect());
    for skr in [&env.skr_a, &env.skr_b] {
        if s.skr_names(skr, MT).await != mts.iter().cloned().collect()
            || s.skr_names(skr, MRM).await != mrms.iter().cloned().collect()
        {
            return false;
        }
    }
    true
}

/// Waits until both SKRs hold exactly the copies of `modules`.
async fn await_skrs(s: &Scenario, modules: &[&str]) {
    let env = testenv::env();
    let mts = mt_names(modules);
    for skr in [&env.skr_a, &env.skr_b] {
        s.await_skr_names(skr, MT, &strs(&mts), PROMPT).await;
        s.await_skr_names(skr, MRM, modules, PROMPT).await;
    }
}

/// A scenario with `modules` in the KCP, synced to two SKRs (one Kyma each).
async fn synced(prefix: &str, modules: &[&str]) -> Scenario {
    let env = testenv::env();
    let mut s = Scenario::new(prefix).await.expect("scenario");
    s.apply_catalog(&catalog(modules)).await.expect("catalog");
    s.add_kyma("a", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("b", &env.skr_b, &[]).await.expect("kyma");
    s.start(&[]).expect("start");
    await_skrs(&s, modules).await;
    s
}

async fn await_gauge(s: &Scenario, name: &str, labels: &[&str], value: f64) {
    testenv::await_condition(PROMPT, &format!("{name}{labels:?} to be {value}"), || async {
        s.metric(name, labels).await == value
    })
    .await;
}

fn leases(s: &Scenario) -> Api<Lease> {
    Api::namespaced(s.kcp.clone(), &s.ns)
}

/// An annotation of the coordinator Lease, once the Lease exists.
async fn lease_annotation(s: &Scenario, key: &str) -> Option<String> {
    let lease = leases(s).get_opt(COORDINATOR_LEASE).await.ok()??;
    lease.metadata.annotations?.get(key).cloned()
}

/// What the operations guide tells a human to run:
/// `kubectl -n <lease namespace> annotate lease catalogsync-coordinator --overwrite
/// catalogsync.kyma-project.io/confirm-shrink=<value>`, a merge patch of the annotation.
async fn confirm(s: &Scenario, value: &str) {
    let patch = json!({"metadata": {"annotations": {CONFIRM: value}}});
    leases(s)
        .patch(COORDINATOR_LEASE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate the coordinator Lease");
}

fn log_has(s: &Scenario, needles: &[&str]) -> bool {
    s.log().lines().any(|line| needles.iter().all(|n| line.contains(n)))
}

#[tokio::test]
async fn deleting_every_release_meta_is_held_until_they_come_back() {
    let modules = ["api-gateway", "btp-operator", "keda", "serverless"];
    let s = synced("guard-hold", &modules).await;
    // Every replica records what it published, for replicas that start later.
    testenv::await_condition(PROMPT, "the published catalog recorded on the coordinator Lease", || async {
        lease_annotation(&s, RECORD).await.as_deref() == Some("mrm=4,mt=4")
    })
    .await;

    // kubectl delete mrm --all
    s.delete_catalog_collection(MRM, "").await.expect("delete every mrm");
    await_gauge(&s, HELD, &[], 1.0).await;
    assert_throughout(HOLD_OBSERVED, "every copy in both SKRs during the hold", || skrs_hold(&s, &modules)).await;
    assert_eq!(s.metric(HELD, &[]).await, 1.0, "still held");
    let latest = ["kind=\"ModuleReleaseMeta\"", "state=\"latest\""];
    let published = ["kind=\"ModuleReleaseMeta\"", "state=\"published\""];
    assert_eq!(s.metric("catalogsync_catalog_reachable_objects", &latest).await, 0.0);
    assert_eq!(s.metric("catalogsync_catalog_reachable_objects", &published).await, 4.0);
    assert!(
        log_has(
            &s,
            &["Holding back a catalog state", "shrink", "mrm=4,mt=4", "mrm=0,mt=0", "--catalog-shrink-threshold"]
        ),
        "no WARN says why the catalog is held:\n{}",
        s.log()
    );

    // The objects come back: the hold clears, and nothing was pruned anywhere.
    s.apply_catalog(&catalog(&modules)).await.expect("recreate");
    await_gauge(&s, HELD, &[], 0.0).await;
    assert!(skrs_hold(&s, &modules).await, "every copy is still there");
    assert_eq!(s.metric("catalogsync_sync_objects_total", &PRUNED).await, 0.0, "nothing was pruned");
    assert!(log_has(&s, &["Catalog no longer held back"]), "{}", s.log());
}

#[tokio::test]
async fn a_confirmed_shrink_is_published_and_the_confirmation_spent() {
    let modules = ["api-gateway", "btp-operator", "keda", "serverless"];
    let s = synced("guard-confirm", &modules).await;
    s.delete_catalog_collection(MRM, &format!("metadata.name!={}", modules[0])).await.expect("delete three mrms");
    await_gauge(&s, HELD, &[], 1.0).await;

    // A confirmation of other counts (an old one, or a typo) approves nothing.
    confirm(&s, "mrm=2,mt=2").await;
    testenv::await_condition(PROMPT, "the WARN about a confirmation of other counts", || async {
        log_has(&s, &["Ignoring a shrink confirmation", "mrm=2,mt=2"])
    })
    .await;
    assert!(skrs_hold(&s, &modules).await, "a wrong confirmation pruned:\n{}", s.log());
    assert_eq!(s.metric(HELD, &[]).await, 1.0);

    // The confirmation of the held counts publishes the shrink.
    confirm(&s, "mrm=1,mt=1").await;
    await_skrs(&s, &modules[..1]).await;
    await_gauge(&s, HELD, &[], 0.0).await;
    assert!(log_has(&s, &["Publishing a catalog shrink a human confirmed", "mrm=1,mt=1"]), "{}", s.log());
    testenv::await_condition(PROMPT, "the shrunk catalog recorded", || async {
        lease_annotation(&s, RECORD).await.as_deref() == Some("mrm=1,mt=1")
    })
    .await;

    // The next catalog with other counts spends the confirmation: it cannot approve a later
    // shrink to one module again.
    s.apply_catalog(&catalog(&modules[..2])).await.expect("add a module");
    await_skrs(&s, &modules[..2]).await;
    testenv::await_condition(PROMPT, "the spent confirmation removed from the Lease", || async {
        lease_annotation(&s, CONFIRM).await.is_none()
            && lease_annotation(&s, RECORD).await.as_deref() == Some("mrm=2,mt=2")
    })
    .await;
}

#[tokio::test]
async fn a_small_shrink_is_published_at_once() {
    let modules = [
        "api-gateway",
        "btp-operator",
        "cloud-manager",
        "connectivity-proxy",
        "eventing",
        "istio-gateway",
        "keda",
        "nats",
        "serverless",
        "telemetry",
    ];
    let s = synced("guard-small", &modules).await;
    // One module of ten: a tenth of each kind.
    s.delete_catalog(MRM, "telemetry").await.expect("delete mrm");
    await_skrs(&s, &modules[..9]).await;
    assert_eq!(s.metric(HELD, &[]).await, 0.0);
    assert!(!log_has(&s, &["Holding back"]), "{}", s.log());
}

#[tokio::test]
async fn a_replica_started_during_a_hold_holds_too() {
    let modules = ["api-gateway", "btp-operator", "keda"];
    let mut s = synced("guard-restart", &modules).await;
    testenv::await_condition(PROMPT, "the published catalog recorded", || async {
        lease_annotation(&s, RECORD).await.as_deref() == Some("mrm=3,mt=3")
    })
    .await;
    let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");

    // The catalog is emptied while no replica runs; a new replica has published nothing, but
    // the record says what the SKRs hold.
    for m in modules {
        s.delete_catalog(MRM, m).await.expect("delete mrm");
    }
    s.start(&[]).expect("restart");
    await_gauge(&s, HELD, &[], 1.0).await;
    assert_throughout(HOLD_OBSERVED, "every copy in both SKRs while the new replica holds", || skrs_hold(&s, &modules))
        .await;
    assert!(!matches!(s.http_get("/readyz").await, Ok((200, _))), "a replica that publishes no catalog is not ready");

    // Confirming the empty catalog lets it through: every copy is pruned.
    confirm(&s, "mrm=0,mt=0").await;
    await_skrs(&s, &[]).await;
    await_gauge(&s, HELD, &[], 0.0).await;
    s.await_ready(PROMPT).await;
}

#[tokio::test]
async fn a_first_start_on_an_empty_catalog_waits_for_one() {
    let env = testenv::env();
    let mut s = Scenario::new("guard-empty").await.expect("scenario");
    s.add_kyma("a", &env.skr_a, &[]).await.expect("kyma");
    s.start(&[]).expect("start");
    await_gauge(&s, HELD, &[], 1.0).await;
    assert!(log_has(&s, &["Holding back a catalog state", "empty_at_start"]), "{}", s.log());
    assert!(!matches!(s.http_get("/readyz").await, Ok((200, _))), "ready without a catalog");

    // The first module ends the hold.
    s.apply_catalog(&catalog(&["keda"])).await.expect("catalog");
    s.await_skr_names(&env.skr_a, MRM, &["keda"], PROMPT).await;
    await_gauge(&s, HELD, &[], 0.0).await;
    s.await_ready(PROMPT).await;
}
