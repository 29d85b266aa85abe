//! `kustomize build` of the directories under `deploy/`, and lookups in what it renders.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use super::apply::parse_yaml_docs;
use super::docs::{metric_names, read, repo_path};

/// `$KUSTOMIZE build <dir>` (`hack/kustomize.sh` provides it), parsed into objects.
///
/// # Panics
/// When `KUSTOMIZE` is not set, the build fails or renders nothing.
pub fn kustomize_build(dir: &str) -> Vec<Value> {
    let yaml = kustomize_build_text(dir);
    let docs =
        parse_yaml_docs(&yaml).unwrap_or_else(|e| panic!("output of kustomize build {dir} does not parse: {e:#}"));
    assert!(!docs.is_empty(), "kustomize build {dir} rendered nothing");
    docs
}

/// `$KUSTOMIZE build <dir>` as it prints it.
///
/// # Panics
/// When `KUSTOMIZE` is not set or the build fails.
pub fn kustomize_build_text(dir: &str) -> String {
    let Some(kustomize) = std::env::var_os("KUSTOMIZE") else {
        panic!("KUSTOMIZE is not set: run `eval \"$(hack/kustomize.sh)\"` first (hack/test.sh does)");
    };
    let out =
        Command::new(&kustomize).arg("build").arg(repo_path(dir)).output().unwrap_or_else(|e| {
            panic!("failed to run {} (KUSTOMIZE; see hack/kustomize.sh): {e}", kustomize.display())
        });
    assert!(
        out.status.success(),
        "kustomize build {dir} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kustomize prints UTF-8")
}

/// The `kind` of an object.
pub fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// The `metadata.name` of an object.
pub fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// The one object of `kind` in `docs`.
///
/// # Panics
/// When there is not exactly one.
pub fn the<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| kind_of(d) == kind).collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind}, found {}", found.len());
    found[0]
}

/// The metric names the Grafana dashboard and the PrometheusRule of `deploy/monitoring` use,
/// by source: in the PrometheusRule, its expressions and the queries of its annotations'
/// templates.
pub fn monitoring_metrics() -> Vec<(&'static str, BTreeSet<String>)> {
    let dashboard = read("deploy/monitoring/dashboard.json");
    serde_json::from_str::<Value>(&dashboard).expect("dashboard.json is JSON");
    let rules = the(&kustomize_build("deploy/monitoring"), "PrometheusRule").clone();
    let texts: Vec<String> = rules["spec"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .flat_map(|r| {
            let annotations = r["annotations"].as_object().into_iter().flat_map(|a| a.values());
            std::iter::once(&r["expr"]).chain(annotations).filter_map(Value::as_str).map(str::to_owned)
        })
        .collect();
    vec![("dashboard.json", metric_names(&dashboard)), ("PrometheusRule", metric_names(&texts.join("\n")))]
}
