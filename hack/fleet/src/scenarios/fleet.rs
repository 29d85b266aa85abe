//! The fleet-scale scenarios on one KCP and one simulator: the whole pipeline (`fleet`),
//! propagation alone (`propagation`) and the baseline alone (`baseline`), each ending in its
//! tables.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::RunArgs;
use super::baseline::baseline;
use super::propagation::{cold_run, fault_run, new_module, props};
use super::rebalance::rebalance;
use super::report::{Report, push_row};
use super::rows::{FaultRow, MemoryRow, NewModuleRow, PropagationRow, RebalanceRow, RolloutRow, ScalingRow, SteadyRow};
use super::setup::{SYNC_TIMEOUT, fill_skrs, replica_ids, start_bench, start_replicas};
use super::steady::steady;
use crate::bench::await_synced;

/// The resync period of the steady-state run, unless `--resync-secs` says otherwise: short,
/// so that 3 periods fit in a few minutes.
const STEADY_RESYNC: Duration = Duration::from_secs(60);

/// The p99 of the single update (normal, slow SKR latency) by replica count.
type P99s = BTreeMap<usize, (f64, f64)>;

/// The fleet-scale pipeline.
pub(super) async fn fleet(args: &RunArgs, dir: &Path, report: &mut Report) -> Result<()> {
    let n = args.kymas;
    let mut bench = start_bench(args, dir, 0).await?;

    // Memory as Kymas grow, with 3 replicas: first_kymas, then n.
    let mut memory_rows = Vec::new();
    let first = args.first_kymas.min(n);
    eprintln!("creating {first} Kymas");
    bench.add_sim_kymas(first).await?;
    let three = replica_ids(3, 0);
    eprintln!("starting 3 replicas on {first} Kymas");
    let rollout_first = start_replicas(&mut bench, &three, &[], SYNC_TIMEOUT).await?;
    push_row(&mut memory_rows, "memory", MemoryRow::new(first, 3, &bench.replica_samples()));
    let mut rollout_rows = vec![RolloutRow {
        kymas: first,
        added: false,
        replicas: 3,
        seconds: rollout_first,
        what: "new SKRs (empty catalogs)".into(),
        traffic: None,
    }];
    if n > first {
        eprintln!("growing to {n} Kymas");
        let before = bench.metric_sum("catalogsync_sync_runs_total", &["result=\"success\""]).await as usize;
        let t = Instant::now();
        bench.add_sim_kymas(n - first).await?;
        await_synced(&bench, before + (n - first), SYNC_TIMEOUT).await?;
        push_row(
            &mut rollout_rows,
            "rollout",
            RolloutRow {
                kymas: n - first,
                added: true,
                replicas: 3,
                seconds: t.elapsed().as_secs_f64(),
                what: "Kymas created while running (creation time included)".into(),
                traffic: None,
            },
        );
        push_row(&mut memory_rows, "memory", MemoryRow::new(n, 3, &bench.replica_samples()));
    }

    // Propagation with 3 replicas (they run already), then a new module, then rebalance.
    let mut prop_rows = Vec::new();
    let mut p99s = P99s::new();
    let p = props(&bench, args, 3, "r3").await?;
    for row in p.rows {
        push_row(&mut prop_rows, "prop", row);
    }
    p99s.insert(3, (p.p99, p.slow_p99));

    let mut new_module_rows = Vec::new();
    push_row(&mut new_module_rows, "new module", new_module(&bench, SYNC_TIMEOUT).await?);
    let mut fault_rows: Vec<FaultRow> = Vec::new();
    push_row(&mut fault_rows, "faults", fault_run(&bench, args.latency_ms).await?);
    let mut rebalance_rows: Vec<RebalanceRow> = Vec::new();
    for row in rebalance(&mut bench).await? {
        push_row(&mut rebalance_rows, "rebalance", row);
    }
    bench.terminate_all().await?;

    for &replicas in args.replicas.iter().filter(|&&r| r != 3) {
        let run = cold_run(&mut bench, args, replicas, "restart, SKRs full", &format!("r{replicas}")).await?;
        push_row(&mut rollout_rows, "rollout", run.rollout);
        for row in run.props.rows {
            push_row(&mut prop_rows, "prop", row);
        }
        p99s.insert(replicas, (run.props.p99, run.props.slow_p99));
    }

    // The baseline at n Kymas: the same three changes at once, in its periodic regime, until
    // its passes have brought them to every SKR.
    let baseline = if args.no_baseline { None } else { Some(baseline(args, &bench).await?) };

    // Steady state: 3 fresh replicas with a short resync period, 3 periods.
    let mut steady_rows: Vec<SteadyRow> = Vec::new();
    let resync = args.resync_secs.map_or(STEADY_RESYNC, Duration::from_secs);
    push_row(&mut steady_rows, "steady", steady(&mut bench, resync).await?);

    if !args.no_growth {
        eprintln!("3 fresh replicas on {n} Kymas (cold start), then growing to {} Kymas", 2 * n);
        start_replicas(&mut bench, &replica_ids(3, 200), &[], SYNC_TIMEOUT).await?;
        let before = bench.metric_sum("catalogsync_sync_runs_total", &["result=\"success\""]).await as usize;
        bench.add_sim_kymas(n).await?;
        await_synced(&bench, before + n, SYNC_TIMEOUT).await?;
        push_row(&mut memory_rows, "memory", MemoryRow::new(2 * n, 3, &bench.replica_samples()));
    }
    bench.terminate_all().await?;

    // Tables.
    report.table("Initial rollout and cold starts", &RolloutRow::HEADER, &rollout_rows);
    if let Some(b) = &baseline {
        push_row(&mut prop_rows, "prop", b.one.clone());
        push_row(&mut prop_rows, "prop", b.release.clone());
        new_module_rows.push(b.new_module.clone());
        steady_rows.push(b.steady.clone());
    }
    report.table("Propagation", &PropagationRow::HEADER, &prop_rows);
    scaling_table(report, args, &p99s);
    report.table("New module (MRM + MT created)", &NewModuleRow::HEADER, &new_module_rows);
    report.table("Rebalance", &RebalanceRow::HEADER, &rebalance_rows);
    report.table(
        "Faults: one MT update while 2% of SKR requests fail and 1% of SKRs are down (3 replicas)",
        &FaultRow::HEADER,
        &fault_rows,
    );
    report.table("Steady state", &SteadyRow::HEADER, &steady_rows);
    report.table("Memory", &MemoryRow::HEADER, &memory_rows);
    Ok(())
}

/// The baseline alone: `--kymas` Kymas, their SKRs filled by 3 replicas (then stopped), then
/// the baseline's window as in the fleet scenario.
pub(super) async fn baseline_alone(args: &RunArgs, dir: &Path, report: &mut Report) -> Result<()> {
    let mut bench = start_bench(args, dir, args.kymas).await?;
    fill_skrs(&mut bench).await?;
    let b = baseline(args, &bench).await?;
    report.table("Propagation", &PropagationRow::HEADER, &[b.one, b.release]);
    report.table("New module (MRM + MT created)", &NewModuleRow::HEADER, &[b.new_module]);
    report.table("Steady state", &SteadyRow::HEADER, &[b.steady]);
    Ok(())
}

/// The propagation scenario alone: `--kymas` Kymas, then for each replica count a cold start
/// (the first one onto empty SKRs) and the propagation runs.
pub(super) async fn propagation_only(args: &RunArgs, dir: &Path, report: &mut Report) -> Result<()> {
    let mut bench = start_bench(args, dir, args.kymas).await?;
    let (mut rollout_rows, mut prop_rows, mut memory_rows) = (Vec::new(), Vec::new(), Vec::new());
    let mut p99s = P99s::new();
    for (i, &replicas) in args.replicas.iter().enumerate() {
        let what = if i == 0 { "first start, SKRs empty" } else { "restart, SKRs full" };
        // Each start marks its changes anew: a replica count may be given twice.
        let run = cold_run(&mut bench, args, replicas, what, &format!("r{replicas}-{i}")).await?;
        push_row(&mut rollout_rows, "rollout", run.rollout);
        for row in run.props.rows {
            push_row(&mut prop_rows, "prop", row);
        }
        push_row(&mut memory_rows, "memory", run.memory);
        p99s.insert(replicas, (run.props.p99, run.props.slow_p99));
    }
    report.table("Cold starts", &RolloutRow::HEADER, &rollout_rows);
    report.table("Propagation", &PropagationRow::HEADER, &prop_rows);
    scaling_table(report, args, &p99s);
    report.table("Memory", &MemoryRow::HEADER, &memory_rows);
    Ok(())
}

/// Speed-ups of the single update's p99 between replica counts, at both SKR latencies.
fn scaling_table(report: &mut Report, args: &RunArgs, p99s: &P99s) {
    report.table(
        "Propagation scaling (one MT update, p99)",
        &ScalingRow::header(args.latency_ms, args.slow_latency_ms),
        &ScalingRow::all(p99s),
    );
}
