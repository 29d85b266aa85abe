//! The calibration: the same requests against real SKR apiservers and against the
//! simulator, compared by count per phase, by response size and by per-request latency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use catalogsync::catalog::CatalogKind;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};

use super::RunArgs;
use super::report::Report;
use super::rows::{ProbeLatencyRow, RequestCountRow, ResponseSizeRow};
use super::setup::{await_idle, probe_mt, replica_ids, start_replicas};
use crate::bench::{Bench, SYNC_NS, await_marks, kyma_name};
use crate::sim::{Faults, MARK_ANNOTATION, SimStats};
use crate::stats::{Percentiles, unix_ms};

/// Calibration: one replica syncs `--calibrate-skrs` real SKR apiservers and as many simulated
/// SKRs (no injected latency) at the same time, Kyma for Kyma with the same labels. Request
/// counts by verb per phase (cold start, two resyncs, one MT update) from the real SKRs' audit
/// logs and from the simulator's counters; then per-request latency of each request kind the
/// sync makes, measured by a probe client against a real SKR and a simulated one.
pub(super) async fn calibrate(args: &RunArgs, dir: &Path, report: &mut Report) -> Result<()> {
    let k = args.calibrate_skrs;
    let mut bench = Bench::start(dir).await?;
    bench.install_catalog().await?;
    bench.start_sim(&Faults::default()).await?;
    eprintln!("starting {k} SKR apiservers");
    let mut skrs = Vec::new();
    for chunk in (0..k).collect::<Vec<_>>().chunks(4) {
        let started = futures::future::try_join_all(chunk.iter().map(|i| bench.start_real_skr(*i))).await?;
        skrs.extend(started);
    }
    let mut planned = Vec::new();
    for (i, skr) in skrs.iter().enumerate() {
        let name = format!("real-{}", kyma_name(i));
        planned.push((i, name, skr.try_kubeconfig_yaml(&format!("skr-admin-{i}"), &["system:masters"])?));
    }
    for i in 0..k {
        let name = format!("sim-{}", kyma_name(i));
        let kc = bench.sim_kubeconfig(&name)?;
        planned.push((i, name, kc));
    }
    bench.create_kymas(planned).await?;
    let resync = 20;
    let extra = vec!["--resync-period".to_owned(), format!("{resync}s"), "--resync-jitter".to_owned(), "0".to_owned()];
    let sim = bench.sim()?.admin;
    let audit_paths: Vec<PathBuf> = skrs.iter().map(|s| s.audit_log_path()).collect();
    let mut phases: Vec<(String, Counts, Counts)> = Vec::new();

    // Phase 1: cold start.
    let t0 = unix_ms();
    start_replicas(&mut bench, &replica_ids(1, 0), &extra, Duration::from_secs(120)).await?;
    await_idle(&bench, Duration::from_secs(60)).await?;
    let t1 = unix_ms();
    phases.push(("cold start".into(), audit_counts(&audit_paths, t0, t1), sim_counts(&sim.stats(false).await?)));
    sim.reset().await?;
    // Phase 2: two resync periods.
    tokio::time::sleep(Duration::from_secs(2 * resync + 2)).await;
    await_idle(&bench, Duration::from_secs(60)).await?;
    let t2 = unix_ms();
    phases.push((
        format!("2 resyncs ({resync}s period)"),
        audit_counts(&audit_paths, t1, t2),
        sim_counts(&sim.stats(false).await?),
    ));
    sim.reset().await?;
    // Phase 3: one MT update.
    let mt = probe_mt();
    bench.annotate("moduletemplates", &mt, MARK_ANNOTATION, "calibrate").await?;
    await_marks(&sim, "moduletemplates", &mt, Some("calibrate"), k, t2, Duration::from_secs(60)).await?;
    for skr in &skrs {
        let api: Api<DynamicObject> =
            Api::namespaced_with(skr.admin_client(), SYNC_NS, &CatalogKind::ModuleTemplate.api_resource());
        testenv::wait_until(Duration::from_secs(60), "the update in every real SKR", || async {
            api.get_opt(&mt).await.ok().flatten().is_some_and(|o| {
                o.metadata.annotations.as_ref().and_then(|a| a.get(MARK_ANNOTATION)).map(String::as_str)
                    == Some("calibrate")
            })
        })
        .await?;
    }
    await_idle(&bench, Duration::from_secs(60)).await?;
    let t3 = unix_ms();
    phases.push(("1 MT update".into(), audit_counts(&audit_paths, t2, t3), sim_counts(&sim.stats(false).await?)));
    bench.terminate_all().await?;

    let rows: Vec<RequestCountRow> = phases
        .iter()
        .flat_map(|(phase, real, simulated)| {
            let keys: BTreeSet<&String> = real.keys().chain(simulated.keys()).collect();
            keys.into_iter().map(|key| RequestCountRow {
                phase: phase.clone(),
                request: key.clone(),
                real: real.get(key).copied().unwrap_or(0),
                simulated: simulated.get(key).copied().unwrap_or(0),
            })
        })
        .collect();
    let identical = rows.iter().all(RequestCountRow::is_identical);
    report.table(
        &format!("Calibration: request counts, {k} real SKRs vs {k} simulated SKRs, one replica"),
        &RequestCountRow::HEADER,
        &rows,
    );

    // Latency probe.
    let first_skr = skrs.first().context("no real SKR apiserver (--calibrate-skrs 0)")?;
    let real_client =
        testenv::client_from_kubeconfig_yaml(&first_skr.try_kubeconfig_yaml("probe", &["system:masters"])?).await?;
    let sim_client =
        testenv::client_from_kubeconfig_yaml(&bench.sim_kubeconfig(&format!("sim-{}", kyma_name(0)))?).await?;
    let probes = [
        ("list-meta moduletemplates", Probe::ListMeta),
        ("list moduletemplates (full)", Probe::ListFull),
        ("apply moduletemplate (unchanged)", Probe::Apply),
        ("get-meta namespace", Probe::GetNamespace),
    ];
    let mut real = Vec::new();
    let mut bare = Vec::new();
    for (_, p) in probes {
        real.push(probe(&real_client, p, &mt).await?);
        bare.push(probe(&sim_client, p, &mt).await?);
    }
    sim.set_faults(&Faults { latency_ms: args.latency_ms, ..Faults::default() }).await?;
    let mut slowed = Vec::new();
    for (_, p) in probes {
        slowed.push(probe(&sim_client, p, &mt).await?);
    }
    sim.set_faults(&Faults::default()).await?;
    let sizes = [("list-meta moduletemplates", true), ("list moduletemplates (full)", false)];
    let mut size_rows = Vec::new();
    for (what, meta) in sizes {
        size_rows.push(ResponseSizeRow {
            request: what.to_owned(),
            real_bytes: response_bytes(&real_client, meta).await?,
            simulated_bytes: response_bytes(&sim_client, meta).await?,
        });
    }
    report.table(
        "Calibration: response sizes of one SKR's lists (bytes of JSON)",
        &ResponseSizeRow::HEADER,
        &size_rows,
    );
    let lat_rows: Vec<ProbeLatencyRow> = probes
        .iter()
        .zip(real.into_iter().zip(bare).zip(slowed))
        .map(|((kind, _), ((real, simulated), simulated_slow))| ProbeLatencyRow {
            request: (*kind).into(),
            real,
            simulated,
            simulated_slow,
        })
        .collect();
    report.table(
        "Calibration: per-request latency (probe client, 100 requests each; p50 / p99 in milliseconds)",
        &ProbeLatencyRow::header(args.latency_ms),
        &lat_rows,
    );
    ensure!(identical, "request counts differ between the real SKRs and the simulator (see the table)");
    Ok(())
}

/// Requests by `"<verb> <resource>"`.
type Counts = BTreeMap<String, u64>;

/// A request kind the latency probe times.
#[derive(Clone, Copy)]
enum Probe {
    ListMeta,
    ListFull,
    Apply,
    GetNamespace,
}

/// Times 100 requests of one kind (after 5 warm-up requests); seconds.
async fn probe(client: &kube::Client, kind: Probe, mt: &str) -> Result<Percentiles> {
    let ar = CatalogKind::ModuleTemplate.api_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), SYNC_NS, &ar);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let current = api.get(mt).await.with_context(|| format!("probe: {mt} in the SKR"))?;
    let mut body = serde_json::to_value(&current)?;
    for field in ["resourceVersion", "uid", "managedFields", "creationTimestamp", "generation"] {
        if let Some(meta) = body["metadata"].as_object_mut() {
            meta.remove(field);
        }
    }
    let mut samples = Vec::new();
    for i in 0..105 {
        let t = Instant::now();
        match kind {
            Probe::ListMeta => drop(api.list_metadata(&ListParams::default()).await?),
            Probe::ListFull => drop(api.list(&ListParams::default()).await?),
            Probe::Apply => {
                drop(api.patch(mt, &PatchParams::apply("catalog-sync").force(), &Patch::Apply(&body)).await?)
            }
            Probe::GetNamespace => drop(namespaces.get_metadata_opt(SYNC_NS).await?),
        }
        if i >= 5 {
            samples.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(Percentiles::of(&samples))
}

/// Bytes of one list of the SKR's ModuleTemplates, metadata-only or full.
async fn response_bytes(client: &kube::Client, meta_only: bool) -> Result<usize> {
    let ar = CatalogKind::ModuleTemplate.api_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), SYNC_NS, &ar);
    let request = kube::core::Request::new(api.resource_url());
    let lp = ListParams::default();
    let req = if meta_only { request.list_metadata(&lp)? } else { request.list(&lp)? };
    Ok(client.request_text(req).await?.len())
}

/// Requests per `"<audit verb> <resource>"` in the audit logs between two instants, by
/// catalogsync (its User-Agent).
fn audit_counts(paths: &[PathBuf], from_ms: u64, to_ms: u64) -> Counts {
    let mut out = BTreeMap::new();
    for path in paths {
        for e in testenv::read_audit_log(path).unwrap_or_default() {
            if e.stage != "ResponseComplete" || !e.user_agent.as_deref().unwrap_or("").starts_with("catalogsync/") {
                continue;
            }
            let at = e
                .request_received_timestamp
                .parse::<k8s_openapi::jiff::Timestamp>()
                .map(|t| t.as_millisecond() as u64)
                .unwrap_or_default();
            if at < from_ms || at >= to_ms {
                continue;
            }
            *out.entry(format!("{} {}", e.verb, e.resource())).or_default() += 1;
        }
    }
    out
}

/// The simulator's counters under the audit log's verbs (`get-meta` is a `get`, `list-meta` a
/// `list`, `apply` a `patch`, `replace` an `update`).
fn sim_counts(stats: &SimStats) -> Counts {
    let mut out = BTreeMap::new();
    for (key, v) in &stats.requests {
        let (verb, resource) = key.split_once(' ').unwrap_or((key, ""));
        let verb = match verb {
            "get-meta" => "get",
            "list-meta" => "list",
            "apply" => "patch",
            "replace" => "update",
            other => other,
        };
        *out.entry(format!("{verb} {resource}")).or_default() += v;
    }
    out
}
