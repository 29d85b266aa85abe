//! What an SKR holds against what catalogsync would have it hold (pure): the verdict of shadow
//! mode and of `catalogsync explain --skr`.
//!
//! Per kind, every name lands in exactly one bucket:
//!
//! | bucket | desired | in the SKR | what an active sync does |
//! | --- | --- | --- | --- |
//! | in agreement | yes | holds the desired copy | nothing |
//! | missing | yes | absent | applies it |
//! | different | yes | differs (or was not read in full) | applies it |
//! | extra | no | a copy with a `catalog-sync` managed-fields entry | prunes it |
//! | user-owned | no | an object no `catalog-sync` apply ever wrote | leaves it alone |
//!
//! An SKR agrees when nothing is missing, different or extra.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::catalog::{CatalogKind, DesiredObject, DesiredSet, KindMemory, Observed, Plan, plan};

/// The comparison of one kind in one SKR; names sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KindComparison {
    /// Desired and held as desired.
    pub in_agreement: Vec<String>,
    /// Desired, absent.
    pub missing: Vec<String>,
    /// Desired, present with other content.
    pub different: Vec<String>,
    /// Not desired, a managed copy (an active sync prunes it).
    pub extra: Vec<String>,
    /// Not desired, not a managed copy (never touched).
    pub user_owned: Vec<String>,
}

impl KindComparison {
    /// Whether the SKR holds exactly the desired objects of this kind (user-owned objects
    /// aside).
    pub fn agrees(&self) -> bool {
        self.missing.is_empty() && self.different.is_empty() && self.extra.is_empty()
    }
}

/// The comparison of both kinds in one SKR.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Comparison {
    /// ModuleTemplates.
    #[serde(rename = "moduleTemplates")]
    pub templates: KindComparison,
    /// ModuleReleaseMetas.
    #[serde(rename = "moduleReleaseMetas")]
    pub release_metas: KindComparison,
}

impl Comparison {
    /// The comparison of one kind.
    pub fn of(&self, kind: CatalogKind) -> &KindComparison {
        match kind {
            CatalogKind::ModuleTemplate => &self.templates,
            CatalogKind::ModuleReleaseMeta => &self.release_metas,
        }
    }

    /// The comparison of one kind, to fill in.
    pub fn of_mut(&mut self, kind: CatalogKind) -> &mut KindComparison {
        match kind {
            CatalogKind::ModuleTemplate => &mut self.templates,
            CatalogKind::ModuleReleaseMeta => &mut self.release_metas,
        }
    }

    /// Whether the SKR holds exactly the desired catalog.
    pub fn agrees(&self) -> bool {
        CatalogKind::ALL.iter().all(|kind| self.of(*kind).agrees())
    }

    /// Compares `desired` with what the SKR holds, kind by kind (`observed`, from full lists).
    pub fn build(desired: &DesiredSet, observed: &BTreeMap<CatalogKind, Vec<Observed>>) -> Self {
        let mut out = Comparison::default();
        for kind in CatalogKind::ALL {
            let held = observed.get(&kind).map_or(&[][..], Vec::as_slice);
            *out.of_mut(kind) = compare_kind(desired.of(kind), held);
        }
        out
    }
}

/// Compares one kind from full lists. A desired object whose observed copy was not read in
/// full (`content: None`) counts as different: nothing proves it holds the desired copy.
pub fn compare_kind(desired: &BTreeMap<String, DesiredObject>, observed: &[Observed]) -> KindComparison {
    KindComparison::of_plan(&plan(desired, observed, &KindMemory::new()), observed)
}

impl KindComparison {
    /// The comparison a plan implies: what it leaves unchanged agrees, what it applies is
    /// missing or different, what it prunes is extra, and the unmanaged objects it does not
    /// name are user-owned. With this replica's memory of verified copies, a metadata-only
    /// list is enough for the copies it remembers.
    pub fn of_plan(plan: &Plan, observed: &[Observed]) -> Self {
        let held: BTreeMap<&str, &Observed> = observed.iter().map(|o| (o.name.as_str(), o)).collect();
        let mut out = KindComparison {
            in_agreement: plan.unchanged.iter().map(|(name, _, _)| name.clone()).collect(),
            extra: plan.prune.iter().map(|o| o.name.clone()).collect(),
            ..KindComparison::default()
        };
        let applied: std::collections::BTreeSet<&str> = plan.apply.iter().map(|o| o.name.as_str()).collect();
        for want in &plan.apply {
            let bucket = if held.contains_key(want.name.as_str()) { &mut out.different } else { &mut out.missing };
            bucket.push(want.name.clone());
        }
        let agreed: std::collections::BTreeSet<&str> = out.in_agreement.iter().map(String::as_str).collect();
        out.user_owned = held
            .values()
            .filter(|o| !o.managed && !applied.contains(o.name.as_str()) && !agreed.contains(o.name.as_str()))
            .map(|o| o.name.clone())
            .collect();
        for list in [&mut out.in_agreement, &mut out.missing, &mut out.different, &mut out.extra, &mut out.user_owned] {
            list.sort();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::catalog::render::CopyDigest;
    use crate::catalog::serialize_copy;

    fn desired(name: &str, version: &str) -> (String, DesiredObject) {
        let copy = json!({"metadata": {"name": name, "labels": {"m": "kyma"}}, "spec": {"version": version}});
        let (body, hash) = serialize_copy(&copy);
        (name.to_owned(), DesiredObject { name: name.to_owned(), digest: Arc::new(CopyDigest::of(&copy)), body, hash })
    }

    fn held(name: &str, version: Option<&str>, managed: bool) -> Observed {
        let content = version.map(|v| {
            CopyDigest::of(
                &json!({"metadata": {"name": name, "labels": {"m": "kyma", "x": "y"}}, "spec": {"version": v}}),
            )
        });
        Observed { name: name.to_owned(), uid: "u".into(), resource_version: "1".into(), managed, content }
    }

    #[test]
    fn every_name_lands_in_one_bucket() {
        let want: BTreeMap<String, DesiredObject> = [
            desired("same", "1.0.0"),
            desired("gone", "1.0.0"),
            desired("changed", "1.0.0"),
            desired("unread", "1.0.0"),
        ]
        .into();
        let have = vec![
            held("same", Some("1.0.0"), true),
            held("changed", Some("2.0.0"), true),
            held("unread", None, true),
            held("orphan", Some("1.0.0"), true),
            held("mine", Some("1.0.0"), false),
        ];
        let got = compare_kind(&want, &have);
        assert_eq!(got.in_agreement, ["same"]);
        assert_eq!(got.missing, ["gone"]);
        assert_eq!(got.different, ["changed", "unread"]);
        assert_eq!(got.extra, ["orphan"]);
        assert_eq!(got.user_owned, ["mine"]);
        assert!(!got.agrees());
    }

    #[test]
    fn user_owned_objects_do_not_break_agreement() {
        let want: BTreeMap<String, DesiredObject> = [desired("a", "1.0.0")].into();
        let got = compare_kind(&want, &[held("a", Some("1.0.0"), false), held("b", Some("1.0.0"), false)]);
        assert!(got.agrees());
        assert_eq!(got.user_owned, ["b"]);
    }
}
