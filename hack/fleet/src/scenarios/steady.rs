//! Steady state: fresh replicas resyncing an unchanged catalog, measured over a few resync
//! periods once their first warm resyncs passed.

use std::time::Duration;

use anyhow::Result;

use super::rows::SteadyRow;
use super::setup::{replica_ids, start_replicas, traffic};
use crate::bench::{Bench, proc_sample};
use crate::stats::unix_ms;

/// Resync periods measured.
const PERIODS: u32 = 3;

/// 3 fresh replicas with `--resync-period <period>` (given explicitly, whatever the default),
/// measured over [`PERIODS`] periods, then stopped.
pub(super) async fn steady(bench: &mut Bench, period: Duration) -> Result<SteadyRow> {
    let secs = period.as_secs();
    eprintln!("steady state: 3 replicas, resync {secs}s, {PERIODS} periods");
    let extra = vec!["--resync-period".to_owned(), format!("{secs}s")];
    let ids = replica_ids(3, 100);
    start_replicas(bench, &ids, &extra, Duration::from_secs(900)).await?;
    // Every SKR has had its cold sync; one more period lets the first warm resyncs pass, so
    // the window holds warm resyncs only.
    tokio::time::sleep(period).await;
    let sim = bench.sim()?.admin;
    sim.reset().await?;
    let sim_pid = bench.sim()?.pid();
    let sim0 = proc_sample(sim_pid)?;
    let cpu0 = bench.replica_samples();
    // The start's peak (cold or recalled syncs of every SKR) is reported apart from the
    // window's.
    bench.reset_replica_peaks()?;
    let t0 = unix_ms();
    tokio::time::sleep(period * PERIODS).await;
    let t1 = unix_ms();
    let cpu1 = bench.replica_samples();
    let sim1 = proc_sample(sim_pid)?;
    let traffic = traffic(bench).await?;
    let (lease_writes, other_writes) = bench.kcp_writes(testenv::CATALOGSYNC_USER, t0, t1);
    let periods = f64::from(PERIODS);
    let cpu = cpu1
        .iter()
        .map(|(id, s)| (s.cpu_seconds - cpu0.get(id).map(|c| c.cpu_seconds).unwrap_or_default()) / periods)
        .collect();
    let start_peaks = cpu0.values().map(|s| s.peak_rss_mib).collect();
    let peaks = cpu1.values().map(|s| s.peak_rss_mib).collect();
    // Replicas that resync every few seconds never have "no sync in flight", which the
    // following phases wait for.
    bench.terminate_all().await?;
    Ok(SteadyRow {
        run: format!("catalogsync, 3 replicas, resync {secs}s"),
        periods,
        traffic,
        kcp_writes: other_writes as u64,
        kcp_lease_writes: lease_writes as u64,
        cpu_seconds_per_period: cpu,
        start_peak_rss_mib: start_peaks,
        peak_rss_mib: peaks,
        sim_cpu_seconds_per_period: (sim1.cpu_seconds - sim0.cpu_seconds) / periods,
    })
}
