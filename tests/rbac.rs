//! The RBAC in `deploy/rbac/` grants nothing beyond what catalogsync uses: run a replica
//! through everything it does against the KCP (start, sync, a Secret problem and its repair,
//! a catalog change, the clean-up of a member Lease a replica left behind, shutdown) and
//! compare the requests in the KCP audit log with the rules.

use std::collections::BTreeSet;
use std::time::Duration;

use catalogsync::api::{MEMBER_LEFT_ANNOTATION, MEMBER_NONCE_ANNOTATION, member_lease_name};
use catalogsync::sharding::lease::new_member;
use k8s_openapi::api::coordination::v1::Lease;
use testenv::scenario::{Scenario, mrm, mt};

const PROMPT: Duration = Duration::from_secs(30);

/// (API group, resource with subresource, verb)
type Permission = (String, String, String);

/// Every (group, resource, verb) the rules of `deploy/rbac/` grant.
fn granted() -> BTreeSet<Permission> {
    let mut out = BTreeSet::new();
    for file in testenv::apply::yaml_files(&testenv::rbac_dir()).expect("deploy/rbac") {
        let text = std::fs::read_to_string(&file).expect("read");
        for doc in testenv::parse_yaml_docs(&text).expect("yaml") {
            if !matches!(doc["kind"].as_str(), Some("Role" | "ClusterRole")) {
                continue;
            }
            for rule in doc["rules"].as_array().into_iter().flatten() {
                let strings = |key: &str| -> Vec<String> {
                    rule[key].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
                };
                for group in strings("apiGroups") {
                    for resource in strings("resources") {
                        for verb in strings("verbs") {
                            out.insert((group.clone(), resource.clone(), verb));
                        }
                    }
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn rbac_grants_exactly_what_catalogsync_uses() {
    let env = testenv::env();
    let mut s = Scenario::new("rbac").await.expect("scenario");
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    s.add_kyma("good", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma_without_secret("lost", &[]).await.expect("kyma");
    let mark = env.kcp.read_audit_events().len();
    // The member Lease of a replica that shut down: the coordinator deletes it a lease duration
    // after it first saw it.
    let leases: kube::Api<Lease> = kube::Api::namespaced(s.kcp.clone(), &s.ns);
    let mut gone = new_member("gone", &s.ns, 8, k8s_openapi::jiff::Timestamp::now());
    gone.metadata.annotations = Some(
        [(MEMBER_NONCE_ANNOTATION.to_owned(), "n".to_owned()), (MEMBER_LEFT_ANNOTATION.to_owned(), "n".to_owned())]
            .into(),
    );
    leases.create(&kube::api::PostParams::default(), &gone).await.expect("create the Lease of a replica that left");
    s.start(&["--resync-period", "2s", "--resync-jitter", "0"]).expect("start");
    s.await_condition("good", "True", "CatalogSynced", PROMPT).await;
    s.await_condition("lost", "False", "AccessSecretMissing", PROMPT).await;
    // Repair the Secret, then lose it again: the same Warning event a second time is a patch.
    s.put_secret("lost", "lost", &s.skr_kubeconfig("lost", &env.skr_b)).await.expect("secret");
    s.await_condition("lost", "True", "CatalogSynced", PROMPT).await;
    s.delete_secret("lost").await.expect("delete secret");
    s.await_condition("lost", "False", "AccessSecretMissing", PROMPT).await;
    s.apply_catalog(&[mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.1.0")])])
        .await
        .expect("change");
    s.await_skr_names(&env.skr_a, testenv::scenario::MT, &["keda-1.0.0", "keda-1.1.0"], PROMPT).await;
    testenv::await_condition(PROMPT, "the coordinator to delete the member Lease of a replica that left", || async {
        matches!(leases.get_opt(&member_lease_name("gone")).await, Ok(None))
    })
    .await;
    let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");
    // The records it wrote when it released its shards exist: the server-side apply that
    // created them was allowed (it needs `create` as well as `patch`).
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(s.kcp.clone(), &s.ns);
    let kept = config_maps.list(&Default::default()).await.expect("list ConfigMaps");
    assert!(
        kept.items.iter().any(|cm| cm.data.as_ref().is_some_and(|d| d.values().any(|v| v.contains("\"good\"")))),
        "a shard record names the synced Kyma: {:?}",
        kept.items.iter().map(|cm| cm.metadata.name.clone()).collect::<Vec<_>>()
    );

    let used: BTreeSet<Permission> = env.kcp.read_audit_events()[mark..]
        .iter()
        .filter(|e| e.user.username == testenv::CATALOGSYNC_USER && e.stage == "ResponseComplete")
        .filter(|e| e.namespace().is_none_or(|ns| ns == s.ns))
        .flat_map(|e| {
            let Some(obj) = e.object_ref.as_ref() else { return Vec::new() };
            let resource = match &obj.subresource {
                Some(sub) => format!("{}/{sub}", obj.resource),
                None => obj.resource.clone(),
            };
            let group = obj.api_group.clone().unwrap_or_default();
            let mut verbs = vec![e.verb.clone()];
            // A server-side apply that created its object was authorized as a create too.
            if e.verb == "patch" && e.response_status.as_ref().is_some_and(|s| s.code == 201) {
                verbs.push("create".to_owned());
            }
            verbs.into_iter().map(|verb| (group.clone(), resource.clone(), verb)).collect()
        })
        .collect();
    let granted = granted();
    let unused: Vec<_> = granted.difference(&used).collect();
    let denied: Vec<_> = used.difference(&granted).collect();
    eprintln!("used: {used:#?}");
    assert!(unused.is_empty(), "deploy/rbac grants what catalogsync never used: {unused:?}");
    assert!(denied.is_empty(), "catalogsync used what deploy/rbac does not grant (so it was denied): {denied:?}");
}
