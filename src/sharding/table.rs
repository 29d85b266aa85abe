//! `catalogsync shards`: the current assignment read from the Leases, like `kubectl get`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::api::{COORDINATOR_LEASE, Kyma, LEASE_TYPE_LABEL};
use crate::sharding::lease::{self, is_member, is_shard, live_members, member_left, shard_number};
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
    /// The shard count recorded in the config Lease; without one (older deployments), one more
    /// than the highest shard Lease number.
    pub shards: u32,
    /// Shards.
    pub rows: Vec<Row>,
}

/// What one holder has, from the rows of a [`Table`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// The shards it holds, in order.
    pub shards: Vec<u32>,
    /// SKRs (Kymas) in those shards.
    pub skrs: usize,
}

impl Table {
    /// Shards and SKRs per holder, by identity; the key `""` collects the unheld shards.
    pub fn holdings(&self) -> BTreeMap<&str, Holding> {
        let mut out: BTreeMap<&str, Holding> = BTreeMap::new();
        for r in &self.rows {
            let h = out.entry(r.holder.as_str()).or_default();
            h.shards.push(r.shard);
            h.skrs += r.skrs;
        }
        out
    }

    /// The row of the shard that Kyma `namespace/name` maps to, if that shard has a Lease.
    pub fn row_of(&self, namespace: &str, name: &str) -> Option<&Row> {
        if self.shards == 0 {
            return None;
        }
        let shard = shard_of(namespace, name, self.shards);
        self.rows.iter().find(|r| r.shard == shard)
    }
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
    // A member that marked its Lease as left is gone, as the coordinator sees it, though the
    // Lease has not expired yet.
    let members = live_members(leases.iter().filter(|l| is_member(l) && !member_left(l)), now);
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
    Table { coordinator, members, shards, rows }
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
    let holdings = table.holdings();
    let _ = writeln!(out);
    let coordinator = if table.coordinator.is_empty() { "<none>" } else { &table.coordinator };
    let _ = writeln!(out, "coordinator: {coordinator}");
    for m in &table.members {
        let (shards, skrs) = holdings.get(m.as_str()).map_or((0, 0), |h| (h.shards.len(), h.skrs));
        let _ = writeln!(out, "member {m}: {shards} shards, {skrs} SKRs");
    }
    if let Some(h) = holdings.get("") {
        let _ = writeln!(out, "unowned: {} shards, {} SKRs", h.shards.len(), h.skrs);
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
    fn a_member_that_left_is_not_live_though_its_lease_has_not_expired() {
        use crate::api::{MEMBER_LEFT_ANNOTATION, MEMBER_NONCE_ANNOTATION};
        let now = Timestamp::from_second(10_000).expect("valid");
        let mut left = new_member("b", "ns", 15, now);
        left.annotations_mut().insert(MEMBER_NONCE_ANNOTATION.to_owned(), "n1".to_owned());
        left.annotations_mut().insert(MEMBER_LEFT_ANNOTATION.to_owned(), "n1".to_owned());
        let leases = vec![new_member("a", "ns", 15, now), left, with_holder(&new_shard(0, "ns"), "b", now)];
        let table = build(&leases, &[], "a".into(), now);
        assert_eq!(table.members, ["a"]);
        assert_eq!(table.rows[0].state, "held-by-dead");
    }

    #[test]
    fn the_recorded_shard_count_wins_over_leftover_leases() {
        let now = Timestamp::from_second(10_000).expect("valid");
        let leases = vec![new_config(2, "ns"), new_shard(0, "ns"), new_shard(1, "ns"), new_shard(5, "ns")];
        let table = build(&leases, &[], String::new(), now);
        assert_eq!(table.rows.iter().map(|r| r.shard).collect::<Vec<_>>(), [0, 1], "shard 5 is left over");
        assert_eq!(table.shards, 2);
    }

    #[test]
    fn holdings_group_the_shards_by_holder_and_row_of_finds_a_kymas_shard() {
        let now = Timestamp::from_second(10_000).expect("valid");
        let held = |n, holder| with_holder(&new_shard(n, "ns"), holder, now);
        let leases = vec![
            new_config(4, "ns"),
            held(0, "a"),
            held(1, "b"),
            held(2, "a"),
            new_shard(3, "ns"),
            new_member("a", "ns", 15, now),
        ];
        let table = build(&leases, &[], "a".into(), now);
        let holdings = table.holdings();
        assert_eq!(holdings["a"].shards, [0, 2]);
        assert_eq!(holdings["b"].shards, [1]);
        assert_eq!(holdings[""].shards, [3], "the unheld shards");
        let row = table.row_of("kcp-system", "kyma-one").expect("every shard has a Lease");
        assert_eq!(row.shard, shard_of("kcp-system", "kyma-one", 4));
        assert!(build(&[], &[], String::new(), now).row_of("kcp-system", "kyma-one").is_none(), "no shards yet");
    }
}
