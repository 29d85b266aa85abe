//! `docs/metrics.md` documents exactly the metrics catalogsync registers, each with its type,
//! label names and label values, and exactly the `ModuleCatalog` condition reasons.
//!
//! The registered metrics come from two places, so that a new metric cannot slip through:
//!
//! - the registry of [`Metrics::new`] with the scrape-time shard gauges, gathered after a
//!   shard was taken and failed once with every counted reason (a labelled metric with no
//!   series yet is not gathered at all);
//! - every string literal in `src/` that is a whole metric name (`"catalogsync_…"`), which
//!   covers a metric this test does not know about yet.
//!
//! Label values come from the label enums: [`Metrics::new`] creates a series for every value
//! of each (its unit tests check that), so the values gathered here are the enums' `ALL`.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use catalogsync::error::ConditionReason;
use catalogsync::label::Label;
use catalogsync::metrics::{HandoverOp, Metrics, RequestResult, SkrVerb, SyncOutcome, SyncResult};
use catalogsync::sharding::ShardView;
use catalogsync::sharding::agent::{ShardRow, ShardState, ShardsDebug};
use catalogsync::sharding::coordinator::CoordinatorView;
use catalogsync::sync::kymas::{KymaRecords, ShadowCounts};
use prometheus::proto::MetricType;

use testenv::docs;

use docs::{
    METRIC_PREFIX as PREFIX, METRICS_DOC as DOC, documented_metrics as documented, label_names, label_values, read,
    repo_path,
};

/// One metric family as registered.
#[derive(Debug)]
struct Registered {
    kind: &'static str,
    labels: BTreeSet<String>,
    /// Every value of each label, over all series.
    values: BTreeMap<String, BTreeSet<String>>,
}

fn type_name(t: MetricType) -> &'static str {
    match t {
        MetricType::COUNTER => "counter",
        MetricType::GAUGE => "gauge",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        MetricType::UNTYPED => "untyped",
    }
}

/// The label whose values are a range, not a list.
const SHARD: &str = "shard";

/// A fresh replica's metrics with every labelled metric given its series: shard 0 taken and
/// held, one failure of every reason counted in `catalogsync_sync_errors_total`.
fn populated() -> Metrics {
    let metrics = Metrics::new().expect("metrics register");
    metrics.shard_handover(0, HandoverOp::Claimed);
    for &reason in ConditionReason::ALL.iter().filter(|r| r.counts_as_sync_error()) {
        match reason {
            ConditionReason::ConditionWriteFailed => metrics.sync.condition_write_failed(0),
            reason => metrics.sync.finished(0, SyncOutcome::Failed(reason)),
        }
    }
    metrics.sync.queue_depth(0, 0);
    let held = ShardRow {
        shard: 0,
        holder: "me".to_owned(),
        desired: "me".to_owned(),
        state: ShardState::Active,
        draining_since: None,
        in_flight: 0,
        clusters: 1,
    };
    let (_, view) = tokio::sync::watch::channel(ShardsDebug { rows: vec![held], ..ShardsDebug::default() });
    catalogsync::sharding::shard_gauges::register(metrics.registry(), view).expect("shard gauges register");
    let (_, coordinator) = tokio::sync::watch::channel(CoordinatorView::default());
    let (kymas, _) = kube::runtime::reflector::store();
    let view = ShardView::single_replica();
    catalogsync::sharding::coordinator_gauges::register(metrics.registry(), coordinator, kymas, view)
        .expect("coordinator gauges register");
    let records = std::sync::Arc::new(KymaRecords::new(metrics.sync.clone(), metrics.skr.clone()));
    records.set_contested("k", 0, true);
    records.set_shadow("k", 0, ShadowCounts::default());
    catalogsync::sync::kyma_gauges::register(metrics.registry(), records).expect("Kyma gauges register");
    metrics
}

/// Every family of [`populated`]'s registry.
fn registered() -> BTreeMap<String, Registered> {
    populated()
        .registry()
        .gather()
        .iter()
        .map(|family| {
            let mut values: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for metric in family.get_metric() {
                for label in metric.get_label() {
                    values.entry(label.name().to_owned()).or_default().insert(label.value().to_owned());
                }
            }
            let labels = values.keys().cloned().collect();
            (family.name().to_owned(), Registered { kind: type_name(family.get_field_type()), labels, values })
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("failed to read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every string literal in `src/` that is a whole metric name, with the file it is in.
fn names_in_source() -> BTreeMap<String, PathBuf> {
    let mut files = Vec::new();
    rust_files(&repo_path("src"), &mut files);
    let mut names = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("failed to read {}: {e}", file.display()));
        for (at, _) in text.match_indices(&format!("\"{PREFIX}")) {
            let rest = &text[at + 1..];
            let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
            if let Some(end) = end.filter(|&end| rest[end..].starts_with('"')) {
                let relative = file.strip_prefix(testenv::repo_root()).unwrap_or(&file).to_path_buf();
                names.entry(rest[..end].to_owned()).or_insert(relative);
            }
        }
    }
    names
}

#[test]
fn every_registered_metric_is_documented_and_nothing_else() {
    let doc = documented();
    let registry = registered();
    let source = names_in_source();
    let mut problems = Vec::new();

    for name in registry.keys() {
        if !doc.contains_key(name) {
            problems.push(format!("{name} is registered but not documented in {DOC}"));
        }
    }
    for (name, file) in &source {
        if !doc.contains_key(name) && !registry.contains_key(name) {
            problems.push(format!("{name} (in {}) is not documented in {DOC}", file.display()));
        }
        if !registry.contains_key(name) {
            problems.push(format!(
                "{name} (in {}) is not in the registry of Metrics::new() as gathered by this test: if it is a new \
                 labelled metric, touch it in `registered()`; if it is registered elsewhere, extend this test",
                file.display()
            ));
        }
    }
    for name in doc.keys() {
        if !registry.contains_key(name) && !source.contains_key(name) {
            problems.push(format!("{name} is documented in {DOC} but not registered"));
        }
    }
    for (name, have) in &registry {
        let Some(row) = doc.get(name) else { continue };
        if row.kind != have.kind {
            problems.push(format!("{name} is a {} but {DOC} says {}", have.kind, row.kind));
        }
        if row.labels != have.labels {
            problems.push(format!("{name} has labels {:?} but {DOC} lists {:?}", have.labels, row.labels));
        }
        for (label, values) in have.values.iter().filter(|(label, _)| *label != SHARD) {
            let listed = row.values.get(label).cloned().unwrap_or_default();
            if &listed != values {
                problems.push(format!("{name} has {label} values {values:?} but {DOC} lists {listed:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "docs/metrics.md and the code disagree:\n  {}", problems.join("\n  "));
}

/// The rows of the condition reason table of `docs/metrics.md`: reason, status, whether an
/// Event is published.
fn documented_reasons() -> Vec<(String, String, bool)> {
    read(DOC)
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let [before, reason, status, event, ..] = cells[..] else { return None };
            let reason = reason.strip_prefix('`')?.strip_suffix('`')?;
            let status_column = status == "True" || status == "False";
            (before.is_empty() && status_column).then(|| (reason.to_owned(), status.to_owned(), event == "event"))
        })
        .collect()
}

#[test]
fn the_condition_reasons_are_documented_with_status_and_event() {
    let want: Vec<(String, String, bool)> = ConditionReason::ALL
        .iter()
        .filter(|r| r.reaches_condition())
        .map(|&r| {
            let status = if r == ConditionReason::CatalogSynced { "True" } else { "False" };
            (r.as_str().to_owned(), status.to_owned(), r.needs_human())
        })
        .collect();
    assert_eq!(documented_reasons(), want, "the reason table of {DOC} and ConditionReason disagree");
    // The two that never reach a condition are named in the text below the table.
    let text = read(DOC);
    for reason in ConditionReason::ALL.iter().filter(|r| !r.reaches_condition()) {
        assert!(text.contains(&format!("`{reason}`")), "{DOC} does not explain {reason}");
    }
}

/// The texts of the values of `L` that `keep` keeps.
fn texts<L: Label>(keep: impl Fn(L) -> bool) -> BTreeSet<String> {
    L::ALL.iter().copied().filter(|l| keep(*l)).map(|l| l.as_str().to_owned()).collect()
}

#[test]
fn every_label_enum_value_is_a_series() {
    // End to end, for a few: every value of the enum is scraped, and nothing else.
    let registry = registered();
    let values = |name: &str, label: &str| registry[name].values[label].clone();
    assert_eq!(values("catalogsync_shard_handovers_total", "op"), texts::<HandoverOp>(|_| true));
    assert_eq!(values("catalogsync_sync_runs_total", "result"), texts::<SyncResult>(|_| true));
    assert_eq!(values("catalogsync_skr_requests_total", "verb"), texts::<SkrVerb>(|_| true));
    assert_eq!(values("catalogsync_skr_requests_total", "result"), texts::<RequestResult>(|_| true));
    assert_eq!(
        values("catalogsync_sync_errors_total", "reason"),
        texts::<ConditionReason>(ConditionReason::counts_as_sync_error)
    );
}

#[test]
fn label_names_are_read_from_the_labels_column() {
    assert_eq!(
        label_names("`kind`: `ModuleTemplate`, `ModuleReleaseMeta`<br>`op`: `applied`, `pruned`"),
        BTreeSet::from(["kind".to_owned(), "op".to_owned()])
    );
    assert!(label_names("none").is_empty());
    let values = label_values("`kind`: `ModuleTemplate`, `ModuleReleaseMeta`<br>`op`: `applied`, `pruned`");
    assert_eq!(values["op"], BTreeSet::from(["applied".to_owned(), "pruned".to_owned()]));
    assert_eq!(values.len(), 2);
}
