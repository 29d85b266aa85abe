//! Renders stored entries as a kube-apiserver would: the shared content with the server
//! metadata spliced into `metadata`, without copying the content; lists, metadata-only
//! (`PartialObjectMetadata`) views, watch events and `Status` errors.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Value, json};

use super::store::{ApiError, Entry, Res, rfc3339};

/// A full object.
pub(super) struct Full<'a>(pub &'a Entry);

/// A `PartialObjectMetadata`.
pub(super) struct MetaOnly<'a>(pub &'a Entry);

/// An object either full or metadata-only.
pub(super) struct Object<'a> {
    pub entry: &'a Entry,
    pub meta_only: bool,
}

/// The `metadata` of an entry: content metadata plus the server fields.
struct Meta<'a>(&'a Entry);

struct ManagedFields<'a>(&'a Entry);

impl Serialize for Full<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Value::Object(content) = &*self.0.content else { return self.0.content.serialize(s) };
        let mut map = s.serialize_map(Some(content.len()))?;
        for (k, v) in content {
            if k == "metadata" {
                map.serialize_entry(k, &Meta(self.0))?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

impl Serialize for MetaOnly<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("kind", "PartialObjectMetadata")?;
        map.serialize_entry("apiVersion", "meta.k8s.io/v1")?;
        map.serialize_entry("metadata", &Meta(self.0))?;
        map.end()
    }
}

impl Serialize for Object<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.meta_only { MetaOnly(self.entry).serialize(s) } else { Full(self.entry).serialize(s) }
    }
}

impl Serialize for Meta<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        let empty = serde_json::Map::new();
        let content = e.content.get("metadata").and_then(Value::as_object).unwrap_or(&empty);
        let mut map = s.serialize_map(None)?;
        for (k, v) in content {
            map.serialize_entry(k, v)?;
        }
        map.serialize_entry("uid", &uid(e.uid))?;
        map.serialize_entry("resourceVersion", &e.resource_version.to_string())?;
        if e.res != Res::Namespaces {
            map.serialize_entry("generation", &e.generation)?;
        }
        map.serialize_entry("creationTimestamp", &rfc3339(e.created_ms))?;
        map.serialize_entry("managedFields", &ManagedFields(e))?;
        map.end()
    }
}

impl Serialize for ManagedFields<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        let mut seq = s.serialize_seq(Some(e.managers.len()))?;
        for m in &e.managers {
            seq.serialize_element(&json!({
                "manager": &*m.name,
                "operation": m.op.as_str(),
                "apiVersion": e.res.api_version(),
                "time": rfc3339(m.time_ms),
                "fieldsType": "FieldsV1",
                "fieldsV1": {},
            }))?;
        }
        seq.end()
    }
}

/// Formats a UID the way Kubernetes does (a v4-looking UUID).
fn uid(n: u64) -> String {
    format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", n >> 32, (n >> 16) & 0xffff, n & 0xfff, (n >> 12) & 0xfff, n)
}

/// A list body.
pub(super) struct List<'a> {
    pub res: Res,
    pub resource_version: u64,
    pub items: &'a [Entry],
    pub meta_only: bool,
}

struct Items<'a>(&'a [Entry], bool);

impl Serialize for Items<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for entry in self.0 {
            seq.serialize_element(&Object { entry, meta_only: self.1 })?;
        }
        seq.end()
    }
}

impl Serialize for List<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(4))?;
        if self.meta_only {
            map.serialize_entry("kind", "PartialObjectMetadataList")?;
            map.serialize_entry("apiVersion", "meta.k8s.io/v1")?;
        } else {
            map.serialize_entry("kind", &format!("{}List", self.res.kind()))?;
            map.serialize_entry("apiVersion", self.res.api_version())?;
        }
        map.serialize_entry("metadata", &json!({"resourceVersion": self.resource_version.to_string()}))?;
        map.serialize_entry("items", &Items(self.items, self.meta_only))?;
        map.end()
    }
}

/// One watch event line (with the trailing newline).
pub(super) fn watch_event(kind: &str, object: &Object<'_>) -> Vec<u8> {
    struct Event<'a>(&'a str, &'a Object<'a>);
    impl Serialize for Event<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(Some(2))?;
            map.serialize_entry("type", self.0)?;
            map.serialize_entry("object", self.1)?;
            map.end()
        }
    }
    let mut line = to_json(&Event(kind, object));
    line.push(b'\n');
    line
}

/// A `Status` body for an error.
pub(super) fn status(err: &ApiError) -> Vec<u8> {
    to_json(&json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": err.message,
        "reason": err.reason,
        "code": err.code,
    }))
}

/// Serializes to JSON; the types here cannot fail to serialize (string keys only).
pub(super) fn to_json<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}
