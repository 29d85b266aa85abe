//! Micro-benchmarks of the catalog path of one SKR: building the snapshot of a realistic catalog,
//! the desired set of one Kyma, its fingerprint, the shared set of a Kyma's profile, and the plan
//! for a warm and a cold SKR.
//!
//! Run with `cargo bench --bench desired_set`. See `docs/performance.md`.

// `criterion_group!` generates an undocumented public function, and bench setup may fail loudly.
#![allow(missing_docs, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use catalogsync::catalog::{
    CatalogKind, DesiredSet, KindMemory, Observed, Plan, ProfileCache, Snapshot, desired_set, plan,
};
use criterion::{Criterion, criterion_group, criterion_main};

use testenv::fixtures::fleet::{SYNC_NAMESPACE, catalog, cold_skr, kyma_labels, restricted_modules, warm_skr};

fn bench_desired_set(c: &mut Criterion) {
    let (mts, mrms) = catalog();
    let restricted = restricted_modules();
    let plain = kyma_labels(false, false);
    let beta_internal = kyma_labels(true, true);
    let snapshot = Snapshot::build(&mts, &mrms, SYNC_NAMESPACE);
    let (plain_set, _) = desired_set(&snapshot, &plain, &restricted);
    let (beta_internal_set, _) = desired_set(&snapshot, &beta_internal, &restricted);

    let descriptor_bytes: usize =
        mts.iter().map(|mt| serde_json::to_vec(&mt.data["spec"]["descriptor"]).map_or(0, |b| b.len())).sum();
    let payload_bytes: usize = snapshot.templates.values().map(|mt| mt.body.bytes().len()).sum();
    eprintln!(
        "catalog: {} MTs (descriptor {} B on average, rendered copy {} B on average), {} MRMs, {} malformed; \
         desired set: plain Kyma {} MTs + {} MRMs, beta+internal Kyma {} MTs + {} MRMs",
        snapshot.templates.len(),
        descriptor_bytes / mts.len().max(1),
        payload_bytes / snapshot.templates.len().max(1),
        snapshot.release_metas.len(),
        snapshot.malformed.len(),
        plain_set.templates.len(),
        plain_set.release_metas.len(),
        beta_internal_set.templates.len(),
        beta_internal_set.release_metas.len(),
    );

    c.bench_function("snapshot_build/75mt_25mrm", |b| {
        b.iter(|| Snapshot::build(black_box(&mts), black_box(&mrms), SYNC_NAMESPACE));
    });

    let mut group = c.benchmark_group("desired_set");
    for (name, labels) in [("plain_kyma", &plain), ("beta_internal_kyma", &beta_internal)] {
        group.bench_function(name, |b| b.iter(|| desired_set(black_box(&snapshot), black_box(labels), &restricted)));
    }
    group.finish();

    c.bench_function("fingerprint/plain_kyma", |b| b.iter(|| black_box(&plain_set).fingerprint()));

    // What a replica does per owned Kyma when the catalog changes (`requeue_affected`).
    c.bench_function("desired_set_and_fingerprint/plain_kyma", |b| {
        b.iter(|| desired_set(black_box(&snapshot), black_box(&plain), &restricted).0.fingerprint());
    });

    // What a replica does per owned Kyma since desired sets are shared per profile: the
    // Kyma's profile and a lookup (the set itself is computed once per profile and snapshot).
    let shared = ProfileCache::default();
    let _ = shared.get(&snapshot, &plain, &restricted);
    c.bench_function("desired_shared/plain_kyma", |b| {
        b.iter(|| shared.get(black_box(&snapshot), black_box(&plain), &restricted).fingerprint);
    });

    let mut group = c.benchmark_group("plan");
    let warm: Vec<_> = CatalogKind::ALL.iter().map(|&k| warm_skr(plain_set.of(k))).collect();
    let cold: Vec<_> = CatalogKind::ALL.iter().map(|&k| cold_skr(plain_set.of(k))).collect();
    for (name, skr) in [("warm_skr", &warm), ("cold_skr", &cold)] {
        let check = plan_skr(&plain_set, skr);
        assert!(check.iter().all(|p| p.is_noop()), "the bench SKR {name} must already hold its desired set");
        group.bench_function(name, |b| b.iter(|| plan_skr(black_box(&plain_set), black_box(skr))));
    }
    group.finish();
}

/// Plans both kinds of one SKR, as a sync does.
fn plan_skr(desired: &DesiredSet, skr: &[(Vec<Observed>, KindMemory)]) -> Vec<Plan> {
    CatalogKind::ALL
        .iter()
        .zip(skr)
        .map(|(&kind, (observed, memory))| plan(desired.of(kind), observed, memory))
        .collect()
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(40).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    targets = bench_desired_set
}
criterion_main!(benches);
