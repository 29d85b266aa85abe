//! Validation as apimachinery's `LabelSelectorAsSelector` does it, and matching.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use proptest::prelude::*;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.iter().map(|s| (*s).to_owned()).collect()),
        }]),
    }
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector { match_labels: Some(labels(pairs)), match_expressions: None }
}

fn parse(selector: &LabelSelector) -> KymaSelector {
    KymaSelector::parse(selector).unwrap_or_else(|e| panic!("{selector:?} is valid: {e}"))
}

/// A DNS-1123 subdomain of exactly `len` characters: parts of 63 characters joined by dots.
fn subdomain(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        if !out.is_empty() {
            out.push('.');
        }
        let part = (len - out.len()).min(63);
        out.push_str(&"a".repeat(part));
    }
    assert_eq!(out.len(), len);
    out
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

#[test]
fn qualified_names_are_valid_keys() {
    let name63 = "n".repeat(63);
    let prefix253 = format!("{}/x", subdomain(253));
    let keys = [
        "a",
        "Z",
        "0",
        "region",
        "MyName",
        "my.name",
        "123-abc",
        "a_b-c.d",
        "kyma-project.io/region",
        "operator.kyma-project.io/beta",
        "example.com/MyName",
        "a/B",
        "1.2.3/x",
        "a-b.c-d/e",
        name63.as_str(),
        prefix253.as_str(),
    ];
    for key in keys {
        assert_eq!(key_problem(key), None, "{key:?}");
        assert!(KymaSelector::parse(&expr(key, "Exists", None)).is_ok(), "{key:?}");
        assert!(KymaSelector::parse(&match_labels(&[(key, "v")])).is_ok(), "{key:?}");
    }
}

#[test]
fn keys_that_are_not_qualified_names_are_rejected_with_the_rule_they_break() {
    let name64 = "n".repeat(64);
    let prefixed_name64 = format!("example.com/{name64}");
    let prefix254 = format!("{}/x", subdomain(254));
    let cases = [
        ("", KEY_EMPTY_NAME),
        ("/a", KEY_EMPTY_PREFIX),
        ("/", KEY_EMPTY_PREFIX),
        ("a/", KEY_EMPTY_NAME),
        ("a/b/c", KEY_TOO_MANY_SLASHES),
        ("//", KEY_TOO_MANY_SLASHES),
        ("-a", KEY_NAME_CHARS),
        ("a-", KEY_NAME_CHARS),
        (".a", KEY_NAME_CHARS),
        ("_a", KEY_NAME_CHARS),
        ("a b", KEY_NAME_CHARS),
        ("bad key!", KEY_NAME_CHARS),
        ("not a valid key!", KEY_NAME_CHARS),
        ("région", KEY_NAME_CHARS),
        ("a\n", KEY_NAME_CHARS),
        (name64.as_str(), KEY_NAME_TOO_LONG),
        (prefixed_name64.as_str(), KEY_NAME_TOO_LONG),
        (prefix254.as_str(), KEY_PREFIX_TOO_LONG),
        ("Example.com/a", KEY_PREFIX_NOT_SUBDOMAIN),
        ("EXAMPLE/a", KEY_PREFIX_NOT_SUBDOMAIN),
        ("exa_mple.com/a", KEY_PREFIX_NOT_SUBDOMAIN),
        ("a..b/c", KEY_PREFIX_NOT_SUBDOMAIN),
        (".a/c", KEY_PREFIX_NOT_SUBDOMAIN),
        ("a./c", KEY_PREFIX_NOT_SUBDOMAIN),
        ("-a.com/c", KEY_PREFIX_NOT_SUBDOMAIN),
        ("a-.com/c", KEY_PREFIX_NOT_SUBDOMAIN),
        ("a b/c", KEY_PREFIX_NOT_SUBDOMAIN),
        ("example.com/-x", KEY_NAME_CHARS),
    ];
    for (key, problem) in cases {
        assert_eq!(key_problem(key), Some(problem), "{key:?}");
        for (selector, field) in
            [(expr(key, "NotIn", Some(&["x"])), "matchExpressions"), (match_labels(&[(key, "v")]), "matchLabels")]
        {
            assert_eq!(
                KymaSelector::parse(&selector),
                Err(SelectorError::InvalidKey { key: Shown::new(key), field, problem }),
                "{key:?}"
            );
        }
    }
}

#[test]
fn upper_case_is_fine_in_the_name_but_not_in_the_prefix() {
    assert_eq!(key_problem("example.com/UPPER"), None);
    assert_eq!(key_problem("UPPER"), None);
    assert_eq!(key_problem("Example.com/upper"), Some(KEY_PREFIX_NOT_SUBDOMAIN));
}

#[test]
fn name_and_prefix_lengths_stop_exactly_at_the_kubernetes_limits() {
    assert_eq!(key_problem(&"a".repeat(63)), None);
    assert_eq!(key_problem(&"a".repeat(64)), Some(KEY_NAME_TOO_LONG));
    assert_eq!(key_problem(&format!("{}/a", subdomain(253))), None);
    assert_eq!(key_problem(&format!("{}/a", subdomain(254))), Some(KEY_PREFIX_TOO_LONG));
    // A subdomain has no limit per dot-separated part, only in total.
    assert_eq!(key_problem(&format!("{}/a", "b".repeat(200))), None);
}

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

#[test]
fn valid_label_values_are_accepted() {
    let value63 = "v".repeat(63);
    for value in ["", "a", "Z9", "eu", "my_value", "12345", "a.b-c_d", "A-1", value63.as_str()] {
        assert_eq!(value_problem(value), None, "{value:?}");
        assert!(KymaSelector::parse(&expr("k", "In", Some(&[value]))).is_ok(), "{value:?}");
        assert!(KymaSelector::parse(&match_labels(&[("k", value)])).is_ok(), "{value:?}");
    }
}

#[test]
fn invalid_label_values_are_rejected_with_the_rule_they_break() {
    let value64 = "v".repeat(64);
    let cases = [
        (value64.as_str(), VALUE_TOO_LONG),
        (".a", VALUE_CHARS),
        ("a.", VALUE_CHARS),
        ("-a", VALUE_CHARS),
        ("_a", VALUE_CHARS),
        ("a b", VALUE_CHARS),
        (" ", VALUE_CHARS),
        ("a/b", VALUE_CHARS),
        ("ü", VALUE_CHARS),
        ("a\tb", VALUE_CHARS),
    ];
    for (value, problem) in cases {
        assert_eq!(value_problem(value), Some(problem), "{value:?}");
        for op in ["In", "NotIn"] {
            assert_eq!(
                KymaSelector::parse(&expr("k", op, Some(&["ok", value]))),
                Err(SelectorError::InvalidValue {
                    key: Shown::new("k"),
                    value: Shown::new(value),
                    field: "matchExpressions",
                    problem
                }),
                "{op} {value:?}"
            );
        }
        assert_eq!(
            KymaSelector::parse(&match_labels(&[("k", value)])),
            Err(SelectorError::InvalidValue {
                key: Shown::new("k"),
                value: Shown::new(value),
                field: "matchLabels",
                problem
            }),
            "{value:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Operators and value counts
// ---------------------------------------------------------------------------------------------

#[test]
fn operators_are_case_sensitive() {
    for op in ["in", "IN", "notin", "Notin", "exists", "EXISTS", "doesnotexist", "Like", "=", "Gt", ""] {
        assert_eq!(
            KymaSelector::parse(&expr("k", op, Some(&["x"]))),
            Err(SelectorError::UnknownOperator(Shown::new(op))),
            "{op:?}"
        );
    }
}

#[test]
fn in_and_not_in_need_values_and_exists_and_does_not_exist_take_none() {
    for op in ["In", "NotIn"] {
        for values in [None, Some(&[][..])] {
            assert_eq!(
                KymaSelector::parse(&expr("k", op, values)),
                Err(SelectorError::MissingValues(op, Shown::new("k"))),
                "{op} {values:?}"
            );
        }
    }
    for op in ["Exists", "DoesNotExist"] {
        assert_eq!(
            KymaSelector::parse(&expr("k", op, Some(&["x"]))),
            Err(SelectorError::UnexpectedValues(op, Shown::new("k"))),
            "{op}"
        );
        assert!(KymaSelector::parse(&expr("k", op, Some(&[]))).is_ok(), "an empty list is no values: {op}");
    }
}

#[test]
fn not_in_on_an_invalid_key_is_an_error_not_a_match() {
    // Matched naively, NotIn on a key no Kyma can carry would select every Kyma.
    for key in ["bad key!", "not a valid key!", "a/b/c", "Example.com/x"] {
        let err = KymaSelector::parse(&expr(key, "NotIn", Some(&["x"]))).expect_err(key);
        assert!(matches!(err, SelectorError::InvalidKey { .. }), "{key:?}: {err}");
    }
    let err =
        KymaSelector::parse(&expr("k", "NotIn", Some(&["v".repeat(64).as_str()]))).expect_err("64-character value");
    assert!(matches!(err, SelectorError::InvalidValue { .. }), "{err}");
}

#[test]
fn one_bad_term_invalidates_the_whole_selector() {
    let selector = LabelSelector {
        match_labels: Some(labels(&[("region", "eu")])),
        match_expressions: Some(vec![
            LabelSelectorRequirement { key: "plan".into(), operator: "Exists".into(), values: None },
            LabelSelectorRequirement { key: "bad key!".into(), operator: "DoesNotExist".into(), values: None },
        ]),
    };
    assert!(matches!(KymaSelector::parse(&selector), Err(SelectorError::InvalidKey { .. })));
}

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

#[test]
fn messages_name_the_problem() {
    let err = KymaSelector::parse(&expr("bad key!", "NotIn", Some(&["x"]))).expect_err("invalid");
    assert_eq!(
        err.to_string(),
        format!("label key \"bad key!\" in matchExpressions is not a qualified name: {KEY_NAME_CHARS}")
    );
    let err = KymaSelector::parse(&match_labels(&[("region", "a b")])).expect_err("invalid");
    assert_eq!(
        err.to_string(),
        format!("label value \"a b\" of key \"region\" in matchLabels is not a valid label value: {VALUE_CHARS}")
    );
    let err = KymaSelector::parse(&expr("k", "in", Some(&["x"]))).expect_err("invalid");
    assert_eq!(err.to_string(), "unknown operator \"in\" in matchExpressions");
}

#[test]
fn messages_are_bounded_and_free_of_control_characters() {
    let huge = format!("{}\u{1b}[31m\n\r{}", "k".repeat(10_000), "v".repeat(10_000));
    let selectors = [
        expr(&huge, "In", Some(&["x"])),
        expr("k", "In", Some(&[huge.as_str()])),
        expr("k", &huge, Some(&["x"])),
        match_labels(&[(huge.as_str(), "v")]),
        match_labels(&[("k", huge.as_str())]),
        expr(&format!("\u{7}{huge}"), "In", Some(&["x"])),
    ];
    for selector in selectors {
        let message = KymaSelector::parse(&selector).expect_err("invalid").to_string();
        assert!(message.chars().count() < 400, "{} characters: {message}", message.chars().count());
        assert!(!message.chars().any(char::is_control), "{message:?}");
    }
}

#[test]
fn shown_text_is_cut_to_its_limit() {
    assert_eq!(Shown::new("abc").to_string(), "\"abc\"");
    assert_eq!(Shown::new("a\"b").to_string(), "\"a\\\"b\"");
    assert_eq!(Shown::new("a\nb").0, "a b");
    let exact = "x".repeat(SHOWN_CHARS);
    assert_eq!(Shown::new(&exact).0, exact, "text of the limit's length is shown in full");
    let cut = Shown::new(&"x".repeat(SHOWN_CHARS + 1)).0;
    assert_eq!(cut, format!("{exact}..."));
}

// ---------------------------------------------------------------------------------------------
// Matching
// ---------------------------------------------------------------------------------------------

#[test]
fn match_labels_require_every_pair() {
    let sel = parse(&match_labels(&[("a", "1"), ("b", "2")]));
    assert!(sel.matches(&labels(&[("a", "1"), ("b", "2"), ("c", "3")])));
    assert!(!sel.matches(&labels(&[("a", "1")])));
    assert!(!sel.matches(&labels(&[("a", "1"), ("b", "3")])));
}

#[test]
fn expressions_follow_kubernetes_semantics() {
    let l = labels(&[("region", "eu"), ("plan", "trial")]);
    assert!(parse(&expr("region", "In", Some(&["eu", "us"]))).matches(&l));
    assert!(!parse(&expr("missing", "In", Some(&["eu"]))).matches(&l));
    assert!(!parse(&expr("region", "NotIn", Some(&["eu"]))).matches(&l));
    assert!(parse(&expr("region", "NotIn", Some(&["us"]))).matches(&l));
    assert!(parse(&expr("missing", "NotIn", Some(&["x"]))).matches(&l));
    assert!(parse(&expr("plan", "Exists", None)).matches(&l));
    assert!(!parse(&expr("missing", "Exists", None)).matches(&l));
    assert!(!parse(&expr("plan", "DoesNotExist", None)).matches(&l));
    assert!(parse(&expr("missing", "DoesNotExist", None)).matches(&l));
}

#[test]
fn an_empty_value_matches_a_label_with_an_empty_value() {
    assert!(parse(&match_labels(&[("k", "")])).matches(&labels(&[("k", "")])));
    assert!(!parse(&match_labels(&[("k", "")])).matches(&labels(&[])));
}

#[test]
fn emptiness() {
    assert!(parse(&LabelSelector::default()).is_empty());
    assert!(parse(&LabelSelector { match_labels: Some(BTreeMap::new()), match_expressions: Some(vec![]) }).is_empty());
    assert!(parse(&LabelSelector::default()).matches(&labels(&[])), "empty matches everything, as in Kubernetes");
    assert!(!parse(&expr("a", "Exists", None)).is_empty());
    assert!(!parse(&match_labels(&[("a", "")])).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

fn gen_prefix() -> impl Strategy<Value = String> {
    "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?){0,4}"
}

fn gen_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
}

fn gen_key() -> impl Strategy<Value = String> {
    (proptest::option::of(gen_prefix()), gen_name()).prop_map(|(prefix, name)| match prefix {
        Some(prefix) => format!("{prefix}/{name}"),
        None => name,
    })
}

fn gen_value() -> impl Strategy<Value = String> {
    "([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
}

fn gen_requirement() -> impl Strategy<Value = LabelSelectorRequirement> {
    (gen_key(), 0..4usize, proptest::collection::vec(gen_value(), 1..4)).prop_map(|(key, op, values)| {
        let (operator, values) = match op {
            0 => ("In", Some(values)),
            1 => ("NotIn", Some(values)),
            2 => ("Exists", None),
            _ => ("DoesNotExist", Some(Vec::new())),
        };
        LabelSelectorRequirement { key, operator: operator.to_owned(), values }
    })
}

proptest! {
    #[test]
    fn selectors_built_from_valid_parts_validate(
        match_labels in proptest::collection::btree_map(gen_key(), gen_value(), 0..4),
        expressions in proptest::collection::vec(gen_requirement(), 0..4),
    ) {
        let selector = LabelSelector { match_labels: Some(match_labels), match_expressions: Some(expressions) };
        prop_assert!(KymaSelector::parse(&selector).is_ok(), "{:?}: {:?}", selector, KymaSelector::parse(&selector));
    }

    #[test]
    fn accepted_keys_and_values_have_the_documented_shape(text in "[-a-zA-Z0-9_./ !é]{0,80}") {
        if key_problem(&text).is_none() {
            let (prefix, name) = text.rsplit_once('/').map_or((None, text.as_str()), |(p, n)| (Some(p), n));
            prop_assert!((1..=63).contains(&name.len()));
            prop_assert!(name.starts_with(|c: char| c.is_ascii_alphanumeric()));
            prop_assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()));
            prop_assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
            if let Some(prefix) = prefix {
                prop_assert!((1..=253).contains(&prefix.len()));
                prop_assert!(!prefix.contains('/'));
                for part in prefix.split('.') {
                    prop_assert!(!part.is_empty() && !part.starts_with('-') && !part.ends_with('-'));
                    prop_assert!(part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
                }
            }
        }
        if value_problem(&text).is_none() && !text.is_empty() {
            prop_assert!(text.len() <= 63);
            prop_assert!(text.starts_with(|c: char| c.is_ascii_alphanumeric()));
            prop_assert!(text.ends_with(|c: char| c.is_ascii_alphanumeric()));
            prop_assert!(text.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
        }
    }

    #[test]
    fn one_foreign_character_makes_a_valid_name_invalid(
        name in gen_name(),
        at in any::<prop::sample::Index>(),
        bad in prop::sample::select(vec![' ', '!', '/', ':', '@', 'é', '\n', '"', '*']),
    ) {
        let mut chars: Vec<char> = name.chars().collect();
        chars.insert(at.index(chars.len() + 1), bad);
        let broken: String = chars.into_iter().collect();
        if bad != '/' {
            prop_assert!(key_problem(&broken).is_some(), "{:?}", broken);
        }
        prop_assert!(value_problem(&broken).is_some(), "{:?}", broken);
    }
}
