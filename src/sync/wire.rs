//! The SKR's answers as the executor reads them: lean wire types that keep only what a plan
//! needs, and the checks every kept field passes before it is kept.
//!
//! An SKR is customer-controlled, so each field it sends is held to what a real apiserver
//! sends (the `MAX_*` constants below): object names are DNS subdomains of at most 253
//! bytes, namespaces the namespace listed, UIDs at most 36 bytes, resourceVersions at most 64
//! printable bytes, field managers at most 128 bytes, `continue` tokens at most 4 KiB. A string over its bound
//! is not even allocated while decoding ([`Capped`]); a violation fails the sync with an
//! [`InvalidAnswer`] that names the field and never quotes the value.

use serde::Deserialize;
use serde::de::{Deserializer, Visitor};
use serde_json::Value;

use crate::api::SKR_FIELD_MANAGER;
use std::collections::BTreeMap;

use crate::catalog::render::CopyDigest;
use crate::catalog::{DesiredObject, Observed};
use crate::skr::request::InvalidAnswer;

/// Longest object name: a DNS subdomain.
pub const MAX_NAME: usize = 253;
/// Longest namespace name: a DNS label.
pub const MAX_NAMESPACE: usize = 63;
/// Longest UID: apiservers send a UUID of 36 characters.
pub const MAX_UID: usize = 36;
/// Longest resourceVersion: etcd's revisions are at most 20 digits; 64 leaves room for other
/// storage, and is what the replica remembers per copy at most.
pub const MAX_RESOURCE_VERSION: usize = crate::catalog::plan::MAX_REMEMBERED_VERSION;
/// Longest field manager name: the apiserver refuses longer ones.
pub const MAX_FIELD_MANAGER: usize = 128;
/// Longest `continue` token: an apiserver's encodes a resourceVersion and a key of at most a
/// few hundred bytes.
pub const MAX_CONTINUE: usize = 4096;
/// Longest `kind` an item may name.
pub const MAX_KIND: usize = 63;

/// A string of at most `MAX` bytes, or the fact that the SKR sent a longer one (which is not
/// allocated when the decoder can lend it, as `serde_json` does for strings without escapes).
/// `null` and a missing field read as empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capped<const MAX: usize> {
    /// The string, at most `MAX` bytes.
    Text(String),
    /// A longer string was sent.
    TooLong,
}

impl<const MAX: usize> Default for Capped<MAX> {
    fn default() -> Self {
        Self::Text(String::new())
    }
}

impl<const MAX: usize> Capped<MAX> {
    /// The text, or `field` named as too long.
    fn checked(self, field: &'static str, too_long: &'static str) -> Result<String, InvalidAnswer> {
        match self {
            Self::Text(text) => Ok(text),
            Self::TooLong => Err(InvalidAnswer { field, problem: too_long }),
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Self::Text(text) => Some(text),
            Self::TooLong => None,
        }
    }
}

impl<'de, const MAX: usize> Deserialize<'de> for Capped<MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<const MAX: usize>;
        impl<'de, const MAX: usize> Visitor<'de> for V<MAX> {
            type Value = Capped<MAX>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or null")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(if v.len() > MAX { Capped::TooLong } else { Capped::Text(v.to_owned()) })
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(if v.len() > MAX { Capped::TooLong } else { Capped::Text(v) })
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(Capped::default())
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(Capped::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_str(self)
            }
        }
        d.deserialize_option(V::<MAX>)
    }
}

/// Go encodes an empty slice as `null`; read it as empty.
fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The metadata a plan needs of an SKR object: everything else (the `fieldsV1` trees of
/// managedFields above all, about half of a metadata-only list) is skipped while parsing,
/// never built.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LeanMeta {
    name: Capped<MAX_NAME>,
    namespace: Capped<MAX_NAMESPACE>,
    uid: Capped<MAX_UID>,
    resource_version: Capped<MAX_RESOURCE_VERSION>,
    #[serde(deserialize_with = "null_as_default")]
    managed_fields: Vec<LeanManager>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LeanManager {
    manager: Capped<MAX_FIELD_MANAGER>,
}

/// An object answered as `PartialObjectMetadata` (a metadata-only list item, an apply's
/// answer), read through [`LeanMeta`].
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MetaOnly {
    kind: Capped<MAX_KIND>,
    metadata: LeanMeta,
}

/// A `PartialObjectMetadataList`, read through [`LeanMeta`].
#[derive(Debug, Deserialize)]
pub struct MetaOnlyList {
    #[serde(default)]
    metadata: ListContinue,
    #[serde(default, deserialize_with = "null_as_default")]
    items: Vec<MetaOnly>,
}

/// The `continue` token of a list's metadata.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListContinue {
    #[serde(rename = "continue")]
    next: Capped<MAX_CONTINUE>,
}

/// An object's labels, read from its metadata (the sync namespace's, to see whether it
/// carries the managed-by label).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Labelled {
    metadata: LabelsOnly,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LabelsOnly {
    #[serde(deserialize_with = "null_as_default")]
    labels: std::collections::BTreeMap<String, Capped<MAX_LABEL_VALUE>>,
    #[serde(rename = "deletionTimestamp")]
    deletion_timestamp: Option<Capped<MAX_TIMESTAMP>>,
}

/// Longest RFC 3339 time an apiserver writes (`2006-01-02T15:04:05Z`, with room to spare).
const MAX_TIMESTAMP: usize = 64;

/// Longest label value the apiserver accepts.
pub const MAX_LABEL_VALUE: usize = 63;

impl Labelled {
    /// Whether the object carries label `key` with `value`.
    pub fn has(&self, key: &str, value: &str) -> bool {
        self.metadata.labels.get(key).and_then(Capped::as_str) == Some(value)
    }

    /// Whether the object is being deleted (it has a deletion timestamp).
    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}

/// What the executor expects of the objects in one answer.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// The namespace listed or written (an object in another one is a lie).
    pub namespace: &'a str,
    /// The `kind` an object may name (or none).
    pub kind: &'a str,
    /// Of a full list, the objects whose content is kept ([`CopyDigest`]): the desired ones
    /// (`None`: every object). A plan reads the content of desired objects only, and the
    /// labels and annotations of the others would otherwise be held until the list ends.
    pub content_of: Option<&'a BTreeMap<String, DesiredObject>>,
}

impl Expect<'_> {
    /// What the executor expects of a single object of `kind` (or of a metadata-only answer,
    /// `PartialObjectMetadata`) in `namespace`.
    pub fn new<'a>(namespace: &'a str, kind: &'a str) -> Expect<'a> {
        Expect { namespace, kind, content_of: None }
    }

    fn keeps_content(&self, name: &str) -> bool {
        self.content_of.is_none_or(|desired| desired.contains_key(name))
    }
}

/// The kind of a metadata-only object.
pub const PARTIAL_OBJECT_METADATA: &str = "PartialObjectMetadata";

/// Whether `name` is a DNS subdomain (RFC 1123): lower-case alphanumerics, `-` and `.`,
/// starting and ending with an alphanumeric, at most 253 bytes. Every object name of the
/// catalog kinds is one.
pub fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            bytes.len() <= MAX_NAME
                && alnum(first)
                && alnum(last)
                && bytes.iter().all(|&b| alnum(b) || b == b'-' || b == b'.')
        }
        _ => false,
    }
}

/// Checks a resourceVersion an SKR sent, as it will be kept.
pub fn check_resource_version(rv: &str, field: &'static str) -> Result<(), InvalidAnswer> {
    if rv.len() > MAX_RESOURCE_VERSION {
        return Err(InvalidAnswer { field, problem: "is longer than 64 bytes" });
    }
    if !rv.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidAnswer { field, problem: "holds characters other than printable ASCII" });
    }
    Ok(())
}

impl MetaOnly {
    /// The object checked against `expect`, as a plan sees it (without content).
    ///
    /// # Errors
    /// The first field that no real apiserver would send.
    pub fn checked(self, expect: Expect<'_>, fields: &ItemFields) -> Result<Observed, InvalidAnswer> {
        check_kind(&self.kind, expect, fields.kind)?;
        self.metadata.checked(expect, fields, None)
    }

    /// The resourceVersion of an apply's answer for `name`, checked.
    ///
    /// # Errors
    /// A field of the answer that no real apiserver would send, or an answer about another
    /// object.
    pub fn applied(self, name: &str, expect: Expect<'_>) -> Result<Applied, InvalidAnswer> {
        check_kind(&self.kind, expect, APPLIED.kind)?;
        if self.metadata.name.as_str().is_some_and(|n| !n.is_empty() && n != name) {
            return Err(InvalidAnswer { field: APPLIED.name, problem: "is not the name applied" });
        }
        let managers = self.metadata.managers(&APPLIED)?;
        let observed = self.metadata.checked_fields(expect, &APPLIED)?;
        Ok(Applied { resource_version: observed.resource_version, managers })
    }
}

/// What an apply's answer tells: the copy's new resourceVersion, and its field managers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The new resourceVersion.
    pub resource_version: String,
    /// Every field manager of the copy.
    pub managers: Vec<String>,
}

/// The paths of an object's fields, for the messages of one kind of answer.
#[derive(Debug)]
pub struct ItemFields {
    kind: &'static str,
    name: &'static str,
    namespace: &'static str,
    uid: &'static str,
    /// The path of the resourceVersion.
    pub resource_version: &'static str,
    manager: &'static str,
}

/// The fields of a list's items.
pub const LISTED: ItemFields = ItemFields {
    kind: "items[].kind",
    name: "items[].metadata.name",
    namespace: "items[].metadata.namespace",
    uid: "items[].metadata.uid",
    resource_version: "items[].metadata.resourceVersion",
    manager: "items[].metadata.managedFields[].manager",
};

/// The fields of a single object's answer (an apply, a read, a replace).
pub const APPLIED: ItemFields = ItemFields {
    kind: "kind",
    name: "metadata.name",
    namespace: "metadata.namespace",
    uid: "metadata.uid",
    resource_version: "metadata.resourceVersion",
    manager: "metadata.managedFields[].manager",
};

fn check_kind<const MAX: usize>(
    kind: &Capped<MAX>,
    expect: Expect<'_>,
    field: &'static str,
) -> Result<(), InvalidAnswer> {
    match kind.as_str() {
        Some("") => Ok(()),
        Some(kind) if kind == expect.kind => Ok(()),
        _ => Err(InvalidAnswer { field, problem: "is not the kind asked for" }),
    }
}

impl LeanMeta {
    fn managers(&self, fields: &ItemFields) -> Result<Vec<String>, InvalidAnswer> {
        self.managed_fields
            .iter()
            .map(|m| m.manager.clone().checked(fields.manager, "is longer than 128 bytes"))
            .collect()
    }

    fn checked(
        self,
        expect: Expect<'_>,
        fields: &ItemFields,
        content: Option<CopyDigest>,
    ) -> Result<Observed, InvalidAnswer> {
        let managers = self.managers(fields)?;
        let mut observed = self.checked_fields(expect, fields)?;
        observed.managed = managers.iter().any(|m| m == SKR_FIELD_MANAGER);
        observed.content = content;
        Ok(observed)
    }

    /// Name, namespace, UID and resourceVersion checked; `managed` false, no content.
    fn checked_fields(self, expect: Expect<'_>, fields: &ItemFields) -> Result<Observed, InvalidAnswer> {
        let name = self.name.checked(fields.name, "is longer than 253 bytes")?;
        if !is_dns_subdomain(&name) {
            return Err(InvalidAnswer { field: fields.name, problem: "is not a DNS subdomain" });
        }
        let namespace = self.namespace.checked(fields.namespace, "is longer than 63 bytes")?;
        if !namespace.is_empty() && namespace != expect.namespace {
            return Err(InvalidAnswer { field: fields.namespace, problem: "is not the namespace asked for" });
        }
        let uid = self.uid.checked(fields.uid, "is longer than 36 bytes")?;
        if !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(InvalidAnswer { field: fields.uid, problem: "is not a UID" });
        }
        let resource_version = self.resource_version.checked(fields.resource_version, "is longer than 64 bytes")?;
        check_resource_version(&resource_version, fields.resource_version)?;
        Ok(Observed { name, uid, resource_version, managed: false, content: None })
    }
}

/// One page of a list: what a plan needs of each item, and the token of the next page.
#[derive(Debug)]
pub struct Page {
    /// The items, checked.
    pub items: Vec<Observed>,
    /// The next page's token (`None`: the last page).
    pub next: Option<String>,
}

/// The `continue` token of a page, checked.
fn next_token(next: Capped<MAX_CONTINUE>) -> Result<Option<String>, InvalidAnswer> {
    let token = next.checked("metadata.continue", "is longer than 4096 bytes")?;
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidAnswer {
            field: "metadata.continue",
            problem: "holds characters other than printable ASCII",
        });
    }
    Ok((!token.is_empty()).then_some(token))
}

impl MetaOnlyList {
    /// The page, its items checked against `expect`.
    ///
    /// # Errors
    /// The first field that no real apiserver would send.
    pub fn checked(self, expect: Expect<'_>) -> Result<Page, InvalidAnswer> {
        let items = self.items.into_iter().map(|o| o.checked(expect, &LISTED)).collect::<Result<_, _>>()?;
        Ok(Page { items, next: next_token(self.metadata.next)? })
    }
}

/// The error of decoding a full list page: malformed JSON, or a field no real apiserver
/// sends.
#[derive(Debug)]
pub enum PageError {
    /// Not a list.
    Parse(serde_json::Error),
    /// A field over its bounds.
    Invalid(InvalidAnswer),
}

/// Reads a full list page (`{"metadata": {"continue": ..}, "items": [...]}`), keeping of each
/// item what a plan needs: name, resourceVersion, whether it is managed, and its
/// [`CopyDigest`]; each item checked against `expect` as soon as it is read, so only one
/// item is held in full at once.
///
/// # Errors
/// Malformed JSON, or the first invalid field.
pub fn digest_list(body: &[u8], expect: Expect<'_>) -> Result<Page, PageError> {
    use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess};

    struct Items<'a>(Expect<'a>, &'a std::cell::RefCell<Option<InvalidAnswer>>);
    impl<'de> DeserializeSeed<'de> for Items<'_> {
        type Value = Vec<Observed>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for Items<'_> {
        type Value = Vec<Observed>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of objects")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<Value>()? {
                let kind = Capped::<MAX_KIND>::deserialize(&item["kind"]).map_err(serde::de::Error::custom)?;
                let meta = LeanMeta::deserialize(&item["metadata"]).map_err(serde::de::Error::custom)?;
                let checked = check_kind(&kind, self.0, LISTED.kind).and_then(|()| meta.checked(self.0, &LISTED, None));
                match checked {
                    Ok(mut observed) => {
                        if self.0.keeps_content(&observed.name) {
                            observed.content = Some(CopyDigest::of(&item));
                        }
                        out.push(observed);
                    }
                    Err(invalid) => {
                        *self.1.borrow_mut() = Some(invalid);
                        return Err(serde::de::Error::custom("an invalid item"));
                    }
                }
            }
            Ok(out)
        }
    }
    struct List<'a>(Expect<'a>, &'a std::cell::RefCell<Option<InvalidAnswer>>);
    impl<'de> Visitor<'de> for List<'_> {
        type Value = (Vec<Observed>, Capped<MAX_CONTINUE>);
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list response")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let (mut items, mut next) = (Vec::new(), Capped::default());
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                match key.as_ref() {
                    "items" => items = map.next_value_seed(Items(self.0, self.1))?,
                    "metadata" => next = map.next_value::<ListContinue>()?.next,
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok((items, next))
        }
    }
    let invalid = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed =
        serde::Deserializer::deserialize_map(&mut de, List(expect, &invalid)).and_then(|page| de.end().map(|()| page));
    if let Some(invalid) = invalid.into_inner() {
        return Err(PageError::Invalid(invalid));
    }
    let (items, next) = parsed.map_err(PageError::Parse)?;
    Ok(Page { items, next: next_token(next).map_err(PageError::Invalid)? })
}

#[cfg(test)]
mod tests;
