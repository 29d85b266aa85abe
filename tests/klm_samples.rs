//! lifecycle-manager's own ModuleTemplates (its history and integration samples, read from
//! `../shared/klm-samples`, which is not part of this repository): the old-style ones, with a
//! `spec` but no `moduleName`, are left out as lifecycle-manager leaves them out, and none of them
//! is malformed.

use std::path::PathBuf;

use catalogsync::catalog::Snapshot;
use kube::api::DynamicObject;

/// Every ModuleTemplate of the sample files whose name starts with one of `prefixes`.
fn sample_templates(prefixes: &[&str]) -> Vec<DynamicObject> {
    let dir: PathBuf = testenv::repo_root().join("../shared/klm-samples/objects");
    assert!(dir.is_dir(), "the KLM samples are not at {}", dir.display());
    let entries = std::fs::read_dir(&dir).expect("list the KLM samples");
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| prefixes.iter().any(|pre| n.starts_with(pre)))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a sample");
        for doc in testenv::parse_yaml_docs(&text).expect("samples are YAML") {
            if doc["kind"] == "ModuleTemplate" {
                out.push(serde_json::from_value(doc).expect("a sample is a Kubernetes object"));
            }
        }
    }
    out
}

#[test]
fn old_style_samples_are_left_out_and_none_is_malformed() {
    let templates = sample_templates(&["history_", "mt_"]);
    assert!(templates.len() >= 9, "found only {} sample ModuleTemplates", templates.len());
    let old_style: Vec<String> = templates
        .iter()
        .filter(|t| t.data["spec"].get("moduleName").is_none())
        .filter_map(|t| t.metadata.name.clone())
        .collect();
    assert!(!old_style.is_empty(), "the samples hold old-style templates");

    let snap = Snapshot::build(templates.iter(), std::iter::empty(), "kyma-system");
    assert!(snap.malformed.is_empty(), "malformed: {:?}", snap.malformed);
    let mut unnamed = snap.unnamed_templates.clone();
    unnamed.sort();
    let mut expected = old_style;
    expected.sort();
    assert_eq!(unnamed, expected);
    assert_eq!(snap.templates.len(), templates.len() - unnamed.len(), "every other template is read");
}
