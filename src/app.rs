//! Wiring: builds the KCP client, caches, metrics, the controller, the catalog loop and the
//! HTTP server; runs and supervises them; owns the shutdown order.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use k8s_openapi::api::coordination::v1::Lease;
use kube_leader_election::{LeaseLock, LeaseLockParams};
use tokio::task::JoinHandle;

use crate::api::{COORDINATOR_LEASE, KYMA_NAME_LABEL, Kyma, LEASE_TYPE_LABEL};
use crate::config::RunArgs;
use crate::http::{self, HttpState};
use crate::metrics::Metrics;
use crate::sharding::ShardView;
use crate::sharding::agent::{Agent, ShardsDebug};
use crate::sharding::coordinator::Coordinator;
use crate::sharding::{Timing, membership};
use crate::skr::destination::Destinations;
use crate::skr::kubeconfig::InsecureTls;
use crate::skr::{AccessSecrets, AccessSettings, SkrPool};
use crate::sync::catalog::{CatalogState, run_catalog_loop, watch_catalog};
use crate::sync::guard::ShrinkGuard;
use crate::sync::reconciler::{self, Book, Context, Settings};

/// Capacity of the catalog requeue channel. The catalog loop awaits free space (it is our
/// own task, not a watch), so this only bounds memory: one entry per owned Kyma fits a
/// 10,000-Kyma fleet.
const REQUEUE_CAPACITY: usize = 16_384;

/// SKR connect timeout: a reachable apiserver answers a TCP and TLS handshake well within it.
const SKR_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why the controller stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The flags are inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
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
    let config = kube::Config::infer().await.map_err(|e| AppError::KcpClient(kube::Error::InferConfig(e)))?;
    let kcp_addrs = kcp_addresses(&config.cluster_url).await;
    let kcp = Client::try_from(config).map_err(AppError::KcpClient)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_handler(shutdown.clone()));
    run_with(kcp, kcp_addrs, args, shutdown).await
}

/// The addresses of the KCP apiserver, which no SKR kubeconfig may name: an access Secret
/// must not make a replica send requests, with an SKR's credentials, to its own KCP.
async fn kcp_addresses(url: &::http::Uri) -> Vec<SocketAddr> {
    let Some(host) = url.host() else { return Vec::new() };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(443);
    let lookup = tokio::net::lookup_host((host, port));
    match tokio::time::timeout(SKR_CONNECT_TIMEOUT, lookup).await {
        Ok(Ok(addrs)) => addrs.collect(),
        _ => {
            warn!("Failed to resolve the KCP apiserver's address; only --skr-allowed-destinations keeps SKRs off it");
            Vec::new()
        }
    }
}

/// Cancels `token` on SIGTERM or Ctrl-C.
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
    let metrics = Metrics::new().map_err(AppError::Metrics)?;
    let ns = args.kcp_namespace.clone();
    // This process's nonce: in its member Lease, the shard Leases it claims, and the user
    // agent of its SKR requests (so SKR audit logs tell two processes of one identity apart).
    let nonce = membership::new_nonce();
    let settings = Settings {
        sync_namespace: args.sync_namespace.clone(),
        restricted_modules: args.restricted_set(),
        resync_period: args.resync_period,
        resync_jitter: args.resync_jitter,
        skr_concurrency: args.skr_concurrency,
        skr_request_timeout: args.skr_request_timeout,
        sync_timeout: args.sync_timeout,
        backoff_min: args.backoff_min,
        backoff_max: args.backoff_max,
        kcp_request_timeout: args.kcp_request_timeout,
    };

    // KCP caches.
    let (catalog_stores, catalog_changes) = watch_catalog(&kcp, &ns);
    // `catalog_stores` is moved into the catalog loop, the only waiter on its readiness.
    let (secret_store, secret_writer) = reflector::store();
    let access_secrets = AccessSecrets::new(secret_store.clone());
    let (noted, forgotten) = (access_secrets.clone(), access_secrets.clone());
    let secret_stream = watcher(
        Api::<PartialObjectMeta<Secret>>::namespaced(kcp.clone(), &ns),
        watcher::Config::default().labels(KYMA_NAME_LABEL),
    )
    .default_backoff()
    .modify(move |s| {
        trim_secret(s);
        // Indexed before the cache holds it; see `AccessSecrets`.
        noted.note(s);
    })
    .reflect(secret_writer)
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(s) = event {
            forgotten.forget(s);
        }
    })
    .touched_objects();
    // Secret changes requeue their Kyma through a channel, so the Secret cache fills (and
    // becomes ready) before the controller starts: no Kyma is judged against a partial cache.
    let (secret_tx, secret_rx) = mpsc::channel::<ObjectRef<Kyma>>(REQUEUE_CAPACITY);
    let secret_ns = ns.clone();
    let secret_task = secret_stream
        .for_each(move |event| {
            let tx = secret_tx.clone();
            let ns = secret_ns.clone();
            async move {
                match event {
                    Ok(secret) => {
                        let kyma = secret.metadata.labels.as_ref().and_then(|l| l.get(KYMA_NAME_LABEL));
                        if let Some(kyma) = kyma {
                            // Awaiting space only delays this Secret watch, never a Kyma watch.
                            let _ = tx.send(ObjectRef::<Kyma>::new(kyma).within(&ns)).await;
                        }
                    }
                    Err(error) => warn!(error = &error as &dyn std::error::Error, "Secret watch failed; retrying"),
                }
            }
        })
        .instrument(info_span!("secrets"));
    let (kyma_store, kyma_writer) = reflector::store();

    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(CatalogState::default()));
    let (requeue_tx, requeue_rx) = mpsc::channel(REQUEUE_CAPACITY);
    let shards = ShardView::new(args.shards);
    let ctx = Arc::new(Context {
        kcp: kcp.clone(),
        pool: SkrPool::new(
            kcp.clone(),
            ns.clone(),
            access_settings(&args, &nonce, kcp_addrs, &metrics),
            args.kcp_request_timeout,
            metrics.skr.clone(),
        ),
        settings,
        full_lists: tokio::sync::Semaphore::new(args.full_list_concurrency),
        metrics: metrics.clone(),
        catalog: catalog_rx.clone(),
        secrets: access_secrets,
        recorder: Recorder::new(
            kcp.clone(),
            Reporter { controller: "catalogsync".into(), instance: Some(args.identity.clone()) },
        ),
        shards: shards.clone(),
        book: Book::default(),
    });
    let deleted_ctx = Arc::clone(&ctx);
    let kyma_stream = watcher(Api::<Kyma>::namespaced(kcp.clone(), &ns), watcher::Config::default())
        .default_backoff()
        .modify(reconciler::trim)
        .reflect(kyma_writer)
        .inspect_ok(move |event| {
            // Deletes never reach the controller (applied objects only); a Kyma deleted
            // without finalizers shows no deletionTimestamp first.
            if let watcher::Event::Delete(kyma) = event {
                deleted_ctx.forget_kyma(&ObjectRef::from_obj(kyma));
            }
        })
        .applied_objects()
        .predicate_filter(reconciler::trigger_hash, PredicateConfig::default());

    // Leases: one cache for member and shard Leases, shared by the agent and the coordinator.
    let lease_api: Api<Lease> = Api::namespaced(kcp.clone(), &args.lease_namespace);
    let (lease_store, lease_writer) = reflector::store();
    let (lease_changed_tx, lease_changed_rx) = watch::channel(());
    let lease_task = watcher(lease_api.clone(), watcher::Config::default().labels(LEASE_TYPE_LABEL))
        .default_backoff()
        .modify(|l: &mut Lease| l.metadata.managed_fields = None)
        .reflect(lease_writer)
        .for_each(move |event| {
            if let Err(error) = &event {
                warn!(error = error as &dyn std::error::Error, "Lease watch failed; retrying");
            }
            lease_changed_tx.send_replace(());
            futures::future::ready(())
        })
        .instrument(info_span!("leases"));
    let timing = Timing {
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
        drain_timeout: args.drain_timeout,
        request_timeout: args.skr_request_timeout,
        kcp_request_timeout: args.kcp_request_timeout,
    };
    // Cancelled by the shard agent once it released its shards on shutdown; only then is the
    // member Lease deleted.
    let shards_released = CancellationToken::new();
    let predecessors = membership::Predecessors::default();
    // A round of either loop takes a retry period plus a few bounded KCP requests.
    let max_silence = 3 * (args.retry_period + 3 * args.kcp_request_timeout);
    let membership_beat = crate::health::Heartbeat::new("member Lease", max_silence);
    let agent_beat = crate::health::Heartbeat::new("shard agent", max_silence);
    let membership_task = membership::Member {
        api: lease_api.clone(),
        identity: args.identity.clone(),
        nonce: nonce.clone(),
        view: shards.clone(),
        timing,
        metrics: metrics.shard.clone(),
        heartbeat: membership_beat.clone(),
        leases: lease_store.clone(),
        predecessors: predecessors.clone(),
    }
    .run(shutdown.clone(), shards_released.clone())
    .instrument(info_span!("membership"));
    let (debug_tx, debug_rx) = watch::channel(ShardsDebug::default());
    let release_ctx = Arc::clone(&ctx);
    let agent = Agent {
        api: lease_api.clone(),
        identity: args.identity.clone(),
        nonce,
        predecessors,
        view: shards.clone(),
        timing,
        leases: lease_store.clone(),
        kymas: kyma_store.clone(),
        requeue: requeue_tx.clone(),
        on_release: Arc::new(move |kymas| {
            for kyma in kymas {
                release_ctx.pool.evict(&kyma.name, "released");
            }
        }),
        metrics: metrics.shard.clone(),
        sync_metrics: metrics.sync.clone(),
        debug: debug_tx,
        heartbeat: agent_beat.clone(),
    };
    let agent_task =
        agent.run(lease_changed_rx.clone(), shutdown.clone(), shards_released).instrument(info_span!("shards"));
    let coordinator = Coordinator {
        lock: LeaseLock::new(
            kcp.clone(),
            &args.lease_namespace,
            LeaseLockParams {
                lease_name: COORDINATOR_LEASE.to_owned(),
                holder_id: args.identity.clone(),
                lease_ttl: args.lease_duration,
            },
        ),
        api: lease_api.clone(),
        leases: lease_store.clone(),
        kymas: kyma_store.clone(),
        view: shards.clone(),
        timing,
        metrics: metrics.shard.clone(),
    };
    let coordinator_task = coordinator.run(lease_changed_rx, shutdown.clone()).instrument(info_span!("coordinator"));

    let (ready_tx, ready_rx) = watch::channel(false);
    let http_shutdown = shutdown.clone();
    let http_addr = args.http_addr;
    let http_state = HttpState {
        metrics: metrics.clone(),
        ready: ready_rx,
        shards: debug_rx,
        view: shards.clone(),
        heartbeats: vec![membership_beat, agent_beat],
    };
    let http_task = async move {
        if let Err(error) = http::serve(http_addr, http_state, async move { http_shutdown.cancelled().await }).await {
            error!(error = &error as &dyn std::error::Error, %http_addr, "HTTP server failed");
        }
    }
    .instrument(info_span!("http"));

    let catalog_task = run_catalog_loop(
        Box::pin(catalog_changes),
        catalog_stores.with_shrink_guard(ShrinkGuard::new(
            args.catalog_shrink_threshold,
            kcp.clone(),
            &args.lease_namespace,
            args.kcp_request_timeout,
        )),
        kyma_store.clone(),
        catalog_tx,
        requeue_tx,
        Arc::clone(&ctx),
        args.catalog_debounce,
    )
    .instrument(info_span!("catalog"));

    let controller_ctx = Arc::clone(&ctx);
    let vanished_ctx = Arc::clone(&ctx);
    let controller_shutdown = shutdown.clone();
    let mut catalog_ready = catalog_rx.clone();
    let kyma_readiness = kyma_store.clone();
    let secrets_ready = secret_store.clone();
    let concurrency = args.concurrency;
    let controller_task = async move {
        // Never sync against an empty or partial catalog (that would prune every SKR), nor
        // before the Secret cache is complete (every Kyma would look secret-less).
        if catalog_ready.changed().await.is_err() || !until_ready(&secrets_ready).await {
            return;
        }
        let requeue = futures::stream::select(receiver_stream(requeue_rx), receiver_stream(secret_rx));
        Controller::for_stream(kyma_stream, kyma_store.clone())
            .reconcile_on(requeue)
            .with_config(controller::Config::default().concurrency(concurrency))
            .graceful_shutdown_on(async move { controller_shutdown.cancelled().await })
            .run(reconciler::reconcile, reconciler::error_policy, controller_ctx)
            .for_each(|res| {
                if let Err(controller::Error::ObjectNotFound(obj)) = &res {
                    tracing::debug!(kyma = %obj, "Kyma vanished before its reconcile");
                    // A requeue (catalog or Secret change, backoff, resync) of a deleted Kyma.
                    let ns = obj.namespace.as_deref().unwrap_or_default();
                    vanished_ctx.forget_kyma(&ObjectRef::new(&obj.name).within(ns));
                }
                futures::future::ready(())
            })
            .await;
    }
    .instrument(info_span!("controller"));

    let readiness_view = shards.clone();
    let readiness = async move {
        let (secrets, kymas) = (secret_store, kyma_readiness);
        let mut published = catalog_rx;
        // The catalog loop publishes only after its stores listed everything.
        let ok = until_ready(&secrets).await && published.changed().await.is_ok() && until_ready(&kymas).await;
        // Ready also means holding a fresh member Lease.
        while readiness_view.is_fenced() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        if ok {
            info!("KCP caches synced and member Lease held; ready");
            ready_tx.send_replace(true);
        }
        std::future::pending::<()>().await;
    };

    // Every task is essential: if one ends while the replica is not shutting down, the
    // replica exits non-zero rather than staying Ready without doing its job.
    let ordered = vec![
        ("controller", tokio::spawn(controller_task)),
        ("shard agent", tokio::spawn(agent_task)),
        ("coordinator", tokio::spawn(coordinator_task)),
        ("membership", tokio::spawn(membership_task)),
        ("http", tokio::spawn(http_task)),
    ];
    let background = vec![
        ("catalog watch", tokio::spawn(catalog_task)),
        ("secret watch", tokio::spawn(secret_task)),
        ("lease watch", tokio::spawn(lease_task)),
        ("readiness", tokio::spawn(readiness)),
    ];
    let mut all: Vec<(&'static str, JoinHandle<()>)> = ordered.into_iter().chain(background).collect();
    let ended = tokio::select! {
        biased;
        () = shutdown.cancelled() => None,
        (_, index, _) = futures::future::select_all(all.iter_mut().map(|(_, h)| h)) => Some(index),
    };
    // A task that ended because shutdown began is not a failure.
    let failed = ended.map(|index| all.remove(index).0).filter(|_| !shutdown.is_cancelled());
    if let Some(task) = failed {
        error!(task, "Essential task ended unexpectedly; shutting down");
    }

    // Shutdown, in order: stop SKR writes, let the controller finish or abandon in-flight
    // syncs, release shard Leases, delete the member Lease, step down, stop serving.
    shards.stop();
    shutdown.cancel();
    let deadline = tokio::time::Instant::now() + args.shutdown_timeout;
    for (task, handle) in all.iter_mut().take_while(|(t, _)| !matches!(*t, "catalog watch")) {
        if tokio::time::timeout_at(deadline, handle).await.is_err() {
            warn!(task = *task, "Task did not stop within the shutdown timeout");
        }
    }
    for (_, handle) in &all {
        handle.abort();
    }
    match failed {
        Some(task) => Err(AppError::TaskEnded(task)),
        None => {
            info!("Stopped");
            Ok(())
        }
    }
}

/// Keeps of an access Secret's metadata only what is read: name, namespace, labels, uid and
/// resourceVersion. Annotations go: after a client-side `kubectl apply` they hold the whole
/// Secret, kubeconfig included (`last-applied-configuration`).
fn trim_secret(secret: &mut PartialObjectMeta<Secret>) {
    let meta = std::mem::take(&mut secret.metadata);
    secret.metadata = kube::api::ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        labels: meta.labels,
        uid: meta.uid,
        resource_version: meta.resource_version,
        ..kube::api::ObjectMeta::default()
    };
}

/// How SKR clients are built, from the flags.
fn access_settings(args: &RunArgs, nonce: &str, kcp_addrs: Vec<SocketAddr>, metrics: &Metrics) -> AccessSettings {
    let destinations = Destinations::new(args.skr_allowed_destinations.clone()).deny(kcp_addrs);
    let insecure_tls = if args.allow_insecure_skr_tls {
        warn!("--allow-insecure-skr-tls is on: SKR kubeconfigs may switch TLS verification off; never in production");
        metrics.skr.insecure_tls_allowed.set(1);
        InsecureTls::Allow
    } else {
        InsecureTls::Refuse
    };
    info!(
        destinations = %args.skr_allowed_destinations.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        max_response_bytes = args.skr_max_response_size,
        "SKR access rules"
    );
    AccessSettings {
        user_agent: format!("catalogsync/{} ({}) process/{nonce}", env!("CARGO_PKG_VERSION"), args.identity),
        connect: SKR_CONNECT_TIMEOUT,
        destinations: Arc::new(destinations),
        insecure_tls,
        max_response: args.skr_max_response_size,
    }
}

/// Waits until a store finished its first list. A store's readiness signal wakes only its
/// most recent waiter, and the controller waits on the same stores, so poll it again
/// periodically rather than sleeping on it. Returns false when the store's writer was dropped
/// first.
pub async fn until_ready<K>(store: &reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(std::time::Duration::from_millis(200), store.wait_until_ready()).await {
            Ok(result) => return result.is_ok(),
            Err(_) => continue,
        }
    }
}

/// A stream over an mpsc receiver.
fn receiver_stream<T: Send + 'static>(rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_cache_keeps_no_annotations() {
        let mut secret: PartialObjectMeta<Secret> = PartialObjectMeta {
            types: None,
            metadata: kube::api::ObjectMeta {
                name: Some("s".into()),
                namespace: Some("kcp-system".into()),
                labels: Some([(KYMA_NAME_LABEL.to_owned(), "k".to_owned())].into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                annotations: Some(
                    [("kubectl.kubernetes.io/last-applied-configuration".to_owned(), "{\"data\":{}}".to_owned())]
                        .into(),
                ),
                managed_fields: Some(vec![Default::default()]),
                ..Default::default()
            },
            _phantom: std::marker::PhantomData,
        };
        trim_secret(&mut secret);
        let m = &secret.metadata;
        assert_eq!((m.name.as_deref(), m.namespace.as_deref()), (Some("s"), Some("kcp-system")));
        assert_eq!((m.uid.as_deref(), m.resource_version.as_deref()), (Some("u"), Some("7")));
        assert!(m.labels.is_some());
        assert!(m.annotations.is_none() && m.managed_fields.is_none());
    }
}
