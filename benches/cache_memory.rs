//! What a replica keeps per Kyma of the fleet and per SKR it holds, measured: the resident
//! bytes (`VmRSS`) each structure adds when it is filled, allocator overhead included, divided
//! by the number of entries. Nothing is freed between two measurements, so freed memory is not
//! counted twice.
//!
//! - Per Kyma in the fleet, held or not: its trimmed copy in the Kyma cache (the reflector
//!   store, as the Kyma watch fills it; of the fleet's ten labels, the one the restricted
//!   module's `kymaSelector` reads is kept), the entry the watch's predicate filter keeps for it
//!   (modelled on kube-runtime's cache: name, namespace, uid, hash, last seen), and its access
//!   Secret in `AccessSecrets`.
//! - Per SKR held: the memory of its copies (`KindMemory`, one per kind).
//!
//! Run with `cargo bench --bench cache_memory`. See `docs/performance.md` ("Where the time and
//! the memory go").

#![allow(missing_docs, clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};

use catalogsync::api::{KYMA_NAME_LABEL, Kyma, KymaStatus};
use catalogsync::catalog::KindMemory;
use catalogsync::skr::AccessSecrets;
use catalogsync::sync::label_keys::KymaLabelKeys;
use catalogsync::sync::reconciler::{trigger_hash, trim};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ObjectMeta, PartialObjectMeta};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use testenv::fixtures::fleet::kyma_labels;

/// The resident set of this process in bytes (`VmRSS`), as the kernel counts it.
fn resident() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

const KYMAS: usize = 20_000;
const NAMESPACE: &str = "kcp-system";

/// The resident bytes `build` adds and keeps, divided by `per`.
fn counted<T>(per: usize, build: impl FnOnce() -> T) -> (T, usize) {
    let before = resident();
    let kept = build();
    let after = resident();
    (kept, after.saturating_sub(before) / per)
}

fn kyma_name(i: usize) -> String {
    format!("{:08x}-4e5f-4a6b-8c7d-{i:012x}", i * 2_654_435_761 % 0xffff_ffff)
}

/// Kyma number `i` as the KCP holds it: the fleet's labels, identity, and the `ModuleCatalog`
/// condition, trimmed as the Kyma watch trims it to `label_keys`.
fn kyma(i: usize, label_keys: &BTreeSet<String>) -> Kyma {
    let mut kyma = Kyma::new(&kyma_name(i), Default::default());
    kyma.metadata.namespace = Some(NAMESPACE.into());
    kyma.metadata.labels = Some(kyma_labels(i % 10 == 3, i % 20 == 7));
    kyma.metadata.uid = Some(format!("0b7e2c1a-5d1c-4b8e-9f3a-{i:012x}"));
    kyma.metadata.resource_version = Some((48_213_377 + i).to_string());
    kyma.metadata.generation = Some(1);
    let condition = Condition {
        type_: "ModuleCatalog".into(),
        status: "True".into(),
        reason: "Synced".into(),
        message: "The module catalog is in sync: 82 ModuleTemplates, 10 ModuleReleaseMetas".into(),
        observed_generation: Some(1),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    };
    kyma.status = Some(KymaStatus { conditions: Some(vec![condition]), ..KymaStatus::default() });
    trim(&mut kyma, label_keys);
    kyma
}

fn secret(i: usize) -> PartialObjectMeta<Secret> {
    let kyma = kyma_name(i);
    PartialObjectMeta {
        types: None,
        metadata: ObjectMeta {
            name: Some(kyma.clone()),
            namespace: Some(NAMESPACE.into()),
            labels: Some([(KYMA_NAME_LABEL.to_owned(), kyma)].into()),
            uid: Some(format!("5a1d2e3f-6b7c-4d8e-9f0a-{i:012x}")),
            resource_version: Some((58_213_377 + i).to_string()),
            ..ObjectMeta::default()
        },
        _phantom: std::marker::PhantomData,
    }
}

type PredicateKey = (String, Option<String>, Option<String>);

fn main() {
    // What the fleet's catalog wants kept: the flags and its restricted module's selector key.
    let label_keys = KymaLabelKeys::new();
    label_keys.want(["kyma-project.io/global-account-id"]);
    let label_keys = label_keys.wanted().expect("wanted");
    let kymas: Vec<Kyma> = (0..KYMAS).map(|i| kyma(i, &label_keys)).collect();
    let secrets: Vec<PartialObjectMeta<Secret>> = (0..KYMAS).map(secret).collect();

    let ((_store, _writer), store_bytes) = counted(KYMAS, || {
        let (store, mut writer) = reflector::store::<Kyma>();
        writer.apply_watcher_event(&Event::Init);
        for kyma in &kymas {
            writer.apply_watcher_event(&Event::InitApply(kyma.clone()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(store.state().len(), KYMAS);
        (store, writer)
    });
    let (_predicates, predicate_bytes) = counted(KYMAS, || {
        let now = std::time::Instant::now();
        kymas
            .iter()
            .map(|k| {
                let m = &k.metadata;
                let key: PredicateKey = (m.name.clone().unwrap_or_default(), m.namespace.clone(), m.uid.clone());
                (key, (trigger_hash(k).unwrap_or_default(), now))
            })
            .collect::<HashMap<_, _>>()
    });
    let (_access, secret_bytes) = counted(KYMAS, || {
        let access = AccessSecrets::new(NAMESPACE);
        access.apply(&Event::Init);
        for secret in &secrets {
            access.apply(&Event::InitApply(secret.clone()));
        }
        access.apply(&Event::InitDone);
        assert!(access.find(&kyma_name(7), NAMESPACE).is_ok());
        access
    });
    const SKRS: usize = 5_000;
    let (_memories, memory_bytes) = counted(SKRS, || {
        (0..SKRS)
            .map(|s| {
                let kind = |copies: usize, prefix: &str| {
                    let mut memory = KindMemory::new();
                    for i in 0..copies {
                        memory.remember(&format!("{prefix}-{i}-1.{s}.0"), &(48_213_377 + i).to_string(), i as u64);
                    }
                    memory.shrink();
                    memory
                };
                [kind(82, "module"), kind(10, "module")]
            })
            .collect::<Vec<_>>()
    });

    println!("per Kyma in the fleet (held or not), {KYMAS} Kymas, resident bytes:");
    println!("  Kyma cache (trimmed Kyma, store entry)   {store_bytes:>6}");
    println!("  predicate filter entry                   {predicate_bytes:>6}");
    println!("  access Secret (AccessSecrets)            {secret_bytes:>6}");
    println!("  total                                    {:>6}", store_bytes + predicate_bytes + secret_bytes);
    println!("per SKR held ({SKRS} SKRs), resident bytes:");
    println!("  memory of 82 + 10 copies (KindMemory)    {memory_bytes:>6}");
}
