//! A ModuleReleaseMeta's `kymaSelector` (pure): validated once, as Kubernetes validates label
//! selectors, into a [`KymaSelector`], which then matches Kyma labels without further checks.
//!
//! The rules are those of apimachinery's `metav1.LabelSelectorAsSelector` (what
//! lifecycle-manager uses): every `matchLabels` and `matchExpressions` key must be a
//! qualified name (`content.IsLabelKey`), every value a valid label value
//! (`content.IsLabelValue`), the operator one of `In`, `NotIn`, `Exists`, `DoesNotExist`
//! (exact case), In and NotIn need values and Exists and DoesNotExist take none
//! (`labels.NewRequirement`). A selector that breaks any rule is never matched against a
//! Kyma, so a malformed term cannot decide a match: a restricted module fails closed.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// At most this many characters of a key, value or operator appear in an error message. A
/// selector comes from a KCP object, so what it holds is cut (and its control characters
/// replaced) before it reaches a log line; 64 shows any valid name part or value in full.
pub const SHOWN_CHARS: usize = 64;

/// Longest name part of a qualified name, and longest label value (Kubernetes'
/// `LabelValueMaxLength`, `labelKeyMaxLength`).
const NAME_MAX: usize = 63;

/// Longest prefix of a qualified name (a DNS-1123 subdomain, `DNS1123SubdomainMaxLength`).
const PREFIX_MAX: usize = 253;

// Why a key is not a qualified name, in the order they are checked.
const KEY_TOO_MANY_SLASHES: &str = "it has more than one '/'";
const KEY_EMPTY_PREFIX: &str = "the prefix before '/' is empty";
const KEY_PREFIX_NOT_SUBDOMAIN: &str = "the prefix is not a DNS-1123 subdomain (lower-case alphanumerics, '-' and '.', \
                                        each dot-separated part starting and ending with an alphanumeric)";
const KEY_PREFIX_TOO_LONG: &str = "the prefix is longer than 253 characters";
const KEY_EMPTY_NAME: &str = "the name part is empty";
const KEY_NAME_CHARS: &str =
    "the name part must consist of alphanumerics, '-', '_' and '.', and start and end with an alphanumeric";
const KEY_NAME_TOO_LONG: &str = "the name part is longer than 63 characters";

// Why a value is not a valid label value.
const VALUE_CHARS: &str =
    "it must be empty or consist of alphanumerics, '-', '_' and '.', and start and end with an alphanumeric";
const VALUE_TOO_LONG: &str = "it is longer than 63 characters";

/// Text of a KCP object shown in an error message: at most [`SHOWN_CHARS`] characters
/// (longer text is cut and ends in `...`), control characters replaced by spaces
/// ([`crate::text::bounded`]). Displayed quoted, with quotes and backslashes escaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown(String);

impl Shown {
    /// The shown form of `text`.
    pub fn new(text: &str) -> Self {
        Self(crate::text::bounded(text, SHOWN_CHARS))
    }
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Why a `kymaSelector` is not a valid Kubernetes label selector. Only the first problem is
/// reported; every key, value and operator in it is [`Shown`], so a message is bounded
/// whatever the KCP object holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An expression uses an operator other than In, NotIn, Exists, DoesNotExist (the case
    /// matters).
    #[error("unknown operator {0} in matchExpressions")]
    UnknownOperator(Shown),
    /// In or NotIn without values.
    #[error("operator {0} on key {1} in matchExpressions needs at least one value")]
    MissingValues(&'static str, Shown),
    /// Exists or DoesNotExist with values.
    #[error("operator {0} on key {1} in matchExpressions takes no values")]
    UnexpectedValues(&'static str, Shown),
    /// A `matchLabels` or `matchExpressions` key is not a qualified name.
    #[error("label key {key} in {field} is not a qualified name: {problem}")]
    InvalidKey {
        /// The key.
        key: Shown,
        /// `matchLabels` or `matchExpressions`.
        field: &'static str,
        /// Which rule it breaks.
        problem: &'static str,
    },
    /// A `matchLabels` or `matchExpressions` value is not a valid label value.
    #[error("label value {value} of key {key} in {field} is not a valid label value: {problem}")]
    InvalidValue {
        /// The key the value belongs to.
        key: Shown,
        /// The value.
        value: Shown,
        /// `matchLabels` or `matchExpressions`.
        field: &'static str,
        /// Which rule it breaks.
        problem: &'static str,
    },
}

/// A `kymaSelector` that Kubernetes would accept: only [`KymaSelector::parse`] makes one, so
/// matching it cannot fail. All requirements are ANDed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KymaSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    /// Also a `matchLabels` entry, with one value (Kubernetes' `Equals` matches the same).
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

impl KymaSelector {
    /// Validates `selector` as `metav1.LabelSelectorAsSelector` does: `matchLabels` first,
    /// then `matchExpressions` in order.
    ///
    /// # Errors
    /// Returns the first rule the selector breaks (see the [module docs](self)).
    pub fn parse(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            check_key(key, "matchLabels")?;
            check_value(key, value, "matchLabels")?;
            requirements.push(Requirement { key: key.clone(), op: Op::In(vec![value.clone()]) });
        }
        for expr in selector.match_expressions.iter().flatten() {
            let values = expr.values.as_deref().unwrap_or_default();
            let op = match expr.operator.as_str() {
                "In" => Op::In(values.to_vec()),
                "NotIn" => Op::NotIn(values.to_vec()),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => return Err(SelectorError::UnknownOperator(Shown::new(other))),
            };
            check_key(&expr.key, "matchExpressions")?;
            match (&op, values.is_empty()) {
                (Op::In(_) | Op::NotIn(_), true) => {
                    return Err(SelectorError::MissingValues(op_name(&op), Shown::new(&expr.key)));
                }
                (Op::Exists | Op::DoesNotExist, false) => {
                    return Err(SelectorError::UnexpectedValues(op_name(&op), Shown::new(&expr.key)));
                }
                _ => {}
            }
            for value in values {
                check_value(&expr.key, value, "matchExpressions")?;
            }
            requirements.push(Requirement { key: expr.key.clone(), op });
        }
        Ok(Self { requirements })
    }

    /// True when the selector has no requirement (neither `matchLabels` nor
    /// `matchExpressions` entries).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The label keys the selector reads.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.requirements.iter().map(|r| r.key.as_str())
    }

    /// Whether `labels` satisfy every requirement. An empty selector matches everything, as
    /// in Kubernetes; callers that want "empty matches nothing" check [`is_empty`](Self::is_empty)
    /// first.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.get(&r.key);
            match &r.op {
                Op::In(values) => value.is_some_and(|v| values.contains(v)),
                Op::NotIn(values) => value.is_none_or(|v| !values.contains(v)),
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
            }
        })
    }
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::In(_) => "In",
        Op::NotIn(_) => "NotIn",
        Op::Exists => "Exists",
        Op::DoesNotExist => "DoesNotExist",
    }
}

fn check_key(key: &str, field: &'static str) -> Result<(), SelectorError> {
    key_problem(key).map_or(Ok(()), |problem| Err(SelectorError::InvalidKey { key: Shown::new(key), field, problem }))
}

fn check_value(key: &str, value: &str, field: &'static str) -> Result<(), SelectorError> {
    value_problem(value).map_or(Ok(()), |problem| {
        Err(SelectorError::InvalidValue { key: Shown::new(key), value: Shown::new(value), field, problem })
    })
}

/// Why `key` is not a qualified name (`[prefix/]name`), or `None` when it is one.
fn key_problem(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.split_once('/') {
        None => (None, key),
        Some((_, rest)) if rest.contains('/') => return Some(KEY_TOO_MANY_SLASHES),
        Some((prefix, name)) => (Some(prefix), name),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some(KEY_EMPTY_PREFIX);
        }
        if !prefix.split('.').all(is_dns_label_syntax) {
            return Some(KEY_PREFIX_NOT_SUBDOMAIN);
        }
        if prefix.len() > PREFIX_MAX {
            return Some(KEY_PREFIX_TOO_LONG);
        }
    }
    if name.is_empty() {
        return Some(KEY_EMPTY_NAME);
    }
    if !is_name_syntax(name) {
        return Some(KEY_NAME_CHARS);
    }
    // Only ASCII is left, so bytes are characters.
    (name.len() > NAME_MAX).then_some(KEY_NAME_TOO_LONG)
}

/// Why `value` is not a valid label value, or `None` when it is one.
fn value_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        return None;
    }
    if !is_name_syntax(value) {
        return Some(VALUE_CHARS);
    }
    (value.len() > NAME_MAX).then_some(VALUE_TOO_LONG)
}

/// Whether `value` is a valid label value (empty, or at most 63 characters of
/// [`is_name_syntax`]).
pub(crate) fn is_label_value(value: &str) -> bool {
    value_problem(value).is_none()
}

/// Whether `name` is a DNS-1123 subdomain (at most 253 characters of dot-separated
/// [`is_dns_label_syntax`] parts), as object names of most kinds are.
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty() && name.len() <= PREFIX_MAX && name.split('.').all(is_dns_label_syntax)
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: the name part of a qualified name and a
/// non-empty label value, length aside.
fn is_name_syntax(s: &str) -> bool {
    let bytes = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() && bytes.iter().all(inner)
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`: one dot-separated part of a DNS-1123 subdomain (the
/// subdomain itself has no limit per part, only the 253 in total).
fn is_dns_label_syntax(s: &str) -> bool {
    let bytes = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let inner = |c: &u8| edge(c) || *c == b'-';
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => edge(first) && edge(last) && bytes.iter().all(inner),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
