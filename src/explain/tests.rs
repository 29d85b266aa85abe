//! The report of `catalogsync explain`, without clusters: its JSON shape, its tables, and
//! what it prints of an SKR (hostile names included) and of a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::ObjectMeta;
use serde_json::json;

use super::*;
use crate::catalog::plan::Observed;
use crate::catalog::render::CopyDigest;
use crate::fixtures::{MrmBuilder, MtBuilder, kyma_labels, snapshot};

fn kyma(labels: &[(&str, &str)]) -> PartialObjectMeta<Kyma> {
    PartialObjectMeta {
        types: None,
        metadata: ObjectMeta {
            name: Some("kyma-1".into()),
            namespace: Some("kcp-system".into()),
            labels: Some(kyma_labels(labels)),
            ..ObjectMeta::default()
        },
        _phantom: std::marker::PhantomData,
    }
}

fn report(labels: &[(&str, &str)]) -> Report {
    let mts = vec![
        MtBuilder::new("keda", "1.0.0").build(),
        MtBuilder::new("keda", "1.1.0").beta().build(),
        MtBuilder::new("sap-btp", "1.0.0").build(),
        MtBuilder::new("legacy", "1.0.0").without_spec_field("moduleName").build(),
    ];
    let mrms = vec![
        MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.1.0").build(),
        MrmBuilder::new("sap-btp").channel("regular", "1.0.0").build(),
    ];
    kcp_report(&kyma(labels), "kcp-system", &snapshot(&mts, &mrms), BTreeSet::from(["sap-btp".to_owned()]))
}

#[test]
fn json_has_the_documented_top_level_fields() {
    let value = serde_json::to_value(report(&[])).expect("serialises");
    let fields: BTreeSet<&str> = value.as_object().expect("an object").keys().map(String::as_str).collect();
    assert_eq!(
        fields,
        BTreeSet::from([
            "kyma",
            "restrictedModules",
            "desired",
            "moduleReleaseMetas",
            "moduleTemplates",
            "oldStyleTemplates",
            "malformed",
            "skr",
        ])
    );
    assert_eq!(
        value["kyma"],
        json!({"name": "kyma-1", "namespace": "kcp-system", "beta": false, "internal": false, "leftAlone": null})
    );
    assert_eq!(value["desired"], json!({"moduleReleaseMetas": ["keda"], "moduleTemplates": ["keda-1.0.0"]}));
    assert_eq!(value["restrictedModules"], json!(["sap-btp"]));
    assert_eq!(value["oldStyleTemplates"], json!(["legacy-1.0.0"]));
    assert_eq!(value["skr"], json!(null));
}

#[test]
fn a_kyma_the_controller_leaves_alone_says_so() {
    let skipped = report(&[(SKIP_RECONCILIATION_LABEL, "True")]);
    assert_eq!(skipped.kyma.left_alone, Some("skip_reconciliation"));
    assert!(skipped.render(OutputFormat::Table).contains("leaves this Kyma alone (skip_reconciliation)"));
    let mut deleting = kyma(&[]);
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    assert_eq!(left_alone(&deleting), Some("deleting"));
    assert_eq!(report(&[]).kyma.left_alone, None);
}

#[test]
fn the_table_gives_every_verdict_with_its_reason() {
    let text = report(&[]).render(OutputFormat::Table);
    let line = |start: &str| {
        text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no line {start:?} in\n{text}")).to_owned()
    };
    assert!(line("Kyma:").ends_with("kcp-system/kyma-1"), "{text}");
    assert_eq!(line("Restricted:"), "Restricted:  sap-btp");
    let keda = line("keda ");
    assert!(keda.contains("yes") && keda.contains("regular=1.0.0, fast=1.1.0 [cut: template_beta]"), "{keda}");
    assert!(line("sap-btp ").contains("restricted_without_selector"), "{text}");
    assert!(line("keda-1.1.0").contains(" beta"), "{text}");
    let btp = line("sap-btp-1.0.0");
    assert!(btp.contains("not_referenced") && btp.contains("restricted_without_selector"), "{btp}");
    assert_eq!(line("legacy-1.0.0"), "legacy-1.0.0");
    assert!(!text.contains("\nSKR"), "no SKR section without --skr");
}

fn observed(name: &str, managed: bool, content: Option<CopyDigest>) -> Observed {
    Observed { name: name.to_owned(), uid: "u".into(), resource_version: "1".into(), managed, content }
}

#[test]
fn the_skr_section_counts_and_names_each_bucket() {
    let mut r = report(&[]);
    let desired = &r.explanation.desired;
    let mt = &desired.templates["keda-1.0.0"];
    let mrm_digest = Arc::clone(&desired.release_metas["keda"].digest);
    let hostile = "evil\u{1b}]0;owned\u{7}".to_owned() + &"x".repeat(600);
    let held = BTreeMap::from([
        (
            CatalogKind::ModuleTemplate,
            vec![
                observed("keda-1.0.0", true, Some((*mt.digest).clone())),
                observed("keda-0.9.0", true, None),
                observed(&hostile, false, None),
            ],
        ),
        (CatalogKind::ModuleReleaseMeta, vec![observed("keda", true, Some((*mrm_digest).clone()))]),
    ]);
    let mut skr = SkrReport::new("kyma-system", Some("kyma-1".into()));
    skr.compare(&Comparison::build(desired, &held));
    r.skr = Some(skr);
    let skr = r.skr.as_ref().expect("set");
    assert_eq!(skr.agrees, Some(false));
    let mts = skr.module_templates.as_ref().expect("read");
    assert_eq!(mts.in_agreement, ["keda-1.0.0"]);
    assert_eq!(mts.extra, ["keda-0.9.0"]);
    assert_eq!(mts.user_owned.len(), 1);
    assert!(!mts.user_owned[0].chars().any(char::is_control), "an SKR's name is printed as it is");
    assert!(mts.user_owned[0].chars().count() <= SKR_NAME_CHARS + 3);

    let text = r.render(OutputFormat::Table);
    assert!(text.contains("SKR (namespace kyma-system, access Secret kyma-1)"), "{text}");
    assert!(text.contains("ModuleTemplate extra (a sync prunes it): keda-0.9.0"), "{text}");
    assert!(text.contains("does not hold the desired catalog"), "{text}");
    let json = serde_json::to_value(&r).expect("serialises");
    assert_eq!(
        json["skr"]["moduleReleaseMetas"],
        json!({"inAgreement": ["keda"], "missing": [], "different": [], "extra": [], "userOwned": []})
    );
    assert_eq!(json["skr"]["agrees"], json!(false));
    assert_eq!(json["skr"]["error"], json!(null));
}

#[test]
fn an_skr_failure_is_reported_as_the_condition_would_report_it() {
    let mut r = report(&[]);
    let mut skr = SkrReport::new("kyma-system", None);
    skr.fail(&SyncError::AccessSecretMissing { kyma: "kyma-1".into(), namespace: "kcp-system".into() });
    r.skr = Some(skr);
    let json = serde_json::to_value(&r).expect("serialises");
    assert_eq!(json["skr"]["error"]["reason"], json!("AccessSecretMissing"));
    assert_eq!(json["skr"]["agrees"], json!(null));
    assert_eq!(json["skr"]["moduleTemplates"], json!(null));
    let text = r.render(OutputFormat::Table);
    assert!(text.contains("not read: AccessSecretMissing: found no access secret labelled"), "{text}");
    // The KCP part is there all the same.
    assert!(text.contains("keda-1.0.0"), "{text}");
}

#[test]
fn names_that_are_no_object_names_or_label_values_are_recognised() {
    for good in ["kyma-1", "b6f1a2c4-0d8e-4f5e-9a1b-2c3d4e5f6a7b", "a.b"] {
        assert!(is_dns_subdomain(good), "{good}");
        assert!(is_label_value(good), "{good}");
    }
    for bad in ["", "Kyma", "a,metadata.namespace=x", "-a", "a..b", &"a".repeat(254)] {
        assert!(!is_dns_subdomain(bad), "{bad}");
    }
    assert!(!is_label_value(&"a".repeat(64)));
    assert!(!is_label_value("a=b"));
}

#[test]
fn docs_list_every_reason_code_and_json_field() {
    use crate::catalog::desired::{ChannelCut, ReleaseMetaSkip, TemplateSkip};
    let doc = include_str!("../../docs/explain.md");
    let codes = ReleaseMetaSkip::ALL
        .iter()
        .map(|r| r.as_str())
        .chain(ChannelCut::ALL.map(ChannelCut::as_str))
        .chain(TemplateSkip::ALL.map(TemplateSkip::as_str));
    for code in codes {
        assert!(doc.contains(&format!("| `{code}` |")), "docs/explain.md has no row for reason `{code}`");
    }
    for field in ["leftAlone", "restrictedModules", "oldStyleTemplates", "accessSecret", "userOwned", "survives"] {
        assert!(doc.contains(&format!("`{field}`")) || doc.contains(&format!(".{field}`")), "no field {field}");
    }
}
