//! The catalog: trimmed views of the KCP's ModuleTemplates and ModuleReleaseMetas, and the
//! pure functions that turn them into what one SKR should hold.
//!
//! ```text
//!  KCP objects ──Snapshot::build──▶ Snapshot ──desired_set(kyma labels)──▶ DesiredSet
//!                                                                              │
//!                      observed SKR objects + remembered writes ──plan()──▶ Plan
//!
//!  Snapshot ──explain(kyma labels)──▶ Explanation (the verdict on every entry, and the DesiredSet)
//!  DesiredSet + observed SKR objects ──Comparison::build──▶ Comparison (shadow mode, explain --skr)
//! ```
//!
//! Nothing here holds a `Client`; `sync::executor` performs a `Plan`, and asks [`verify`] what
//! the SKR's answers mean (replace a copy after its apply, check and write a CRD).

pub mod compare;
pub mod desired;
pub mod guard;
pub mod plan;
pub mod render;
pub mod selector;
pub mod snapshot;
pub mod verify;

pub use compare::{Comparison, KindComparison};
pub use desired::{
    DesiredObject, DesiredSet, Explanation, Filtered, Profile, ProfileCache, Warning, WarningReason, desired_set,
    explain,
};
pub use plan::{KindMemory, Observed, Orphan, Plan, plan, plan_from_memory};
pub use snapshot::{Entry, MrmView, MtView, Snapshot};

/// The two catalog kinds, used as keys and as bounded metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CatalogKind {
    /// `ModuleTemplate`
    ModuleTemplate,
    /// `ModuleReleaseMeta`
    ModuleReleaseMeta,
}

impl CatalogKind {
    /// Both kinds, in the order they are written to an SKR (templates before the release
    /// metadata that points at them).
    pub const ALL: [CatalogKind; 2] = [CatalogKind::ModuleTemplate, CatalogKind::ModuleReleaseMeta];

    /// The kind name, also the metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CatalogKind::ModuleTemplate => "ModuleTemplate",
            CatalogKind::ModuleReleaseMeta => "ModuleReleaseMeta",
        }
    }

    /// The resource plural.
    pub fn plural(self) -> &'static str {
        match self {
            CatalogKind::ModuleTemplate => "moduletemplates",
            CatalogKind::ModuleReleaseMeta => "modulereleasemetas",
        }
    }

    /// The kind whose resource plural is `plural`.
    pub fn from_plural(plural: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.plural() == plural)
    }

    /// The `ApiResource` of the kind, for dynamic clients (the same group, version and plural
    /// in the KCP and in every SKR).
    pub fn api_resource(self) -> kube::api::ApiResource {
        match self {
            CatalogKind::ModuleTemplate => kube::api::ApiResource::erase::<crate::api::ModuleTemplate>(&()),
            CatalogKind::ModuleReleaseMeta => kube::api::ApiResource::erase::<crate::api::ModuleReleaseMeta>(&()),
        }
    }
}

impl crate::label::Label for CatalogKind {
    const ALL: &'static [Self] = &CatalogKind::ALL;

    fn as_str(self) -> &'static str {
        CatalogKind::as_str(self)
    }
}

/// A stable 64-bit content hash (xxh3 over canonical JSON). Stable across processes and
/// versions of the binary, unlike `std`'s `DefaultHasher`.
pub fn content_hash(value: &serde_json::Value) -> u64 {
    // serde_json's Map is a BTreeMap (no preserve_order feature), so serialisation is canonical.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// A rendered copy serialized once, as every SKR gets it in its apply body. Applies send
/// these bytes as they are, shared and not copied, so an apply to thousands of SKRs neither
/// encodes the ~30 KB copy thousands of times nor holds a copy of it per apply in flight.
#[derive(Debug, Clone)]
pub struct CopyBody(bytes::Bytes);

impl CopyBody {
    /// The JSON text, shared (a reference count, not a copy).
    pub fn bytes(&self) -> bytes::Bytes {
        self.0.clone()
    }

    /// The copy as a JSON value, parsed from the body: for the rare replace of a copy whose
    /// foreign fields survived an apply, and for tests.
    ///
    /// # Errors
    /// None in practice: the body was serialized from a JSON value.
    pub fn value(&self) -> serde_json::Result<serde_json::Value> {
        serde_json::from_slice(&self.0)
    }

    /// Whether both are the same serialization (shared, not only equal).
    pub fn is_shared_with(&self, other: &CopyBody) -> bool {
        self.0.as_ptr() == other.0.as_ptr() && self.0.len() == other.0.len()
    }
}

impl PartialEq for CopyBody {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

/// Serializes a rendered copy once: its [`CopyBody`] and its [`content_hash`] (over the same
/// bytes).
pub fn serialize_copy(value: &serde_json::Value) -> (CopyBody, u64) {
    // Encoding a `Value` cannot fail: its map keys are strings and its numbers are finite.
    let text = serde_json::to_vec(value).expect("a JSON value always encodes");
    let hash = xxhash_rust::xxh3::xxh3_64(&text);
    // A boxed slice: no spare capacity kept with each copy.
    (CopyBody(bytes::Bytes::from(text.into_boxed_slice())), hash)
}
