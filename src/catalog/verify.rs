//! What the executor concludes from what an SKR answered (pure): whether a copy it applied
//! must also be replaced, whether a sync looks at the SKR's CRDs at all, and whether a CRD the
//! SKR holds is current.
//!
//! `sync::executor` makes the requests and acts on what these functions return; they take
//! plain data (field manager names, digests, JSON values, hashes) and hold no client, read no
//! clock and do no I/O.
//!
//! # Why an apply may be followed by a replace
//!
//! Server-side apply with `force` resets every field `catalog-sync` owns, but fields another
//! field manager added (an SKR admin's `kubectl edit`, a mutating webhook) survive it. The
//! apply asks for the result's metadata only, so its field managers are all the executor
//! knows at first: with `catalog-sync` the only one, the object holds exactly the applied
//! copy. Otherwise it reads the object in full, and replaces it only when the foreign fields
//! make it differ from the desired copy ([`CopyDigest::holds`]: equal `spec`, desired labels
//! and annotations present).

use serde_json::Value;

use crate::api::SKR_FIELD_MANAGER;
use crate::catalog::render::{CopyDigest, is_subset};

/// What follows the server-side apply of a copy, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterApply {
    /// Done: `catalog-sync` is the object's only field manager (or the answer names none), so
    /// the object holds exactly the applied copy.
    OnlyOurs,
    /// Another field manager owns fields of the object, and they survive an apply: read the
    /// object in full and decide again with what it holds.
    ReadBack,
    /// Done: read back, the object holds the desired copy despite the foreign fields (labels
    /// or annotations others added, fields outside `spec`).
    HoldsCopy,
    /// Read back, the object still differs from the desired copy: replace it with the desired
    /// copy, so the foreign fields go.
    Replace,
}

/// Decides what follows the apply of a copy whose digest is `desired`, given the field
/// managers of the object the apply answered with and, once it was read back, the digest of
/// what the object holds (`None` before that read).
///
/// The field managers decide first: when `catalog-sync` is the only one, no read is needed
/// and what a read showed does not matter.
pub fn after_apply<'a>(
    managers: impl IntoIterator<Item = &'a str>,
    read_back: Option<&CopyDigest>,
    desired: &CopyDigest,
) -> AfterApply {
    if managers.into_iter().all(|manager| manager == SKR_FIELD_MANAGER) {
        return AfterApply::OnlyOurs;
    }
    match read_back {
        None => AfterApply::ReadBack,
        Some(held) if held.holds(desired) => AfterApply::HoldsCopy,
        Some(_) => AfterApply::Replace,
    }
}

/// Whether a sync looks at the SKR's CRDs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdCheck {
    /// Not this time: a warm sync within a resync period of the last check, and the KCP CRDs
    /// are the ones last ensured in this SKR.
    Skip,
    /// A sync that is not warm (after a restart, a handover, a new access, a failure), or
    /// the last check is a resync period old: it verifies everything.
    Cold,
    /// The KCP CRDs changed since they were last ensured in this SKR, or were never ensured
    /// there.
    KcpChanged,
}

/// Decides whether a sync checks the SKR's CRDs: `warm` is whether the SKR's namespace and
/// CRDs need no check now (the last sync through this access succeeded and checked them
/// within a resync period, `SkrState::trusts_setup` in `skr`), `ensured` the combined
/// hash of the CRDs last ensured in the SKR, `kcp` the combined hash of the KCP's CRDs now.
pub fn crd_check(warm: bool, ensured: Option<u64>, kcp: u64) -> CrdCheck {
    if !warm {
        CrdCheck::Cold
    } else if ensured != Some(kcp) {
        CrdCheck::KcpChanged
    } else {
        CrdCheck::Skip
    }
}

/// How the SKR's copy of a CRD compares with the one rendered from the KCP's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdState {
    /// Up to date: the desired `spec` is a subset of the SKR's, and the desired labels are
    /// present. Fields the apiserver defaults do not count as a difference.
    Current,
    /// The SKR has no such CRD.
    Missing,
    /// The SKR's CRD lacks or changed a desired field or label.
    Differs,
}

/// Compares the SKR's CRD `held` (`None`: not found) with the `desired` apply body. Only a
/// CRD that is not [`CrdState::Current`] is applied.
pub fn crd_state(desired: &Value, held: Option<&Value>) -> CrdState {
    match held {
        None => CrdState::Missing,
        Some(have)
            if is_subset(&desired["spec"], &have["spec"])
                && is_subset(&desired["metadata"]["labels"], &have["metadata"]["labels"]) =>
        {
            CrdState::Current
        }
        Some(_) => CrdState::Differs,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn copy() -> Value {
        json!({
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "kind": "ModuleTemplate",
            "metadata": {"name": "btp-1.0.0", "labels": {"operator.kyma-project.io/managed-by": "kyma"}},
            "spec": {"moduleName": "btp", "version": "1.0.0"},
        })
    }

    fn digest(edit: impl FnOnce(&mut Value)) -> CopyDigest {
        let mut object = copy();
        edit(&mut object);
        CopyDigest::of(&object)
    }

    #[test]
    fn an_object_only_catalog_sync_manages_needs_no_read() {
        let desired = CopyDigest::of(&copy());
        assert_eq!(after_apply([SKR_FIELD_MANAGER], None, &desired), AfterApply::OnlyOurs);
        assert_eq!(after_apply([SKR_FIELD_MANAGER, SKR_FIELD_MANAGER], None, &desired), AfterApply::OnlyOurs);
        // The managers decide before any read: a stale read does not matter.
        let other = digest(|o| o["spec"]["version"] = json!("9.9.9"));
        assert_eq!(after_apply([SKR_FIELD_MANAGER], Some(&other), &desired), AfterApply::OnlyOurs);
    }

    #[test]
    fn an_answer_without_field_managers_counts_as_only_ours() {
        let desired = CopyDigest::of(&copy());
        assert_eq!(after_apply([], None, &desired), AfterApply::OnlyOurs);
    }

    #[test]
    fn a_foreign_field_manager_asks_for_a_read() {
        let desired = CopyDigest::of(&copy());
        assert_eq!(after_apply([SKR_FIELD_MANAGER, "kubectl-edit"], None, &desired), AfterApply::ReadBack);
        assert_eq!(after_apply(["kubectl-edit"], None, &desired), AfterApply::ReadBack);
        assert_eq!(after_apply([""], None, &desired), AfterApply::ReadBack, "an unnamed manager is not ours");
    }

    #[test]
    fn foreign_labels_and_annotations_are_kept() {
        let desired = CopyDigest::of(&copy());
        let managers = [SKR_FIELD_MANAGER, "kubectl-edit"];
        let labelled = digest(|o| o["metadata"]["labels"]["team"] = json!("x"));
        assert_eq!(after_apply(managers, Some(&labelled), &desired), AfterApply::HoldsCopy);
        let annotated = digest(|o| o["metadata"]["annotations"] = json!({"note": "y"}));
        assert_eq!(after_apply(managers, Some(&annotated), &desired), AfterApply::HoldsCopy);
        let with_status = digest(|o| o["status"] = json!({"state": "Ready"}));
        assert_eq!(after_apply(managers, Some(&with_status), &desired), AfterApply::HoldsCopy);
    }

    #[test]
    fn a_foreign_field_that_changes_the_copy_is_replaced() {
        let desired = CopyDigest::of(&copy());
        let managers = [SKR_FIELD_MANAGER, "kubectl-edit"];
        let extra_spec = digest(|o| o["spec"]["extra"] = json!(true));
        assert_eq!(after_apply(managers, Some(&extra_spec), &desired), AfterApply::Replace);
        let relabelled = digest(|o| o["metadata"]["labels"]["operator.kyma-project.io/managed-by"] = json!("me"));
        assert_eq!(after_apply(managers, Some(&relabelled), &desired), AfterApply::Replace);
    }

    #[test]
    fn crds_are_checked_on_cold_syncs_and_after_kcp_changes_only() {
        assert_eq!(crd_check(false, Some(7), 7), CrdCheck::Cold);
        assert_eq!(crd_check(false, None, 7), CrdCheck::Cold);
        assert_eq!(crd_check(true, Some(6), 7), CrdCheck::KcpChanged);
        assert_eq!(crd_check(true, None, 7), CrdCheck::KcpChanged);
        assert_eq!(crd_check(true, Some(7), 7), CrdCheck::Skip);
    }

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "moduletemplates.operator.kyma-project.io",
                         "labels": {"operator.kyma-project.io/managed-by": "kyma"}},
            "spec": {"group": "operator.kyma-project.io", "conversion": {"strategy": "None"},
                     "versions": [{"name": "v1beta2", "served": true, "storage": true}]},
        })
    }

    #[test]
    fn a_crd_with_defaults_and_extra_labels_is_current() {
        let mut held = crd();
        held["metadata"]["labels"]["kubernetes.io/other"] = json!("x");
        held["metadata"]["resourceVersion"] = json!("12");
        held["spec"]["versions"][0]["deprecated"] = json!(false);
        held["spec"]["scope"] = json!("Namespaced");
        held["status"] = json!({"conditions": []});
        assert_eq!(crd_state(&crd(), Some(&held)), CrdState::Current);
        assert_eq!(crd_state(&crd(), Some(&crd())), CrdState::Current);
    }

    #[test]
    fn a_missing_crd_is_missing() {
        assert_eq!(crd_state(&crd(), None), CrdState::Missing);
    }

    #[test]
    fn a_crd_that_lost_a_field_or_label_differs() {
        let mut old_version = crd();
        old_version["spec"]["versions"][0]["name"] = json!("v1beta1");
        assert_eq!(crd_state(&crd(), Some(&old_version)), CrdState::Differs);
        let mut extra_version = crd();
        extra_version["spec"]["versions"] = json!([{"name": "v1beta2"}, {"name": "v1beta1"}]);
        assert_eq!(crd_state(&crd(), Some(&extra_version)), CrdState::Differs, "arrays compare element-wise");
        let mut converted = crd();
        converted["spec"]["conversion"] = json!({"strategy": "Webhook"});
        assert_eq!(crd_state(&crd(), Some(&converted)), CrdState::Differs);
        let mut unlabelled = crd();
        unlabelled["metadata"]["labels"] = json!({});
        assert_eq!(crd_state(&crd(), Some(&unlabelled)), CrdState::Differs);
        let mut no_labels = crd();
        no_labels["metadata"].as_object_mut().expect("an object").remove("labels");
        assert_eq!(crd_state(&crd(), Some(&no_labels)), CrdState::Differs);
    }
}
