//! What the repository's docs and manifests say, parsed for the tests that hold the code to
//! them: the metric reference table of `docs/metrics.md`, the metric names in the dashboard
//! and the alerts, and `kustomize build` of a directory under `deploy/`.
//!
//! Self-contained (no other harness module), so a light test binary can include just this
//! file with `#[path = "common/docs.rs"] mod docs;`.
#![allow(dead_code, clippy::panic)] // Not every test binary uses every helper; test failures panic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The metrics reference.
pub const METRICS_DOC: &str = "docs/metrics.md";
/// Prefix of every catalogsync metric.
pub const METRIC_PREFIX: &str = "catalogsync_";

/// A path in the repository.
pub fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A file of the repository.
///
/// # Panics
/// When it cannot be read.
pub fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative)).unwrap_or_else(|e| panic!("failed to read {relative}: {e}"))
}

/// One row of the reference table of `docs/metrics.md`.
#[derive(Debug)]
pub struct DocRow {
    /// `counter`, `gauge` or `histogram`.
    pub kind: String,
    /// Label names.
    pub labels: BTreeSet<String>,
}

/// The backticked words of a table cell that are followed by a colon: the label names of
/// `` `kind`: `ModuleTemplate`, `ModuleReleaseMeta`<br>`op`: `applied` ``.
pub fn label_names(cell: &str) -> BTreeSet<String> {
    let parts: Vec<&str> = cell.split('`').collect();
    parts
        .iter()
        .enumerate()
        .skip(1)
        .step_by(2)
        .filter(|(i, _)| parts.get(i + 1).is_some_and(|after| after.starts_with(':')))
        .map(|(_, name)| (*name).to_owned())
        .collect()
}

/// The rows of the reference table of `docs/metrics.md` whose first column is a backticked
/// metric name, by name.
///
/// # Panics
/// When the doc cannot be read, documents a metric twice or has no such rows.
pub fn documented_metrics() -> BTreeMap<String, DocRow> {
    let text = read(METRICS_DOC);
    let mut rows = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // A table row is `| name | type | labels | meaning |`: empty text before the first bar.
        let [before, name, kind, labels, ..] = cells[..] else { continue };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else { continue };
        if !before.is_empty() || !name.starts_with(METRIC_PREFIX) {
            continue;
        }
        let row = DocRow { kind: kind.to_owned(), labels: label_names(labels) };
        assert!(rows.insert(name.to_owned(), row).is_none(), "{METRICS_DOC} documents {name} twice");
    }
    assert!(
        !rows.is_empty(),
        "{METRICS_DOC} has no table rows of the form | `{METRIC_PREFIX}...` | type | labels | meaning |"
    );
    rows
}

/// The `catalogsync_…` metric names in `text`, without the `_bucket`, `_sum` and `_count`
/// suffixes of histogram series.
pub fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(METRIC_PREFIX) {
        let tail = &rest[at..];
        let len = tail.find(|c: char| !(c.is_ascii_lowercase() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..len];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        names.insert(base.to_owned());
        rest = &tail[len..];
    }
    names
}

/// The metric families of a Prometheus text exposition (from its `# TYPE` lines), with the
/// label names of their series (`le` and `quantile` left out).
pub fn exposed_metrics(exposition: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                out.entry(name.to_owned()).or_default();
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, _) = line.split_once(' ').unwrap_or((line, ""));
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        let family = if out.contains_key(family) { family } else { name };
        let entry = out.entry(family.to_owned()).or_default();
        for pair in labels.trim_end_matches('}').split(',').filter(|p| !p.is_empty()) {
            if let Some((key, _)) = pair.split_once('=')
                && key != "le"
                && key != "quantile"
            {
                entry.insert(key.to_owned());
            }
        }
    }
    out
}

/// `$KUSTOMIZE build <dir>` (`hack/kustomize.sh` provides it), parsed into objects.
///
/// # Panics
/// When `KUSTOMIZE` is not set, the build fails or renders nothing.
pub fn kustomize_build(dir: &str) -> Vec<Value> {
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
    let yaml = String::from_utf8(out.stdout).expect("kustomize prints UTF-8");
    let docs = serde_saphyr::from_multiple::<Value>(&yaml)
        .unwrap_or_else(|e| panic!("output of kustomize build {dir} does not parse: {e}"));
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    assert!(!docs.is_empty(), "kustomize build {dir} rendered nothing");
    docs
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
/// by source.
pub fn monitoring_metrics() -> Vec<(&'static str, BTreeSet<String>)> {
    let dashboard = read("deploy/monitoring/dashboard.json");
    serde_json::from_str::<Value>(&dashboard).expect("dashboard.json is JSON");
    let rules = the(&kustomize_build("deploy/monitoring"), "PrometheusRule").clone();
    let exprs: Vec<String> = rules["spec"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| r["expr"].as_str().expect("expr").to_owned())
        .collect();
    vec![("dashboard.json", metric_names(&dashboard)), ("PrometheusRule", metric_names(&exprs.join("\n")))]
}
