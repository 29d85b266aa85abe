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
    /// SKR requests issued, keyed `"<verb> <plural>"` as the simulator keys them: the catalog's
    /// `apply`, `list` and `delete` of `moduletemplates` and `modulereleasemetas`, and with
    /// `--reconcile full` or `without-catalog` also `apply namespaces`, `apply
    /// customresourcedefinitions`, and `get`, `create`, `apply` and `replace-status` of
    /// `kymas`. Failed requests count too.
    pub requests: BTreeMap<String, u64>,
    /// Of [`BaselineStats::requests`] and [`BaselineStats::kcp_requests`], those that failed
    /// (timeouts included; NotFound on delete and list is success, and on the get of the SKR
    /// Kyma an answer), by the same keys.
    #[serde(default)]
    pub request_errors: BTreeMap<String, u64>,
    /// Sum of [`BaselineStats::requests`].
    pub requests_total: u64,
    /// KCP requests issued (`--reconcile full` or `without-catalog`): `patch kymas` (the
    /// finalizer) and `apply-status kymas`. Failed requests count too; reads from the caches
    /// are no requests.
    #[serde(default)]
    pub kcp_requests: BTreeMap<String, u64>,
    /// Duration of completed passes, failed ones included (desired set, SKR client, SKR
    /// requests), in seconds, over the most recent [`MAX_SAMPLES`] passes.
    pub pass_seconds: Percentiles,
    /// From when a Kyma was due (start, requeue time, or a label/generation change) to when
    /// its pass started: above zero when the workers do not keep up with the period. In
    /// seconds, over the most recent [`MAX_SAMPLES`] passes.
    pub queue_lag_seconds: Percentiles,
    /// When the workers started (every cache synced, the Kymas' too), Unix milliseconds (not
    /// reset).
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

/// A request a pass sends: to the SKR (keyed `"<verb> <plural>"` as the simulator keys it)
/// or to the KCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Request {
    /// SSA of a desired ModuleTemplate.
    ApplyTemplate,
    /// The cluster-wide list of ModuleTemplates.
    ListTemplates,
    /// Deletion of an obsolete ModuleTemplate.
    DeleteTemplate,
    /// SSA of a desired ModuleReleaseMeta.
    ApplyReleaseMeta,
    /// The cluster-wide list of ModuleReleaseMetas.
    ListReleaseMetas,
    /// Deletion of an obsolete ModuleReleaseMeta.
    DeleteReleaseMeta,
    /// SSA of the SKR's `kyma-system` namespace.
    ApplyNamespace,
    /// SSA of one of the three CRDs.
    ApplyCrd,
    /// Get of the SKR Kyma.
    GetSkrKyma,
    /// Create of the SKR Kyma (when the get found none).
    CreateSkrKyma,
    /// SSA of the SKR Kyma's labels and annotations.
    ApplySkrKyma,
    /// Update of the SKR Kyma's status.
    ReplaceSkrKymaStatus,
    /// KCP: update of the Kyma adding the finalizer.
    PatchKcpKyma,
    /// KCP: SSA of the Kyma's status.
    ApplyKcpKymaStatus,
}

impl Request {
    const ALL: [Request; 14] = [
        Request::ApplyTemplate,
        Request::ListTemplates,
        Request::DeleteTemplate,
        Request::ApplyReleaseMeta,
        Request::ListReleaseMetas,
        Request::DeleteReleaseMeta,
        Request::ApplyNamespace,
        Request::ApplyCrd,
        Request::GetSkrKyma,
        Request::CreateSkrKyma,
        Request::ApplySkrKyma,
        Request::ReplaceSkrKymaStatus,
        Request::PatchKcpKyma,
        Request::ApplyKcpKymaStatus,
    ];

    /// The catalog request of `op` on `kind`.
    pub fn catalog(kind: CatalogKind, op: Op) -> Request {
        match (kind, op) {
            (CatalogKind::ModuleTemplate, Op::Apply) => Request::ApplyTemplate,
            (CatalogKind::ModuleTemplate, Op::List) => Request::ListTemplates,
            (CatalogKind::ModuleTemplate, Op::Delete) => Request::DeleteTemplate,
            (CatalogKind::ModuleReleaseMeta, Op::Apply) => Request::ApplyReleaseMeta,
            (CatalogKind::ModuleReleaseMeta, Op::List) => Request::ListReleaseMetas,
            (CatalogKind::ModuleReleaseMeta, Op::Delete) => Request::DeleteReleaseMeta,
        }
    }

    /// The stats key.
    pub fn as_str(self) -> &'static str {
        match self {
            Request::ApplyTemplate => "apply moduletemplates",
            Request::ListTemplates => "list moduletemplates",
            Request::DeleteTemplate => "delete moduletemplates",
            Request::ApplyReleaseMeta => "apply modulereleasemetas",
            Request::ListReleaseMetas => "list modulereleasemetas",
            Request::DeleteReleaseMeta => "delete modulereleasemetas",
            Request::ApplyNamespace => "apply namespaces",
            Request::ApplyCrd => "apply customresourcedefinitions",
            Request::GetSkrKyma => "get kymas",
            Request::CreateSkrKyma => "create kymas",
            Request::ApplySkrKyma => "apply kymas",
            Request::ReplaceSkrKymaStatus => "replace-status kymas",
            Request::PatchKcpKyma => "patch kymas",
            Request::ApplyKcpKymaStatus => "apply-status kymas",
        }
    }

    /// Whether the request goes to the KCP rather than the SKR.
    pub fn is_kcp(self) -> bool {
        matches!(self, Request::PatchKcpKyma | Request::ApplyKcpKymaStatus)
    }

    /// Whether a 404 answer is an outcome rather than a failure: a list whose CRD is absent
    /// (KLM's no-match), a get of an SKR Kyma not created yet.
    pub fn expects_not_found(self) -> bool {
        matches!(self, Request::ListTemplates | Request::ListReleaseMetas | Request::GetSkrKyma)
    }
}

/// A catalog operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Apply,
    List,
    Delete,
}

/// Request counters, one per [`Request`].
#[derive(Default)]
struct Counters([AtomicU64; Request::ALL.len()]);

impl Counters {
    fn slot(&self, request: Request) -> &AtomicU64 {
        &self.0[request as usize]
    }

    /// The counts of the SKR requests (`kcp` false) or of the KCP ones, by key.
    fn to_map(&self, kcp: bool) -> BTreeMap<String, u64> {
        Request::ALL
            .into_iter()
            .filter(|r| r.is_kcp() == kcp)
            .map(|r| (r.as_str().to_owned(), self.slot(r).load(Ordering::Relaxed)))
            .collect()
    }

    fn reset(&self) {
        self.0.iter().for_each(|c| c.store(0, Ordering::Relaxed));
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
    /// When the workers started, Unix milliseconds.
    pub started_unix_ms: AtomicU64,
    /// Passes running now.
    pub in_flight: AtomicU64,
    /// The most recent pass error.
    pub last_error: Mutex<Option<String>>,
}

impl Stats {
    /// Counts one request.
    pub fn count(&self, request: Request) {
        self.requests.slot(request).fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed request.
    pub fn count_error(&self, request: Request) {
        self.request_errors.slot(request).fetch_add(1, Ordering::Relaxed);
    }

    /// The counters as [`BaselineStats`]; what is not counted here (`kymas`, `queued`,
    /// `first_round_done_unix_ms`) is left empty for the caller to fill in.
    pub fn snapshot(&self) -> BaselineStats {
        let requests = self.requests.to_map(false);
        let mut request_errors = self.request_errors.to_map(false);
        request_errors.extend(self.request_errors.to_map(true));
        BaselineStats {
            kymas: 0,
            passes: self.passes.load(Ordering::Relaxed),
            failed_passes: self.failed_passes.load(Ordering::Relaxed),
            skipped_passes: self.skipped_passes.load(Ordering::Relaxed),
            requests_total: requests.values().sum(),
            requests,
            request_errors,
            kcp_requests: self.requests.to_map(true),
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
