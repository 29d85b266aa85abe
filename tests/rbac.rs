//! The RBAC in `deploy/` grants nothing beyond what catalogsync uses, and the apiserver
//! enforces it:
//!
//! - `deploy/rbac/`: run a replica through everything it does against the KCP (start, sync, a
//!   Secret problem and its repair, a catalog change, the clean-up of a member Lease a replica
//!   left behind, shutdown) and compare the requests in the KCP audit log with the rules; every
//!   shard record it touched is one the rules name.
//! - The shard records (`deploy/rbac/shard_records.yaml`) are granted by name: the file is what
//!   `hack/render-shard-rbac.sh` renders for the default `--shards`, and on the real apiserver a
//!   server-side apply that creates a named record is allowed (so its `create` is authorized
//!   with the name), while every other ConfigMap, a POST create, an update and a delete are
//!   refused.
//! - The shadow overlay (`deploy/overlays/shadow`): its Roles are the base's without a write
//!   but the Leases; applied to the real apiserver, every write active mode makes (and the
//!   catalog and Secret writes it never makes) is refused with 403 under it while its reads and
//!   Lease writes are allowed; and shadow mode runs under it without one refused request.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use catalogsync::api::ConditionStatus;
use catalogsync::api::{KCP_FIELD_MANAGER, Kyma, MEMBER_LEFT_ANNOTATION, MEMBER_NONCE_ANNOTATION, member_lease_name};
use catalogsync::config::{Cli, Command as CliCommand};
use catalogsync::error::ConditionReason;
use catalogsync::sharding::lease::new_member;
use catalogsync::sync::condition::{self, Wanted};
use catalogsync::sync::recall::config_map_name;
use clap::Parser as _;
use futures::StreamExt as _;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube::core::ApiResource;
use kube::{Client, Resource as _};
use serde_json::{Value, json};
use testenv::kustomize::{kind_of, kustomize_build as render, name_of};
use testenv::scenario::{MRM, MT, Scenario, catalog_resource, mrm, mt};
use testenv::{CATALOGSYNC_GROUPS, CATALOGSYNC_NAMESPACE, CATALOGSYNC_USER};

const PROMPT: Duration = Duration::from_secs(30);

/// The KCP namespace of the Kymas that `deploy/rbac/role.yaml` names.
const KCP_NAMESPACE: &str = "kcp-system";
/// The generated Role of the shard records.
const SHARD_RECORDS_FILE: &str = "deploy/rbac/shard_records.yaml";
/// The verbs that only read.
const READ_VERBS: &[&str] = &["get", "list", "watch"];

/// (API group, resource with subresource, verb)
type Permission = (String, String, String);

/// One grant of a rule: the namespace of its Role (empty for a ClusterRole), the API group,
/// the resource (with subresource), the verb, and the names the rule limits it to (empty: any).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    namespace: String,
    group: String,
    resource: String,
    verb: String,
    names: Vec<String>,
}

impl Grant {
    fn is_read(&self) -> bool {
        READ_VERBS.contains(&self.verb.as_str())
    }

    /// A grant on Leases in catalogsync's own namespace.
    fn is_own_lease(&self) -> bool {
        self.namespace == CATALOGSYNC_NAMESPACE && self.group == "coordination.k8s.io" && self.resource == "leases"
    }
}

/// Every grant of the Roles and ClusterRoles among `docs`.
fn grants(docs: &[Value]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for doc in docs.iter().filter(|d| matches!(kind_of(d), "Role" | "ClusterRole")) {
        let namespace = doc["metadata"]["namespace"].as_str().unwrap_or_default();
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let strings = |key: &str| -> Vec<String> {
                rule[key].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
            };
            let mut names = strings("resourceNames");
            names.sort();
            for group in strings("apiGroups") {
                for resource in strings("resources") {
                    for verb in strings("verbs") {
                        out.insert(Grant {
                            namespace: namespace.to_owned(),
                            group: group.clone(),
                            resource: resource.clone(),
                            verb,
                            names: names.clone(),
                        });
                    }
                }
            }
        }
    }
    out
}

/// The objects of every YAML file of `deploy/rbac/`, as the end-to-end tests apply them.
fn rbac_files() -> Vec<Value> {
    let mut docs = Vec::new();
    for file in testenv::apply::yaml_files(&testenv::rbac_dir()).expect("deploy/rbac") {
        let text = std::fs::read_to_string(&file).expect("read");
        docs.extend(testenv::parse_yaml_docs(&text).expect("yaml"));
    }
    docs
}

/// Every (group, resource, verb) the rules of `deploy/rbac/` grant.
fn granted() -> BTreeSet<Permission> {
    grants(&rbac_files()).into_iter().map(|g| (g.group, g.resource, g.verb)).collect()
}

/// The default `--shards` of `catalogsync run`.
fn default_shards() -> u32 {
    let cli = Cli::try_parse_from(["catalogsync", "run"]).expect("defaults parse");
    let CliCommand::Run(args) = cli.command else { unreachable!("run was given") };
    args.shards
}

/// The ConfigMap names the rules of `deploy/rbac/` grant (the shard records).
fn granted_config_maps() -> BTreeSet<String> {
    grants(&rbac_files()).into_iter().filter(|g| g.resource == "configmaps").flat_map(|g| g.names).collect()
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
    // Every shard record it read or wrote is one the rules name.
    let records = granted_config_maps();
    let touched: BTreeSet<String> = env.kcp.read_audit_events()[mark..]
        .iter()
        .filter(|e| e.user.username == testenv::CATALOGSYNC_USER && e.resource() == "configmaps")
        .filter(|e| e.namespace() == Some(s.ns.as_str()))
        .filter_map(|e| e.name().map(str::to_owned))
        .collect();
    assert!(!touched.is_empty(), "catalogsync kept no shard record");
    assert!(touched.is_subset(&records), "ConfigMaps outside the granted names: {:?}", touched.difference(&records));
    let granted = granted();
    let unused: Vec<_> = granted.difference(&used).collect();
    let denied: Vec<_> = used.difference(&granted).collect();
    eprintln!("used: {used:#?}");
    assert!(unused.is_empty(), "deploy/rbac grants what catalogsync never used: {unused:?}");
    assert!(denied.is_empty(), "catalogsync used what deploy/rbac does not grant (so it was denied): {denied:?}");
}

/// The first line where `a` and `b` differ, for a failure message.
fn first_difference(a: &str, b: &str) -> String {
    let (mut a_lines, mut b_lines) = (a.lines(), b.lines());
    for n in 1.. {
        match (a_lines.next(), b_lines.next()) {
            (Some(x), Some(y)) if x == y => {}
            (None, None) => return "the line ends differ".to_owned(),
            (x, y) => return format!("line {n} is {x:?} where the rendering has {y:?}"),
        }
    }
    unreachable!("the loop returns")
}

/// `hack/render-shard-rbac.sh` with `args`, its output.
fn render_shard_rbac(args: &[&str]) -> String {
    let out = Command::new(testenv::repo_root().join("hack/render-shard-rbac.sh"))
        .args(args)
        .output()
        .expect("run hack/render-shard-rbac.sh");
    assert!(
        out.status.success(),
        "hack/render-shard-rbac.sh {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn shard_records_rbac_is_rendered_for_the_default_shard_count() {
    let shards = default_shards();
    let committed = testenv::docs::read(SHARD_RECORDS_FILE);
    let regenerate = format!("run `hack/render-shard-rbac.sh > {SHARD_RECORDS_FILE}`");
    // The script's default is the flag's default, and the file is its rendering.
    for args in [vec![shards.to_string()], Vec::new()] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let rendered = render_shard_rbac(&args);
        assert!(
            committed == rendered,
            "{SHARD_RECORDS_FILE} is not the rendering of hack/render-shard-rbac.sh {args:?} ({}): {regenerate}",
            first_difference(&committed, &rendered)
        );
    }
    // It names exactly the records of shards 0 .. --shards - 1, as catalogsync names them.
    let names = |yaml: &str| -> BTreeSet<String> {
        let docs = testenv::parse_yaml_docs(yaml).expect("YAML");
        grants(&docs).into_iter().filter(|g| g.resource == "configmaps").flat_map(|g| g.names).collect()
    };
    let expected: BTreeSet<String> = (0..shards).map(config_map_name).collect();
    assert_eq!(names(&committed), expected);
    assert_eq!(granted_config_maps(), expected, "deploy/rbac grants ConfigMaps beyond the shard records");
    let four: BTreeSet<String> = (0..4).map(config_map_name).collect();
    assert_eq!(names(&render_shard_rbac(&["4"])), four, "another --shards renders its own names");
    // Every grant of the file is by name, and none deletes, updates or lists.
    for grant in grants(&testenv::parse_yaml_docs(&committed).expect("YAML")) {
        assert!(!grant.names.is_empty(), "a grant not limited by name: {grant:?}");
        assert!(["get", "create", "patch"].contains(&grant.verb.as_str()), "{grant:?}");
    }
}

/// The HTTP status a request ended with: 200 for any success (the typed API hides a 201), the
/// code of the apiserver's answer otherwise, 0 for an error without one.
fn code<T>(result: kube::Result<T>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(_) => 0,
    }
}

/// The requests of a test with the status each got, and those that got another than expected.
#[derive(Default)]
struct Outcomes {
    seen: Vec<String>,
    wrong: Vec<String>,
}

impl Outcomes {
    /// Records that `what` was to be allowed (`true`, a 2xx) or refused by RBAC (`false`, a 403).
    fn expect<T>(&mut self, what: &str, allowed: bool, result: kube::Result<T>) {
        let got = code(result);
        let ok = if allowed { (200..300).contains(&got) } else { got == 403 };
        let line = format!("{got} {what}");
        if !ok {
            self.wrong.push(format!("{line} (expected {})", if allowed { "2xx" } else { "403" }));
        }
        self.seen.push(line);
    }

    fn assert_all_as_expected(&self) {
        eprintln!("{}", self.seen.join("\n"));
        assert!(self.wrong.is_empty(), "requests with another answer than expected:\n{}", self.wrong.join("\n"));
    }
}

/// Opens a watch and reads its first answer: `Ok` when the watch was allowed (an event, or
/// the end of a quiet watch), the apiserver's refusal otherwise.
async fn watch_first<K>(api: &Api<K>) -> kube::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let stream = api.watch(&WatchParams::default().timeout(1), "0").await?;
    let mut stream = std::pin::pin!(stream);
    match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        Ok(Some(Err(e))) => Err(e),
        _ => Ok(()),
    }
}

/// Whether catalogsync's identity may `verb` `resource` (`kymas/status` names a subresource)
/// of API group `group` in namespace `ns`, as the apiserver's authorizer answers now.
async fn may(admin: &Client, ns: &str, verb: &str, group: &str, resource: &str) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, sub)) => (r, Some(sub.to_owned())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(CATALOGSYNC_USER.to_owned()),
            groups: Some(CATALOGSYNC_GROUPS.iter().map(|g| (*g).to_owned()).collect()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.to_owned()),
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("create a SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

/// A client with catalogsync's identity in the KCP: what `deploy/` binds is all it may do.
async fn catalogsync_client() -> Client {
    testenv::env().kcp.client_for(CATALOGSYNC_USER, CATALOGSYNC_GROUPS).await.expect("a client of catalogsync")
}

/// A ConfigMap apply body named `name`, as a shard record is applied.
fn record_body(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"skrs.json": "{}"}})
}

#[tokio::test]
async fn shard_records_are_granted_by_name_only() {
    let env = testenv::env();
    // deploy/rbac bound in the scenario namespace, which is also the lease namespace.
    let s = Scenario::new("records").await.expect("scenario");
    let admin: Api<ConfigMap> = Api::namespaced(s.kcp.clone(), &s.ns);
    let other = "someone-elses-config";
    admin
        .create(&PostParams::default(), &serde_json::from_value(record_body(other)).expect("ConfigMap"))
        .await
        .expect("create");
    let records: Api<ConfigMap> = Api::namespaced(catalogsync_client().await, &s.ns);
    let (first, last, beyond) =
        (config_map_name(0), config_map_name(default_shards() - 1), config_map_name(default_shards()));
    testenv::await_condition(PROMPT, "the shard-record Role to be in force", || async {
        records.get_opt(&first).await.ok().map(|found| assert!(found.is_none(), "{first} exists before the test"))
    })
    .await;
    let apply = PatchParams::apply(KCP_FIELD_MANAGER).force();
    let mut o = Outcomes::default();
    // Server-side applies that create: authorized as `create` with the name, which the rule
    // grants only by name. That they pass proves the apiserver passes the name along.
    o.expect(
        &format!("apply (create) {first}"),
        true,
        records.patch(&first, &apply, &Patch::Apply(record_body(&first))).await,
    );
    o.expect(
        &format!("apply (create) {last}"),
        true,
        records.patch(&last, &apply, &Patch::Apply(record_body(&last))).await,
    );
    let created = env.kcp.read_audit_events().into_iter().any(|e| {
        let ours = e.user.username == CATALOGSYNC_USER && e.namespace() == Some(s.ns.as_str());
        ours && e.verb == "patch" && e.name() == Some(first.as_str()) && e.code() == 201
    });
    assert!(created, "the audit log shows the apply of {first} as a create (201)");
    o.expect(
        &format!("apply (patch) {first}"),
        true,
        records.patch(&first, &apply, &Patch::Apply(record_body(&first))).await,
    );
    o.expect(
        &format!("merge patch {first}"),
        true,
        records.patch(&first, &PatchParams::default(), &Patch::Merge(json!({"data": {"x": "1"}}))).await,
    );
    o.expect(&format!("get {first}"), true, records.get(&first).await);
    // Anything else is refused.
    o.expect(
        &format!("apply (create) {beyond}"),
        false,
        records.patch(&beyond, &apply, &Patch::Apply(record_body(&beyond))).await,
    );
    o.expect(
        &format!("apply (patch) {other}"),
        false,
        records.patch(other, &apply, &Patch::Apply(record_body(other))).await,
    );
    o.expect(&format!("get {other}"), false, records.get(other).await);
    o.expect("list ConfigMaps", false, records.list(&ListParams::default()).await);
    let second: ConfigMap = serde_json::from_value(record_body(&config_map_name(1))).expect("ConfigMap");
    o.expect(
        "POST create of a record (no name to authorize)",
        false,
        records.create(&PostParams::default(), &second).await,
    );
    let current = admin.get(&first).await.expect("get");
    o.expect(&format!("update {first}"), false, records.replace(&first, &PostParams::default(), &current).await);
    o.expect(&format!("delete {first}"), false, records.delete(&first, &Default::default()).await);
    o.assert_all_as_expected();
}

/// The RBAC objects of a kustomization, moved into test namespaces: the Kymas' namespace
/// (`kcp-system`) becomes `kcp_ns`, catalogsync's own `lease_ns`. The subjects stay
/// catalogsync's ServiceAccount, the identity the tests run as.
fn rbac_in(dir: &str, kcp_ns: &str, lease_ns: &str) -> Vec<Value> {
    let mut docs: Vec<Value> = render(dir)
        .into_iter()
        .filter(|d| matches!(kind_of(d), "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"))
        .collect();
    for doc in &mut docs {
        let moved = match doc["metadata"]["namespace"].as_str() {
            None => continue,
            Some(KCP_NAMESPACE) => kcp_ns,
            Some(CATALOGSYNC_NAMESPACE) => lease_ns,
            Some(other) => panic!("{dir}: {} {} in unexpected namespace {other}", kind_of(doc), name_of(doc)),
        };
        doc["metadata"]["namespace"] = json!(moved);
    }
    docs
}

/// (kind, namespace, name) of the RBAC objects of a rendering, and the bindings in full.
fn rbac_objects(docs: &[Value]) -> (BTreeSet<(String, String, String)>, Vec<Value>) {
    let rbac: Vec<&Value> = docs
        .iter()
        .filter(|d| matches!(kind_of(d), "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"))
        .collect();
    let identities = rbac
        .iter()
        .map(|d| {
            let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
            (kind_of(d).to_owned(), ns.to_owned(), name_of(d).to_owned())
        })
        .collect();
    let bindings = rbac.into_iter().filter(|d| kind_of(d).ends_with("Binding")).cloned().collect();
    (identities, bindings)
}

#[test]
fn shadow_rbac_is_the_base_rbac_without_its_writes() {
    let base = render("deploy/base");
    let shadow = render("deploy/overlays/shadow");
    // The same objects under the same names, bound alike: applying the overlay over an active
    // install replaces every Role, and nothing of the active RBAC is left behind.
    assert_eq!(rbac_objects(&shadow), rbac_objects(&base), "the shadow overlay renames, adds or drops RBAC objects");
    // Shadow mode reads what active mode reads, but the shard records (it keeps none), and
    // writes nothing but its Leases in its own namespace.
    let expected: BTreeSet<Grant> =
        grants(&base).into_iter().filter(|g| g.is_own_lease() || (g.is_read() && g.resource != "configmaps")).collect();
    let got = grants(&shadow);
    let extra: Vec<_> = got.difference(&expected).collect();
    let missing: Vec<_> = expected.difference(&got).collect();
    assert!(extra.is_empty(), "the shadow overlay grants more than the base's reads and Leases: {extra:?}");
    assert!(missing.is_empty(), "the shadow overlay lacks reads or Lease rights of the base: {missing:?}");
    let writes: Vec<_> = got.iter().filter(|g| !g.is_read()).collect();
    assert!(writes.iter().all(|g| g.is_own_lease()), "shadow writes: {writes:?}");
    assert!(!writes.is_empty(), "shadow mode must keep its Lease writes");
}

/// A Kyma apply body.
fn kyma_body(name: &str) -> Value {
    json!({"apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Kyma", "metadata": {"name": name}, "spec": {"channel": "regular"}})
}

/// The status apply catalogsync sends to write the `ModuleCatalog` condition of `kyma`.
fn condition_apply(kyma: &DynamicObject) -> Value {
    let kyma: Kyma = serde_json::from_value(serde_json::to_value(kyma).expect("JSON")).expect("a Kyma");
    let wanted = Wanted {
        status: ConditionStatus::True,
        reason: ConditionReason::CatalogSynced,
        message: "the SKR holds the desired module catalog".into(),
        observed_generation: kyma.metadata.generation,
    };
    condition::apply_body(&kyma, None, &wanted, k8s_openapi::jiff::Timestamp::now())
}

/// An events.k8s.io/v1 Event about `kyma`, as catalogsync publishes one.
fn event_body(ns: &str, kyma: &DynamicObject) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "k1.catalogsync", "namespace": ns},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "catalogsync",
        "reportingInstance": "shadow",
        "action": "SyncModuleCatalog",
        "reason": "AccessSecretMissing",
        "type": "Warning",
        "regarding": kyma.object_ref(&ApiResource::erase::<Kyma>(&())),
    })
}

#[tokio::test]
async fn shadow_rbac_refuses_every_write_but_its_own_leases() {
    let env = testenv::env();
    testenv::install_catalogsync_crds(&env.kcp).await.expect("CRDs");
    let admin = env.kcp.admin_client();
    let kcp_ns = testenv::unique_name("shadow-rbac");
    let lease_ns = format!("{kcp_ns}-leases");
    for ns in [&kcp_ns, &lease_ns] {
        testenv::create_namespace(&admin, ns).await.expect("namespace");
    }
    testenv::apply_docs(&admin, rbac_in("deploy/overlays/shadow", &kcp_ns, &lease_ns))
        .await
        .expect("apply the shadow overlay's RBAC");

    // What the writes below aim at, written by the admin.
    let kyma_resource = ApiResource::erase::<Kyma>(&());
    let setup = PatchParams::apply(testenv::HARNESS_FIELD_MANAGER).force();
    let dynamic =
        |client: &Client, ar: &ApiResource| Api::<DynamicObject>::namespaced_with(client.clone(), &kcp_ns, ar);
    let kyma = dynamic(&admin, &kyma_resource).patch("k1", &setup, &Patch::Apply(kyma_body("k1"))).await.expect("Kyma");
    for (plural, body) in [(MT, mt("keda", "1.0.0")), (MRM, mrm("keda", &[("regular", "1.0.0")]))] {
        let name = body["metadata"]["name"].as_str().expect("name").to_owned();
        dynamic(&admin, &catalog_resource(plural)).patch(&name, &setup, &Patch::Apply(body)).await.expect("catalog");
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "k1", "labels": {"operator.kyma-project.io/kyma-name": "k1"}}, "stringData": {"config": "not a kubeconfig"}});
    Api::<Secret>::namespaced(admin.clone(), &kcp_ns)
        .patch("k1", &setup, &Patch::Apply(&secret))
        .await
        .expect("Secret");
    let record = config_map_name(0);
    Api::<ConfigMap>::namespaced(admin.clone(), &lease_ns)
        .patch(&record, &setup, &Patch::Apply(record_body(&record)))
        .await
        .expect("record");
    let lease = |name: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": {"holderIdentity": "someone"}});
    Api::<Lease>::namespaced(admin.clone(), &kcp_ns)
        .patch("elsewhere", &setup, &Patch::Apply(lease("elsewhere")))
        .await
        .expect("Lease");

    let me = catalogsync_client().await;
    let kymas = dynamic(&me, &kyma_resource);
    testenv::await_condition(PROMPT, "the shadow RBAC to be in force", || async {
        kymas.list(&ListParams::default()).await.ok()
    })
    .await;
    let apply = PatchParams::apply(KCP_FIELD_MANAGER).force();
    let merge = |v: Value| Patch::Merge(v);
    let mut o = Outcomes::default();

    // Reads: the watches and reads of both modes.
    o.expect("list kymas", true, kymas.list(&ListParams::default()).await);
    o.expect("watch kymas", true, watch_first(&kymas).await);
    for plural in [MT, MRM] {
        let api = dynamic(&me, &catalog_resource(plural));
        o.expect(&format!("list {plural}"), true, api.list(&ListParams::default()).await);
        o.expect(&format!("watch {plural}"), true, watch_first(&api).await);
    }
    let secrets: Api<Secret> = Api::namespaced(me.clone(), &kcp_ns);
    o.expect("list secrets (metadata)", true, secrets.list_metadata(&ListParams::default()).await);
    o.expect("watch secrets", true, watch_first(&secrets).await);
    o.expect("get secret k1", true, secrets.get("k1").await);
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(me.clone());
    let by_name = ListParams::default().fields("metadata.name=moduletemplates.operator.kyma-project.io");
    o.expect("list the ModuleTemplate CRD by name", true, crds.list(&by_name).await);

    // Its own Leases, in its own namespace: every verb.
    let leases: Api<Lease> = Api::namespaced(me.clone(), &lease_ns);
    let mine = member_lease_name("shadow-0");
    let created = leases.create(&PostParams::default(), &serde_json::from_value(lease(&mine)).expect("Lease")).await;
    o.expect(&format!("create Lease {mine}"), true, created);
    o.expect("list Leases", true, leases.list(&ListParams::default()).await);
    o.expect("watch Leases", true, watch_first(&leases).await);
    let current = leases.get(&mine).await;
    let replaced = match current {
        Ok(l) => leases.replace(&mine, &PostParams::default(), &l).await,
        Err(e) => Err(e),
    };
    o.expect(&format!("update Lease {mine}"), true, replaced);
    o.expect(
        &format!("patch Lease {mine}"),
        true,
        leases.patch(&mine, &PatchParams::default(), &merge(json!({"spec": {"leaseDurationSeconds": 8}}))).await,
    );
    o.expect(&format!("delete Lease {mine}"), true, leases.delete(&mine, &Default::default()).await);

    // Every KCP write of active mode, refused.
    o.expect(
        "apply the ModuleCatalog condition (kymas/status)",
        false,
        kymas.patch_status("k1", &apply, &Patch::Apply(condition_apply(&kyma))).await,
    );
    o.expect(
        "merge patch kymas/status",
        false,
        kymas.patch_status("k1", &PatchParams::default(), &merge(json!({"status": {"state": "Error"}}))).await,
    );
    o.expect(
        "create an Event (events.k8s.io)",
        false,
        dynamic(&me, &ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&()))
            .create(&PostParams::default(), &serde_json::from_value(event_body(&kcp_ns, &kyma)).expect("Event"))
            .await,
    );
    o.expect(
        "patch an Event (events.k8s.io)",
        false,
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(me.clone(), &kcp_ns)
            .patch("k1.catalogsync", &PatchParams::default(), &merge(json!({"series": {"count": 2}})))
            .await,
    );
    let core_event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "k1.core"}, "involvedObject": {"kind": "Kyma", "name": "k1", "namespace": kcp_ns}, "reason": "X", "message": "x", "type": "Warning"});
    o.expect(
        "create an Event (core)",
        false,
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(me.clone(), &kcp_ns)
            .create(&PostParams::default(), &serde_json::from_value(core_event).expect("Event"))
            .await,
    );
    let records: Api<ConfigMap> = Api::namespaced(me.clone(), &lease_ns);
    let next = config_map_name(1);
    o.expect(
        &format!("apply (create) shard record {next}"),
        false,
        records.patch(&next, &apply, &Patch::Apply(record_body(&next))).await,
    );
    o.expect(
        &format!("apply (patch) shard record {record}"),
        false,
        records.patch(&record, &apply, &Patch::Apply(record_body(&record))).await,
    );
    o.expect(&format!("get shard record {record}"), false, records.get(&record).await);
    // Writes active mode never makes in the KCP, refused all the same.
    o.expect(
        "patch a Kyma",
        false,
        kymas.patch("k1", &PatchParams::default(), &merge(json!({"spec": {"channel": "fast"}}))).await,
    );
    o.expect("create a Kyma", false, kymas.patch("k2", &apply, &Patch::Apply(kyma_body("k2"))).await);
    o.expect("delete a Kyma", false, kymas.delete("k1", &Default::default()).await);
    for (plural, body) in [(MT, mt("keda", "2.0.0")), (MRM, mrm("other", &[("regular", "1.0.0")]))] {
        let api = dynamic(&me, &catalog_resource(plural));
        let name = body["metadata"]["name"].as_str().expect("name").to_owned();
        o.expect(
            &format!("apply (create) {plural} {name}"),
            false,
            api.patch(&name, &apply, &Patch::Apply(body)).await,
        );
        let existing = if plural == MT { "keda-1.0.0" } else { "keda" };
        o.expect(
            &format!("patch {plural} {existing}"),
            false,
            api.patch(existing, &PatchParams::default(), &merge(json!({"metadata": {"labels": {"x": "y"}}}))).await,
        );
        o.expect(&format!("delete {plural} {existing}"), false, api.delete(existing, &Default::default()).await);
    }
    let other_secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "k9"}, "stringData": {"config": "x"}})).expect("Secret");
    o.expect("create a Secret", false, secrets.create(&PostParams::default(), &other_secret).await);
    o.expect(
        "patch a Secret",
        false,
        secrets.patch("k1", &PatchParams::default(), &merge(json!({"stringData": {"config": "y"}}))).await,
    );
    o.expect("delete a Secret", false, secrets.delete("k1", &Default::default()).await);
    let elsewhere: Api<Lease> = Api::namespaced(me.clone(), &kcp_ns);
    o.expect(
        "create a Lease outside the lease namespace",
        false,
        elsewhere.create(&PostParams::default(), &serde_json::from_value(lease(&mine)).expect("Lease")).await,
    );
    o.expect(
        "patch a Lease outside the lease namespace",
        false,
        elsewhere.patch("elsewhere", &PatchParams::default(), &merge(json!({"spec": {"holderIdentity": "me"}}))).await,
    );
    o.expect(
        "delete a Lease outside the lease namespace",
        false,
        elsewhere.delete("elsewhere", &Default::default()).await,
    );
    o.assert_all_as_expected();
}

#[tokio::test]
async fn shadow_mode_runs_under_the_shadow_rbac() {
    let env = testenv::env();
    let mut s = Scenario::new("shadow-run").await.expect("scenario");
    // Scenario::new bound deploy/rbac in its namespace; the shadow overlay's RBAC goes over
    // it, as when an active install is switched (back) to shadow with `kubectl apply`.
    testenv::apply_docs(&s.kcp, rbac_in("deploy/overlays/shadow", &s.ns, &s.ns)).await.expect("apply the shadow RBAC");
    testenv::await_condition(PROMPT, "the shadow RBAC to take the status write away", || async {
        (!may(&s.kcp, &s.ns, "patch", "operator.kyma-project.io", "kymas/status").await).then_some(())
    })
    .await;
    for (verb, group, resource) in [("create", "events.k8s.io", "events"), ("patch", "", "configmaps")] {
        assert!(!may(&s.kcp, &s.ns, verb, group, resource).await, "{verb} {resource} is still allowed");
    }
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    s.add_kyma("good", &env.skr_a, &[]).await.expect("kyma");
    // A Kyma without a Secret: active mode would write a False condition and an Event.
    s.add_kyma_without_secret("lost", &[]).await.expect("kyma");
    let mark = env.kcp.read_audit_events().len();
    s.start(&["--mode", "shadow", "--resync-period", "2s", "--resync-jitter", "0"]).expect("start");
    s.await_ready(PROMPT).await;
    testenv::await_condition(PROMPT, "shadow mode to compare the SKR and to find the Secret missing", || async {
        let compared = s.metric("catalogsync_shadow_skrs", &[]).await;
        let missing = s.metric("catalogsync_sync_errors_total", &[r#"reason="AccessSecretMissing""#]).await;
        (compared >= 1.0 && missing >= 1.0).then_some(())
    })
    .await;
    let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");

    let events: Vec<_> = env.kcp.read_audit_events()[mark..]
        .iter()
        .filter(|e| e.user.username == CATALOGSYNC_USER && e.stage == "ResponseComplete")
        .filter(|e| e.namespace().is_none_or(|ns| ns == s.ns))
        .cloned()
        .collect();
    let describe = |e: &testenv::AuditEvent| format!("{} {} {} {:?}", e.code(), e.verb, e.resource(), e.name());
    let refused: Vec<String> = events.iter().filter(|e| e.code() == 403).map(describe).collect();
    assert!(refused.is_empty(), "shadow mode was refused requests under the shadow RBAC: {refused:?}");
    let writes: Vec<String> =
        events.iter().filter(|e| e.is_write() && e.resource() != "leases").map(describe).collect();
    assert!(writes.is_empty(), "shadow mode wrote more than its Leases: {writes:?}");
    assert!(events.iter().any(|e| e.is_write() && e.resource() == "leases"), "shadow mode holds its Leases");
    assert!(s.condition("lost").await.is_none() && s.condition("good").await.is_none(), "no condition was written");
}
