//! The committed CRD YAML is exactly what the Rust types generate, and the generated schemas
//! keep the fields of real ModuleTemplates that our types do not model.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSONSchemaProps};

/// The committed CRDs, relative to the repository root.
const CRDS_FILE: &str = "deploy/crds/operator.kyma-project.io.yaml";
const REGENERATE: &str = "cargo run -- crds > deploy/crds/operator.kyma-project.io.yaml";

fn generated_yaml() -> String {
    catalogsync::api::crds_yaml().expect("the CRDs serialise to YAML")
}

/// The first line where `a` and `b` differ, 1-based, with both versions of it.
fn first_difference(a: &str, b: &str) -> Option<(usize, String, String)> {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (None, None) => return None,
            (x, y) if x == y => {}
            (x, y) => {
                let show = |l: Option<&str>| l.map_or_else(|| "<end of file>".to_owned(), str::to_owned);
                return Some((n, show(x), show(y)));
            }
        }
    }
    None
}

#[test]
fn committed_crds_match_the_generated_ones() {
    let path = testenv::repo_root().join(CRDS_FILE);
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("failed to read {CRDS_FILE}: {e}; generate it with `{REGENERATE}`"));
    let generated = generated_yaml();
    if committed != generated {
        let detail = match first_difference(&committed, &generated) {
            Some((line, have, want)) => {
                format!("first difference at line {line}:\n  committed: {have}\n  generated: {want}")
            }
            None => "the files differ only in line endings or the final newline".to_owned(),
        };
        panic!("{CRDS_FILE} is out of date with the Rust types; regenerate it with `{REGENERATE}`\n{detail}");
    }
}

#[test]
fn generated_yaml_is_the_three_crds() {
    let yaml = generated_yaml();
    assert_eq!(yaml.matches("---\n").count(), 3, "one document per kind");
    for name in [
        "kymas.operator.kyma-project.io",
        "moduletemplates.operator.kyma-project.io",
        "modulereleasemetas.operator.kyma-project.io",
    ] {
        assert!(yaml.contains(&format!("name: {name}\n")), "{name} is missing");
    }
}

/// The `openAPIV3Schema` of the only version of the CRD named `name`.
fn schema(name: &str) -> JSONSchemaProps {
    let crds: Vec<CustomResourceDefinition> = catalogsync::api::crds();
    let crd = crds.into_iter().find(|c| c.metadata.name.as_deref() == Some(name)).expect("the CRD is generated");
    let [version] = <[_; 1]>::try_from(crd.spec.versions).expect("exactly one version is served");
    assert_eq!(version.name, "v1beta2");
    version.schema.and_then(|s| s.open_api_v3_schema).expect("the version has a schema")
}

/// The property at `path` (for example `["spec", "data"]`) below `root`.
fn property<'a>(root: &'a JSONSchemaProps, path: &[&str]) -> &'a JSONSchemaProps {
    path.iter().fold(root, |props, key| {
        props
            .properties
            .as_ref()
            .and_then(|p| p.get(*key))
            .unwrap_or_else(|| panic!("the schema has no property {}", path.join(".")))
    })
}

#[test]
fn module_template_descriptor_and_data_keep_unknown_fields() {
    let root = schema("moduletemplates.operator.kyma-project.io");

    let descriptor = property(&root, &["spec", "descriptor"]);
    assert_eq!(descriptor.type_.as_deref(), Some("object"));
    assert_eq!(
        descriptor.x_kubernetes_preserve_unknown_fields,
        Some(true),
        "spec.descriptor must preserve unknown fields: it is a whole OCM component descriptor"
    );

    let data = property(&root, &["spec", "data"]);
    assert_eq!(data.type_.as_deref(), Some("object"));
    assert_eq!(
        data.x_kubernetes_preserve_unknown_fields,
        Some(true),
        "spec.data must preserve unknown fields: it is the module's default CR"
    );
    assert_eq!(
        data.x_kubernetes_embedded_resource,
        Some(true),
        "spec.data must be an embedded resource, as in lifecycle-manager's CRD"
    );
}
