//! What the baseline counts: SKR requests by kind and op, passes, and the most recent pass
//! durations and queue lags; [`BaselineStats`] is the snapshot the admin endpoint serves.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use catalogsync::catalog::CatalogKind;
use serde::{Deserialize, Serialize};

use super::lock;
use crate::stats::Percentiles;

/// How many pass durations and queue lags are kept for the percentiles (the most recent ones).
const MAX_SAMPLES: usize = 200_000;

/// What the baseline has done since start or the last `POST /reset`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BaselineStats {
    /// Kymas in the KCP cache now (not reset).
    pub kymas: u64,
    /// Completed passes, failed ones included (skipped Kymas excluded).
    pub passes: u64,
    /// Completed passes that failed (some request of the pass failed, or no SKR client).
    pub failed_passes: u64,
    /// Reconciles of Kymas labelled `operator.kyma-project.io/skip-reconciliation=true`
    /// (no SKR request).
    #[serde(default)]
    pub skipped_passes: u64,
    /// SKR requests issued, keyed `"<op> <plural>"`: op is `apply`, `list` or `delete`,
    /// plural is `moduletemplates` or `modulereleasemetas`. Failed requests count too.
    pub requests: BTreeMap<String, u64>,
    /// Of [`BaselineStats::requests`], those that failed (timeouts included; NotFound on
    /// delete and list is success), by the same keys.
    #[serde(default)]
    pub request_errors: BTreeMap<String, u64>,
    /// Sum of [`BaselineStats::requests`].
    pub requests_total: u64,
    /// Duration of completed passes, failed ones included (desired set, SKR client, SKR
    /// requests), in seconds, over the most recent [`MAX_SAMPLES`] passes.
    pub pass_seconds: Percentiles,
    /// From when a Kyma was due (start, requeue time, or a label/generation change) to when
    /// its pass started: above zero when the workers do not keep up with the period. In
    /// seconds, over the most recent [`MAX_SAMPLES`] passes.
    pub queue_lag_seconds: Percentiles,
    /// When the controller started (caches synced), Unix milliseconds (not reset).
    #[serde(default)]
    pub started_unix_ms: u64,
    /// When every Kyma known at start had completed one pass, successful or not (Kymas deleted
    /// meanwhile are dropped), Unix milliseconds (not reset).
    pub first_round_done_unix_ms: Option<u64>,
    /// Passes running now (not reset).
    pub in_flight: u64,
    /// Kymas due and waiting for a worker now (not reset).
    #[serde(default)]
    pub queued: u64,
    /// The most recent pass error, for diagnosis.
    #[serde(default)]
    pub last_error: Option<String>,
}

/// A kind of SKR request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Apply,
    List,
    Delete,
}

impl Op {
    const ALL: [Op; 3] = [Op::Apply, Op::List, Op::Delete];

    fn as_str(self) -> &'static str {
        match self {
            Op::Apply => "apply",
            Op::List => "list",
            Op::Delete => "delete",
        }
    }
}

/// Request counters indexed by kind and op.
#[derive(Default)]
struct Counters([[AtomicU64; 3]; 2]);

impl Counters {
    fn slot(&self, kind: CatalogKind, op: Op) -> &AtomicU64 {
        let k = match kind {
            CatalogKind::ModuleTemplate => 0,
            CatalogKind::ModuleReleaseMeta => 1,
        };
        let o = match op {
            Op::Apply => 0,
            Op::List => 1,
            Op::Delete => 2,
        };
        &self.0[k][o]
    }

    fn to_map(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for kind in CatalogKind::ALL {
            for op in Op::ALL {
                out.insert(format!("{} {}", op.as_str(), kind.plural()), self.slot(kind, op).load(Ordering::Relaxed));
            }
        }
        out
    }

    fn reset(&self) {
        self.0.iter().flatten().for_each(|c| c.store(0, Ordering::Relaxed));
    }
}

/// The most recent durations, for percentiles on request.
#[derive(Default)]
pub(super) struct Samples(Mutex<VecDeque<f64>>);

impl Samples {
    /// Adds one sample, dropping the oldest beyond [`MAX_SAMPLES`].
    pub fn push(&self, value: Duration) {
        let mut samples = lock(&self.0);
        if samples.len() >= MAX_SAMPLES {
            samples.pop_front();
        }
        samples.push_back(value.as_secs_f64());
    }

    fn percentiles(&self) -> Percentiles {
        let values: Vec<f64> = lock(&self.0).iter().copied().collect();
        Percentiles::of(&values)
    }

    fn reset(&self) {
        lock(&self.0).clear();
    }
}

/// Live counters behind [`BaselineStats`].
#[derive(Default)]
pub(super) struct Stats {
    /// Completed passes.
    pub passes: AtomicU64,
    /// Completed passes that failed.
    pub failed_passes: AtomicU64,
    /// Reconciles of skipped Kymas.
    pub skipped_passes: AtomicU64,
    requests: Counters,
    request_errors: Counters,
    /// Pass durations.
    pub pass_seconds: Samples,
    /// Queue lags.
    pub queue_lag: Samples,
    /// When the controller started, Unix milliseconds.
    pub started_unix_ms: AtomicU64,
    /// Passes running now.
    pub in_flight: AtomicU64,
    /// The most recent pass error.
    pub last_error: Mutex<Option<String>>,
}

impl Stats {
    /// Counts one SKR request.
    pub fn count(&self, kind: CatalogKind, op: Op) {
        self.requests.slot(kind, op).fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed SKR request.
    pub fn count_error(&self, kind: CatalogKind, op: Op) {
        self.request_errors.slot(kind, op).fetch_add(1, Ordering::Relaxed);
    }

    /// The counters as [`BaselineStats`]; what is not counted here (`kymas`, `queued`,
    /// `first_round_done_unix_ms`) is left empty for the caller to fill in.
    pub fn snapshot(&self) -> BaselineStats {
        let requests = self.requests.to_map();
        BaselineStats {
            kymas: 0,
            passes: self.passes.load(Ordering::Relaxed),
            failed_passes: self.failed_passes.load(Ordering::Relaxed),
            skipped_passes: self.skipped_passes.load(Ordering::Relaxed),
            requests_total: requests.values().sum(),
            requests,
            request_errors: self.request_errors.to_map(),
            pass_seconds: self.pass_seconds.percentiles(),
            queue_lag_seconds: self.queue_lag.percentiles(),
            started_unix_ms: self.started_unix_ms.load(Ordering::Relaxed),
            first_round_done_unix_ms: None,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued: 0,
            last_error: lock(&self.last_error).clone(),
        }
    }

    /// Zeroes the counters and the samples (not the gauges and timestamps).
    pub fn reset(&self) {
        self.passes.store(0, Ordering::Relaxed);
        self.failed_passes.store(0, Ordering::Relaxed);
        self.skipped_passes.store(0, Ordering::Relaxed);
        self.requests.reset();
        self.request_errors.reset();
        self.pass_seconds.reset();
        self.queue_lag.reset();
        *lock(&self.last_error) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples = Samples::default();
        for ms in 1..=100 {
            samples.push(Duration::from_millis(ms));
        }
        let p = samples.percentiles();
        assert_eq!(p.count, 100);
        assert!((p.p50 - 0.050).abs() < 1e-9 && (p.p99 - 0.099).abs() < 1e-9 && (p.max - 0.1).abs() < 1e-9, "{p:?}");
        assert_eq!(Samples::default().percentiles(), Percentiles::default());
    }
}
