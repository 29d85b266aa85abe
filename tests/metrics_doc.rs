//! `docs/metrics.md` documents exactly the metrics catalogsync registers, each with its type
//! and label names.
//!
//! The registered metrics come from two places, so that a new metric cannot slip through:
//!
//! - the registry of [`Metrics::new`], gathered after every labelled metric was given one
//!   label combination (a labelled metric with no combination yet is not gathered at all);
//! - every string literal in `src/` that is a whole metric name (`"catalogsync_…"`), which
//!   covers a metric this test does not know about yet.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use catalogsync::metrics::Metrics;
use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::proto::MetricType;

use testenv::docs;

use docs::{METRIC_PREFIX as PREFIX, METRICS_DOC as DOC, documented_metrics as documented, label_names, repo_path};

/// One metric family as registered.
#[derive(Debug)]
struct Registered {
    kind: &'static str,
    labels: BTreeSet<String>,
}

/// Gives a labelled metric one label combination, so that the registry gathers it.
fn touch<T: MetricVecBuilder>(vec: &MetricVec<T>) {
    let labels = vec.desc().first().map_or(0, |d| d.variable_labels.len());
    vec.with_label_values(&vec!["placeholder"; labels]);
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

/// Every family of [`Metrics::new`]'s registry, with each labelled metric touched first.
fn registered() -> BTreeMap<String, Registered> {
    let metrics = Metrics::new().expect("metrics register");
    let Metrics { sync, skr, catalog, shard, .. } = &metrics;
    touch(&sync.runs);
    touch(&sync.errors);
    touch(&sync.duration);
    touch(&sync.queue_depth);
    touch(&sync.objects);
    touch(&sync.condition_writes);
    touch(&sync.skipped);
    touch(&skr.requests);
    touch(&skr.evictions);
    touch(&catalog.objects);
    touch(&catalog.malformed);
    touch(&catalog.skipped_release_metas);
    touch(&shard.owned_clusters);
    touch(&shard.handovers);
    touch(&shard.renewals);
    metrics
        .registry()
        .gather()
        .iter()
        .map(|family| {
            let labels = family
                .get_metric()
                .first()
                .map(|m| m.get_label().iter().map(|l| l.name().to_owned()).collect())
                .unwrap_or_default();
            (family.name().to_owned(), Registered { kind: type_name(family.get_field_type()), labels })
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
    }
    assert!(problems.is_empty(), "docs/metrics.md and the code disagree:\n  {}", problems.join("\n  "));
}

#[test]
fn label_names_are_read_from_the_labels_column() {
    assert_eq!(
        label_names("`kind`: `ModuleTemplate`, `ModuleReleaseMeta`<br>`op`: `applied`, `pruned`"),
        BTreeSet::from(["kind".to_owned(), "op".to_owned()])
    );
    assert!(label_names("none").is_empty());
}
