//! The `ModuleCatalog` condition: computing it (pure) and deciding whether it needs a write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::api::{GROUP, Kyma, MODULE_CATALOG_CONDITION, VERSION};
use crate::error::ConditionReason;

crate::label_enum! {
    /// The status of the `ModuleCatalog` condition; also the `status` label of
    /// `catalogsync_kyma_condition_writes_total`.
    pub enum ConditionStatus {
        /// The SKR holds the desired catalog.
        True => "True",
        /// The last sync failed.
        False => "False",
    }
}

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
