//! Plans (docs/catalog-rules.md section 3: apply what is missing or differs, prune only
//! managed orphans, write nothing that is already there), plus the snapshot and render
//! behaviour plans rely on.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::api::{LAST_APPLIED_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_VALUE};
use crate::catalog::render::render_copy;
use crate::catalog::snapshot::Malformed;
use crate::catalog::{CatalogKind, content_hash};
use crate::fixtures::{
    MrmBuilder, MtBuilder, SYNC_NAMESPACE, klm_data, klm_descriptor, klm_module_template, raw_object, snapshot,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The desired ModuleTemplate for `<module>-<version>`, as the desired set would hold it.
fn desired_mt(module: &str, version: &str) -> DesiredObject {
    let snap = snapshot(&[MtBuilder::new(module, version).build()], &[]);
    let view = snap.templates.values().next().expect("one template");
    DesiredObject {
        name: view.name.clone(),
        digest: Arc::clone(&view.digest),
        body: view.body.clone(),
        hash: view.hash,
    }
}

fn desired_of<'a>(objects: impl IntoIterator<Item = &'a DesiredObject>) -> BTreeMap<String, DesiredObject> {
    objects.into_iter().map(|o| (o.name.clone(), o.clone())).collect()
}

/// What a full (cold) list returns for a copy of `want`: the body plus what the SKR's
/// apiserver adds.
fn listed_copy(want: &DesiredObject, rv: &str, managed: bool) -> Observed {
    listed_copy_edited(want, rv, managed, |_| {})
}

/// [`listed_copy`] of a copy that `edit` changed in the SKR.
fn listed_copy_edited(want: &DesiredObject, rv: &str, managed: bool, edit: impl FnOnce(&mut Value)) -> Observed {
    let mut content = want.body.value().expect("the body is JSON");
    content["metadata"]["resourceVersion"] = json!(rv);
    content["metadata"]["uid"] = json!(uid_of(&want.name));
    content["metadata"]["generation"] = json!(1);
    content["metadata"]["creationTimestamp"] = json!("2025-06-03T10:00:00Z");
    if managed {
        content["metadata"]["managedFields"] = json!([{"manager": "catalog-sync", "operation": "Apply"}]);
    }
    edit(&mut content);
    Observed {
        name: want.name.clone(),
        uid: uid_of(&want.name),
        resource_version: rv.to_owned(),
        managed,
        content: Some(CopyDigest::of(&content)),
    }
}

/// The UID the SKR gave `name` in these tests.
fn uid_of(name: &str) -> String {
    format!("uid-of-{name}")
}

/// What a metadata-only (warm) list returns.
fn listed_meta(name: &str, rv: &str, managed: bool) -> Observed {
    Observed { name: name.to_owned(), uid: uid_of(name), resource_version: rv.to_owned(), managed, content: None }
}

fn remember(entries: &[(&str, &str, u64)]) -> KindMemory {
    let mut memory = KindMemory::new();
    for (name, rv, hash) in entries {
        memory.remember(name, rv, *hash);
    }
    memory
}

fn applied(plan: &Plan) -> Vec<&str> {
    plan.apply.iter().map(|o| o.name.as_str()).collect()
}

fn unchanged(plan: &Plan) -> Vec<&str> {
    plan.unchanged.iter().map(|(name, _, _)| name.as_str()).collect()
}

fn pruned(plan: &Plan) -> Vec<&str> {
    plan.prune.iter().map(|o| o.name.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// Apply
// ---------------------------------------------------------------------------------------------

#[test]
fn plan_applies_missing_objects() {
    let keda = desired_mt("keda", "1.0.0");
    let serverless = desired_mt("serverless", "1.1.0");
    let plan = plan(&desired_of([&keda, &serverless]), &[], &KindMemory::new());
    assert_eq!(plan.apply, vec![keda, serverless]);
    assert_eq!(plan.prune, Vec::<Orphan>::new());
    assert_eq!(plan.unchanged, vec![]);
    assert!(!plan.is_noop());
}

#[test]
fn plan_of_nothing_against_nothing_is_a_noop() {
    let plan = plan(&BTreeMap::new(), &[], &KindMemory::new());
    assert_eq!(plan, Plan::default());
    assert!(plan.is_noop());
}

#[test]
fn cold_copy_that_matches_is_unchanged() {
    let keda = desired_mt("keda", "1.0.0");
    // Labels or annotations others add are not drift.
    let observed = listed_copy_edited(&keda, "17", true, |c| c["metadata"]["labels"]["team"] = json!("x"));
    let plan = plan(&desired_of([&keda]), &[observed], &KindMemory::new());
    assert_eq!(plan.apply, vec![]);
    assert_eq!(plan.prune, Vec::<Orphan>::new());
    assert_eq!(plan.unchanged, vec![("keda-1.0.0".to_owned(), "17".to_owned(), keda.hash)]);
    assert!(plan.is_noop());
}

#[test]
fn cold_copy_that_matches_is_unchanged_even_if_memory_is_stale() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "3", keda.hash ^ 1)]);
    let plan = plan(&desired_of([&keda]), &[listed_copy(&keda, "17", true)], &memory);
    assert_eq!(plan.unchanged, vec![("keda-1.0.0".to_owned(), "17".to_owned(), keda.hash)]);
    assert!(plan.is_noop());
}

#[test]
fn cold_copy_whose_spec_differs_is_applied() {
    let keda = desired_mt("keda", "1.0.0");
    let observed = listed_copy_edited(&keda, "17", true, |c| c["spec"]["descriptor"]["edited"] = json!(true));
    let plan = plan(&desired_of([&keda]), &[observed], &KindMemory::new());
    assert_eq!(plan.apply, vec![keda]);
    assert_eq!(plan.prune, Vec::<Orphan>::new());
    assert_eq!(plan.unchanged, vec![]);
}

/// Memory that names a copy's resourceVersion (a shard record, which may be forged or
/// describe content this replica never read) does not outweigh what a full list read.
#[test]
fn a_full_list_decides_even_where_memory_names_the_listed_resource_version() {
    let keda = desired_mt("keda", "1.0.0");
    let observed = listed_copy_edited(&keda, "17", true, |c| c["spec"]["descriptor"]["edited"] = json!(true));
    let memory = remember(&[("keda-1.0.0", "17", keda.hash)]);
    let plan = plan(&desired_of([&keda]), &[observed], &memory);
    assert_eq!(plan.apply, vec![keda], "the drifted copy is applied");
}

#[test]
fn cold_copy_missing_a_desired_label_is_applied() {
    let keda = desired_mt("keda", "1.0.0");
    let observed = listed_copy_edited(&keda, "17", true, |c| {
        c["metadata"]["labels"].as_object_mut().expect("labels").remove(MANAGED_BY_LABEL);
    });
    let plan = plan(&desired_of([&keda]), &[observed], &KindMemory::new());
    assert_eq!(applied(&plan), ["keda-1.0.0"]);
    assert_eq!(plan.unchanged, vec![]);
}

// ---------------------------------------------------------------------------------------------
// Warm: remembered resourceVersion and hash
// ---------------------------------------------------------------------------------------------

#[test]
fn warm_copy_with_remembered_rv_and_hash_is_unchanged() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "17", keda.hash)]);
    let plan = plan(&desired_of([&keda]), &[listed_meta("keda-1.0.0", "17", true)], &memory);
    assert_eq!(plan.apply, vec![]);
    assert_eq!(plan.prune, Vec::<Orphan>::new());
    assert_eq!(plan.unchanged, vec![("keda-1.0.0".to_owned(), "17".to_owned(), keda.hash)]);
}

#[test]
fn warm_copy_whose_rv_changed_is_applied() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "17", keda.hash)]);
    let listed = [listed_meta("keda-1.0.0", "18", true)];
    let plan = plan(&desired_of([&keda]), &listed, &memory);
    assert_eq!(plan.apply, vec![keda]);
    assert_eq!(plan.unchanged, vec![]);
    assert_eq!(plan.prune, Vec::<Orphan>::new());
    assert!(needs_content(&plan, &listed, &memory), "written in the SKR since: read it before rewriting it");
}

#[test]
fn warm_copy_rewritten_in_the_skr_but_still_holding_the_copy_is_left_alone() {
    // lifecycle-manager, running beside catalogsync, applied its body with an owner reference
    // catalogsync does not send: the resourceVersion moved, the copy still holds.
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "17", keda.hash)]);
    let full = [listed_copy_edited(&keda, "18", true, |o| {
        o["metadata"]["ownerReferences"] = json!([{"uid": "kcp-uid"}]);
    })];
    let plan = plan(&desired_of([&keda]), &full, &memory);
    assert_eq!(unchanged(&plan), ["keda-1.0.0"]);
    assert!(!needs_content(&plan, &full, &memory), "a full list was read");
}

#[test]
fn a_catalog_change_needs_no_full_list() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "17", keda.hash.wrapping_add(1))]);
    let listed = [listed_meta("keda-1.0.0", "17", true)];
    let plan = plan(&desired_of([&keda]), &listed, &memory);
    assert_eq!(applied(&plan), ["keda-1.0.0"]);
    assert!(!needs_content(&plan, &listed, &memory), "the SKR copy is the one last seen: apply it");
}

#[test]
fn warm_copy_whose_desired_hash_changed_is_applied() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "17", keda.hash.wrapping_add(1))]);
    let plan = plan(&desired_of([&keda]), &[listed_meta("keda-1.0.0", "17", true)], &memory);
    assert_eq!(plan.apply, vec![keda]);
    assert_eq!(plan.unchanged, vec![]);
}

#[test]
fn warm_copy_without_memory_is_applied() {
    let keda = desired_mt("keda", "1.0.0");
    let plan = plan(&desired_of([&keda]), &[listed_meta("keda-1.0.0", "17", true)], &KindMemory::new());
    assert_eq!(plan.apply, vec![keda]);
    assert_eq!(plan.unchanged, vec![]);
}

#[test]
fn memory_of_another_object_does_not_vouch_for_this_one() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("serverless-1.0.0", "17", keda.hash)]);
    let plan = plan(&desired_of([&keda]), &[listed_meta("keda-1.0.0", "17", true)], &memory);
    assert_eq!(applied(&plan), ["keda-1.0.0"]);
}

#[test]
fn steady_state_makes_no_write() {
    let objects = [desired_mt("keda", "1.0.0"), desired_mt("keda", "1.1.0"), desired_mt("serverless", "2.0.0")];
    let memory = remember(&[
        ("keda-1.0.0", "10", objects[0].hash),
        ("keda-1.1.0", "11", objects[1].hash),
        ("serverless-2.0.0", "12", objects[2].hash),
    ]);
    let observed = [
        listed_meta("keda-1.0.0", "10", true),
        listed_meta("keda-1.1.0", "11", true),
        listed_meta("serverless-2.0.0", "12", true),
    ];
    let plan = plan(&desired_of(&objects), &observed, &memory);
    assert!(plan.is_noop(), "{plan:?}");
    assert_eq!(unchanged(&plan), ["keda-1.0.0", "keda-1.1.0", "serverless-2.0.0"]);
}

// ---------------------------------------------------------------------------------------------
// Prune
// ---------------------------------------------------------------------------------------------

#[test]
fn plan_prunes_only_managed_orphans() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "1", keda.hash)]);
    let observed = [
        listed_meta("keda-1.0.0", "1", true),
        listed_meta("keda-0.9.0", "2", true),
        listed_meta("user-made", "3", false),
        listed_meta("serverless-1.0.0", "4", true),
    ];
    let plan = plan(&desired_of([&keda]), &observed, &memory);
    assert_eq!(pruned(&plan), ["keda-0.9.0", "serverless-1.0.0"]);
    assert_eq!(plan.apply, vec![]);
    assert_eq!(unchanged(&plan), ["keda-1.0.0"]);
}

#[test]
fn orphans_carry_the_uid_and_version_they_were_listed_with() {
    // Warm (metadata-only) and cold (full) lists alike: the delete's preconditions.
    let observed = [listed_meta("keda-0.9.0", "17", true), listed_copy(&desired_mt("old", "0.1.0"), "23", true)];
    let plan = plan(&BTreeMap::new(), &observed, &KindMemory::new());
    let orphan =
        |name: &str, rv: &str| Orphan { name: name.to_owned(), uid: uid_of(name), resource_version: rv.to_owned() };
    assert_eq!(plan.prune, [orphan("keda-0.9.0", "17"), orphan("old-0.1.0", "23")]);
}

#[test]
fn plan_never_prunes_unmanaged_objects() {
    let observed = [listed_meta("user-made", "3", false), listed_copy(&desired_mt("keda", "0.1.0"), "4", false)];
    for desired in [BTreeMap::new(), desired_of([&desired_mt("keda", "1.0.0")])] {
        let plan = plan(&desired, &observed, &KindMemory::new());
        assert_eq!(plan.prune, Vec::<Orphan>::new());
        assert!(plan.unchanged.is_empty());
    }
}

#[test]
fn empty_desired_set_prunes_every_managed_object() {
    let observed = [
        listed_meta("keda-1.0.0", "1", true),
        listed_copy(&desired_mt("serverless", "1.0.0"), "2", true),
        listed_meta("user-made", "3", false),
    ];
    let memory = remember(&[("keda-1.0.0", "1", 42)]);
    let plan = plan(&BTreeMap::new(), &observed, &memory);
    assert_eq!(pruned(&plan), ["keda-1.0.0", "serverless-1.0.0"]);
    assert_eq!(plan.apply, vec![]);
    assert_eq!(plan.unchanged, vec![]);
}

// ---------------------------------------------------------------------------------------------
// Adoption
// ---------------------------------------------------------------------------------------------

#[test]
fn unmanaged_copy_with_identical_content_is_unchanged() {
    let keda = desired_mt("keda", "1.0.0");
    let plan = plan(&desired_of([&keda]), &[listed_copy(&keda, "5", false)], &KindMemory::new());
    assert_eq!(plan.unchanged, vec![("keda-1.0.0".to_owned(), "5".to_owned(), keda.hash)]);
    assert!(plan.is_noop());
}

#[test]
fn unmanaged_copy_that_differs_is_applied_not_pruned() {
    let keda = desired_mt("keda", "1.0.0");
    let observed = listed_copy_edited(&keda, "5", false, |c| c["spec"]["version"] = json!("0.0.1"));
    let plan = plan(&desired_of([&keda]), &[observed], &KindMemory::new());
    assert_eq!(plan.apply, vec![keda]);
    assert_eq!(plan.prune, Vec::<Orphan>::new());
}

// ---------------------------------------------------------------------------------------------
// Snapshot and render
// ---------------------------------------------------------------------------------------------

#[test]
fn snapshot_records_malformed_objects_without_failing() {
    let mts = [
        MtBuilder::new("keda", "1.0.0").build(),
        raw_object(CatalogKind::ModuleTemplate, "no-spec-1.0.0", json!({})),
        raw_object(CatalogKind::ModuleTemplate, "null-spec-1.0.0", json!({"spec": null})),
        MtBuilder::new("nameless", "1.0.0").without_spec_field("moduleName").build(),
        MtBuilder::new("numeric", "1.0.0").spec_field("version", json!(1)).build(),
    ];
    let mrms = [
        MrmBuilder::new("keda").channel("regular", "1.0.0").build(),
        raw_object(CatalogKind::ModuleReleaseMeta, "no-spec", json!({"status": {}})),
        raw_object(CatalogKind::ModuleReleaseMeta, "no-module-name", json!({"spec": {"channels": []}})),
        MrmBuilder::new("versionless").raw_channel(json!({"channel": "regular"})).build(),
    ];
    let snap = snapshot(&mts, &mrms);
    assert_eq!(snap.templates.keys().collect::<Vec<_>>(), ["keda-1.0.0"]);
    assert_eq!(snap.release_metas.keys().collect::<Vec<_>>(), ["keda"]);
    let got: Vec<(CatalogKind, &str)> = snap.malformed.iter().map(|m| (m.kind, m.name.as_str())).collect();
    assert_eq!(
        got,
        [
            (CatalogKind::ModuleTemplate, "no-spec-1.0.0"),
            (CatalogKind::ModuleTemplate, "null-spec-1.0.0"),
            (CatalogKind::ModuleTemplate, "numeric-1.0.0"),
            (CatalogKind::ModuleReleaseMeta, "no-spec"),
            (CatalogKind::ModuleReleaseMeta, "no-module-name"),
            (CatalogKind::ModuleReleaseMeta, "versionless"),
        ]
    );
    let reasons: Vec<&Malformed> = snap.malformed.iter().filter(|m| m.reason.is_empty()).collect();
    assert!(reasons.is_empty(), "every malformed object says why: {reasons:?}");
    assert_eq!(snap.malformed[0].reason, "has no spec");
    assert!(snap.malformed[2].reason.contains("expected a string"), "{}", snap.malformed[2].reason);
    // An old-style template (a spec without moduleName) is not malformed: counted apart, never synced.
    assert_eq!(snap.unnamed_templates, ["nameless-1.0.0"]);
}

#[test]
fn old_style_templates_are_never_synced_and_not_malformed() {
    let mts = [
        MtBuilder::new("keda", "1.0.0").build(),
        MtBuilder::new("keda", "0.9.0").without_spec_field("moduleName").build(),
        MtBuilder::new("keda", "0.8.0").spec_field("moduleName", json!(null)).build(),
    ];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "0.9.0").build()];
    let snap = snapshot(&mts, &mrms);
    assert!(snap.malformed.is_empty(), "{:?}", snap.malformed);
    assert_eq!(snap.unnamed_templates, ["keda-0.9.0", "keda-0.8.0"]);
    let (set, _) = crate::catalog::desired_set(&snap, &crate::fixtures::kyma_flags(false, false), &Default::default());
    let names: Vec<&String> = set.of(CatalogKind::ModuleTemplate).keys().collect();
    assert_eq!(names, ["keda-1.0.0"], "the old-style template of channel fast is not synced");
}

#[test]
fn snapshot_reads_a_template_without_version_as_empty_version() {
    let snap = snapshot(&[MtBuilder::new("keda", "").without_spec_field("version").name("keda").build()], &[]);
    assert!(snap.malformed.is_empty(), "{:?}", snap.malformed);
    assert_eq!(snap.templates["keda"].version, "");
}

#[test]
fn render_of_a_klm_template_keeps_descriptor_and_data_byte_for_byte() {
    let kcp = klm_module_template();
    let copy = render_copy(&kcp, CatalogKind::ModuleTemplate, SYNC_NAMESPACE);

    assert_eq!(copy["spec"]["descriptor"], klm_descriptor());
    assert_eq!(copy["spec"]["data"], klm_data());
    let mut typed = kcp.data["spec"].clone();
    crate::catalog::render::typed_spec(CatalogKind::ModuleTemplate, typed.as_object_mut().expect("a spec"));
    assert_eq!(copy["spec"], typed);
    let bytes = |v: &Value| serde_json::to_vec(v).expect("serialises");
    assert_eq!(bytes(&copy["spec"]["descriptor"]), bytes(&kcp.data["spec"]["descriptor"]));
    assert_eq!(bytes(&copy["spec"]["data"]), bytes(&kcp.data["spec"]["data"]));

    let meta = copy["metadata"].as_object().expect("metadata is an object");
    let mut keys: Vec<&str> = meta.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["annotations", "labels", "name", "namespace"]);
    assert_eq!(meta["name"], json!("btp-operator-1.1.0"));
    assert_eq!(meta["namespace"], json!(SYNC_NAMESPACE));
    assert_eq!(meta["labels"][MANAGED_BY_LABEL], json!(MANAGED_BY_VALUE));
    assert_eq!(meta["labels"]["operator.kyma-project.io/module-name"], json!("btp-operator"));
    assert_eq!(
        meta["annotations"].get(LAST_APPLIED_ANNOTATION),
        kcp.metadata.annotations.as_ref().and_then(|a| a.get(LAST_APPLIED_ANNOTATION)).map(|a| json!(a)).as_ref()
    );
    assert_eq!(meta["annotations"]["operator.kyma-project.io/is-cluster-scoped"], json!("false"));
    assert_eq!(copy["apiVersion"], json!("operator.kyma-project.io/v1beta2"));
    assert_eq!(copy["kind"], json!("ModuleTemplate"));

    let view = &snapshot(&[kcp], &[]).templates["btp-operator-1.1.0"];
    assert_eq!(view.body.value().expect("the body is JSON"), copy);
    assert_eq!(*view.digest, CopyDigest::of(&copy));
    assert_eq!(view.hash, content_hash(&copy));
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

#[test]
fn memory_matches_exactly_the_remembered_version_and_hash() {
    let mut memory = KindMemory::new();
    memory.remember("keda-1.0.0", "1234", 7);
    memory.remember("odd", "0012", 7);
    memory.remember("opaque", "a/b:c", 7);
    assert!(memory.matches("keda-1.0.0", "1234", 7));
    assert!(!memory.matches("keda-1.0.0", "1235", 7));
    assert!(!memory.matches("keda-1.0.0", "1234", 8));
    assert!(!memory.matches("serverless-1.0.0", "1234", 7));
    // Non-canonical and non-numeric versions are kept as text, compared as text.
    assert!(memory.matches("odd", "0012", 7));
    assert!(!memory.matches("odd", "12", 7));
    assert!(!memory.matches("keda-1.0.0", "01234", 7));
    assert!(!memory.matches("keda-1.0.0", "+1234", 7));
    assert!(memory.matches("opaque", "a/b:c", 7));
    memory.remember("keda-1.0.0", "1300", 8);
    assert!(memory.matches("keda-1.0.0", "1300", 8) && !memory.matches("keda-1.0.0", "1234", 7));
    memory.retain_names(["keda-1.0.0", "opaque"]);
    assert_eq!(memory.len(), 2);
    assert!(!memory.matches("odd", "0012", 7));
    memory.forget("keda-1.0.0");
    assert!(!memory.matches("keda-1.0.0", "1300", 8));
    assert_eq!(memory.len(), 1);
}

#[test]
fn a_version_turns_from_text_to_number_and_back() {
    let mut memory = KindMemory::new();
    memory.remember("keda-1.0.0", "0012", 7);
    memory.remember("keda-1.0.0", "12", 7);
    assert!(memory.matches("keda-1.0.0", "12", 7) && !memory.saw("keda-1.0.0", "0012"));
    memory.remember("keda-1.0.0", "x", 7);
    assert!(memory.saw("keda-1.0.0", "x") && !memory.saw("keda-1.0.0", "12"));
    memory.remember("keda-1.0.0", "y", 7);
    assert!(memory.saw("keda-1.0.0", "y") && !memory.saw("keda-1.0.0", "x"));
    memory.forget("keda-1.0.0");
    memory.remember("keda-1.0.0", "0", 7);
    assert!(memory.saw("keda-1.0.0", "0") && !memory.saw("keda-1.0.0", "y"));
    assert_eq!(memory.len(), 1);
}

/// The digest's bytes are what records kept by earlier releases were made of: per name, in
/// the order of its key (xxh3-64 of the name), the key, the resourceVersion's length and
/// text, and the content hash, little-endian; xxh3-128 of all.
#[test]
fn the_digest_keeps_its_format() {
    let entries = [("serverless-2.0.0", "18", 2u64), ("keda-1.0.0", "017", 1), ("eventing-1.1.0", "123456789", 9)];
    let mut keyed: Vec<(u64, &str, u64)> =
        entries.iter().map(|(name, rv, hash)| (xxhash_rust::xxh3::xxh3_64(name.as_bytes()), *rv, *hash)).collect();
    keyed.sort_unstable_by_key(|(key, _, _)| *key);
    let mut bytes = Vec::new();
    for (key, rv, hash) in keyed {
        bytes.extend_from_slice(&key.to_le_bytes());
        bytes.extend_from_slice(&(rv.len() as u64).to_le_bytes());
        bytes.extend_from_slice(rv.as_bytes());
        bytes.extend_from_slice(&hash.to_le_bytes());
    }
    assert_eq!(remember(&entries).digest(), xxhash_rust::xxh3::xxh3_128(&bytes));
}

proptest::proptest! {
    /// The memory behaves as a map from name to (resourceVersion, hash), whatever the order
    /// of operations, and its digest depends on the content only.
    #[test]
    fn memory_is_a_map_of_names(ops in proptest::collection::vec(
        (0u8..4, 0usize..12, proptest::sample::select(vec!["1", "17", "017", "x", "0", "18446744073709551615"]), 0u64..3),
        0..60,
    )) {
        let mut memory = KindMemory::new();
        let mut model: BTreeMap<String, (String, u64)> = BTreeMap::new();
        for (op, n, rv, hash) in ops {
            let name = format!("module-{n}");
            match op {
                0 | 1 => {
                    memory.remember(&name, rv, hash);
                    model.insert(name, (rv.to_owned(), hash));
                }
                2 => {
                    memory.forget(&name);
                    model.remove(&name);
                }
                _ => {
                    let keep: Vec<String> = model.keys().filter(|k| k.len() % 2 == 0).cloned().collect();
                    memory.retain_names(keep.iter().map(String::as_str));
                    model.retain(|k, _| keep.contains(k));
                }
            }
            memory.shrink();
        }
        proptest::prop_assert_eq!(memory.len(), model.len());
        for n in 0..12 {
            let name = format!("module-{n}");
            for rv in ["1", "17", "017", "x", "0", "18446744073709551615"] {
                let want = model.get(&name).is_some_and(|(r, _)| r == rv);
                proptest::prop_assert_eq!(memory.saw(&name, rv), want);
                for hash in 0..3 {
                    proptest::prop_assert_eq!(memory.matches(&name, rv, hash), model.get(&name) == Some(&(rv.to_owned(), hash)));
                }
            }
        }
        let rebuilt = remember(&model.iter().rev().map(|(n, (r, h))| (n.as_str(), r.as_str(), *h)).collect::<Vec<_>>());
        proptest::prop_assert_eq!(&rebuilt, &memory);
        proptest::prop_assert_eq!(rebuilt.digest(), memory.digest());
    }
}

#[test]
fn a_digest_depends_on_every_name_version_and_hash_and_not_on_order() {
    let a = remember(&[("keda-1.0.0", "17", 1), ("serverless-2.0.0", "18", 2)]);
    let b = remember(&[("serverless-2.0.0", "18", 2), ("keda-1.0.0", "17", 1)]);
    assert_eq!(a.digest(), b.digest());
    for other in [
        remember(&[("keda-1.0.0", "17", 1)]),
        remember(&[("keda-1.0.0", "19", 1), ("serverless-2.0.0", "18", 2)]),
        remember(&[("keda-1.0.0", "17", 3), ("serverless-2.0.0", "18", 2)]),
        remember(&[("keda-1.0.0", "17", 1), ("serverless-2.0.1", "18", 2)]),
        remember(&[("keda-1.0.0", "017", 1), ("serverless-2.0.0", "18", 2)]),
        remember(&[("keda-1.0.0", "17", 1), ("serverless-2.0.0", "18", 2), ("x", "1", 0)]),
    ] {
        assert_ne!(a.digest(), other.digest(), "{other:?}");
    }
    assert_ne!(KindMemory::new().digest(), a.digest());
}

#[test]
fn recall_rebuilds_the_memory_only_while_every_copy_and_the_catalog_are_as_they_were() {
    let keda = desired_mt("keda", "1.0.0");
    let serverless = desired_mt("serverless", "2.0.0");
    let desired = desired_of([&keda, &serverless]);
    let memory = remember(&[("keda-1.0.0", "17", keda.hash), ("serverless-2.0.0", "18", serverless.hash)]);
    let digest = memory.digest();
    let listed = |keda_rv: &str| {
        vec![
            listed_meta("keda-1.0.0", keda_rv, true),
            listed_meta("serverless-2.0.0", "18", true),
            listed_meta("someone-elses", "3", false),
            listed_meta("orphan-0.1.0", "4", true),
        ]
    };
    // As it was (objects that are not desired do not count: the plan prunes or keeps them).
    let recalled = KindMemory::recall(&desired, &listed("17"), digest).expect("recalled");
    assert_eq!(recalled, memory);
    let plan = plan(&desired, &listed("17"), &recalled);
    assert!(plan.apply.is_empty() && !needs_content(&plan, &listed("17"), &recalled));
    assert_eq!(pruned(&plan), ["orphan-0.1.0"]);
    // A copy written since (new resourceVersion), gone, or a catalog change: no memory.
    assert_eq!(KindMemory::recall(&desired, &listed("20"), digest), None);
    assert_eq!(KindMemory::recall(&desired, &listed("17")[1..], digest), None);
    let changed = DesiredObject { hash: serverless.hash.wrapping_add(1), ..serverless.clone() };
    assert_eq!(KindMemory::recall(&desired_of([&keda, &changed]), &listed("17"), digest), None);
    assert_eq!(KindMemory::recall(&desired_of([&keda]), &listed("17"), digest), None);
    let added = desired_mt("eventing", "1.0.0");
    assert_eq!(KindMemory::recall(&desired_of([&keda, &serverless, &added]), &listed("17"), digest), None);
    // An empty SKR that had nothing desired is recalled as empty.
    assert_eq!(KindMemory::recall(&BTreeMap::new(), &[], KindMemory::new().digest()), Some(KindMemory::new()));
}

// ---------------------------------------------------------------------------------------------
// Trusted memory (no list)
// ---------------------------------------------------------------------------------------------

#[test]
fn from_memory_a_catalog_change_applies_only_the_changed_and_new_copies() {
    let keda = desired_mt("keda", "1.0.0");
    let serverless = desired_mt("serverless", "2.0.0");
    let added = desired_mt("eventing", "1.0.0");
    let memory =
        remember(&[("keda-1.0.0", "17", keda.hash), ("serverless-2.0.0", "18", serverless.hash.wrapping_add(1))]);
    let plan = plan_from_memory(&desired_of([&keda, &serverless, &added]), &memory).expect("memory can tell");
    assert_eq!(applied(&plan), ["eventing-1.0.0", "serverless-2.0.0"]);
    assert_eq!((plan.kept, plan.unchanged.len()), (1, 0), "keda stands in memory as it is");
    assert!(plan.prune.is_empty());
}

#[test]
fn from_memory_an_unchanged_catalog_makes_no_request_at_all() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "0017", keda.hash)]);
    let plan = plan_from_memory(&desired_of([&keda]), &memory).expect("memory can tell");
    assert!(plan.is_noop());
    assert_eq!((plan.kept, plan.unchanged.len()), (1, 0));
    let mut after = memory.clone();
    after.remember("keda-1.0.0", "0017", keda.hash);
    assert_eq!(after, memory, "the memory already holds the copy, rv as text");
    assert!(memory.matches("keda-1.0.0", "0017", keda.hash));
}

#[test]
fn from_memory_a_copy_no_longer_desired_needs_a_list_to_be_pruned() {
    let keda = desired_mt("keda", "1.0.0");
    let memory = remember(&[("keda-1.0.0", "17", keda.hash), ("keda-0.9.0", "16", 7)]);
    assert_eq!(plan_from_memory(&desired_of([&keda]), &memory), None);
    assert_eq!(plan_from_memory(&BTreeMap::new(), &memory), None);
    assert_eq!(plan_from_memory(&BTreeMap::new(), &KindMemory::new()), Some(Plan::default()));
}

/// What an SKR can make a replica keep between syncs: at most [`MAX_BYTES_PER_COPY`] per
/// remembered copy, whatever resourceVersions it sends (numbers, texts of the longest length
/// kept, or longer ones, which are not kept).
#[test]
fn memory_per_copy_is_bounded_whatever_the_versions() {
    const COPIES: usize = 500;
    let longest = "v".repeat(MAX_REMEMBERED_VERSION);
    let mut memory = KindMemory::new();
    for i in 0..COPIES {
        let rv = match i % 3 {
            0 => format!("{}", 1_000_000 + i),
            1 => longest.clone(),
            _ => "x".repeat(1 << 20),
        };
        memory.remember(&format!("copy-{i}"), &rv, 7);
    }
    memory.shrink();
    let kept = memory.len();
    assert_eq!(kept, COPIES - COPIES / 3, "copies with over-long versions are not remembered");
    assert!(!memory.saw("copy-2", &"x".repeat(1 << 20)));
    assert!(memory.saw("copy-1", &longest) && memory.saw("copy-0", "1000000"));
    let bytes = memory.heap_bytes();
    assert!(bytes <= kept * MAX_BYTES_PER_COPY, "{bytes} bytes for {kept} copies");
    assert_eq!(MAX_BYTES_PER_COPY, 112);

    // A version that was remembered and then comes back too long is forgotten.
    memory.remember("copy-0", &"x".repeat(65), 7);
    assert!(!memory.saw("copy-0", "1000000"));
}
