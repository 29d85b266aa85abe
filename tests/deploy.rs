//! The manifests under `deploy/` and the docs that describe them:
//!
//! - every kustomization renders with the pinned kustomize (`hack/kustomize.sh`) and every
//!   object it renders is accepted by the real test KCP apiserver (server-side apply, dry run);
//! - the Deployment has the replicas, identity, probes, security context and grace period the
//!   controller relies on, and the HPA overlay leaves the replica count to the HPA;
//! - the egress NetworkPolicies of `deploy/egress-policy` select exactly the Deployment's pods
//!   and allow DNS, the KCP apiserver (a placeholder the docs explain) and public addresses
//!   on 443 (every non-public range excepted), and no rule reaches a cloud metadata address;
//! - every `run`, `shards` and `explain` flag of `--help` is in `docs/configuration.md` with its
//!   environment variable and default;
//! - `deploy/install.yaml` is exactly what `hack/render-install.sh` renders: a generated header
//!   over the output of `kustomize build deploy/base`, byte for byte;
//! - every metric named in the dashboard and the alerts is documented in `docs/metrics.md`
//!   (which `tests/metrics_doc.rs` keeps equal to the registered metrics), and every alert's
//!   runbook link points at a section of `docs/operations.md`.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use catalogsync::config::{Cli, Command as CliCommand};
use clap::Parser as _;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use serde_json::Value;

use testenv::docs::{documented_metrics, metric_names, read};
use testenv::kustomize::{kind_of, kustomize_build as render, kustomize_build_text, monitoring_metrics, name_of, the};
use testenv::{create_namespace, env, install_crds_yaml, parse_yaml_docs, wait_until};

/// Field manager of the dry-run applies.
const FIELD_MANAGER: &str = "deploy-test";
/// How long a kind may take to appear in discovery (a CRD installed just before).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(15);
/// The kustomizations under `deploy/` that are installed on their own.
const KUSTOMIZATIONS: &[&str] = &[
    "deploy/crds",
    "deploy/base",
    "deploy/overlays/hpa",
    "deploy/overlays/shadow",
    "deploy/monitoring",
    "deploy/egress-policy",
    "deploy/admission-policy",
];

/// Server-side applies every object with `dryRun=All`: the apiserver validates, defaults and
/// admits each one (schema, RBAC escalation checks, namespace existence) and stores nothing.
/// The namespaces the objects live in are created for real first, because a dry-run object
/// in a namespace that does not exist is rejected (a dry-run Namespace does not count).
async fn dry_run_apply(client: &Client, docs: &[Value]) -> Result<()> {
    let namespaces: BTreeSet<&str> = docs
        .iter()
        .filter_map(|d| d["metadata"]["namespace"].as_str())
        .chain(docs.iter().filter(|d| kind_of(d) == "Namespace").map(name_of))
        .collect();
    for ns in namespaces {
        create_namespace(client, ns).await?;
    }
    let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
    let mut kinds: BTreeMap<String, (ApiResource, ApiCapabilities)> = BTreeMap::new();
    for doc in docs {
        let obj: DynamicObject =
            serde_json::from_value(doc.clone()).context("a document is not a Kubernetes object")?;
        let types = obj.types.clone().ok_or_else(|| anyhow!("object {} has no apiVersion/kind", name_of(doc)))?;
        let gvk =
            GroupVersionKind::try_from(&types).with_context(|| format!("bad apiVersion {}", types.api_version))?;
        let key = format!("{}/{}", types.api_version, types.kind);
        if !kinds.contains_key(&key) {
            let found = wait_until(DISCOVERY_TIMEOUT, &format!("{key} to be served"), || async {
                kube::discovery::pinned_kind(client, &gvk).await.ok()
            })
            .await?;
            kinds.insert(key.clone(), found);
        }
        let (resource, caps) = &kinds[&key];
        let name = name_of(doc);
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = obj.metadata.namespace.as_deref().ok_or_else(|| anyhow!("{key} {name} has no namespace"))?;
                Api::namespaced_with(client.clone(), ns, resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), resource),
        };
        api.patch(name, &params, &Patch::Apply(&obj))
            .await
            .with_context(|| format!("the KCP rejected {key} {name} (dry-run apply)"))?;
    }
    Ok(())
}

/// Installs the stand-in Prometheus Operator CRDs (tests/fixtures/monitoring-crds.yaml: any
/// object of the kinds is accepted) so that deploy/monitoring can be dry-run applied.
async fn install_monitoring_crds(env: &testenv::TestEnv) -> Result<()> {
    install_crds_yaml(&env.kcp, &read("tests/fixtures/monitoring-crds.yaml")).await?;
    Ok(())
}

#[tokio::test]
async fn every_kustomization_renders_and_the_kcp_accepts_it() {
    let env = env();
    let client = env.kcp.admin_client();
    install_monitoring_crds(env).await.expect("install the monitoring CRD stand-ins");
    for dir in KUSTOMIZATIONS {
        let docs = render(dir);
        dry_run_apply(&client, &docs).await.unwrap_or_else(|e| panic!("{dir}: {e:#}"));
        eprintln!("{dir}: {} objects accepted by the KCP (dry run)", docs.len());
    }
}

/// The single-file install and the kustomization it is rendered from.
const INSTALL_YAML: &str = "deploy/install.yaml";
const INSTALL_SOURCE: &str = "deploy/base";

/// The first line where the shipped text `a` and the rendered text `b` differ.
fn first_difference(a: &str, b: &str) -> String {
    let (mut a_lines, mut b_lines) = (a.lines(), b.lines());
    for n in 1.. {
        match (a_lines.next(), b_lines.next()) {
            (Some(x), Some(y)) if x == y => {}
            (None, None) => return "the line ends differ".to_owned(),
            (x, y) => {
                let (x, y) = (x.unwrap_or("<end of file>"), y.unwrap_or("<end of file>"));
                return format!("line {n} is {x:?} where the rendering has {y:?}");
            }
        }
    }
    unreachable!("the loop returns")
}

#[test]
fn install_yaml_is_the_rendered_base() {
    let regenerate = format!("run hack/render-install.sh and commit {INSTALL_YAML}");
    let out = Command::new(testenv::repo_root().join("hack/render-install.sh"))
        .arg("-")
        .output()
        .expect("run hack/render-install.sh");
    assert!(out.status.success(), "hack/render-install.sh - failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let rendered = String::from_utf8(out.stdout).expect("UTF-8");
    let shipped = read(INSTALL_YAML);
    assert!(
        shipped == rendered,
        "{INSTALL_YAML} is stale or edited by hand ({}): {regenerate}",
        first_difference(&shipped, &rendered)
    );
    // Below its header of comment lines it is kustomize's output, unchanged.
    let body = kustomize_build_text(INSTALL_SOURCE);
    let header = shipped
        .strip_suffix(&body)
        .unwrap_or_else(|| panic!("{INSTALL_YAML} does not end with `kustomize build {INSTALL_SOURCE}`: {regenerate}"));
    assert!(header.lines().all(|l| l.starts_with('#')), "{INSTALL_YAML}: only comment lines above the objects");
    assert!(
        header.contains("GENERATED") && header.contains("hack/render-install.sh"),
        "the header says how it is made"
    );
    let docs = render(INSTALL_SOURCE);
    assert!(docs.iter().any(|d| kind_of(d) == "Deployment"), "{INSTALL_YAML} installs the Deployment");
    assert!(
        docs.iter().all(|d| kind_of(d) != "CustomResourceDefinition"),
        "{INSTALL_YAML} must not carry the CRDs: on a KCP with lifecycle-manager they are KLM's"
    );
}

#[test]
fn namespaced_objects_name_their_namespace() {
    // A namespaced object without a namespace would land wherever `kubectl apply` points.
    for dir in KUSTOMIZATIONS.iter().filter(|d| **d != "deploy/crds") {
        for doc in render(dir) {
            let cluster_scoped = [
                "Namespace",
                "ClusterRole",
                "ClusterRoleBinding",
                "CustomResourceDefinition",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ];
            if !cluster_scoped.contains(&kind_of(&doc)) {
                assert!(
                    doc["metadata"]["namespace"].is_string(),
                    "{dir}: {} {} has no namespace",
                    kind_of(&doc),
                    name_of(&doc)
                );
            }
        }
    }
}

#[test]
fn base_includes_exactly_the_rbac_of_deploy_rbac() {
    // The end-to-end tests apply deploy/rbac/*.yaml file by file; the base must ship the same.
    let identity = |d: &Value| {
        (
            kind_of(d).to_owned(),
            d["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(),
            name_of(d).to_owned(),
        )
    };
    let mut from_files = BTreeSet::new();
    for file in testenv::apply::yaml_files(&testenv::rbac_dir()).expect("read deploy/rbac") {
        let text = std::fs::read_to_string(&file).expect("read an RBAC file");
        from_files.extend(parse_yaml_docs(&text).expect("RBAC YAML parses").iter().map(identity));
    }
    let rendered: BTreeSet<_> = render("deploy/rbac").iter().map(identity).collect();
    assert_eq!(rendered, from_files, "deploy/rbac/kustomization.yaml must list every file of deploy/rbac");
    let base: BTreeSet<_> = render("deploy/base").iter().map(identity).collect();
    assert!(base.is_superset(&from_files), "deploy/base misses RBAC: {:?}", from_files.difference(&base));
}

#[test]
fn base_deployment_runs_the_controller_as_designed() {
    let docs = render("deploy/base");
    let deploy = the(&docs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 3);
    let pod = &deploy["spec"]["template"]["spec"];
    let sa = the(&docs, "ServiceAccount");
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(deploy["metadata"]["namespace"], sa["metadata"]["namespace"]);
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["args"], serde_json::json!(["run"]));
    let image = c["image"].as_str().expect("image");
    assert!(image.contains('/') && image.contains(':'), "kustomize `images:` sets a full image reference: {image}");

    let env: BTreeMap<&str, &Value> =
        c["env"].as_array().expect("env").iter().map(|e| (e["name"].as_str().expect("env name"), e)).collect();
    assert_eq!(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name", "--identity from the pod name");
    assert_eq!(
        env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace",
        "--lease-namespace from the pod namespace"
    );
    assert_eq!(env["CATALOGSYNC_LOG_FORMAT"]["value"], "json");

    // Probes on the HTTP server's port (default --http-addr 0.0.0.0:8080).
    let port = c["ports"].as_array().expect("ports").iter().find(|p| p["containerPort"] == 8080).expect("port 8080");
    let probe_port = |probe: &str| {
        let p = &c[probe]["httpGet"]["port"];
        assert!(p == &port["name"] || p == 8080, "{probe} must use port 8080, got {p}");
        c[probe]["httpGet"]["path"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(probe_port("livenessProbe"), "/healthz");
    assert_eq!(probe_port("readinessProbe"), "/readyz");

    assert!(c["resources"]["requests"]["cpu"].is_string(), "a CPU request (the HPA scales on it)");
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());

    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let run_as_non_root = sc["runAsNonRoot"] == true || pod["securityContext"]["runAsNonRoot"] == true;
    assert!(run_as_non_root, "runAsNonRoot");
    let seccomp = if sc["seccompProfile"].is_object() {
        &sc["seccompProfile"]
    } else {
        &pod["securityContext"]["seccompProfile"]
    };
    assert_eq!(seccomp["type"], "RuntimeDefault");

    let spread = pod["topologySpreadConstraints"].as_array().expect("topologySpreadConstraints");
    assert!(spread.iter().any(|t| t["topologyKey"] == "kubernetes.io/hostname"), "spread over nodes");

    // SIGTERM: drain (--drain-timeout), then in-flight work (--shutdown-timeout), then the
    // Lease writes. A SIGKILL before that leaves the shards unowned for a lease duration.
    let cli = Cli::try_parse_from(["catalogsync", "run"]).expect("defaults parse");
    let CliCommand::Run(args) = cli.command else { unreachable!("run was given") };
    let needed = (args.drain_timeout + args.shutdown_timeout).as_secs();
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
    assert!(grace > needed, "terminationGracePeriodSeconds {grace} must exceed drain + shutdown timeouts ({needed} s)");

    let svc = the(&docs, "Service");
    let svc_port = &svc["spec"]["ports"][0];
    assert_eq!((svc_port["name"].as_str(), svc_port["port"].as_u64()), (Some("http-metrics"), Some(8080)));
    assert_eq!(svc["spec"]["selector"], deploy["spec"]["selector"]["matchLabels"]);
    let pdb = the(&docs, "PodDisruptionBudget");
    assert!(pdb["spec"]["maxUnavailable"] == 1 || pdb["spec"]["minAvailable"].is_number());
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], deploy["spec"]["selector"]["matchLabels"]);
}

#[test]
fn hpa_overlay_leaves_the_replica_count_to_a_slow_scaling_hpa() {
    let docs = render("deploy/overlays/hpa");
    let deploy = the(&docs, "Deployment");
    assert!(deploy["spec"].get("replicas").is_none(), "the HPA owns the replica count");
    let hpa = the(&docs, "HorizontalPodAutoscaler");
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], deploy["metadata"]["name"]);
    assert_eq!(hpa["spec"]["minReplicas"], 3);
    assert_eq!(hpa["spec"]["maxReplicas"], 10);
    assert_eq!(hpa["spec"]["metrics"][0]["resource"]["name"], "cpu");
    let down = &hpa["spec"]["behavior"]["scaleDown"];
    assert_eq!(down["stabilizationWindowSeconds"], 600);
    let policies = down["policies"].as_array().expect("scale-down policies");
    assert!(!policies.is_empty());
    for p in policies {
        assert_eq!(p["type"], "Pods");
        assert!(p["value"] == 1 && p["periodSeconds"].as_u64() >= Some(300), "at most one pod per 5 minutes: {p}");
    }
}

#[test]
fn shadow_overlay_runs_the_base_in_shadow_mode() {
    let base = the(&render("deploy/base"), "Deployment").clone();
    let docs = render("deploy/overlays/shadow");
    let deploy = the(&docs, "Deployment");
    let env = deploy["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env");
    let mode: Vec<&Value> = env.iter().filter(|e| e["name"] == "CATALOGSYNC_MODE").collect();
    assert_eq!(mode.len(), 1, "one CATALOGSYNC_MODE");
    assert_eq!(mode[0]["value"], "shadow");
    let base_env = base["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env").len();
    assert_eq!(env.len(), base_env + 1, "the base's environment is kept");
}

/// The ranges `--skr-allowed-destinations=public` refuses. The egress policy's public rule must
/// except each of them; one per line, so that dropping one from the policy fails a test.
const NON_PUBLIC_RANGES: &[&str] = &[
    "0.0.0.0/8",      // "this network", unspecified
    "10.0.0.0/8",     // private (RFC 1918)
    "172.16.0.0/12",  // private (RFC 1918)
    "192.168.0.0/16", // private (RFC 1918)
    "100.64.0.0/10",  // carrier-grade NAT (RFC 6598)
    "169.254.0.0/16", // link-local, cloud metadata
    "127.0.0.0/8",    // loopback
    "224.0.0.0/4",    // multicast
    "240.0.0.0/4",    // reserved, broadcast
    "::/128",         // unspecified
    "::1/128",        // loopback
    "fc00::/7",       // unique local (private)
    "fe80::/10",      // link-local
    "ff00::/8",       // multicast
];
/// Cloud metadata services (every major cloud's IPv4 one, AWS's IPv6 one): no egress rule may
/// reach them.
const METADATA_ADDRESSES: &[&str] = &["169.254.169.254", "fd00:ec2::254"];
/// The policy that only the operator can complete: the KCP apiserver's address.
const KCP_APISERVER_POLICY: &str = "catalogsync-egress-kcp-apiserver";
/// Its placeholder address as shipped, in TEST-NET-1 (RFC 5737), which reaches nothing.
const KCP_APISERVER_PLACEHOLDER: &str = "192.0.2.1";

/// An IP prefix (`10.0.0.0/8`, `fc00::/7`; a bare address is a prefix of full length), enough
/// to tell whether one range holds another.
#[derive(Debug, Clone, Copy)]
struct Cidr {
    /// The address as written, for messages.
    addr: IpAddr,
    /// The address, an IPv4 one in the low 32 bits.
    bits: u128,
    /// Address length: 32 or 128.
    width: u32,
    /// Prefix length.
    prefix: u32,
}

impl Cidr {
    fn parse(text: &str) -> Self {
        let (addr, prefix) = text.split_once('/').map_or((text, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = addr.parse().unwrap_or_else(|e| panic!("{text}: not an IP address: {e}"));
        let (bits, width) = match addr {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        let prefix = prefix.map_or(width, |p| p.parse().unwrap_or_else(|e| panic!("{text}: bad prefix length: {e}")));
        assert!(prefix <= width, "{text}: prefix longer than the address");
        Self { addr, bits, width, prefix }
    }

    /// Whether every address of `other` is in `self`.
    fn contains(&self, other: &Self) -> bool {
        let host_bits = self.width - self.prefix;
        self.width == other.width
            && self.prefix <= other.prefix
            && self.bits.checked_shr(host_bits).unwrap_or(0) == other.bits.checked_shr(host_bits).unwrap_or(0)
    }

    /// Whether `self` and `other` share an address.
    fn overlaps(&self, other: &Self) -> bool {
        self.contains(other) || other.contains(self)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The NetworkPolicies of `deploy/egress-policy`, by name (it renders nothing else).
fn egress_policies() -> BTreeMap<String, Value> {
    let docs = render("deploy/egress-policy");
    assert!(docs.iter().all(|d| kind_of(d) == "NetworkPolicy"), "deploy/egress-policy renders only NetworkPolicies");
    docs.into_iter().map(|d| (name_of(&d).to_owned(), d)).collect()
}

/// The egress rules of a NetworkPolicy.
fn egress_rules(policy: &Value) -> &[Value] {
    policy["spec"]["egress"].as_array().map_or(&[], Vec::as_slice)
}

/// The `ipBlock`s of a rule, as (cidr, except).
fn ip_blocks(rule: &Value) -> Vec<(Cidr, Vec<Cidr>)> {
    let peers = rule["to"].as_array().map_or(&[][..], Vec::as_slice);
    peers
        .iter()
        .filter_map(|p| p.get("ipBlock"))
        .map(|b| {
            let cidr = Cidr::parse(b["cidr"].as_str().expect("ipBlock.cidr"));
            let except = b["except"].as_array().map_or(&[][..], Vec::as_slice);
            (cidr, except.iter().map(|e| Cidr::parse(e.as_str().expect("an except entry"))).collect())
        })
        .collect()
}

#[test]
fn cidr_containment_follows_the_prefix() {
    let c = Cidr::parse;
    assert!(c("169.254.0.0/16").contains(&c("169.254.169.254")));
    assert!(!c("169.254.0.0/16").contains(&c("169.255.0.1")));
    assert!(c("0.0.0.0/0").contains(&c("10.0.0.0/8")) && !c("10.0.0.0/8").contains(&c("0.0.0.0/0")));
    assert!(c("fc00::/7").contains(&c("fd00:ec2::254")) && !c("fc00::/7").contains(&c("fe80::1")));
    assert!(c("::/0").contains(&c("::1")) && !c("::/0").contains(&c("127.0.0.1")), "families never mix");
    assert!(c("10.1.0.0/16").overlaps(&c("10.0.0.0/8")) && !c("11.0.0.0/8").overlaps(&c("10.0.0.0/8")));
}

#[test]
fn egress_policies_select_exactly_the_deployments_pods_and_restrict_egress_only() {
    let base = render("deploy/base");
    let deploy = the(&base, "Deployment");
    let pod_labels = &deploy["spec"]["template"]["metadata"]["labels"];
    assert!(pod_labels.as_object().is_some_and(|l| !l.is_empty()), "the Deployment's pods carry labels");
    let policies = egress_policies();
    assert!(policies.contains_key("catalogsync-egress") && policies.contains_key(KCP_APISERVER_POLICY));
    for (name, policy) in &policies {
        assert_eq!(policy["metadata"]["namespace"], deploy["metadata"]["namespace"], "{name}: the pods' namespace");
        assert_eq!(
            policy["spec"]["podSelector"],
            serde_json::json!({ "matchLabels": pod_labels }),
            "{name} must select exactly the labels of the Deployment's pods"
        );
        // Ingress (metrics scrapes, probes) stays unrestricted.
        assert_eq!(policy["spec"]["policyTypes"], serde_json::json!(["Egress"]), "{name}: policyTypes");
        assert!(policy["spec"].get("ingress").is_none(), "{name} has ingress rules");
        assert!(!egress_rules(policy).is_empty(), "{name} has no egress rules");
        for (i, rule) in egress_rules(policy).iter().enumerate() {
            // An empty or missing `to` or `ports` means every destination or every port.
            assert!(rule["to"].as_array().is_some_and(|t| !t.is_empty()), "{name}: rule {i} allows every destination");
            assert!(rule["ports"].as_array().is_some_and(|p| !p.is_empty()), "{name}: rule {i} allows every port");
        }
    }
}

#[test]
fn egress_policy_allows_dns_to_kube_dns() {
    let policies = egress_policies();
    let kube_dns = serde_json::json!({
        "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "kube-system" } },
        "podSelector": { "matchLabels": { "k8s-app": "kube-dns" } },
    });
    let dns = egress_rules(&policies["catalogsync-egress"])
        .iter()
        .find(|r| r["to"].as_array().is_some_and(|to| to.contains(&kube_dns)))
        .expect("a rule to the kube-dns pods of kube-system");
    let ports = dns["ports"].as_array().expect("DNS ports");
    for protocol in ["UDP", "TCP"] {
        assert!(
            ports.contains(&serde_json::json!({ "protocol": protocol, "port": 53 })),
            "DNS over {protocol} port 53 must be allowed: {ports:?}"
        );
    }
    for peer in dns["to"].as_array().expect("to") {
        assert!(peer.get("ipBlock").is_none(), "the DNS rule allows addresses besides the kube-dns pods: {peer}");
    }
}

#[test]
fn egress_policy_allows_public_addresses_on_443_and_excepts_every_non_public_range() {
    let policies = egress_policies();
    let policy = &policies["catalogsync-egress"];
    let mut public_families = BTreeSet::new();
    for rule in egress_rules(policy) {
        for (cidr, except) in ip_blocks(rule) {
            if cidr.prefix == 0 {
                public_families.insert(cidr.width);
                assert_eq!(
                    rule["ports"],
                    serde_json::json!([{ "protocol": "TCP", "port": 443 }]),
                    "public addresses only on TCP 443, where SKR apiservers answer"
                );
            }
            for range in NON_PUBLIC_RANGES {
                let range_cidr = Cidr::parse(range);
                if cidr.overlaps(&range_cidr) {
                    assert!(
                        except.iter().any(|e| e.contains(&range_cidr)),
                        "catalogsync-egress: ipBlock {cidr} must except {range}, which --skr-allowed-destinations refuses"
                    );
                }
            }
        }
    }
    assert_eq!(public_families, BTreeSet::from([32, 128]), "one public ipBlock per family: 0.0.0.0/0 and ::/0");
}

#[test]
fn no_egress_rule_reaches_a_cloud_metadata_address() {
    for (name, policy) in egress_policies() {
        for (i, rule) in egress_rules(&policy).iter().enumerate() {
            for (cidr, except) in ip_blocks(rule) {
                for address in METADATA_ADDRESSES {
                    let metadata = Cidr::parse(address);
                    assert!(
                        !cidr.contains(&metadata) || except.iter().any(|e| e.contains(&metadata)),
                        "{name}: rule {i} allows the metadata address {address} (ipBlock {cidr})"
                    );
                }
            }
        }
    }
}

#[test]
fn kcp_apiserver_policy_ships_a_placeholder_the_docs_explain() {
    // deploy/ must not carry one cluster's apiserver address; the operator sets it
    // (docs/operations.md, "Network egress").
    let policies = egress_policies();
    let placeholder = Cidr::parse(KCP_APISERVER_PLACEHOLDER);
    let blocks: Vec<_> = egress_rules(&policies[KCP_APISERVER_POLICY]).iter().flat_map(ip_blocks).collect();
    assert!(!blocks.is_empty(), "{KCP_APISERVER_POLICY} allows the apiserver by ipBlock");
    for (cidr, _) in blocks {
        assert!(placeholder.contains(&cidr), "{KCP_APISERVER_POLICY}: {cidr} is not the placeholder");
    }
    let ops = read("docs/operations.md");
    for needle in [KCP_APISERVER_POLICY, KCP_APISERVER_PLACEHOLDER, "kubernetes.io/service-name=kubernetes"] {
        assert!(ops.contains(needle), "docs/operations.md must explain the egress policy: it lacks {needle}");
    }
}

#[test]
fn dashboard_and_alerts_use_only_documented_metrics() {
    // tests/deployment.rs checks the same names against a live scrape of running replicas.
    let doc = documented_metrics();
    for (source, names) in monitoring_metrics() {
        assert!(names.len() > 3, "{source}: found too few metric names: {names:?}");
        for name in names {
            assert!(doc.contains_key(&name), "{source} uses {name}, which docs/metrics.md does not document");
        }
    }
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_links_to_its_playbook() {
    let ops = read("docs/operations.md");
    let anchors: BTreeSet<String> =
        ops.lines().filter_map(|l| l.strip_prefix('#')).map(|l| anchor(l.trim_start_matches('#'))).collect();
    let rules = the(&render("deploy/monitoring"), "PrometheusRule").clone();
    let mut alerts = 0;
    for group in rules["spec"]["groups"].as_array().expect("rule groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let Some(alert) = rule["alert"].as_str() else { continue };
            alerts += 1;
            let url =
                rule["annotations"]["runbook_url"].as_str().unwrap_or_else(|| panic!("{alert} has no runbook_url"));
            let (page, target) = url.split_once('#').unwrap_or_else(|| panic!("{alert}: runbook_url without #anchor"));
            assert!(page.ends_with("docs/operations.md"), "{alert}: runbook_url must point into docs/operations.md");
            assert!(anchors.contains(target), "{alert}: docs/operations.md has no section #{target}");
            assert!(rule["labels"]["severity"].is_string(), "{alert} has no severity");
        }
    }
    assert_eq!(alerts, 7, "the five sharding and sync alerts, the shrink guard's and the lasting contest's");
}

/// For each flag in the `--help` of `catalogsync <sub>`: its `[env: X=]` and `[default: Y]`.
fn help_flags(sub: &str) -> BTreeMap<String, (Option<String>, Option<String>)> {
    let out = Command::new(env!("CARGO_BIN_EXE_catalogsync"))
        .args([sub, "--help"])
        .env_clear() // `[env: X=value]` would show values from this environment.
        .output()
        .expect("run catalogsync --help");
    assert!(out.status.success(), "catalogsync {sub} --help failed");
    let help = String::from_utf8(out.stdout).expect("help is UTF-8");
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(flag) = trimmed.strip_prefix("--").map(|f| f.split([' ', '<']).next().unwrap_or_default()) {
            current = Some(format!("--{flag}"));
        } else if trimmed.starts_with('-') && trimmed.contains(", --") {
            current = trimmed.split(", ").nth(1).map(|f| f.split([' ', '<']).next().unwrap_or_default().to_owned());
        }
        if let Some(flag) = &current {
            flags.entry(flag.clone()).or_default().push_str(&format!("{trimmed} "));
        }
    }
    let bracket = |text: &str, key: &str| {
        let start = text.find(key)? + key.len();
        Some(text[start..].split(']').next()?.trim().to_owned())
    };
    flags
        .into_iter()
        .filter(|(flag, _)| flag != "--help" && flag != "--version")
        .map(|(flag, text)| {
            let env = bracket(&text, "[env: ").map(|e| e.trim_end_matches('=').to_owned());
            (flag, (env, bracket(&text, "[default: ")))
        })
        .collect()
}

/// The table rows of the `## \`catalogsync <sub>\`` section of docs/configuration.md, by flag.
fn doc_rows(doc: &str, sub: &str) -> BTreeMap<String, String> {
    let heading = format!("## `catalogsync {sub}`");
    let section = doc.split_once(&heading).unwrap_or_else(|| panic!("docs/configuration.md has no {heading}")).1;
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `--"))
        .map(|l| {
            let flag = l.split('`').next().unwrap_or_default();
            (format!("--{flag}"), format!("| `--{l}"))
        })
        .collect()
}

#[test]
fn configuration_doc_lists_every_flag_with_its_env_var_and_default() {
    let doc = read("docs/configuration.md");
    for sub in ["run", "shards", "explain"] {
        let flags = help_flags(sub);
        assert!(flags.len() > 2, "parsed too few flags of {sub}: {flags:?}");
        let rows = doc_rows(&doc, sub);
        for (flag, (env, default)) in &flags {
            let row =
                rows.get(flag).unwrap_or_else(|| panic!("docs/configuration.md: `catalogsync {sub}` lacks {flag}"));
            if let Some(env) = env {
                assert!(
                    row.contains(&format!("`{env}`")),
                    "docs/configuration.md: {flag} of {sub} must name env {env}"
                );
            }
            if let Some(default) = default {
                assert!(
                    row.contains(&format!("`{default}`")),
                    "docs/configuration.md: {flag} of {sub} must show the default `{default}`: {row}"
                );
            }
        }
        let stale: Vec<&String> = rows.keys().filter(|f| !flags.contains_key(*f)).collect();
        assert!(stale.is_empty(), "docs/configuration.md documents flags `catalogsync {sub}` does not have: {stale:?}");
    }
}

#[test]
fn help_parser_reads_env_and_default() {
    let flags = help_flags("run");
    assert_eq!(flags["--drain-timeout"], (Some("CATALOGSYNC_DRAIN_TIMEOUT".into()), Some("10s".into())));
    assert_eq!(flags["--restricted-modules"], (Some("CATALOGSYNC_RESTRICTED_MODULES".into()), None));
    assert_eq!(flags["--identity"].0.as_deref(), Some("POD_NAME"));
    let shards = help_flags("shards");
    assert_eq!(shards["--lease-namespace"], (Some("POD_NAMESPACE".into()), Some("catalogsync-system".into())));
    assert_eq!(shards["--json"], (None, None));
}

#[test]
fn metric_names_strip_histogram_suffixes() {
    let names = metric_names("rate(catalogsync_sync_duration_seconds_bucket{x=\"1\"}[5m]) / catalogsync_a_count");
    assert_eq!(names, BTreeSet::from(["catalogsync_sync_duration_seconds".to_owned(), "catalogsync_a".to_owned()]));
}
