use serde_json::json;

use super::*;

const NS: &str = "kyma-system";

fn listed() -> Expect<'static> {
    Expect::new(NS, PARTIAL_OBJECT_METADATA)
}

fn item(name: &str, rv: &str, managers: &[&str]) -> Value {
    let fields: Vec<Value> = managers
        .iter()
        .map(|m| json!({"manager": m, "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}}}}))
        .collect();
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": {"name": name, "namespace": NS, "resourceVersion": rv, "labels": {"a": "b"}, "managedFields": fields}})
}

fn metadata_page(items: Vec<Value>) -> Result<Page, InvalidAnswer> {
    let text = json!({"kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "9"}, "items": items});
    serde_json::from_str::<MetaOnlyList>(&text.to_string()).expect("parses").checked(listed())
}

#[test]
fn metadata_lists_keep_name_version_and_managers_only() {
    let page = metadata_page(vec![
        item("a", "1", &[SKR_FIELD_MANAGER]),
        item("b", "2", &["kubectl", "other"]),
        item("c", "3", &[]),
    ])
    .expect("valid");
    let summary: Vec<(&str, &str, bool)> =
        page.items.iter().map(|o| (o.name.as_str(), o.resource_version.as_str(), o.managed)).collect();
    assert_eq!(summary, [("a", "1", true), ("b", "2", false), ("c", "3", false)]);
    assert_eq!(page.next, None);
}

#[test]
fn nulls_read_as_empty() {
    let list: MetaOnlyList = serde_json::from_str(r#"{"items": null}"#).expect("parses");
    assert!(list.checked(listed()).expect("valid").items.is_empty());
    let one: MetaOnly = serde_json::from_str(
        r#"{"metadata": {"name": "x", "resourceVersion": null, "uid": null, "managedFields": [{"manager": null}]}}"#,
    )
    .expect("parses");
    let observed = one.checked(listed(), &LISTED).expect("valid");
    assert_eq!((observed.name.as_str(), observed.resource_version.as_str(), observed.managed), ("x", "", false));
}

#[test]
fn lists_keep_the_uid() {
    let mut copy = item("m-1", "7", &[SKR_FIELD_MANAGER]);
    copy["metadata"]["uid"] = json!("0a1b-uid");
    let page = metadata_page(vec![copy.clone()]).expect("valid");
    assert_eq!(page.items[0].uid, "0a1b-uid");
    copy["kind"] = json!("ModuleTemplate");
    let full = Expect::new(NS, "ModuleTemplate");
    let page = digest_list(json!({"items": [copy]}).to_string().as_bytes(), full).expect("parses");
    assert_eq!(page.items[0].uid, "0a1b-uid");
}

#[test]
fn full_lists_digest_each_item_with_its_metadata() {
    let mut copy = item("m-1", "7", &[SKR_FIELD_MANAGER]);
    copy["kind"] = json!("ModuleTemplate");
    copy["spec"] = json!({"descriptor": {"big": "x"}});
    let text = json!({"metadata": {"continue": "next-page"}, "items": [copy.clone()]}).to_string();
    let page = digest_list(text.as_bytes(), Expect::new(NS, "ModuleTemplate")).expect("parses");
    assert_eq!(page.next.as_deref(), Some("next-page"));
    let got = page.items;
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].name.as_str(), got[0].resource_version.as_str(), got[0].managed), ("m-1", "7", true));
    assert_eq!(got[0].content, Some(CopyDigest::of(&copy)));
}

/// Each field an SKR sends, over its bound or malformed: refused with the field's path and
/// never its value.
#[test]
fn every_kept_field_is_checked_and_named_never_quoted() {
    let long = |n: usize| "a".repeat(n);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("name too long", json!({"name": long(254)}), "items[].metadata.name"),
        ("name with a newline", json!({"name": "a\n{\"level\":\"ERROR\"}"}), "items[].metadata.name"),
        ("name upper case", json!({"name": "Keda"}), "items[].metadata.name"),
        ("empty name", json!({"name": ""}), "items[].metadata.name"),
        ("other namespace", json!({"name": "a", "namespace": "kube-system"}), "items[].metadata.namespace"),
        ("namespace too long", json!({"name": "a", "namespace": long(64)}), "items[].metadata.namespace"),
        ("uid too long", json!({"name": "a", "uid": long(37)}), "items[].metadata.uid"),
        ("uid with spaces", json!({"name": "a", "uid": "a b"}), "items[].metadata.uid"),
        ("rv too long", json!({"name": "a", "resourceVersion": long(1 << 20)}), "items[].metadata.resourceVersion"),
        ("rv with a newline", json!({"name": "a", "resourceVersion": "1\n2"}), "items[].metadata.resourceVersion"),
        (
            "manager too long",
            json!({"name": "a", "managedFields": [{"manager": long(129)}]}),
            "items[].metadata.managedFields[].manager",
        ),
    ];
    for (case, metadata, field) in cases {
        let item = json!({"kind": "PartialObjectMetadata", "metadata": metadata});
        let err = metadata_page(vec![item]).expect_err(case);
        assert_eq!(err.field, field, "{case}");
        assert!(!err.to_string().contains("aaaa") && !err.to_string().contains('\n'), "{case}: {err}");
    }
    let wrong_kind = json!({"kind": "Secret", "metadata": {"name": "a"}});
    assert_eq!(metadata_page(vec![wrong_kind]).expect_err("a Secret").field, "items[].kind");

    // The longest fields a real apiserver sends pass.
    let max = json!({"kind": "PartialObjectMetadata", "metadata": {"name": long(253), "namespace": NS,
        "uid": "0f9e8d7c-6b5a-4321-8fed-cba987654321", "resourceVersion": "18446744073709551615",
        "managedFields": [{"manager": long(128)}]}});
    metadata_page(vec![max]).expect("the longest valid fields");
}

#[test]
fn continue_tokens_are_bounded() {
    let page = |token: Value| {
        let text = json!({"metadata": {"continue": token}, "items": []}).to_string();
        serde_json::from_str::<MetaOnlyList>(&text).expect("parses").checked(listed())
    };
    assert_eq!(page(json!("eyJ2IjoibWV0YSJ9")).expect("valid").next.as_deref(), Some("eyJ2IjoibWV0YSJ9"));
    assert_eq!(page(json!("")).expect("valid").next, None);
    assert_eq!(page(json!("a".repeat(5000))).expect_err("too long").field, "metadata.continue");
    assert_eq!(page(json!("a\nb")).expect_err("a newline").field, "metadata.continue");
    let full = Expect::new(NS, "ModuleTemplate");
    let text = json!({"metadata": {"continue": "a".repeat(5000)}, "items": []}).to_string();
    assert!(matches!(digest_list(text.as_bytes(), full), Err(PageError::Invalid(e)) if e.field == "metadata.continue"));
}

#[test]
fn an_invalid_item_of_a_full_page_ends_the_page() {
    let full = Expect::new(NS, "ModuleTemplate");
    let good = json!({"kind": "ModuleTemplate", "metadata": {"name": "a", "resourceVersion": "1"}});
    let bad = json!({"kind": "ModuleTemplate", "metadata": {"name": "b".repeat(7 << 20)}});
    let text = json!({"items": [good, bad]}).to_string();
    match digest_list(text.as_bytes(), full) {
        Err(PageError::Invalid(e)) => assert_eq!(e.field, "items[].metadata.name"),
        other => panic!("expected an invalid name, got {other:?}"),
    }
    assert!(matches!(digest_list(b"{\"items\": [", full), Err(PageError::Parse(_))));
}

#[test]
fn an_apply_answer_about_another_object_or_with_an_odd_version_is_refused() {
    let answer = |metadata: Value| -> MetaOnly {
        serde_json::from_value(json!({"kind": "PartialObjectMetadata", "metadata": metadata})).expect("parses")
    };
    let ok = answer(json!({"name": "keda", "namespace": NS, "resourceVersion": "7",
                           "managedFields": [{"manager": SKR_FIELD_MANAGER}]}))
    .applied("keda", listed())
    .expect("valid");
    assert_eq!(ok, Applied { resource_version: "7".to_owned(), managers: vec![SKR_FIELD_MANAGER.to_owned()] });
    let err = answer(json!({"name": "other"})).applied("keda", listed()).expect_err("another object");
    assert_eq!(err.field, "metadata.name");
    let err = answer(json!({"name": "keda", "resourceVersion": "9".repeat(65)})).applied("keda", listed());
    assert_eq!(err.expect_err("too long").field, "metadata.resourceVersion");
}

#[test]
fn dns_subdomains() {
    for ok in ["a", "btp-operator-1.1.0", "0", &"a".repeat(253)] {
        assert!(is_dns_subdomain(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", ".a", "A", "a_b", "a b", "ä", &"a".repeat(254)] {
        assert!(!is_dns_subdomain(bad), "{bad}");
    }
}

/// Of a full list, only the desired objects' content is kept: the labels and annotations of
/// the others are not held until the list ends.
#[test]
fn a_full_list_keeps_the_content_of_desired_objects_only() {
    let kcp = crate::fixtures::MtBuilder::new("keda", "1.0.0").build();
    let copy = crate::catalog::render::render_copy(&kcp, crate::catalog::CatalogKind::ModuleTemplate, NS);
    let (body, hash) = crate::catalog::serialize_copy(&copy);
    let digest = std::sync::Arc::new(CopyDigest::of(&copy));
    let desired: BTreeMap<String, DesiredObject> =
        [("keda-1.0.0".to_owned(), DesiredObject { name: "keda-1.0.0".to_owned(), digest, body, hash })].into();
    let big =
        json!({"kind": "ModuleTemplate", "metadata": {"name": "someone-else", "annotations": {"a": "x".repeat(1000)}}});
    let mut ours = copy.clone();
    ours["kind"] = json!("ModuleTemplate");
    ours["metadata"]["name"] = json!("keda-1.0.0");
    let text = json!({"items": [ours, big]}).to_string();
    let expect = Expect { content_of: Some(&desired), ..Expect::new(NS, "ModuleTemplate") };
    let page = digest_list(text.as_bytes(), expect).expect("parses");
    let content: Vec<(&str, bool)> = page.items.iter().map(|o| (o.name.as_str(), o.content.is_some())).collect();
    assert_eq!(content, [("keda-1.0.0", true), ("someone-else", false)]);
}

#[test]
fn a_namespace_being_deleted_is_told_from_one_that_stands() {
    let read = |v: Value| serde_json::from_value::<Labelled>(v).expect("parses");
    let standing = read(json!({"metadata": {"name": NS, "labels": {"operator.kyma-project.io/managed-by": "kyma"}}}));
    assert!(standing.has("operator.kyma-project.io/managed-by", "kyma"));
    assert!(!standing.is_deleting());
    let deleting = read(json!({"metadata": {"name": NS, "deletionTimestamp": "2026-12-04T19:00:00Z",
                                            "labels": {"operator.kyma-project.io/managed-by": "kyma"}}}));
    assert!(deleting.is_deleting(), "labelled, but being deleted");
    assert!(!read(json!({"metadata": {"deletionTimestamp": null}})).is_deleting());
}
