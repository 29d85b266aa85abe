//! Turns a KCP catalog object into the body catalogsync applies to an SKR (pure).
//!
//! A copy is the body lifecycle-manager (KLM) applies for the same object, so that either
//! applier's server-side apply, under the shared field manager `catalog-sync`, is a no-op
//! against a copy the other wrote (docs/catalog-rules.md R3.3; docs/migration.md):
//!
//! - `metadata`: the name, the namespace rewritten to the sync namespace, the KCP labels with
//!   `operator.kyma-project.io/managed-by=kyma` merged in, and the KCP annotations, all of
//!   them (`kubectl.kubernetes.io/last-applied-configuration` included, as KLM keeps it).
//!   Identity and history go (`resourceVersion`, `uid`, `managedFields`; `creationTimestamp`
//!   and `generation`, which KLM sends and the apiserver ignores). So do `ownerReferences`
//!   and `finalizers`, which KLM keeps: an owner reference names a KCP UID that the SKR's
//!   garbage collector cannot find (it would delete the copy), and nothing in the SKR would
//!   ever remove a KCP finalizer (the copy could not be deleted). A copy that carries them
//!   still counts as holding the desired copy ([`copy_matches`]), so catalogsync does not
//!   fight KLM over them.
//! - `spec`: the KCP spec as KLM's typed Go structs encode it ([`typed_spec`]): a field
//!   without `omitempty` is always sent, its zero value when the KCP object has none
//!   (ModuleTemplate `channel`, `version`, `moduleName`: `""`; `mandatory`,
//!   `requiresDowntime`: `false`; ModuleReleaseMeta `beta`, `internal`: `false`), and an
//!   empty `omitempty` field is left out.
use kube::api::DynamicObject;
use serde_json::{Map, Value, json};

use crate::api::{GROUP, MANAGED_BY_LABEL, MANAGED_BY_VALUE, VERSION};
use crate::catalog::CatalogKind;

/// Renders the SKR copy of `obj` (a KCP object of `kind`) for namespace `sync_namespace`.
pub fn render_copy(obj: &DynamicObject, kind: CatalogKind, sync_namespace: &str) -> Value {
    let meta = &obj.metadata;
    let mut labels: Map<String, Value> =
        meta.labels.iter().flatten().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    labels.insert(MANAGED_BY_LABEL.to_owned(), Value::String(MANAGED_BY_VALUE.to_owned()));
    let annotations: Map<String, Value> =
        meta.annotations.iter().flatten().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();

    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(meta.name.clone().unwrap_or_default()));
    metadata.insert("namespace".into(), json!(sync_namespace));
    metadata.insert("labels".into(), Value::Object(labels));
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }

    let mut body = Map::new();
    body.insert("apiVersion".into(), json!(format!("{GROUP}/{VERSION}")));
    body.insert("kind".into(), json!(kind.as_str()));
    body.insert("metadata".into(), Value::Object(metadata));
    if let Value::Object(data) = &obj.data {
        for (k, v) in data {
            // The catalog kinds have no status; never carry one (or stray identity fields) over.
            if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
                body.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(Value::Object(spec)) = body.get_mut("spec") {
        typed_spec(kind, spec);
    }
    Value::Object(body)
}

/// Rewrites a catalog `spec` as KLM's Go types encode it after decoding it (its
/// `api/v1beta2` types at the commit docs/klm-reference.md names): every field without
/// `omitempty` present (its zero value when missing or null), every empty `omitempty` field
/// absent. `descriptor` and `data` are raw JSON to both and stay as they are.
pub fn typed_spec(kind: CatalogKind, spec: &mut Map<String, Value>) {
    match kind {
        CatalogKind::ModuleTemplate => {
            always(spec, &["channel", "version", "moduleName"], &json!(""));
            always(spec, &["mandatory", "requiresDowntime"], &json!(false));
            omit_empty(spec, &["customStateCheck", "resources", "associatedResources", "info", "manager"]);
            items(spec, "customStateCheck", |i| always(i, &["jsonPath", "value", "mappedState"], &json!("")));
            items(spec, "resources", |i| always(i, &["name", "link"], &json!("")));
            items(spec, "associatedResources", |i| always(i, &["group", "version", "kind"], &json!("")));
            if let Some(Value::Object(manager)) = spec.get_mut("manager") {
                always(manager, &["group", "version", "kind", "name"], &json!(""));
                omit_empty(manager, &["namespace"]);
            }
            if let Some(Value::Object(info)) = spec.get_mut("info") {
                always(info, &["repository", "documentation"], &json!(""));
                omit_empty(info, &["icons"]);
                items(info, "icons", |i| always(i, &["name", "link"], &json!("")));
            }
        }
        CatalogKind::ModuleReleaseMeta => {
            always(spec, &["moduleName"], &json!(""));
            always(spec, &["beta", "internal"], &json!(false));
            omit_empty(spec, &["ocmComponentName", "channels", "mandatory", "kymaSelector"]);
            items(spec, "channels", |i| always(i, &["channel", "version"], &json!("")));
            if let Some(Value::Object(mandatory)) = spec.get_mut("mandatory") {
                always(mandatory, &["version"], &json!(""));
            }
            if let Some(Value::Object(selector)) = spec.get_mut("kymaSelector") {
                omit_empty(selector, &["matchLabels", "matchExpressions"]);
                items(selector, "matchExpressions", |i| {
                    always(i, &["key", "operator"], &json!(""));
                    omit_empty(i, &["values"]);
                });
            }
        }
    }
}

/// Go's encoding of a field without `omitempty`: always there, `zero` when missing or null.
fn always(obj: &mut Map<String, Value>, fields: &[&str], zero: &Value) {
    for field in fields {
        let slot = obj.entry(*field).or_insert(Value::Null);
        if slot.is_null() {
            *slot = zero.clone();
        }
    }
}

/// Go's encoding of an `omitempty` field: absent when null, an empty string, list or map. (A
/// pointer to a struct is omitted only when nil, so `{}` stays for those; the maps and lists
/// named here are Go maps and slices, whose empty values are omitted.)
fn omit_empty(obj: &mut Map<String, Value>, fields: &[&str]) {
    for field in fields {
        let empty = match obj.get(*field) {
            Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(o)) => o.is_empty() && matches!(*field, "matchLabels"),
            _ => false,
        };
        if empty {
            obj.remove(*field);
        }
    }
}

/// Applies `f` to every object in the list `obj[field]`.
fn items(obj: &mut Map<String, Value>, field: &str, f: impl Fn(&mut Map<String, Value>)) {
    if let Some(Value::Array(list)) = obj.get_mut(field) {
        list.iter_mut().filter_map(Value::as_object_mut).for_each(f);
    }
}

/// Whether an observed SKR object already holds `desired`: equal `spec`, and every desired
/// label and annotation present with the same value. Extra labels or annotations that others
/// put on the copy do not count as drift: server-side apply would not remove them either.
pub fn copy_matches(desired: &Value, observed: &Value) -> bool {
    desired.get("spec") == observed.get("spec")
        && ["labels", "annotations"].iter().all(|field| {
            carries(desired, field, observed.pointer(&format!("/metadata/{field}")).and_then(Value::as_object))
        })
}

/// Whether `have` holds every entry of `desired`'s `metadata.<field>` with the same value.
fn carries(desired: &Value, field: &str, have: Option<&Map<String, Value>>) -> bool {
    let want = desired.pointer(&format!("/metadata/{field}")).and_then(Value::as_object);
    want.into_iter().flatten().all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
}

/// What decides whether one copy holds another: the content hash of its `spec` and its
/// labels and annotations. A cold sync keeps this of each copy it lists in full, and the
/// snapshot keeps it of each desired copy (beside its serialized body), so that
/// [`CopyDigest::holds`] gives the verdict of [`copy_matches`] at a small fraction of the
/// memory of the objects (a ModuleTemplate's `spec` carries a descriptor of about 30 KB) and
/// without hashing a desired `spec` per SKR.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyDigest {
    spec_hash: Option<u64>,
    labels: Map<String, Value>,
    annotations: Map<String, Value>,
}

impl CopyDigest {
    /// The digest of a copy: an observed SKR object, or a rendered copy to compare with one.
    pub fn of(observed: &Value) -> Self {
        let map = |field: &str| {
            observed.pointer(&format!("/metadata/{field}")).and_then(Value::as_object).cloned().unwrap_or_default()
        };
        Self {
            spec_hash: observed.get("spec").map(crate::catalog::content_hash),
            labels: map("labels"),
            annotations: map("annotations"),
        }
    }

    /// Whether the object this is the digest of already holds the copy `desired` is the
    /// digest of: the same verdict as `copy_matches(desired, observed)` on the two objects
    /// (equal `spec`, and every desired label and annotation present with its value).
    pub fn holds(&self, desired: &CopyDigest) -> bool {
        let subset =
            |want: &Map<String, Value>, have: &Map<String, Value>| want.iter().all(|(k, v)| have.get(k) == Some(v));
        self.spec_hash == desired.spec_hash
            && subset(&desired.labels, &self.labels)
            && subset(&desired.annotations, &self.annotations)
    }
}

/// Whether every field of `desired` is present in `observed` with the same value, recursing
/// into objects; arrays must have equal length and match element-wise. Used for CRDs, where
/// the apiserver adds defaults to what was written.
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d.iter().all(|(k, v)| o.get(k).is_some_and(|ov| is_subset(v, ov))),
        (Value::Array(d), Value::Array(o)) => d.len() == o.len() && d.iter().zip(o).all(|(a, b)| is_subset(a, b)),
        (d, o) => d == o,
    }
}

#[cfg(test)]
mod tests {
    use kube::api::{ApiResource, ObjectMeta};
    use serde_json::json;

    use super::*;
    use crate::api::LAST_APPLIED_ANNOTATION;

    fn kcp_object() -> DynamicObject {
        let ar = ApiResource::erase::<crate::api::ModuleTemplate>(&());
        let mut obj = DynamicObject::new("btp-operator-1.1.0", &ar).within("kcp-system");
        obj.metadata = ObjectMeta {
            name: Some("btp-operator-1.1.0".into()),
            namespace: Some("kcp-system".into()),
            uid: Some("0c5a".into()),
            resource_version: Some("42".into()),
            generation: Some(3),
            finalizers: Some(vec!["operator.kyma-project.io/mandatory-module".into()]),
            labels: Some([("operator.kyma-project.io/beta".to_owned(), "true".to_owned())].into()),
            annotations: Some(
                [
                    (LAST_APPLIED_ANNOTATION.to_owned(), "{}".to_owned()),
                    ("argocd.argoproj.io/tracking-id".to_owned(), "x".to_owned()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        };
        obj.data = json!({"spec": {"moduleName": "btp-operator", "version": "1.1.0", "descriptor": {"x": 1}}});
        obj
    }

    #[test]
    fn render_strips_identity_and_rewrites_namespace() {
        let copy = render_copy(&kcp_object(), CatalogKind::ModuleTemplate, "kyma-system");
        assert_eq!(
            copy,
            json!({
                "apiVersion": "operator.kyma-project.io/v1beta2",
                "kind": "ModuleTemplate",
                "metadata": {
                    "name": "btp-operator-1.1.0",
                    "namespace": "kyma-system",
                    "labels": {"operator.kyma-project.io/beta": "true", "operator.kyma-project.io/managed-by": "kyma"},
                    "annotations": {LAST_APPLIED_ANNOTATION: "{}", "argocd.argoproj.io/tracking-id": "x"},
                },
                "spec": {
                    "moduleName": "btp-operator",
                    "version": "1.1.0",
                    "channel": "",
                    "mandatory": false,
                    "requiresDowntime": false,
                    "descriptor": {"x": 1},
                },
            })
        );
    }

    #[test]
    fn typed_spec_sends_what_go_sends() {
        let mut mt = json!({
            "moduleName": "m", "version": null, "descriptor": {"resources": []}, "data": {},
            "resources": [], "customStateCheck": [{"jsonPath": "a"}],
            "associatedResources": [{"version": "v1", "kind": "Pod"}],
            "info": {"repository": "r", "icons": []}, "manager": {"kind": "Deployment", "name": "d", "namespace": ""},
        });
        typed_spec(CatalogKind::ModuleTemplate, mt.as_object_mut().expect("object"));
        assert_eq!(
            mt,
            json!({
                "moduleName": "m", "version": "", "channel": "", "mandatory": false, "requiresDowntime": false,
                "descriptor": {"resources": []}, "data": {},
                "customStateCheck": [{"jsonPath": "a", "value": "", "mappedState": ""}],
                "associatedResources": [{"group": "", "version": "v1", "kind": "Pod"}],
                "info": {"repository": "r", "documentation": ""},
                "manager": {"group": "", "version": "", "kind": "Deployment", "name": "d"},
            })
        );
        let mut mrm = json!({
            "moduleName": "m", "ocmComponentName": "", "channels": [{"channel": "regular", "version": "1.0.0"}],
            "kymaSelector": {"matchLabels": {}, "matchExpressions": [{"key": "k", "operator": "Exists", "values": []}]},
        });
        typed_spec(CatalogKind::ModuleReleaseMeta, mrm.as_object_mut().expect("object"));
        assert_eq!(
            mrm,
            json!({
                "moduleName": "m", "beta": false, "internal": false,
                "channels": [{"channel": "regular", "version": "1.0.0"}],
                "kymaSelector": {"matchExpressions": [{"key": "k", "operator": "Exists"}]},
            })
        );
        let mut mandatory = json!({"moduleName": "m", "mandatory": {}, "kymaSelector": {}});
        typed_spec(CatalogKind::ModuleReleaseMeta, mandatory.as_object_mut().expect("object"));
        assert_eq!(mandatory["mandatory"], json!({"version": ""}), "a non-nil pointer to a struct stays");
        assert_eq!(mandatory["kymaSelector"], json!({}));
    }

    #[test]
    fn typed_spec_is_idempotent() {
        let mut once = render_copy(&kcp_object(), CatalogKind::ModuleTemplate, "kyma-system");
        let twice = once.clone();
        typed_spec(CatalogKind::ModuleTemplate, once["spec"].as_object_mut().expect("object"));
        assert_eq!(once, twice);
    }

    #[test]
    fn copy_matches_ignores_extra_metadata_but_not_spec() {
        let desired = render_copy(&kcp_object(), CatalogKind::ModuleTemplate, "kyma-system");
        let mut observed = desired.clone();
        observed["metadata"]["labels"]["extra"] = json!("1");
        observed["metadata"]["resourceVersion"] = json!("7");
        assert!(copy_matches(&desired, &observed));
        observed["spec"]["version"] = json!("9.9.9");
        assert!(!copy_matches(&desired, &observed));
        let mut relabelled = desired.clone();
        relabelled["metadata"]["labels"]["operator.kyma-project.io/beta"] = json!("false");
        assert!(!copy_matches(&desired, &relabelled));
    }

    #[test]
    fn subset_tolerates_defaults_only() {
        let d = json!({"a": {"b": [1, {"c": 2}]}});
        assert!(is_subset(&d, &json!({"a": {"b": [1, {"c": 2, "x": 0}], "y": 1}})));
        assert!(!is_subset(&d, &json!({"a": {"b": [1]}})));
        assert!(!is_subset(&d, &json!({"a": {"b": [1, {"c": 3}]}})));
    }

    #[test]
    fn copy_digest_agrees_with_copy_matches() {
        let desired = render_copy(&kcp_object(), CatalogKind::ModuleTemplate, "kyma-system");
        type Edit = Box<dyn Fn(&mut Value)>;
        let edits: Vec<(&str, Edit)> = vec![
            ("identical", Box::new(|_| {})),
            ("server metadata added", Box::new(|o| o["metadata"]["resourceVersion"] = json!("7"))),
            ("foreign label added", Box::new(|o| o["metadata"]["labels"]["team"] = json!("x"))),
            ("foreign annotation added", Box::new(|o| o["metadata"]["annotations"]["note"] = json!("y"))),
            ("spec field changed", Box::new(|o| o["spec"]["version"] = json!("0.0.1"))),
            ("spec field added", Box::new(|o| o["spec"]["extra"] = json!(true))),
            ("spec removed", Box::new(|o| drop(o.as_object_mut().map(|m| m.remove("spec"))))),
            ("desired label removed", Box::new(|o| o["metadata"]["labels"] = json!({}))),
            ("desired label changed", Box::new(|o| o["metadata"]["labels"][MANAGED_BY_LABEL] = json!("other"))),
        ];
        for (what, edit) in edits {
            let mut observed = desired.clone();
            edit(&mut observed);
            assert_eq!(
                CopyDigest::of(&observed).holds(&CopyDigest::of(&desired)),
                copy_matches(&desired, &observed),
                "digest and copy_matches disagree on: {what}"
            );
        }
    }
}
