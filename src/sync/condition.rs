//! The `ModuleCatalog` condition: computing it (pure) and deciding whether it needs a write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ManagedFieldsEntry, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::api::{GROUP, KCP_FIELD_MANAGER, Kyma, MODULE_CATALOG_CONDITION, VERSION};
use crate::error::ConditionReason;

use crate::api::ConditionStatus;

/// The condition catalogsync wants on a Kyma, without timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// `True` or `False`.
    pub status: ConditionStatus,
    /// CamelCase reason.
    pub reason: ConditionReason,
    /// Human-actionable message.
    pub message: String,
    /// The Kyma generation seen.
    pub observed_generation: Option<i64>,
}

/// The current `ModuleCatalog` condition of a Kyma, if any.
pub fn current(kyma: &Kyma) -> Option<&Condition> {
    kyma.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == MODULE_CATALOG_CONDITION)
}

/// Whether a managed-fields entry owns (part of) the `ModuleCatalog` condition: its
/// `fieldsV1` has `f:status` / `f:conditions` / `k:{"type":"ModuleCatalog"}`.
fn owns_condition(entry: &ManagedFieldsEntry) -> bool {
    let Some(conditions) = entry
        .fields_v1
        .as_ref()
        .and_then(|f| f.0.get("f:status"))
        .and_then(|status| status.get("f:conditions"))
        .and_then(Value::as_object)
    else {
        return false;
    };
    conditions.keys().filter_map(|key| key.strip_prefix("k:")).any(|key| {
        serde_json::from_str::<Value>(key)
            .is_ok_and(|k| k.get("type").and_then(Value::as_str) == Some(MODULE_CATALOG_CONDITION))
    })
}

/// The managed-fields entries of a Kyma that own its `ModuleCatalog` condition, without their
/// field sets (all that is kept of a Kyma's managed fields in the cache).
pub fn condition_owners(entries: &[ManagedFieldsEntry]) -> Vec<ManagedFieldsEntry> {
    entries
        .iter()
        .filter(|e| owns_condition(e))
        .map(|e| ManagedFieldsEntry {
            manager: e.manager.clone(),
            operation: e.operation.clone(),
            subresource: e.subresource.clone(),
            time: e.time.clone(),
            ..ManagedFieldsEntry::default()
        })
        .collect()
}

/// How long after another applier's last write of the Kyma's status its ownership of the
/// `ModuleCatalog` condition still counts as a contest. lifecycle-manager resets every
/// condition and applies the whole status on every reconcile, at least every 5 minutes (its
/// Ready requeue), and its `lastTransitionTime`s change each time, so its managed-fields time
/// moves at least that often while it runs; three of its periods are the bound. An owner whose
/// last write is older (lifecycle-manager removed or stopped, a hand apply of long ago) no
/// longer silences catalogsync, whose forced apply then takes the condition back.
pub const CONTEST_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The field manager, other than catalogsync, that keeps applying the Kyma's `ModuleCatalog`
/// condition at `now`, if any: an owner of the condition whose operation is `Apply` (a
/// server-side applier states its intent on every write, as lifecycle-manager's forced status
/// apply does) and whose last write is less than [`CONTEST_STALE_AFTER`] old (an entry
/// without a time counts as fresh). An owner by `Update` (a one-off edit) is not a contest;
/// catalogsync's forced apply takes the fields over from it. `kyma` must carry the entries
/// [`condition_owners`] keeps.
pub fn contested_by(kyma: &Kyma, now: Timestamp) -> Option<&str> {
    kyma.metadata.managed_fields.iter().flatten().find_map(|e| {
        let manager = e.manager.as_deref()?;
        let fresh =
            e.time.as_ref().is_none_or(|t| now.duration_since(t.0).as_secs() < CONTEST_STALE_AFTER.as_secs() as i64);
        (manager != KCP_FIELD_MANAGER && e.operation.as_deref() == Some("Apply") && owns_condition_kept(e) && fresh)
            .then_some(manager)
    })
}

/// Whether a cached entry (field set already dropped by [`condition_owners`]) or a full one
/// owns the condition.
fn owns_condition_kept(entry: &ManagedFieldsEntry) -> bool {
    entry.fields_v1.is_none() || owns_condition(entry)
}

/// Whether catalogsync still owns a part of the Kyma's `ModuleCatalog` condition. Beside
/// another applier it must let go of it: a field both applied with the same value stays
/// shared, and when the other manager later leaves the condition out of its apply, the
/// remains (`type`, `status`) would make that apply fail validation. `kyma` must carry the
/// entries [`condition_owners`] keeps.
pub fn owned_by_us(kyma: &Kyma) -> bool {
    kyma.metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|e| e.manager.as_deref() == Some(KCP_FIELD_MANAGER) && owns_condition_kept(e))
}

/// The status apply body that gives up every status field catalogsync owns: an apply
/// without them leaves them to their other owners (and removes those nobody else owns).
pub fn release_body(kyma: &Kyma) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Kyma",
        "metadata": {"name": kyma.metadata.name, "namespace": kyma.metadata.namespace},
    })
}

/// Whether `current` already says what `wanted` says (no write needed).
pub fn is_current(current: Option<&Condition>, wanted: &Wanted) -> bool {
    current.is_some_and(|c| {
        c.status == wanted.status.as_str()
            && c.reason == wanted.reason.as_str()
            && c.message == wanted.message
            && c.observed_generation == wanted.observed_generation
    })
}

/// The status apply body for `wanted`. `lastTransitionTime` moves only when the status
/// changes.
pub fn apply_body(kyma: &Kyma, current: Option<&Condition>, wanted: &Wanted, now: Timestamp) -> Value {
    let transition = match current {
        Some(c) if c.status == wanted.status.as_str() => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let condition = Condition {
        type_: MODULE_CATALOG_CONDITION.to_owned(),
        status: wanted.status.as_str().to_owned(),
        reason: wanted.reason.as_str().to_owned(),
        message: wanted.message.clone(),
        observed_generation: wanted.observed_generation,
        last_transition_time: transition,
    };
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Kyma",
        "metadata": {"name": kyma.metadata.name, "namespace": kyma.metadata.namespace},
        "status": {"conditions": [condition]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kyma_with(status: &str, reason: &str, message: &str, at: Timestamp) -> Kyma {
        let mut k = Kyma::new("k", Default::default());
        k.status = Some(crate::api::KymaStatus {
            conditions: Some(vec![Condition {
                type_: MODULE_CATALOG_CONDITION.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                observed_generation: Some(1),
                last_transition_time: Time(at),
            }]),
            ..Default::default()
        });
        k
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let then = Timestamp::from_second(1_000).expect("valid");
        let now = Timestamp::from_second(2_000).expect("valid");
        let kyma = kyma_with("False", "SkrUnreachable", "down", then);
        let cur = current(&kyma);
        let still_false = Wanted {
            status: ConditionStatus::False,
            reason: ConditionReason::ApplyFailed,
            message: "x".into(),
            observed_generation: Some(1),
        };
        assert!(!is_current(cur, &still_false));
        let body = apply_body(&kyma, cur, &still_false, now);
        assert_eq!(body["status"]["conditions"][0]["lastTransitionTime"], json!(Time(then)));
        let now_true = Wanted {
            status: ConditionStatus::True,
            reason: ConditionReason::CatalogSynced,
            message: "ok".into(),
            observed_generation: Some(1),
        };
        let body = apply_body(&kyma, cur, &now_true, now);
        assert_eq!(body["status"]["conditions"][0]["lastTransitionTime"], json!(Time(now)));
    }

    fn entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            subresource: Some("status".into()),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn another_applier_of_the_condition_contests_it() {
        let catalog = json!({"f:status": {"f:conditions": {
            "k:{\"type\":\"CRDsSync\"}": {".": {}},
            "k:{\"type\":\"ModuleCatalog\"}": {".": {}, "f:status": {}},
        }}});
        let other = json!({"f:status": {"f:conditions": {"k:{\"type\":\"Modules\"}": {".": {}}}, "f:state": {}}});
        let entries = vec![
            entry("lifecycle-manager", "Apply", catalog.clone()),
            entry("kubectl-edit", "Update", catalog.clone()),
            entry("someone", "Apply", other),
            entry(KCP_FIELD_MANAGER, "Apply", catalog),
        ];
        let kept = condition_owners(&entries);
        let managers: Vec<_> = kept.iter().filter_map(|e| e.manager.as_deref()).collect();
        assert_eq!(managers, ["lifecycle-manager", "kubectl-edit", KCP_FIELD_MANAGER]);
        assert!(kept.iter().all(|e| e.fields_v1.is_none()), "field sets are not kept");

        let now = Timestamp::from_second(100_000).expect("valid");
        let mut kyma = Kyma::new("k", Default::default());
        kyma.metadata.managed_fields = Some(kept);
        assert_eq!(contested_by(&kyma, now), Some("lifecycle-manager"));
        kyma.metadata.managed_fields = Some(condition_owners(&entries[1..]));
        assert_eq!(contested_by(&kyma, now), None, "a one-off Update and catalogsync itself do not contest it");
        kyma.metadata.managed_fields = Some(entries[2..3].to_vec());
        assert_eq!(contested_by(&kyma, now), None, "an applier of other conditions does not contest it");
    }

    /// An applier that stopped writing (lifecycle-manager removed while it owned the
    /// condition, a hand apply of long ago) contests the condition only for
    /// [`CONTEST_STALE_AFTER`] after its last write; then catalogsync takes it back.
    #[test]
    fn a_contest_lasts_only_while_the_other_applier_keeps_writing() {
        let catalog = json!({"f:status": {"f:conditions": {"k:{\"type\":\"ModuleCatalog\"}": {".": {}}}}});
        let written = Timestamp::from_second(100_000).expect("valid");
        let mut applied = entry("sre-by-hand", "Apply", catalog);
        applied.time = Some(Time(written));
        let mut kyma = Kyma::new("k", Default::default());
        kyma.metadata.managed_fields = Some(condition_owners(&[applied]));
        let after = |secs: i64| Timestamp::from_second(100_000 + secs).expect("valid");
        assert_eq!(contested_by(&kyma, after(60)), Some("sre-by-hand"));
        let stale = CONTEST_STALE_AFTER.as_secs() as i64;
        assert_eq!(contested_by(&kyma, after(stale - 1)), Some("sre-by-hand"));
        assert_eq!(contested_by(&kyma, after(stale)), None, "a contest ends when the other applier stops writing");
    }

    #[test]
    fn unchanged_condition_needs_no_write() {
        let at = Timestamp::from_second(1_000).expect("valid");
        let kyma = kyma_with("True", "CatalogSynced", "ok", at);
        let wanted = Wanted {
            status: ConditionStatus::True,
            reason: ConditionReason::CatalogSynced,
            message: "ok".into(),
            observed_generation: Some(1),
        };
        assert!(is_current(current(&kyma), &wanted));
    }
}
