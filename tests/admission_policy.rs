//! The optional ValidatingAdmissionPolicy of `deploy/admission-policy` on the real KCP
//! apiserver (kube-apiserver 1.35): with it in force, catalogsync's identity may change a
//! Kyma's `ModuleCatalog` condition and nothing else of a Kyma (no other status field, no other
//! condition, no spec, no metadata, no create or delete), even where its RBAC allows more;
//! another identity is not affected; and catalogsync itself syncs and writes its condition
//! under it.
//!
//! Each test installs the policy and its binding under names of its own, bound to its own
//! namespace only (a namespaceSelector), and deletes both when it ends, also when it fails.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::time::Duration;

use catalogsync::api::ConditionStatus;
use catalogsync::api::{KCP_FIELD_MANAGER, Kyma, MODULE_CATALOG_CONDITION};
use catalogsync::error::ConditionReason;
use catalogsync::sync::condition::{self, Wanted};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
use testenv::kustomize::{kind_of, kustomize_build as render, name_of, the};
use testenv::scenario::{Scenario, mrm, mt};
use testenv::{CATALOGSYNC_GROUPS, CATALOGSYNC_USER};

const PROMPT: Duration = Duration::from_secs(30);
/// The kustomization of the policy.
const POLICY_DIR: &str = "deploy/admission-policy";
/// An identity the policy must leave alone: lifecycle-manager's ServiceAccount, which writes
/// the rest of a Kyma's status.
const KLM_USER: &str = "system:serviceaccount:kcp-system:klm-controller-manager";
const KLM_GROUPS: &[&str] = &["system:serviceaccounts", "system:serviceaccounts:kcp-system"];
/// lifecycle-manager's field manager of the Kyma status.
const KLM_MANAGER: &str = "lifecycle-manager";

/// The policy and binding of [`POLICY_DIR`], installed under names of their own and bound to
/// one namespace; both are deleted on drop.
struct InstalledPolicy {
    policy: String,
    binding: String,
}

impl InstalledPolicy {
    /// Renders [`POLICY_DIR`], renames the policy and binding after `ns`, limits the binding
    /// to namespace `ns`, and applies both.
    async fn install(admin: &Client, ns: &str) -> Self {
        let mut docs = render(POLICY_DIR);
        let policy = format!("{}-{ns}", name_of(the(&docs, "ValidatingAdmissionPolicy")));
        let binding = format!("{}-{ns}", name_of(the(&docs, "ValidatingAdmissionPolicyBinding")));
        let installed = Self { policy: policy.clone(), binding: binding.clone() };
        for doc in &mut docs {
            match kind_of(doc) {
                "ValidatingAdmissionPolicy" => doc["metadata"]["name"] = json!(policy),
                "ValidatingAdmissionPolicyBinding" => {
                    assert!(doc["spec"]["matchResources"].is_null(), "the shipped binding selects every namespace");
                    doc["metadata"]["name"] = json!(binding);
                    doc["spec"]["policyName"] = json!(policy);
                    doc["spec"]["matchResources"] = json!({
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    });
                }
                other => panic!("{POLICY_DIR} renders a {other}"),
            }
        }
        testenv::apply_docs(admin, docs).await.expect("apply the admission policy");
        installed
    }
}

impl Drop for InstalledPolicy {
    fn drop(&mut self) {
        let (policy, binding) = (self.policy.clone(), self.binding.clone());
        let deleted = testenv::block_on_own_thread(async move {
            let admin = testenv::env().kcp.admin_client();
            let params = DeleteParams::default();
            Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()).delete(&binding, &params).await?;
            Api::<ValidatingAdmissionPolicy>::all(admin).delete(&policy, &params).await?;
            Ok(())
        });
        if let Err(e) = deleted {
            eprintln!("failed to delete admission policy {}: {e:#}", self.policy);
        }
    }
}

/// A client for `user` in `groups` in the KCP.
async fn client_for(user: &str, groups: &[&str]) -> Client {
    testenv::env().kcp.client_for(user, groups).await.expect("a client")
}

/// The Kymas of namespace `ns` through `client`.
fn kymas(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<Kyma>(&()))
}

/// Lets catalogsync's identity and lifecycle-manager's do anything to the Kymas of `ns`, so
/// that every refusal of catalogsync's writes below is the policy's, not RBAC's.
async fn allow_all_kyma_writes(admin: &Client, ns: &str) {
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "kyma-writer", "namespace": ns},
        "rules": [{
            "apiGroups": ["operator.kyma-project.io"],
            "resources": ["kymas", "kymas/status"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        }],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "kyma-writer", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kyma-writer"},
        "subjects": [
            {"kind": "ServiceAccount", "name": "catalogsync", "namespace": testenv::CATALOGSYNC_NAMESPACE},
            {"kind": "ServiceAccount", "name": "klm-controller-manager", "namespace": "kcp-system"},
        ],
    });
    testenv::apply_docs(admin, vec![role, binding]).await.expect("apply the Kyma writer Role");
}

/// A condition of the Kyma status.
fn condition_of(type_: &str, status: &str, reason: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": "set by the test", "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// lifecycle-manager's status apply: its state, channel and `Ready` condition.
fn klm_status(name: &str, state: &str, ready: &str) -> Value {
    json!({
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "Kyma",
        "metadata": {"name": name},
        "status": {"state": state, "activeChannel": "regular", "conditions": [condition_of("Ready", ready, "Ready")]},
    })
}

/// The status apply catalogsync sends for `wanted` on `kyma` (as it is now in the KCP).
async fn condition_apply(
    api: &Api<DynamicObject>,
    kyma: &str,
    status: ConditionStatus,
    reason: ConditionReason,
) -> Value {
    let kyma: Kyma =
        serde_json::from_value(serde_json::to_value(api.get(kyma).await.expect("get the Kyma")).expect("JSON"))
            .expect("a Kyma");
    let wanted =
        Wanted { status, reason, message: "set by the test".into(), observed_generation: kyma.metadata.generation };
    condition::apply_body(&kyma, condition::current(&kyma), &wanted, k8s_openapi::jiff::Timestamp::now())
}

/// The outcome of a write: `Ok` or the refusal's code and message.
fn outcome<T>(result: kube::Result<T>) -> Result<(), (u16, String)> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err((status.code, status.message.clone())),
        Err(e) => Err((0, e.to_string())),
    }
}

/// The writes of a test, what each should get, and those that got something else.
struct Outcomes {
    /// The name of the installed policy, which its refusals name.
    policy: String,
    seen: Vec<String>,
    wrong: Vec<String>,
}

impl Outcomes {
    fn new(policy: &InstalledPolicy) -> Self {
        Self { policy: policy.policy.clone(), seen: Vec::new(), wrong: Vec::new() }
    }

    /// `what` was to be allowed.
    fn allowed<T>(&mut self, what: &str, result: kube::Result<T>) {
        let got = outcome(result);
        self.seen.push(format!("{:<9} {what}", if got.is_ok() { "allowed" } else { "REFUSED" }));
        if let Err((code, message)) = got {
            self.wrong.push(format!("{what}: refused with {code}: {message}"));
        }
    }

    /// `what` was to be refused by the policy (a 403 naming it) with a message containing
    /// `because`.
    fn refused<T>(&mut self, what: &str, because: &str, result: kube::Result<T>) {
        let got = outcome(result);
        self.seen.push(format!("{:<9} {what}", if got.is_ok() { "ALLOWED" } else { "refused" }));
        match got {
            Ok(()) => self.wrong.push(format!("{what}: allowed")),
            Err((403, message)) if message.contains(&self.policy) && message.contains(because) => {}
            Err((code, message)) => {
                self.wrong
                    .push(format!("{what}: {code} {message} (expected 403 from {} saying {because:?})", self.policy));
            }
        }
    }

    fn assert_all_as_expected(&self) {
        eprintln!("{}", self.seen.join("\n"));
        assert!(self.wrong.is_empty(), "writes with another answer than expected:\n{}", self.wrong.join("\n"));
    }
}

/// Waits until the policy refuses catalogsync's change of `kyma`'s `status.state` (a dry
/// run): the apiserver has loaded the policy and its binding.
async fn await_policy_in_force(catalogsync: &Api<DynamicObject>, kyma: &str, policy: &InstalledPolicy) {
    let params = PatchParams::default().dry_run();
    let patch = Patch::Merge(json!({"status": {"state": "Error"}}));
    testenv::await_condition(PROMPT, &format!("admission policy {} to be in force", policy.policy), || async {
        match catalogsync.patch_status(kyma, &params, &patch).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(&policy.policy) => Some(()),
            _ => None,
        }
    })
    .await;
}

/// What of a Kyma only others may change: its conditions but `ModuleCatalog` (in their
/// order), the rest of its status, its spec and its labels.
async fn kyma_state(api: &Api<DynamicObject>, kyma: &str) -> (Vec<Value>, Value, Value, Value) {
    let obj = api.get(kyma).await.expect("get the Kyma");
    let status = obj.data["status"].clone();
    let others = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] != MODULE_CATALOG_CONDITION)
        .cloned()
        .collect();
    let mut status_rest = status.clone();
    if let Some(map) = status_rest.as_object_mut() {
        map.remove("conditions");
    }
    (others, status_rest, obj.data["spec"].clone(), json!(obj.metadata.labels))
}

#[test]
fn policy_names_catalogsyncs_service_account() {
    let rbac = render("deploy/rbac");
    let sa = the(&rbac, "ServiceAccount");
    let user = format!("system:serviceaccount:{}:{}", sa["metadata"]["namespace"].as_str().expect("ns"), name_of(sa));
    assert_eq!(user, CATALOGSYNC_USER, "the tests run as deploy/rbac's ServiceAccount");
    let docs = render(POLICY_DIR);
    let policy = the(&docs, "ValidatingAdmissionPolicy");
    let conditions = policy["spec"]["matchConditions"].as_array().expect("matchConditions");
    assert_eq!(conditions.len(), 1);
    assert_eq!(
        conditions[0]["expression"].as_str().expect("expression"),
        format!("request.userInfo.username == '{user}'"),
        "the policy must match exactly catalogsync's identity"
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Fail", "an expression error refuses, never allows");
    let binding = the(&docs, "ValidatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(
        render("deploy/base").iter().all(|d| !kind_of(d).starts_with("ValidatingAdmissionPolicy")),
        "the policy is optional: not part of deploy/base"
    );
}

#[tokio::test]
async fn policy_lets_catalogsync_change_only_its_condition() {
    let s = Scenario::new("vap").await.expect("scenario");
    allow_all_kyma_writes(&s.kcp, &s.ns).await;
    s.add_kyma_without_secret("k1", &[("team", "a")]).await.expect("kyma");
    let klm = kymas(&client_for(KLM_USER, KLM_GROUPS).await, &s.ns);
    let klm_apply = PatchParams::apply(KLM_MANAGER).force();
    klm.patch_status("k1", &klm_apply, &Patch::Apply(klm_status("k1", "Ready", "True"))).await.expect("KLM status");
    let cs = kymas(&client_for(CATALOGSYNC_USER, CATALOGSYNC_GROUPS).await, &s.ns);
    let policy = InstalledPolicy::install(&s.kcp, &s.ns).await;
    await_policy_in_force(&cs, "k1", &policy).await;
    let before = kyma_state(&cs, "k1").await;

    let apply = PatchParams::apply(KCP_FIELD_MANAGER).force();
    let merge = |v: Value| Patch::Merge(v);
    let mut o = Outcomes::new(&policy);
    // What catalogsync sends: its condition, a change of it, and giving up its share of it.
    let synced = condition_apply(&cs, "k1", ConditionStatus::True, ConditionReason::CatalogSynced).await;
    o.allowed("apply the ModuleCatalog condition (new)", cs.patch_status("k1", &apply, &Patch::Apply(&synced)).await);
    let failed = condition_apply(&cs, "k1", ConditionStatus::False, ConditionReason::AccessSecretMissing).await;
    o.allowed(
        "apply the ModuleCatalog condition (changed)",
        cs.patch_status("k1", &apply, &Patch::Apply(&failed)).await,
    );
    let kyma: Kyma =
        serde_json::from_value(serde_json::to_value(cs.get("k1").await.expect("get")).expect("JSON")).expect("Kyma");
    let release = condition::release_body(&kyma);
    o.allowed(
        "apply without the condition (give up its share)",
        cs.patch_status("k1", &apply, &Patch::Apply(&release)).await,
    );
    o.allowed("apply the ModuleCatalog condition (again)", cs.patch_status("k1", &apply, &Patch::Apply(&synced)).await);

    // Anything else catalogsync's identity might send, refused by the policy.
    let status_field = "status but its ModuleCatalog condition";
    let conditions = "conditions but ModuleCatalog";
    let subresource = "only through its status subresource";
    o.refused(
        "merge patch status.state",
        status_field,
        cs.patch_status("k1", &PatchParams::default(), &merge(json!({"status": {"state": "Error"}}))).await,
    );
    let mut with_channel = synced.clone();
    with_channel["status"]["activeChannel"] = json!("fast");
    o.refused(
        "apply the condition and status.activeChannel",
        status_field,
        cs.patch_status("k1", &apply, &Patch::Apply(&with_channel)).await,
    );
    let mut with_operation = synced.clone();
    with_operation["status"]["lastOperation"] = json!({"operation": "catalogsync was here"});
    o.refused(
        "apply a new status field (lastOperation)",
        status_field,
        cs.patch_status("k1", &apply, &Patch::Apply(&with_operation)).await,
    );
    let mut ready_false = synced.clone();
    ready_false["status"]["conditions"] =
        json!([synced["status"]["conditions"][0], condition_of("Ready", "False", "Broken")]);
    o.refused(
        "apply another condition (Ready) changed",
        conditions,
        cs.patch_status("k1", &apply, &Patch::Apply(&ready_false)).await,
    );
    let mut added = synced.clone();
    added["status"]["conditions"] =
        json!([synced["status"]["conditions"][0], condition_of("CatalogsyncWasHere", "True", "Yes")]);
    o.refused("apply an added condition type", conditions, cs.patch_status("k1", &apply, &Patch::Apply(&added)).await);
    let only_ours = json!({"status": {"conditions": [synced["status"]["conditions"][0]]}});
    o.refused(
        "merge patch the conditions to ModuleCatalog only (drops Ready)",
        conditions,
        cs.patch_status("k1", &PatchParams::default(), &merge(only_ours)).await,
    );
    o.refused(
        "patch the spec",
        subresource,
        cs.patch("k1", &PatchParams::default(), &merge(json!({"spec": {"channel": "fast"}}))).await,
    );
    o.refused(
        "patch a label",
        subresource,
        cs.patch("k1", &PatchParams::default(), &merge(json!({"metadata": {"labels": {"team": "b"}}}))).await,
    );
    let mut k2 = json!({"apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Kyma", "metadata": {"name": "k2"}, "spec": {"channel": "regular"}});
    o.refused("create a Kyma", subresource, cs.patch("k2", &apply, &Patch::Apply(&k2)).await);
    o.refused("delete a Kyma", subresource, cs.delete("k1", &DeleteParams::default()).await);
    // A status write cannot carry a metadata or spec change: the apiserver drops it before
    // the policy sees the object, so there is nothing to refuse, and nothing changes.
    let mut smuggled = synced.clone();
    smuggled["metadata"]["labels"] = json!({"team": "b"});
    smuggled["spec"] = json!({"channel": "fast"});
    o.allowed(
        "apply the condition with a label and spec (dropped)",
        cs.patch_status("k1", &apply, &Patch::Apply(&smuggled)).await,
    );
    o.assert_all_as_expected();
    let after = kyma_state(&cs, "k1").await;
    assert_eq!(after, before, "catalogsync's identity changed the Kyma beyond its condition");
    let ours = cs.get("k1").await.expect("get").data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == MODULE_CATALOG_CONDITION && c["reason"] == "CatalogSynced");
    assert!(ours, "the ModuleCatalog condition was written");

    // Another identity is not affected: lifecycle-manager changes whatever it likes.
    let mut o = Outcomes::new(&policy);
    o.allowed(
        "KLM: apply status with state Error and Ready False",
        klm.patch_status("k1", &klm_apply, &Patch::Apply(klm_status("k1", "Error", "False"))).await,
    );
    o.allowed(
        "KLM: merge patch status.lastOperation",
        klm.patch_status(
            "k1",
            &PatchParams::default(),
            &merge(json!({"status": {"lastOperation": {"operation": "klm"}}})),
        )
        .await,
    );
    o.allowed(
        "KLM: patch the spec and a label",
        klm.patch(
            "k1",
            &PatchParams::default(),
            &merge(json!({"spec": {"channel": "fast"}, "metadata": {"labels": {"team": "b"}}})),
        )
        .await,
    );
    k2["metadata"]["namespace"] = json!(s.ns);
    o.allowed("KLM: create a Kyma", klm.patch("k2", &PatchParams::apply(KLM_MANAGER), &Patch::Apply(&k2)).await);
    o.allowed("KLM: delete a Kyma", klm.delete("k2", &DeleteParams::default()).await);
    o.assert_all_as_expected();
}

#[tokio::test]
async fn catalogsync_syncs_and_reports_under_the_policy() {
    let env = testenv::env();
    let mut s = Scenario::new("vap-run").await.expect("scenario");
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    s.add_kyma("good", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma_without_secret("lost", &[]).await.expect("kyma");
    allow_all_kyma_writes(&s.kcp, &s.ns).await;
    let klm = kymas(&client_for(KLM_USER, KLM_GROUPS).await, &s.ns);
    let klm_apply = PatchParams::apply(KLM_MANAGER).force();
    for kyma in ["good", "lost"] {
        klm.patch_status(kyma, &klm_apply, &Patch::Apply(klm_status(kyma, "Ready", "True"))).await.expect("KLM status");
    }
    let cs = kymas(&client_for(CATALOGSYNC_USER, CATALOGSYNC_GROUPS).await, &s.ns);
    let policy = InstalledPolicy::install(&s.kcp, &s.ns).await;
    await_policy_in_force(&cs, "good", &policy).await;
    let before = (kyma_state(&cs, "good").await, kyma_state(&cs, "lost").await);
    let mark = env.kcp.read_audit_events().len();

    s.start(&["--resync-period", "2s", "--resync-jitter", "0"]).expect("start");
    s.await_condition("good", "True", "CatalogSynced", PROMPT).await;
    s.await_condition("lost", "False", "AccessSecretMissing", PROMPT).await;
    // The condition changes: a Secret arrives.
    s.put_secret("lost", "lost", &s.skr_kubeconfig("lost", &env.skr_b)).await.expect("secret");
    s.await_condition("lost", "True", "CatalogSynced", PROMPT).await;
    let status = s.catalogsync.as_mut().expect("running").terminate(PROMPT).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");

    let after = (kyma_state(&cs, "good").await, kyma_state(&cs, "lost").await);
    assert_eq!(after, before, "catalogsync changed a Kyma beyond its condition");
    let kyma_writes: Vec<_> = env.kcp.read_audit_events()[mark..]
        .iter()
        .filter(|e| e.user.username == CATALOGSYNC_USER && e.stage == "ResponseComplete")
        .filter(|e| e.resource() == "kymas" && e.is_write() && e.namespace() == Some(s.ns.as_str()))
        .map(|e| (e.code(), e.verb.clone(), e.name().unwrap_or_default().to_owned()))
        .collect();
    assert!(kyma_writes.len() >= 3, "catalogsync wrote its conditions: {kyma_writes:?}");
    let refused: Vec<_> = kyma_writes.iter().filter(|(code, ..)| *code >= 300).collect();
    assert!(refused.is_empty(), "the policy refused catalogsync's own writes: {refused:?}");
    assert!(!s.log().contains("Failed to write the ModuleCatalog condition"), "no condition write failed");
}
