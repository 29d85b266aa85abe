//! The lifecycle-manager baseline on the bench: started in its periodic regime, then the same
//! three changes catalogsync's runs make, at once, watched until every SKR holds them or the
//! window runs out.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};

use super::RunArgs;
use super::rows::{NewModuleRow, PropagationRow, SteadyRow};
use super::setup::{new_module_objects, probe_mt, release, traffic};
use crate::baseline::Reconcile;
use crate::bench::{BASELINE_USER, Baseline, Bench, Reached, marks_until, proc_sample, reset_peak_rss};
use crate::sim::MARK_ANNOTATION;
use crate::stats::unix_ms;

/// How long after one period the baseline may still be listing the Kymas.
const LIST_GRACE: Duration = Duration::from_secs(120);

/// The baseline's rows in the fleet tables.
pub(super) struct BaselineRows {
    /// The single MT update.
    pub one: PropagationRow,
    /// The release.
    pub release: PropagationRow,
    /// The new module.
    pub new_module: NewModuleRow,
    /// The window as a steady state.
    pub steady: SteadyRow,
}

/// The baseline at the bench's Kymas. Once every Kyma had a pass, or one period after its
/// start if the round takes longer, the one-MT update, the release and a new module are made
/// at once; then until every SKR holds all three, or `--baseline-window-secs` ran out (the
/// rows then show the SKRs still without them as `> window`).
pub(super) async fn baseline(args: &RunArgs, bench: &Bench) -> Result<BaselineRows> {
    eprintln!("baseline: {} workers, period {}s", args.baseline_workers, args.baseline_period_secs);
    let n = bench.kymas.len();
    let period = Duration::from_secs(args.baseline_period_secs);
    let process = bench.start_baseline(period, args.baseline_workers, false, Reconcile::Catalog).await?;
    await_periodic(&process, n, period).await?;
    let sim = &bench.sim()?.admin;
    sim.reset().await?;
    process.admin.reset().await?;
    let cpu0 = proc_sample(process.pid())?;
    reset_peak_rss(process.pid())?;
    let sim_pid = bench.sim()?.pid();
    let sim0 = proc_sample(sim_pid)?;
    let t0 = unix_ms();
    let started = Instant::now();
    let until = started + Duration::from_secs(args.baseline_window_secs);
    // The three changes at once. The release's MTs include the probe MT: it keeps the
    // one-MT mark (one object carries one mark), the other 10 objects get the release's.
    let mt = probe_mt();
    let (rel_mts, rel_mrm) = release();
    for m in rel_mts.iter().filter(|m| **m != mt) {
        bench.annotate("moduletemplates", m, MARK_ANNOTATION, "baseline-release").await?;
    }
    bench.annotate("moduletemplates", &mt, MARK_ANNOTATION, "baseline-one").await?;
    bench.annotate("modulereleasemetas", &rel_mrm, MARK_ANNOTATION, "baseline-release").await?;
    let (nmt, nmrm) = new_module_objects("fleet-newer");
    bench.apply_catalog_object(&nmt).await?;
    bench.apply_catalog_object(&nmrm).await?;
    let one = marks_until(sim, "moduletemplates", &mt, Some("baseline-one"), n, t0, until).await?;
    let rel = marks_until(sim, "modulereleasemetas", &rel_mrm, Some("baseline-release"), n, t0, until).await?;
    let nm = marks_until(sim, "modulereleasemetas", "fleet-newer", None, n, t0, until).await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu1 = proc_sample(process.pid())?;
    let sim1 = proc_sample(sim_pid)?;
    let traffic = traffic(bench).await?;
    let stats = process.admin.stats().await?;
    let t1 = unix_ms();
    let (_, kcp_writes) = bench.kcp_writes(BASELINE_USER, t0, t1);
    process.stop().await;
    // The window covers about one pass per Kyma (one round).
    let periods = stats.passes.max(1) as f64 / n as f64;
    eprintln!(
        "baseline: window {wall:.0}s, {} passes, pass p50 {:.2}s, queue lag p50 {:.0}s p99 {:.0}s",
        stats.passes, stats.pass_seconds.p50, stats.queue_lag_seconds.p50, stats.queue_lag_seconds.p99
    );
    let row = |run: String, reached: &Reached| PropagationRow {
        run,
        latency: reached.spread(),
        traffic: traffic.clone(),
        objects: None,
        replica_cpu_seconds: None,
        sim_cpu_seconds: None,
    };
    Ok(BaselineRows {
        one: row(format!("baseline ({}s period): 1 MT update (all three changes at once)", period.as_secs()), &one),
        release: row("baseline: release 10 MTs + 1 MRM (same window)".into(), &rel),
        new_module: NewModuleRow { run: format!("baseline ({}s period)", period.as_secs()), latency: nm.spread() },
        steady: SteadyRow {
            run: format!("baseline, {} workers, period {}s", args.baseline_workers, period.as_secs()),
            periods,
            traffic: traffic.clone(),
            kcp_writes: kcp_writes as u64,
            kcp_lease_writes: 0,
            cpu_seconds_per_period: vec![(cpu1.cpu_seconds - cpu0.cpu_seconds) / periods],
            start_peak_rss_mib: vec![cpu0.peak_rss_mib],
            peak_rss_mib: vec![cpu1.peak_rss_mib],
            sim_cpu_seconds_per_period: (sim1.cpu_seconds - sim0.cpu_seconds) / periods,
        },
    })
}

/// Waits for the baseline's periodic regime: every Kyma had a pass, or one period passed
/// since its start with every Kyma listed. From then on each Kyma is requeued or still waits
/// in FIFO order, and takes the changes at its next pass.
async fn await_periodic(process: &Baseline, n: usize, period: Duration) -> Result<()> {
    let started = Instant::now();
    let mut last_report = Instant::now();
    let first_round = loop {
        let s = process.admin.stats().await?;
        if s.first_round_done_unix_ms.is_some() || (s.kymas as usize >= n && started.elapsed() >= period) {
            break s;
        }
        ensure!(
            started.elapsed() < period + LIST_GRACE,
            "the baseline did not list the {n} Kymas within {}s of its start ({} in its cache)",
            (period + LIST_GRACE).as_secs(),
            s.kymas
        );
        if last_report.elapsed() >= Duration::from_secs(30) {
            eprintln!("  baseline: {} passes, {} queued, {} in flight", s.passes, s.queued, s.in_flight);
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "baseline: changes at {:.0}s, after {} passes ({} queued; first round {})",
        started.elapsed().as_secs_f64(),
        first_round.passes,
        first_round.queued,
        if first_round.first_round_done_unix_ms.is_some() { "done" } else { "not done" }
    );
    Ok(())
}
