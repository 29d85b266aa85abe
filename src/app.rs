//! Wiring: builds the KCP client, caches, metrics, the controller, the catalog loop and the
//! HTTP server; runs and supervises them; owns the shutdown order.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Api, Client};
use kube_leader_election::{LeaseLock, LeaseLockParams};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use crate::api::{COORDINATOR_LEASE, Kyma};
use crate::config::{CatalogFlags, ConfigError, Mode, RunArgs, SkrAccessArgs};
use crate::http::{self, HttpState};
use crate::metrics::Metrics;
use crate::sharding::ShardView;
use crate::sharding::agent::{Agent, ShardsDebug};
use crate::sharding::coordinator::{Coordinator, CoordinatorView};
use crate::sharding::{Timing, membership};
use crate::skr::destination::Rule;
use crate::skr::kubeconfig::InsecureTls;
use crate::skr::{AccessSecrets, AccessSettings, SkrConnector};
use crate::sync::guard::ShrinkGuard;
use crate::sync::kymas::KymaRecords;
use crate::sync::label_keys::KymaLabelKeys;
use crate::sync::publisher::PublisherContext;
use crate::sync::publisher::run_catalog_loop;
use crate::sync::recall::ShardMemory;
use crate::sync::reconciler::{self, Context, Settings};
use crate::sync::state::CatalogState;
use crate::watches;

/// Capacity of the catalog requeue channel. The catalog loop awaits free space (it is our
/// own task, not a watch), so this only bounds memory: one entry per owned Kyma fits a
/// 10,000-Kyma fleet.
const REQUEUE_CAPACITY: usize = 16_384;

/// Why the controller stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The flags are inconsistent.
    #[error("invalid configuration")]
    Config(#[source] ConfigError),
    /// No KCP client could be built.
    #[error("failed to create the KCP client")]
    KcpClient(#[source] kube::Error),
    /// Metrics could not be registered.
    #[error("failed to register metrics")]
    Metrics(#[source] prometheus::Error),
    /// An essential task ended while the replica was not shutting down.
    #[error("essential task {0} ended unexpectedly")]
    TaskEnded(&'static str),
}

/// Runs the controller until SIGTERM or Ctrl-C.
///
/// # Errors
/// Returns an [`AppError`] when start-up fails or an essential task dies.
pub async fn run(args: RunArgs) -> Result<(), AppError> {
    args.validate().map_err(AppError::Config)?;
    // First, so a stop during start-up is a graceful one too.
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_handler(shutdown.clone()));
    let config = kube::Config::infer().await.map_err(|e| AppError::KcpClient(kube::Error::InferConfig(e)))?;
    let kcp_addrs = kcp_addresses(&config.cluster_url).await;
    let kcp = Client::try_from(config).map_err(AppError::KcpClient)?;
    run_with(kcp, kcp_addrs, args, shutdown).await
}

/// The addresses of the KCP apiserver, which no SKR kubeconfig may name
/// ([`crate::skr::access::kcp_addresses`]).
async fn kcp_addresses(url: &::http::Uri) -> Vec<SocketAddr> {
    crate::skr::access::kcp_addresses(url).await.unwrap_or_else(|| {
        warn!("Failed to resolve the KCP apiserver's address; only --skr-allowed-destinations keeps SKRs off it");
        Vec::new()
    })
}

/// Cancels `token` on SIGTERM or Ctrl-C (SIGINT), logging which.
pub async fn signal_handler(token: CancellationToken) {
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(error) => {
                warn!(error = &error as &dyn std::error::Error, "Failed to listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!(signal = "SIGINT", "Shutting down"),
        () = term => info!(signal = "SIGTERM", "Shutting down"),
    }
    token.cancel();
}

/// Runs the controller with a given KCP client until `shutdown` is cancelled.
///
/// # Errors
/// Returns an [`AppError`] when start-up fails or an essential task dies.
pub async fn run_with(
    kcp: Client,
    kcp_addrs: Vec<SocketAddr>,
    args: RunArgs,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let restricted_modules = args.catalog.restricted_set();
    // Every flag is taken apart here, once: a new flag that nothing reads does not compile.
    let RunArgs {
        mode,
        catalog: CatalogFlags { kcp_namespace: ns, sync_namespace, restricted_modules: _ },
        catalog_shrink_threshold,
        resync_period,
        resync_jitter,
        catalog_debounce,
        concurrency,
        listing_concurrency,
        skr_concurrency,
        full_list_concurrency,
        apply_concurrency,
        skr_request_timeout,
        sync_timeout,
        backoff_min,
        backoff_max,
        skr_access:
            SkrAccessArgs { skr_allowed_destinations, allow_insecure_skr_tls, skr_max_response_size, skr_sync_budget },
        shards,
        lease_namespace,
        lease_duration,
        renew_deadline,
        retry_period,
        drain_timeout,
        kcp_request_timeout,
        http_addr,
        identity,
        log_format: _,
        log_filter: _,
        shutdown_timeout,
    } = args;
    let metrics = Metrics::new().map_err(AppError::Metrics)?;
    match mode {
        Mode::Active => info!(mode = mode.as_str(), "Syncing the catalog to the SKRs"),
        Mode::Shadow => info!(
            mode = mode.as_str(),
            "Shadow mode: comparing the SKRs with the desired catalog; nothing is written to an SKR, no condition or Event to the KCP"
        ),
    }
    // This process's nonce: in its member Lease, the shard Leases it claims, and the user
    // agent of its SKR requests (so SKR audit logs tell two processes of one identity apart).
    let nonce = membership::new_nonce();
    let access = SkrAccessFlags {
        destinations: skr_allowed_destinations,
        allow_insecure_tls: allow_insecure_skr_tls,
        max_response: skr_max_response_size,
        sync_budget: skr_sync_budget,
    }
    .settings(&identity, &nonce, kcp_addrs, &metrics);
    let timing = Timing {
        lease_duration,
        renew_deadline,
        retry_period,
        drain_timeout,
        request_timeout: skr_request_timeout,
        kcp_request_timeout,
    };

    // KCP watches.
    let (catalog_stores, catalog_changes) = watches::catalog(&kcp, &ns, &sync_namespace);
    let (access_secrets, secret_kymas) = watches::access_secrets(&kcp, &ns);
    let secrets_ready = access_secrets.clone();
    let (lease_store, lease_changes) = watches::leases(&kcp, &lease_namespace);
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(CatalogState::default()));
    let (requeue_tx, requeue_rx) = mpsc::channel(REQUEUE_CAPACITY);
    let view = ShardView::new(shards);
    let kymas = Arc::new(KymaRecords::new(metrics.sync.clone(), metrics.skr.clone()));
    let (kyma_store, kyma_writer) = reflector::store();
    let label_keys = KymaLabelKeys::new();
    let ctx = Arc::new(Context {
        kcp: kcp.clone(),
        connector: SkrConnector::new(kcp.clone(), ns.clone(), access, kcp_request_timeout),
        settings: Settings {
            mode,
            sync_namespace,
            restricted_modules,
            resync_period,
            resync_jitter,
            skr_concurrency,
            skr_request_timeout,
            sync_timeout,
            backoff_min,
            backoff_max,
            kcp_request_timeout,
        },
        full_lists: tokio::sync::Semaphore::new(full_list_concurrency),
        applies: tokio::sync::Semaphore::new(apply_concurrency),
        listing: tokio::sync::Semaphore::new(listing_concurrency),
        metrics: metrics.clone(),
        catalog: catalog_rx.clone(),
        secrets: access_secrets,
        recorder: Recorder::new(
            kcp.clone(),
            Reporter { controller: "catalogsync".into(), instance: Some(identity.clone()) },
        ),
        shards: view.clone(),
        kymas: Arc::clone(&kymas),
        kyma_cache: kyma_store.clone(),
        label_keys: label_keys.clone(),
    });
    let deleted_ctx = Arc::clone(&ctx);
    let kyma_changes =
        watches::kymas(&kcp, &ns, kyma_writer, label_keys.clone(), move |kyma| deleted_ctx.forget_kyma(&kyma));

    // Secret changes requeue their Kyma through a channel, so the Secret cache fills (and
    // becomes ready) before the controller starts: no Kyma is judged against a partial cache.
    let (secret_tx, secret_rx) = mpsc::channel::<ObjectRef<Kyma>>(REQUEUE_CAPACITY);
    let secret_task = secret_kymas
        .for_each(move |kyma| {
            let tx = secret_tx.clone();
            // Awaiting space only delays this Secret watch, never a Kyma watch.
            async move { drop(tx.send(kyma).await) }
        })
        .instrument(info_span!("secrets"));
    // One Lease cache for the shard agent and the coordinator; each change wakes both.
    let (lease_changed_tx, lease_changed_rx) = watch::channel(());
    let lease_task = lease_changes
        .for_each(move |()| {
            lease_changed_tx.send_replace(());
            futures::future::ready(())
        })
        .instrument(info_span!("leases"));

    // Shard ownership.
    let lease_api: Api<Lease> = Api::namespaced(kcp.clone(), &lease_namespace);
    // Cancelled by the shard agent once it released its shards on shutdown; only then is the
    // member Lease marked as left.
    let shards_released = CancellationToken::new();
    let predecessors = membership::Predecessors::default();
    // A round of either loop takes a retry period plus a few bounded KCP requests.
    let max_silence = 3 * (retry_period + 3 * kcp_request_timeout);
    let membership_beat = crate::health::Heartbeat::new("member Lease", max_silence);
    let agent_beat = crate::health::Heartbeat::new("shard agent", max_silence);
    let membership_task = membership::Member {
        api: lease_api.clone(),
        identity: identity.clone(),
        nonce: nonce.clone(),
        view: view.clone(),
        timing,
        metrics: metrics.shard.clone(),
        heartbeat: membership_beat.clone(),
        leases: lease_store.clone(),
        predecessors: predecessors.clone(),
        shadow: mode == Mode::Shadow,
    }
    .run(shutdown.clone(), shards_released.clone())
    .instrument(info_span!("membership"));
    let (debug_tx, debug_rx) = watch::channel(ShardsDebug::default());
    crate::sharding::shard_gauges::register(metrics.registry(), debug_rx.clone()).map_err(AppError::Metrics)?;
    let (coordinator_tx, coordinator_rx) = watch::channel(CoordinatorView::default());
    let (registry, coordinator) = (metrics.registry(), coordinator_rx.clone());
    crate::sharding::coordinator_gauges::register(registry, coordinator, kyma_store.clone(), view.clone())
        .map_err(AppError::Metrics)?;
    crate::sync::kyma_gauges::register(metrics.registry(), Arc::clone(&kymas)).map_err(AppError::Metrics)?;
    let released = Arc::clone(&kymas);
    let agent_task = Agent {
        api: lease_api.clone(),
        identity: identity.clone(),
        nonce,
        predecessors,
        view: view.clone(),
        timing,
        leases: lease_store.clone(),
        kymas: kyma_store.clone(),
        requeue: requeue_tx.clone(),
        // Shadow mode writes nothing but its Leases: no shard records.
        work: Arc::new(crate::sync::handoff::Handoff {
            kymas: released,
            memory: (mode == Mode::Active).then(|| {
                ShardMemory::new(
                    Api::namespaced(kcp.clone(), &lease_namespace),
                    kcp_request_timeout,
                    Arc::clone(&kymas),
                )
            }),
        }),
        metrics: metrics.clone(),
        debug: debug_tx,
        coordinator: coordinator_rx,
        heartbeat: agent_beat.clone(),
    }
    .run(lease_changed_rx.clone(), shutdown.clone(), shards_released)
    .instrument(info_span!("shards"));
    let coordinator_task = Coordinator {
        lock: LeaseLock::new(
            kcp.clone(),
            &lease_namespace,
            LeaseLockParams {
                lease_name: COORDINATOR_LEASE.to_owned(),
                holder_id: identity,
                lease_ttl: lease_duration,
            },
        ),
        api: lease_api,
        leases: lease_store,
        view: view.clone(),
        timing,
        metrics: metrics.shard.clone(),
        published: coordinator_tx,
    }
    .run(lease_changed_rx, shutdown.clone())
    .instrument(info_span!("coordinator"));

    // The catalog loop and the controller.
    let catalog_task = run_catalog_loop(
        Box::pin(catalog_changes),
        catalog_stores,
        kyma_store.clone(),
        catalog_tx,
        requeue_tx,
        PublisherContext {
            view: view.clone(),
            kymas,
            metrics: metrics.clone(),
            restricted_modules: ctx.settings.restricted_modules.clone(),
            guard: Some(ShrinkGuard::new(catalog_shrink_threshold, kcp.clone(), &lease_namespace, kcp_request_timeout)),
            debounce: catalog_debounce,
            label_keys,
        },
    )
    .instrument(info_span!("catalog"));
    let controller_task = {
        let (catalog, secrets, kymas) = (catalog_rx.clone(), ctx.secrets.clone(), kyma_store.clone());
        let requeue = futures::stream::select(receiver_stream(requeue_rx), receiver_stream(secret_rx));
        let shutdown = shutdown.clone();
        async move {
            if start_gate(catalog, &secrets).await {
                reconciler::run(kyma_changes, kymas, requeue, concurrency, ctx, shutdown).await;
            }
        }
        .instrument(info_span!("controller"))
    };

    // Serving.
    let (ready_tx, ready_rx) = watch::channel(false);
    let readiness = report_ready(secrets_ready, kyma_store, catalog_rx, view.clone(), ready_tx);
    let http_state = HttpState {
        metrics,
        ready: ready_rx,
        shards: debug_rx,
        view: view.clone(),
        heartbeats: vec![membership_beat, agent_beat],
    };
    let http_shutdown = shutdown.clone();
    let http_task = async move {
        if let Err(error) = http::serve(http_addr, http_state, async move { http_shutdown.cancelled().await }).await {
            error!(error = &error as &dyn std::error::Error, %http_addr, "HTTP server failed");
        }
    }
    .instrument(info_span!("http"));

    let mut tasks = Tasks {
        controller: Task::spawn("controller", controller_task),
        shard_agent: Task::spawn("shard agent", agent_task),
        coordinator: Task::spawn("coordinator", coordinator_task),
        membership: Task::spawn("membership", membership_task),
        http: Task::spawn("http", http_task),
        background: vec![
            Task::spawn("catalog watch", catalog_task),
            Task::spawn("secret watch", secret_task),
            Task::spawn("lease watch", lease_task),
            Task::spawn("readiness", readiness),
        ],
    };
    // Every task is essential: if one ends while the replica is not shutting down, the
    // replica exits non-zero rather than staying Ready without doing its job.
    let ended = tokio::select! {
        biased;
        () = shutdown.cancelled() => None,
        task = tasks.first_to_end() => Some(task),
    };
    // A task that ended because shutdown began is not a failure.
    let failed = ended.filter(|_| !shutdown.is_cancelled());
    if let Some(task) = failed {
        error!(task, "Essential task ended unexpectedly; shutting down");
    }
    tasks.shut_down(&view, &shutdown, tokio::time::Instant::now() + shutdown_timeout).await;
    match failed {
        Some(task) => Err(AppError::TaskEnded(task)),
        None => {
            info!("Stopped");
            Ok(())
        }
    }
}

/// Whether the controller may start: never against an empty or partial catalog (that would
/// prune every SKR), nor before the Secret cache is complete (every Kyma would look
/// secret-less). False when either source ended first.
async fn start_gate(mut catalog: watch::Receiver<Arc<CatalogState>>, secrets: &AccessSecrets) -> bool {
    if catalog.changed().await.is_err() {
        return false;
    }
    secrets.until_ready().await;
    true
}

/// Reports the replica ready once its KCP caches are complete (the catalog loop publishes only
/// after its stores listed everything) and it holds a fresh member Lease. Never ends.
async fn report_ready(
    secrets: AccessSecrets,
    kymas: reflector::Store<Kyma>,
    mut published: watch::Receiver<Arc<CatalogState>>,
    view: ShardView,
    ready: watch::Sender<bool>,
) {
    secrets.until_ready().await;
    let ok = published.changed().await.is_ok() && crate::kcp::until_ready(&kymas).await;
    while view.is_fenced() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if ok {
        info!("KCP caches synced and member Lease held; ready");
        ready.send_replace(true);
    }
    std::future::pending::<()>().await;
}

/// One spawned task of the replica, by name; its handle is gone once it was seen to end.
struct Task {
    name: &'static str,
    handle: Option<JoinHandle<()>>,
}

impl Task {
    fn spawn(name: &'static str, task: impl Future<Output = ()> + Send + 'static) -> Self {
        Self { name, handle: Some(tokio::spawn(task)) }
    }

    /// Waits until the task ended or `deadline` passed; says so when it did not stop.
    async fn stop_by(&mut self, deadline: tokio::time::Instant) {
        let Some(handle) = self.handle.as_mut() else { return };
        if tokio::time::timeout_at(deadline, handle).await.is_ok() {
            self.handle = None;
        } else {
            warn!(task = self.name, "Task did not stop within the shutdown timeout");
        }
    }

    fn abort(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.abort();
        }
    }
}

/// The tasks of a running replica, by the stage of shutdown that stops them.
struct Tasks {
    /// Syncs Kymas, the only writer to SKRs: stopped first, and drained.
    controller: Task,
    /// Releases this replica's shard Leases once the controller stopped writing.
    shard_agent: Task,
    /// Steps down as coordinator.
    coordinator: Task,
    /// Deletes the member Lease once the shards are released.
    membership: Task,
    /// Serves metrics and probes until the Leases are settled.
    http: Task,
    /// KCP watches and the readiness report: aborted last.
    background: Vec<Task>,
}

impl Tasks {
    fn all(&mut self) -> impl Iterator<Item = &mut Task> {
        [&mut self.controller, &mut self.shard_agent, &mut self.coordinator, &mut self.membership, &mut self.http]
            .into_iter()
            .chain(self.background.iter_mut())
    }

    /// The name of the first task to end, whatever the reason; pending while none runs.
    async fn first_to_end(&mut self) -> &'static str {
        let mut running: Vec<&mut Task> = self.all().filter(|t| t.handle.is_some()).collect();
        if running.is_empty() {
            return std::future::pending().await;
        }
        let ended = {
            let waits = running.iter_mut().filter_map(|t| t.handle.as_mut());
            futures::future::select_all(waits).await.1
        };
        let task = &mut running[ended];
        task.handle = None;
        task.name
    }

    /// Shuts the replica down in stages, all within `deadline`: stop the writers, drain the
    /// controller's syncs, release the shard Leases (shard agent, then coordinator, then
    /// member Lease), stop serving, stop the watches.
    async fn shut_down(mut self, view: &ShardView, shutdown: &CancellationToken, deadline: tokio::time::Instant) {
        // Stop writers: no new SKR write starts, every loop hears the shutdown.
        view.stop();
        shutdown.cancel();
        // Drain: the controller finishes or abandons its in-flight syncs.
        self.controller.stop_by(deadline).await;
        // Release: shard Leases first, then the coordinator Lease, then the member Lease.
        self.shard_agent.stop_by(deadline).await;
        self.coordinator.stop_by(deadline).await;
        self.membership.stop_by(deadline).await;
        // Stop serving.
        self.http.stop_by(deadline).await;
        // Stop watches, and whatever did not stop in time.
        for task in self.all() {
            task.abort();
        }
    }
}

/// The SKR access flags.
struct SkrAccessFlags {
    destinations: Vec<Rule>,
    allow_insecure_tls: bool,
    max_response: usize,
    sync_budget: usize,
}

impl SkrAccessFlags {
    /// How SKR clients are built: with these rules, never to the KCP's own addresses, and with
    /// a user agent naming this replica and process.
    fn settings(self, identity: &str, nonce: &str, kcp_addrs: Vec<SocketAddr>, metrics: &Metrics) -> AccessSettings {
        let listed = self.destinations.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        let insecure_tls = if self.allow_insecure_tls {
            warn!(
                "--allow-insecure-skr-tls is on: SKR kubeconfigs may switch TLS verification off; never in production"
            );
            metrics.skr.insecure_tls_allowed();
            InsecureTls::Allow
        } else {
            InsecureTls::Refuse
        };
        info!(
            destinations = %listed,
            max_response_bytes = self.max_response,
            sync_budget_bytes = self.sync_budget,
            "SKR access rules"
        );
        AccessSettings::from_flags(
            format!("catalogsync/{} ({identity}) process/{nonce}", env!("CARGO_PKG_VERSION")),
            self.destinations,
            kcp_addrs,
            insecure_tls,
            self.max_response,
            self.sync_budget,
        )
    }
}

/// A stream over an mpsc receiver.
fn receiver_stream<T: Send + 'static>(rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}
