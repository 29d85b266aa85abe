//! The handover rules as a pure function: what a replica does with one shard, given the
//! shard Lease as last seen, its own state for the shard, and the time.
//!
//! ```text
//!            desired = me, holder = ""              desired ≠ me
//!   Idle ────────────── Claim ──────▶ Active ─────────── StartDrain ──▶ Draining
//!    ▲                                  │                                  │ in flight = 0
//!    │            holder ≠ me (lost)    │                                  │ or drain timeout
//!    └───────────────── Drop ───────────┘◀──────────── Release ────────────┘
//! ```
//!
//! Before its first write on a shard Lease that someone else may have written last (a
//! shard a human released, handed to it or recreated by hand; its own shard after a restart),
//! a replica waits in `Pending` for the drain timeout plus the SKR request timeout, so
//! whatever the previous holder still had in flight has ended. It does not wait when the
//! Lease is *clean*: released by the protocol (its holder nonce cleared after a drain, or by
//! the coordinator after the holder expired), last claimed by this very process (its own
//! nonce, as after a lapse of its member Lease), or by an earlier process of its identity
//! whose member Lease it took over after seeing it unchanged for a lease duration.
//!
//! A replica gives up every shard when it is fenced and works on a shard again only after a
//! successful Lease write (claim or resume, each with a resourceVersion precondition), so a
//! Lease cache that went stale while it was cut off cannot make it write. It never claims
//! while fenced, claims only an unheld shard (the write carries the
//! Lease's resourceVersion, so two claimers cannot both win), and releases only after its
//! syncs of the shard finished or the drain timeout passed (no new SKR write starts once a
//! drain began, and every request is bounded by the SKR request timeout, which the drain
//! timeout must not undercut).

use tokio::time::{Duration, Instant};

/// The parts of a shard Lease the rules read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseState {
    /// `spec.holderIdentity`; empty when unheld.
    pub holder: String,
    /// The coordinator's desired holder annotation; empty when none.
    pub desired: String,
}

/// This replica's state for one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Local {
    /// Not working on the shard.
    #[default]
    Idle,
    /// Holding the Lease and syncing the shard's SKRs.
    Active,
    /// Holding the Lease, taking no new syncs, waiting for in-flight ones since the instant.
    Draining(Instant),
    /// Offered the shard by a Lease that is not clean, waiting since the instant before the
    /// first write (see the module docs).
    Pending(Instant),
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Write the Lease with this replica as holder (resourceVersion precondition).
    Claim,
    /// The Lease already names this replica (a restart under the same identity, or after a
    /// fence): write it again with its resourceVersion as precondition, so a stale cache
    /// cannot make the replica work on a shard that moved, then work on it.
    Resume,
    /// Stop taking new syncs of the shard and wait for in-flight ones.
    StartDrain,
    /// Write the Lease with an empty holder (resourceVersion precondition).
    Release,
    /// The Lease names someone else: stop working on the shard at once.
    Drop,
    /// Start waiting before the first write (enter `Pending`).
    Wait,
    /// Stop waiting: the shard is no longer offered here (back to `Idle`).
    Forget,
}

/// Inputs besides the Lease and local state.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// This replica's identity.
    pub me: &'a str,
    /// Now.
    pub now: Instant,
    /// Whether this replica is fenced (member Lease not renewed in time) or stopping.
    pub fenced: bool,
    /// Syncs of the shard in flight here.
    pub in_flight: usize,
    /// Longest wait for in-flight syncs before releasing anyway.
    pub drain_timeout: Duration,
    /// Whether every SKR write of the shard allowed here was allowed at least the request
    /// timeout ago (or none was): a request sent may land until then, even after its sync
    /// ended or was dropped, so the shard is released no sooner.
    pub writes_settled: bool,
    /// Whether the Lease is clean: released by the protocol, or last claimed by this process.
    pub clean: bool,
    /// How long to wait in `Pending` before writing a Lease that is not clean.
    pub settle: Duration,
}

/// Decides the next step for one shard.
pub fn decide(lease: &LeaseState, local: Local, facts: Facts<'_>) -> Action {
    let mine = lease.holder == facts.me;
    let wanted_here = lease.desired == facts.me || (lease.desired.is_empty() && mine);
    match local {
        Local::Active | Local::Draining(_) if !mine => Action::Drop,
        // A fenced replica gives up everything: its view of the Leases may be stale by now.
        Local::Active | Local::Draining(_) if facts.fenced => Action::Drop,
        Local::Active if !wanted_here => Action::StartDrain,
        Local::Active => Action::None,
        Local::Draining(since) => {
            let drained = facts.in_flight == 0 || facts.now.saturating_duration_since(since) >= facts.drain_timeout;
            if drained && facts.writes_settled { Action::Release } else { Action::None }
        }
        Local::Idle if facts.fenced => Action::None,
        Local::Pending(_) if facts.fenced => Action::Forget,
        Local::Idle | Local::Pending(_) if mine || (lease.holder.is_empty() && lease.desired == facts.me) => {
            let settled = facts.clean
                || matches!(local, Local::Pending(since) if facts.now.saturating_duration_since(since) >= facts.settle);
            if !settled {
                return if local == Local::Idle { Action::Wait } else { Action::None };
            }
            if mine && wanted_here {
                Action::Resume
            } else if mine {
                // Held by this identity but wanted elsewhere (a restart mid-handover).
                Action::Release
            } else {
                Action::Claim
            }
        }
        Local::Pending(_) => Action::Forget,
        Local::Idle => Action::None,
    }
}

/// Whether the coordinator may release a shard whose holder is `holder`: only when the
/// holder's member Lease expired (or is gone), measured on the coordinator's clock. The
/// holder fenced itself at least `lease duration - renew deadline` earlier.
pub fn may_force_release(holder: &str, holder_alive: bool) -> bool {
    !holder.is_empty() && !holder_alive
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, desired: &str) -> LeaseState {
        LeaseState { holder: holder.into(), desired: desired.into() }
    }

    fn facts(now: Instant, in_flight: usize, fenced: bool) -> Facts<'static> {
        Facts {
            me: "a",
            now,
            fenced,
            in_flight,
            drain_timeout: Duration::from_secs(10),
            writes_settled: true,
            clean: true,
            settle: Duration::from_secs(13),
        }
    }

    fn unclean(now: Instant) -> Facts<'static> {
        Facts { clean: false, ..facts(now, 0, false) }
    }

    #[tokio::test(start_paused = true)]
    async fn a_drained_shard_is_released_only_once_its_last_write_has_settled() {
        let start = Instant::now();
        let draining = Local::Draining(start);
        let unsettled = Facts { writes_settled: false, ..facts(start, 0, false) };
        // No sync runs any more, but a write was allowed less than a request timeout ago.
        assert_eq!(decide(&lease("a", "b"), draining, unsettled), Action::None);
        // Not even at the drain timeout.
        tokio::time::advance(Duration::from_secs(11)).await;
        let late = Facts { writes_settled: false, ..facts(Instant::now(), 1, false) };
        assert_eq!(decide(&lease("a", "b"), draining, late), Action::None);
        assert_eq!(decide(&lease("a", "b"), draining, facts(Instant::now(), 0, false)), Action::Release);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_that_is_not_clean_is_written_only_after_the_settle_time() {
        let start = Instant::now();
        // Released by hand (holder nonce left behind), desired here: wait, then claim.
        assert_eq!(decide(&lease("", "a"), Local::Idle, unclean(start)), Action::Wait);
        let pending = Local::Pending(start);
        assert_eq!(decide(&lease("", "a"), pending, unclean(start)), Action::None);
        tokio::time::advance(Duration::from_secs(12)).await;
        assert_eq!(decide(&lease("", "a"), pending, unclean(Instant::now())), Action::None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(decide(&lease("", "a"), pending, unclean(Instant::now())), Action::Claim);
        // Handed here by hand, or held by a previous process of this identity.
        assert_eq!(decide(&lease("a", "a"), Local::Idle, unclean(start)), Action::Wait);
        assert_eq!(decide(&lease("a", "a"), pending, unclean(Instant::now())), Action::Resume);
        assert_eq!(decide(&lease("a", "b"), pending, unclean(Instant::now())), Action::Release);
        // No longer offered, or fenced: stop waiting.
        assert_eq!(decide(&lease("", "b"), pending, unclean(Instant::now())), Action::Forget);
        assert_eq!(decide(&lease("c", "a"), pending, unclean(Instant::now())), Action::Forget);
        assert_eq!(decide(&lease("", "a"), pending, facts(Instant::now(), 0, true)), Action::Forget);
    }

    #[tokio::test(start_paused = true)]
    async fn claims_only_an_unheld_shard_desired_here() {
        let now = Instant::now();
        assert_eq!(decide(&lease("", "a"), Local::Idle, facts(now, 0, false)), Action::Claim);
        assert_eq!(decide(&lease("b", "a"), Local::Idle, facts(now, 0, false)), Action::None);
        assert_eq!(decide(&lease("", "b"), Local::Idle, facts(now, 0, false)), Action::None);
        assert_eq!(decide(&lease("", "a"), Local::Idle, facts(now, 0, true)), Action::None, "never while fenced");
    }

    #[tokio::test(start_paused = true)]
    async fn drains_then_releases_when_idle_or_after_the_timeout() {
        let start = Instant::now();
        assert_eq!(decide(&lease("a", "b"), Local::Active, facts(start, 2, false)), Action::StartDrain);
        let draining = Local::Draining(start);
        assert_eq!(decide(&lease("a", "b"), draining, facts(start, 2, false)), Action::None);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(decide(&lease("a", "b"), draining, facts(Instant::now(), 0, false)), Action::Release);
        tokio::time::advance(Duration::from_secs(7)).await;
        assert_eq!(
            decide(&lease("a", "b"), draining, facts(Instant::now(), 1, false)),
            Action::Release,
            "the drain timeout bounds the wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn drops_a_shard_taken_away_and_resumes_its_own() {
        let now = Instant::now();
        assert_eq!(decide(&lease("", "b"), Local::Active, facts(now, 0, false)), Action::Drop);
        assert_eq!(decide(&lease("b", "b"), Local::Draining(now), facts(now, 1, false)), Action::Drop);
        assert_eq!(decide(&lease("a", "a"), Local::Idle, facts(now, 0, false)), Action::Resume);
        assert_eq!(decide(&lease("a", ""), Local::Idle, facts(now, 0, false)), Action::Resume);
        assert_eq!(decide(&lease("a", "b"), Local::Idle, facts(now, 0, false)), Action::Release);
        assert_eq!(decide(&lease("a", "a"), Local::Active, facts(now, 0, false)), Action::None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_replica_drops_everything_and_claims_nothing() {
        let now = Instant::now();
        assert_eq!(decide(&lease("a", "a"), Local::Active, facts(now, 0, true)), Action::Drop);
        assert_eq!(decide(&lease("a", "b"), Local::Draining(now), facts(now, 1, true)), Action::Drop);
        assert_eq!(decide(&lease("a", "a"), Local::Idle, facts(now, 0, true)), Action::None);
    }

    #[test]
    fn force_release_needs_a_dead_holder() {
        assert!(may_force_release("b", false));
        assert!(!may_force_release("b", true));
        assert!(!may_force_release("", false));
    }
}
