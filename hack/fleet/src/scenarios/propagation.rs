//! How fast catalogsync's replicas bring changes to every SKR: one MT update, a release, the
//! same update with slow SKRs, a new module, an update under faults, and cold starts.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};

use super::RunArgs;
use super::rows::{FaultRow, MemoryRow, NewModuleRow, PropagationRow, RolloutRow, Traffic};
use super::setup::{cpu_now, new_module_objects, probe_mt, release, replica_ids, start_replicas, traffic};
use crate::bench::{Bench, await_marks};
use crate::sim::{Faults, MARK_ANNOTATION};
use crate::stats::{Percentiles, unix_ms};

/// How long a propagation may take.
const PROPAGATION_TIMEOUT: Duration = Duration::from_secs(900);

/// One propagation measurement.
pub(super) struct Propagation {
    /// Seconds until each SKR held the change.
    pub latencies: Percentiles,
    /// The simulator's traffic meanwhile.
    pub traffic: Traffic,
    /// CPU seconds of all replicas, from the first write to the end of the window.
    pub replica_cpu: f64,
    /// CPU seconds of the simulator over the same time.
    pub sim_cpu: f64,
}

impl Propagation {
    /// Its table row: `run` changed `objects` objects.
    fn row(&self, run: String, objects: usize) -> PropagationRow {
        PropagationRow {
            run,
            latency: (&self.latencies).into(),
            traffic: self.traffic.clone(),
            objects: Some(objects),
            replica_cpu_seconds: Some(self.replica_cpu),
            sim_cpu_seconds: Some(self.sim_cpu),
        }
    }
}

/// Writes `mark` on the given objects and waits until every SKR holds `last` (the object its
/// sync writes last) with it.
pub(super) async fn propagate(
    bench: &Bench,
    objects: &[(&str, String)],
    mark: &str,
    timeout: Duration,
) -> Result<Propagation> {
    let sim = &bench.sim()?.admin;
    sim.reset().await?;
    let cpu0 = cpu_now(bench)?;
    let t0 = unix_ms();
    for (plural, name) in objects {
        bench.annotate(plural, name, MARK_ANNOTATION, mark).await?;
    }
    let (last_plural, last_name) = objects.last().context("nothing to propagate")?;
    let lat = await_marks(sim, last_plural, last_name, Some(mark), bench.kymas.len(), t0, timeout).await?;
    for (plural, name) in objects {
        let marks = sim.marks(plural, name, Some(mark)).await?;
        ensure!(marks.holding == bench.kymas.len(), "{plural}/{name}: only {} SKRs hold mark {mark}", marks.holding);
    }
    // Let in-flight syncs finish before reading the counters.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu1 = cpu_now(bench)?;
    Ok(Propagation {
        latencies: Percentiles::of(&lat),
        traffic: traffic(bench).await?,
        replica_cpu: cpu1.0 - cpu0.0,
        sim_cpu: cpu1.1 - cpu0.1,
    })
}

/// The propagation rows of one replica count, and the p99 of the single update at the normal
/// and at the slow SKR latency.
pub(super) struct PropRows {
    /// One MT update, a release, one MT update with slow SKRs.
    pub rows: Vec<PropagationRow>,
    /// The single update's p99, seconds.
    pub p99: f64,
    /// The same with slow SKRs.
    pub slow_p99: f64,
}

/// Propagation of one MT update and of a release with the running replicas, then the update
/// again with slow SKRs.
pub(super) async fn props(bench: &Bench, args: &RunArgs, replicas: usize, tag: &str) -> Result<PropRows> {
    let one = propagate(bench, &[("moduletemplates", probe_mt())], &format!("{tag}-one"), PROPAGATION_TIMEOUT).await?;
    let (rel_mts, rel_mrm) = release();
    let mut objs: Vec<(&str, String)> = rel_mts.into_iter().map(|m| ("moduletemplates", m)).collect();
    objs.push(("modulereleasemetas", rel_mrm));
    let rel = propagate(bench, &objs, &format!("{tag}-release"), PROPAGATION_TIMEOUT).await?;
    // The same update with slow SKRs, where the SKR side and not the CPU is the bottleneck.
    let sim = bench.sim()?.admin;
    sim.set_faults(&Faults { latency_ms: args.slow_latency_ms, ..Faults::default() }).await?;
    let slow = propagate(bench, &[("moduletemplates", probe_mt())], &format!("{tag}-slow"), PROPAGATION_TIMEOUT).await;
    sim.set_faults(&Faults { latency_ms: args.latency_ms, ..Faults::default() }).await?;
    let slow = slow?;
    Ok(PropRows {
        rows: vec![
            one.row(format!("catalogsync, {replicas} replica(s): 1 MT update"), 1),
            rel.row(format!("catalogsync, {replicas} replica(s): release 10 MTs + 1 MRM"), 11),
            slow.row(
                format!("catalogsync, {replicas} replica(s): 1 MT update, {} ms SKR latency", args.slow_latency_ms),
                1,
            ),
        ],
        p99: one.latencies.p99,
        slow_p99: slow.latencies.p99,
    })
}

/// One replica count started cold: its rollout row, propagation rows and memory row.
pub(super) struct ColdRun {
    /// Until every SKR synced.
    pub rollout: RolloutRow,
    /// The propagations.
    pub props: PropRows,
    /// Memory after them.
    pub memory: MemoryRow,
}

/// Starts `replicas` fresh replicas on the bench's Kymas, waits until every SKR synced, runs
/// the propagation measurements, samples memory and stops the replicas; `what` describes the
/// start in the rollout row, `tag` names the marks of its changes (unique per start).
pub(super) async fn cold_run(
    bench: &mut Bench,
    args: &RunArgs,
    replicas: usize,
    what: &str,
    tag: &str,
) -> Result<ColdRun> {
    eprintln!("propagation with {replicas} replica(s): cold start");
    let ids = replica_ids(replicas, 10 * replicas);
    bench.sim()?.admin.reset().await?;
    let cold = start_replicas(bench, &ids, &[], Duration::from_secs(900)).await?;
    let kymas = bench.kymas.len();
    // Until every SKR synced once: the cold syncs alone (resyncs come a period later).
    let traffic = Some(traffic(bench).await?);
    let rollout = RolloutRow { kymas, added: false, replicas, seconds: cold, what: what.into(), traffic };
    let props = props(bench, args, replicas, tag).await?;
    let memory = MemoryRow::new(kymas, replicas, &bench.replica_samples());
    bench.terminate_all().await?;
    Ok(ColdRun { rollout, props, memory })
}

/// A new module: its MT and MRM created in the KCP; time until every SKR holds the MRM (which
/// syncs write after the MTs).
pub(super) async fn new_module(bench: &Bench, timeout: Duration) -> Result<NewModuleRow> {
    eprintln!("new module");
    let sim = &bench.sim()?.admin;
    sim.reset().await?;
    let t0 = unix_ms();
    let (mt, mrm) = new_module_objects("fleet-new");
    bench.apply_catalog_object(&mt).await?;
    bench.apply_catalog_object(&mrm).await?;
    let lat = await_marks(sim, "modulereleasemetas", "fleet-new", None, bench.kymas.len(), t0, timeout).await?;
    Ok(NewModuleRow { run: "catalogsync, 3 replicas".into(), latency: (&Percentiles::of(&lat)).into() })
}

/// One MT update while the simulator fails 2% of requests and 1% of the SKRs are down; then
/// the down SKRs come back. The healthy SKRs must not wait for the broken ones.
pub(super) async fn fault_run(bench: &Bench, latency_ms: f64) -> Result<FaultRow> {
    eprintln!("faults");
    let n = bench.kymas.len();
    let down: Vec<String> = bench.kymas.iter().step_by(100).cloned().collect();
    let sim = bench.sim()?.admin;
    sim.set_faults(&Faults { latency_ms, error_rate: 0.02, down: down.clone(), ..Faults::default() }).await?;
    sim.reset().await?;
    let mt = probe_mt();
    let t0 = unix_ms();
    bench.annotate("moduletemplates", &mt, MARK_ANNOTATION, "faults").await?;
    let healthy =
        await_marks(&sim, "moduletemplates", &mt, Some("faults"), n - down.len(), t0, PROPAGATION_TIMEOUT).await?;
    let during = sim.stats(false).await?;
    sim.set_faults(&Faults { latency_ms, ..Faults::default() }).await?;
    let t1 = unix_ms();
    let all = await_marks(&sim, "moduletemplates", &mt, Some("faults"), n, t1, PROPAGATION_TIMEOUT).await?;
    Ok(FaultRow {
        skrs: n,
        down: down.len(),
        healthy: Percentiles::of(&healthy),
        injected_errors: during.injected_errors,
        recovered_seconds: all.iter().copied().fold(0.0, f64::max),
    })
}
