//! Every reason `catalogsync explain` gives, one catalog entry each, and the JSON shape.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::DynamicObject;
use serde_json::json;

use super::*;
use crate::catalog::CatalogKind;
use crate::catalog::desired::desired_set;
use crate::fixtures::{MrmBuilder, MtBuilder, kyma_flags, kyma_labels, raw_object, snapshot};

const REGION: &str = "kyma-project.io/region";

fn region(value: &str) -> LabelSelector {
    LabelSelector { match_labels: Some(kyma_labels(&[(REGION, value)])), match_expressions: None }
}

fn restricted(modules: &[&str]) -> BTreeSet<String> {
    modules.iter().map(|m| (*m).to_owned()).collect()
}

/// A catalog with one module (or entry) per reason; a plain Kyma in region `eu` sees `plain`
/// and `eu-only`, and `cut` with its regular channel only.
fn catalog() -> (Vec<DynamicObject>, Vec<DynamicObject>) {
    let mts = vec![
        MtBuilder::new("plain", "1.0.0").build(),
        MtBuilder::new("plain", "0.9.0").build(),
        MtBuilder::new("betamod", "1.0.0").beta().build(),
        MtBuilder::new("internalmod", "1.0.0").internal().build(),
        MtBuilder::new("mandatorymod", "1.0.0").mandatory().build(),
        MtBuilder::new("eu-only", "1.0.0").build(),
        MtBuilder::new("us-only", "1.0.0").build(),
        MtBuilder::new("nosel", "1.0.0").build(),
        MtBuilder::new("emptysel", "1.0.0").build(),
        MtBuilder::new("badsel", "1.0.0").build(),
        MtBuilder::new("unrestricted-sel", "1.0.0").build(),
        MtBuilder::new("cut", "1.0.0").build(),
        MtBuilder::new("cut", "2.0.0").beta().build(),
        MtBuilder::new("orphan", "1.0.0").build(),
        MtBuilder::new("legacy", "1.0.0").without_spec_field("moduleName").build(),
        raw_object(CatalogKind::ModuleTemplate, "broken-mt", json!({"spec": {"moduleName": 7}})),
    ];
    let mrms = vec![
        MrmBuilder::new("plain").channel("regular", "1.0.0").build(),
        MrmBuilder::new("betamod").channel("regular", "1.0.0").build(),
        MrmBuilder::new("internalmod").channel("regular", "1.0.0").build(),
        MrmBuilder::new("mandatorymod").mandatory("1.0.0").build(),
        MrmBuilder::new("eu-only").selector(region("eu")).channel("regular", "1.0.0").build(),
        MrmBuilder::new("us-only").selector(region("us")).channel("regular", "1.0.0").build(),
        MrmBuilder::new("nosel").channel("regular", "1.0.0").build(),
        MrmBuilder::new("emptysel").raw_selector(json!({})).channel("regular", "1.0.0").build(),
        MrmBuilder::new("badsel")
            .raw_selector(json!({"matchExpressions": [{"key": REGION, "operator": "Like", "values": ["eu"]}]}))
            .channel("regular", "1.0.0")
            .build(),
        MrmBuilder::new("unrestricted-sel").selector(region("eu")).channel("regular", "1.0.0").build(),
        MrmBuilder::new("cut").channel("regular", "1.0.0").channel("fast", "2.0.0").build(),
        MrmBuilder::new("ghost").channel("regular", "3.0.0").build(),
        MrmBuilder::new("empty").build(),
        raw_object(CatalogKind::ModuleReleaseMeta, "broken-mrm", json!({"spec": {"channels": []}})),
    ];
    (mts, mrms)
}

fn restricted_modules() -> BTreeSet<String> {
    restricted(&["eu-only", "us-only", "nosel", "emptysel", "badsel"])
}

fn eu_kyma() -> BTreeMap<String, String> {
    let mut labels = kyma_flags(false, false);
    labels.insert(REGION.to_owned(), "eu".to_owned());
    labels
}

fn explained() -> Explanation {
    let (mts, mrms) = catalog();
    explain(&snapshot(&mts, &mrms), &eu_kyma(), &restricted_modules())
}

fn mrm<'a>(e: &'a Explanation, name: &str) -> &'a ReleaseMetaVerdict {
    e.release_metas.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no verdict on MRM {name}"))
}

fn mt<'a>(e: &'a Explanation, name: &str) -> &'a TemplateVerdict {
    e.templates.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no verdict on MT {name}"))
}

fn mrm_reason(e: &Explanation, name: &str) -> Option<&'static str> {
    mrm(e, name).reason.map(ReleaseMetaSkip::as_str)
}

fn mt_reason(e: &Explanation, name: &str) -> Option<&'static str> {
    mt(e, name).reason.map(TemplateSkip::as_str)
}

#[test]
fn every_release_meta_gets_its_reason() {
    let e = explained();
    for (name, reason) in [
        ("plain", None),
        ("eu-only", None),
        ("cut", None),
        ("betamod", Some("no_channel_survives")),
        ("internalmod", Some("no_channel_survives")),
        ("mandatorymod", Some("mandatory")),
        ("us-only", Some("selector_does_not_match")),
        ("nosel", Some("restricted_without_selector")),
        ("emptysel", Some("restricted_empty_selector")),
        ("badsel", Some("invalid_selector")),
        ("unrestricted-sel", Some("selector_on_unrestricted_module")),
        ("ghost", Some("no_channel_survives")),
        ("empty", Some("no_channels")),
    ] {
        assert_eq!(mrm_reason(&e, name), reason, "{name}");
        assert_eq!(mrm(&e, name).desired, reason.is_none(), "{name}");
    }
    assert_eq!(e.release_metas.len(), 13, "one verdict per parsed MRM, the malformed one aside");
}

#[test]
fn every_template_gets_its_reason() {
    let e = explained();
    for (name, reason) in [
        ("plain-1.0.0", None),
        ("eu-only-1.0.0", None),
        ("cut-1.0.0", None),
        ("plain-0.9.0", Some("not_referenced")),
        ("betamod-1.0.0", Some("beta")),
        ("internalmod-1.0.0", Some("internal")),
        ("mandatorymod-1.0.0", Some("mandatory")),
        ("us-only-1.0.0", Some("not_referenced")),
        ("cut-2.0.0", Some("beta")),
        ("orphan-1.0.0", Some("not_referenced")),
    ] {
        assert_eq!(mt_reason(&e, name), reason, "{name}");
        assert_eq!(mt(&e, name).desired, reason.is_none(), "{name}");
    }
}

#[test]
fn channels_say_why_they_are_cut() {
    let e = explained();
    let cut = mrm(&e, "cut");
    let verdicts: Vec<(&str, bool, Option<&str>)> =
        cut.channels.iter().map(|c| (c.channel.as_str(), c.survives, c.reason.map(ChannelCut::as_str))).collect();
    assert_eq!(verdicts, [("regular", true, None), ("fast", false, Some("template_beta"))]);
    assert_eq!(cut.channels[1].template, "cut-2.0.0");
    let ghost = &mrm(&e, "ghost").channels;
    assert_eq!(ghost.len(), 1);
    assert_eq!((ghost[0].template.as_str(), ghost[0].reason), ("ghost-3.0.0", Some(ChannelCut::NoTemplate)));
    assert_eq!(mrm(&e, "internalmod").channels[0].reason, Some(ChannelCut::TemplateDisallowed(Disallowed::Internal)));
    // Skipped before its channels were looked at: no channel verdicts.
    assert!(mrm(&e, "us-only").channels.is_empty());
    assert!(mrm(&e, "mandatorymod").channels.is_empty());
}

#[test]
fn details_name_the_selector_problem_and_what_no_channel_offers() {
    let e = explained();
    let bad = mrm(&e, "badsel").detail.clone().unwrap_or_default();
    assert!(bad.contains("unknown operator \"Like\""), "{bad}");
    assert_eq!(mrm(&e, "us-only").detail, None);
    let detail = |name| mt(&e, name).detail.clone().unwrap_or_default();
    assert_eq!(detail("orphan-1.0.0"), "no ModuleReleaseMeta has spec.moduleName orphan");
    assert_eq!(
        detail("us-only-1.0.0"),
        "the module's ModuleReleaseMeta is not desired: us-only (selector_does_not_match)"
    );
    assert_eq!(detail("plain-0.9.0"), "no channel offers version 0.9.0");
    assert_eq!(mt(&e, "betamod-1.0.0").detail, None, "a disallowed template needs no detail");
}

#[test]
fn a_template_whose_channel_is_cut_through_a_lookalike_says_so() {
    // `skew-1.0.0` is named for 1.0.0 but holds 2.0.0 and is beta; `skew-other` holds 1.0.0.
    let mts = vec![
        MtBuilder::new("skew", "2.0.0").name("skew-1.0.0").beta().build(),
        MtBuilder::new("skew", "1.0.0").name("skew-other").build(),
        MtBuilder::new("skew", "3.0.0").build(),
    ];
    let mrms = vec![MrmBuilder::new("skew").channel("regular", "1.0.0").channel("fast", "3.0.0").build()];
    let e = explain(&snapshot(&mts, &mrms), &kyma_flags(false, false), &BTreeSet::new());
    assert_eq!(mt_reason(&e, "skew-other"), Some("not_referenced"));
    assert_eq!(
        mt(&e, "skew-other").detail.as_deref(),
        Some("the channels offering version 1.0.0 are cut: skew/regular (template_beta)")
    );
}

#[test]
fn old_style_and_malformed_objects_are_listed_apart() {
    let e = explained();
    assert_eq!(e.old_style_templates, ["legacy-1.0.0"]);
    let malformed: Vec<(&str, &str)> = e.malformed.iter().map(|m| (m.kind, m.name.as_str())).collect();
    assert_eq!(malformed, [("ModuleTemplate", "broken-mt"), ("ModuleReleaseMeta", "broken-mrm")]);
    assert!(e.malformed.iter().all(|m| m.reason.starts_with("spec does not parse")), "{:?}", e.malformed);
    assert!(e.templates.iter().all(|t| t.name != "legacy-1.0.0" && t.name != "broken-mt"));
}

#[test]
fn the_explanation_carries_the_desired_set_and_its_warnings() {
    let (mts, mrms) = catalog();
    let snap = snapshot(&mts, &mrms);
    let e = explain(&snap, &eu_kyma(), &restricted_modules());
    let (set, warnings) = desired_set(&snap, &eu_kyma(), &restricted_modules());
    assert_eq!(e.desired, set);
    assert_eq!(e.warnings, warnings);
    assert_eq!(e.desired_release_metas(), BTreeSet::from(["cut", "eu-only", "plain"]));
    assert_eq!(e.desired_templates(), BTreeSet::from(["cut-1.0.0", "eu-only-1.0.0", "plain-1.0.0"]));
    assert!(!e.beta && !e.internal);
}

#[test]
fn flags_open_beta_and_internal_versions() {
    let (mts, mrms) = catalog();
    let mut labels = eu_kyma();
    labels.extend(kyma_flags(true, true));
    let e = explain(&snapshot(&mts, &mrms), &labels, &restricted_modules());
    assert!(e.beta && e.internal);
    for name in ["betamod", "internalmod"] {
        assert!(mrm(&e, name).desired, "{name}");
    }
    assert!(mrm(&e, "cut").channels.iter().all(|c| c.survives));
    assert_eq!(mt_reason(&e, "mandatorymod-1.0.0"), Some("mandatory"), "no flag opens a mandatory module");
}

#[test]
fn kcp_text_is_bounded_and_without_control_characters() {
    let module = format!("evil\u{1b}[31m{}", "x".repeat(400));
    let mts = vec![MtBuilder::new(&module, "1.0.0").name("evil-1.0.0").build()];
    let mrms = vec![MrmBuilder::new(&module).name("evil").channel("regular\n", "1.0.0").build()];
    let e = explain(&snapshot(&mts, &mrms), &kyma_flags(false, false), &BTreeSet::new());
    for text in [&mrm(&e, "evil").module, &mt(&e, "evil-1.0.0").module, &mrm(&e, "evil").channels[0].channel] {
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.chars().count() <= DETAIL_CHARS + 3, "{} characters", text.chars().count());
    }
}

#[test]
fn json_field_names_and_reason_codes_are_stable() {
    let mts = vec![MtBuilder::new("keda", "1.0.0").build(), MtBuilder::new("keda", "1.1.0").beta().build()];
    let mrms = vec![MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.1.0").build()];
    let e = explain(&snapshot(&mts, &mrms), &kyma_flags(false, false), &BTreeSet::new());
    let got = serde_json::to_value(&e).expect("serialises");
    assert_eq!(
        got,
        json!({
            "moduleReleaseMetas": [{
                "name": "keda", "module": "keda", "desired": true, "reason": null, "detail": null,
                "channels": [
                    {"channel": "regular", "version": "1.0.0", "template": "keda-1.0.0", "survives": true, "reason": null},
                    {"channel": "fast", "version": "1.1.0", "template": "keda-1.1.0", "survives": false, "reason": "template_beta"},
                ],
            }],
            "moduleTemplates": [
                {"name": "keda-1.0.0", "module": "keda", "version": "1.0.0", "desired": true, "reason": null, "detail": null},
                {"name": "keda-1.1.0", "module": "keda", "version": "1.1.0", "desired": false, "reason": "beta", "detail": null},
            ],
            "oldStyleTemplates": [],
            "malformed": [],
        })
    );
}

#[test]
fn reason_codes_are_distinct_within_each_kind() {
    let codes = |all: &[&'static str]| all.iter().copied().collect::<BTreeSet<_>>().len() == all.len();
    assert!(codes(&ReleaseMetaSkip::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>()));
    assert!(codes(&ChannelCut::ALL.map(ChannelCut::as_str)));
    assert!(codes(&TemplateSkip::ALL.map(TemplateSkip::as_str)));
}
