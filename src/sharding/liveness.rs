//! Which members are alive, as the coordinator judges it (pure): by when it *observed* each
//! member Lease change, on its own monotonic clock, as client-go's leader election does. A
//! member Lease's `renewTime` is written with the member's wall clock; comparing it with the
//! coordinator's wall clock would let clock skew between nodes expire live replicas (and
//! force-release their shards) or keep dead ones alive.
//!
//! Rules, with `d` the lease duration:
//!
//! - A member is alive until `d` after the last change the coordinator observed of its Lease:
//!   a new `renewTime` (or a new process nonce), the Lease appearing, **or the Lease
//!   disappearing**. So a member Lease deleted by hand keeps its holder alive for `d` after the
//!   deletion was seen: the holder renewed before the deletion at the latest, so it has
//!   fenced itself (renew deadline < `d`) by the time it counts as dead.
//! - A member whose Lease says it left (it shut down after releasing its shards) is dead at
//!   once: a graceful scale-in moves its shards without waiting.
//! - A member first seen now is alive for `d` from now, whatever its `renewTime` says; a new
//!   coordinator (or one whose own member Lease lapsed) therefore starts from a clean slate
//!   and takes nobody's shards for `d`, so a cache that has not caught up with the others'
//!   renewals after a KCP outage cannot make it release live replicas' shards.

use std::collections::BTreeMap;

use tokio::time::{Duration, Instant};

/// What the coordinator saw of one member Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The version of the Lease last seen (`renewTime` and nonce), `None` while it is gone.
    version: Option<String>,
    /// When that version (or the disappearance) was first seen.
    changed_at: Instant,
}

/// The coordinator's record of member Lease changes.
#[derive(Debug, Clone)]
pub struct Liveness {
    lease_duration: Duration,
    seen: BTreeMap<String, Seen>,
}

impl Liveness {
    /// A tracker that has seen nothing yet.
    pub fn new(lease_duration: Duration) -> Self {
        Self { lease_duration, seen: BTreeMap::new() }
    }

    /// Forgets everything (a new term as coordinator, or after a lapse of its own).
    pub fn reset(&mut self) {
        self.seen.clear();
    }

    /// Records the member Leases present at `now`, as `(identity, version)` pairs; the version
    /// is anything that changes with every renewal (the `renewTime` text). Members not in
    /// `present` are recorded as gone.
    pub fn observe<I: AsRef<str>, V: AsRef<str>>(&mut self, present: impl IntoIterator<Item = (I, V)>, now: Instant) {
        let present: BTreeMap<String, V> = present.into_iter().map(|(i, v)| (i.as_ref().to_owned(), v)).collect();
        for (identity, version) in &present {
            self.record(identity, Some(version.as_ref()), now);
        }
        let gone: Vec<String> = self.seen.keys().filter(|identity| !present.contains_key(*identity)).cloned().collect();
        for identity in gone {
            self.record(&identity, None, now);
        }
        // Entries dead for long are of no use any more (replicas that went away for good).
        let horizon = self.lease_duration.saturating_mul(10);
        self.seen.retain(|_, s| now.saturating_duration_since(s.changed_at) < horizon);
    }

    /// Records one member Lease as read directly (`None`: it does not exist).
    pub fn record(&mut self, identity: &str, version: Option<&str>, now: Instant) {
        match self.seen.get_mut(identity) {
            Some(seen) if seen.version.as_deref() == version => {}
            Some(seen) => *seen = Seen { version: version.map(str::to_owned), changed_at: now },
            None if version.is_some() => {
                self.seen.insert(identity.to_owned(), Seen { version: version.map(str::to_owned), changed_at: now });
            }
            // Never seen and not there: nothing to record.
            None => {}
        }
    }

    /// Records that `identity` shut down after releasing its shards (see
    /// [`crate::sharding::lease::member_left`]): dead at once.
    pub fn left(&mut self, identity: &str) {
        self.seen.remove(identity);
    }

    /// Whether `identity` counts as alive at `now`.
    pub fn is_alive(&self, identity: &str, now: Instant) -> bool {
        self.seen.get(identity).is_some_and(|s| now.saturating_duration_since(s.changed_at) < self.lease_duration)
    }

    /// The members alive at `now`, sorted: the ones shards are assigned to. A member whose
    /// Lease vanished stays among them until it counts as dead, so a Lease deleted by hand
    /// (and recreated by its holder at its next renewal) moves no shard.
    pub fn live(&self, now: Instant) -> Vec<String> {
        self.seen.keys().filter(|identity| self.is_alive(identity, now)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    #[tokio::test(start_paused = true)]
    async fn a_member_lives_until_a_lease_duration_after_its_last_observed_renewal() {
        let mut l = Liveness::new(D);
        l.observe([("a", "t1"), ("b", "t1")], Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        l.observe([("a", "t2"), ("b", "t1")], Instant::now());
        tokio::time::advance(Duration::from_secs(6)).await;
        let now = Instant::now();
        assert!(l.is_alive("a", now), "renewed 6 s ago");
        assert!(!l.is_alive("b", now), "no renewal seen for 16 s");
        assert_eq!(l.live(now), ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn wall_clock_values_do_not_matter_only_their_changes() {
        // A member whose clock is an hour behind writes old-looking renew times: alive while
        // they change.
        let mut l = Liveness::new(D);
        for t in ["1999-01-01T00:00:00Z", "1999-01-01T00:00:02Z", "1999-01-01T00:00:04Z"] {
            l.observe([("skewed", t)], Instant::now());
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        assert!(l.is_alive("skewed", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_member_lease_counts_as_alive_for_a_lease_duration_after_it_was_seen_gone() {
        let mut l = Liveness::new(D);
        l.observe([("a", "t1")], Instant::now());
        tokio::time::advance(Duration::from_secs(14)).await;
        // Deleted by hand just before it would have expired.
        l.observe(Vec::<(&str, &str)>::new(), Instant::now());
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(l.is_alive("a", Instant::now()), "14 s after the deletion was seen");
        assert_eq!(l.live(Instant::now()), ["a"], "its shards stay where they are");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!l.is_alive("a", Instant::now()));
        // Recreated by its holder: alive again.
        l.observe([("a", "t9")], Instant::now());
        assert!(l.is_alive("a", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_coordinator_gives_everyone_a_full_lease_duration() {
        let mut l = Liveness::new(D);
        // The record of a member that died long ago, seen for the first time.
        l.observe([("dead", "2020-01-01T00:00:00Z")], Instant::now());
        assert!(l.is_alive("dead", Instant::now()));
        tokio::time::advance(D).await;
        l.observe([("dead", "2020-01-01T00:00:00Z")], Instant::now());
        assert!(!l.is_alive("dead", Instant::now()));
        l.reset();
        assert!(!l.is_alive("dead", Instant::now()), "forgotten after a reset");
        l.observe([("dead", "2020-01-01T00:00:00Z")], Instant::now());
        assert!(l.is_alive("dead", Instant::now()), "and given a full duration again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_left_is_dead_at_once() {
        let mut l = Liveness::new(D);
        l.observe([("a", "t1"), ("b", "t1")], Instant::now());
        l.left("a");
        assert_eq!(l.live(Instant::now()), ["b"]);
        l.observe([("b", "t2")], Instant::now());
        assert!(!l.is_alive("a", Instant::now()), "its Lease going away afterwards changes nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_direct_read_that_shows_a_renewal_revives() {
        let mut l = Liveness::new(D);
        l.observe([("a", "t1")], Instant::now());
        tokio::time::advance(D).await;
        assert!(!l.is_alive("a", Instant::now()));
        l.record("a", Some("t1"), Instant::now());
        assert!(!l.is_alive("a", Instant::now()), "the same version is no news");
        l.record("a", Some("t2"), Instant::now());
        assert!(l.is_alive("a", Instant::now()));
    }
}
