//! `catalogsync shards`: the current assignment read from the Leases, like `kubectl get`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::api::{COORDINATOR_LEASE, Kyma, LEASE_TYPE_LABEL};
use crate::sharding::lease::{self, is_member, is_shard, live_members, shard_number};
use crate::sharding::ring::shard_of;

/// One shard in the table.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Row {
    /// Shard number.
    pub shard: u32,
    /// Holder, empty when unheld.
    pub holder: String,
    /// Desired holder.
    pub desired: String,
    /// SKRs (Kymas) in the shard.
    pub skrs: usize,
    /// held, moving, unowned or held-by-dead.
    pub state: &'static str,
}

/// The whole view.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Table {
    /// Coordinator identity, if any.
    pub coordinator: String,
    /// Live members.
    pub members: Vec<String>,
    /// Shards.
    pub rows: Vec<Row>,
}

/// Reads the Leases in `lease_namespace` and the Kymas in `kcp_namespace`.
///
/// # Errors
/// The API error of a failed list.
pub async fn read(client: &Client, lease_namespace: &str, kcp_namespace: &str) -> Result<Table, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), lease_namespace);
    let all = leases.list(&ListParams::default().labels(LEASE_TYPE_LABEL)).await?.items;
    let coordinator =
        leases.get_opt(COORDINATOR_LEASE).await?.and_then(|l| l.spec?.holder_identity).unwrap_or_default();
    let kymas: Api<PartialObjectMeta<Kyma>> = Api::namespaced(client.clone(), kcp_namespace);
    let kymas = kymas.list(&ListParams::default()).await?.items;
    Ok(build(&all, &kymas, coordinator, Timestamp::now()))
}

/// Builds the table (pure).
pub fn build(leases: &[Lease], kymas: &[PartialObjectMeta<Kyma>], coordinator: String, now: Timestamp) -> Table {
    let members = live_members(leases.iter().filter(|l| is_member(l)), now);
    let mut shard_leases: BTreeMap<u32, &Lease> =
        leases.iter().filter(|l| is_shard(l)).filter_map(|l| Some((shard_number(l)?, l))).collect();
    // The recorded shard count; without one (older deployments), the highest Lease number.
    let shards = leases
        .iter()
        .find_map(lease::recorded_shards)
        .unwrap_or_else(|| shard_leases.keys().next_back().map_or(0, |m| m + 1));
    shard_leases.retain(|n, _| *n < shards);
    let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
    if shards > 0 {
        for k in kymas {
            *counts.entry(shard_of(&k.namespace().unwrap_or_default(), &k.name_any(), shards)).or_default() += 1;
        }
    }
    let rows = shard_leases
        .iter()
        .map(|(shard, l)| {
            let st = lease::state(l);
            let state = if st.holder.is_empty() {
                "unowned"
            } else if !members.contains(&st.holder) {
                "held-by-dead"
            } else if !st.desired.is_empty() && st.desired != st.holder {
                "moving"
            } else {
                "held"
            };
            Row {
                shard: *shard,
                holder: st.holder,
                desired: st.desired,
                skrs: counts.get(shard).copied().unwrap_or(0),
                state,
            }
        })
        .collect();
    Table { coordinator, members, rows }
}

/// Renders the table like `kubectl get`.
pub fn render(table: &Table) -> String {
    let width = |f: &dyn Fn(&Row) -> usize, title: usize| table.rows.iter().map(f).max().unwrap_or(0).max(title);
    let hw = width(&|r| r.holder.len().max(6), 6);
    let dw = width(&|r| r.desired.len().max(6), 7);
    let mut out = String::new();
    let _ = writeln!(out, "{:<6} {:<hw$} {:<dw$} {:>5} STATE", "SHARD", "HOLDER", "DESIRED", "SKRS");
    for r in &table.rows {
        let holder = if r.holder.is_empty() { "<none>" } else { &r.holder };
        let desired = if r.desired.is_empty() { "<none>" } else { &r.desired };
        let _ = writeln!(out, "{:<6} {:<hw$} {:<dw$} {:>5} {}", r.shard, holder, desired, r.skrs, r.state);
    }
    let mut per_member: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for r in &table.rows {
        let e = per_member.entry(r.holder.as_str()).or_default();
        e.0 += 1;
        e.1 += r.skrs;
    }
    let _ = writeln!(out);
    let coordinator = if table.coordinator.is_empty() { "<none>" } else { &table.coordinator };
    let _ = writeln!(out, "coordinator: {coordinator}");
    for m in &table.members {
        let (shards, skrs) = per_member.get(m.as_str()).copied().unwrap_or_default();
        let _ = writeln!(out, "member {m}: {shards} shards, {skrs} SKRs");
    }
    if let Some((shards, skrs)) = per_member.get("") {
        let _ = writeln!(out, "unowned: {shards} shards, {skrs} SKRs");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharding::lease::{new_config, new_member, new_shard, with_desired, with_holder};

    #[test]
    fn table_shows_holders_states_and_counts() {
        let now = Timestamp::from_second(10_000).expect("valid");
        let leases = vec![
            new_member("a", "ns", 15, now),
            with_holder(&with_desired(&new_shard(0, "ns"), "a", now), "a", now),
            with_holder(&with_desired(&new_shard(1, "ns"), "a", now), "b", now),
            with_desired(&new_shard(2, "ns"), "a", now),
        ];
        let table = build(&leases, &[], "a".into(), now);
        let states: Vec<&str> = table.rows.iter().map(|r| r.state).collect();
        assert_eq!(states, ["held", "held-by-dead", "unowned"]);
        let text = render(&table);
        assert!(text.contains("coordinator: a"), "{text}");
        assert!(text.contains("member a: 1 shards"), "{text}");
    }

    #[test]
    fn the_recorded_shard_count_wins_over_leftover_leases() {
        let now = Timestamp::from_second(10_000).expect("valid");
        let leases = vec![new_config(2, "ns"), new_shard(0, "ns"), new_shard(1, "ns"), new_shard(5, "ns")];
        let table = build(&leases, &[], String::new(), now);
        assert_eq!(table.rows.iter().map(|r| r.shard).collect::<Vec<_>>(), [0, 1], "shard 5 is left over");
    }
}
