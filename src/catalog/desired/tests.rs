//! The desired-set matrix (docs/catalog-rules.md section 2) and its properties.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::DynamicObject;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::api::ChannelVersion;
use crate::catalog::content_hash;
use crate::fixtures::{MrmBuilder, MtBuilder, kyma_flags, kyma_labels, snapshot};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn names(objects: &BTreeMap<String, DesiredObject>) -> Vec<&str> {
    objects.keys().map(String::as_str).collect()
}

/// The `spec.channels` of a desired MRM, as `(channel, version)` pairs.
fn channels_of(set: &DesiredSet, mrm: &str) -> Vec<(String, String)> {
    let obj = set.release_metas.get(mrm).expect("the release meta is desired");
    let channels: Vec<ChannelVersion> =
        serde_json::from_value(obj.body.value().expect("the body is JSON")["spec"]["channels"].clone())
            .expect("channels parse");
    channels.into_iter().map(|c| (c.channel, c.version)).collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

fn no_restrictions() -> BTreeSet<String> {
    BTreeSet::new()
}

fn restricted(modules: &[&str]) -> BTreeSet<String> {
    modules.iter().map(|m| (*m).to_owned()).collect()
}

/// Desired set with no restricted modules; asserts that nothing produced a warning.
fn desired_quietly(mts: &[DynamicObject], mrms: &[DynamicObject], labels: &BTreeMap<String, String>) -> DesiredSet {
    let (set, warnings) = desired_set(&snapshot(mts, mrms), labels, &no_restrictions());
    assert_eq!(warnings, vec![], "no warnings expected");
    set
}

/// One module per flavour, each with a single `regular` channel pointing at its only version.
fn flavoured_catalog() -> (Vec<DynamicObject>, Vec<DynamicObject>) {
    let mts = vec![
        MtBuilder::new("plain", "1.0.0").build(),
        MtBuilder::new("betamod", "1.0.0").beta().build(),
        MtBuilder::new("internalmod", "1.0.0").internal().build(),
        MtBuilder::new("betainternal", "1.0.0").beta().internal().build(),
        MtBuilder::new("mandatorymod", "1.0.0").mandatory().build(),
    ];
    let mrms = ["plain", "betamod", "internalmod", "betainternal", "mandatorymod"]
        .iter()
        .map(|m| MrmBuilder::new(m).channel("regular", "1.0.0").build())
        .collect();
    (mts, mrms)
}

/// One module whose channels offer one version of each flavour.
fn channelled_catalog() -> (Vec<DynamicObject>, Vec<DynamicObject>) {
    let mts = vec![
        MtBuilder::new("keda", "1.0.0").build(),
        MtBuilder::new("keda", "1.1.0").beta().build(),
        MtBuilder::new("keda", "1.2.0").internal().build(),
        MtBuilder::new("keda", "2.0.0").beta().internal().build(),
    ];
    let mrms = vec![
        MrmBuilder::new("keda")
            .channel("regular", "1.0.0")
            .channel("fast", "1.1.0")
            .channel("experimental", "1.2.0")
            .channel("dev", "2.0.0")
            .build(),
    ];
    (mts, mrms)
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector { match_labels: Some(kyma_labels(pairs)), match_expressions: None }
}

fn match_expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }]),
    }
}

/// A plain module `keda` plus a module `sap-btp` whose MRM is built by `mrm`.
fn catalog_with(mrm: MrmBuilder) -> (Vec<DynamicObject>, Vec<DynamicObject>) {
    let mts = vec![MtBuilder::new("keda", "1.0.0").build(), MtBuilder::new("sap-btp", "1.0.0").build()];
    let mrms =
        vec![MrmBuilder::new("keda").channel("regular", "1.0.0").build(), mrm.channel("regular", "1.0.0").build()];
    (mts, mrms)
}

// ---------------------------------------------------------------------------------------------
// Beta x internal matrix
// ---------------------------------------------------------------------------------------------

#[test]
fn plain_kyma_sees_only_plain_versions() {
    let (mts, mrms) = flavoured_catalog();
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    assert_eq!(names(&set.templates), ["plain-1.0.0"]);
    assert_eq!(names(&set.release_metas), ["plain"]);
}

#[test]
fn beta_kyma_sees_plain_and_beta_versions() {
    let (mts, mrms) = flavoured_catalog();
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, false));
    assert_eq!(names(&set.templates), ["betamod-1.0.0", "plain-1.0.0"]);
    assert_eq!(names(&set.release_metas), ["betamod", "plain"]);
}

#[test]
fn internal_kyma_sees_plain_and_internal_versions() {
    let (mts, mrms) = flavoured_catalog();
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, true));
    assert_eq!(names(&set.templates), ["internalmod-1.0.0", "plain-1.0.0"]);
    assert_eq!(names(&set.release_metas), ["internalmod", "plain"]);
}

#[test]
fn beta_internal_kyma_sees_every_version_except_mandatory_ones() {
    let (mts, mrms) = flavoured_catalog();
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert_eq!(names(&set.templates), ["betainternal-1.0.0", "betamod-1.0.0", "internalmod-1.0.0", "plain-1.0.0"]);
    assert_eq!(names(&set.release_metas), ["betainternal", "betamod", "internalmod", "plain"]);
}

#[test]
fn channels_are_cut_to_the_versions_the_kyma_may_see() {
    let (mts, mrms) = channelled_catalog();
    // (kyma beta, kyma internal, surviving channels, desired templates)
    type Case = (bool, bool, &'static [(&'static str, &'static str)], &'static [&'static str]);
    let cases: [Case; 4] = [
        (false, false, &[("regular", "1.0.0")], &["keda-1.0.0"]),
        (true, false, &[("regular", "1.0.0"), ("fast", "1.1.0")], &["keda-1.0.0", "keda-1.1.0"]),
        (false, true, &[("regular", "1.0.0"), ("experimental", "1.2.0")], &["keda-1.0.0", "keda-1.2.0"]),
        (
            true,
            true,
            &[("regular", "1.0.0"), ("fast", "1.1.0"), ("experimental", "1.2.0"), ("dev", "2.0.0")],
            &["keda-1.0.0", "keda-1.1.0", "keda-1.2.0", "keda-2.0.0"],
        ),
    ];
    for (beta, internal, channels, templates) in cases {
        let set = desired_quietly(&mts, &mrms, &kyma_flags(beta, internal));
        assert_eq!(channels_of(&set, "keda"), pairs(channels), "beta={beta} internal={internal}");
        assert_eq!(names(&set.templates), templates, "beta={beta} internal={internal}");
        assert_eq!(names(&set.release_metas), ["keda"], "beta={beta} internal={internal}");
    }
}

// ---------------------------------------------------------------------------------------------
// Channel pruning
// ---------------------------------------------------------------------------------------------

#[test]
fn pruned_mrm_differs_from_the_kcp_copy_only_in_its_channels() {
    let mts = [MtBuilder::new("keda", "1.0.0").build(), MtBuilder::new("keda", "1.1.0").beta().build()];
    let mrms = [MrmBuilder::new("keda")
        .channel("regular", "1.0.0")
        .channel("fast", "1.1.0")
        .label("team", "keda")
        .annotation("docs", "https://kyma-project.io")
        .spec_field("futureField", json!({"nested": [1, 2, {"x": "y"}]}))
        .spec_field("beta", json!(true))
        .top_level_field("futureTopLevel", json!({"a": 1}))
        .build()];
    let snap = snapshot(&mts, &mrms);
    let (set, warnings) = desired_set(&snap, &kyma_flags(false, false), &no_restrictions());
    assert_eq!(warnings, vec![]);

    let mut expected = (*snap.release_metas["keda"].payload).clone();
    expected["spec"]["channels"] = json!([{"channel": "regular", "version": "1.0.0"}]);
    let got = &set.release_metas["keda"];
    let value = got.body.value().expect("the body is JSON");
    assert_eq!(value, expected);
    assert_eq!(value["spec"]["futureField"], json!({"nested": [1, 2, {"x": "y"}]}));
    assert_eq!(value["futureTopLevel"], json!({"a": 1}));
    assert_eq!(got.hash, content_hash(&value));
    assert_eq!(*got.digest, CopyDigest::of(&value));
    assert_ne!(got.hash, content_hash(&snap.release_metas["keda"].payload));
}

#[test]
fn unpruned_mrm_is_the_kcp_copy_as_is() {
    let (mts, mrms) = channelled_catalog();
    let snap = snapshot(&mts, &mrms);
    let (set, _) = desired_set(&snap, &kyma_flags(true, true), &no_restrictions());
    let got = &set.release_metas["keda"];
    let kcp = &snap.release_metas["keda"];
    assert!(got.body.is_shared_with(&kcp.body) && Arc::ptr_eq(&got.digest, &kcp.digest));
    assert_eq!(got.hash, content_hash(&kcp.payload));
}

#[test]
fn desired_templates_share_the_snapshot_payload_and_hash() {
    let (mts, mrms) = channelled_catalog();
    let snap = snapshot(&mts, &mrms);
    let (set, _) = desired_set(&snap, &kyma_flags(true, true), &no_restrictions());
    for (name, obj) in &set.templates {
        assert_eq!(&obj.name, name);
        assert!(obj.body.is_shared_with(&snap.templates[name].body));
        assert!(Arc::ptr_eq(&obj.digest, &snap.templates[name].digest));
        assert_eq!(obj.hash, snap.templates[name].hash);
    }
}

#[test]
fn mrm_that_loses_all_channels_is_not_desired() {
    let mts = [
        MtBuilder::new("keda", "1.0.0").build(),
        MtBuilder::new("serverless", "1.1.0").beta().build(),
        MtBuilder::new("serverless", "1.2.0").internal().build(),
    ];
    let mrms = [
        MrmBuilder::new("keda").channel("regular", "1.0.0").build(),
        MrmBuilder::new("serverless").channel("fast", "1.1.0").channel("experimental", "1.2.0").build(),
    ];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    assert_eq!(names(&set.release_metas), ["keda"]);
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

#[test]
fn mrm_without_channels_is_not_desired() {
    let mts = [MtBuilder::new("keda", "1.0.0").build()];
    let mrms = [MrmBuilder::new("keda").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert!(set.is_empty(), "{set:?}");
}

#[test]
fn templates_no_surviving_channel_references_are_not_desired() {
    let mts = [
        MtBuilder::new("keda", "0.9.0").build(),
        MtBuilder::new("keda", "1.0.0").build(),
        MtBuilder::new("keda", "1.1.0").beta().build(),
        MtBuilder::new("orphan", "1.0.0").build(),
    ];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.1.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
    assert_eq!(names(&set.release_metas), ["keda"]);
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert_eq!(names(&set.templates), ["keda-1.0.0", "keda-1.1.0"]);
}

#[test]
fn channel_pointing_to_a_missing_template_is_cut() {
    let mts = [MtBuilder::new("keda", "1.0.0").build()];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.1.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert_eq!(channels_of(&set, "keda"), pairs(&[("regular", "1.0.0")]));
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

#[test]
fn two_channels_on_one_version_keep_both_entries_and_one_template() {
    let mts = [MtBuilder::new("keda", "1.0.0").build()];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.0.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    assert_eq!(channels_of(&set, "keda"), pairs(&[("regular", "1.0.0"), ("fast", "1.0.0")]));
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

// ---------------------------------------------------------------------------------------------
// Mandatory modules
// ---------------------------------------------------------------------------------------------

#[test]
fn mandatory_mrm_is_skipped_with_its_templates() {
    let mts = [MtBuilder::new("keda", "1.0.0").build(), MtBuilder::new("istio", "1.2.0").build()];
    let mrms = [
        MrmBuilder::new("keda").channel("regular", "1.0.0").build(),
        MrmBuilder::new("istio").mandatory("1.2.0").build(),
    ];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert_eq!(names(&set.release_metas), ["keda"]);
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

#[test]
fn mandatory_mrm_is_skipped_even_with_channels() {
    let mts = [MtBuilder::new("istio", "1.2.0").build()];
    let mrms = [MrmBuilder::new("istio").channel("regular", "1.2.0").mandatory("1.2.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert!(set.is_empty(), "{set:?}");
}

#[test]
fn mandatory_template_is_skipped_even_if_a_channel_points_to_it() {
    let mts = [MtBuilder::new("keda", "1.0.0").build(), MtBuilder::new("keda", "1.1.0").mandatory().build()];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.1.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert_eq!(channels_of(&set, "keda"), pairs(&[("regular", "1.0.0")]));
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

#[test]
fn template_with_mandatory_false_is_not_mandatory() {
    let mts = [MtBuilder::new("keda", "1.0.0").spec_field("mandatory", json!(false)).build()];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

// ---------------------------------------------------------------------------------------------
// Lookup by name
// ---------------------------------------------------------------------------------------------

#[test]
fn template_with_matching_spec_but_another_name_does_not_count() {
    let mts = [MtBuilder::new("keda", "1.0.0").name("keda-regular").build()];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    assert!(set.is_empty(), "{set:?}");
}

#[test]
fn templates_are_selected_by_spec_module_and_version_so_a_lookalike_counts_too() {
    let mts = [
        MtBuilder::new("keda", "1.0.0").build(),
        // Same module and version in its spec, but not the name the channel points at.
        MtBuilder::new("keda", "1.0.0").name("keda-1.0.0-copy").build(),
    ];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    // R2.6 in docs/catalog-rules.md (as KLM's FilterAllowedModuleTemplates): selection by spec,
    // not by name.
    assert_eq!(names(&set.templates), ["keda-1.0.0", "keda-1.0.0-copy"]);
}

#[test]
fn channel_survives_by_template_name_but_template_is_selected_by_spec() {
    // The channel survives because a template *named* keda-1.0.0 exists (R2.3), but its spec
    // says 1.0.1, which no channel references (R2.6): KLM syncs the MRM only.
    let mts = [MtBuilder::new("keda", "1.0.1").name("keda-1.0.0").build()];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").build()];
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    assert_eq!(names(&set.release_metas), ["keda"]);
    assert!(set.templates.is_empty(), "{:?}", names(&set.templates));
}

// ---------------------------------------------------------------------------------------------
// Label values
// ---------------------------------------------------------------------------------------------

#[test]
fn kyma_flag_values_are_true_case_insensitively_and_nothing_else() {
    let (mts, mrms) = flavoured_catalog();
    for value in ["true", "TRUE", "True", "tRuE"] {
        let labels = kyma_labels(&[(BETA_LABEL, value), (INTERNAL_LABEL, value)]);
        let set = desired_quietly(&mts, &mrms, &labels);
        assert_eq!(names(&set.release_metas), ["betainternal", "betamod", "internalmod", "plain"], "value {value}");
    }
    for value in ["yes", "1", "on", "false", "", " true"] {
        let labels = kyma_labels(&[(BETA_LABEL, value), (INTERNAL_LABEL, value)]);
        let set = desired_quietly(&mts, &mrms, &labels);
        assert_eq!(names(&set.release_metas), ["plain"], "value {value:?}");
    }
}

#[test]
fn template_flag_values_are_true_case_insensitively_and_nothing_else() {
    let mts = [
        MtBuilder::new("upper", "1.0.0").label(BETA_LABEL, "TRUE").build(),
        MtBuilder::new("title", "1.0.0").label(INTERNAL_LABEL, "True").build(),
        MtBuilder::new("yes", "1.0.0").label(BETA_LABEL, "yes").label(INTERNAL_LABEL, "yes").build(),
        MtBuilder::new("off", "1.0.0").label(BETA_LABEL, "false").build(),
    ];
    let mrms: Vec<_> = ["upper", "title", "yes", "off"]
        .iter()
        .map(|m| MrmBuilder::new(m).channel("regular", "1.0.0").build())
        .collect();
    let snap = snapshot(&mts, &mrms);
    assert!(snap.templates["upper-1.0.0"].beta);
    assert!(snap.templates["title-1.0.0"].internal);
    assert!(!snap.templates["yes-1.0.0"].beta && !snap.templates["yes-1.0.0"].internal);
    let set = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    assert_eq!(names(&set.templates), ["off-1.0.0", "yes-1.0.0"]);
    assert_eq!(names(&set.release_metas), ["off", "yes"]);
}

#[test]
fn kyma_channel_does_not_filter_the_catalog() {
    // desired_set takes no channel: neither the Kyma's spec.channel nor an MT's deprecated
    // spec.channel is an input. Extra Kyma labels change nothing either.
    let mts = [
        MtBuilder::new("keda", "1.0.0").spec_field("channel", json!("regular")).build(),
        MtBuilder::new("keda", "1.1.0").spec_field("channel", json!("fast")).build(),
    ];
    let mrms = [MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.1.0").build()];
    let plain = desired_quietly(&mts, &mrms, &kyma_flags(false, false));
    let labelled = desired_quietly(
        &mts,
        &mrms,
        &kyma_labels(&[("operator.kyma-project.io/channel", "fast"), ("kyma-project.io/region", "eu")]),
    );
    assert_eq!(plain, labelled);
    assert_eq!(channels_of(&plain, "keda"), pairs(&[("regular", "1.0.0"), ("fast", "1.1.0")]));
    assert_eq!(names(&plain.templates), ["keda-1.0.0", "keda-1.1.0"]);
}

// ---------------------------------------------------------------------------------------------
// Restricted modules and selectors
// ---------------------------------------------------------------------------------------------

#[test]
fn restricted_module_without_selector_is_not_desired() {
    let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp"));
    let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &kyma_flags(true, true), &restricted(&["sap-btp"]));
    assert_eq!(warnings, vec![]);
    assert_eq!(names(&set.release_metas), ["keda"]);
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

#[test]
fn restricted_module_with_null_selector_is_not_desired() {
    let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").raw_selector(Value::Null));
    let snap = snapshot(&mts, &mrms);
    assert_eq!(snap.release_metas["sap-btp"].kyma_selector, None);
    let (set, warnings) = desired_set(&snap, &kyma_flags(true, true), &restricted(&["sap-btp"]));
    assert_eq!(warnings, vec![]);
    assert_eq!(names(&set.release_metas), ["keda"]);
}

#[test]
fn restricted_module_with_empty_selector_is_not_desired() {
    for raw in [json!({}), json!({"matchLabels": {}, "matchExpressions": []})] {
        let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").raw_selector(raw.clone()));
        let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &kyma_flags(true, true), &restricted(&["sap-btp"]));
        assert_eq!(warnings, vec![], "selector {raw}");
        assert_eq!(names(&set.release_metas), ["keda"], "selector {raw}");
        assert_eq!(names(&set.templates), ["keda-1.0.0"], "selector {raw}");
    }
}

#[test]
fn restricted_module_with_matching_match_labels_is_desired() {
    let sel = match_labels(&[("kyma-project.io/region", "eu"), ("kyma-project.io/plan", "azure")]);
    let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel));
    let labels = kyma_labels(&[("kyma-project.io/region", "eu"), ("kyma-project.io/plan", "azure"), ("other", "x")]);
    let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &labels, &restricted(&["sap-btp"]));
    assert_eq!(warnings, vec![]);
    assert_eq!(names(&set.release_metas), ["keda", "sap-btp"]);
    assert_eq!(names(&set.templates), ["keda-1.0.0", "sap-btp-1.0.0"]);
}

#[test]
fn restricted_module_with_matching_match_expressions_is_desired() {
    let sel = match_expression("kyma-project.io/region", "In", &["eu", "us"]);
    let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel));
    let labels = kyma_labels(&[("kyma-project.io/region", "us")]);
    let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &labels, &restricted(&["sap-btp"]));
    assert_eq!(warnings, vec![]);
    assert_eq!(names(&set.release_metas), ["keda", "sap-btp"]);
    assert_eq!(names(&set.templates), ["keda-1.0.0", "sap-btp-1.0.0"]);
}

#[test]
fn restricted_module_with_non_matching_selector_is_not_desired() {
    let selectors = [
        match_labels(&[("kyma-project.io/region", "eu")]),
        match_expression("kyma-project.io/region", "NotIn", &["us"]),
        match_expression("kyma-project.io/plan", "Exists", &[]),
    ];
    let labels = kyma_labels(&[("kyma-project.io/region", "us")]);
    for sel in selectors {
        let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel.clone()));
        let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &labels, &restricted(&["sap-btp"]));
        assert_eq!(warnings, vec![], "{sel:?}");
        assert_eq!(names(&set.release_metas), ["keda"], "{sel:?}");
        assert_eq!(names(&set.templates), ["keda-1.0.0"], "{sel:?}");
    }
}

#[test]
fn restricted_module_with_unusable_selector_is_skipped_with_a_warning() {
    let sel = match_expression("kyma-project.io/region", "Like", &["eu"]);
    let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel));
    let labels = kyma_labels(&[("kyma-project.io/region", "eu")]);
    let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &labels, &restricted(&["sap-btp"]));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        matches!(&warnings[0], Warning::InvalidSelector { release_meta, .. } if release_meta == "sap-btp"),
        "{warnings:?}"
    );
    assert_eq!(names(&set.release_metas), ["keda"]);
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

#[test]
fn selector_that_is_not_a_label_selector_is_recorded_and_skips_the_mrm_with_a_warning() {
    let raws = [json!({"matchLabels": "region=eu"}), json!("region=eu"), json!({"matchExpressions": [{"key": 1}]})];
    for raw in raws {
        let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").raw_selector(raw.clone()));
        let snap = snapshot(&mts, &mrms);
        assert!(snap.malformed.is_empty(), "an unparsable selector does not make the MRM malformed");
        assert!(matches!(snap.release_metas["sap-btp"].kyma_selector, Some(Err(_))), "selector {raw}");
        for restricted_modules in [restricted(&["sap-btp"]), no_restrictions()] {
            let (set, warnings) = desired_set(&snap, &kyma_flags(true, true), &restricted_modules);
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert!(
                matches!(&warnings[0], Warning::InvalidSelector { release_meta, .. } if release_meta == "sap-btp"),
                "{warnings:?}"
            );
            assert_eq!(names(&set.release_metas), ["keda"], "selector {raw}");
            assert_eq!(names(&set.templates), ["keda-1.0.0"], "selector {raw}");
        }
    }
}

#[test]
fn selector_on_an_unrestricted_module_is_skipped_with_a_warning() {
    let sel = match_labels(&[("kyma-project.io/region", "eu")]);
    let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel));
    let labels = kyma_labels(&[("kyma-project.io/region", "eu")]);
    let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &labels, &no_restrictions());
    assert_eq!(warnings, vec![Warning::SelectorOnUnrestrictedModule { release_meta: "sap-btp".to_owned() }]);
    assert_eq!(names(&set.release_metas), ["keda"]);
    assert_eq!(names(&set.templates), ["keda-1.0.0"]);
}

/// Selectors that Kubernetes rejects, each with Kyma labels that a matcher skipping
/// validation would take as a match.
fn invalid_selectors() -> Vec<(&'static str, LabelSelector, BTreeMap<String, String>)> {
    let long = "v".repeat(64);
    vec![
        ("NotIn on an invalid key", match_expression("not a valid key!", "NotIn", &["x"]), kyma_labels(&[])),
        (
            "In with a 64-character value",
            match_expression("kyma-project.io/region", "In", &[long.as_str()]),
            kyma_labels(&[("kyma-project.io/region", long.as_str())]),
        ),
        ("matchLabels with an invalid key", match_labels(&[("bad key!", "eu")]), kyma_labels(&[("bad key!", "eu")])),
        (
            "matchLabels with an upper-case prefix",
            match_labels(&[("Kyma-Project.io/region", "eu")]),
            kyma_labels(&[("Kyma-Project.io/region", "eu")]),
        ),
        (
            "DoesNotExist on a key with two slashes",
            match_expression("kyma-project.io/a/b", "DoesNotExist", &[]),
            kyma_labels(&[]),
        ),
    ]
}

#[test]
fn restricted_module_with_an_invalid_selector_is_desired_for_no_kyma() {
    for (case, sel, would_match) in invalid_selectors() {
        let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel));
        let snap = snapshot(&mts, &mrms);
        assert!(snap.malformed.is_empty(), "{case}: an invalid selector does not make the MRM malformed");
        let reason = match &snap.release_metas["sap-btp"].kyma_selector {
            Some(Err(reason)) => reason.clone(),
            other => panic!("{case}: the snapshot holds {other:?}, not the reason"),
        };
        assert!(reason.starts_with("kymaSelector is invalid: "), "{case}: {reason}");
        let sets = ProfileCache::default();
        for labels in [would_match, kyma_flags(true, true), kyma_labels(&[("kyma-project.io/region", "eu")])] {
            let (set, warnings) = desired_set(&snap, &labels, &restricted(&["sap-btp"]));
            assert_eq!(
                warnings,
                vec![Warning::InvalidSelector { release_meta: "sap-btp".to_owned(), reason: reason.clone() }],
                "{case}, labels {labels:?}"
            );
            assert_eq!(names(&set.release_metas), ["keda"], "{case}, labels {labels:?}");
            assert_eq!(names(&set.templates), ["keda-1.0.0"], "{case}, labels {labels:?}");
            let shared = sets.get(&snap, &labels, &restricted(&["sap-btp"]));
            assert_eq!(shared.set, set, "{case}, labels {labels:?}");
            assert_eq!(shared.warnings, warnings, "{case}, labels {labels:?}");
        }
    }
}

#[test]
fn unrestricted_module_with_an_invalid_selector_is_skipped_with_a_warning_as_before() {
    for (case, sel, would_match) in invalid_selectors() {
        let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel));
        let (set, warnings) = desired_set(&snapshot(&mts, &mrms), &would_match, &no_restrictions());
        assert_eq!(warnings.len(), 1, "{case}: {warnings:?}");
        assert_eq!(warnings[0].reason().as_str(), "invalid_selector", "{case}: {warnings:?}");
        assert_eq!(names(&set.release_metas), ["keda"], "{case}");
        assert_eq!(names(&set.templates), ["keda-1.0.0"], "{case}");
    }
}

#[test]
fn an_invalid_selector_does_not_hide_a_valid_one_of_another_module() {
    let mts = [MtBuilder::new("good", "1.0.0").build(), MtBuilder::new("bad", "1.0.0").build()];
    let mrms = [
        MrmBuilder::new("good").channel("regular", "1.0.0").selector(match_labels(&[("tier", "gold")])).build(),
        MrmBuilder::new("bad")
            .channel("regular", "1.0.0")
            .selector(match_expression("not a valid key!", "NotIn", &["x"]))
            .build(),
    ];
    let (set, warnings) =
        desired_set(&snapshot(&mts, &mrms), &kyma_labels(&[("tier", "gold")]), &restricted(&["good", "bad"]));
    assert_eq!(names(&set.release_metas), ["good"]);
    assert_eq!(names(&set.templates), ["good-1.0.0"]);
    assert_eq!(warnings.iter().map(|w| w.reason().as_str()).collect::<Vec<_>>(), ["invalid_selector"]);
}

#[test]
fn warning_reasons_are_the_listed_ones() {
    let warnings = [
        Warning::InvalidSelector { release_meta: "a".to_owned(), reason: "r".to_owned() },
        Warning::SelectorOnUnrestrictedModule { release_meta: "a".to_owned() },
    ];
    let reasons: Vec<&str> = warnings.iter().map(|w| w.reason().as_str()).collect();
    assert_eq!(reasons, ["invalid_selector", "selector_on_unrestricted_module"]);
    assert_eq!(warnings.iter().map(Warning::reason).collect::<Vec<_>>(), WarningReason::ALL);
}

#[test]
fn restricted_module_still_obeys_beta_and_internal_gates() {
    let mts = [MtBuilder::new("sap-btp", "1.0.0").beta().build()];
    let mrms =
        [MrmBuilder::new("sap-btp").channel("fast", "1.0.0").selector(match_labels(&[("tier", "gold")])).build()];
    let snap = snapshot(&mts, &mrms);
    let (set, _) = desired_set(&snap, &kyma_labels(&[("tier", "gold")]), &restricted(&["sap-btp"]));
    assert!(set.is_empty(), "{set:?}");
    let (set, _) =
        desired_set(&snap, &kyma_labels(&[("tier", "gold"), (BETA_LABEL, "true")]), &restricted(&["sap-btp"]));
    assert_eq!(names(&set.release_metas), ["sap-btp"]);
    assert_eq!(names(&set.templates), ["sap-btp-1.0.0"]);
}

// ---------------------------------------------------------------------------------------------
// Fingerprint
// ---------------------------------------------------------------------------------------------

#[test]
fn fingerprint_is_equal_for_equal_sets() {
    let (mts, mrms) = channelled_catalog();
    let a = desired_quietly(&mts, &mrms, &kyma_flags(true, false));
    let b = desired_quietly(&mts, &mrms, &kyma_labels(&[(BETA_LABEL, "TRUE"), ("unrelated", "x")]));
    assert_eq!(a, b);
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_ne!(a.fingerprint(), desired_quietly(&mts, &mrms, &kyma_flags(false, false)).fingerprint());
}

#[test]
fn fingerprint_changes_when_one_descriptor_changes() {
    let (mts, mrms) = channelled_catalog();
    let before = desired_quietly(&mts, &mrms, &kyma_flags(true, true));
    let mut changed = mts.clone();
    changed[0] =
        MtBuilder::new("keda", "1.0.0").descriptor(json!({"component": {"name": "keda", "patched": true}})).build();
    let after = desired_quietly(&changed, &mrms, &kyma_flags(true, true));
    assert_eq!(names(&before.templates), names(&after.templates));
    assert_ne!(before.fingerprint(), after.fingerprint());
}

#[test]
fn fingerprint_of_the_empty_set_differs_from_a_non_empty_one() {
    let (mts, mrms) = channelled_catalog();
    let empty = DesiredSet::default();
    assert!(empty.is_empty());
    assert_ne!(empty.fingerprint(), desired_quietly(&mts, &mrms, &kyma_flags(false, false)).fingerprint());
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

const MODULES: [&str; 4] = ["keda", "serverless", "btp-operator", "telemetry"];
const VERSIONS: [&str; 4] = ["1.0.0", "1.1.0", "2.0.0-rc1", "2.0.0"];
const CHANNELS: [&str; 4] = ["regular", "fast", "experimental", "dev"];

/// How an MT of a generated catalog is named.
#[derive(Debug, Clone, Copy)]
enum Naming {
    /// `<module>-<version>`, as by convention.
    Conventional,
    /// Another name with the same spec (never referenced by a channel).
    Lookalike,
    /// The conventional name of the *next* version, so name and spec disagree.
    Skewed,
}

#[derive(Debug, Clone)]
struct GenMt {
    module: usize,
    version: usize,
    beta: bool,
    internal: bool,
    mandatory: bool,
    naming: Naming,
}

#[derive(Debug, Clone)]
enum GenSelector {
    Empty,
    Region(&'static str),
    RegionIn,
    BadOperator,
    NotASelector,
    /// Parses, but Kubernetes rejects it: `NotIn` on a key that is not a qualified name.
    InvalidKey,
}

#[derive(Debug, Clone)]
struct GenMrm {
    module: usize,
    channels: Vec<(usize, usize)>,
    mandatory: bool,
    selector: Option<GenSelector>,
}

#[derive(Debug, Clone)]
struct GenCatalog {
    mts: Vec<GenMt>,
    mrms: Vec<GenMrm>,
    restricted: Vec<usize>,
}

fn gen_mt() -> impl Strategy<Value = GenMt> {
    (
        0..MODULES.len(),
        0..VERSIONS.len(),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop_oneof![8 => Just(Naming::Conventional), 1 => Just(Naming::Lookalike), 1 => Just(Naming::Skewed)],
    )
        .prop_map(|(module, version, beta, internal, mandatory, naming)| GenMt {
            module,
            version,
            beta,
            internal,
            mandatory,
            naming,
        })
}

fn gen_selector() -> impl Strategy<Value = Option<GenSelector>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(GenSelector::Empty)),
        1 => Just(Some(GenSelector::Region("eu"))),
        1 => Just(Some(GenSelector::Region("us"))),
        1 => Just(Some(GenSelector::RegionIn)),
        1 => Just(Some(GenSelector::BadOperator)),
        1 => Just(Some(GenSelector::NotASelector)),
        1 => Just(Some(GenSelector::InvalidKey)),
    ]
}

fn gen_mrm(module: usize, with_selectors: bool) -> impl Strategy<Value = GenMrm> {
    let selector = if with_selectors { gen_selector().boxed() } else { Just(None).boxed() };
    (prop::collection::vec((0..CHANNELS.len(), 0..VERSIONS.len()), 0..5), prop::bool::weighted(0.1), selector).prop_map(
        move |(channels, mandatory, selector)| {
            // Channels form a list-map keyed by channel name: keep the first entry per channel.
            let mut seen = BTreeSet::new();
            let channels = channels.into_iter().filter(|(c, _)| seen.insert(*c)).collect();
            GenMrm { module, channels, mandatory, selector }
        },
    )
}

fn gen_catalog(with_restrictions: bool) -> impl Strategy<Value = GenCatalog> {
    let mrms: Vec<_> = (0..MODULES.len()).map(|m| prop::option::weighted(0.8, gen_mrm(m, with_restrictions))).collect();
    let restricted = if with_restrictions {
        prop::collection::vec(0..MODULES.len(), 0..3).boxed()
    } else {
        Just(Vec::new()).boxed()
    };
    (prop::collection::vec(gen_mt(), 0..14), mrms, restricted).prop_map(|(mts, mrms, restricted)| GenCatalog {
        mts,
        mrms: mrms.into_iter().flatten().collect(),
        restricted,
    })
}

fn gen_flag() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![Just(None), Just(Some("true")), Just(Some("TRUE")), Just(Some("false")), Just(Some("yes"))]
}

fn gen_kyma_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    (gen_flag(), gen_flag(), prop_oneof![Just(None), Just(Some("eu")), Just(Some("us"))]).prop_map(
        |(beta, internal, region)| {
            let mut labels = BTreeMap::new();
            for (key, value) in [(BETA_LABEL, beta), (INTERNAL_LABEL, internal), ("kyma-project.io/region", region)] {
                if let Some(v) = value {
                    labels.insert(key.to_owned(), v.to_owned());
                }
            }
            labels
        },
    )
}

impl GenCatalog {
    fn objects(&self) -> (Vec<DynamicObject>, Vec<DynamicObject>) {
        let mts = self
            .mts
            .iter()
            .map(|g| {
                let (module, version) = (MODULES[g.module], VERSIONS[g.version]);
                let mut b = MtBuilder::new(module, version);
                match g.naming {
                    Naming::Conventional => {}
                    Naming::Lookalike => b = b.name(&format!("{module}-{version}-lookalike")),
                    Naming::Skewed => {
                        b = b.name(&format!("{module}-{}", VERSIONS[(g.version + 1) % VERSIONS.len()]));
                    }
                }
                if g.beta {
                    b = b.beta();
                }
                if g.internal {
                    b = b.internal();
                }
                if g.mandatory {
                    b = b.mandatory();
                }
                b.build()
            })
            .collect();
        let mrms = self
            .mrms
            .iter()
            .map(|g| {
                let mut b = MrmBuilder::new(MODULES[g.module]);
                for (c, v) in &g.channels {
                    b = b.channel(CHANNELS[*c], VERSIONS[*v]);
                }
                if g.mandatory {
                    b = b.mandatory(VERSIONS[0]);
                }
                b = match &g.selector {
                    None => b,
                    Some(GenSelector::Empty) => b.raw_selector(json!({})),
                    Some(GenSelector::Region(r)) => b.selector(match_labels(&[("kyma-project.io/region", r)])),
                    Some(GenSelector::RegionIn) => {
                        b.selector(match_expression("kyma-project.io/region", "In", &["eu", "us"]))
                    }
                    Some(GenSelector::BadOperator) => {
                        b.selector(match_expression("kyma-project.io/region", "Like", &["eu"]))
                    }
                    Some(GenSelector::NotASelector) => b.raw_selector(json!({"matchLabels": ["eu"]})),
                    Some(GenSelector::InvalidKey) => {
                        b.selector(match_expression("kyma project.io/region", "NotIn", &["eu"]))
                    }
                };
                b.build()
            })
            .collect();
        (mts, mrms)
    }

    fn restricted(&self) -> BTreeSet<String> {
        self.restricted.iter().map(|m| MODULES[*m].to_owned()).collect()
    }
}

fn flags(labels: &BTreeMap<String, String>) -> (bool, bool) {
    (is_flag_on(labels.get(BETA_LABEL)), is_flag_on(labels.get(INTERNAL_LABEL)))
}

// ---------------------------------------------------------------------------------------------
// Shared desired sets (one per profile)
// ---------------------------------------------------------------------------------------------

#[test]
fn kymas_that_differ_only_in_labels_the_filter_ignores_share_one_set() {
    let sel = match_labels(&[("kyma-project.io/region", "eu")]);
    let (mts, mrms) = catalog_with(MrmBuilder::new("sap-btp").selector(sel));
    let snap = snapshot(&mts, &mrms);
    let restricted = restricted(&["sap-btp"]);
    let sets = ProfileCache::default();
    let a = sets.get(&snap, &kyma_labels(&[("kyma-project.io/region", "eu"), ("runtime-id", "a")]), &restricted);
    let b = sets.get(&snap, &kyma_labels(&[("kyma-project.io/region", "eu"), ("runtime-id", "b")]), &restricted);
    let elsewhere = sets.get(&snap, &kyma_labels(&[("kyma-project.io/region", "us")]), &restricted);
    assert!(Arc::ptr_eq(&a, &b), "the same profile shares one set");
    assert_eq!(names(&a.set.release_metas), ["keda", "sap-btp"]);
    assert_eq!(names(&elsewhere.set.release_metas), ["keda"], "the selector decides, not the cache");
    assert_eq!(sets.len(), 2);
    assert_eq!(a.fingerprint, a.set.fingerprint());
}

#[test]
fn flags_are_part_of_the_profile() {
    let (mts, mrms) = flavoured_catalog();
    let snap = snapshot(&mts, &mrms);
    let sets = ProfileCache::default();
    for (beta, internal) in [(false, false), (true, false), (false, true), (true, true)] {
        let labels = kyma_flags(beta, internal);
        let shared = sets.get(&snap, &labels, &no_restrictions());
        assert_eq!(shared.set, desired_set(&snap, &labels, &no_restrictions()).0, "beta {beta}, internal {internal}");
    }
    assert_eq!(sets.len(), 4);
}

#[test]
fn the_cache_is_bounded_and_answers_beyond_its_bound() {
    // Every Kyma matches a different subset of MAX_PROFILES + 1 restricted modules' selectors.
    let modules: Vec<String> = (0..=ProfileCache::MAX_PROFILES).map(|i| format!("mod{i}")).collect();
    let mts: Vec<DynamicObject> = modules.iter().map(|m| MtBuilder::new(m, "1.0.0").build()).collect();
    let mrms: Vec<DynamicObject> = modules
        .iter()
        .map(|m| MrmBuilder::new(m).selector(match_labels(&[(m.as_str(), "yes")])).channel("regular", "1.0.0").build())
        .collect();
    let snap = snapshot(&mts, &mrms);
    let restricted: BTreeSet<String> = modules.iter().cloned().collect();
    let sets = ProfileCache::default();
    for m in &modules {
        let labels = kyma_labels(&[(m.as_str(), "yes")]);
        let shared = sets.get(&snap, &labels, &restricted);
        assert_eq!(names(&shared.set.release_metas), [m.as_str()]);
    }
    assert_eq!(sets.len(), ProfileCache::MAX_PROFILES);
}

proptest! {
    #[test]
    fn shared_sets_are_the_sets_of_each_kyma(
        catalog in gen_catalog(true),
        kymas in proptest::collection::vec(gen_kyma_labels(), 1..6),
    ) {
        let (mts, mrms) = catalog.objects();
        let snap = snapshot(&mts, &mrms);
        let sets = ProfileCache::default();
        // Twice over, so the second round answers from the cache.
        for labels in kymas.iter().chain(&kymas) {
            let own = desired_set(&snap, labels, &catalog.restricted());
            let shared = sets.get(&snap, labels, &catalog.restricted());
            prop_assert_eq!(&shared.set, &own.0);
            prop_assert_eq!(&shared.warnings, &own.1);
            prop_assert_eq!(shared.fingerprint, own.0.fingerprint());
        }
    }

    #[test]
    fn desired_channels_are_kcp_channels_naming_allowed_kcp_templates(
        catalog in gen_catalog(true),
        labels in gen_kyma_labels(),
    ) {
        let (mts, mrms) = catalog.objects();
        let snap = snapshot(&mts, &mrms);
        let (set, _) = desired_set(&snap, &labels, &catalog.restricted());
        for (name, obj) in &set.release_metas {
            let kcp = &snap.release_metas[name];
            prop_assert!(!kcp.mandatory);
            let value = obj.body.value().expect("the body is JSON");
            let channels: Vec<ChannelVersion> =
                serde_json::from_value(value["spec"]["channels"].clone()).expect("channels parse");
            prop_assert!(!channels.is_empty(), "desired MRM {} has no channel", name);
            for c in &channels {
                prop_assert!(kcp.channels.contains(c), "{:?} is not a KCP channel of {}", c, name);
                let mt = format!("{}-{}", kcp.module_name, c.version);
                let (beta, internal) = flags(&labels);
                prop_assert!(
                    snap.templates.get(&mt).is_some_and(|t| t.is_allowed_for(beta, internal)),
                    "{} points at {}, which is no allowed KCP template", name, mt
                );
            }
            // The hash and the digest are of the apply body.
            prop_assert_eq!(obj.hash, content_hash(&value));
            prop_assert_eq!(&*obj.digest, &CopyDigest::of(&value));
        }
    }

    #[test]
    fn desired_templates_are_allowed_and_referenced(
        catalog in gen_catalog(true),
        labels in gen_kyma_labels(),
    ) {
        let (mts, mrms) = catalog.objects();
        let snap = snapshot(&mts, &mrms);
        let (set, _) = desired_set(&snap, &labels, &catalog.restricted());
        let (beta, internal) = flags(&labels);
        let mut referenced = BTreeSet::new();
        for obj in set.release_metas.values() {
            let value = obj.body.value().expect("the body is JSON");
            let module = value["spec"]["moduleName"].as_str().expect("moduleName is a string");
            let channels: Vec<ChannelVersion> =
                serde_json::from_value(value["spec"]["channels"].clone()).expect("channels parse");
            referenced.extend(channels.into_iter().map(|c| format!("{module}-{}", c.version)));
        }
        for (name, obj) in &set.templates {
            let mt = &snap.templates[name];
            prop_assert!(!mt.mandatory, "{} is mandatory", name);
            prop_assert!(mt.is_allowed_for(beta, internal), "{} is not allowed", name);
            let key = format!("{}-{}", mt.module_name, mt.version);
            prop_assert!(referenced.contains(&key), "{} ({}) is not referenced by a desired channel", name, key);
            prop_assert_eq!(obj.hash, mt.hash);
        }
    }

    #[test]
    fn beta_internal_kyma_sees_a_superset_of_a_plain_kyma_without_restrictions(
        catalog in gen_catalog(false),
    ) {
        let (mts, mrms) = catalog.objects();
        let snap = snapshot(&mts, &mrms);
        let (plain, _) = desired_set(&snap, &kyma_flags(false, false), &no_restrictions());
        let (both, _) = desired_set(&snap, &kyma_flags(true, true), &no_restrictions());
        for name in plain.templates.keys() {
            prop_assert!(both.templates.contains_key(name), "template {} missing", name);
        }
        for name in plain.release_metas.keys() {
            prop_assert!(both.release_metas.contains_key(name), "release meta {} missing", name);
            let wide = channels_of(&both, name);
            for c in channels_of(&plain, name) {
                prop_assert!(wide.contains(&c), "channel {:?} of {} missing", c, name);
            }
        }
    }

    #[test]
    fn modules_whose_selector_is_invalid_are_never_desired(
        catalog in gen_catalog(true),
        labels in gen_kyma_labels(),
    ) {
        let (mts, mrms) = catalog.objects();
        let snap = snapshot(&mts, &mrms);
        let (set, warnings) = desired_set(&snap, &labels, &catalog.restricted());
        for mrm in snap.release_metas.values() {
            if matches!(mrm.kyma_selector, Some(Err(_))) && !mrm.mandatory {
                prop_assert!(!set.release_metas.contains_key(&mrm.name), "{} is desired", mrm.name);
                prop_assert!(
                    warnings.iter().any(|w| matches!(w, Warning::InvalidSelector { release_meta, .. } if *release_meta == mrm.name)),
                    "no warning for {}", mrm.name
                );
            }
        }
    }

    #[test]
    fn explained_desired_entries_are_the_desired_set(
        catalog in gen_catalog(true),
        labels in gen_kyma_labels(),
    ) {
        let (mts, mrms) = catalog.objects();
        let snap = snapshot(&mts, &mrms);
        let restricted = catalog.restricted();
        let (set, warnings) = desired_set(&snap, &labels, &restricted);
        let explained = explain(&snap, &labels, &restricted);
        prop_assert_eq!(explained.desired_release_metas(), set.release_metas.keys().map(String::as_str).collect());
        prop_assert_eq!(explained.desired_templates(), set.templates.keys().map(String::as_str).collect());
        prop_assert_eq!(&explained.desired, &set);
        prop_assert_eq!(&explained.warnings, &warnings);
        // One verdict per object, with a reason exactly when it is not desired.
        prop_assert_eq!(explained.release_metas.len(), snap.release_metas.len());
        prop_assert_eq!(explained.templates.len(), snap.templates.len());
        let (beta, internal) = flags(&labels);
        prop_assert_eq!((explained.beta, explained.internal), (beta, internal));
        for v in &explained.release_metas {
            prop_assert_eq!(v.desired, v.reason.is_none(), "{:?}", v);
            if v.desired {
                // The surviving channels are the desired copy's channels, in order.
                let survivors: Vec<(String, String)> =
                    v.channels.iter().filter(|c| c.survives).map(|c| (c.channel.clone(), c.version.clone())).collect();
                prop_assert_eq!(channels_of(&set, &v.name), survivors);
            }
            prop_assert!(v.channels.iter().all(|c| c.survives == c.reason.is_none()), "{:?}", v);
        }
        for v in &explained.templates {
            prop_assert_eq!(v.desired, v.reason.is_none(), "{:?}", v);
            let mt = &snap.templates[&v.name];
            let disallowed = mt.disallowed_for(beta, internal).map(TemplateSkip::Disallowed);
            if disallowed.is_some() {
                prop_assert_eq!(v.reason, disallowed, "{:?}", v);
            }
        }
    }

    #[test]
    fn desired_set_is_deterministic(
        catalog in gen_catalog(true),
        labels in gen_kyma_labels(),
    ) {
        let (mts, mrms) = catalog.objects();
        let snap = snapshot(&mts, &mrms);
        let first = desired_set(&snap, &labels, &catalog.restricted());
        let again = desired_set(&snap, &labels, &catalog.restricted());
        prop_assert_eq!(&first, &again);
        // The order the stores hand the objects over in does not matter either (names are
        // unique here unless a generated lookalike collides, which last-wins would reorder).
        let unique = mts.iter().map(|o| o.metadata.name.clone()).collect::<BTreeSet<_>>().len() == mts.len();
        if unique {
            let rev_mts: Vec<_> = mts.iter().rev().cloned().collect();
            let rev_mrms: Vec<_> = mrms.iter().rev().cloned().collect();
            let reversed = desired_set(&snapshot(&rev_mts, &rev_mrms), &labels, &catalog.restricted());
            prop_assert_eq!(&first.0, &reversed.0);
            prop_assert_eq!(first.0.fingerprint(), reversed.0.fingerprint());
        }
    }
}
