//! `deploy/` running for real: the rendered `deploy/overlays/hpa` (ServiceAccount, RBAC,
//! Deployment, PodDisruptionBudget, Service, HPA) is applied to the test KCP as it is, and
//! kube-controller-manager's Deployment, ReplicaSet, HPA and disruption controllers act on it,
//! kube-scheduler binds the pods to a real node (`testenv::node`: containerd, runc, the
//! kubelet and kube-proxy in a network namespace of the test's own), and the pods run the
//! release image that `hack/image.sh` builds, with in-cluster configuration (ServiceAccount
//! token, the `kubernetes` Service), probes, security context and grace period as in a
//! cluster. The test changes only what a cluster operator would: the image reference
//! (`imagePullPolicy: Never`: it is imported, not pulled) and the SKR destinations the test
//! SKRs need (`CATALOGSYNC_SKR_ALLOWED_DESTINATIONS`).
//!
//! One test walks the life of an installation: the HPA scales the Deployment from its
//! default of one replica to `minReplicas`, the replicas share the SKRs, every metric that
//! `docs/metrics.md`, the dashboard and the alerts name is served by the running replicas,
//! the HPA scales out and in, a rolling update replaces every pod, the PodDisruptionBudget
//! refuses a second eviction, and through all of it every catalog change reaches every SKR and
//! no SKR ever has two writers (audit logs). At the end the node is stopped and the host
//! settings it changed are checked to be restored.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use catalogsync::sharding::ring::shard_of;
use catalogsync::sharding::table::{self, Table};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use serde_json::json;
use testenv::controllers::ControllerManager;
use testenv::docs::{documented_metrics, exposed_metrics};
use testenv::fleet::Fleet;
use testenv::invariants::{InvariantOptions, check_invariants};
use testenv::kustomize::{kind_of, kustomize_build, monitoring_metrics, name_of, the};
use testenv::monitoring::{AlertsExpected, RULE_FILE, check_live, prometheus_rule, rule_file};
use testenv::node::{Node, SKR_ADDRESS};
use testenv::prometheus::{Prometheus, PrometheusOptions};
use testenv::scenario::{MT, Scenario, mrm, mt};

/// The KCP namespace `deploy/rbac/role.yaml` grants access to (the controller's default).
const KCP_NAMESPACE: &str = "kcp-system";
/// catalogsync's own namespace in `deploy/`.
const NAMESPACE: &str = "catalogsync-system";
/// The controller's default SKR namespace.
const SYNC_NAMESPACE: &str = "kyma-system";
/// The controller's default shard count (the Deployment sets none).
const SHARDS: u32 = 64;
const KYMAS: usize = 16;
/// Pods becoming ready or going away: the readiness probe runs every 5 s (the Deployment's
/// own setting), a graceful exit takes a few seconds.
const ROLLOUT: Duration = Duration::from_secs(120);
const PROMPT: Duration = Duration::from_secs(60);
/// The container's HTTP port (`http-metrics`).
const HTTP_PORT: u16 = 8080;

struct Install {
    fleet: Fleet,
    node: Node,
    kcm: ControllerManager,
}

/// The catalogsync image's reference, as `hack/image.sh` names it.
fn image_ref() -> String {
    format!("catalogsync:{}", env!("CARGO_PKG_VERSION"))
}

/// The OCI archive of `what` (`catalogsync` or `pause`): from `$CATALOGSYNC_TEST_IMAGE` /
/// `$CATALOGSYNC_TEST_PAUSE_IMAGE` (hack/test.sh builds both first), else built here with
/// `hack/image.sh` (a release build on the first run).
fn image_archive(what: &str, env_var: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        return PathBuf::from(path);
    }
    eprintln!("{env_var} not set: building the {what} image with hack/image.sh");
    let root = testenv::repo_root();
    let out = Command::new(root.join("hack/image.sh"))
        .arg(what)
        .current_dir(&root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run hack/image.sh");
    assert!(out.status.success(), "hack/image.sh {what} failed");
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

impl Install {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.fleet.scenario.kcp.clone(), NAMESPACE)
    }

    fn hpa(&self) -> Api<HorizontalPodAutoscaler> {
        Api::namespaced(self.fleet.scenario.kcp.clone(), NAMESPACE)
    }

    /// Waits until exactly `n` pods exist, none of them deleting, all of them Ready, and the
    /// Deployment counts them as ready; returns their names.
    async fn await_ready_pods(&mut self, n: usize, excluding: &BTreeSet<String>) -> BTreeSet<String> {
        let kcp = self.fleet.scenario.kcp.clone();
        let what = format!("{n} ready catalogsync pods (not {excluding:?})");
        let pods = self.pods();
        let found = testenv::wait_until(ROLLOUT, &what, || async {
            let list = pods.list(&ListParams::default()).await.ok()?.items;
            let names: BTreeSet<String> = list.iter().filter_map(|p| p.metadata.name.clone()).collect();
            let deleting = list.iter().any(|p| p.metadata.deletion_timestamp.is_some());
            let ready: BTreeSet<String> = list
                .iter()
                .filter(|p| {
                    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
                    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            let deployment = Api::<Deployment>::namespaced(kcp.clone(), NAMESPACE).get("catalogsync").await.ok()?;
            let status = deployment.status.unwrap_or_default();
            let ok = names.len() == n
                && !deleting
                && names.is_subset(&ready)
                && names.is_disjoint(excluding)
                && status.ready_replicas == Some(i32::try_from(n).ok()?)
                && status.replicas == Some(i32::try_from(n).ok()?);
            ok.then_some(names)
        })
        .await;
        match found {
            Ok(names) => names,
            Err(e) => {
                let kcm = if self.kcm.is_running() { "running" } else { "exited" };
                panic!(
                    "{e}\nkube-controller-manager ({kcm}), last lines of its log:\n{}\nnode:\n{}\npods seen: {:#?}",
                    self.kcm.log_tail(30),
                    self.node.log_tails(30),
                    self.node.pods()
                )
            }
        }
    }

    /// Waits until every shard is held, as desired, by one of `pods`, which are the live
    /// members, within the cap.
    async fn await_converged(&self, pods: &BTreeSet<String>) -> Table {
        let kcp = &self.fleet.scenario.kcp;
        let cap = SHARDS.div_ceil(u32::try_from(pods.len()).expect("few pods")) as usize;
        testenv::await_condition(PROMPT, &format!("all {SHARDS} shards held by {pods:?}"), || async {
            let t = table::read(kcp, NAMESPACE, KCP_NAMESPACE).await.ok()?;
            let ok = t.rows.len() == SHARDS as usize
                && t.rows.iter().all(|r| r.state == "held" && pods.contains(&r.holder))
                && pods.iter().all(|m| t.rows.iter().filter(|r| &r.holder == m).count() <= cap)
                && t.members.iter().cloned().collect::<BTreeSet<_>>() == *pods;
            ok.then_some(t)
        })
        .await
    }

    /// Writes a catalog change (a new version on a new channel) and waits until both SKRs
    /// hold it.
    async fn release(&self, version: &str) {
        let s = &self.fleet.scenario;
        s.apply_catalog(&[mt("keda", version), mrm("keda", &[("regular", "1.0.0"), ("fast", version)])])
            .await
            .expect("catalog change");
        self.await_everywhere(&format!("keda-{version}")).await;
    }

    async fn await_everywhere(&self, name: &str) {
        let env = testenv::env();
        for skr in [&env.skr_a, &env.skr_b] {
            testenv::await_condition(PROMPT, &format!("{name} in {}", skr.name()), || async {
                self.fleet.scenario.skr_names(skr, MT).await.contains(name)
            })
            .await;
        }
    }

    async fn set_hpa_bounds(&self, min: i32, max: i32) {
        let patch = json!({"spec": {"minReplicas": min, "maxReplicas": max}});
        self.hpa().patch("catalogsync", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch the HPA");
    }

    /// `GET path` from pod `pod`'s HTTP port, through the node's network namespace.
    async fn http_get(&self, pod: &str, path: &str) -> anyhow::Result<(u16, String)> {
        let ip = self.node.pod(pod).and_then(|p| p.ip).ok_or_else(|| anyhow::anyhow!("{pod} has no IP"))?;
        self.node.http_get(SocketAddr::new(ip, HTTP_PORT), path).await
    }

    async fn metric(&self, pod: &str, name: &str, labels: &[&str]) -> f64 {
        match self.http_get(pod, "/metrics").await {
            Ok((200, body)) => testenv::fleet::metric_sum(&body, name, labels),
            _ => 0.0,
        }
    }

    /// Waits until pod `name` is gone and asserts that the kubelet reported its container
    /// exited 0, by itself, within the grace period after the deletion (SIGTERM).
    async fn assert_terminated_gracefully(&self, name: &str) {
        let seen = testenv::await_condition(PROMPT, &format!("{name} to be gone"), || async {
            self.node.pod(name).filter(|p| p.gone)
        })
        .await;
        let (code, reason, finished) =
            seen.terminated.clone().unwrap_or_else(|| panic!("no terminated state reported for {name}: {seen:?}"));
        let requested = seen.deletion_requested.unwrap_or_else(|| panic!("{name} was not deleted: {seen:?}"));
        let grace = seen.grace_seconds.expect("a grace period");
        let took = finished.duration_since(requested);
        let log = self.node.container_log(NAMESPACE, name, "catalogsync");
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        assert_eq!(code, 0, "{name} exited with {code} ({reason}) after SIGTERM; last log lines: {tail:#?}");
        assert!(took.as_secs() < grace, "{name} took {took:?} of its {grace} s grace period to exit");
        eprintln!("{name}: exited 0 ({reason}) {:.1}s after SIGTERM", took.as_secs_f64());
    }
}

/// Installs `deploy/crds` and `deploy/overlays/hpa` (with the test's image and SKR
/// destinations), starts kube-controller-manager and the node, and creates the Kymas and a
/// catalog.
async fn install() -> Install {
    testenv::configure_env(testenv::node::env_options());
    let images = [
        image_archive("catalogsync", "CATALOGSYNC_TEST_IMAGE"),
        image_archive("pause", "CATALOGSYNC_TEST_PAUSE_IMAGE"),
    ];
    let env = testenv::env();
    let kcp = env.kcp.admin_client();
    let mut scenario = Scenario::in_namespace(KCP_NAMESPACE, SYNC_NAMESPACE).await.expect("scenario");
    scenario.skr_address = Some(SKR_ADDRESS.into());
    let mut objects = kustomize_build("deploy/overlays/hpa");
    let kinds: BTreeSet<&str> = objects.iter().map(kind_of).collect();
    for kind in
        ["ServiceAccount", "Role", "ClusterRole", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget"]
    {
        assert!(kinds.contains(kind), "deploy/overlays/hpa renders no {kind}: {kinds:?}");
    }
    assert!(
        the(&objects, "Deployment")["spec"].get("replicas").is_none(),
        "the HPA overlay leaves the replica count to the HPA"
    );
    for object in &mut objects {
        if kind_of(object) == "Deployment" {
            let container = &mut object["spec"]["template"]["spec"]["containers"][0];
            container["image"] = json!(image_ref());
            container["imagePullPolicy"] = json!("Never");
            let env = container["env"].as_array_mut().expect("the container's env");
            env.push(json!({"name": "CATALOGSYNC_SKR_ALLOWED_DESTINATIONS", "value": format!("{SKR_ADDRESS}/32")}));
        }
    }
    testenv::create_namespace(&kcp, NAMESPACE).await.expect("namespace");
    let names: Vec<String> = objects.iter().map(|o| format!("{} {}", kind_of(o), name_of(o))).collect();
    testenv::apply_docs(&kcp, objects).await.expect("apply deploy/overlays/hpa");
    eprintln!("applied deploy/overlays/hpa: {names:?}");

    let fleet = Fleet::with_scenario(scenario, &[&env.skr_a, &env.skr_b], KYMAS).await.expect("kymas");
    // One Kyma whose Secret is missing: its failing syncs give the error metrics a series.
    fleet.scenario.add_kyma_without_secret("kyma-lost", &[]).await.expect("kyma without secret");
    fleet.scenario.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");

    let kcm = ControllerManager::start(&env.kcp).expect("start kube-controller-manager");
    let node = match Node::start(&env.kcp, &[&env.skr_a, &env.skr_b], &images, NAMESPACE).await {
        Ok(node) => node,
        Err(e) => panic!("start the node: {e:#}\nkube-controller-manager:\n{}", kcm.log_tail(20)),
    };
    Install { fleet, node, kcm }
}

/// Every metric `docs/metrics.md` documents is served by the running replicas (the union of
/// their scrapes: the coordinator-only ones come from the coordinator; the shadow-mode ones
/// are not served in the default mode) with the documented
/// labels, nothing undocumented is served, and the dashboard and the alerts use only served
/// metrics (and shadow-only ones).
async fn assert_live_metrics_match_the_docs(install: &Install, pods: &BTreeSet<String>) {
    let mut served: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in pods {
        let (code, body) = install.http_get(pod, "/metrics").await.expect("scrape");
        assert_eq!(code, 200, "/metrics of {pod}");
        for (name, labels) in exposed_metrics(&body) {
            served.entry(name).or_default().extend(labels);
        }
    }
    let served: BTreeMap<String, BTreeSet<String>> =
        served.into_iter().filter(|(name, _)| name.starts_with(testenv::docs::METRIC_PREFIX)).collect();
    let documented = documented_metrics();
    let mut problems = Vec::new();
    for (name, row) in &documented {
        match served.get(name) {
            // These replicas run in the default mode, active.
            None if row.shadow_only => {}
            None => problems.push(format!("{name} is documented but no replica serves it")),
            Some(labels) if labels != &row.labels => {
                problems.push(format!("{name} is served with labels {labels:?}, documented with {:?}", row.labels));
            }
            Some(_) => {}
        }
    }
    for name in served.keys() {
        if !documented.contains_key(name) {
            problems.push(format!("{name} is served but not documented in docs/metrics.md"));
        }
    }
    for (source, names) in monitoring_metrics() {
        for name in names {
            // A shadow-only metric may be named to tell shadow replicas apart (an alert's
            // `unless on (pod) catalogsync_shadow_skrs`); these replicas are active.
            let shadow_only = documented.get(&name).is_some_and(|row| row.shadow_only);
            if !served.contains_key(&name) && !shadow_only {
                problems.push(format!("{source} uses {name}, which no replica serves"));
            }
        }
    }
    assert!(problems.is_empty(), "live /metrics and the docs disagree:\n  {}", problems.join("\n  "));
    eprintln!("live /metrics of {} replicas: all {} documented metrics served", pods.len(), documented.len());
}

/// A real Prometheus, run on the node as in a cluster, finds the replicas through Kubernetes
/// service discovery as `deploy/monitoring`'s ServiceMonitor describes them (the
/// EndpointSlices of the Services it selects, its port and path, the labels the Prometheus
/// Operator adds), evaluates the PrometheusRule and answers every dashboard query.
async fn assert_prometheus_discovers_and_scrapes(install: &Install, n: usize) {
    let monitoring = kustomize_build("deploy/monitoring");
    let monitor = the(&monitoring, "ServiceMonitor");
    let endpoint = &monitor["spec"]["endpoints"][0];
    let port = endpoint["port"].as_str().expect("the ServiceMonitor's endpoint port name");
    let path = endpoint["path"].as_str().unwrap_or("/metrics");
    let meta = |name: &str| name.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let mut relabel: Vec<serde_json::Value> = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("the ServiceMonitor's selector")
        .iter()
        .map(|(k, v)| {
            json!({"action": "keep", "source_labels": [format!("__meta_kubernetes_service_label_{}", meta(k))], "regex": v})
        })
        .collect();
    relabel.extend([
        json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": port}),
        json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
        json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
        json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
        json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
        json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}),
        json!({"target_label": "endpoint", "replacement": port}),
    ]);
    let scrape = json!({
        "job_name": "catalogsync",
        "metrics_path": path,
        "kubernetes_sd_configs": [{"role": "endpointslice", "kubeconfig_file": "kcp.kubeconfig", "namespaces": {"names": [NAMESPACE]}}],
        "relabel_configs": relabel,
    });
    let node = &install.node;
    let kubeconfig = node.kcp_kubeconfig(&testenv::env().kcp, "prometheus").expect("a kubeconfig for Prometheus");
    let kubeconfig = std::fs::read_to_string(kubeconfig).expect("read it");
    // Inside the node's network namespace, on its loopback; reached through a forward.
    let listen = SocketAddr::from(([127, 0, 0, 1], 9090));
    let options = PrometheusOptions::new(listen)
        .file("kcp.kubeconfig", &kubeconfig)
        .scrape(scrape)
        .rule_file(RULE_FILE, &rule_file(&prometheus_rule()))
        .command_prefix(node.command_prefix())
        .api_addr(node.forward(listen).expect("a forward to Prometheus"));
    let prometheus = Prometheus::start(options, Some(node.dir())).await.expect("start Prometheus on the node");
    // kyma-lost's failing syncs may make alerts pending; their own tests are promtool's.
    match check_live(&prometheus, "catalogsync", n, AlertsExpected::Any, PROMPT).await {
        Ok(summary) => eprintln!("Prometheus on the node (Kubernetes service discovery): {summary}"),
        Err(e) => panic!("{e:#}\nPrometheus log:\n{}", prometheus.log_tail(30)),
    }
}

/// The kernel's view of the catalogsync processes on the node: the Deployment's security
/// context is in force (uid 65532, no capabilities, no privilege escalation, a seccomp
/// filter, a read-only root file system).
fn assert_pods_run_confined(install: &Install, n: usize) {
    let processes: Vec<_> =
        install.node.container_processes().into_iter().filter(|p| p.comm == "catalogsync").collect();
    assert_eq!(processes.len(), n, "catalogsync processes on the node: {processes:#?}");
    for p in &processes {
        assert_eq!(p.uids, "65532 65532 65532 65532", "uids of {p:?}");
        assert_eq!(p.cap_eff, "0000000000000000", "capabilities of {p:?}");
        assert_eq!(p.no_new_privs, "1", "no_new_privs of {p:?}");
        assert_eq!(p.seccomp, "2", "seccomp mode of {p:?}");
        assert!(p.root_read_only, "root file system of {p:?} is writable");
    }
    eprintln!("{n} catalogsync processes: uid 65532, no capabilities, no_new_privs, seccomp filter, read-only root");
}

#[tokio::test]
async fn deploy_runs_scales_with_its_hpa_and_hands_over_without_a_second_writer() {
    let mut install = install().await;
    let none = BTreeSet::new();

    // The Deployment has no replica count; the HPA raises the default 1 to minReplicas 3.
    let three = install.await_ready_pods(3, &none).await;
    let hpas = install.hpa();
    testenv::await_condition(PROMPT, "the HPA to report 3 current replicas", || async {
        hpas.get("catalogsync").await.ok()?.status?.current_replicas.filter(|&n| n == 3)
    })
    .await;
    let t = install.await_converged(&three).await;
    eprintln!("{}", table::render(&t));
    for k in &install.fleet.kymas {
        install.fleet.scenario.await_condition(&k.name, "True", "CatalogSynced", PROMPT).await;
    }
    install.fleet.scenario.await_condition("kyma-lost", "False", "AccessSecretMissing", PROMPT).await;
    // The replicas report the pod names the downward API gave them.
    for pod in &three {
        let (code, body) = install.http_get(pod, "/debug/shards").await.expect("/debug/shards");
        assert_eq!(code, 200);
        assert!(body.contains(pod.as_str()), "/debug/shards of {pod} does not name it: {body}");
    }
    assert_live_metrics_match_the_docs(&install, &three).await;
    assert_pods_run_confined(&install, 3);
    assert_prometheus_discovers_and_scrapes(&install, 3).await;

    // Scale out through the HPA.
    install.set_hpa_bounds(4, 10).await;
    let four = install.await_ready_pods(4, &none).await;
    let added: Vec<&String> = four.difference(&three).collect();
    assert_eq!(added.len(), 1, "one pod added: {four:?}");
    install.await_converged(&four).await;
    let claimed = install.metric(added[0], "catalogsync_shard_handovers_total", &["op=\"claimed\""]).await;
    assert!(claimed >= 1.0, "{} claimed no shard", added[0]);
    install.release("1.1.0").await;

    // Scale in through the HPA: the ReplicaSet deletes a pod, which hands its shards over.
    install.set_hpa_bounds(3, 3).await;
    let after = install.await_ready_pods(3, &none).await;
    let removed: Vec<&String> = four.difference(&after).collect();
    assert_eq!(removed.len(), 1, "one pod removed: {after:?}");
    install.assert_terminated_gracefully(removed[0]).await;
    install.await_converged(&after).await;
    install.release("1.2.0").await;

    // A rolling update (what `kubectl rollout restart` does): maxSurge 1, maxUnavailable 0,
    // gated by the readiness probe. A release during it reaches every SKR.
    let patch =
        json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "test"}}}}});
    Api::<Deployment>::namespaced(install.fleet.scenario.kcp.clone(), NAMESPACE)
        .patch("catalogsync", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("restart the rollout");
    install.release("1.3.0").await;
    let rolled = install.await_ready_pods(3, &after).await;
    for old in &after {
        install.assert_terminated_gracefully(old).await;
    }
    install.await_converged(&rolled).await;
    install.release("1.4.0").await;

    // The PodDisruptionBudget (maxUnavailable 1) allows one eviction at a time.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(install.fleet.scenario.kcp.clone(), NAMESPACE);
    testenv::await_condition(PROMPT, "the PDB to allow one disruption of 3 healthy pods", || async {
        let status = pdbs.get("catalogsync").await.ok()?.status?;
        (status.current_healthy == 3 && status.disruptions_allowed == 1).then_some(())
    })
    .await;
    let mut victims = rolled.iter();
    let (first, second) = (victims.next().expect("a pod"), victims.next().expect("a second pod"));
    // A client that does not retry 429 (kube's default client does, until the budget allows).
    let mut config = testenv::env().kcp.admin_config();
    config.default_retry = false;
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config).expect("client"), NAMESPACE);
    pods.evict(first, &EvictParams::default()).await.expect("the first eviction is allowed");
    match pods.evict(second, &EvictParams::default()).await {
        Err(kube::Error::Api(status)) if status.code == 429 => {}
        other => panic!("a second eviction at once must be refused with 429 (PDB), got {other:?}"),
    }
    let healed = install.await_ready_pods(3, &BTreeSet::from([first.clone()])).await;
    install.assert_terminated_gracefully(first).await;
    install.await_converged(&healed).await;
    install.release("1.5.0").await;

    // Through all of it: each SKR identity was written by one replica at a time, the holder
    // of its shard.
    let options =
        InvariantOptions { lease_namespace: Some(NAMESPACE.to_owned()), member_liveness: true, ..Default::default() };
    let report = check_invariants(&install.fleet.invariant_input(|ns, name| shard_of(ns, name, SHARDS), options))
        .expect("invariants");
    eprintln!("{report}");
    report.assert_no_double_writer();
    // And no container crashed or was restarted by its liveness probe.
    let pods = install.node.pods();
    let restarted: Vec<_> = pods.iter().filter(|(_, p)| p.restarts > 0).map(|(n, p)| (n, p.restarts)).collect();
    assert!(restarted.is_empty(), "containers restarted: {restarted:?}");
    eprintln!("{} pods run, none restarted", pods.len());

    // The node stops, and the host settings it changed are back.
    let Install { node, fleet, kcm } = install;
    drop(fleet);
    let restored = node.shutdown().expect("the host restored");
    drop(kcm);
    eprintln!("node stopped; host settings restored: {restored:?}");
}
