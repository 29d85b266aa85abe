//! The hostile-SKR fuzzer: thousands of seeded cases per run, each an SKR of its own
//! ([`testenv::fuzz`]) that is mostly an honest apiserver but answers one or more requests in
//! a hostile way. Each case is synced in-process through the production client stack (the
//! access Secret read through the kubeconfig allowlist, the allowlisted destination, TLS, the
//! bounded request layer) and the executor, exactly as the reconciler runs a sync. Beside
//! them, a healthy SKR (a real apiserver) keeps being synced.
//!
//! For every case, whatever the SKR sends:
//! - the sync ends within [`SYNC_TIMEOUT`] (plus [`SLACK`]) and does not panic;
//! - a failure has an SKR-side [`ConditionReason`] ([`ALLOWED_REASONS`]), and its message and
//!   its condition message are at most [`MESSAGE_BOUND`] characters without control
//!   characters;
//!
//! and over the whole run: the peak RSS stays under [`RSS_BOUND_MIB`], no log line is longer
//! than [`LOG_LINE_BOUND`] or holds a control character, and every healthy sync succeeds.
//!
//! A case may succeed (its hostile answer came too late, or was harmless); that is fine.
//!
//! Seeds: `CATALOGSYNC_FUZZ_SEED` (decimal or `0x` hex) if set, else [`CI_SEED`] in CI (so CI
//! is deterministic), else a random one; it is printed at the start. `CATALOGSYNC_FUZZ_CASES`
//! runs more (or fewer) cases than [`DEFAULT_CASES`]; `CATALOGSYNC_FUZZ_CASE` runs just one
//! and prints what its SKR sent and how its syncs ended (each failure prints the command that
//! reruns it). A rerun replays the case exactly, but for the order in which the concurrent
//! applies of one kind reach the SKR ([`SKR_CONCURRENCY`]), which can move a hostile answer
//! from one apply to another.
//!
//! The healthy SKR is the test environment's `skr-a`, synced into a namespace of its own; the
//! fuzz SKRs listen on `127.0.0.64` to `127.0.0.127` (see [`testenv::fuzz`]).
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use catalogsync::api::KUBECONFIG_KEY;
use catalogsync::catalog::{CatalogKind, DesiredSet, Snapshot, desired_set};
use catalogsync::error::{ConditionReason, SyncError};
use catalogsync::metrics::SkrClientMetrics;
use catalogsync::skr::SkrState;
use catalogsync::skr::access::{AccessSettings, SkrAccess};
use catalogsync::skr::destination::{Destinations, Rule};
use catalogsync::sync::executor::{SkrCrds, SkrTarget, SyncReport, skr_crd_names};
use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::ObjectMeta;
use testenv::fixtures::{self, MrmBuilder, MtBuilder};
use testenv::fuzz::{FuzzCase, FuzzSkr, FuzzTls, Honest};
use tokio::sync::{Semaphore, watch};
use tracing_subscriber::fmt::MakeWriter;

/// Bound of one SKR request: short, so that a case whose SKR trickles or hangs costs a second,
/// and far above what the local fuzz server needs for an honest answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// Bound of one sync, as `--sync-timeout` bounds it in the reconciler: room for a few request
/// timeouts in a row, short enough that thousands of cases fit in minutes.
const SYNC_TIMEOUT: Duration = Duration::from_secs(4);

/// How much later than [`SYNC_TIMEOUT`] a sync may end: a timeout fires only when the runtime
/// gets to it, and a debug build on two busy cores can be late by a second or so. A sync
/// later than this is one that does not yield (a CPU-bound loop), which the timeout cannot cut.
const SLACK: Duration = Duration::from_secs(2);

/// A sync task not done this long after its start is reported as a hang (and aborted).
const HANG: Duration = Duration::from_secs(30);

/// TCP and TLS connect timeout of the clients (`AccessSettings::connect`): as the request
/// timeout, a local server answers at once.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the summary line of the last run is written, under the target's test directory.
const SUMMARY_FILE: &str = "hostile-fuzz-summary.txt";

/// Cases synced at once: most of a case's time is spent waiting for timeouts, so far more
/// cases than cores fit (on two cores, 32 at once keep about one core busy and syncs end
/// within a few hundred milliseconds of their timeout); many more would make the cores the
/// bottleneck and the timeouts late.
const CONCURRENT_CASES: usize = 32;

/// Cases per run unless `CATALOGSYNC_FUZZ_CASES` says otherwise: about two minutes of a debug
/// build on two cores (measured: 110 s for the whole test on an idle machine, 170 s on one
/// kept busy by other builds; each run prints its own figures in the summary line).
const DEFAULT_CASES: u64 = 3_000;

/// The seed in CI, so a CI run is deterministic and a failure there reproduces locally.
const CI_SEED: u64 = 0x5eed_0fc0_ffee;

/// Cases without anything hostile, synced first: the honest SKR must be honest enough that
/// every one of them syncs, or the fuzz proves nothing.
const HONEST_CASES: u64 = 8;

/// `--skr-concurrency`'s default: requests in flight per SKR.
const SKR_CONCURRENCY: usize = 4;

/// Peak RSS (VmHWM) of this test process, in MiB. Measured: 110-150 MiB without the lists
/// whose every page is just under the answer limit, 240-370 MiB with them (a sync keeps the
/// labels and annotations of every object it lists until the list ends, so such a list holds
/// up to the sync budget, 64 MiB, until the budget ends it; a few of them overlap among 32
/// cases at once). A client that read past its answer limit (the fuzz sends bodies of up to
/// 16 MiB and lists that never end) or past its budget would cross this within a run.
const RSS_BOUND_MIB: u64 = 512;

/// Longest log line accepted, in bytes: a condition message is at most 1,024 characters and
/// SKR-sent text at most 256.
const LOG_LINE_BOUND: usize = 4096;

/// Longest error message (and condition message) accepted, in characters: the condition
/// message is cut at 1,024 characters plus an ellipsis; the top-level message names our own
/// objects only.
const MESSAGE_BOUND: usize = 1100;

/// How often the healthy SKR is synced while the fuzz runs.
const HEALTHY_PERIOD: Duration = Duration::from_secs(1);

/// Bound of one healthy sync (its sync timeout): a sync of a real apiserver is a few
/// requests of a few milliseconds each; this leaves room for two busy cores in a debug build.
const HEALTHY_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// Request timeout of the healthy syncs: above `--skr-request-timeout`'s default (3 s), as the
/// fuzz keeps the machine busy.
const HEALTHY_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Bound of the first healthy sync, which creates the namespace and the CRDs and waits until
/// they are established.
const HEALTHY_FIRST_TIMEOUT: Duration = Duration::from_secs(60);

/// Every n-th healthy sync starts from a cold state (full lists, namespace and CRD checks).
const HEALTHY_COLD_EVERY: usize = 5;

/// The failure reasons a sync against a hostile SKR may end with: every reason about the
/// SKR, none about the KCP, the access Secret or ownership.
const ALLOWED_REASONS: [ConditionReason; 10] = [
    ConditionReason::SkrUnauthorized,
    ConditionReason::SkrForbidden,
    ConditionReason::SkrUnreachable,
    ConditionReason::SkrResponseTooLarge,
    ConditionReason::SkrBudgetExceeded,
    ConditionReason::SkrAnswerInvalid,
    ConditionReason::CrdSyncFailed,
    ConditionReason::ListFailed,
    ConditionReason::ApplyFailed,
    ConditionReason::PruneFailed,
];

/// Failing cases printed in full at the end (all are counted).
const PRINTED_FAILURES: usize = 40;

// ------------------------------------------------------------------------------------------
// What runs

/// Which cases this run syncs, and with which seed.
struct Run {
    seed: u64,
    seed_origin: &'static str,
    cases: Vec<u64>,
}

impl Run {
    fn from_env() -> Self {
        let (seed, seed_origin) = match std::env::var("CATALOGSYNC_FUZZ_SEED") {
            Ok(text) => (
                parse_u64(&text).unwrap_or_else(|| panic!("CATALOGSYNC_FUZZ_SEED={text:?} is no number")),
                "CATALOGSYNC_FUZZ_SEED",
            ),
            Err(_) if testenv::in_ci() => (CI_SEED, "fixed in CI"),
            Err(_) => (rand::random(), "random"),
        };
        let cases = match std::env::var("CATALOGSYNC_FUZZ_CASE") {
            Ok(text) => vec![parse_u64(&text).unwrap_or_else(|| panic!("CATALOGSYNC_FUZZ_CASE={text:?} is no number"))],
            Err(_) => {
                let count = std::env::var("CATALOGSYNC_FUZZ_CASES")
                    .ok()
                    .map(|text| {
                        parse_u64(&text).unwrap_or_else(|| panic!("CATALOGSYNC_FUZZ_CASES={text:?} is no number"))
                    })
                    .unwrap_or(DEFAULT_CASES);
                (0..count).collect()
            }
        };
        Self { seed, seed_origin, cases }
    }

    fn rerun(&self, index: u64) -> String {
        format!(
            "CATALOGSYNC_FUZZ_SEED={} CATALOGSYNC_FUZZ_CASE={index} cargo test --test hostile_fuzz -- --nocapture",
            self.seed
        )
    }
}

fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim().replace('_', "");
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

// ------------------------------------------------------------------------------------------
// The catalog

/// What every sync of the test syncs: a small catalog with one realistic ModuleTemplate.
struct Catalog {
    templates: Vec<kube::api::DynamicObject>,
    release_metas: Vec<kube::api::DynamicObject>,
    crds: SkrCrds,
}

impl Catalog {
    fn new() -> Self {
        let templates = vec![
            // KLM's ModuleTemplate without its KCP-only label (whose value no apiserver takes):
            // a 30 KB descriptor and a default CR with unknown fields.
            MtBuilder::new(fixtures::KLM_MODULE, fixtures::KLM_VERSION)
                .label(fixtures::MODULE_NAME_LABEL, fixtures::KLM_MODULE)
                .descriptor(fixtures::klm_descriptor())
                .data(fixtures::klm_data())
                .build(),
            MtBuilder::new("api-gateway", "2.10.0").build(),
            MtBuilder::new("keda", "1.5.0").build(),
            MtBuilder::new("serverless", "1.4.0").label("team", "serverless").build(),
        ];
        let release_metas = vec![
            MrmBuilder::new(fixtures::KLM_MODULE).channel("regular", fixtures::KLM_VERSION).build(),
            MrmBuilder::new("api-gateway").channel("regular", "2.10.0").build(),
            MrmBuilder::new("keda").channel("regular", "1.5.0").channel("fast", "1.5.0").build(),
            MrmBuilder::new("serverless").channel("regular", "1.4.0").build(),
        ];
        let kcp_crds = catalogsync::api::crds();
        let found = skr_crd_names()
            .into_iter()
            .map(|name| {
                let crd = kcp_crds.iter().find(|c| c.name_any() == name).cloned();
                (name, crd)
            })
            .collect();
        Self { templates, release_metas, crds: SkrCrds::from_kcp(found) }
    }

    /// The desired set of a plain Kyma, rendered for `namespace`.
    fn desired(&self, namespace: &str) -> DesiredSet {
        let snapshot = Snapshot::build(&self.templates, &self.release_metas, namespace);
        let (desired, _) = desired_set(&snapshot, &fixtures::kyma_flags(false, false), &BTreeSet::new());
        assert!(desired.len() >= 6, "the fuzz catalog has copies of both kinds: {}", desired.len());
        desired
    }

    /// The honest SKR the fuzz servers play for `desired`.
    fn honest(&self, namespace: &str, desired: &DesiredSet) -> Honest {
        let copies = CatalogKind::ALL
            .into_iter()
            .map(|kind| {
                let copies = desired.of(kind).values().map(|d| d.body.value().expect("a copy is JSON")).collect();
                (kind.plural().to_owned(), copies)
            })
            .collect();
        let crds = self
            .crds
            .bodies
            .iter()
            .map(|(name, body)| (name.clone(), body.as_deref().cloned().expect("the KCP has both CRDs")))
            .collect();
        Honest { namespace: namespace.to_owned(), crds, copies }
    }
}

/// An access Secret named `name` holding `kubeconfig`.
fn access_secret(name: &str, kubeconfig: &str) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        data: Some([(KUBECONFIG_KEY.to_owned(), ByteString(kubeconfig.as_bytes().to_vec()))].into()),
        ..Secret::default()
    }
}

/// The SKR access settings of `catalogsync run`, with the loopback addresses allowed (as
/// every test allows them, `testenv::SKR_DESTINATIONS`) and short connect timeouts.
fn access_settings() -> AccessSettings {
    let mut settings = AccessSettings::new("catalogsync/fuzz", CONNECT_TIMEOUT);
    let rule: Rule = testenv::SKR_DESTINATIONS.parse().expect("a valid rule");
    settings.destinations = Arc::new(Destinations::new(vec![rule]));
    settings
}

// ------------------------------------------------------------------------------------------
// One sync

/// Everything a sync needs that outlives it.
struct Ctx {
    desired: DesiredSet,
    crds: SkrCrds,
    metrics: SkrClientMetrics,
    namespace: String,
    request_timeout: Duration,
    sync_timeout: Duration,
}

/// How one sync ended.
struct Synced {
    result: Result<Result<SyncReport, SyncError>, String>,
    elapsed: Duration,
    state: SkrState,
}

/// One sync of the SKR `access` leads to, as the reconciler runs it: the client built and the
/// executor run under the sync timeout, which ends the sync with [`SyncError::SyncTimeout`].
/// Runs in a task of its own, so a panic is caught and reported (as `Err`), and a task that
/// does not end within [`HANG`] is aborted and reported.
async fn sync_once(access: SkrAccess, ctx: Arc<Ctx>, mut state: SkrState) -> Synced {
    let started = Instant::now();
    let task = tokio::spawn(async move {
        let sync_timeout = ctx.sync_timeout;
        let work = async {
            let client = access.client().await?;
            let full_lists = Semaphore::new(1);
            let applies = Semaphore::new(SKR_CONCURRENCY);
            let may_write = || true;
            let target = SkrTarget {
                client: &client,
                namespace: &ctx.namespace,
                concurrency: SKR_CONCURRENCY,
                request_timeout: ctx.request_timeout,
                metrics: &ctx.metrics,
                may_write: &may_write,
                full_lists: &full_lists,
                applies: &applies,
                trust_memory_for: Duration::ZERO,
            };
            target.sync(&ctx.desired, &ctx.crds, &mut state).await
        };
        let result = match tokio::time::timeout(sync_timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(SyncError::SyncTimeout(sync_timeout)),
        };
        (result, state)
    });
    let abort = task.abort_handle();
    match tokio::time::timeout(HANG, task).await {
        Ok(Ok((result, state))) => Synced { result: Ok(result), elapsed: started.elapsed(), state },
        Ok(Err(join)) if join.is_panic() => {
            let panic = join.into_panic();
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Synced {
                result: Err(format!("panicked: {message}")),
                elapsed: started.elapsed(),
                state: SkrState::default(),
            }
        }
        Ok(Err(join)) => Synced {
            result: Err(format!("the sync task failed: {join}")),
            elapsed: started.elapsed(),
            state: SkrState::default(),
        },
        Err(_) => {
            abort.abort();
            Synced {
                result: Err(format!("hangs: not done after {HANG:?}")),
                elapsed: started.elapsed(),
                state: SkrState::default(),
            }
        }
    }
}

/// What is wrong with how a sync against a hostile SKR ended, if anything.
fn problems(synced: &Synced) -> Vec<String> {
    let mut problems = Vec::new();
    if synced.elapsed > SYNC_TIMEOUT + SLACK {
        problems.push(format!("took {:?}, more than {SYNC_TIMEOUT:?} + {SLACK:?}", synced.elapsed));
    }
    match &synced.result {
        Err(problem) => problems.push(problem.clone()),
        Ok(Ok(_)) => {}
        Ok(Err(err)) => {
            let reason = err.reason();
            if !ALLOWED_REASONS.contains(&reason) {
                problems.push(format!("reason {} is not an SKR failure", reason.as_str()));
            }
            for (what, text) in [("message", err.to_string()), ("condition message", err.condition_message())] {
                let chars = text.chars().count();
                if chars > MESSAGE_BOUND {
                    problems.push(format!("{what} of {chars} characters: {}", preview(&text)));
                }
                if text.chars().any(char::is_control) {
                    problems.push(format!("{what} with control characters: {}", preview(&text)));
                }
            }
        }
    }
    problems
}

/// Logs a failed sync as the reconciler does (`sync::reconciler`, "Failed to sync catalog"),
/// so the log check sees the line production writes for it.
fn log_failure(err: &SyncError) {
    tracing::warn!(reason = err.reason().as_str(), error = %err.condition_message(), "Failed to sync catalog");
}

/// The start of `text`, escaped, for a failure report.
fn preview(text: &str) -> String {
    let start: String = text.chars().take(300).collect();
    format!("{start:?}{}", if text.chars().count() > 300 { "..." } else { "" })
}

fn outcome_label(synced: &Synced) -> &'static str {
    match &synced.result {
        Ok(Ok(_)) => ConditionReason::CatalogSynced.as_str(),
        Ok(Err(err)) => err.reason().as_str(),
        Err(_) => "panic-or-hang",
    }
}

// ------------------------------------------------------------------------------------------
// One case

/// How one case went.
struct CaseOutcome {
    case: FuzzCase,
    labels: Vec<&'static str>,
    worst: Duration,
    problems: Vec<String>,
    fired: Vec<String>,
    requests: usize,
    last_error: Option<String>,
}

/// Runs `case`: its server, then its syncs one after the other, sharing their state.
async fn run_case(case: FuzzCase, honest: Arc<Honest>, tls: Arc<FuzzTls>, ctx: Arc<Ctx>) -> CaseOutcome {
    let mut outcome = CaseOutcome {
        case: case.clone(),
        labels: Vec::new(),
        worst: Duration::ZERO,
        problems: Vec::new(),
        fired: Vec::new(),
        requests: 0,
        last_error: None,
    };
    let skr = match FuzzSkr::start(case.clone(), honest, &tls) {
        Ok(skr) => skr,
        Err(e) => {
            outcome.problems.push(format!("the fuzz SKR did not start: {e:#}"));
            return outcome;
        }
    };
    let secret = access_secret(&format!("fuzz-{}", case.index()), &skr.kubeconfig_with_token("fuzz-t0ken"));
    match SkrAccess::from_secret(&secret, &access_settings()) {
        Err(e) => outcome.problems.push(format!("the fuzz kubeconfig was refused: {e}")),
        Ok(access) => {
            let mut state = SkrState::default();
            for _ in 0..case.syncs() {
                let synced = sync_once(access.clone(), Arc::clone(&ctx), state).await;
                outcome.labels.push(outcome_label(&synced));
                outcome.worst = outcome.worst.max(synced.elapsed);
                outcome.problems.extend(problems(&synced));
                if let Ok(Err(err)) = &synced.result {
                    log_failure(err);
                    outcome.last_error = Some(preview(&err.condition_message()));
                }
                state = synced.state;
            }
        }
    }
    outcome.fired = skr.fired();
    outcome.requests = skr.requests();
    if skr.server_panics() > 0 {
        outcome
            .problems
            .push(format!("the fuzz SKR itself panicked {} times (a bug of the fuzzer)", skr.server_panics()));
    }
    // Dropping joins the server's thread: not on a runtime worker.
    let _ = tokio::task::spawn_blocking(move || drop(skr)).await;
    outcome
}

// ------------------------------------------------------------------------------------------
// The healthy SKR

/// How the healthy syncs went.
#[derive(Default)]
struct HealthyReport {
    syncs: usize,
    worst: Duration,
    failures: Vec<String>,
}

/// Syncs the healthy SKR every [`HEALTHY_PERIOD`] until `stop`, each sync bounded by
/// [`HEALTHY_SYNC_TIMEOUT`]; every [`HEALTHY_COLD_EVERY`]-th one from a cold state.
async fn keep_syncing(
    access: SkrAccess,
    ctx: Arc<Ctx>,
    mut state: SkrState,
    mut stop: watch::Receiver<bool>,
) -> HealthyReport {
    let mut report = HealthyReport::default();
    let mut tick = tokio::time::interval(HEALTHY_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return report,
            _ = tick.tick() => {}
        }
        if report.syncs % HEALTHY_COLD_EVERY == HEALTHY_COLD_EVERY - 1 {
            state = SkrState::default();
        }
        let synced = sync_once(access.clone(), Arc::clone(&ctx), state).await;
        report.syncs += 1;
        report.worst = report.worst.max(synced.elapsed);
        match &synced.result {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => report.failures.push(format!(
                "healthy sync {} failed after {:?}: {}",
                report.syncs,
                synced.elapsed,
                preview(&err.condition_message())
            )),
            Err(problem) => report.failures.push(format!("healthy sync {}: {problem}", report.syncs)),
        }
        state = synced.state;
    }
}

// ------------------------------------------------------------------------------------------
// Logs

/// A [`MakeWriter`] that checks every log line as it is written and keeps only the
/// statistics and the offending lines (cut short), so a flood of logs costs no memory.
#[derive(Clone, Default)]
struct LogSink(Arc<Mutex<LogStats>>);

#[derive(Default)]
struct LogStats {
    lines: u64,
    longest: usize,
    offending: Vec<String>,
    offending_count: u64,
}

impl LogSink {
    fn stats(&self) -> std::sync::MutexGuard<'_, LogStats> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks one event's output: one line, its terminating newline the only control
    /// character (a newline inside would let a field forge further log lines), at most
    /// [`LOG_LINE_BOUND`] bytes. `kept` is the start of the `total` bytes written.
    fn check(&self, kept: &[u8], total: usize) {
        let mut stats = self.stats();
        let text = String::from_utf8_lossy(kept);
        let complete = kept.len() == total;
        let line = if complete { text.strip_suffix('\n').unwrap_or(&text) } else { &text };
        let len = if complete { line.len() } else { total.saturating_sub(1) };
        stats.lines += 1;
        stats.longest = stats.longest.max(len);
        let control = line.chars().any(char::is_control);
        if len > LOG_LINE_BOUND || control {
            stats.offending_count += 1;
            if stats.offending.len() < 10 {
                let what = if control { "a control character" } else { "too long" };
                stats.offending.push(format!("{len} bytes, {what}: {}", preview(line)));
            }
        }
    }
}

/// One event's output, checked when the formatter is done with it (dropped).
struct LineWriter {
    sink: LogSink,
    kept: Vec<u8>,
    total: usize,
}

impl io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Keep enough to see any line over the bound; count the rest.
        let room = (4 * LOG_LINE_BOUND).saturating_sub(self.kept.len()).min(buf.len());
        self.kept.extend_from_slice(&buf[..room]);
        self.total += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        self.sink.check(&self.kept, self.total);
    }
}

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter { sink: self.clone(), kept: Vec::new(), total: 0 }
    }
}

/// Installs the process's subscriber: plain format, no colours, DEBUG for catalogsync and INFO
/// for the rest (as `--log-filter info,catalogsync=debug`), into `sink`.
fn install_logs(sink: &LogSink) {
    let filter = tracing_subscriber::EnvFilter::new("info,catalogsync=debug");
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(sink.clone())
        .try_init()
        .expect("no other subscriber in this test binary");
}

// ------------------------------------------------------------------------------------------
// The test

fn peak_rss_mib() -> u64 {
    let (_, hwm_kib) = testenv::process::rss_kib(std::process::id()).expect("read /proc/self/status");
    hwm_kib / 1024
}

/// A healthy sync of `access` that must succeed (the first one, creating namespace and CRDs).
async fn healthy_first_sync(access: &SkrAccess, ctx: &Arc<Ctx>) -> SkrState {
    let synced = sync_once(access.clone(), Arc::clone(ctx), SkrState::default()).await;
    match synced.result {
        Ok(Ok(_)) => synced.state,
        Ok(Err(err)) => panic!("the first healthy sync failed: {}", err.condition_message()),
        Err(problem) => panic!("the first healthy sync: {problem}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_skrs_fail_within_bounds_while_a_healthy_one_keeps_syncing() {
    let run = Run::from_env();
    eprintln!(
        "hostile fuzz: seed {} ({}), {} cases, {CONCURRENT_CASES} at once, \
         request timeout {REQUEST_TIMEOUT:?}, sync timeout {SYNC_TIMEOUT:?}",
        run.seed,
        run.seed_origin,
        run.cases.len()
    );
    let started = Instant::now();
    let catalog = Catalog::new();
    let metrics = SkrClientMetrics::register(&prometheus::Registry::new()).expect("a new registry");

    // The healthy SKR, in a sync namespace of its own. The logs are watched from here on:
    // the environment's start-up (readiness polls of starting apiservers) is no sync.
    let env = testenv::env();
    let logs = LogSink::default();
    install_logs(&logs);
    let healthy_ns = testenv::unique_name("fuzz-healthy");
    let healthy_ctx = Arc::new(Ctx {
        desired: catalog.desired(&healthy_ns),
        crds: catalog.crds.clone(),
        metrics: metrics.clone(),
        namespace: healthy_ns.clone(),
        request_timeout: HEALTHY_REQUEST_TIMEOUT,
        sync_timeout: HEALTHY_FIRST_TIMEOUT,
    });
    let kubeconfig = env.skr_a.kubeconfig_yaml("catalogsync-fuzz-healthy", &["system:masters"]);
    let healthy = SkrAccess::from_secret(&access_secret("fuzz-healthy", &kubeconfig), &access_settings())
        .expect("the healthy SKR's kubeconfig is accepted");
    let state = healthy_first_sync(&healthy, &healthy_ctx).await;
    let healthy_ctx = Arc::new(Ctx {
        desired: catalog.desired(&healthy_ns),
        crds: catalog.crds.clone(),
        metrics: metrics.clone(),
        namespace: healthy_ns.clone(),
        request_timeout: HEALTHY_REQUEST_TIMEOUT,
        sync_timeout: HEALTHY_SYNC_TIMEOUT,
    });
    let (stop, stopped) = watch::channel(false);
    let healthy_task = tokio::spawn(keep_syncing(healthy, healthy_ctx, state, stopped));

    // The fuzz.
    let namespace = fixtures::SYNC_NAMESPACE;
    let desired = catalog.desired(namespace);
    let honest = Arc::new(catalog.honest(namespace, &desired));
    let ctx = Arc::new(Ctx {
        desired,
        crds: catalog.crds.clone(),
        metrics,
        namespace: namespace.to_owned(),
        request_timeout: REQUEST_TIMEOUT,
        sync_timeout: SYNC_TIMEOUT,
    });
    let tls = Arc::new(FuzzTls::generate().expect("a CA for the fuzz SKRs"));

    let honest_cases = (0..HONEST_CASES).map(|i| FuzzCase::honest(run.seed, i));
    let honest_outcomes: Vec<CaseOutcome> = futures::stream::iter(honest_cases)
        .map(|case| run_case(case, Arc::clone(&honest), Arc::clone(&tls), Arc::clone(&ctx)))
        .buffer_unordered(CONCURRENT_CASES)
        .collect()
        .await;
    for outcome in &honest_outcomes {
        let failed = outcome.labels.iter().any(|l| *l != ConditionReason::CatalogSynced.as_str());
        assert!(
            !failed && outcome.problems.is_empty(),
            "an honest fuzz SKR did not sync, so the fuzzer is broken: {} ({}): {:?} {:?}",
            outcome.case,
            outcome.labels.join(", "),
            outcome.problems,
            outcome.last_error
        );
    }

    let fuzz_started = Instant::now();
    let mut results: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut failed: Vec<CaseOutcome> = Vec::new();
    let mut failed_kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut worst: Option<(Duration, u64)> = None;
    let mut done = 0usize;
    let mut outcomes = futures::stream::iter(run.cases.iter().map(|&i| FuzzCase::new(run.seed, i)))
        .map(|case| run_case(case, Arc::clone(&honest), Arc::clone(&tls), Arc::clone(&ctx)))
        .buffer_unordered(CONCURRENT_CASES);
    while let Some(outcome) = outcomes.next().await {
        done += 1;
        if done.is_multiple_of(500) {
            eprintln!("hostile fuzz: {done} cases in {:.0}s", fuzz_started.elapsed().as_secs_f64());
        }
        if run.cases.len() == 1 {
            // A rerun of one case: show everything about it.
            eprintln!("{}", outcome.case);
            eprintln!("  sent: {}", outcome.fired.join(" | "));
            eprintln!(
                "  results: {} after {} requests, worst {:?}",
                outcome.labels.join(", "),
                outcome.requests,
                outcome.worst
            );
            eprintln!("  last error: {}", outcome.last_error.as_deref().unwrap_or("none"));
        }
        for label in &outcome.labels {
            *results.entry(label).or_default() += 1;
        }
        if worst.is_none_or(|(d, _)| outcome.worst > d) {
            worst = Some((outcome.worst, outcome.case.index()));
        }
        if !outcome.problems.is_empty() {
            for kind in outcome.case.kinds() {
                *failed_kinds.entry(kind).or_default() += 1;
            }
            failed.push(outcome);
        }
    }
    drop(outcomes);
    let fuzz_took = fuzz_started.elapsed();

    let _ = stop.send(true);
    let healthy = healthy_task.await.expect("the healthy syncs do not panic");
    let rss = peak_rss_mib();
    let stats = logs.stats();

    // Report.
    failed.sort_by_key(|o| o.case.index());
    for outcome in failed.iter().take(PRINTED_FAILURES) {
        eprintln!("FAILED {}", outcome.case);
        eprintln!("  problems: {}", outcome.problems.join("; "));
        eprintln!(
            "  sent: {}",
            if outcome.fired.is_empty() { "nothing hostile".to_owned() } else { outcome.fired.join(" | ") }
        );
        eprintln!("  results: {} after {} requests", outcome.labels.join(", "), outcome.requests);
        eprintln!("  rerun: {}", run.rerun(outcome.case.index()));
    }
    if failed.len() > PRINTED_FAILURES {
        eprintln!("... and {} more failing cases", failed.len() - PRINTED_FAILURES);
    }
    for line in &stats.offending {
        eprintln!("LOG LINE {line}");
    }
    for failure in &healthy.failures {
        eprintln!("HEALTHY {failure}");
    }
    let (worst_time, worst_case) = worst.unwrap_or_default();
    let results_line: Vec<String> = results.iter().map(|(label, n)| format!("{label} {n}")).collect();
    let summary = format!(
        "hostile fuzz summary: {} cases (seed {}) in {:.0}s (fuzz {:.0}s); worst RSS {rss} MiB (bound {RSS_BOUND_MIB}); \
         worst sync {:.2}s (case {worst_case}); results: {}; healthy syncs {} (worst {:.2}s, {} failed); \
         log lines {} (longest {} bytes); failing cases {}{}",
        run.cases.len(),
        run.seed,
        started.elapsed().as_secs_f64(),
        fuzz_took.as_secs_f64(),
        worst_time.as_secs_f64(),
        results_line.join(", "),
        healthy.syncs,
        healthy.worst.as_secs_f64(),
        healthy.failures.len(),
        stats.lines,
        stats.longest,
        failed.len(),
        if failed_kinds.is_empty() { String::new() } else { format!(" (by kind: {failed_kinds:?})") },
    );
    eprintln!("{summary}");
    // The test runner shows a passing test's output only on request: `hack/test.sh` prints
    // this file after the tests, so every run's figures are in its output.
    let summary_file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(SUMMARY_FILE);
    if let Err(error) = std::fs::write(&summary_file, format!("{summary}\n")) {
        eprintln!("failed to write {}: {error}", summary_file.display());
    }

    let mut violations = Vec::new();
    if !failed.is_empty() {
        violations.push(format!("{} of {} cases failed (see FAILED above)", failed.len(), run.cases.len()));
    }
    if rss > RSS_BOUND_MIB {
        violations.push(format!("peak RSS {rss} MiB over {RSS_BOUND_MIB} MiB"));
    }
    if stats.offending_count > 0 {
        violations.push(format!("{} log lines too long or with control characters", stats.offending_count));
    }
    if !healthy.failures.is_empty() {
        violations.push(format!("{} of {} healthy syncs failed", healthy.failures.len(), healthy.syncs));
    }
    if healthy.syncs == 0 && fuzz_took > 2 * HEALTHY_PERIOD {
        violations.push("the healthy SKR was never synced during the fuzz".to_owned());
    }
    assert!(violations.is_empty(), "hostile fuzz with seed {}: {}", run.seed, violations.join("; "));
}
