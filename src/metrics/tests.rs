use std::collections::{BTreeMap, BTreeSet};

use prometheus::proto::MetricFamily;

use super::*;

/// The families of a gather, by name.
fn families(metrics: &Metrics) -> BTreeMap<String, MetricFamily> {
    metrics.registry().gather().into_iter().map(|f| (f.name().to_owned(), f)).collect()
}

/// The label combinations of one family, each as `name=value` pairs.
fn series(metrics: &Metrics, name: &str) -> BTreeSet<Vec<String>> {
    let families = families(metrics);
    let Some(family) = families.get(name) else { return BTreeSet::new() };
    family
        .get_metric()
        .iter()
        .map(|m| m.get_label().iter().map(|l| format!("{}={}", l.name(), l.value())).collect())
        .collect()
}

/// Every combination of the values of `A` (label `a`) and `B` (label `b`), label names
/// sorted as the registry sorts them.
fn pairs<A: Label, B: Label>(a: &str, b: &str) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for x in A::ALL {
        for y in B::ALL {
            let mut labels = vec![format!("{a}={}", x.as_str()), format!("{b}={}", y.as_str())];
            labels.sort();
            out.insert(labels);
        }
    }
    out
}

fn singles<A: Label>(a: &str) -> BTreeSet<Vec<String>> {
    A::ALL.iter().map(|x| vec![format!("{a}={}", x.as_str())]).collect()
}

#[test]
fn every_value_of_every_label_enum_is_scraped_from_the_start() {
    let m = Metrics::new().expect("metrics register");
    let expected = [
        ("catalogsync_sync_objects_total", pairs::<CatalogKind, ObjectOp>("kind", "op")),
        ("catalogsync_kyma_condition_writes_total", singles::<ConditionStatus>("status")),
        ("catalogsync_kymas_skipped_total", singles::<SkipReason>("reason")),
        ("catalogsync_skr_requests_total", pairs::<SkrVerb, RequestResult>("verb", "result")),
        ("catalogsync_skr_client_evictions_total", singles::<EvictionReason>("reason")),
        ("catalogsync_catalog_objects", singles::<CatalogKind>("kind")),
        ("catalogsync_catalog_malformed_objects", singles::<CatalogKind>("kind")),
        ("catalogsync_catalog_skipped_release_metas", singles::<WarningReason>("reason")),
        ("catalogsync_catalog_reachable_objects", pairs::<CatalogKind, ReachableState>("kind", "state")),
        ("catalogsync_shard_handovers_total", singles::<HandoverOp>("op")),
        ("catalogsync_member_renewals_total", singles::<RenewalResult>("result")),
    ];
    for (name, want) in expected {
        assert_eq!(series(&m, name), want, "{name}");
    }
}

#[test]
fn a_shard_taken_has_its_series_and_a_shard_that_left_has_none() {
    let m = Metrics::new().expect("metrics register");
    let per_shard = [
        "catalogsync_sync_runs_total",
        "catalogsync_sync_errors_total",
        "catalogsync_sync_duration_seconds",
        "catalogsync_queue_depth",
    ];
    let of_shard = |shard: &str| {
        per_shard
            .iter()
            .flat_map(|name| series(&m, name).into_iter().map(move |labels| (*name, labels)))
            .filter(|(_, labels)| labels.contains(&format!("shard={shard}")))
            .count()
    };

    m.shard_handover(3, HandoverOp::Claimed);
    m.shard_handover(5, HandoverOp::Resumed);
    let runs: BTreeSet<Vec<String>> = ["3", "5"]
        .iter()
        .flat_map(|s| SyncResult::ALL.iter().map(move |r| vec![format!("result={r}"), format!("shard={s}")]))
        .collect();
    assert_eq!(series(&m, "catalogsync_sync_runs_total"), runs, "every result of a taken shard at zero");
    // A sync of each: timed, failed with a reason, and one requeued Kyma pending.
    for shard in [3, 5] {
        drop(m.sync.measure(shard));
        m.sync.finished(shard, SyncOutcome::Failed(ConditionReason::SkrUnreachable));
        m.sync.condition_write_failed(shard);
        m.sync.queue_depth(shard, 1);
    }
    // runs × 2, errors × 2, duration, queue depth.
    assert_eq!(of_shard("3"), 6);

    m.shard_handover(3, HandoverOp::Drained);
    assert_eq!(of_shard("3"), 6, "a draining shard is still held");
    m.shard_handover(3, HandoverOp::Released);
    assert_eq!(of_shard("3"), 0, "every series of a released shard is gone");
    assert_eq!(of_shard("5"), 6, "the other shard keeps its series");
    m.shard_handover(5, HandoverOp::Dropped);
    assert_eq!(of_shard("5"), 0);
    for name in per_shard {
        assert!(series(&m, name).is_empty(), "{name} still has series");
    }
    // Counted all the same.
    let handovers = families(&m)["catalogsync_shard_handovers_total"].clone();
    let total: f64 = handovers.get_metric().iter().map(|s| s.get_counter().get_value()).sum();
    assert_eq!(total, 5.0);
}
