//! The load taken off the Kyma reconcile loop: lifecycle-manager's Kyma reconcile as the
//! baseline reproduces it, with and without its catalog part, side by side with catalogsync's
//! steady state over the same fleet.
//!
//! Each baseline variant is one `--once` round started with every Kyma due, as after a restart
//! of lifecycle-manager: the workers are busy from the first pass to the last, so the round's
//! passes per second are the Kymas per second that many workers manage.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use super::RunArgs;
use super::report::{Report, push_row};
use super::rows::{ReconcileRow, SteadyRow};
use super::setup::{fill_skrs, start_bench, traffic};
use super::steady::steady;
use crate::baseline::Reconcile;
use crate::bench::{BASELINE_USER, Bench, proc_sample};

/// catalogsync's resync period in the steady state unless `--resync-secs` says otherwise: its
/// default.
const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// `--kymas` Kymas whose SKRs 3 replicas fill; a first round of the reconcile without its
/// catalog part sets up what KLM's first reconcile of a Kyma sets up once (the SKR Kyma and
/// its CRD, the namespace's labels, the finalizer), so that the rounds measured next find
/// Kymas reconciled before; then the round without the catalog part and the full one; then
/// catalogsync's steady state.
///
/// The round without the catalog part comes first: once a full round has applied the
/// `ModuleCatalog` condition as `lifecycle-manager`, whose fields catalogsync's filling
/// replicas own too, an apply that leaves the condition out removes the fields only
/// `lifecycle-manager` owns, and the apiserver rejects the condition left without them.
pub(super) async fn reconcile(args: &RunArgs, dir: &Path, report: &mut Report) -> Result<()> {
    let mut bench = start_bench(args, dir, args.kymas).await?;
    fill_skrs(&mut bench).await?;
    eprintln!("baseline: a first round sets the SKRs and the Kymas up");
    round(args, &bench, Reconcile::WithoutCatalog).await?;
    let mut rows = Vec::new();
    for reconcile in [Reconcile::WithoutCatalog, Reconcile::Full] {
        push_row(&mut rows, "reconcile", round(args, &bench, reconcile).await?);
    }
    let resync = args.resync_secs.map_or(DEFAULT_RESYNC, Duration::from_secs);
    let steady_row = steady(&mut bench, resync).await?;
    push_row(&mut rows, "reconcile", ReconcileRow::from_steady(&steady_row));
    let title = format!("Kyma reconcile with and without its catalog part, and catalogsync ({} Kymas)", args.kymas);
    report.table(&title, &ReconcileRow::HEADER, &rows);
    report.table("Steady state", &SteadyRow::HEADER, &[steady_row]);
    Ok(())
}

/// One `--once` round of the baseline reproducing `reconcile`, measured from its workers'
/// start to the end of the round.
async fn round(args: &RunArgs, bench: &Bench, reconcile: Reconcile) -> Result<ReconcileRow> {
    let (workers, n) = (args.baseline_workers, bench.kymas.len());
    eprintln!("baseline round: --reconcile {}, {workers} workers, {n} Kymas", reconcile.as_str());
    let timeout = Duration::from_secs(args.baseline_window_secs);
    let sim = bench.sim()?;
    sim.admin.reset().await?;
    let period = Duration::from_secs(args.baseline_period_secs);
    let process = bench.start_baseline(period, workers, true, reconcile).await?;
    let measured = async {
        process.await_stats("its workers' start", timeout, |s| s.started_unix_ms > 0).await?;
        let (cpu0, sim0) = (proc_sample(process.pid())?, proc_sample(sim.pid())?);
        let stats = process.await_round(timeout).await?;
        let (cpu1, sim1) = (proc_sample(process.pid())?, proc_sample(sim.pid())?);
        anyhow::Ok((stats, cpu1.cpu_seconds - cpu0.cpu_seconds, sim1.cpu_seconds - sim0.cpu_seconds))
    }
    .await;
    process.stop().await;
    let (stats, cpu_seconds, sim_cpu_seconds) = measured?;
    let done = stats.first_round_done_unix_ms.unwrap_or_default();
    let seconds = done.saturating_sub(stats.started_unix_ms) as f64 / 1000.0;
    eprintln!(
        "baseline round: {} passes in {seconds:.1}s, {} failed{}",
        stats.passes,
        stats.failed_passes,
        stats.last_error.as_deref().map(|e| format!(" (last: {e})")).unwrap_or_default()
    );
    let (_, kcp_writes) = bench.kcp_writes(BASELINE_USER, stats.started_unix_ms, done);
    let failed = match stats.failed_passes {
        0 => String::new(),
        failed => format!(" ({failed} passes failed)"),
    };
    Ok(ReconcileRow {
        run: format!("baseline, --reconcile {}, {workers} workers{failed}", reconcile.as_str()),
        unit: "pass",
        units: stats.passes as f64,
        window_seconds: seconds,
        kymas_per_second: Some(stats.passes as f64 / seconds.max(0.001)),
        pass_seconds: Some(stats.pass_seconds),
        traffic: traffic(bench).await?,
        kcp_writes: kcp_writes as u64,
        cpu_seconds: vec![cpu_seconds],
        sim_cpu_seconds,
    })
}
