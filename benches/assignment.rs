//! Micro-benchmarks of shard placement: `ring::assign` of S = 64 shards to n = 3, 5, 10 members
//! (from scratch, after one member joined, and the steady re-evaluation with unchanged members),
//! `ring::shard_of` for 10,000 Kymas, and both together.
//!
//! Run with `cargo bench --bench assignment`. See `docs/performance.md`.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use catalogsync::sharding::ring::{assign, shard_of};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use testenv::fixtures::runtime_id;

/// The default `--shards`.
const SHARDS: u32 = 64;
/// Kymas mapped to shards.
const KYMAS: usize = 10_000;
/// Namespace of the Kymas in the KCP.
const KCP_NAMESPACE: &str = "kcp-system";
/// Replica counts.
const MEMBERS: [usize; 3] = [3, 5, 10];

/// Member identities as a Deployment names its pods, for example `catalogsync-5d8f7c9b6-x4k2p`.
fn members(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let h = xxhash_rust::xxh3::xxh3_64(format!("member-{i}").as_bytes());
            format!("catalogsync-5d8f7c9b6-{:05x}", h & 0xf_ffff)
        })
        .collect()
}

/// The shard of every Kyma.
fn map_kymas(names: &[String]) -> Vec<u32> {
    names.iter().map(|name| shard_of(KCP_NAMESPACE, name, SHARDS)).collect()
}

fn bench_assign(c: &mut Criterion) {
    let none = BTreeMap::new();
    let mut group = c.benchmark_group("assign_s64");
    for n in MEMBERS {
        let live = members(n);
        // Before the join: the same members but the last, balanced.
        let before_join = assign(SHARDS, &live[..n - 1], &none);
        let steady = assign(SHARDS, &live, &none);
        group.bench_with_input(BenchmarkId::new("scratch", n), &live, |b, live| {
            b.iter(|| assign(SHARDS, black_box(live), black_box(&none)));
        });
        group.bench_with_input(BenchmarkId::new("join", n), &live, |b, live| {
            b.iter(|| assign(SHARDS, black_box(live), black_box(&before_join)));
        });
        group.bench_with_input(BenchmarkId::new("steady", n), &live, |b, live| {
            b.iter(|| assign(SHARDS, black_box(live), black_box(&steady)));
        });
    }
    group.finish();
}

fn bench_kymas(c: &mut Criterion) {
    let names: Vec<String> = (0..KYMAS as u64).map(runtime_id).collect();
    let none = BTreeMap::new();
    c.bench_function("shard_of/10000_kymas", |b| b.iter(|| map_kymas(black_box(&names))));

    // The whole assignment computation for 10,000 Kymas: map every Kyma to its shard, and
    // assign the shards to the members (from scratch, the costliest case).
    let mut group = c.benchmark_group("kymas_10000_total");
    for n in MEMBERS {
        let live = members(n);
        group.bench_with_input(BenchmarkId::new("scratch", n), &live, |b, live| {
            b.iter(|| {
                let shards = map_kymas(black_box(&names));
                let assignment = assign(SHARDS, black_box(live), &none);
                (shards, assignment)
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(40).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench_assign, bench_kymas
}
criterion_main!(benches);
