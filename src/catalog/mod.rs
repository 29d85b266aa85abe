//! The catalog: trimmed views of the KCP's ModuleTemplates and ModuleReleaseMetas, and the
//! pure functions that turn them into what one SKR should hold.
//!
//! ```text
//!  KCP objects ──Snapshot::build──▶ Snapshot ──desired_set(kyma labels)──▶ DesiredSet
//!                                                                              │
//!                      observed SKR objects + remembered writes ──plan()──▶ Plan
//! ```
//!
//! Nothing here holds a `Client`; `sync::executor` performs a `Plan`.

pub mod desired;
pub mod plan;
pub mod render;
pub mod selector;
pub mod snapshot;

pub use desired::{DesiredObject, DesiredSet, Warning, desired_set};
pub use plan::{KindMemory, Observed, Plan, plan};
pub use snapshot::{MrmView, MtView, Snapshot};

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
}

/// A stable 64-bit content hash (xxh3 over canonical JSON). Stable across processes and
/// versions of the binary, unlike `std`'s `DefaultHasher`.
pub fn content_hash(value: &serde_json::Value) -> u64 {
    // serde_json's Map is a BTreeMap (no preserve_order feature), so serialisation is canonical.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}
