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

/// One label matcher of a series selector: `shard="1"`, `reason=~"Skr.*"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    /// The label name.
    pub label: String,
    /// `=`, `!=`, `=~` or `!~`.
    pub op: String,
    /// The value, unquoted.
    pub value: String,
}

/// Every `catalogsync_…` series selector in a PromQL expression (or a `promtool` input series),
/// as the metric name as written (with any `_bucket`, `_sum` or `_count`) and its matchers.
///
/// # Errors
/// When a selector's braces or quotes do not close or a matcher has no operator.
pub fn selectors(text: &str) -> anyhow::Result<Vec<(String, Vec<Matcher>)>> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(METRIC_PREFIX) {
        let preceded_by_name = rest[..at].chars().next_back().is_some_and(is_name);
        let tail = &rest[at..];
        let len = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        let name = &tail[..len];
        rest = &tail[len..];
        if preceded_by_name {
            continue;
        }
        let mut matchers = Vec::new();
        if let Some(body) = rest.trim_start().strip_prefix('{') {
            let (inside, after) = split_braces(body).ok_or_else(|| anyhow::anyhow!("unclosed {{ after {name}"))?;
            for part in split_outside_quotes(inside, ',').into_iter().map(str::trim).filter(|p| !p.is_empty()) {
                matchers.push(matcher(part).ok_or_else(|| anyhow::anyhow!("{name}: bad matcher {part}"))?);
            }
            rest = after;
        }
        out.push((name.to_owned(), matchers));
    }
    Ok(out)
}

/// The inside of `{...}` (after its `{`) and what follows its `}`, quotes respected.
fn split_braces(body: &str) -> Option<(&str, &str)> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some((&body[..i], &body[i + 1..])),
            _ => {}
        }
    }
    None
}

/// `text` split at each `sep` outside double quotes.
fn split_outside_quotes(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut quoted, mut escaped, mut start) = (false, false, 0);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `label op "value"`.
fn matcher(text: &str) -> Option<Matcher> {
    let at = text.find(['=', '!'])?;
    let label = text[..at].trim();
    let after = &text[at..];
    let op = ["=~", "!~", "!=", "="].into_iter().find(|op| after.starts_with(op))?;
    let value = after[op.len()..].trim();
    let value = value.strip_prefix('"')?.strip_suffix('"')?;
    Some(Matcher { label: label.to_owned(), op: op.to_owned(), value: value.replace("\\\"", "\"") })
}

/// The label names of every `by (...)` and `without (...)` clause in a PromQL expression.
pub fn grouping_labels(promql: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for keyword in ["by", "without"] {
        let mut rest = promql;
        while let Some(at) = rest.find(keyword) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + keyword.len()..].trim_start();
            rest = &rest[at + keyword.len()..];
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let Some(list) = after.strip_prefix('(').and_then(|l| l.split_once(')')).map(|(l, _)| l) else {
                continue;
            };
            out.extend(list.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned));
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_read_with_their_matchers() {
        let promql = r#"sum by (shard) (rate(catalogsync_sync_runs_total{shard=~"$shard", result="error"}[10m]))
            / on() catalogsync_a_count + xcatalogsync_not_a_selector{a="b"} + catalogsync_b{le="+Inf",x!~"a,}b"}"#;
        let found = selectors(promql).expect("parses");
        let m =
            |label: &str, op: &str, value: &str| Matcher { label: label.into(), op: op.into(), value: value.into() };
        assert_eq!(
            found,
            vec![
                ("catalogsync_sync_runs_total".to_owned(), vec![m("shard", "=~", "$shard"), m("result", "=", "error")]),
                ("catalogsync_a_count".to_owned(), vec![]),
                ("catalogsync_b".to_owned(), vec![m("le", "=", "+Inf"), m("x", "!~", "a,}b")]),
            ]
        );
        assert!(selectors("catalogsync_a{b=\"c\"").is_err(), "unclosed brace");
    }

    #[test]
    fn grouping_labels_are_read_from_by_and_without() {
        let promql = "sum by (shard, le) (x) / sum without(pod) (y) + sum(z) by (reason) + standby(q) + bytes";
        assert_eq!(
            grouping_labels(promql),
            ["le", "pod", "reason", "shard"].into_iter().map(str::to_owned).collect::<BTreeSet<_>>()
        );
    }
}
