//! The manifests under `deploy/` and the docs that describe them:
//!
//! - every kustomization renders with the pinned kustomize (`hack/kustomize.sh`) and every
//!   object it renders is accepted by the real test KCP apiserver (server-side apply, dry run);
//! - the Deployment has the replicas, identity, probes, security context and grace period the
//!   controller relies on, and the HPA overlay leaves the replica count to the HPA;
//! - every `run` and `shards` flag of `--help` is in `docs/configuration.md` with its
//!   environment variable and default;
//! - every metric named in the dashboard and the alerts is documented in `docs/metrics.md`
//!   (which `tests/metrics_doc.rs` keeps equal to the registered metrics), and every alert's
//!   runbook link points at a section of `docs/operations.md`.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

mod common;

use std::collections::{BTreeMap, BTreeSet};
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

use common::docs::{documented_metrics, metric_names, read};
use common::kustomize::{kind_of, kustomize_build as render, monitoring_metrics, name_of, the};
use common::{create_namespace, env, install_crds_yaml, parse_yaml_docs, wait_until};

/// Field manager of the dry-run applies.
const FIELD_MANAGER: &str = "deploy-test";
/// How long a kind may take to appear in discovery (a CRD installed just before).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(15);
/// The kustomizations under `deploy/` that are installed on their own.
const KUSTOMIZATIONS: &[&str] = &["deploy/crds", "deploy/base", "deploy/overlays/hpa", "deploy/monitoring"];

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
async fn install_monitoring_crds(env: &common::TestEnv) -> Result<()> {
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

#[test]
fn namespaced_objects_name_their_namespace() {
    // A namespaced object without a namespace would land wherever `kubectl apply` points.
    for dir in ["deploy/base", "deploy/overlays/hpa", "deploy/monitoring"] {
        for doc in render(dir) {
            let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"];
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
    for file in common::apply::yaml_files(&common::rbac_dir()).expect("read deploy/rbac") {
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
    assert_eq!(alerts, 5, "the five alerts of issue 4");
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
    for sub in ["run", "shards"] {
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
