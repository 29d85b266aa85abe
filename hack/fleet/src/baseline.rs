//! The lifecycle-manager baseline: a faithful reproduction of KLM's in-loop catalog sync
//! (described under "The baseline" in `docs/performance.md`; how it differs from catalogsync:
//! section 7 of `docs/catalog-rules.md`), the reference catalogsync is measured against; with
//! `--reconcile full` also the rest of the Kyma reconcile's SKR and KCP requests, and with
//! `--reconcile without-catalog` those alone.
//!
//! ```text
//!  KCP reflectors (Kymas, MTs, MRMs, access Secrets): no KCP request per pass
//!        │
//!  controller-runtime's work queue over Kymas (FIFO, one pass per Kyma at a time),
//!  --workers concurrent reconciles
//!        │  once at start, then --period after each successful pass, 5s..30s backoff on error
//!        ▼
//!  pass(kyma) = [full, without-catalog: namespace, finalizer, CRDs, SKR Kyma (see `kyma`)]
//!        [catalog, full: desired_set(snapshot, labels)
//!        then per kind (MTs, then MRMs): SSA every desired object concurrently (catalog-sync,
//!        force); only if all succeeded: list the kind cluster-wide, delete catalog-sync-managed
//!        objects not desired]
//!        [full, without-catalog: KCP Kyma status, SKR Kyma metadata and status]
//! ```
//!
//! Unlike catalogsync, every pass re-applies the whole desired catalog (about M + R + 2 SKR
//! requests per Kyma per pass): that is the point of the baseline. The admin address serves
//! [`BaselineStats`] at `GET /stats` and zeroes the counters on `POST /reset`; read it with
//! [`BaselineAdmin`].
//!
//! The parts, one module each: [`args`] (flags and settings), [`kcp`] (the client and the
//! reflectors), [`controller`] (watch, [`queue`], workers, first round), [`schedule`] (when a
//! Kyma is due), [`pass`] (one pass and its catalog requests), [`kyma`] (the reconcile's
//! requests around the catalog), [`skr`] (the SKR client of a pass), [`error`], [`stats`] and
//! [`admin`] (the endpoint and its client). This file wires them.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context as _, Result};
use catalogsync::api::Kyma;
use catalogsync::app::signal_handler;
use catalogsync::kcp::until_ready;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::admin::BaselineAdmin;
pub use self::args::{BaselineArgs, Reconcile};
pub use self::stats::BaselineStats;

use self::args::Settings;
use self::kcp::{Catalog, kcp_client, watch_catalog, watch_crds, watch_secrets};
use self::pass::PassSettings;
use self::queue::WorkQueue;
use self::schedule::Scheduler;
use self::skr::SkrClients;
use self::stats::Stats;

mod admin;
mod args;
mod controller;
mod error;
mod kcp;
mod kyma;
mod pass;
mod queue;
mod schedule;
mod skr;
mod stats;

/// How long the final drain (in-flight passes, admin server) may take after a stop signal.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the baseline until SIGTERM or Ctrl-C (or, with `--once`, until the first round is
/// done), then prints the final stats as one JSON line to stdout.
///
/// # Errors
/// Fails when the KCP client cannot be built or the admin address cannot be bound.
pub async fn run(args: BaselineArgs) -> Result<()> {
    init_tracing();
    let Settings { kubeconfig, kcp_namespace, admin, workers, once, once_linger, pass, requeue, skr } =
        Settings::from(args);
    let kcp = kcp_client(kubeconfig.as_deref()).await?;
    // `signal` ends everything; `shutdown` (its child) stops the passes, also when `--once`
    // is done; the admin server outlives it by `--once-linger`.
    let signal = CancellationToken::new();
    let shutdown = signal.child_token();
    let admin_stop = CancellationToken::new();
    let signals = tokio::spawn(signal_handler(signal.clone()));

    let (catalog, catalog_task) = watch_catalog(&kcp, &kcp_namespace);
    let (secrets, secret_task) = watch_secrets(&kcp, &kcp_namespace);
    let (crds, crd_task) = watch_crds(&kcp);
    let ctx = Arc::new(Ctx {
        kcp: kcp.clone(),
        crds,
        pass,
        catalog,
        skrs: SkrClients::new(skr, secrets),
        schedule: Scheduler::new(requeue),
        stats: Stats::default(),
        kymas: Mutex::new(None),
        queue: Mutex::new(None),
    });

    let listener = tokio::net::TcpListener::bind(admin)
        .await
        .with_context(|| format!("failed to bind the admin address {admin}"))?;
    let bound = listener.local_addr()?;
    println!("{}", serde_json::json!({ "admin": bound.to_string() }));
    let admin_shutdown = admin_stop.clone();
    let app = admin::router(ctx.clone());
    let admin = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(async move { admin_shutdown.cancelled().await }).await
    });

    // Never pass against a partial catalog: an empty desired set prunes every copy.
    let synced = tokio::select! {
        ready = async { until_ready(&ctx.catalog.templates).await
            && until_ready(&ctx.catalog.release_metas).await
            && until_ready(ctx.skrs.secrets()).await
            && until_ready(&ctx.crds).await } => ready,
        () = shutdown.cancelled() => false,
    };
    if synced {
        info!(
            templates = ctx.catalog.templates.len(),
            release_metas = ctx.catalog.release_metas.len(),
            "KCP caches synced"
        );
        controller::run_controller(&kcp, &kcp_namespace, workers, ctx.clone(), shutdown.clone()).await;
    }
    shutdown.cancel();
    let stats = ctx.stats();
    println!("{}", serde_json::to_string(&stats)?);
    if once && !signal.is_cancelled() {
        tokio::select! {
            () = tokio::time::sleep(once_linger) => {}
            () = signal.cancelled() => {}
        }
    }
    admin_stop.cancel();
    catalog_task.abort();
    secret_task.abort();
    crd_task.abort();
    signals.abort();
    match tokio::time::timeout(SHUTDOWN_TIMEOUT, admin).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => warn!(error = &error as &dyn std::error::Error, "Admin server failed"),
        Ok(Err(error)) => warn!(error = &error as &dyn std::error::Error, "Admin server task failed"),
        Err(_) => warn!("Admin server did not stop in time"),
    }
    Ok(())
}

/// Everything a pass, the workers and the admin endpoint share.
struct Ctx {
    /// The KCP client (status and finalizer writes of `--reconcile full`).
    kcp: Client,
    /// The KCP's CRDs, which `--reconcile full` copies to the SKRs.
    crds: Store<CustomResourceDefinition>,
    /// What every pass reads.
    pass: PassSettings,
    /// The KCP catalog.
    catalog: Catalog,
    /// The SKR client of each pass.
    skrs: SkrClients,
    /// When each Kyma is due.
    schedule: Scheduler,
    /// The counters.
    stats: Stats,
    /// The Kyma cache, once the controller runs (its length is the stats' `kymas`).
    kymas: Mutex<Option<Store<Kyma>>>,
    /// The work queue, once the controller runs (its length is the stats' `queued`).
    queue: Mutex<Option<Arc<WorkQueue>>>,
}

impl Ctx {
    /// The stats the admin endpoint serves.
    fn stats(&self) -> BaselineStats {
        let kymas = lock(&self.kymas).as_ref().map_or(0, |s| s.len() as u64);
        let queued = lock(&self.queue).as_ref().map_or(0, |q| q.len() as u64);
        let first_round_done_unix_ms = self.schedule.first_round_done_unix_ms();
        BaselineStats { kymas, queued, first_round_done_unix_ms, ..self.stats.snapshot() }
    }
}

/// Locks a std mutex, ignoring poisoning (every critical section here leaves valid state).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The baseline's own subscriber: `RUST_LOG` or a quiet default, plain text, colour only on a
/// terminal (its stderr goes to a log file). catalogsync's `telemetry::init` takes the filter
/// from a flag instead.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube_client=error,kube_runtime=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
