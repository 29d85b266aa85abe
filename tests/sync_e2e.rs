//! End-to-end sync against real apiservers: one KCP and two SKRs, catalogsync as a process
//! under the ServiceAccount identity and RBAC of `deploy/rbac/`.

use std::time::Duration;

use testenv::scenario::{MRM, MT, Scenario, labelled, mrm, mt};

/// Catalog changes must arrive well within this, without a periodic resync.
const PROMPT: Duration = Duration::from_secs(15);
const BETA: &str = "operator.kyma-project.io/beta";
const INTERNAL: &str = "operator.kyma-project.io/internal";

/// A catalog with a plain, a beta, an internal and a mandatory module version.
fn sample_catalog() -> Vec<serde_json::Value> {
    vec![
        mt("api-gateway", "2.10.0"),
        mt("api-gateway", "2.11.0"),
        mrm("api-gateway", &[("regular", "2.10.0"), ("fast", "2.11.0")]),
        mt("btp-operator", "1.1.0"),
        labelled(mt("btp-operator", "1.2.0"), BETA, "true"),
        mrm("btp-operator", &[("regular", "1.1.0"), ("fast", "1.2.0")]),
        labelled(mt("serverless", "1.6.0"), INTERNAL, "true"),
        mrm("serverless", &[("experimental", "1.6.0")]),
        {
            let mut m = mt("istio", "1.20.0");
            m["spec"]["mandatory"] = serde_json::json!(true);
            m
        },
        {
            let mut m = mrm("istio", &[]);
            m["spec"].as_object_mut().map(|s| s.remove("channels"));
            m["spec"]["mandatory"] = serde_json::json!({"version": "1.20.0"});
            m
        },
    ]
}

#[tokio::test]
async fn new_kymas_get_their_filtered_catalog() {
    let env = testenv::env();
    let mut s = Scenario::new("filter").await.expect("scenario");
    s.apply_catalog(&sample_catalog()).await.expect("catalog");
    s.add_kyma("plain", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("beta", &env.skr_b, &[(BETA, "true")]).await.expect("kyma");
    s.start(&[]).expect("start");

    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "api-gateway-2.11.0", "btp-operator-1.1.0"], PROMPT)
        .await;
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "btp-operator"], PROMPT).await;
    s.await_skr_names(
        &env.skr_b,
        MT,
        &["api-gateway-2.10.0", "api-gateway-2.11.0", "btp-operator-1.1.0", "btp-operator-1.2.0"],
        PROMPT,
    )
    .await;
    s.await_skr_names(&env.skr_b, MRM, &["api-gateway", "btp-operator"], PROMPT).await;
    s.await_condition("plain", "True", "CatalogSynced", PROMPT).await;
    s.await_condition("beta", "True", "CatalogSynced", PROMPT).await;

    // The plain Kyma's btp-operator MRM lost its beta channel; the beta Kyma's kept it.
    let channels = |obj: kube::api::DynamicObject| obj.data["spec"]["channels"].clone();
    let plain = s.skr_api(&env.skr_a, MRM).get("btp-operator").await.expect("mrm");
    assert_eq!(channels(plain.clone()), serde_json::json!([{"channel": "regular", "version": "1.1.0"}]));
    let beta = s.skr_api(&env.skr_b, MRM).get("btp-operator").await.expect("mrm");
    assert_eq!(
        channels(beta),
        serde_json::json!([{"channel": "regular", "version": "1.1.0"}, {"channel": "fast", "version": "1.2.0"}])
    );
    assert_eq!(plain.labels().get("operator.kyma-project.io/managed-by").map(String::as_str), Some("kyma"));
    s.await_ready(PROMPT).await;
}

/// A module `name` at 1.0.0 on the regular channel whose MRM has `kymaSelector: selector`.
fn selected_module(name: &str, selector: serde_json::Value) -> [serde_json::Value; 2] {
    let mut release_meta = mrm(name, &[("regular", "1.0.0")]);
    release_meta["spec"]["kymaSelector"] = selector;
    [mt(name, "1.0.0"), release_meta]
}

#[tokio::test]
async fn restricted_modules_with_invalid_selectors_reach_no_skr() {
    use serde_json::json;
    let env = testenv::env();
    let mut s = Scenario::new("selectors").await.expect("scenario");
    let long = "v".repeat(64);
    // The CRD schema (deploy/crds) types kymaSelector as a LabelSelector without checking its
    // keys and values, so the KCP stores these MRMs; Kubernetes' label selector validation
    // (what lifecycle-manager applies) rejects them. Matched without validation, each would
    // select both Kymas below: NotIn and DoesNotExist on a key no Kyma can carry are true for
    // every Kyma, and In holds the Kymas' own value beside one that is too long.
    let mut catalog = vec![mt("api-gateway", "2.10.0"), mrm("api-gateway", &[("regular", "2.10.0")])];
    catalog.extend(selected_module("good-restricted", json!({"matchLabels": {"kyma-project.io/region": "eu"}})));
    catalog.extend(selected_module(
        "bad-key",
        json!({"matchExpressions": [{"key": "not a valid key!", "operator": "NotIn", "values": ["x"]}]}),
    ));
    catalog.extend(selected_module(
        "long-value",
        json!({"matchExpressions": [{"key": "kyma-project.io/tier", "operator": "In", "values": ["gold", long]}]}),
    ));
    catalog.extend(selected_module(
        "two-slashes",
        json!({"matchExpressions": [{"key": "kyma-project.io/a/b", "operator": "DoesNotExist"}]}),
    ));
    s.apply_catalog(&catalog).await.expect("the KCP accepts MRMs with selectors Kubernetes would reject");
    let labels = [("kyma-project.io/region", "eu"), ("kyma-project.io/tier", "gold")];
    s.add_kyma("eu-gold-a", &env.skr_a, &labels).await.expect("kyma");
    s.add_kyma("eu-gold-b", &env.skr_b, &labels).await.expect("kyma");
    s.start(&["--restricted-modules", "good-restricted,bad-key,long-value,two-slashes"]).expect("start");

    let (kymas, skrs) = (["eu-gold-a", "eu-gold-b"], [&env.skr_a, &env.skr_b]);
    for (kyma, skr) in kymas.into_iter().zip(skrs) {
        s.await_condition(kyma, "True", "CatalogSynced", PROMPT).await;
        // The sync that set the condition wrote the whole desired set: what is there now is it.
        assert_eq!(s.skr_names(skr, MRM).await, ["api-gateway", "good-restricted"].map(String::from).into());
        assert_eq!(
            s.skr_names(skr, MT).await,
            ["api-gateway-2.10.0", "good-restricted-1.0.0"].map(String::from).into()
        );
    }
    assert_eq!(s.metric("catalogsync_catalog_skipped_release_metas", &["reason=\"invalid_selector\""]).await, 3.0);
    let log = s.log();
    for module in ["bad-key", "long-value", "two-slashes"] {
        assert!(
            log.lines().any(|l| l.contains("its kymaSelector is invalid") && l.contains(module)),
            "no WARN for {module}:\n{log}"
        );
    }

    // Once its selector is valid, the same module reaches both SKRs: the selector kept it out.
    s.apply_catalog(&selected_module(
        "long-value",
        json!({"matchExpressions": [{"key": "kyma-project.io/tier", "operator": "In", "values": ["gold"]}]}),
    ))
    .await
    .expect("fix the selector");
    for skr in skrs {
        s.await_skr_names(skr, MRM, &["api-gateway", "good-restricted", "long-value"], PROMPT).await;
        s.await_skr_names(skr, MT, &["api-gateway-2.10.0", "good-restricted-1.0.0", "long-value-1.0.0"], PROMPT).await;
    }
    assert_eq!(s.metric("catalogsync_catalog_skipped_release_metas", &["reason=\"invalid_selector\""]).await, 2.0);
}

/// Every name a kind's copies in `skr` have from now on, including ones created and pruned
/// again in between: a watch that runs until the test ends, returned once its first list is
/// in, so nothing written after this returns is missed.
async fn names_ever_seen(api: kube::Api<kube::api::DynamicObject>) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use futures::StreamExt as _;
    use kube::runtime::watcher::{self, Event};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&seen);
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let mut listed_tx = Some(listed_tx);
    tokio::spawn(watcher::watcher(api, watcher::Config::default()).for_each(move |event| {
        match event {
            Ok(Event::Apply(obj) | Event::InitApply(obj)) => sink.lock().expect("names").push(obj.name_any()),
            Ok(Event::InitDone) => {
                if let Some(tx) = listed_tx.take() {
                    let _ = tx.send(());
                }
            }
            _ => {}
        }
        futures::future::ready(())
    }));
    tokio::time::timeout(PROMPT, listed).await.expect("the SKR watch listed in time").expect("the SKR watch runs");
    seen
}

#[tokio::test]
async fn a_selector_on_a_label_no_selector_read_before_is_judged_on_the_kymas_labels() {
    use serde_json::json;
    let env = testenv::env();
    let mut s = Scenario::new("label-keys").await.expect("scenario");
    s.apply_catalog(&[mt("api-gateway", "2.10.0"), mrm("api-gateway", &[("regular", "2.10.0")])])
        .await
        .expect("catalog");
    s.add_kyma("gold", &env.skr_a, &[("kyma-project.io/tier", "gold")]).await.expect("kyma");
    s.add_kyma("silver", &env.skr_b, &[("kyma-project.io/tier", "silver")]).await.expect("kyma");
    s.start(&["--restricted-modules", "gold-only,not-gold"]).expect("start");
    for kyma in ["gold", "silver"] {
        s.await_condition(kyma, "True", "CatalogSynced", PROMPT).await;
    }
    let seen_a = names_ever_seen(s.skr_api(&env.skr_a, MRM)).await;
    let seen_b = names_ever_seen(s.skr_api(&env.skr_b, MRM)).await;

    // No selector read the tier label so far, so the Kyma cache did not keep it. Judged on
    // the cached labels alone, `NotIn gold` would hold for the gold Kyma too, if only until
    // the Kymas are listed again with the label kept.
    let mut catalog = selected_module("gold-only", json!({"matchLabels": {"kyma-project.io/tier": "gold"}})).to_vec();
    catalog.extend(selected_module(
        "not-gold",
        json!({"matchExpressions": [{"key": "kyma-project.io/tier", "operator": "NotIn", "values": ["gold"]}]}),
    ));
    s.apply_catalog(&catalog).await.expect("selected modules");
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "gold-only"], PROMPT).await;
    s.await_skr_names(&env.skr_b, MRM, &["api-gateway", "not-gold"], PROMPT).await;
    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "gold-only-1.0.0"], PROMPT).await;
    s.await_skr_names(&env.skr_b, MT, &["api-gateway-2.10.0", "not-gold-1.0.0"], PROMPT).await;
    let ever = |seen: &std::sync::Arc<std::sync::Mutex<Vec<String>>>, name: &str| {
        seen.lock().expect("names").iter().any(|n| n == name)
    };
    assert!(!ever(&seen_a, "not-gold"), "the gold Kyma's SKR got not-gold, if only for a while");
    assert!(!ever(&seen_b, "gold-only"), "the silver Kyma's SKR got gold-only, if only for a while");

    // A change of a label the selectors read moves the modules.
    s.set_kyma_label("gold", "kyma-project.io/tier", Some("silver")).await.expect("relabel");
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "not-gold"], PROMPT).await;
    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "not-gold-1.0.0"], PROMPT).await;
}

use kube::ResourceExt as _;

fn spec_of(obj: &kube::api::DynamicObject) -> serde_json::Value {
    obj.data["spec"].clone()
}

/// The `spec` of the SKR copy of a KCP ModuleTemplate `body`: as lifecycle-manager's typed Go
/// structs encode it (docs/catalog-rules.md R3.3).
fn copy_spec(body: &serde_json::Value) -> serde_json::Value {
    let mut spec = body["spec"].clone();
    if let Some(fields) = spec.as_object_mut() {
        catalogsync::catalog::render::typed_spec(catalogsync::catalog::CatalogKind::ModuleTemplate, fields);
    }
    spec
}

#[tokio::test]
async fn catalog_changes_reach_every_skr_without_a_resync() {
    let env = testenv::env();
    let mut s = Scenario::new("changes").await.expect("scenario");
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    s.add_kyma("plain", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("beta", &env.skr_b, &[(BETA, "true")]).await.expect("kyma");
    // A resync far beyond the test: every change below must travel as an event.
    s.start(&["--resync-period", "1h"]).expect("start");
    for skr in [&env.skr_a, &env.skr_b] {
        s.await_skr_names(skr, MT, &["keda-1.0.0"], PROMPT).await;
    }

    // Create: a new module, MT and MRM.
    s.apply_catalog(&[mt("eventing", "0.9.0"), mrm("eventing", &[("regular", "0.9.0")])]).await.expect("create");
    for skr in [&env.skr_a, &env.skr_b] {
        s.await_skr_names(skr, MT, &["eventing-0.9.0", "keda-1.0.0"], PROMPT).await;
        s.await_skr_names(skr, MRM, &["eventing", "keda"], PROMPT).await;
    }

    // Update an MT: the new spec reaches every SKR.
    let mut updated = mt("keda", "1.0.0");
    updated["spec"]["descriptor"]["component"]["labels"] = serde_json::json!([{"name": "rev", "value": "2"}]);
    s.apply_catalog(std::slice::from_ref(&updated)).await.expect("update mt");
    for skr in [&env.skr_a, &env.skr_b] {
        testenv::await_condition(PROMPT, "updated keda-1.0.0 descriptor", || async {
            s.skr_api(skr, MT).get("keda-1.0.0").await.ok().is_some_and(|o| spec_of(&o) == copy_spec(&updated))
        })
        .await;
    }

    // Update an MRM: a new channel with its MT.
    s.apply_catalog(&[mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.1.0")])])
        .await
        .expect("update mrm");
    for skr in [&env.skr_a, &env.skr_b] {
        s.await_skr_names(skr, MT, &["eventing-0.9.0", "keda-1.0.0", "keda-1.1.0"], PROMPT).await;
        testenv::await_condition(PROMPT, "keda MRM with two channels", || async {
            s.skr_api(skr, MRM)
                .get("keda")
                .await
                .ok()
                .is_some_and(|o| spec_of(&o)["channels"].as_array().map(Vec::len) == Some(2))
        })
        .await;
    }

    // Flip keda-1.1.0 to beta: gone from the plain SKR, its channel pruned; kept in the beta SKR.
    s.apply_catalog(&[labelled(mt("keda", "1.1.0"), BETA, "true")]).await.expect("flip beta");
    s.await_skr_names(&env.skr_a, MT, &["eventing-0.9.0", "keda-1.0.0"], PROMPT).await;
    testenv::await_condition(PROMPT, "keda MRM in skr-a pruned to the regular channel", || async {
        s.skr_api(&env.skr_a, MRM)
            .get("keda")
            .await
            .ok()
            .is_some_and(|o| spec_of(&o)["channels"] == serde_json::json!([{"channel": "regular", "version": "1.0.0"}]))
    })
    .await;
    s.await_skr_names(&env.skr_b, MT, &["eventing-0.9.0", "keda-1.0.0", "keda-1.1.0"], PROMPT).await;

    // Flip the plain Kyma to beta and back: entries come and go.
    s.set_kyma_label("plain", BETA, Some("true")).await.expect("label");
    s.await_skr_names(&env.skr_a, MT, &["eventing-0.9.0", "keda-1.0.0", "keda-1.1.0"], PROMPT).await;
    s.set_kyma_label("plain", BETA, None).await.expect("label");
    s.await_skr_names(&env.skr_a, MT, &["eventing-0.9.0", "keda-1.0.0"], PROMPT).await;

    // Delete an MRM: its module disappears (MTs no channel references are not synced).
    s.delete_catalog(MRM, "eventing").await.expect("delete mrm");
    for skr in [&env.skr_a, &env.skr_b] {
        s.await_skr_names(skr, MRM, &["keda"], PROMPT).await;
    }
    s.await_skr_names(&env.skr_a, MT, &["keda-1.0.0"], PROMPT).await;
    // Delete an MT: the channel pointing at it is pruned, and the copy goes.
    s.delete_catalog(MT, "keda-1.1.0").await.expect("delete mt");
    s.await_skr_names(&env.skr_b, MT, &["keda-1.0.0"], PROMPT).await;
    assert!(s.metric("catalogsync_sync_runs_total", &["result=\"error\""]).await == 0.0, "{}", s.log());
}

/// keda 1.0.0 on the regular channel and 1.1.0 on the fast one.
fn keda_on_two_channels() -> [serde_json::Value; 3] {
    [mt("keda", "1.0.0"), mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.1.0")])]
}

#[tokio::test]
async fn drift_is_repaired_and_user_objects_are_left_alone() {
    let env = testenv::env();
    let skr = &env.skr_a;
    let mut s = Scenario::new("drift").await.expect("scenario");
    s.apply_catalog(&keda_on_two_channels()).await.expect("catalog");
    s.add_kyma("k", skr, &[]).await.expect("kyma");

    // Before catalogsync runs, the SKR holds what lifecycle-manager left there: an up-to-date
    // copy and a stale one written under field manager catalog-sync, and a user's own MT.
    testenv::create_namespace(&skr.admin_client(), &s.sync_ns).await.expect("ns");
    testenv::install_catalogsync_crds(skr).await.expect("crds");
    let as_copy = |body: serde_json::Value| {
        let mut b = body;
        b["metadata"]["namespace"] = serde_json::json!(s.sync_ns);
        b["metadata"]["labels"]["operator.kyma-project.io/managed-by"] = serde_json::json!("kyma");
        b["spec"] = copy_spec(&b);
        b
    };
    let ssa = |manager: &'static str| kube::api::PatchParams::apply(manager).force();
    let mts = s.skr_api(skr, MT);
    let klm_copy = mts
        .patch("keda-1.0.0", &ssa("catalog-sync"), &kube::api::Patch::Apply(as_copy(mt("keda", "1.0.0"))))
        .await
        .expect("klm copy");
    mts.patch("old-0.1.0", &ssa("catalog-sync"), &kube::api::Patch::Apply(as_copy(mt("old", "0.1.0"))))
        .await
        .expect("stale");
    let mut own = mt("mine", "1.0.0");
    own["metadata"]["namespace"] = serde_json::json!(s.sync_ns);
    mts.patch("mine-1.0.0", &ssa("skr-admin"), &kube::api::Patch::Apply(&own)).await.expect("user mt");

    s.start(&["--resync-period", "2s", "--resync-jitter", "0"]).expect("start");
    // The stale managed copy is pruned, the user's MT stays, the desired ones are there.
    s.await_skr_names(skr, MT, &["keda-1.0.0", "keda-1.1.0", "mine-1.0.0"], PROMPT).await;
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;
    // The copy KLM wrote was already right: adopted without a write.
    let adopted = mts.get("keda-1.0.0").await.expect("copy");
    assert_eq!(adopted.resource_version(), klm_copy.resource_version(), "an identical copy was rewritten");

    // An SKR admin edits a copy, changing a field and adding one: it comes back on the next
    // resync, without the added field.
    let edit = serde_json::json!({"spec": {"version": "6.6.6", "descriptor": {"tampered": true}}});
    mts.patch("keda-1.1.0", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&edit)).await.expect("edit");
    testenv::await_condition(PROMPT, "edited copy repaired", || async {
        mts.get("keda-1.1.0").await.ok().is_some_and(|o| spec_of(&o) == copy_spec(&mt("keda", "1.1.0")))
    })
    .await;
    // An SKR admin deletes a copy: it comes back.
    mts.delete("keda-1.0.0", &Default::default()).await.expect("delete");
    s.await_skr_names(skr, MT, &["keda-1.0.0", "keda-1.1.0", "mine-1.0.0"], PROMPT).await;
    let mrms = s.skr_api(skr, MRM);
    mrms.delete("keda", &Default::default()).await.expect("delete mrm");
    s.await_skr_names(skr, MRM, &["keda"], PROMPT).await;

    // The user's own MT was never written by catalogsync.
    let mine = mts.get("mine-1.0.0").await.expect("user mt");
    let managers: Vec<String> = mine.managed_fields().iter().filter_map(|f| f.manager.clone()).collect();
    assert_eq!(managers, ["skr-admin"], "catalogsync touched a user object");
    assert_eq!(spec_of(&mine), own["spec"]);
}

/// Prunes delete a copy only as it was listed: each DELETE carries the copy's UID and
/// resourceVersion as preconditions (the SKR's audit log holds the `DeleteOptions` of catalog
/// deletes), so a copy recreated or changed since the list would stay. Both a cold prune
/// (after a full list) and a warm one (after a metadata-only list) are checked.
#[tokio::test]
async fn prunes_carry_the_listed_uid_and_resource_version_as_preconditions() {
    let env = testenv::env();
    let skr = &env.skr_b;
    let mut s = Scenario::new("prune-pre").await.expect("scenario");
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    s.add_kyma("k", skr, &[]).await.expect("kyma");

    // Before catalogsync runs: a stale copy written under field manager catalog-sync.
    testenv::create_namespace(&skr.admin_client(), &s.sync_ns).await.expect("ns");
    testenv::install_catalogsync_crds(skr).await.expect("crds");
    let mut stale = mt("old", "0.1.0");
    stale["metadata"]["namespace"] = serde_json::json!(s.sync_ns);
    let mts = s.skr_api(skr, MT);
    let ssa = kube::api::PatchParams::apply("catalog-sync").force();
    let stale = mts.patch("old-0.1.0", &ssa, &kube::api::Patch::Apply(&stale)).await.expect("stale copy");

    s.start(&[]).expect("start");
    s.await_skr_names(skr, MT, &["keda-1.0.0"], PROMPT).await;
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;

    // A module that comes and goes: its copies are pruned by a warm sync.
    s.apply_catalog(&[mt("serverless", "1.6.0"), mrm("serverless", &[("regular", "1.6.0")])]).await.expect("add");
    s.await_skr_names(skr, MT, &["keda-1.0.0", "serverless-1.6.0"], PROMPT).await;
    s.await_skr_names(skr, MRM, &["keda", "serverless"], PROMPT).await;
    let copy = mts.get("serverless-1.6.0").await.expect("the serverless copy");
    s.delete_catalog(MRM, "serverless").await.expect("delete mrm");
    s.delete_catalog(MT, "serverless-1.6.0").await.expect("delete mt");
    s.await_skr_names(skr, MT, &["keda-1.0.0"], PROMPT).await;
    s.await_skr_names(skr, MRM, &["keda"], PROMPT).await;

    let user = s.skr_user("k");
    let deletes: Vec<testenv::AuditEvent> = skr
        .read_audit_events()
        .into_iter()
        .filter(|e| e.verb == "delete" && e.user.username == user && e.namespace() == Some(s.sync_ns.as_str()))
        .filter(|e| e.stage == "ResponseComplete")
        .collect();
    let summary: Vec<String> = deletes
        .iter()
        .map(|e| format!("{} {:?} -> {} {:?}", e.resource(), e.name(), e.code(), e.request_object))
        .collect();
    assert_eq!(deletes.len(), 3, "deletes by {user}: {summary:#?}");
    for (obj, resource) in [(&stale, MT), (&copy, MT)] {
        let name = obj.metadata.name.as_deref();
        let delete = deletes.iter().find(|e| e.resource() == resource && e.name() == name).expect("its delete");
        assert_eq!(delete.code(), 200, "{summary:#?}");
        let preconditions = delete.request_object.as_ref().map(|o| o["preconditions"].clone());
        let listed = serde_json::json!({"uid": obj.metadata.uid, "resourceVersion": obj.metadata.resource_version});
        assert_eq!(preconditions, Some(listed), "{name:?}: {summary:#?}");
    }
    let mrm_delete = deletes.iter().find(|e| e.resource() == MRM).expect("the MRM's delete");
    let preconditions = mrm_delete.request_object.as_ref().map(|o| o["preconditions"].clone()).unwrap_or_default();
    assert!(preconditions["uid"].is_string() && preconditions["resourceVersion"].is_string(), "{summary:#?}");
    assert_eq!(s.metric("catalogsync_skr_requests_total", &["verb=\"delete\"", "result=\"conflict\""]).await, 0.0);
    assert!(s.metric("catalogsync_sync_runs_total", &["result=\"error\""]).await == 0.0, "{}", s.log());
}

#[tokio::test]
async fn skr_crds_are_created_when_missing_and_not_rewritten_when_equal() {
    let env = testenv::env();
    let skr = env.start_extra_skr("skr-crd").await.expect("skr");
    let mut s = Scenario::new("crds").await.expect("scenario");
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    s.add_kyma("k", &skr, &[]).await.expect("kyma");
    s.start(&[]).expect("start");
    s.await_skr_names(&skr, MT, &["keda-1.0.0"], PROMPT).await;
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;

    let crds: kube::Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        kube::Api::all(skr.admin_client());
    let names = ["moduletemplates.operator.kyma-project.io", "modulereleasemetas.operator.kyma-project.io"];
    let mut versions = Vec::new();
    for name in names {
        let crd = crds.get(name).await.expect("crd in skr");
        assert_eq!(crd.labels().get("operator.kyma-project.io/managed-by").map(String::as_str), Some("kyma"));
        let strategy = crd.spec.conversion.as_ref().map(|c| c.strategy.as_str());
        assert_eq!(strategy, Some("None"));
        versions.push(crd.resource_version());
    }
    // The Kyma CRD stays KLM's business.
    assert!(crds.get_opt("kymas.operator.kyma-project.io").await.expect("get").is_none());

    // A restarted catalogsync verifies the CRDs (a cold sync) and does not rewrite them.
    let before = skr.read_audit_events().len();
    s.catalogsync.take();
    s.start(&[]).expect("restart");
    testenv::await_condition(PROMPT, "a successful sync after the restart", || async {
        s.metric("catalogsync_sync_runs_total", &["result=\"success\""]).await >= 1.0
    })
    .await;
    for (name, version) in names.iter().zip(&versions) {
        assert_eq!(&crds.get(name).await.expect("crd").resource_version(), version, "{name} was rewritten");
    }
    let writes: Vec<String> = skr.read_audit_events()[before..]
        .iter()
        .filter(|e| e.is_write() && e.user.username == s.skr_user("k"))
        .map(|e| format!("{} {} {:?}", e.verb, e.resource(), e.name()))
        .collect();
    assert!(writes.is_empty(), "writes after the restart: {writes:?}");
}

#[tokio::test]
async fn kyma_gets_only_its_condition_and_steady_state_writes_nothing() {
    let env = testenv::env();
    let mut s = Scenario::new("steady").await.expect("scenario");
    s.apply_catalog(&sample_catalog()).await.expect("catalog");
    s.add_kyma("k1", &env.skr_a, &[("kyma-project.io/runtime-id", "k1")]).await.expect("kyma");
    s.add_kyma("k2", &env.skr_b, &[(BETA, "true"), (INTERNAL, "true")]).await.expect("kyma");
    let before_kyma = s.kymas().get("k1").await.expect("kyma");
    s.start(&["--resync-period", "2s", "--resync-jitter", "0"]).expect("start");
    let cond = s.await_condition("k1", "True", "CatalogSynced", PROMPT).await;
    s.await_condition("k2", "True", "CatalogSynced", PROMPT).await;
    assert_eq!(cond.observed_generation, before_kyma.metadata.generation);

    // The only change to the Kyma is the ModuleCatalog condition, owned by catalogsync.
    let after = s.kymas().get("k1").await.expect("kyma");
    assert_eq!(after.data["spec"], before_kyma.data["spec"]);
    assert_eq!(after.metadata.labels, before_kyma.metadata.labels);
    assert_eq!(after.metadata.annotations, before_kyma.metadata.annotations);
    assert_eq!(after.metadata.generation, before_kyma.metadata.generation);
    let ours: Vec<_> = after.managed_fields().iter().filter(|f| f.manager.as_deref() == Some("catalogsync")).collect();
    assert_eq!(ours.len(), 1, "{:?}", after.managed_fields());
    assert_eq!(ours[0].subresource.as_deref(), Some("status"));
    let fields = serde_json::to_value(&ours[0].fields_v1).expect("fields");
    assert_eq!(
        fields,
        serde_json::json!({"f:status": {"f:conditions": {"k:{\"type\":\"ModuleCatalog\"}": {
            ".": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:observedGeneration": {},
            "f:reason": {}, "f:status": {}, "f:type": {}
        }}}}),
    );

    // Steady state: over three resync periods, no write anywhere, and a bounded number of
    // reads per SKR sync.
    let kcp_mark = env.kcp.read_audit_events().len();
    let skr_marks = [env.skr_a.read_audit_events().len(), env.skr_b.read_audit_events().len()];
    let runs = s.metric("catalogsync_sync_runs_total", &["result=\"success\""]).await;
    testenv::await_condition(Duration::from_secs(20), "three more resyncs of both Kymas", || async {
        s.metric("catalogsync_sync_runs_total", &["result=\"success\""]).await >= runs + 6.0
    })
    .await;
    let kcp_writes: Vec<String> = env.kcp.read_audit_events()[kcp_mark..]
        .iter()
        // Other scenarios run in parallel under the same identity: look at this one's namespace.
        // Lease renewals (member and coordinator) are the heartbeat: a fixed cost per replica,
        // independent of the number of SKRs. Shard Leases must not be written.
        .filter(|e| {
            e.is_write() && e.user.username == testenv::CATALOGSYNC_USER && e.namespace() == Some(s.ns.as_str())
        })
        .filter(|e| {
            let heartbeat = e.resource() == "leases"
                && e.name().is_some_and(|n| n.starts_with("catalogsync-member-") || n == "catalogsync-coordinator");
            !heartbeat
        })
        .map(|e| format!("{} {} {:?}", e.verb, e.resource(), e.name()))
        .collect();
    assert!(kcp_writes.is_empty(), "KCP writes in steady state: {kcp_writes:?}");
    for ((skr, mark), kyma) in [&env.skr_a, &env.skr_b].into_iter().zip(skr_marks).zip(["k1", "k2"]) {
        let events: Vec<_> = skr.read_audit_events()[mark..]
            .iter()
            .filter(|e| e.user.username == s.skr_user(kyma) && e.stage == "ResponseComplete")
            .cloned()
            .collect();
        let writes: Vec<_> =
            events.iter().filter(|e| e.is_write()).map(|e| (e.verb.clone(), e.resource().to_owned())).collect();
        assert!(writes.is_empty(), "SKR writes in steady state for {kyma}: {writes:?}");
        // Per resync: the copies of both kinds listed (metadata only), and the namespace and
        // both CRDs read (the drift bound: each is verified once per resync period).
        let requests: Vec<(&str, &str)> = events.iter().map(|e| (e.verb.as_str(), e.resource())).collect();
        let expected = [
            ("list", "moduletemplates"),
            ("list", "modulereleasemetas"),
            ("get", "namespaces"),
            ("get", "customresourcedefinitions"),
        ];
        assert!(
            requests.iter().all(|r| expected.contains(r)),
            "{kyma}: steady-state requests other than the lists and the reads of the drift bound: {requests:?}"
        );
        let lists = requests.iter().filter(|(verb, _)| *verb == "list").count();
        assert!(lists >= 6, "{kyma}: expected two lists per resync, saw {lists}");
    }
}

#[tokio::test]
async fn klm_shaped_module_template_round_trips_without_losing_fields() {
    let env = testenv::env();
    let mut s = Scenario::new("roundtrip").await.expect("scenario");
    let mut big = mt("btp-operator", "1.1.0");
    let resources: Vec<serde_json::Value> = (0..120)
        .map(|i| {
            serde_json::json!({
                "name": format!("resource-{i}"), "type": "ociArtifact", "relation": "external", "version": "1.1.0",
                "labels": [{"name": "oci-artifact", "value": {"digest": format!("sha256:{i:064x}")}, "version": "v1"}],
                "access": {"type": "ociArtifact", "imageReference": format!("europe-docker.pkg.dev/kyma/btp-operator/r{i}:1.1.0")},
                "digest": {"hashAlgorithm": "SHA-256", "normalisationAlgorithm": "ociArtifactDigest/v1", "value": format!("{i:064x}")},
            })
        })
        .collect();
    big["spec"]["descriptor"] = serde_json::json!({
        "meta": {"schemaVersion": "v2"},
        "component": {
            "name": "kyma-project.io/module/btp-operator", "version": "1.1.0", "provider": "internal",
            "repositoryContexts": [{"type": "OCIRegistry", "baseUrl": "europe-docker.pkg.dev/kyma", "componentNameMapping": "urlPath"}],
            "resources": resources, "sources": [{"name": "src", "type": "Github", "access": {"commit": "abc", "repoUrl": "github.com/kyma-project/btp-manager"}}],
            "componentReferences": [], "labels": [{"name": "security.kyma-project.io/scan", "value": "enabled"}],
        },
        "signatures": [{"name": "kyma", "digest": {"hashAlgorithm": "SHA-256", "value": "00ff"}, "signature": {"algorithm": "RSASSA-PSS", "value": "abcd", "mediaType": "application/vnd.ocm.signature.rsa"}}],
    });
    big["spec"]["data"] = serde_json::json!({
        "apiVersion": "operator.kyma-project.io/v1alpha1", "kind": "BtpOperator",
        "metadata": {"name": "btpoperator", "namespace": "kyma-system"},
        "spec": {"unknownField": {"nested": [1, 2, {"deep": "yes"}]}, "anotherOne": "x"},
    });
    big["spec"]["info"] = serde_json::json!({"repository": "https://github.com/kyma-project/btp-manager", "documentation": "https://kyma-project.io", "icons": [{"name": "icon", "link": "https://x/icon.svg"}]});
    big["spec"]["manager"] = serde_json::json!({"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "kyma-system", "name": "btp-manager"});
    big["spec"]["associatedResources"] =
        serde_json::json!([{"group": "services.cloud.sap.com", "version": "v1", "kind": "ServiceInstance"}]);
    big["spec"]["resources"] = serde_json::json!([{"name": "rawManifest", "link": "https://x/manifest.yaml"}]);
    big["spec"]["requiresDowntime"] = serde_json::json!(false);
    big["metadata"]["annotations"] = serde_json::json!({"operator.kyma-project.io/is-cluster-scoped": "false", "kubectl.kubernetes.io/last-applied-configuration": "{}"});
    assert!(serde_json::to_vec(&big).expect("json").len() > 30_000, "descriptor should be KLM-sized");
    s.apply_catalog(&[big.clone(), mrm("btp-operator", &[("regular", "1.1.0")])]).await.expect("catalog");
    s.add_kyma("k", &env.skr_a, &[]).await.expect("kyma");
    s.start(&[]).expect("start");
    s.await_skr_names(&env.skr_a, MT, &["btp-operator-1.1.0"], PROMPT).await;

    let kcp = s.catalog_api(MT).get("btp-operator-1.1.0").await.expect("kcp mt");
    assert_eq!(spec_of(&kcp), big["spec"], "the KCP CRD dropped fields");
    let copy = s.skr_api(&env.skr_a, MT).get("btp-operator-1.1.0").await.expect("skr copy");
    assert_eq!(spec_of(&copy), copy_spec(&big), "the SKR copy lost fields");
    assert_eq!(copy.data["spec"]["channel"], "", "the zero-valued fields lifecycle-manager sends are sent");
    let annotations = copy.annotations();
    assert_eq!(annotations.get("operator.kyma-project.io/is-cluster-scoped").map(String::as_str), Some("false"));
    assert_eq!(
        annotations.get("kubectl.kubernetes.io/last-applied-configuration").map(String::as_str),
        Some("{}"),
        "every KCP annotation, as lifecycle-manager keeps them"
    );
    assert!(copy.owner_references().is_empty() && copy.finalizers().is_empty());
}

/// A catalog change reaches an SKR that was verified within the resync period with one write
/// per changed copy and no other request (no list): the replica plans from what it remembers
/// of the SKR. The resync after it lists again.
#[tokio::test]
async fn a_catalog_change_to_a_warm_skr_costs_one_write_per_changed_copy() {
    let env = testenv::env();
    let skr = &env.skr_a;
    let mut s = Scenario::new("one-write").await.expect("scenario");
    s.apply_catalog(&keda_on_two_channels()).await.expect("catalog");
    s.add_kyma("k", skr, &[]).await.expect("kyma");
    s.start(&["--resync-period", "1h"]).expect("start");
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(skr, MT, &["keda-1.0.0", "keda-1.1.0"], PROMPT).await;

    let mark = skr.read_audit_events().len();
    let runs = s.metric("catalogsync_sync_runs_total", &["result=\"success\""]).await;
    let mut updated = mt("keda", "1.1.0");
    updated["spec"]["descriptor"]["component"]["labels"] = serde_json::json!([{"name": "rev", "value": "2"}]);
    s.apply_catalog(std::slice::from_ref(&updated)).await.expect("update mt");
    let mts = s.skr_api(skr, MT);
    testenv::await_condition(PROMPT, "the updated keda-1.1.0 in the SKR", || async {
        mts.get("keda-1.1.0").await.ok().is_some_and(|o| spec_of(&o) == copy_spec(&updated))
    })
    .await;
    // The sync of the change has finished (the audit log is written before each response).
    testenv::await_condition(PROMPT, "the sync of the change to finish", || async {
        s.metric("catalogsync_sync_runs_total", &["result=\"success\""]).await > runs
    })
    .await;
    assert_eq!(
        skr_requests(&s, skr, "k", mark),
        [("patch".to_owned(), "moduletemplates".to_owned(), Some("keda-1.1.0".to_owned()))],
        "the SKR requests of one MT change"
    );
}

/// The ConfigMaps in the scenario's namespace, where the replica keeps its shard records.
fn shard_records(s: &Scenario) -> kube::Api<k8s_openapi::api::core::v1::ConfigMap> {
    kube::Api::namespaced(s.kcp.clone(), &s.ns)
}

/// The SKR requests `kyma`'s sync made since audit entry `mark`: verb, resource, name.
fn skr_requests(
    s: &Scenario,
    skr: &testenv::ControlPlane,
    kyma: &str,
    mark: usize,
) -> Vec<(String, String, Option<String>)> {
    skr.read_audit_events()[mark..]
        .iter()
        .filter(|e| e.user.username == s.skr_user(kyma) && e.stage == "ResponseComplete")
        .map(|e| (e.verb.clone(), e.resource().to_owned(), e.name().map(str::to_owned)))
        .collect()
}

#[tokio::test]
async fn a_restart_verifies_unchanged_skrs_from_what_the_replica_kept() {
    let env = testenv::env();
    let mut s = Scenario::new("recall").await.expect("scenario");
    s.apply_catalog(&keda_on_two_channels()).await.expect("catalog");
    s.add_kyma("same", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("edited", &env.skr_b, &[]).await.expect("kyma");
    s.start(&["--resync-period", "1h"]).expect("start");
    for (kyma, skr) in [("same", &env.skr_a), ("edited", &env.skr_b)] {
        s.await_condition(kyma, "True", "CatalogSynced", PROMPT).await;
        s.await_skr_names(skr, MT, &["keda-1.0.0", "keda-1.1.0"], PROMPT).await;
    }
    let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");

    // It kept a record of both SKRs when it released its shards; nothing of a Secret but its
    // UID and resourceVersion.
    let records = s.shard_records_text().await.expect("the shard records");
    for kyma in ["same", "edited"] {
        assert!(records.contains(&format!("\"{kyma}\"")), "{kyma} kept: {records}");
    }
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(s.kcp.clone(), &s.ns);
    for secret in secrets.list(&Default::default()).await.expect("secrets").items {
        for value in secret.data.unwrap_or_default().into_values() {
            for line in String::from_utf8_lossy(&value.0).lines().map(str::trim).filter(|l| l.len() >= 24) {
                assert!(!records.contains(line), "a record holds Secret content: {line}");
            }
        }
    }

    // While no replica runs, an SKR admin edits a copy in one SKR.
    let edited = s.skr_api(&env.skr_b, MT);
    let edit = serde_json::json!({"spec": {"version": "6.6.6"}});
    edited
        .patch("keda-1.1.0", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&edit))
        .await
        .expect("edit");

    let marks = (env.skr_a.read_audit_events().len(), env.skr_b.read_audit_events().len());
    s.start(&["--resync-period", "1h"]).expect("restart");
    testenv::await_condition(PROMPT, "the edited copy repaired", || async {
        edited.get("keda-1.1.0").await.ok().is_some_and(|o| spec_of(&o) == copy_spec(&mt("keda", "1.1.0")))
    })
    .await;
    testenv::await_condition(PROMPT, "both SKRs synced after the restart", || async {
        s.metric("catalogsync_sync_runs_total", &["result=\"success\""]).await >= 2.0
    })
    .await;
    // The unchanged SKR: the namespace and both CRDs read (a record never stands in for
    // them), two metadata-only lists, no write.
    let list = |resource: &str| ("list".to_owned(), resource.to_owned(), None);
    let get = |resource: &str, name: &str| ("get".to_owned(), resource.to_owned(), Some(name.to_owned()));
    let setup = [
        get("namespaces", &s.sync_ns),
        get("customresourcedefinitions", "modulereleasemetas.operator.kyma-project.io"),
        get("customresourcedefinitions", "moduletemplates.operator.kyma-project.io"),
    ];
    let mut expected = setup.to_vec();
    expected.extend([list("moduletemplates"), list("modulereleasemetas")]);
    assert_eq!(
        skr_requests(&s, &env.skr_a, "same", marks.0),
        expected,
        "the SKR requests of an unchanged SKR after a restart"
    );
    // The edited one: its ModuleTemplates listed again in full, the edited copy applied.
    let mut expected = setup.to_vec();
    expected.extend([
        list("moduletemplates"),
        list("moduletemplates"),
        ("patch".to_owned(), "moduletemplates".to_owned(), Some("keda-1.1.0".to_owned())),
        list("modulereleasemetas"),
    ]);
    assert_eq!(
        skr_requests(&s, &env.skr_b, "edited", marks.1),
        expected,
        "the SKR requests of an SKR edited while no replica ran"
    );
}

#[tokio::test]
async fn an_unreadable_record_costs_a_full_verification_and_nothing_else() {
    let env = testenv::env();
    let skr = &env.skr_a;
    let mut s = Scenario::new("bad-record").await.expect("scenario");
    s.apply_catalog(&keda_on_two_channels()).await.expect("catalog");
    s.add_kyma("k", skr, &[]).await.expect("kyma");
    testenv::create_namespace(&skr.admin_client(), &s.sync_ns).await.expect("ns");
    // Records of every shard that do not parse, of another format, or that name the Kyma
    // with digests that match nothing.
    let config_maps = shard_records(&s);
    let texts = [
        "{not json".to_owned(),
        r#"{"format":99,"skrs":{}}"#.to_owned(),
        r#"{"format":1,"skrs":{"k":{"secret":"x/y","kinds":{"ModuleTemplate":"00"}}}}"#.to_owned(),
        "x".repeat(512 * 1024),
    ];
    for (shard, text) in texts.iter().enumerate() {
        let cm = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("catalogsync-shard-{shard}-memory")},
            "data": {"skrs.json": text},
        });
        config_maps.create(&Default::default(), &serde_json::from_value(cm).expect("cm")).await.expect("create");
    }
    s.start(&["--resync-period", "1h"]).expect("start");
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(skr, MT, &["keda-1.0.0", "keda-1.1.0"], PROMPT).await;
    s.await_skr_names(skr, MRM, &["keda"], PROMPT).await;
}

/// A replica stopped right after its start (before, or just after, its Kyma cache filled)
/// leaves the shard records as good as it found them: it takes no shard before the cache is
/// filled, and a record is only ever replaced by one that knows at least as much of the
/// shard's SKRs (`sync::recall`), so the next start still verifies from the record.
#[tokio::test]
async fn a_replica_stopped_at_once_leaves_the_shard_records_as_good_as_it_found_them() {
    let env = testenv::env();
    let skr = &env.skr_a;
    let mut s = Scenario::new("record-kept").await.expect("scenario");
    s.apply_catalog(&keda_on_two_channels()).await.expect("catalog");
    s.add_kyma("k", skr, &[]).await.expect("kyma");
    s.start(&["--resync-period", "1h"]).expect("start");
    s.await_condition("k", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(skr, MT, &["keda-1.0.0", "keda-1.1.0"], PROMPT).await;
    let stop = async |s: &mut Scenario| {
        let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
        assert!(status.success(), "catalogsync exited with {status}");
    };
    stop(&mut s).await;
    let good = s.shard_records_text().await.expect("the shard records");
    assert!(good.contains("\"k\""), "k kept: {good}");

    // Started and stopped as soon as it answers on its HTTP port, three times over.
    for _ in 0..3 {
        s.start(&["--resync-period", "1h"]).expect("restart");
        testenv::await_condition(PROMPT, "catalogsync to answer /healthz", || async {
            s.http_get("/healthz").await.is_ok()
        })
        .await;
        stop(&mut s).await;
        let records = s.shard_records_text().await.expect("the shard records");
        assert!(records.contains("\"k\""), "a start stopped at once lost k's entry: {records}");
    }

    // The next start verifies k's SKR from the record: metadata-only lists, no full list.
    let mark = skr.read_audit_events().len();
    s.start(&["--resync-period", "1h"]).expect("restart");
    testenv::await_condition(PROMPT, "k synced after the restart", || async {
        s.metric("catalogsync_sync_runs_total", &["result=\"success\""]).await >= 1.0
    })
    .await;
    let lists = skr_requests(&s, skr, "k", mark).into_iter().filter(|(verb, _, _)| verb == "list").count();
    assert_eq!(lists, 2, "one metadata-only list per kind after the restart");
}
