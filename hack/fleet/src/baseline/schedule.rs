//! When each Kyma is due: KLM's requeue after a successful pass (the period) and after a
//! failed one (its failure rate limiter), the queue lag of each pass, and the first round
//! (every Kyma known at start had one pass), which ends a `--once` run.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::info;

use super::lock;
use crate::stats::unix_ms;

/// When a Kyma is due again after a pass.
pub(super) struct RequeuePolicy {
    /// After a successful pass (KLM `--kyma-requeue-success-interval`).
    pub period: Duration,
    /// After the first failed pass in a row, doubled per further failure.
    pub backoff_min: Duration,
    /// The cap of the failure delay.
    pub backoff_max: Duration,
    /// `--once`: never requeue.
    pub once: bool,
}

/// Per-Kyma scheduling state.
#[derive(Default)]
struct Schedule {
    /// When each Kyma is next due (for the queue lag).
    due: HashMap<String, Instant>,
    /// Failed passes in a row, per Kyma.
    failures: HashMap<String, u32>,
    /// Kymas that completed a pass (until the first round is done).
    completed: HashSet<String>,
    /// Kymas known at start still without a pass (`None` until the Kyma cache synced).
    pending: Option<HashSet<String>>,
    /// The first round is done.
    first_round_done: bool,
}

impl Schedule {
    /// Records that `key` is due at `at` unless it was due earlier already.
    fn mark_due(&mut self, key: &str, at: Instant) {
        self.due.entry(key.to_owned()).and_modify(|d| *d = (*d).min(at)).or_insert(at);
    }
}

/// The scheduling state of every Kyma, shared by the watch, the workers and the first-round
/// tracker.
pub(super) struct Scheduler {
    policy: RequeuePolicy,
    state: Mutex<Schedule>,
    /// When the first round was done, Unix milliseconds; 0 until then.
    first_round_done_unix_ms: AtomicU64,
    /// Cancelled when the first round is done with `--once`.
    once_done: CancellationToken,
}

impl Scheduler {
    /// A scheduler with no Kyma due yet.
    pub fn new(policy: RequeuePolicy) -> Scheduler {
        Scheduler {
            policy,
            state: Mutex::new(Schedule::default()),
            first_round_done_unix_ms: AtomicU64::new(0),
            once_done: CancellationToken::new(),
        }
    }

    /// Whether this is a `--once` run.
    pub fn is_once(&self) -> bool {
        self.policy.once
    }

    /// Cancelled when a `--once` run has done its round.
    pub fn once_done(&self) -> &CancellationToken {
        &self.once_done
    }

    /// When every Kyma known at start had completed one pass, Unix milliseconds.
    pub fn first_round_done_unix_ms(&self) -> Option<u64> {
        let at = self.first_round_done_unix_ms.load(Ordering::Relaxed);
        (at != 0).then_some(at)
    }

    /// Records that `key` is due at `at` unless it was due earlier already.
    pub fn mark_due(&self, key: &str, at: Instant) {
        lock(&self.state).mark_due(key, at);
    }

    /// The queue lag of a pass of `key` starting at `now`: how long it was due.
    pub fn queue_lag(&self, key: &str, now: Instant) -> Duration {
        let due = lock(&self.state).due.remove(key);
        due.map(|d| now.saturating_duration_since(d)).unwrap_or_default()
    }

    /// Records that `key` completed a pass (or was skipped), for the first round.
    pub fn complete(&self, key: &str) {
        let mut schedule = lock(&self.state);
        if schedule.first_round_done {
            return;
        }
        match schedule.pending.as_mut() {
            Some(pending) => {
                pending.remove(key);
            }
            None => {
                schedule.completed.insert(key.to_owned());
            }
        }
        self.check_first_round(&mut schedule);
    }

    /// Fixes the Kymas of the first round once the Kyma cache has synced: those `known` now
    /// that have not completed a pass yet.
    pub fn start_first_round(&self, known: &HashSet<String>) {
        let mut schedule = lock(&self.state);
        let completed = std::mem::take(&mut schedule.completed);
        schedule.pending = Some(known.difference(&completed).cloned().collect());
        self.check_first_round(&mut schedule);
    }

    /// Drops Kymas no longer `present` from the first round; returns whether it is done.
    pub fn drop_deleted(&self, present: &HashSet<String>) -> bool {
        let mut schedule = lock(&self.state);
        if let Some(pending) = schedule.pending.as_mut() {
            pending.retain(|k| present.contains(k));
        }
        self.check_first_round(&mut schedule);
        schedule.first_round_done
    }

    fn check_first_round(&self, schedule: &mut MutexGuard<'_, Schedule>) {
        if !schedule.first_round_done && schedule.pending.as_ref().is_some_and(HashSet::is_empty) {
            schedule.first_round_done = true;
            schedule.completed = HashSet::new();
            self.first_round_done_unix_ms.store(unix_ms(), Ordering::Relaxed);
            info!("Every Kyma known at start completed one pass");
            if self.policy.once {
                self.once_done.cancel();
            }
        }
    }

    /// The requeue delay after a successful pass (or skip): the period (none with `--once`).
    pub fn requeue_after_success(&self, key: &str) -> Option<Duration> {
        let mut schedule = lock(&self.state);
        schedule.failures.remove(key);
        if self.policy.once {
            return None;
        }
        // A change seen during the pass makes the Kyma due now (the queue reruns it).
        schedule.mark_due(key, Instant::now() + self.policy.period);
        Some(self.policy.period)
    }

    /// KLM's failure rate limiter: per Kyma, 5s doubled per failure in a row, capped at 30s
    /// (none with `--once`).
    pub fn requeue_after_failure(&self, key: &str) -> Option<Duration> {
        if self.policy.once {
            return None;
        }
        let mut schedule = lock(&self.state);
        let failures = schedule.failures.entry(key.to_owned()).or_default();
        *failures = failures.saturating_add(1);
        let exp = self.policy.backoff_min.saturating_mul(2u32.saturating_pow((*failures - 1).min(20)));
        let delay = exp.min(self.policy.backoff_max);
        schedule.mark_due(key, Instant::now() + delay);
        Some(delay)
    }

    /// Drops the scheduling state of a deleted Kyma.
    pub fn forget(&self, key: &str) {
        let mut schedule = lock(&self.state);
        schedule.failures.remove(key);
        schedule.due.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduler(once: bool) -> Scheduler {
        Scheduler::new(RequeuePolicy {
            period: Duration::from_secs(300),
            backoff_min: Duration::from_secs(5),
            backoff_max: Duration::from_secs(30),
            once,
        })
    }

    #[test]
    fn failures_back_off_doubling_up_to_the_cap_and_a_success_resets_them() {
        let s = scheduler(false);
        let delays: Vec<u64> = (0..5).filter_map(|_| s.requeue_after_failure("ns/k")).map(|d| d.as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 30, 30]);
        assert_eq!(s.requeue_after_success("ns/k"), Some(Duration::from_secs(300)));
        assert_eq!(s.requeue_after_failure("ns/k"), Some(Duration::from_secs(5)));
    }

    #[test]
    fn the_first_round_counts_passes_before_the_cache_synced_and_ignores_deleted_kymas() {
        let s = scheduler(true);
        s.complete("ns/a");
        s.start_first_round(&["ns/a".to_owned(), "ns/b".to_owned(), "ns/c".to_owned()].into());
        s.complete("ns/b");
        assert!(s.first_round_done_unix_ms().is_none() && !s.once_done().is_cancelled());
        assert!(s.drop_deleted(&["ns/a".to_owned(), "ns/b".to_owned()].into()));
        assert!(s.first_round_done_unix_ms().is_some() && s.once_done().is_cancelled());
        assert_eq!(s.requeue_after_success("ns/a"), None, "--once never requeues");
    }
}
