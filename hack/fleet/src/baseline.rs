//! The lifecycle-manager baseline: a faithful reproduction of KLM's in-loop catalog sync
//! (described under "The baseline" in `docs/performance.md`; how it differs from catalogsync:
//! section 7 of `docs/catalog-rules.md`), the reference catalogsync is measured against.
//!
//! ```text
//!  KCP reflectors (Kymas, MTs, MRMs, access Secrets): no KCP request per pass
//!        │
//!  controller-runtime's work queue over Kymas (FIFO, one pass per Kyma at a time),
//!  --workers concurrent reconciles
//!        │  once at start, then --period after each successful pass, 5s..30s backoff on error
//!        ▼
//!  pass(kyma) = desired_set(snapshot, labels)
//!        then per kind (MTs, then MRMs): SSA every desired object concurrently (catalog-sync,
//!        force); only if all succeeded: list the kind cluster-wide, delete catalog-sync-managed
//!        objects not desired
//! ```
//!
//! Unlike catalogsync, every pass re-applies the whole desired catalog (about M + R + 2 SKR
//! requests per Kyma per pass): that is the point of the baseline. The admin address serves
//! [`BaselineStats`] at `GET /stats` and zeroes the counters on `POST /reset`; read it with
//! [`BaselineAdmin`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use catalogsync::api::{KYMA_NAME_LABEL, Kyma, SKIP_RECONCILIATION_LABEL, SKR_FIELD_MANAGER, is_flag_on};
use catalogsync::catalog::{CatalogKind, DesiredObject, Snapshot, desired_set};
use catalogsync::skr::access::{AccessSettings, SkrAccess, find_access_secret};
use catalogsync::skr::destination::Destinations;
use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use self::queue::WorkQueue;
use crate::stats::{Percentiles, unix_ms};

mod queue;

/// How many pass durations and queue lags are kept for the percentiles (the most recent ones).
const MAX_SAMPLES: usize = 200_000;
/// How often the first-round tracker drops Kymas deleted before their first pass.
const FIRST_ROUND_POLL: Duration = Duration::from_millis(200);
/// How long the final drain (in-flight passes, admin server) may take after a stop signal.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of one [`BaselineAdmin`] request.
const ADMIN_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Flags of `fleet baseline`. Defaults are KLM's production values.
#[derive(clap::Args, Debug, Clone)]
pub struct BaselineArgs {
    /// KCP kubeconfig file. Without it, the usual inference applies ($KUBECONFIG,
    /// ~/.kube/config, in-cluster).
    #[arg(long, env = "FLEET_BASELINE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// KCP namespace of the Kymas, their access Secrets and the catalog (KLM's cache namespace).
    #[arg(long, env = "FLEET_BASELINE_KCP_NAMESPACE", default_value = "kcp-system")]
    pub kcp_namespace: String,
    /// SKR namespace the catalog copies are written to (KLM `--sync-namespace`).
    #[arg(long, env = "FLEET_BASELINE_SYNC_NAMESPACE", default_value = "kyma-system")]
    pub sync_namespace: String,
    /// Comma-separated restricted module names (KLM `--restricted-default-modules`): their
    /// MRMs reach only Kymas matched by the MRM's `kymaSelector`.
    #[arg(long, env = "FLEET_BASELINE_RESTRICTED_MODULES", value_delimiter = ',')]
    pub restricted_modules: Vec<String>,
    /// Requeue delay after a successful pass (KLM `--kyma-requeue-success-interval`), such as
    /// 300s, 5m or 500ms.
    #[arg(long, env = "FLEET_BASELINE_PERIOD", default_value = "300s", value_parser = catalogsync::config::parse_duration)]
    pub period: Duration,
    /// Concurrent Kyma reconciles (KLM `--max-concurrent-kyma-reconciles` in production).
    #[arg(long, env = "FLEET_BASELINE_WORKERS", default_value_t = 25, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// Timeout of one SKR request (connect, and the whole request).
    #[arg(long, env = "FLEET_BASELINE_REQUEST_TIMEOUT", default_value = "10s", value_parser = catalogsync::config::parse_duration)]
    pub request_timeout: Duration,
    /// First requeue delay after a failed pass, doubled per failure in a row (KLM
    /// `--failure-base-delay`).
    #[arg(long, env = "FLEET_BASELINE_FAILURE_BASE_DELAY", default_value = "5s", value_parser = catalogsync::config::parse_duration)]
    pub failure_base_delay: Duration,
    /// Cap of the failure requeue delay (KLM `--failure-max-delay`).
    #[arg(long, env = "FLEET_BASELINE_FAILURE_MAX_DELAY", default_value = "30s", value_parser = catalogsync::config::parse_duration)]
    pub failure_max_delay: Duration,
    /// Requests per second of one SKR client, a token bucket as client-go's (KLM
    /// `--k8s-skr-client-qps`); 0 disables the limit.
    #[arg(long, env = "FLEET_BASELINE_SKR_QPS", default_value_t = 50.0)]
    pub skr_qps: f64,
    /// Token-bucket size of one SKR client (KLM `--k8s-skr-client-burst`).
    #[arg(long, env = "FLEET_BASELINE_SKR_BURST", default_value_t = 100)]
    pub skr_burst: u32,
    /// Most requests in flight to one SKR; 0 means unbounded, as KLM. KLM multiplexes its
    /// unbounded goroutines over one HTTP/2 connection; this client speaks HTTP/1.1, where
    /// each concurrent request holds its own connection, so the bound keeps connections (and
    /// TLS handshakes) per pass near KLM's while keeping most of its parallelism.
    #[arg(long, env = "FLEET_BASELINE_SKR_MAX_IN_FLIGHT", default_value_t = 32)]
    pub skr_max_in_flight: u32,
    /// Keep each SKR client, and its idle connections, between passes (rebuilt when the
    /// access Secret changes). Off by default: at a 5m period KLM's connection has been closed
    /// as idle (90s) before the next pass, and thousands of SKRs' idle HTTP/1.1 pools would
    /// exhaust file descriptors; the client is then built per pass and dropped after it.
    #[arg(long, env = "FLEET_BASELINE_SKR_KEEP_CONNECTIONS")]
    pub skr_keep_connections: bool,
    /// Plain-HTTP stats address (`GET /stats`, `POST /reset`). Once bound, one line
    /// `{"admin":"<addr>"}` is printed to stdout.
    #[arg(long, env = "FLEET_BASELINE_ADMIN", default_value = "127.0.0.1:0")]
    pub admin: SocketAddr,
    /// Run one pass per Kyma known at start, print the final stats line and exit.
    #[arg(long, env = "FLEET_BASELINE_ONCE")]
    pub once: bool,
    /// With `--once`: keep serving the admin endpoint this long after the round, so a poller
    /// sees the final stats (SIGTERM ends it early).
    #[arg(long, env = "FLEET_BASELINE_ONCE_LINGER", default_value = "5s", value_parser = catalogsync::config::parse_duration)]
    pub once_linger: Duration,
}

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

/// A client of a running baseline's admin endpoint.
#[derive(Debug, Clone)]
pub struct BaselineAdmin {
    /// The address the baseline printed as `{"admin":"<addr>"}`.
    pub addr: SocketAddr,
}

impl BaselineAdmin {
    /// A client of the baseline serving at `addr`.
    pub fn new(addr: SocketAddr) -> BaselineAdmin {
        BaselineAdmin { addr }
    }

    /// Reads the current stats.
    ///
    /// # Errors
    /// Fails when the endpoint cannot be reached, answers other than 200, or sends no stats.
    pub async fn stats(&self) -> Result<BaselineStats> {
        let body = self.request("GET", "/stats").await?;
        serde_json::from_str(&body).context("failed to parse the baseline stats")
    }

    /// Zeroes the counters and the percentile samples.
    ///
    /// # Errors
    /// Fails when the endpoint cannot be reached or answers other than 200.
    pub async fn reset(&self) -> Result<()> {
        self.request("POST", "/reset").await.map(drop)
    }

    async fn request(&self, method: &str, path: &str) -> Result<String> {
        let (code, body) = testenv::http::request(self.addr, method, path, None, ADMIN_CLIENT_TIMEOUT)
            .await
            .with_context(|| format!("failed to call baseline admin {method} {path}"))?;
        if code != 200 {
            bail!("baseline admin {method} {path} answered {code}");
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

/// Runs the baseline until SIGTERM or Ctrl-C (or, with `--once`, until the first round is
/// done), then prints the final stats as one JSON line to stdout.
///
/// # Errors
/// Fails when the KCP client cannot be built or the admin address cannot be bound.
pub async fn run(args: BaselineArgs) -> Result<()> {
    init_tracing();
    let kcp = kcp_client(args.kubeconfig.as_deref()).await?;
    // `signal` ends everything; `shutdown` (its child) stops the passes, also when `--once`
    // is done; the admin server outlives it by `--once-linger`.
    let signal = CancellationToken::new();
    let shutdown = signal.child_token();
    let admin_stop = CancellationToken::new();
    let signals = tokio::spawn(on_signal(signal.clone()));

    let ns = args.kcp_namespace.clone();
    let (catalog, catalog_task) = watch_catalog(&kcp, &ns);
    let (secrets, secret_task) = watch_secrets(&kcp, &ns);
    let ctx = Arc::new(Ctx::new(&args, catalog, secrets));

    let listener = tokio::net::TcpListener::bind(args.admin)
        .await
        .with_context(|| format!("failed to bind the admin address {}", args.admin))?;
    let bound = listener.local_addr()?;
    println!("{}", serde_json::json!({ "admin": bound.to_string() }));
    let admin_shutdown = admin_stop.clone();
    let app = router(ctx.clone());
    let admin = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(async move { admin_shutdown.cancelled().await }).await
    });

    // Never pass against a partial catalog: an empty desired set prunes every copy.
    let synced = tokio::select! {
        ready = async { until_ready(&ctx.catalog.templates).await
            && until_ready(&ctx.catalog.release_metas).await
            && until_ready(&ctx.secrets).await } => ready,
        () = shutdown.cancelled() => false,
    };
    if synced {
        info!(
            templates = ctx.catalog.templates.len(),
            release_metas = ctx.catalog.release_metas.len(),
            "KCP caches synced"
        );
        run_controller(&kcp, &args, ctx.clone(), shutdown.clone()).await;
    }
    shutdown.cancel();
    let stats = ctx.stats();
    println!("{}", serde_json::to_string(&stats)?);
    if args.once && !signal.is_cancelled() {
        tokio::select! {
            () = tokio::time::sleep(args.once_linger) => {}
            () = signal.cancelled() => {}
        }
    }
    admin_stop.cancel();
    catalog_task.abort();
    secret_task.abort();
    signals.abort();
    match tokio::time::timeout(SHUTDOWN_TIMEOUT, admin).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => warn!(error = &error as &dyn std::error::Error, "Admin server failed"),
        Ok(Err(error)) => warn!(error = &error as &dyn std::error::Error, "Admin server task failed"),
        Err(_) => warn!("Admin server did not stop in time"),
    }
    Ok(())
}

/// Runs the Kyma controller (watch, work queue, workers) and the first-round tracker until
/// `shutdown`.
async fn run_controller(kcp: &Client, args: &BaselineArgs, ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let writer = reflector::store::Writer::<Kyma>::default();
    let kyma_store = writer.as_reader();
    let queue = WorkQueue::new();
    // KLM's Kyma watch passes generation and label changes only (status writes never); the
    // initial list queues every Kyma in list order.
    let events = watcher(Api::<Kyma>::namespaced(kcp.clone(), &args.kcp_namespace), watcher::Config::default())
        .default_backoff()
        .modify(trim_kyma)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(trigger_hash, PredicateConfig::default());
    let watch = tokio::spawn({
        let (ctx, queue, stop) = (ctx.clone(), queue.clone(), shutdown.clone());
        async move {
            tokio::pin!(events);
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    () = stop.cancelled() => return,
                };
                match event {
                    Some(Ok(kyma)) => {
                        let key = key_of(&kyma);
                        ctx.mark_due(&key, Instant::now());
                        queue.add(&key);
                    }
                    Some(Err(error)) => warn!(error = &error as &dyn std::error::Error, "Kyma watch failed; retrying"),
                    None => return,
                }
            }
        }
    });
    ctx.stats.started_unix_ms.store(unix_ms(), Ordering::Relaxed);
    *lock(&ctx.kymas) = Some(kyma_store.clone());
    *lock(&ctx.queue) = Some(queue.clone());

    let tracker = tokio::spawn(track_first_round(ctx.clone(), kyma_store.clone(), shutdown.clone()));
    let timers = tokio::spawn({
        let (queue, stop) = (queue.clone(), shutdown.clone());
        async move { queue.run_timers(&stop).await }
    });
    // As controller-runtime, workers start once the Kyma cache has synced: the store shows
    // the initial list only when it is complete, and a key taken before would find no Kyma.
    let synced = tokio::select! {
        ready = until_ready(&kyma_store) => ready,
        () = shutdown.cancelled() => false,
    };
    let workers: Vec<_> = (0..if synced { args.workers } else { 0 })
        .map(|_| tokio::spawn(work(ctx.clone(), queue.clone(), kyma_store.clone(), shutdown.clone())))
        .collect();
    shutdown.cancelled().await;
    // Let in-flight passes finish, but not forever.
    if tokio::time::timeout(SHUTDOWN_TIMEOUT, future::join_all(workers)).await.is_err() {
        warn!("In-flight passes did not finish in time");
    }
    for task in [watch, tracker, timers] {
        task.abort();
    }
}

/// One worker: takes the next Kyma off the queue, runs its pass, requeues it (controller-
/// runtime's `processNextWorkItem`), until `shutdown`.
async fn work(ctx: Arc<Ctx>, queue: Arc<WorkQueue>, kymas: Store<Kyma>, shutdown: CancellationToken) {
    while let Some(key) = queue.get(&shutdown).await {
        let kyma = key.split_once('/').and_then(|(ns, name)| kymas.get(&ObjectRef::new(name).within(ns)));
        let requeue = match kyma {
            Some(kyma) => match reconcile(kyma, &ctx).await {
                Ok(()) => ctx.requeue_after_success(&key),
                Err(_) => ctx.requeue_after_failure(&key),
            },
            // Deleted: nothing to do, and no requeue.
            None => {
                ctx.forget(&key);
                None
            }
        };
        if let Some(delay) = requeue {
            queue.add_at(&key, tokio::time::Instant::now() + delay);
        }
        queue.done(&key);
    }
}

// ---------------------------------------------------------------------------------------
// KCP caches
// ---------------------------------------------------------------------------------------

/// The KCP catalog reflectors and the snapshot built from them, rebuilt lazily after a change.
struct Catalog {
    templates: Store<DynamicObject>,
    release_metas: Store<DynamicObject>,
    /// Bumped after every catalog watch event (the store is updated before).
    generation: Arc<AtomicU64>,
    /// The snapshot and the generation it was built at.
    cached: Mutex<Option<(u64, Arc<Snapshot>)>>,
}

impl Catalog {
    /// The snapshot of the current catalog (built at most once per catalog change).
    fn snapshot(&self, sync_namespace: &str) -> Arc<Snapshot> {
        let mut cached = lock(&self.cached);
        let generation = self.generation.load(Ordering::Acquire);
        if let Some((built_at, snapshot)) = cached.as_ref()
            && *built_at == generation
        {
            return snapshot.clone();
        }
        let templates = self.templates.state();
        let release_metas = self.release_metas.state();
        let snapshot = Arc::new(Snapshot::build(
            templates.iter().map(AsRef::as_ref),
            release_metas.iter().map(AsRef::as_ref),
            sync_namespace,
        ));
        if !snapshot.malformed.is_empty() {
            warn!(malformed = snapshot.malformed.len(), "Some KCP catalog objects do not parse; left out");
        }
        *cached = Some((generation, snapshot.clone()));
        snapshot
    }
}

/// Starts the MT and MRM reflectors (managedFields stripped: KLM's copy clears them anyway).
fn watch_catalog(kcp: &Client, namespace: &str) -> (Catalog, tokio::task::JoinHandle<()>) {
    let generation = Arc::new(AtomicU64::new(0));
    let (templates, mts) = watch_kind(kcp, namespace, CatalogKind::ModuleTemplate.api_resource(), generation.clone());
    let (release_metas, mrms) =
        watch_kind(kcp, namespace, CatalogKind::ModuleReleaseMeta.api_resource(), generation.clone());
    let task = tokio::spawn(async move {
        future::join(mts, mrms).await;
    });
    (Catalog { templates, release_metas, generation, cached: Mutex::new(None) }, task)
}

/// One catalog reflector; `generation` is bumped after each event.
fn watch_kind(
    kcp: &Client,
    namespace: &str,
    ar: ApiResource,
    generation: Arc<AtomicU64>,
) -> (Store<DynamicObject>, impl Future<Output = ()> + Send + 'static) {
    let writer = reflector::store::Writer::new(ar.clone());
    let store = writer.as_reader();
    let stream =
        watcher(Api::<DynamicObject>::namespaced_with(kcp.clone(), namespace, &ar), watcher::Config::default())
            .default_backoff()
            .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None)
            .reflect(writer)
            .for_each(move |event| {
                match event {
                    Ok(_) => {
                        generation.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(error) => warn!(error = &error as &dyn std::error::Error, "Catalog watch failed; retrying"),
                }
                future::ready(())
            });
    (store, stream)
}

/// Starts the reflector of the access Secrets (full objects: KLM's Secret cache holds them).
fn watch_secrets(kcp: &Client, namespace: &str) -> (Store<Secret>, tokio::task::JoinHandle<()>) {
    let writer = reflector::store::Writer::<Secret>::default();
    let store = writer.as_reader();
    let stream =
        watcher(Api::<Secret>::namespaced(kcp.clone(), namespace), watcher::Config::default().labels(KYMA_NAME_LABEL))
            .default_backoff()
            .modify(|s| s.metadata.managed_fields = None)
            .reflect(writer)
            .for_each(|event| {
                if let Err(error) = event {
                    warn!(error = &error as &dyn std::error::Error, "Secret watch failed; retrying");
                }
                future::ready(())
            });
    (store, tokio::spawn(stream))
}

/// Keeps only what a pass reads of a Kyma (labels, identity, generation).
fn trim_kyma(kyma: &mut Kyma) {
    kyma.metadata.managed_fields = None;
    kyma.metadata.annotations = None;
    kyma.spec = Default::default();
    kyma.status = None;
}

/// KLM's Kyma event filter: generation or label changes (plus identity).
fn trigger_hash(kyma: &Kyma) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    kyma.metadata.uid.hash(&mut h);
    kyma.metadata.generation.hash(&mut h);
    kyma.metadata.labels.hash(&mut h);
    Some(h.finish())
}

/// Waits until a store finished its first list (polled: a readiness signal wakes only its
/// latest waiter).
async fn until_ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(200), store.wait_until_ready()).await {
            Ok(result) => return result.is_ok(),
            Err(_) => continue,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reconcile
// ---------------------------------------------------------------------------------------

/// Where the simulated SKRs are.
const LOOPBACK: &str = "127.0.0.0/8";

/// Settings of every pass.
struct Settings {
    sync_namespace: String,
    restricted: BTreeSet<String>,
    period: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    access: AccessSettings,
    request_timeout: Duration,
    skr_qps: f64,
    skr_burst: u32,
    skr_max_in_flight: u32,
    skr_keep_connections: bool,
    once: bool,
}

/// The SKR client of one pass and its request bounds.
struct Skr {
    client: Client,
    /// client-go's per-client QPS limit; kept per Kyma across client rebuilds.
    limiter: Option<Arc<TokenBucket>>,
    /// The bound of concurrent requests (per pass: one pass per Kyma runs at a time).
    in_flight: Option<Semaphore>,
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

/// Everything a reconcile needs.
struct Ctx {
    settings: Settings,
    catalog: Catalog,
    secrets: Store<Secret>,
    kymas: Mutex<Option<Store<Kyma>>>,
    /// The work queue, once the controller runs (its length is the stats' `queued`).
    queue: Mutex<Option<Arc<WorkQueue>>>,
    /// Cached clients by Kyma key and Secret version (`--skr-keep-connections`).
    skrs: Mutex<HashMap<String, (String, Client)>>,
    /// Token buckets by Kyma key.
    limiters: Mutex<HashMap<String, Arc<TokenBucket>>>,
    schedule: Mutex<Schedule>,
    stats: Stats,
    /// Cancelled when `--once` is done.
    once_done: CancellationToken,
}

impl Ctx {
    fn new(args: &BaselineArgs, catalog: Catalog, secrets: Store<Secret>) -> Ctx {
        Ctx {
            settings: Settings {
                sync_namespace: args.sync_namespace.clone(),
                restricted: args
                    .restricted_modules
                    .iter()
                    .map(|m| m.trim())
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
                    .collect(),
                period: args.period,
                backoff_min: args.failure_base_delay,
                backoff_max: args.failure_max_delay,
                access: AccessSettings {
                    // The simulated SKRs listen on loopback.
                    destinations: Arc::new(Destinations::new(vec![LOOPBACK.parse().expect("a CIDR")])),
                    ..AccessSettings::new(format!("klm-baseline/{}", env!("CARGO_PKG_VERSION")), args.request_timeout)
                },
                request_timeout: args.request_timeout,
                skr_qps: args.skr_qps,
                skr_burst: args.skr_burst,
                skr_max_in_flight: args.skr_max_in_flight,
                skr_keep_connections: args.skr_keep_connections,
                once: args.once,
            },
            catalog,
            secrets,
            kymas: Mutex::new(None),
            queue: Mutex::new(None),
            skrs: Mutex::new(HashMap::new()),
            limiters: Mutex::new(HashMap::new()),
            schedule: Mutex::new(Schedule::default()),
            stats: Stats::default(),
            once_done: CancellationToken::new(),
        }
    }

    /// Records that `key` is due at `at` unless it was due earlier already.
    fn mark_due(&self, key: &str, at: Instant) {
        lock(&self.schedule).mark_due(key, at);
    }

    /// Records the start of a pass: its queue lag.
    fn start_pass(&self, key: &str, now: Instant) {
        let due = lock(&self.schedule).due.remove(key);
        let lag = due.map(|d| now.saturating_duration_since(d)).unwrap_or_default();
        self.stats.queue_lag.push(lag);
    }

    /// Records that `key` completed a pass (or was skipped), for the first round.
    fn complete(&self, key: &str) {
        let mut schedule = lock(&self.schedule);
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

    fn check_first_round(&self, schedule: &mut MutexGuard<'_, Schedule>) {
        if !schedule.first_round_done && schedule.pending.as_ref().is_some_and(HashSet::is_empty) {
            schedule.first_round_done = true;
            schedule.completed = HashSet::new();
            self.stats.first_round_done_unix_ms.store(unix_ms(), Ordering::Relaxed);
            info!("Every Kyma known at start completed one pass");
            if self.settings.once {
                self.once_done.cancel();
            }
        }
    }

    /// The requeue delay after a successful pass (or skip): the period (none with `--once`).
    fn requeue_after_success(&self, key: &str) -> Option<Duration> {
        let mut schedule = lock(&self.schedule);
        schedule.failures.remove(key);
        if self.settings.once {
            return None;
        }
        // A change seen during the pass makes the Kyma due now (the queue reruns it).
        schedule.mark_due(key, Instant::now() + self.settings.period);
        Some(self.settings.period)
    }

    /// KLM's failure rate limiter: per Kyma, 5s doubled per failure in a row, capped at 30s
    /// (none with `--once`).
    fn requeue_after_failure(&self, key: &str) -> Option<Duration> {
        if self.settings.once {
            return None;
        }
        let mut schedule = lock(&self.schedule);
        let failures = schedule.failures.entry(key.to_owned()).or_default();
        *failures = failures.saturating_add(1);
        let exp = self.settings.backoff_min.saturating_mul(2u32.saturating_pow((*failures - 1).min(20)));
        let delay = exp.min(self.settings.backoff_max);
        schedule.mark_due(key, Instant::now() + delay);
        Some(delay)
    }

    /// Drops the scheduling state of a deleted Kyma.
    fn forget(&self, key: &str) {
        let mut schedule = lock(&self.schedule);
        schedule.failures.remove(key);
        schedule.due.remove(key);
    }

    /// The SKR client of `kyma`: built per pass, or once per access-Secret version with
    /// `--skr-keep-connections`.
    async fn skr_for(&self, kyma: &Kyma) -> Result<Skr, PassError> {
        let name = kyma.name_any();
        let namespace = kyma.namespace().unwrap_or_default();
        let secret = self.access_secret(&name, &namespace)?;
        let version = format!(
            "{}/{}",
            secret.metadata.uid.as_deref().unwrap_or_default(),
            secret.metadata.resource_version.as_deref().unwrap_or_default()
        );
        let key = format!("{namespace}/{name}");
        let limiter = (self.settings.skr_qps > 0.0).then(|| {
            let (qps, burst) = (self.settings.skr_qps, self.settings.skr_burst);
            lock(&self.limiters).entry(key.clone()).or_insert_with(|| Arc::new(TokenBucket::new(qps, burst))).clone()
        });
        let in_flight = usize::try_from(self.settings.skr_max_in_flight)
            .ok()
            .filter(|n| *n > 0)
            .map(|n| Semaphore::new(n.min(Semaphore::MAX_PERMITS)));
        let cached = lock(&self.skrs).get(&key).filter(|(v, _)| *v == version).map(|(_, c)| c.clone());
        let client = match cached {
            Some(client) => client,
            None => {
                let access = SkrAccess::from_secret(&secret, &self.settings.access).map_err(PassError::Access)?;
                let client = access.client().await.map_err(PassError::Access)?.kube().clone();
                if self.settings.skr_keep_connections {
                    lock(&self.skrs).insert(key, (version.clone(), client.clone()));
                }
                client
            }
        };
        Ok(Skr { client, limiter, in_flight })
    }

    /// KLM's lookup: the one Secret in the Kyma's namespace labelled with the Kyma's name.
    fn access_secret(&self, kyma: &str, namespace: &str) -> Result<Arc<Secret>, PassError> {
        let candidates: Vec<Arc<Secret>> = self
            .secrets
            .state()
            .into_iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.metadata.labels.as_ref().and_then(|l| l.get(KYMA_NAME_LABEL)).map(String::as_str) == Some(kyma)
            })
            .collect();
        let metas: Vec<PartialObjectMeta<Secret>> = candidates
            .iter()
            .map(|s| PartialObjectMeta {
                types: None,
                metadata: s.metadata.clone(),
                _phantom: std::marker::PhantomData,
            })
            .collect();
        let found = find_access_secret(&metas, kyma, namespace).map_err(PassError::Access)?;
        let index = metas.iter().position(|m| std::ptr::eq(m, found)).unwrap_or_default();
        candidates.get(index).cloned().ok_or(PassError::Access(catalogsync::error::Error::AccessSecretMissing {
            kyma: kyma.to_owned(),
            namespace: namespace.to_owned(),
        }))
    }

    fn stats(&self) -> BaselineStats {
        let kymas = lock(&self.kymas).as_ref().map_or(0, |s| s.len() as u64);
        let queued = lock(&self.queue).as_ref().map_or(0, |q| q.len() as u64);
        BaselineStats { queued, ..self.stats.snapshot(kymas) }
    }
}

/// One Kyma reconcile: the catalog part of KLM's `handleProcessingState`.
async fn reconcile(kyma: Arc<Kyma>, ctx: &Ctx) -> Result<(), PassError> {
    let key = key_of(&kyma);
    let started = Instant::now();
    ctx.start_pass(&key, started);
    if is_flag_on(kyma.labels().get(SKIP_RECONCILIATION_LABEL)) {
        ctx.stats.skipped_passes.fetch_add(1, Ordering::Relaxed);
        ctx.complete(&key);
        return Ok(());
    }
    ctx.stats.in_flight.fetch_add(1, Ordering::Relaxed);
    let result = pass(&kyma, ctx).await;
    ctx.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    ctx.stats.pass_seconds.push(started.elapsed());
    ctx.stats.passes.fetch_add(1, Ordering::Relaxed);
    ctx.complete(&key);
    match result {
        Ok(()) => {
            debug!(kyma = %key, seconds = started.elapsed().as_secs_f64(), "Synced catalog");
            Ok(())
        }
        Err(error) => {
            ctx.stats.failed_passes.fetch_add(1, Ordering::Relaxed);
            *lock(&ctx.stats.last_error) = Some(format!("{key}: {}", chain(&error)));
            debug!(kyma = %key, error = &error as &dyn std::error::Error, "Catalog sync failed");
            Err(error)
        }
    }
}

/// One pass: desired set, SKR client, then apply-and-prune per kind (MTs, then MRMs).
async fn pass(kyma: &Kyma, ctx: &Ctx) -> Result<(), PassError> {
    let snapshot = ctx.catalog.snapshot(&ctx.settings.sync_namespace);
    let labels = kyma.metadata.labels.clone().unwrap_or_default();
    let (desired, _warnings) = desired_set(&snapshot, &labels, &ctx.settings.restricted);
    let skr = ctx.skr_for(kyma).await?;
    let mut errors = Vec::new();
    for kind in CatalogKind::ALL {
        // KLM: an MT failure does not stop the MRM pass.
        if let Err(error) = sync_kind(ctx, &skr, kind, desired.of(kind)).await {
            errors.push(error);
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(PassError::Sync { errors }) }
}

/// Applies every desired object of `kind` concurrently; only if all succeeded, lists the
/// kind cluster-wide and deletes the catalog-sync-managed objects that are not desired.
async fn sync_kind(
    ctx: &Ctx,
    skr: &Skr,
    kind: CatalogKind,
    desired: &BTreeMap<String, DesiredObject>,
) -> Result<(), KindError> {
    let ar = kind.api_resource();
    let sync_ns = ctx.settings.sync_namespace.as_str();
    let api = Api::<DynamicObject>::namespaced_with(skr.client.clone(), sync_ns, &ar);
    let params = PatchParams::apply(SKR_FIELD_MANAGER).force();
    let applies = desired.values().map(|object| {
        let (api, params) = (&api, &params);
        ctx.call(skr, kind, Op::Apply, async move {
            api.patch(&object.name, params, &Patch::Apply(object.body.json())).await.map(drop)
        })
    });
    let failed: Vec<RequestError> = future::join_all(applies).await.into_iter().filter_map(Result::err).collect();
    if let Some(first) = failed.into_iter().next() {
        return Err(KindError::Apply { kind: kind.plural(), total: desired.len(), source: first });
    }

    let all = Api::<DynamicObject>::all_with(skr.client.clone(), &ar);
    let listed = match ctx.call(skr, kind, Op::List, async { all.list(&ListParams::default()).await }).await {
        Ok(list) => list.items,
        // KLM: a no-match (CRD absent) counts as success.
        Err(RequestError::Kube(kube::Error::Api(s))) if s.code == 404 => Vec::new(),
        Err(source) => return Err(KindError::List { kind: kind.plural(), source }),
    };
    let obsolete: Vec<(String, String)> = listed
        .iter()
        .filter(|o| is_ours(o))
        .filter_map(|o| {
            let ns = o.metadata.namespace.clone().unwrap_or_default();
            let name = o.metadata.name.clone()?;
            let desired_here = ns == sync_ns && desired.contains_key(&name);
            (!desired_here).then_some((ns, name))
        })
        .collect();
    let deletes = obsolete.iter().map(|(ns, name)| {
        let api = Api::<DynamicObject>::namespaced_with(skr.client.clone(), ns, &ar);
        ctx.call(skr, kind, Op::Delete, async move {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e),
            }
        })
    });
    let failed: Vec<RequestError> = future::join_all(deletes).await.into_iter().filter_map(Result::err).collect();
    let failed_count = failed.len();
    match failed.into_iter().next() {
        Some(source) => {
            Err(KindError::Delete { kind: kind.plural(), failed: failed_count, total: obsolete.len(), source })
        }
        None => Ok(()),
    }
}

impl Ctx {
    /// Performs one SKR request: rate limit, count, timeout.
    async fn call<T>(
        &self,
        skr: &Skr,
        kind: CatalogKind,
        op: Op,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, RequestError> {
        // Held until the response is read, as a connection is.
        let _permit = match &skr.in_flight {
            Some(gate) => gate.acquire().await.ok(),
            None => None,
        };
        if let Some(limiter) = &skr.limiter {
            limiter.acquire().await;
        }
        self.stats.count(kind, op);
        let result = match tokio::time::timeout(self.settings.request_timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(RequestError::Kube(error)),
            Err(_) => Err(RequestError::Timeout(self.settings.request_timeout)),
        };
        let not_found = matches!(&result, Err(RequestError::Kube(kube::Error::Api(s))) if s.code == 404);
        if result.is_err() && !(not_found && op == Op::List) {
            self.stats.count_error(kind, op);
        }
        result
    }
}

/// Whether an SKR object carries a `catalog-sync` managedFields entry (KLM's ownership test).
fn is_ours(obj: &DynamicObject) -> bool {
    obj.metadata.managed_fields.iter().flatten().any(|m| m.manager.as_deref() == Some(SKR_FIELD_MANAGER))
}

fn key_of(kyma: &Kyma) -> String {
    format!("{}/{}", kyma.namespace().unwrap_or_default(), kyma.name_any())
}

/// Drops Kymas deleted before their first pass from the first round, once the Kyma cache has
/// synced and fixed the set of Kymas known at start.
async fn track_first_round(ctx: Arc<Ctx>, kymas: Store<Kyma>, shutdown: CancellationToken) {
    if !until_ready(&kymas).await {
        return;
    }
    {
        let known: HashSet<String> = kymas.state().iter().map(|k| key_of(k)).collect();
        info!(kymas = known.len(), "Kyma cache synced");
        let mut schedule = lock(&ctx.schedule);
        let completed = std::mem::take(&mut schedule.completed);
        schedule.pending = Some(known.difference(&completed).cloned().collect());
        ctx.check_first_round(&mut schedule);
    }
    loop {
        tokio::select! {
            () = ctx.once_done.cancelled() => {
                shutdown.cancel();
                return;
            }
            () = tokio::time::sleep(FIRST_ROUND_POLL) => {}
        }
        let present: HashSet<String> = kymas.state().iter().map(|k| key_of(k)).collect();
        let mut schedule = lock(&ctx.schedule);
        if let Some(pending) = schedule.pending.as_mut() {
            pending.retain(|k| present.contains(k));
        }
        ctx.check_first_round(&mut schedule);
        if schedule.first_round_done && !ctx.settings.once {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Why one SKR request failed.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// The API call failed.
    #[error("request failed")]
    Kube(#[source] kube::Error),
    /// The API call did not finish in time.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
}

/// Why one kind's sync failed in a pass.
#[derive(Debug, thiserror::Error)]
enum KindError {
    /// At least one apply failed (the first cause is kept); no deletion ran.
    #[error("failed to apply {kind} ({total} desired)")]
    Apply {
        kind: &'static str,
        total: usize,
        #[source]
        source: RequestError,
    },
    /// Listing the kind failed.
    #[error("failed to list {kind}")]
    List {
        kind: &'static str,
        #[source]
        source: RequestError,
    },
    /// At least one deletion failed.
    #[error("failed to delete {failed} of {total} obsolete {kind}")]
    Delete {
        kind: &'static str,
        failed: usize,
        total: usize,
        #[source]
        source: RequestError,
    },
}

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
enum PassError {
    /// No SKR client (Secret missing, ambiguous or invalid).
    #[error("failed to get the SKR client")]
    Access(#[source] catalogsync::error::Error),
    /// One or both kinds failed.
    #[error("failed to sync the catalog: {}", errors.iter().map(|e| chain(e)).collect::<Vec<_>>().join("; "))]
    Sync { errors: Vec<KindError> },
}

/// An error with its whole source chain.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

// ---------------------------------------------------------------------------------------
// Stats
// ---------------------------------------------------------------------------------------

/// A kind of SKR request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
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
struct Samples(Mutex<VecDeque<f64>>);

impl Samples {
    fn push(&self, value: Duration) {
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
struct Stats {
    passes: AtomicU64,
    failed_passes: AtomicU64,
    skipped_passes: AtomicU64,
    requests: Counters,
    request_errors: Counters,
    pass_seconds: Samples,
    queue_lag: Samples,
    started_unix_ms: AtomicU64,
    /// 0 until the first round is done.
    first_round_done_unix_ms: AtomicU64,
    in_flight: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Stats {
    fn count(&self, kind: CatalogKind, op: Op) {
        self.requests.slot(kind, op).fetch_add(1, Ordering::Relaxed);
    }

    fn count_error(&self, kind: CatalogKind, op: Op) {
        self.request_errors.slot(kind, op).fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self, kymas: u64) -> BaselineStats {
        let requests = self.requests.to_map();
        let first_round = self.first_round_done_unix_ms.load(Ordering::Relaxed);
        BaselineStats {
            kymas,
            passes: self.passes.load(Ordering::Relaxed),
            failed_passes: self.failed_passes.load(Ordering::Relaxed),
            skipped_passes: self.skipped_passes.load(Ordering::Relaxed),
            requests_total: requests.values().sum(),
            requests,
            request_errors: self.request_errors.to_map(),
            pass_seconds: self.pass_seconds.percentiles(),
            queue_lag_seconds: self.queue_lag.percentiles(),
            started_unix_ms: self.started_unix_ms.load(Ordering::Relaxed),
            first_round_done_unix_ms: (first_round != 0).then_some(first_round),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            queued: 0,
            last_error: lock(&self.last_error).clone(),
        }
    }

    fn reset(&self) {
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

fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/stats", get(|State(ctx): State<Arc<Ctx>>| async move { axum::Json(ctx.stats()) }))
        .route(
            "/reset",
            post(|State(ctx): State<Arc<Ctx>>| async move {
                ctx.stats.reset();
                "reset\n"
            }),
        )
        .with_state(ctx)
}

// ---------------------------------------------------------------------------------------
// Plumbing
// ---------------------------------------------------------------------------------------

/// client-go's token bucket (`flowcontrol.NewTokenBucketRateLimiter`): `qps` refill, `burst`
/// capacity, waiting callers reserve a token ahead (as `rate.Limiter.Wait` does).
struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Tokens (negative: reserved ahead) and when they were last refilled.
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    fn new(qps: f64, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps, burst, state: Mutex::new((burst, Instant::now())) }
    }

    async fn acquire(&self) {
        let wait = {
            let mut state = lock(&self.state);
            let now = Instant::now();
            let (tokens, last) = *state;
            let refilled =
                (tokens + now.saturating_duration_since(last).as_secs_f64() * self.qps).min(self.burst) - 1.0;
            *state = (refilled, now);
            if refilled < 0.0 { Duration::from_secs_f64(-refilled / self.qps) } else { Duration::ZERO }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Locks a std mutex, ignoring poisoning (every critical section here leaves valid state).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn kcp_client(kubeconfig: Option<&std::path::Path>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).with_context(|| format!("failed to read {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .context("failed to load the KCP kubeconfig")?
        }
        None => kube::Config::infer().await.context("failed to infer the KCP config")?,
    };
    Client::try_from(config).context("failed to build the KCP client")
}

/// Cancels `token` on SIGTERM or Ctrl-C.
async fn on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(error) => {
                warn!(error = &error as &dyn std::error::Error, "Cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                token.cancel();
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    info!("Stopping");
    token.cancel();
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client=error,kube_runtime=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
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
