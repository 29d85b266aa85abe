//! Running beside lifecycle-manager (KLM) on real apiservers, with KLM's writes reproduced by
//! `testenv::klm` from the lifecycle-manager reference: catalogsync adopts an SKR that KLM
//! filled without a single write, and the two appliers, running side by side, do not flip
//! the copies (their resourceVersions stay after KLM's first pass). The catalog is KLM's own
//! sample objects (read from `../shared/klm-samples`) and fixtures with the metadata KLM
//! keeps: a last-applied annotation, an owner reference and a finalizer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::{Value, json};
use testenv::klm::{KlmCatalogWriter, KlmPass};
use testenv::scenario::{MRM, MT, Scenario, mrm, mt};
use testenv::{AuditEvent, ControlPlane};

const PROMPT: Duration = Duration::from_secs(30);
/// The resync period of these tests: several resyncs per KLM pass.
const RESYNC: &str = "2s";

/// One of KLM's sample objects, by file name, without its namespace.
fn klm_sample(file: &str) -> Value {
    let path = testenv::repo_root().join("../shared/klm-samples/objects").join(file);
    let text = std::fs::read_to_string(&path).expect("read a lifecycle-manager sample");
    let mut doc = testenv::parse_yaml_docs(&text).expect("YAML").into_iter().next().expect("one object");
    if let Some(meta) = doc["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    doc
}

/// keda's KCP ModuleTemplate, with the metadata KLM keeps and catalogsync does not send (an
/// owner reference) and the annotation `kubectl apply` leaves.
fn keda_in_kcp(info: Option<Value>) -> Value {
    let mut keda = mt("keda", "1.0.0");
    keda["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "catalog-source", "uid": "0b7c1a4e-kcp-only"}]);
    keda["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
        json!(r#"{"apiVersion":"operator.kyma-project.io/v1beta2","kind":"ModuleTemplate"}"#);
    if let Some(info) = info {
        keda["spec"]["info"] = info;
    }
    keda
}

/// The catalog of these tests and the names every (non-beta) Kyma gets of it.
fn catalog() -> (Vec<Value>, BTreeSet<String>, BTreeSet<String>) {
    let objects = vec![
        klm_sample("mt_template-operator-1.0.5_e2e-transferred.yaml"),
        klm_sample("mrm_template-operator_regular-1.0.5_rendered-deploy_modulereleasemeta.yaml"),
        klm_sample("community-modules_docker-registry-0.14.0.yaml"),
        mrm("docker-registry", &[("regular", "0.14.0")]),
        keda_in_kcp(None),
        mrm("keda", &[("regular", "1.0.0"), ("fast", "1.0.0")]),
    ];
    let set = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<_>>();
    (
        objects,
        set(&["template-operator-1.0.5", "docker-registry-0.14.0", "keda-1.0.0"]),
        set(&["template-operator", "docker-registry", "keda"]),
    )
}

/// resourceVersion of every copy in the sync namespace, by kind and name.
async fn versions(s: &Scenario, skr: &ControlPlane) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for plural in [MT, MRM] {
        for obj in s.skr_api(skr, plural).list(&ListParams::default()).await.expect("list copies") {
            out.insert(format!("{plural}/{}", obj.name_any()), obj.resource_version().unwrap_or_default());
        }
    }
    out
}

/// The writes `user` made in `skr` from audit position `from` on.
fn writes_since(skr: &ControlPlane, from: usize, user: &str) -> Vec<AuditEvent> {
    skr.read_audit_events().into_iter().skip(from).filter(|e| e.user.username == user && e.is_write()).collect()
}

fn describe(events: &[AuditEvent]) -> Vec<String> {
    events.iter().map(|e| format!("{} {} {:?}/{:?}", e.verb, e.resource(), e.namespace(), e.name())).collect()
}

/// Waits until catalogsync finished `n` more successful syncs than `from`.
async fn await_syncs(s: &Scenario, from: f64, n: f64) -> f64 {
    testenv::await_condition(PROMPT, &format!("{n} more successful syncs"), || async {
        let done = s.metric("catalogsync_sync_runs_total", &[r#"result="success""#]).await;
        (done >= from + n).then_some(done)
    })
    .await
}

/// A new SKR `name` and scenario `name` with the catalog and Kyma `k1`, the SKR set up and
/// filled by KLM's writer (returned with its first pass), before catalogsync starts.
async fn klm_filled_skr(name: &str) -> (ControlPlane, Scenario, KlmCatalogWriter, KlmPass) {
    let skr = testenv::env().start_extra_skr(name).await.expect("start an SKR");
    let s = Scenario::new(name).await.expect("scenario");
    let (objects, templates, release_metas) = catalog();
    s.apply_catalog(&objects).await.expect("catalog");
    s.add_kyma("k1", &skr, &[]).await.expect("kyma");
    let klm = KlmCatalogWriter {
        kcp: s.kcp.clone(),
        catalog_namespace: s.ns.clone(),
        skr: skr.admin_client(),
        sync_namespace: s.sync_ns.clone(),
        templates,
        release_metas,
        channels: BTreeMap::new(),
    };
    klm.setup().await.expect("KLM setup");
    let first = klm.pass().await.expect("KLM pass");
    (skr, s, klm, first)
}

/// An SKR that KLM filled is adopted without one write; then KLM's passes and catalogsync's
/// resyncs run side by side: no flips, and a catalog change costs a bounded number of writes
/// before the copies settle again.
#[tokio::test]
async fn adopts_klm_copies_without_writes_and_does_not_flip_beside_klm() {
    let env = testenv::env();
    // KLM's world: it set up the SKR and synced the catalog.
    let (skr, mut s, klm, first) = klm_filled_skr("klm-side").await;
    assert_eq!(first, KlmPass { applied: 6, deleted: 0 });
    let keda = s.skr_api(&skr, MT).get("keda-1.0.0").await.expect("KLM's copy");
    assert_eq!(keda.owner_references().len(), 1, "KLM keeps the KCP owner reference");
    assert!(keda.annotations().contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    let before = versions(&s, &skr).await;

    // KLM keeps writing the Kyma status, its ModuleCatalog condition included.
    let status =
        testenv::klm::KlmStatusWriter::start(s.kcp.clone(), &s.ns, vec!["k1".to_owned()], Duration::from_secs(1));
    s.await_condition("k1", "True", "Ready", PROMPT).await;

    // catalogsync starts: it holds every copy as it is.
    let mark = skr.read_audit_events().len();
    let kcp_mark = env.kcp.read_audit_events().len();
    s.start(&["--resync-period", RESYNC]).expect("start");
    let done = await_syncs(&s, 0.0, 3.0).await;
    let user = s.skr_user("k1");
    let adoption = writes_since(&skr, mark, &user);
    assert!(adoption.is_empty(), "catalogsync wrote while adopting KLM's copies: {:?}", describe(&adoption));
    assert_eq!(versions(&s, &skr).await, before, "no copy changed");
    let reads = skr.read_audit_events().into_iter().skip(mark).filter(|e| e.user.username == user).count();
    assert!(reads > 0, "catalogsync did read the SKR");
    eprintln!("adoption: 0 SKR writes by catalogsync over {done} syncs");

    // Side by side: KLM passes every few resyncs; neither changes a copy.
    let mut done = done;
    for _ in 0..3 {
        let pass = klm.pass().await.expect("KLM pass");
        assert_eq!(pass.deleted, 0);
        done = await_syncs(&s, done, 2.0).await;
    }
    assert_eq!(versions(&s, &skr).await, before, "a copy flipped while both ran");
    let side_by_side = writes_since(&skr, mark, &user);
    assert!(side_by_side.is_empty(), "catalogsync wrote beside KLM: {:?}", describe(&side_by_side));
    let klm_status_writes = status.stop().await.expect("stop the status writer");
    let kcp = kcp_writes_since(&s, kcp_mark);
    assert!(kcp.is_empty(), "catalogsync wrote to the KCP beside KLM: {:?}", describe(&kcp));
    assert_eq!(s.metric("catalogsync_kyma_condition_contested", &[]).await, 1.0);
    eprintln!(
        "side by side: 0 SKR and 0 KCP writes by catalogsync over {done} syncs; KLM wrote the status {klm_status_writes} times"
    );

    // A catalog change while both run: catalogsync writes the changed copies first, without
    // the KCP owner reference; KLM's next pass puts it back (one write); then both settle.
    let mark = skr.read_audit_events().len();
    let info = json!({"repository": "https://example.invalid/keda", "documentation": "d"});
    s.apply_catalog(&[keda_in_kcp(Some(info))]).await.expect("change keda");
    testenv::await_condition(PROMPT, "catalogsync to apply the changed copy", || async {
        let copy = s.skr_api(&skr, MT).get("keda-1.0.0").await.ok()?;
        (copy.data["spec"]["info"]["repository"] == "https://example.invalid/keda").then_some(())
    })
    .await;
    let applied = writes_since(&skr, mark, &user);
    assert_eq!(applied.len(), 1, "one write for one changed copy: {:?}", describe(&applied));
    klm.pass().await.expect("KLM pass after the change");
    done = await_syncs(&s, done, 2.0).await;
    let settled = versions(&s, &skr).await;
    for _ in 0..3 {
        klm.pass().await.expect("KLM pass");
        done = await_syncs(&s, done, 2.0).await;
    }
    assert_eq!(versions(&s, &skr).await, settled, "a copy flipped after the change settled");
    let after = writes_since(&skr, mark, &user);
    assert_eq!(after.len(), 1, "catalogsync rewrote what KLM put back: {:?}", describe(&after));
    let keda = s.skr_api(&skr, MT).get("keda-1.0.0").await.expect("copy");
    assert_eq!(keda.owner_references().len(), 1, "KLM's owner reference stays");
}

/// The KCP writes catalogsync made in scenario `s`'s namespace from audit position `from` on,
/// its own Leases aside.
fn kcp_writes_since(s: &Scenario, from: usize) -> Vec<AuditEvent> {
    testenv::env()
        .kcp
        .read_audit_events()
        .into_iter()
        .skip(from)
        .filter(|e| e.user.username == testenv::CATALOGSYNC_USER && e.is_write())
        .filter(|e| e.namespace() == Some(s.ns.as_str()) && e.resource() != "leases")
        .collect()
}

/// Waits until the gauge `name` with `labels` reads `value`.
async fn await_gauge(s: &Scenario, name: &str, labels: &[&str], value: f64) {
    testenv::await_condition(PROMPT, &format!("{name}{labels:?} == {value}"), || async {
        (s.metric(name, labels).await == value).then_some(())
    })
    .await;
}

/// Shadow mode beside a KLM-filled SKR: it reports agreement, then the disagreement of a
/// tampered SKR object by object, then agreement again once KLM repaired it, and in all that
/// time writes nothing to the SKR and nothing but its Leases to the KCP.
#[tokio::test]
async fn shadow_mode_reports_agreement_and_writes_nothing() {
    let env = testenv::env();
    let (skr, mut s, klm, _) = klm_filled_skr("klm-shadow").await;

    let (skr_mark, kcp_mark) = (skr.read_audit_events().len(), env.kcp.read_audit_events().len());
    s.start(&["--mode", "shadow", "--resync-period", RESYNC]).expect("start");
    s.await_ready(PROMPT).await;
    await_gauge(&s, "catalogsync_shadow_skrs", &[r#"agreement="agree""#], 1.0).await;
    assert_eq!(s.metric("catalogsync_shadow_skrs", &[r#"agreement="disagree""#]).await, 0.0);

    // Tamper: a changed ModuleTemplate, a deleted ModuleReleaseMeta, an extra managed copy
    // (as KLM leaves one when a module leaves the catalog) and a user's own object.
    let mts = s.skr_api(&skr, MT);
    let edit = json!({"spec": {"requiresDowntime": true}});
    mts.patch("keda-1.0.0", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&edit)).await.expect("edit");
    s.skr_api(&skr, MRM).delete("docker-registry", &Default::default()).await.expect("delete");
    let mut stale = testenv::klm::klm_body(&s.catalog_api(MT).get("keda-1.0.0").await.expect("keda"), &s.sync_ns);
    stale["metadata"]["name"] = json!("keda-0.9.0");
    let force = kube::api::PatchParams::apply(testenv::klm::KLM_CATALOG_MANAGER).force();
    mts.patch("keda-0.9.0", &force, &kube::api::Patch::Apply(&stale)).await.expect("extra copy");
    let mut own = stale.clone();
    own["metadata"]["name"] = json!("my-own-1.0.0");
    let user = kube::api::PatchParams::apply("a-user").force();
    mts.patch("my-own-1.0.0", &user, &kube::api::Patch::Apply(&own)).await.expect("user object");

    await_gauge(&s, "catalogsync_shadow_skrs", &[r#"agreement="disagree""#], 1.0).await;
    let objects = |kind: &'static str, difference: &'static str| {
        let kind = format!(r#"kind="{kind}""#);
        let difference = format!(r#"difference="{difference}""#);
        let s = &s;
        async move { s.metric("catalogsync_shadow_objects", &[&kind, &difference]).await }
    };
    assert_eq!(objects("ModuleTemplate", "different").await, 1.0);
    assert_eq!(objects("ModuleTemplate", "extra").await, 1.0);
    assert_eq!(objects("ModuleTemplate", "missing").await, 0.0);
    assert_eq!(objects("ModuleReleaseMeta", "missing").await, 1.0);
    assert_eq!(objects("ModuleReleaseMeta", "different").await, 0.0);
    assert!(s.log().contains("Shadow: the SKR does not hold the desired catalog"), "the disagreement is logged");

    // KLM's next pass repairs its copies and prunes the extra one: agreement again.
    let repaired = klm.pass().await.expect("KLM pass");
    assert_eq!(repaired.deleted, 1, "KLM prunes the extra managed copy, not the user's object");
    await_gauge(&s, "catalogsync_shadow_skrs", &[r#"agreement="agree""#], 1.0).await;

    let skr_writes = writes_since(&skr, skr_mark, &s.skr_user("k1"));
    assert!(skr_writes.is_empty(), "shadow mode wrote to the SKR: {:?}", describe(&skr_writes));
    let kcp_writes = kcp_writes_since(&s, kcp_mark);
    assert!(kcp_writes.is_empty(), "shadow mode wrote to the KCP: {:?}", describe(&kcp_writes));
    assert!(s.condition("k1").await.is_none(), "no ModuleCatalog condition");
}

/// A KLM-like status writer force-applies the whole Kyma status every second, its own
/// `ModuleCatalog` condition included: catalogsync, which wrote the condition before the
/// writer came, leaves it alone (no write, one log line, the contested gauge); once the
/// writer's apply no longer includes the condition (KLM changed) catalogsync writes it again.
#[tokio::test]
async fn condition_kept_by_another_manager_is_left_alone() {
    let env = testenv::env();
    let mut s = Scenario::new("klm-cond").await.expect("scenario");
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    s.add_kyma("k1", &env.skr_a, &[]).await.expect("kyma");
    s.start(&["--resync-period", "1s"]).expect("start");
    s.await_condition("k1", "True", "CatalogSynced", PROMPT).await;

    let mark = env.kcp.read_audit_events().len();
    let writer =
        testenv::klm::KlmStatusWriter::start(s.kcp.clone(), &s.ns, vec!["k1".to_owned()], Duration::from_secs(1));
    s.await_condition("k1", "True", "Ready", PROMPT).await;
    await_gauge(&s, "catalogsync_kyma_condition_contested", &[], 1.0).await;
    let done = s.metric("catalogsync_sync_runs_total", &[r#"result="success""#]).await;
    let done = await_syncs(&s, done, 10.0).await;
    let klm_writes = writer.stop().await.expect("stop the writer");
    // One write: catalogsync gives up its share of the condition it wrote before the writer
    // came (fields both applied with the same value stay shared otherwise).
    let contested = kcp_writes_since(&s, mark);
    assert_eq!(contested.len(), 1, "catalogsync wrote beside the status writer: {:?}", describe(&contested));
    assert_eq!(s.log().matches("Another field manager keeps applying the condition").count(), 1, "reported once");
    eprintln!("contested: 1 KCP write by catalogsync over {done} syncs while the writer made {klm_writes}");

    // KLM no longer writes the condition: its apply leaves it out, so the condition it owned
    // goes, and catalogsync's next sync writes its own.
    let mut changed = testenv::klm::klm_status_body("k1", &s.ns, 1, true);
    let conditions = changed["status"]["conditions"].as_array_mut().expect("conditions");
    conditions.retain(|c| c["type"] != "ModuleCatalog");
    let params = kube::api::PatchParams::apply(testenv::klm::KLM_STATUS_MANAGER).force();
    s.kymas().patch_status("k1", &params, &kube::api::Patch::Apply(&changed)).await.expect("KLM without the condition");
    s.await_condition("k1", "True", "CatalogSynced", PROMPT).await;
    await_gauge(&s, "catalogsync_kyma_condition_contested", &[], 0.0).await;
    let after = kcp_writes_since(&s, mark);
    assert_eq!(after.len(), 2, "giving up its share, then one condition write: {:?}", describe(&after));
}
