//! What the scenarios set up and wait for on the bench: the KCP with the catalog and the
//! simulator, replicas until every SKR synced or they are idle, the catalog objects the
//! changes are made to, and the counters read around a measurement.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kube::api::DynamicObject;
use testenv::fixtures::fleet::{MODULES, version};

use super::RunArgs;
use super::rows::Traffic;
use crate::bench::{Bench, await_synced, proc_sample};
use crate::sim::Faults;

/// How long the replicas may take until every SKR synced.
pub(super) const SYNC_TIMEOUT: Duration = Duration::from_secs(900);

/// The KCP with the catalog and the simulator with `--latency-ms`, then `kymas` Kymas.
pub(super) async fn start_bench(args: &RunArgs, dir: &Path, kymas: usize) -> Result<Bench> {
    eprintln!("starting the KCP and the simulator");
    let mut bench = Bench::start(dir).await?;
    bench.install_catalog().await?;
    bench.start_sim(&Faults { latency_ms: args.latency_ms, ..Faults::default() }).await?;
    if kymas > 0 {
        eprintln!("creating {kymas} Kymas");
        bench.add_sim_kymas(kymas).await?;
    }
    Ok(bench)
}

/// Starts replicas `ids`, waits until ready and until every Kyma had one successful sync;
/// returns the seconds that took.
pub(super) async fn start_replicas(
    bench: &mut Bench,
    ids: &[String],
    extra: &[String],
    timeout: Duration,
) -> Result<f64> {
    let started = Instant::now();
    for id in ids {
        bench.spawn_replica(id, extra)?;
    }
    bench.await_ready(Duration::from_secs(120)).await?;
    await_synced(bench, bench.kymas.len(), timeout).await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Fills every SKR with its catalog: 3 replicas until every Kyma synced once, then stopped,
/// so that a baseline started next finds SKRs that hold their catalogs.
pub(super) async fn fill_skrs(bench: &mut Bench) -> Result<()> {
    eprintln!("3 replicas fill the SKRs");
    start_replicas(bench, &replica_ids(3, 0), &[], SYNC_TIMEOUT).await?;
    bench.terminate_all().await
}

/// Replica identities `catalogsync-<offset>..`.
pub(super) fn replica_ids(n: usize, offset: usize) -> Vec<String> {
    (offset..offset + n).map(|i| format!("catalogsync-{i}")).collect()
}

/// Waits until no replica has a sync in flight or queued (two quiet samples in a row).
pub(super) async fn await_idle(bench: &Bench, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut quiet = 0;
    loop {
        let busy = bench.metric_sum("catalogsync_syncs_in_flight", &[]).await
            + bench.metric_sum("catalogsync_queue_depth", &[]).await;
        quiet = if busy == 0.0 { quiet + 1 } else { 0 };
        if quiet >= 4 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("replicas still busy after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The MT all Kymas of the bench get (module 1, `regular` channel).
pub(super) fn probe_mt() -> String {
    format!("{}-{}", MODULES[1], version(1, 0))
}

/// The 10 MTs and 1 MRM of a release: the `regular` MT of modules 1..=10 and the MRM of module 11.
pub(super) fn release() -> (Vec<String>, String) {
    let mts = (1..=10).map(|m| format!("{}-{}", MODULES[m], version(m, 0))).collect();
    (mts, MODULES[11].to_owned())
}

/// The MT and MRM of a new module `name` (one channel, `regular`).
pub(super) fn new_module_objects(name: &str) -> (DynamicObject, DynamicObject) {
    let mut mt = testenv::fixtures::fleet::module_template(1, 0);
    let version = "1.0.0";
    let mt_name = format!("{name}-{version}");
    mt.metadata.name = Some(mt_name);
    if let Some(labels) = mt.metadata.labels.as_mut() {
        labels.insert("operator.kyma-project.io/module-name".into(), name.into());
    }
    mt.data["spec"]["moduleName"] = serde_json::json!(name);
    mt.data["spec"]["version"] = serde_json::json!(version);
    let mut mrm = testenv::fixtures::fleet::module_release_meta(1);
    mrm.metadata.name = Some(name.into());
    mrm.metadata.labels = Some([("operator.kyma-project.io/module-name".to_owned(), name.to_owned())].into());
    mrm.data["spec"]["moduleName"] = serde_json::json!(name);
    mrm.data["spec"]["channels"] = serde_json::json!([{"channel": "regular", "version": version}]);
    (mt, mrm)
}

/// The simulator's traffic since its last reset, over the bench's SKRs.
pub(super) async fn traffic(bench: &Bench) -> Result<Traffic> {
    let stats = bench.sim()?.admin.stats(false).await?;
    Ok(Traffic::new(&stats, bench.kymas.len()))
}

/// CPU seconds so far of all replicas and of the simulator.
pub(super) fn cpu_now(bench: &Bench) -> Result<(f64, f64)> {
    let replicas = bench.replica_samples().values().map(|s| s.cpu_seconds).sum();
    Ok((replicas, proc_sample(bench.sim()?.pid())?.cpu_seconds))
}
