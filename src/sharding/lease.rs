//! Lease helpers: reading the fields the protocol uses, and writing with resourceVersion
//! preconditions so that concurrent writers cannot both win.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};

use crate::api::{
    CONFIG_LEASE, DESIRED_HOLDER_ANNOTATION, HANDOVER_STARTED_ANNOTATION, LEASE_TYPE_CONFIG, LEASE_TYPE_LABEL,
    LEASE_TYPE_MEMBER, LEASE_TYPE_SHARD, MEMBER_LEFT_ANNOTATION, MEMBER_NONCE_ANNOTATION, SHARDS_ANNOTATION,
    member_lease_name, shard_lease_name, shard_of_lease_name,
};
use crate::sharding::handover::LeaseState;

/// The shard number of a shard Lease, from its name.
pub fn shard_number(lease: &Lease) -> Option<u32> {
    shard_of_lease_name(&lease.name_any())
}

/// Whether a Lease is a shard Lease.
pub fn is_shard(lease: &Lease) -> bool {
    lease.labels().get(LEASE_TYPE_LABEL).map(String::as_str) == Some(LEASE_TYPE_SHARD)
}

/// Whether a Lease is a member Lease.
pub fn is_member(lease: &Lease) -> bool {
    lease.labels().get(LEASE_TYPE_LABEL).map(String::as_str) == Some(LEASE_TYPE_MEMBER)
}

/// Holder and desired holder of a shard Lease.
pub fn state(lease: &Lease) -> LeaseState {
    LeaseState {
        holder: lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default(),
        desired: lease.annotations().get(DESIRED_HOLDER_ANNOTATION).cloned().unwrap_or_default(),
    }
}

/// The replica a member Lease belongs to: its holder.
pub fn member_identity(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// What changes with every renewal of a member Lease, and with every new process holding it:
/// its `renewTime` and its process nonce. The coordinator judges liveness by when this
/// changes (see [`crate::sharding::liveness`]).
pub fn member_version(lease: &Lease) -> String {
    let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string()).unwrap_or_default();
    let nonce = lease.annotations().get(MEMBER_NONCE_ANNOTATION).map(String::as_str).unwrap_or_default();
    format!("{renewed}/{nonce}")
}

/// Whether a member Lease says its process shut down after releasing its shards: the left
/// annotation names the process nonce the Lease carries.
pub fn member_left(lease: &Lease) -> bool {
    let annotations = lease.annotations();
    let nonce = annotations.get(MEMBER_NONCE_ANNOTATION);
    nonce.is_some() && annotations.get(MEMBER_LEFT_ANNOTATION) == nonce
}

/// When a member Lease expires by its holder's clock: its renew time plus its duration. For
/// display (`catalogsync shards`); the coordinator does not compare clocks (see
/// [`crate::sharding::liveness`]).
pub fn expiry(lease: &Lease) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let secs = i64::from(spec.lease_duration_seconds?);
    renewed.checked_add(SignedDuration::from_secs(secs)).ok()
}

/// The live members: identities of member Leases that have a holder and have not expired at
/// `now`.
pub fn live_members<'a>(leases: impl IntoIterator<Item = &'a Lease>, now: Timestamp) -> Vec<String> {
    let mut out: Vec<String> = leases
        .into_iter()
        .filter(|l| is_member(l))
        .filter(|l| expiry(l).is_some_and(|e| e > now))
        .filter_map(|l| l.spec.as_ref()?.holder_identity.clone().filter(|h| !h.is_empty()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A new member Lease for `identity`.
pub fn new_member(identity: &str, namespace: &str, duration_secs: i32, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(member_lease_name(identity)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(LEASE_TYPE_LABEL.to_owned(), LEASE_TYPE_MEMBER.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// The shard count recorded in the config Lease, if it is one and names a count.
pub fn recorded_shards(lease: &Lease) -> Option<u32> {
    if lease.name_any() != CONFIG_LEASE {
        return None;
    }
    lease.annotations().get(SHARDS_ANNOTATION)?.trim().parse().ok()
}

/// A new config Lease recording `shards`.
pub fn new_config(shards: u32, namespace: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(CONFIG_LEASE.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(LEASE_TYPE_LABEL.to_owned(), LEASE_TYPE_CONFIG.to_owned())])),
            annotations: Some(BTreeMap::from([(SHARDS_ANNOTATION.to_owned(), shards.to_string())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec::default()),
    }
}

/// A new, unheld shard Lease.
pub fn new_shard(shard: u32, namespace: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(shard_lease_name(shard)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(LEASE_TYPE_LABEL.to_owned(), LEASE_TYPE_SHARD.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec { holder_identity: Some(String::new()), ..LeaseSpec::default() }),
    }
}

/// The process nonce of a shard Lease's holder; empty when it was released by the protocol.
pub fn holder_nonce(lease: &Lease) -> &str {
    lease.annotations().get(MEMBER_NONCE_ANNOTATION).map_or("", String::as_str)
}

/// `lease` claimed by `holder` in the process with `nonce`, as of `now`.
pub fn claimed(lease: &Lease, holder: &str, nonce: &str, now: Timestamp) -> Lease {
    let mut next = with_holder(lease, holder, now);
    next.annotations_mut().insert(MEMBER_NONCE_ANNOTATION.to_owned(), nonce.to_owned());
    next
}

/// `lease` released by the protocol (after a drain, or of an expired holder): no holder, no
/// holder nonce, so the next holder may start at once.
pub fn released(lease: &Lease, now: Timestamp) -> Lease {
    let mut next = with_holder(lease, "", now);
    next.annotations_mut().remove(MEMBER_NONCE_ANNOTATION);
    next
}

/// `lease` with holder `holder` (empty to release), as of `now`.
pub fn with_holder(lease: &Lease, holder: &str, now: Timestamp) -> Lease {
    let mut next = lease.clone();
    let spec = next.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(holder) {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.acquire_time = Some(MicroTime(now));
    }
    spec.holder_identity = Some(holder.to_owned());
    spec.renew_time = Some(MicroTime(now));
    next.metadata.managed_fields = None;
    next
}

/// `lease` with desired holder `desired`, stamped with the start of the handover.
pub fn with_desired(lease: &Lease, desired: &str, now: Timestamp) -> Lease {
    let mut next = lease.clone();
    let annotations = next.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(DESIRED_HOLDER_ANNOTATION.to_owned(), desired.to_owned());
    annotations.insert(HANDOVER_STARTED_ANNOTATION.to_owned(), now.to_string());
    next.metadata.managed_fields = None;
    next
}

/// When the handover of a shard Lease started, if stamped.
pub fn handover_started(lease: &Lease) -> Option<Timestamp> {
    lease.annotations().get(HANDOVER_STARTED_ANNOTATION)?.parse().ok()
}

/// Writes `lease` with the resourceVersion it carries as precondition (a PUT): fails with
/// 409 Conflict when someone else wrote the Lease since it was read. Bounded by `timeout`.
///
/// # Errors
/// The API error, or a timeout.
pub async fn write(api: &Api<Lease>, lease: &Lease, timeout: std::time::Duration) -> Result<Lease, kube::Error> {
    crate::kcp::bounded(timeout, api.replace(&lease.name_any(), &PostParams::default(), lease)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_members_are_unexpired_member_leases() {
        let t0 = Timestamp::from_second(1_000).expect("valid");
        let fresh = new_member("a", "ns", 15, t0);
        let stale = new_member("b", "ns", 15, t0.checked_sub(SignedDuration::from_secs(20)).expect("valid"));
        let shard = new_shard(0, "ns");
        assert_eq!(live_members([&fresh, &stale, &shard], t0), vec!["a".to_owned()]);
        assert_eq!(shard_number(&shard), Some(0));
        assert!(is_shard(&shard) && !is_member(&shard));
    }

    #[test]
    fn holder_changes_count_transitions() {
        let t0 = Timestamp::from_second(1_000).expect("valid");
        let lease = with_holder(&new_shard(3, "ns"), "a", t0);
        assert_eq!(state(&lease).holder, "a");
        assert_eq!(lease.spec.as_ref().and_then(|s| s.lease_transitions), Some(1));
        let desired = with_desired(&lease, "b", t0);
        assert_eq!(state(&desired), LeaseState { holder: "a".into(), desired: "b".into() });
        assert_eq!(handover_started(&desired), Some(t0));
    }
}
