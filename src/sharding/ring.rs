//! Pure shard placement: which shard a Kyma is in, and which member should hold each shard.
//!
//! This module owns two functions and holds no client, no clock and no I/O (a pure module,
//! see "Module map" in docs/architecture.md): the coordinator feeds it the live members and
//! the current holders it read from the Leases, and writes back what it returns.
//!
//! - [`shard_of`]: `xxh3_64("<namespace>/<name>") mod S`. xxh3 is specified and unseeded, so
//!   every replica and every version of the binary maps a Kyma to the same shard.
//! - [`assign`]: a sticky, capped, consistent assignment of the shards `0..S` to `n` members.
//!
//! # How [`assign`] works
//!
//! 1. **Preference order.** A consistent-hash ring (`consistent_hash::StaticHashRing`) with
//!    [`VNODES_PER_MEMBER`] virtual nodes per member gives each shard an order of preference
//!    over the members. All hashing is xxh3 over explicit bytes (the member identity followed by
//!    the vnode index as a little-endian `u64`; `shard-<i>` for a shard), never `std::hash` with
//!    a per-process key, so all replicas compute the same order. The order depends only on the
//!    *set* of members, and adding or removing a member does not reorder the others.
//! 2. **Stickiness.** A shard whose current holder is live stays with it, but a member keeps at
//!    most `cap = ceil(S/n)` shards; a member over the cap keeps the shards it ranks best on
//!    (ties by shard number) and releases the rest.
//! 3. **Placement.** Each unplaced shard (dead holder, released, or new), in shard order, goes to
//!    the first member in its preference order that holds fewer than `floor = S/n` shards or, when
//!    every member has reached the floor, fewer than `cap`.
//! 4. **Balance.** While a member holds fewer than `floor`, it takes one shard from a member above
//!    `floor`: the one it ranks best on. Only members under the floor receive.
//!
//! # Why
//!
//! The cap and the floor give balance: every member ends with `floor` or `cap` shards, so the
//! busiest holds at most `ceil(S/n)` (Guarantee 4 in docs/architecture.md). Stickiness gives
//! minimal movement (Guarantee 3): from a balanced assignment, a member that joins receives
//! only the shards the others shed above the new cap, then up to the new floor, so only shards
//! *to the newcomer* move; a member that leaves moves only its own shards, because the survivors
//! are all at or above their old floor and the new cap has room for them. The ring makes every
//! choice that stickiness leaves open deterministic and spread evenly over the members.
//!
//! Step 3 deviates from the plain "first member under the cap" of the recommended shape on purpose:
//! filling members up to the floor before any reaches the cap means a member that leaves never
//! causes balance moves between the members that stayed. Step 4 is only a safety net for a
//! `current` that was not produced by this function (for example, hand-edited Lease annotations).
//!
//! # Caveats
//!
//! Balance is in shards, not Kymas: with `S = 32` a member holds `floor` or `cap` shards of about
//! `K/S` Kymas each, so the busiest member's Kyma count is about `cap / (S/n)` of the mean, plus
//! the hash noise per shard. More shards smooth this out.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use consistent_hash::{Node, RingHash, StaticHashRing};
use xxhash_rust::xxh3::xxh3_64;

#[cfg(test)]
mod tests;

/// Virtual nodes per member on the ring.
///
/// With stickiness and the cap doing the balancing, vnodes only spread each member's first
/// choices evenly: a member's share of the ring varies by about `1/sqrt(128)`, 9%, at a cost of
/// `128 x n` xxh3 hashes per call (dependencies.md asks for at least 64; timebertt's sharder uses
/// 100).
pub const VNODES_PER_MEMBER: usize = 128;

/// The shard of a Kyma: xxh3_64 of the bytes `"<namespace>/<name>"` modulo `shards`.
///
/// Stable across processes and binary versions (xxh3 is unseeded and specified).
///
/// # Caveats
///
/// `shards == 0` is treated as one shard, so the result is always `0` then.
pub fn shard_of(namespace: &str, name: &str, shards: u32) -> u32 {
    let mut key = Vec::with_capacity(namespace.len() + 1 + name.len());
    key.extend_from_slice(namespace.as_bytes());
    key.push(b'/');
    key.extend_from_slice(name.as_bytes());
    let shard = xxh3_64(&key) % u64::from(shards.max(1));
    // The remainder is below `shards`, which is a `u32`.
    u32::try_from(shard).unwrap_or(0)
}

/// Computes which member should hold each shard `0..shards`.
///
/// `members` are the live member identities, in any order (duplicates are ignored). `current` is
/// the holder, or desired holder, each shard has now; entries naming members that are not live,
/// or shards outside `0..shards`, are ignored.
///
/// Returns a map from shard to member with an entry for every shard when `members` is non-empty,
/// and an empty map when it is empty.
///
/// # Guarantees
///
/// - Every member holds `floor(S/n)` or `ceil(S/n)` shards.
/// - The result depends only on the set of members and on `current`, never on the order of
///   `members` or on the process.
/// - `assign(S, m, &assign(S, m, c)) == assign(S, m, c)`: a balanced assignment is kept as is.
/// - From a balanced assignment, adding a member moves shards only to it (at most
///   `ceil(S/(n+1))`); removing a member moves only that member's shards.
///
/// # Caveats
///
/// The movement guarantees assume `current` is balanced for the old members (every output of
/// this function is). From an arbitrary `current`, step 4 may move shards between live members
/// to restore the floor. A call costs `O(n x VNODES_PER_MEMBER x log)` for the ring plus
/// `O(S x n)`; both are small for the shard and replica counts this controller runs with.
pub fn assign(shards: u32, members: &[String], current: &BTreeMap<u32, String>) -> BTreeMap<u32, String> {
    let members: Vec<&str> = members.iter().map(String::as_str).collect::<BTreeSet<_>>().into_iter().collect();
    if members.is_empty() || shards == 0 {
        return BTreeMap::new();
    }
    let n = members.len();
    let s = shards as usize;
    let cap = s.div_ceil(n);
    let floor = s / n;
    // Step 1: preference order.
    let order = preference_orders(shards, &members);
    let rank = ranks(&order);

    // Step 2: stickiness, trimmed to the cap.
    let mut holder: Vec<Option<usize>> = vec![None; s];
    for (&shard, member) in current.range(..shards) {
        if let Ok(m) = members.binary_search(&member.as_str()) {
            holder[shard as usize] = Some(m);
        }
    }
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (shard, h) in holder.iter().enumerate() {
        if let Some(m) = *h {
            held[m].push(shard);
        }
    }
    for (m, shards_of_m) in held.iter_mut().enumerate() {
        if shards_of_m.len() > cap {
            shards_of_m.sort_by_key(|&shard| (rank[shard][m], shard));
            for &released in &shards_of_m[cap..] {
                holder[released] = None;
            }
            shards_of_m.truncate(cap);
        }
    }
    let mut count: Vec<usize> = held.iter().map(Vec::len).collect();

    // Step 3: placement, up to the floor first, then up to the cap.
    for shard in 0..s {
        if holder[shard].is_some() {
            continue;
        }
        let by_preference = |limit: usize| order[shard].iter().copied().find(|&m| count[m] < limit);
        // The cap always has room (n * cap >= S), so the last fallback is never taken.
        let Some(m) = by_preference(floor).or_else(|| by_preference(cap)).or_else(|| least_loaded(&count)) else {
            continue;
        };
        holder[shard] = Some(m);
        count[m] += 1;
    }

    // Step 4: balance, only towards members under the floor.
    while let Some(receiver) = (0..n).filter(|&m| count[m] < floor).min_by_key(|&m| (count[m], m)) {
        let donation = (0..s)
            .filter_map(|shard| holder[shard].map(|donor| (shard, donor)))
            .filter(|&(_, donor)| count[donor] > floor)
            .min_by_key(|&(shard, _)| (rank[shard][receiver], shard));
        let Some((shard, donor)) = donation else {
            break;
        };
        holder[shard] = Some(receiver);
        count[donor] -= 1;
        count[receiver] += 1;
    }

    holder
        .into_iter()
        .enumerate()
        .filter_map(|(shard, h)| {
            let m = h?;
            Some((u32::try_from(shard).ok()?, members[m].to_owned()))
        })
        .collect()
}

/// The member least loaded, ties by identity.
fn least_loaded(count: &[usize]) -> Option<usize> {
    (0..count.len()).min_by_key(|&m| (count[m], m))
}

/// The preference order for each shard `0..shards`: indices into the sorted, deduplicated
/// `members`, most preferred first, every member exactly once.
fn preference_orders(shards: u32, members: &[&str]) -> Vec<Vec<usize>> {
    let ring =
        StaticHashRing::new(StableHash, members.iter().map(|&m| Node::new(MemberKey(m)).quantity(VNODES_PER_MEMBER)));
    (0..shards)
        .map(|shard| {
            let mut order: Vec<usize> = ring
                .calc_candidates(&ShardKey(shard))
                .filter_map(|node| members.binary_search(&node.key.0).ok())
                .collect();
            // The ring returns every member once; this only guards the invariant.
            let mut seen = vec![false; members.len()];
            order.retain(|&m| !std::mem::replace(&mut seen[m], true));
            order.extend((0..members.len()).filter(|&m| !seen[m]));
            order
        })
        .collect()
}

/// `rank[shard][member]`: the position of `member` in `order[shard]`; 0 is the most preferred.
fn ranks(orders: &[Vec<usize>]) -> Vec<Vec<usize>> {
    orders
        .iter()
        .map(|order| {
            let mut rank = vec![0; order.len()];
            for (position, &m) in order.iter().enumerate() {
                rank[m] = position;
            }
            rank
        })
        .collect()
}

/// A member on the ring. Its `Hash` feeds exactly the identity bytes to the hasher, so the ring
/// never depends on how `std` hashes a `str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct MemberKey<'a>(&'a str);

impl Hash for MemberKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0.as_bytes());
    }
}

/// A shard looked up on the ring. Its `Hash` feeds exactly the bytes `shard-<i>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ShardKey(u32);

impl Hash for ShardKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(format!("shard-{}", self.0).as_bytes());
    }
}

/// The ring's hash: xxh3 over the bytes the keys write (see [`MemberKey`], [`ShardKey`]).
#[derive(Debug, Clone, Copy)]
struct StableHash;

impl RingHash for StableHash {
    fn hash_item<T: Hash>(&self, item: &T) -> u64 {
        let mut bytes = ByteSink::default();
        item.hash(&mut bytes);
        xxh3_64(&bytes.0)
    }

    /// The member identity bytes followed by the vnode index as a little-endian `u64`.
    fn hash_vnode<K: Hash>(&self, node_key: &K, vnode_seq: usize) -> u64 {
        let mut bytes = ByteSink::default();
        node_key.hash(&mut bytes);
        bytes.0.extend_from_slice(&(vnode_seq as u64).to_le_bytes());
        xxh3_64(&bytes.0)
    }
}

/// A `Hasher` that only collects the bytes written to it; integers are written little-endian so
/// that nothing depends on the platform.
#[derive(Debug, Default)]
struct ByteSink(Vec<u8>);

impl Hasher for ByteSink {
    fn finish(&self) -> u64 {
        xxh3_64(&self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn write_u8(&mut self, i: u8) {
        self.0.push(i);
    }

    fn write_u16(&mut self, i: u16) {
        self.0.extend_from_slice(&i.to_le_bytes());
    }

    fn write_u32(&mut self, i: u32) {
        self.0.extend_from_slice(&i.to_le_bytes());
    }

    fn write_u64(&mut self, i: u64) {
        self.0.extend_from_slice(&i.to_le_bytes());
    }

    fn write_usize(&mut self, i: usize) {
        self.0.extend_from_slice(&(i as u64).to_le_bytes());
    }
}
