//! The coordinator's shard Lease updates as a pure function: given what it observed (the
//! shard Leases, the live members, whether it has settled, which shard Leases cool down) and
//! the time, [`updates`] says which shard Leases to create and which to change: a new desired
//! holder, a holder to clear, or both. `sharding::coordinator` reads the Leases, confirms each
//! forced takeover with a fresh read, and writes what this returns.
//!
//! Rules, per shard `0..shards`:
//!
//! - **No Lease:** create it (unheld, unassigned); it is assigned in a later pass, once the
//!   cache holds it.
//! - **Assignment:** [`ring::assign`](crate::sharding::ring::assign) over the live members,
//!   where a shard's current member is its desired holder, else its holder, if that one is
//!   live. A shard whose desired holder differs from the assignment gets the new one, except
//!   - while the coordinator has not settled (a lease duration after a lapse of its own member
//!     Lease: its cache may miss the others' renewals), when only shards nobody holds are
//!     assigned;
//!   - while its Lease cools down (recreated by hand: its old holder's requests may still be in
//!     flight).
//! - **Forced takeover:** once settled, a shard whose holder is not live has that holder
//!   cleared ([`may_force_release`]), after the coordinator re-read the holder's member Lease.
//! - **No live member:** nothing to assign to, so no shard Lease changes.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use crate::sharding::handover::{LeaseState, may_force_release};
use crate::sharding::ring::assign;

/// What the coordinator observed, as plain data.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The shard count (`--shards`).
    pub shards: u32,
    /// Holder and desired holder of each shard Lease present, by shard number (below
    /// `shards`).
    pub leases: &'a BTreeMap<u32, LeaseState>,
    /// The members alive now, sorted (see [`crate::sharding::liveness::Liveness::live`]).
    pub live: &'a [String],
    /// Until when no held shard moves; at start, or from a fresh list, at once.
    pub settling_until: Instant,
    /// Shards whose Lease was recreated and is left unassigned for now.
    pub cooling: &'a BTreeSet<u32>,
}

/// A change of the desired holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The desired holder the Lease names now (empty when none).
    pub from: String,
    /// The new desired holder; the write also stamps the start of the handover.
    pub to: String,
}

/// The changes to one shard Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseUpdate {
    /// Shard number.
    pub shard: u32,
    /// A new desired holder, if the assignment moved the shard.
    pub assign: Option<Assignment>,
    /// The holder to clear (a forced takeover): its member Lease expired. Cleared only when a
    /// fresh read of that member Lease confirms it.
    pub release: Option<String>,
}

/// Everything one coordination pass writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Updates {
    /// Shards that have no Lease yet, in order: create each, unheld.
    pub create: Vec<u32>,
    /// Changes to existing shard Leases, in shard order; shards left as they are have none.
    pub leases: Vec<LeaseUpdate>,
}

/// Decides one coordination pass at `now` (see the module docs for the rules).
pub fn updates(observed: &Observation<'_>, now: Instant) -> Updates {
    let create = (0..observed.shards).filter(|s| !observed.leases.contains_key(s)).collect();
    if observed.live.is_empty() {
        return Updates { create, leases: Vec::new() };
    }
    let live = |member: &str| observed.live.iter().any(|m| m == member);
    let current: BTreeMap<u32, String> = observed
        .leases
        .iter()
        .filter_map(|(shard, st)| {
            let pick = [&st.desired, &st.holder].into_iter().find(|m| live(m))?;
            Some((*shard, pick.clone()))
        })
        .collect();
    let target = assign(observed.shards, observed.live, &current);
    let settled = now >= observed.settling_until;
    let leases = observed
        .leases
        .iter()
        .filter_map(|(shard, st)| {
            let want = target.get(shard).cloned().unwrap_or_default();
            let reassign = st.desired != want && (settled || st.holder.is_empty()) && !observed.cooling.contains(shard);
            let release = settled && may_force_release(&st.holder, live(&st.holder));
            if !reassign && !release {
                return None;
            }
            Some(LeaseUpdate {
                shard: *shard,
                assign: reassign.then(|| Assignment { from: st.desired.clone(), to: want }),
                release: release.then(|| st.holder.clone()),
            })
        })
        .collect();
    Updates { create, leases }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn lease(holder: &str, desired: &str) -> LeaseState {
        LeaseState { holder: holder.to_owned(), desired: desired.to_owned() }
    }

    /// Shard Leases each held by, and desired for, the member `ring::assign` places it on.
    fn settled_on(shards: u32, on: &[&str]) -> BTreeMap<u32, LeaseState> {
        assign(shards, &members(on), &BTreeMap::new()).into_iter().map(|(s, m)| (s, lease(&m, &m))).collect()
    }

    struct Pass {
        shards: u32,
        leases: BTreeMap<u32, LeaseState>,
        live: Vec<String>,
        settling_until: Instant,
        cooling: BTreeSet<u32>,
    }

    impl Pass {
        fn new(leases: BTreeMap<u32, LeaseState>, live: &[&str]) -> Self {
            let shards = u32::try_from(leases.len()).expect("few shards");
            Self { shards, leases, live: members(live), settling_until: Instant::now(), cooling: BTreeSet::new() }
        }

        fn run(&self, now: Instant) -> Updates {
            let observed = Observation {
                shards: self.shards,
                leases: &self.leases,
                live: &self.live,
                settling_until: self.settling_until,
                cooling: &self.cooling,
            };
            updates(&observed, now)
        }
    }

    fn assigned(to: &str, from: &str) -> Option<Assignment> {
        Some(Assignment { from: from.to_owned(), to: to.to_owned() })
    }

    #[test]
    fn a_well_placed_shard_is_not_touched() {
        let pass = Pass::new(settled_on(8, &["a", "b"]), &["a", "b"]);
        assert_eq!(pass.run(Instant::now()), Updates::default());
    }

    #[test]
    fn a_new_member_gets_its_shards_and_nothing_else_moves() {
        let pass = Pass::new(settled_on(9, &["a", "b"]), &["a", "b", "c"]);
        let got = pass.run(Instant::now());
        assert!(got.create.is_empty());
        assert_eq!(got.leases.len(), 3, "c takes a third of the shards: {got:?}");
        for update in &got.leases {
            let before = &pass.leases[&update.shard].desired;
            assert_eq!(update.assign, assigned("c", before), "only moves to the newcomer");
            assert_eq!(update.release, None, "nobody died");
        }
    }

    #[test]
    fn a_handover_in_progress_is_left_alone() {
        // Shard 3 is desired on b and still held by a (draining there): b is its current member,
        // and with it the assignment is balanced.
        let leases =
            BTreeMap::from([(0, lease("a", "a")), (1, lease("a", "a")), (2, lease("b", "b")), (3, lease("a", "b"))]);
        let pass = Pass::new(leases, &["a", "b"]);
        assert_eq!(pass.run(Instant::now()), Updates::default());
    }

    #[test]
    fn a_missing_shard_lease_is_created_and_assigned_later() {
        let mut leases = settled_on(4, &["a"]);
        leases.remove(&3);
        let mut pass = Pass::new(leases, &["a"]);
        pass.shards = 4;
        let got = pass.run(Instant::now());
        assert_eq!(got, Updates { create: vec![3], leases: Vec::new() });
    }

    #[test]
    fn unheld_shards_are_assigned() {
        let leases: BTreeMap<u32, LeaseState> = (0..4).map(|s| (s, lease("", ""))).collect();
        let pass = Pass::new(leases, &["a"]);
        let got = pass.run(Instant::now());
        let expected: Vec<LeaseUpdate> =
            (0..4).map(|shard| LeaseUpdate { shard, assign: assigned("a", ""), release: None }).collect();
        assert_eq!(got.leases, expected);
    }

    #[test]
    fn a_cooling_shard_is_skipped() {
        let leases: BTreeMap<u32, LeaseState> = (0..4).map(|s| (s, lease("", ""))).collect();
        let mut pass = Pass::new(leases, &["a"]);
        pass.cooling = BTreeSet::from([1]);
        let got = pass.run(Instant::now());
        let shards: Vec<u32> = got.leases.iter().map(|u| u.shard).collect();
        assert_eq!(shards, [0, 2, 3]);
    }

    #[test]
    fn a_dead_holder_is_released_once_settled() {
        // x held shards 0 and 1 and is gone; a is the only live member and already desired
        // for shard 1.
        let leases = BTreeMap::from([(0, lease("x", "x")), (1, lease("x", "a"))]);
        let pass = Pass::new(leases, &["a"]);
        let got = pass.run(Instant::now());
        assert_eq!(
            got.leases,
            [
                LeaseUpdate { shard: 0, assign: assigned("a", "x"), release: Some("x".to_owned()) },
                LeaseUpdate { shard: 1, assign: None, release: Some("x".to_owned()) },
            ]
        );
    }

    #[test]
    fn a_live_holder_is_never_released() {
        let leases = BTreeMap::from([(0, lease("a", "a")), (1, lease("b", "a"))]);
        let pass = Pass::new(leases, &["a", "b"]);
        let got = pass.run(Instant::now());
        assert!(got.leases.iter().all(|u| u.release.is_none()), "{got:?}");
    }

    #[test]
    fn until_settled_only_unheld_shards_move() {
        let start = Instant::now();
        let leases = BTreeMap::from([(0, lease("x", "x")), (1, lease("", "")), (2, lease("b", "b"))]);
        let mut pass = Pass::new(leases, &["a"]);
        pass.settling_until = start + Duration::from_secs(15);

        // Before: the unheld shard is assigned; x is not released and its shard stays put,
        // nor does the shard of b (not seen live yet) move.
        let before = pass.run(start + Duration::from_secs(14));
        assert_eq!(before.leases, [LeaseUpdate { shard: 1, assign: assigned("a", ""), release: None }]);

        // Settled: the held shards move too, and their dead holders are released.
        let after = pass.run(start + Duration::from_secs(15));
        assert_eq!(
            after.leases,
            [
                LeaseUpdate { shard: 0, assign: assigned("a", "x"), release: Some("x".to_owned()) },
                LeaseUpdate { shard: 1, assign: assigned("a", ""), release: None },
                LeaseUpdate { shard: 2, assign: assigned("a", "b"), release: Some("b".to_owned()) },
            ]
        );
    }

    #[test]
    fn without_live_members_nothing_changes_but_missing_leases_are_created() {
        let leases = BTreeMap::from([(0, lease("x", "x")), (2, lease("", ""))]);
        let mut pass = Pass::new(leases, &[]);
        pass.shards = 3;
        assert_eq!(pass.run(Instant::now()), Updates { create: vec![1], leases: Vec::new() });
    }
}
