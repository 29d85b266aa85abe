//! What the repository's docs say, parsed for the tests that hold the code to them: the
//! metric reference table of `docs/metrics.md`, metric names in any text, the metric families
//! of a `/metrics` scrape. (The manifests are in [`super::kustomize`].)

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// The metrics reference.
pub const METRICS_DOC: &str = "docs/metrics.md";
/// Prefix of every catalogsync metric.
pub const METRIC_PREFIX: &str = "catalogsync_";

/// A path in the repository.
pub fn repo_path(relative: &str) -> PathBuf {
    super::repo_root().join(relative)
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
    /// The values listed for each label (`shard`'s range as written: `0`, `--shards`).
    pub values: BTreeMap<String, BTreeSet<String>>,
    /// Served by `--mode shadow` replicas only (its meaning starts with "`--mode shadow`
    /// only").
    pub shadow_only: bool,
}

/// The values listed for each label of a table cell:
/// `` `kind`: `ModuleTemplate`, `ModuleReleaseMeta`<br>`op`: `applied` `` gives `kind` →
/// {`ModuleTemplate`, `ModuleReleaseMeta`} and `op` → {`applied`}.
pub fn label_values(cell: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for part in cell.split("<br>") {
        let words: Vec<&str> = part.split('`').skip(1).step_by(2).collect();
        if let [name, values @ ..] = &words[..]
            && part.split('`').nth(2).is_some_and(|after| after.starts_with(':'))
        {
            out.insert((*name).to_owned(), values.iter().map(|v| (*v).to_owned()).collect());
        }
    }
    out
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
        let [before, name, kind, labels, meaning, ..] = cells[..] else { continue };
        let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else { continue };
        if !before.is_empty() || !name.starts_with(METRIC_PREFIX) {
            continue;
        }
        let row = DocRow {
            kind: kind.to_owned(),
            labels: label_names(labels),
            values: label_values(labels),
            shadow_only: meaning.starts_with("`--mode shadow` only"),
        };
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
