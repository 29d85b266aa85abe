//! The smoke scenario: a small run of the whole path (CI runs it so the harness does not rot).

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};

use super::propagation::{new_module, propagate};
use super::report::{Report, markdown};
use super::rows::SmokeResult;
use super::setup::{probe_mt, replica_ids, start_replicas};
use crate::baseline::Reconcile;
use crate::bench::Bench;
use crate::sim::Faults;

/// 50 Kymas, 2 replicas, a short latency; the rollout, one propagation, a new module, and a
/// baseline round of the full Kyma reconcile. Fails when any step does.
pub(super) async fn smoke(dir: &Path, report: &mut Report) -> Result<()> {
    let n = 50;
    let replicas = 2;
    let mut bench = Bench::start(dir).await?;
    bench.install_catalog().await?;
    bench.start_sim(&Faults { latency_ms: 5.0, ..Faults::default() }).await?;
    bench.add_sim_kymas(n).await?;
    let timeout = Duration::from_secs(120);
    let rollout = start_replicas(&mut bench, &replica_ids(replicas, 0), &[], timeout).await?;
    let one = propagate(&bench, &[("moduletemplates", probe_mt())], "smoke-one", timeout).await?;
    ensure!(one.traffic.writes as usize == n, "expected {n} SKR writes for one MT update, saw {}", one.traffic.writes);
    let nm = new_module(&bench, timeout).await?;
    bench.terminate_all().await?;
    let baseline = bench.start_baseline(Duration::from_secs(300), 25, true, Reconcile::Full).await?;
    let stats = baseline.await_round(timeout).await;
    baseline.stop().await;
    let stats = stats?;
    ensure!(stats.passes as usize >= n, "baseline: {} passes for {n} Kymas", stats.passes);
    let status_writes = stats.kcp_requests.get("apply-status kymas").copied().unwrap_or_default();
    ensure!(status_writes as usize >= n, "baseline: {status_writes} KCP status writes for {n} Kymas");
    let result = SmokeResult {
        kymas: n,
        replicas,
        rollout_seconds: rollout,
        one_mt: one.latencies,
        one_mt_writes: one.traffic.writes,
        new_module: nm.latency,
        baseline_passes: stats.passes,
        baseline_requests: stats.requests_total,
        baseline_pass_p50_seconds: stats.pass_seconds.p50,
    };
    report.section("Smoke", &markdown(&SmokeResult::HEADER, result.checks()), &result);
    Ok(())
}
