//! Label selector matching for a ModuleReleaseMeta's `kymaSelector` (pure).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Why a selector could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An expression uses an operator other than In, NotIn, Exists, DoesNotExist.
    #[error("unknown operator {0:?} in matchExpressions")]
    UnknownOperator(String),
    /// In or NotIn without values.
    #[error("operator {0} on key {1:?} needs at least one value")]
    MissingValues(&'static str, String),
    /// Exists or DoesNotExist with values.
    #[error("operator {0} on key {1:?} takes no values")]
    UnexpectedValues(&'static str, String),
}

/// True when the selector has neither `matchLabels` nor `matchExpressions`.
pub fn is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

/// Whether `labels` satisfy `selector` (all terms ANDed). An empty selector matches
/// everything, as in Kubernetes; callers that want "empty matches nothing" check
/// [`is_empty`] first.
///
/// # Errors
/// Returns a [`SelectorError`] when the selector does not parse.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> Result<bool, SelectorError> {
    let mut ok = true;
    for (k, v) in selector.match_labels.iter().flatten() {
        ok &= labels.get(k) == Some(v);
    }
    for expr in selector.match_expressions.iter().flatten() {
        let values = expr.values.as_deref().unwrap_or_default();
        let value = labels.get(&expr.key);
        let term = match expr.operator.as_str() {
            "In" | "NotIn" => {
                let op = if expr.operator == "In" { "In" } else { "NotIn" };
                if values.is_empty() {
                    return Err(SelectorError::MissingValues(op, expr.key.clone()));
                }
                let found = value.is_some_and(|v| values.contains(v));
                if op == "In" { found } else { !found }
            }
            "Exists" | "DoesNotExist" => {
                let op = if expr.operator == "Exists" { "Exists" } else { "DoesNotExist" };
                if !values.is_empty() {
                    return Err(SelectorError::UnexpectedValues(op, expr.key.clone()));
                }
                value.is_some() == (op == "Exists")
            }
            other => return Err(SelectorError::UnknownOperator(other.to_owned())),
        };
        ok &= term;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

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

    #[test]
    fn match_labels_require_every_pair() {
        let sel = LabelSelector { match_labels: Some(labels(&[("a", "1"), ("b", "2")])), match_expressions: None };
        assert_eq!(matches(&sel, &labels(&[("a", "1"), ("b", "2"), ("c", "3")])), Ok(true));
        assert_eq!(matches(&sel, &labels(&[("a", "1")])), Ok(false));
    }

    #[test]
    fn expressions_follow_kubernetes_semantics() {
        let l = labels(&[("region", "eu"), ("plan", "trial")]);
        assert_eq!(matches(&expr("region", "In", Some(&["eu", "us"])), &l), Ok(true));
        assert_eq!(matches(&expr("region", "NotIn", Some(&["eu"])), &l), Ok(false));
        assert_eq!(matches(&expr("missing", "NotIn", Some(&["x"])), &l), Ok(true));
        assert_eq!(matches(&expr("plan", "Exists", None), &l), Ok(true));
        assert_eq!(matches(&expr("plan", "DoesNotExist", None), &l), Ok(false));
    }

    #[test]
    fn malformed_expressions_are_errors() {
        let l = labels(&[]);
        assert!(matches(&expr("a", "Like", Some(&["x"])), &l).is_err());
        assert!(matches(&expr("a", "In", Some(&[])), &l).is_err());
        assert!(matches(&expr("a", "Exists", Some(&["x"])), &l).is_err());
    }

    #[test]
    fn emptiness() {
        assert!(is_empty(&LabelSelector::default()));
        assert!(is_empty(&LabelSelector { match_labels: Some(BTreeMap::new()), match_expressions: Some(vec![]) }));
        assert!(!is_empty(&expr("a", "Exists", None)));
    }
}
