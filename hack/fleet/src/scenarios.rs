//! `fleet run`: the scenarios of `docs/performance.md`, each printing a Markdown table.
//!
//! - `fleet`: the fleet-scale pipeline on one KCP and one simulator: memory as Kymas grow,
//!   propagation with 1, 3 and 5 replicas, a new module, rebalance 3 -> 4 -> 3, steady state
//!   over 3 resync periods, and the lifecycle-manager baseline side by side;
//! - `propagation`: only the propagation runs (each replica count from a cold start), for
//!   iterating on sync speed without the whole pipeline;
//! - `calibrate`: the same requests against real SKR apiservers and against the simulator;
//! - `smoke`: a small, fast run of the whole path (CI runs it so the harness does not rot).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use clap::{Args, ValueEnum};

use crate::bench::{Bench, ProcSample, Reached, await_marks, await_synced, marks_until};
use crate::sim::{Faults, MARK_ANNOTATION, SimStats};
use crate::stats::{Percentiles, unix_ms};

/// What `fleet run` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// The fleet-scale pipeline (all scenarios but calibration), side by side with the baseline.
    Fleet,
    /// Propagation only: --kymas Kymas, then for each of --replicas a cold start and the
    /// propagation runs.
    Propagation,
    /// The baseline alone: --kymas Kymas whose SKRs 3 replicas fill first, then the
    /// baseline's window as in the fleet scenario.
    Baseline,
    /// Request counts and per-request latency: real SKR apiservers vs the simulator.
    Calibrate,
    /// A small end-to-end run of the harness (about a minute).
    Smoke,
}

/// Flags of `fleet run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The scenario.
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Kymas (SKRs) in the fleet scenario.
    #[arg(long, default_value = "5000")]
    pub kymas: usize,
    /// Kymas created first, for the memory curve (then grown to --kymas, then to 2 x --kymas).
    #[arg(long, default_value = "1000")]
    pub first_kymas: usize,
    /// Simulated SKR latency, milliseconds, added to every SKR request.
    #[arg(long, default_value = "20")]
    pub latency_ms: f64,
    /// Replica counts for the propagation scenario.
    #[arg(long, value_delimiter = ',', default_value = "1,3,5")]
    pub replicas: Vec<usize>,
    /// Simulated SKR latency, milliseconds, of the propagation run where the SKR side is the
    /// bottleneck (replica scaling).
    #[arg(long, default_value = "250")]
    pub slow_latency_ms: f64,
    /// Resync period of the steady-state scenario, seconds (catalogsync's default is 600).
    #[arg(long, default_value = "60")]
    pub resync_secs: u64,
    /// The baseline's pass period, seconds (lifecycle-manager's is 300).
    #[arg(long, default_value = "300")]
    pub baseline_period_secs: u64,
    /// The baseline's concurrent Kyma reconciles (lifecycle-manager production runs 25).
    #[arg(long, default_value = "25")]
    pub baseline_workers: usize,
    /// Real SKR apiservers (and simulated SKRs) in the calibration.
    #[arg(long, default_value = "10")]
    pub calibrate_skrs: usize,
    /// Skip the baseline in the fleet scenario.
    #[arg(long)]
    pub no_baseline: bool,
    /// How long the baseline's propagation is watched, seconds: SKRs that have not got the
    /// changes by then count as later than the window.
    #[arg(long, default_value = "1800")]
    pub baseline_window_secs: u64,
    /// Skip growing to 2 x --kymas at the end of the fleet scenario.
    #[arg(long)]
    pub no_growth: bool,
    /// Directory for all files (wiped at start). Default `~/.cache/catalogsync/fleet`.
    #[arg(long, env = "CATALOGSYNC_FLEET_DIR")]
    pub dir: Option<PathBuf>,
}

/// Accumulates the report: printed as it grows, written to `<dir>/report.md`.
struct Report {
    path: PathBuf,
    text: String,
}

impl Report {
    fn new(path: PathBuf) -> Self {
        Self { path, text: String::new() }
    }

    fn section(&mut self, title: &str, body: &str) {
        let block = format!("\n### {title}\n\n{body}\n");
        println!("{block}");
        self.text.push_str(&block);
        let _ = std::fs::write(&self.path, &self.text);
    }
}

/// Adds a measured row and logs it at once, so a run that fails later still shows it.
fn push_row(rows: &mut Vec<Vec<String>>, what: &str, row: Vec<String>) {
    eprintln!("  measured ({what}): {}", row.join(" | "));
    rows.push(row);
}

/// Markdown table from a header and rows.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n|{}\n", header.join(" | "), " --- |".repeat(header.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

fn f1(v: f64) -> String {
    format!("{v:.1}")
}

fn f2(v: f64) -> String {
    format!("{v:.2}")
}

/// Runs the scenario.
///
/// # Errors
/// Fails when a step fails or times out.
pub async fn run(args: RunArgs) -> Result<()> {
    let dir = args.dir.clone().unwrap_or_else(default_dir);
    if dir.exists() {
        ensure!(
            dir.join(MARKER).exists() || std::fs::read_dir(&dir)?.next().is_none(),
            "{} exists and was not made by `fleet run`; pass --dir",
            dir.display()
        );
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(MARKER), "")?;
    let mut report = Report::new(dir.join("report.md"));
    report.section("Run", &describe_machine(&args));
    let started = Instant::now();
    let result = match args.scenario {
        Scenario::Fleet => fleet(&args, &dir, &mut report).await,
        Scenario::Propagation => propagation(&args, &dir, &mut report).await,
        Scenario::Baseline => baseline_alone(&args, &dir, &mut report).await,
        Scenario::Calibrate => calibrate(&args, &dir, &mut report).await,
        Scenario::Smoke => smoke(&dir, &mut report).await,
    };
    eprintln!(
        "fleet run {:?}: {:.0}s; report {}",
        args.scenario,
        started.elapsed().as_secs_f64(),
        report.path.display()
    );
    result
}

const MARKER: &str = ".catalogsync-fleet";

fn default_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("catalogsync").join("fleet")
}

fn describe_machine(args: &RunArgs) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("").to_owned()))
        .unwrap_or_default();
    let date = k8s_openapi::jiff::Timestamp::now().to_string();
    format!("`fleet run {:?}` at {date}: {cores} cores ({cpu}), MemTotal {mem} kB; {args:?}", args.scenario)
}

/// Per-SKR stats of a window of simulator traffic.
struct Window {
    stats: SimStats,
    skrs: usize,
}

impl Window {
    fn per_skr(&self, v: u64) -> f64 {
        v as f64 / self.skrs.max(1) as f64
    }

    fn verbs(&self) -> String {
        let mut by_verb: BTreeMap<&str, u64> = BTreeMap::new();
        for (k, v) in &self.stats.requests {
            *by_verb.entry(k.split(' ').next().unwrap_or(k)).or_default() += v;
        }
        let mut verbs: Vec<String> = by_verb.iter().map(|(k, v)| format!("{k} {v}")).collect();
        verbs.push(format!("TLS handshakes {} ({} resumed)", self.stats.handshakes, self.stats.resumed_handshakes));
        verbs.join(", ")
    }
}

async fn window(bench: &Bench) -> Result<Window> {
    let stats = bench.sim()?.admin.stats(false).await?;
    Ok(Window { skrs: bench.kymas.len(), stats })
}

/// The MT all Kymas of the bench get (module 1, `regular` channel).
fn probe_mt() -> String {
    format!("{}-{}", testenv::fixtures::fleet::MODULES[1], testenv::fixtures::fleet::version(1, 0))
}

/// The 10 MTs and 1 MRM of a release: the `regular` MT of modules 1..=10 and the MRM of module 11.
fn release() -> (Vec<String>, String) {
    let mts = (1..=10)
        .map(|m| format!("{}-{}", testenv::fixtures::fleet::MODULES[m], testenv::fixtures::fleet::version(m, 0)))
        .collect();
    (mts, testenv::fixtures::fleet::MODULES[11].to_owned())
}

/// Starts `n` replicas `r0..`, waits until ready and until every Kyma had one successful sync.
async fn start_replicas(bench: &mut Bench, ids: &[String], extra: &[String], timeout: Duration) -> Result<f64> {
    let started = Instant::now();
    for id in ids {
        bench.spawn_replica(id, extra)?;
    }
    bench.await_ready(Duration::from_secs(120)).await?;
    await_synced(bench, bench.kymas.len(), timeout).await?;
    Ok(started.elapsed().as_secs_f64())
}

fn replica_ids(n: usize, offset: usize) -> Vec<String> {
    (offset..offset + n).map(|i| format!("catalogsync-{i}")).collect()
}

/// One propagation measurement: writes `mark` on the given objects and waits until every SKR
/// holds `last` (the object its sync writes last) with it.
struct Propagation {
    latencies: Percentiles,
    window: Window,
    /// CPU seconds of all replicas, from the first write to the end of the window.
    replica_cpu: f64,
    /// CPU seconds of the simulator over the same time.
    sim_cpu: f64,
}

/// CPU seconds so far of all replicas and of the simulator.
fn cpu_now(bench: &Bench) -> Result<(f64, f64)> {
    let replicas = bench.replica_samples().values().map(|s| s.cpu_seconds).sum();
    Ok((replicas, crate::bench::proc_sample(bench.sim()?.pid())?.cpu_seconds))
}

async fn propagate(bench: &Bench, objects: &[(&str, String)], mark: &str, timeout: Duration) -> Result<Propagation> {
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
        window: window(bench).await?,
        replica_cpu: cpu1.0 - cpu0.0,
        sim_cpu: cpu1.1 - cpu0.1,
    })
}

fn propagation_row(label: &str, p: &Propagation, objects: usize) -> Vec<String> {
    let w = &p.window;
    vec![
        label.to_owned(),
        f2(p.latencies.p50),
        f2(p.latencies.p99),
        f2(p.latencies.max),
        w.stats.total_requests.to_string(),
        f2(w.per_skr(w.stats.total_requests)),
        w.stats.writes.to_string(),
        f2(w.per_skr(w.stats.writes) / objects as f64),
        f1(p.replica_cpu),
        format!("{:.2}", 1000.0 * p.replica_cpu / w.skrs.max(1) as f64),
        f1(p.sim_cpu),
        w.verbs(),
    ]
}

const STEADY_HEADER: [&str; 10] = [
    "run",
    "periods",
    "SKR requests / SKR / period",
    "SKR writes",
    "KCP writes (non-Lease)",
    "KCP Lease writes",
    "CPU s / period, per replica",
    "peak RSS MiB, per replica",
    "simulator CPU s / period",
    "by verb",
];

const PROPAGATION_HEADER: [&str; 12] = [
    "run",
    "p50 s",
    "p99 s",
    "max s",
    "SKR requests",
    "requests / SKR",
    "SKR writes",
    "writes / SKR / object",
    "replica CPU s (all)",
    "replica CPU ms / SKR",
    "simulator CPU s",
    "by verb",
];

fn memory_row(kymas: usize, replicas: usize, samples: &BTreeMap<String, ProcSample>) -> Vec<String> {
    let peaks: Vec<f64> = samples.values().map(|s| s.peak_rss_mib).collect();
    let rss: Vec<f64> = samples.values().map(|s| s.rss_mib).collect();
    let max_peak = peaks.iter().copied().fold(0.0, f64::max);
    vec![
        kymas.to_string(),
        replicas.to_string(),
        peaks.iter().map(|v| f1(*v)).collect::<Vec<_>>().join(" / "),
        f1(max_peak),
        rss.iter().map(|v| f1(*v)).collect::<Vec<_>>().join(" / "),
    ]
}

/// The fleet-scale pipeline.
async fn fleet(args: &RunArgs, dir: &std::path::Path, report: &mut Report) -> Result<()> {
    let n = args.kymas;
    let mut bench = start_bench(args, dir, 0).await?;
    let sync_timeout = Duration::from_secs(900);

    // Memory as Kymas grow, with 3 replicas: first_kymas, then n.
    let mut memory_rows = Vec::new();
    let first = args.first_kymas.min(n);
    eprintln!("creating {first} Kymas");
    bench.add_sim_kymas(first).await?;
    let three = replica_ids(3, 0);
    eprintln!("starting 3 replicas on {first} Kymas");
    let rollout_first = start_replicas(&mut bench, &three, &[], sync_timeout).await?;
    push_row(&mut memory_rows, "memory", memory_row(first, 3, &bench.replica_samples()));
    let mut rollout_rows =
        vec![vec![first.to_string(), "3".into(), f1(rollout_first), "new SKRs (empty catalogs)".into()]];
    if n > first {
        eprintln!("growing to {n} Kymas");
        let before = bench.metric_sum("catalogsync_sync_runs_total", &["result=\"success\""]).await as usize;
        let t = Instant::now();
        bench.add_sim_kymas(n - first).await?;
        await_synced(&bench, before + (n - first), sync_timeout).await?;
        push_row(
            &mut rollout_rows,
            "rollout",
            vec![
                format!("+{}", n - first),
                "3".into(),
                f1(t.elapsed().as_secs_f64()),
                "Kymas created while running (creation time included)".into(),
            ],
        );
        push_row(&mut memory_rows, "memory", memory_row(n, 3, &bench.replica_samples()));
    }

    // Propagation with 3 replicas (they run already), then a new module, then rebalance.
    let mut prop_rows = Vec::new();
    let mut speed: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    let p = props(&bench, args, 3, "r3").await?;
    for row in p.rows {
        push_row(&mut prop_rows, "prop", row);
    }
    speed.insert(3, (p.p99, p.slow_p99));

    let new_module = new_module(&bench, sync_timeout).await?;
    let faults_table = fault_run(&bench, args.latency_ms).await?;
    eprintln!("  measured (new module): {}\n  measured (faults):\n{faults_table}", new_module.join(" | "));
    let rebalance = rebalance(&mut bench).await?;
    eprintln!("  measured (rebalance):\n{rebalance}");
    bench.terminate_all().await?;

    for &replicas in args.replicas.iter().filter(|&&r| r != 3) {
        let run =
            cold_run(&mut bench, args, replicas, "restart, SKRs full (cold sync)", &format!("r{replicas}")).await?;
        push_row(&mut rollout_rows, "rollout", run.rollout);
        for row in run.props.rows {
            push_row(&mut prop_rows, "prop", row);
        }
        speed.insert(replicas, (run.props.p99, run.props.slow_p99));
    }

    // The baseline at n Kymas: the same three changes at once, in its periodic regime, until
    // its passes have brought them to every SKR.
    let baseline = if args.no_baseline { None } else { Some(baseline(args, &bench).await?) };

    // Steady state: 3 fresh replicas with a short resync period, 3 periods.
    let steady = steady(args, &mut bench).await?;
    eprintln!("  measured (steady): {}", steady.join(" | "));

    if !args.no_growth {
        eprintln!("3 fresh replicas on {n} Kymas (cold start), then growing to {} Kymas", 2 * n);
        start_replicas(&mut bench, &replica_ids(3, 200), &[], sync_timeout).await?;
        let before = bench.metric_sum("catalogsync_sync_runs_total", &["result=\"success\""]).await as usize;
        bench.add_sim_kymas(n).await?;
        await_synced(&bench, before + n, sync_timeout).await?;
        push_row(&mut memory_rows, "memory", memory_row(2 * n, 3, &bench.replica_samples()));
    }
    bench.terminate_all().await?;

    // Tables.
    report.section(
        "Initial rollout and cold starts",
        &table(&["Kymas", "replicas", "seconds until every SKR synced", "what"], &rollout_rows),
    );
    if let Some(b) = &baseline {
        push_row(&mut prop_rows, "prop", b.one.clone());
        push_row(&mut prop_rows, "prop", b.release.clone());
    }
    report.section("Propagation", &table(&PROPAGATION_HEADER, &prop_rows));
    report.section("Propagation scaling (one MT update, p99)", &scaling_table(args, &speed));
    let mut nm_rows = vec![new_module];
    if let Some(b) = &baseline {
        nm_rows.push(b.new_module.clone());
    }
    report.section("New module (MRM + MT created)", &table(&["run", "p50 s", "p99 s", "max s"], &nm_rows));
    report.section("Rebalance", &rebalance);
    report.section(
        "Faults: one MT update while 2% of SKR requests fail and 1% of SKRs are down (3 replicas)",
        &faults_table,
    );
    let mut steady_rows = vec![steady];
    if let Some(b) = &baseline {
        steady_rows.push(b.steady.clone());
    }
    report.section("Steady state", &table(&STEADY_HEADER, &steady_rows));
    report.section(
        "Memory",
        &table(&["Kymas", "replicas", "peak RSS MiB per replica", "max", "RSS now MiB"], &memory_rows),
    );
    Ok(())
}

/// The KCP with the catalog and the simulator with `--latency-ms`, then `kymas` Kymas.
async fn start_bench(args: &RunArgs, dir: &std::path::Path, kymas: usize) -> Result<Bench> {
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

/// The baseline alone: `--kymas` Kymas, their SKRs filled by 3 replicas (then stopped), then
/// the baseline's window as in the fleet scenario.
async fn baseline_alone(args: &RunArgs, dir: &std::path::Path, report: &mut Report) -> Result<()> {
    let mut bench = start_bench(args, dir, args.kymas).await?;
    eprintln!("3 replicas fill the SKRs");
    start_replicas(&mut bench, &replica_ids(3, 0), &[], Duration::from_secs(900)).await?;
    bench.terminate_all().await?;
    let b = baseline(args, &bench).await?;
    report.section("Propagation", &table(&PROPAGATION_HEADER, &[b.one, b.release]));
    report.section("New module (MRM + MT created)", &table(&["run", "p50 s", "p99 s", "max s"], &[b.new_module]));
    report.section("Steady state", &table(&STEADY_HEADER, &[b.steady]));
    Ok(())
}

/// The propagation scenario alone: `--kymas` Kymas, then for each replica count a cold start
/// (the first one onto empty SKRs) and the propagation runs.
async fn propagation(args: &RunArgs, dir: &std::path::Path, report: &mut Report) -> Result<()> {
    let mut bench = start_bench(args, dir, args.kymas).await?;
    let (mut rollout_rows, mut prop_rows, mut memory_rows) = (Vec::new(), Vec::new(), Vec::new());
    let mut speed: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    for (i, &replicas) in args.replicas.iter().enumerate() {
        let what = if i == 0 { "first start, SKRs empty" } else { "restart, SKRs full (cold sync)" };
        // Each start marks its changes anew: a replica count may be given twice.
        let run = cold_run(&mut bench, args, replicas, what, &format!("r{replicas}-{i}")).await?;
        push_row(&mut rollout_rows, "rollout", run.rollout);
        for row in run.props.rows {
            push_row(&mut prop_rows, "prop", row);
        }
        push_row(&mut memory_rows, "memory", run.memory);
        speed.insert(replicas, (run.props.p99, run.props.slow_p99));
    }
    report.section(
        "Cold starts",
        &table(&["Kymas", "replicas", "seconds until every SKR synced", "what"], &rollout_rows),
    );
    report.section("Propagation", &table(&PROPAGATION_HEADER, &prop_rows));
    report.section("Propagation scaling (one MT update, p99)", &scaling_table(args, &speed));
    report.section(
        "Memory",
        &table(&["Kymas", "replicas", "peak RSS MiB per replica", "max", "RSS now MiB"], &memory_rows),
    );
    Ok(())
}

/// One replica count started cold: its rollout row, propagation rows and memory row.
struct ColdRun {
    rollout: Vec<String>,
    props: PropRows,
    memory: Vec<String>,
}

/// Starts `replicas` fresh replicas on the bench's Kymas, waits until every SKR synced, runs
/// the propagation measurements, samples memory and stops the replicas; `what` describes the
/// start in the rollout row, `tag` names the marks of its changes (unique per start).
async fn cold_run(bench: &mut Bench, args: &RunArgs, replicas: usize, what: &str, tag: &str) -> Result<ColdRun> {
    eprintln!("propagation with {replicas} replica(s): cold start");
    let ids = replica_ids(replicas, 10 * replicas);
    let cold = start_replicas(bench, &ids, &[], Duration::from_secs(900)).await?;
    let kymas = bench.kymas.len();
    let rollout = vec![kymas.to_string(), replicas.to_string(), f1(cold), what.into()];
    let props = props(bench, args, replicas, tag).await?;
    let memory = memory_row(kymas, replicas, &bench.replica_samples());
    bench.terminate_all().await?;
    Ok(ColdRun { rollout, props, memory })
}

/// Speed-ups of the single update's p99 between replica counts, at both SKR latencies.
fn scaling_table(args: &RunArgs, speed: &BTreeMap<usize, (f64, f64)>) -> String {
    let ratio = |base: Option<&(f64, f64)>, pick: fn(&(f64, f64)) -> f64, mine: f64| {
        base.map(|b| f2(pick(b) / mine)).unwrap_or_else(|| "-".into())
    };
    let rows: Vec<Vec<String>> = speed
        .iter()
        .map(|(r, (p99, slow))| {
            vec![
                r.to_string(),
                f2(*p99),
                ratio(speed.get(&1), |b| b.0, *p99),
                ratio(speed.get(&3), |b| b.0, *p99),
                f2(*slow),
                ratio(speed.get(&1), |b| b.1, *slow),
                ratio(speed.get(&3), |b| b.1, *slow),
            ]
        })
        .collect();
    table(
        &[
            "replicas",
            &format!("p99 s, {} ms SKR latency", args.latency_ms),
            "speed-up vs 1",
            "speed-up vs 3",
            &format!("p99 s, {} ms SKR latency", args.slow_latency_ms),
            "speed-up vs 1",
            "speed-up vs 3",
        ],
        &rows,
    )
}

/// Propagation of one MT update and of a release with the running replicas: the two table rows
/// and the p99 of the single update.
async fn props(bench: &Bench, args: &RunArgs, replicas: usize, tag: &str) -> Result<PropRows> {
    let timeout = Duration::from_secs(900);
    let one = propagate(bench, &[("moduletemplates", probe_mt())], &format!("{tag}-one"), timeout).await?;
    let (rel_mts, rel_mrm) = release();
    let mut objs: Vec<(&str, String)> = rel_mts.into_iter().map(|m| ("moduletemplates", m)).collect();
    objs.push(("modulereleasemetas", rel_mrm));
    let rel = propagate(bench, &objs, &format!("{tag}-release"), timeout).await?;
    // The same update with slow SKRs, where the SKR side and not the CPU is the bottleneck.
    let sim = bench.sim()?.admin();
    sim.set_faults(&Faults { latency_ms: args.slow_latency_ms, ..Faults::default() }).await?;
    let slow = propagate(bench, &[("moduletemplates", probe_mt())], &format!("{tag}-slow"), timeout).await;
    sim.set_faults(&Faults { latency_ms: args.latency_ms, ..Faults::default() }).await?;
    let slow = slow?;
    Ok(PropRows {
        rows: vec![
            propagation_row(&format!("catalogsync, {replicas} replica(s): 1 MT update"), &one, 1),
            propagation_row(&format!("catalogsync, {replicas} replica(s): release 10 MTs + 1 MRM"), &rel, 11),
            propagation_row(
                &format!("catalogsync, {replicas} replica(s): 1 MT update, {} ms SKR latency", args.slow_latency_ms),
                &slow,
                1,
            ),
        ],
        p99: one.latencies.p99,
        slow_p99: slow.latencies.p99,
    })
}

/// The propagation rows of one replica count, and the p99 of the single update at the normal
/// and at the slow SKR latency.
struct PropRows {
    rows: Vec<Vec<String>>,
    p99: f64,
    slow_p99: f64,
}

/// A new module: its MT and MRM created in the KCP; time until every SKR holds the MRM (which
/// syncs write after the MTs).
async fn new_module(bench: &Bench, timeout: Duration) -> Result<Vec<String>> {
    eprintln!("new module");
    let sim = &bench.sim()?.admin;
    sim.reset().await?;
    let t0 = unix_ms();
    let (mt, mrm) = new_module_objects("fleet-new");
    bench.apply_catalog_object(&mt).await?;
    bench.apply_catalog_object(&mrm).await?;
    let lat = await_marks(sim, "modulereleasemetas", "fleet-new", None, bench.kymas.len(), t0, timeout).await?;
    let d = Percentiles::of(&lat);
    Ok(vec!["catalogsync, 3 replicas".into(), f2(d.p50), f2(d.p99), f2(d.max)])
}

/// The MT and MRM of a new module `name` (one channel, `regular`).
fn new_module_objects(name: &str) -> (kube::api::DynamicObject, kube::api::DynamicObject) {
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

/// One MT update while the simulator fails 2% of requests and 1% of the SKRs are down; then
/// the down SKRs come back. The healthy SKRs must not wait for the broken ones.
async fn fault_run(bench: &Bench, latency_ms: f64) -> Result<String> {
    eprintln!("faults");
    let n = bench.kymas.len();
    let down: Vec<String> = bench.kymas.iter().step_by(100).cloned().collect();
    let sim = bench.sim()?.admin();
    sim.set_faults(&Faults { latency_ms, error_rate: 0.02, down: down.clone(), ..Faults::default() }).await?;
    sim.reset().await?;
    let mt = probe_mt();
    let t0 = unix_ms();
    bench.annotate("moduletemplates", &mt, MARK_ANNOTATION, "faults").await?;
    let timeout = Duration::from_secs(900);
    let healthy =
        Percentiles::of(&await_marks(&sim, "moduletemplates", &mt, Some("faults"), n - down.len(), t0, timeout).await?);
    let during = sim.stats(false).await?;
    sim.set_faults(&Faults { latency_ms, ..Faults::default() }).await?;
    let t1 = unix_ms();
    let all = await_marks(&sim, "moduletemplates", &mt, Some("faults"), n, t1, timeout).await?;
    let recovered = all.iter().copied().fold(0.0, f64::max);
    Ok(table(
        &[
            "SKRs",
            "down",
            "healthy SKRs: p50 / p99 / max s",
            "injected errors",
            "down SKRs hold it after they are back: s",
        ],
        &[vec![
            n.to_string(),
            down.len().to_string(),
            format!("{} / {} / {}", f2(healthy.p50), f2(healthy.p99), f2(healthy.max)),
            during.injected_errors.to_string(),
            f1(recovered),
        ]],
    ))
}

/// Rebalance 3 -> 4 -> 3 with the three replicas running.
async fn rebalance(bench: &mut Bench) -> Result<String> {
    eprintln!("rebalance 3 -> 4 -> 3");
    let mut rows = Vec::new();
    let sim = bench.sim()?.admin();
    // 3 -> 4
    sim.reset().await?;
    let before = handover_totals(bench).await;
    let t = Instant::now();
    bench.spawn_replica("catalogsync-3", &[])?;
    let unowned = watch_until_settled(bench, 4, Duration::from_secs(300)).await?;
    let settle = t.elapsed().as_secs_f64();
    // The owned-SKR gauge is set once the new holder's first syncs of a shard ran.
    await_idle(bench, Duration::from_secs(300)).await?;
    let moved =
        crate::bench::metric(bench.replicas["catalogsync-3"].http_port, "catalogsync_shard_owned_clusters", &[]).await;
    let shards_moved =
        crate::bench::metric(bench.replicas["catalogsync-3"].http_port, "catalogsync_shards_held", &[]).await;
    let w = window(bench).await?;
    let after = handover_totals(bench).await;
    rows.push(rebalance_row("3 -> 4 (scale up)", shards_moved, moved, settle, &before, &after, unowned, &w));
    // 4 -> 3
    sim.reset().await?;
    let before = handover_totals(bench).await;
    let t = Instant::now();
    let leaving_port = bench.replicas["catalogsync-3"].http_port;
    let leaving_shards = crate::bench::metric(leaving_port, "catalogsync_shards_held", &[]).await;
    let leaving = crate::bench::metric(leaving_port, "catalogsync_shard_owned_clusters", &[]).await;
    let mut leaver = bench.replicas.remove("catalogsync-3").context("replica catalogsync-3")?;
    let term = leaver.process.terminate(Duration::from_secs(40));
    let watch = watch_until_settled(bench, 3, Duration::from_secs(300));
    let (term, unowned) = tokio::join!(term, watch);
    term?;
    let unowned = unowned?;
    let settle = t.elapsed().as_secs_f64();
    await_idle(bench, Duration::from_secs(300)).await?;
    let w = window(bench).await?;
    let after = handover_totals(bench).await;
    rows.push(rebalance_row("4 -> 3 (SIGTERM)", leaving_shards, leaving, settle, &before, &after, unowned, &w));
    Ok(table(
        &[
            "move",
            "shards moved",
            "SKRs moved",
            "seconds until settled",
            "handovers (claim duration mean s)",
            "unowned SKRs: max, seconds",
            "SKR requests",
            "SKR writes",
            "by verb",
        ],
        &rows,
    ))
}

/// Sum and count of the handover duration histogram over the replicas.
async fn handover_totals(bench: &Bench) -> (f64, f64) {
    (
        bench.metric_sum("catalogsync_shard_handover_duration_seconds_sum", &[]).await,
        bench.metric_sum("catalogsync_shard_handover_duration_seconds_count", &[]).await,
    )
}

#[allow(clippy::too_many_arguments)]
fn rebalance_row(
    label: &str,
    shards: f64,
    skrs: f64,
    settle: f64,
    before: &(f64, f64),
    after: &(f64, f64),
    unowned: (f64, f64),
    w: &Window,
) -> Vec<String> {
    let count = (after.1 - before.1).max(0.0);
    let mean = if count > 0.0 { (after.0 - before.0) / count } else { 0.0 };
    vec![
        label.into(),
        format!("{shards:.0}"),
        format!("{skrs:.0}"),
        f1(settle),
        format!("{count:.0} ({})", f2(mean)),
        format!("{:.0}, {}", unowned.0, f1(unowned.1)),
        w.stats.total_requests.to_string(),
        w.stats.writes.to_string(),
        w.verbs(),
    ]
}

/// Samples the coordinator's unowned-SKR gauge every 100 ms until `replicas` replicas hold all
/// shards between them and nothing is unowned; returns (max unowned, seconds with any unowned).
async fn watch_until_settled(bench: &Bench, replicas: usize, timeout: Duration) -> Result<(f64, f64)> {
    let deadline = Instant::now() + timeout;
    let mut max_unowned: f64 = 0.0;
    let mut unowned_secs = 0.0;
    let tick = Duration::from_millis(100);
    loop {
        let mut held = Vec::new();
        let mut unowned = 0.0;
        for r in bench.replicas.values() {
            held.push(crate::bench::metric(r.http_port, "catalogsync_shards_held", &[]).await);
            unowned += crate::bench::metric(r.http_port, "catalogsync_unowned_clusters", &[]).await;
        }
        max_unowned = max_unowned.max(unowned);
        if unowned > 0.0 {
            unowned_secs += tick.as_secs_f64();
        }
        let total: f64 = held.iter().sum();
        let balanced = held.iter().all(|h| *h >= (64 / replicas) as f64);
        if held.len() == replicas && total >= 64.0 && balanced && unowned == 0.0 {
            return Ok((max_unowned, unowned_secs));
        }
        if Instant::now() > deadline {
            bail!("shards did not settle on {replicas} replicas within {}s: held {held:?}", timeout.as_secs());
        }
        tokio::time::sleep(tick).await;
    }
}

/// Waits until no replica has a sync in flight or queued (two quiet samples in a row).
async fn await_idle(bench: &Bench, timeout: Duration) -> Result<()> {
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

/// Steady state: 3 fresh replicas with `--resync-period <resync>`, measured over 3 periods.
async fn steady(args: &RunArgs, bench: &mut Bench) -> Result<Vec<String>> {
    eprintln!("steady state: 3 replicas, resync {}s, 3 periods", args.resync_secs);
    let period = Duration::from_secs(args.resync_secs);
    let extra = vec!["--resync-period".to_owned(), format!("{}s", args.resync_secs)];
    let ids = replica_ids(3, 100);
    start_replicas(bench, &ids, &extra, Duration::from_secs(900)).await?;
    // Every SKR has had its cold sync; one more period lets the first warm resyncs pass, so
    // the window holds warm resyncs only.
    tokio::time::sleep(period).await;
    let sim = bench.sim()?.admin();
    sim.reset().await?;
    let sim_pid = bench.sim()?.pid();
    let sim0 = crate::bench::proc_sample(sim_pid)?;
    let cpu0 = bench.replica_samples();
    let t0 = unix_ms();
    tokio::time::sleep(period * 3).await;
    let t1 = unix_ms();
    let cpu1 = bench.replica_samples();
    let sim1 = crate::bench::proc_sample(sim_pid)?;
    let w = window(bench).await?;
    let (lease_writes, other_writes) = bench.kcp_writes(testenv::CATALOGSYNC_USER, t0, t1);
    let cpu: Vec<String> = cpu1
        .iter()
        .map(|(id, s)| f2((s.cpu_seconds - cpu0.get(id).map(|c| c.cpu_seconds).unwrap_or_default()) / 3.0))
        .collect();
    let peaks: Vec<String> = cpu1.values().map(|s| f1(s.peak_rss_mib)).collect();
    // Replicas that resync every few seconds never have "no sync in flight", which the
    // following phases wait for.
    bench.terminate_all().await?;
    Ok(vec![
        format!("catalogsync, 3 replicas, resync {}s", args.resync_secs),
        "3".into(),
        f2(w.per_skr(w.stats.total_requests) / 3.0),
        w.stats.writes.to_string(),
        other_writes.to_string(),
        lease_writes.to_string(),
        cpu.join(" / "),
        peaks.join(" / "),
        f2((sim1.cpu_seconds - sim0.cpu_seconds) / 3.0),
        w.verbs(),
    ])
}

/// The baseline's rows.
struct BaselineRows {
    one: Vec<String>,
    release: Vec<String>,
    new_module: Vec<String>,
    steady: Vec<String>,
}

/// The baseline at the bench's Kymas. Once every Kyma had a pass, or one period after its
/// start if the round takes longer, the one-MT update, the release and a new module are made
/// at once; then until every SKR holds all three, or `--baseline-window-secs` ran out (the
/// rows then show the SKRs still without them as `> window`).
async fn baseline(args: &RunArgs, bench: &Bench) -> Result<BaselineRows> {
    eprintln!("baseline: {} workers, period {}s", args.baseline_workers, args.baseline_period_secs);
    let n = bench.kymas.len();
    let period = Duration::from_secs(args.baseline_period_secs);
    let process = bench.start_baseline(period, args.baseline_workers, false).await?;
    // Its periodic regime: from then on each Kyma is requeued or still waits in FIFO order,
    // and takes the changes at its next pass.
    let started = Instant::now();
    let mut last_report = Instant::now();
    let first_round = loop {
        let s = process.admin.stats().await?;
        if s.first_round_done_unix_ms.is_some() || (s.kymas as usize >= n && started.elapsed() >= period) {
            break s;
        }
        ensure!(
            started.elapsed() < period + Duration::from_secs(120),
            "the baseline did not list the {n} Kymas within {}s of its start ({} in its cache)",
            (period + Duration::from_secs(120)).as_secs(),
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
    let sim = &bench.sim()?.admin;
    sim.reset().await?;
    process.admin.reset().await?;
    let cpu0 = crate::bench::proc_sample(process.pid())?;
    let sim_pid = bench.sim()?.pid();
    let sim0 = crate::bench::proc_sample(sim_pid)?;
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
    let cpu1 = crate::bench::proc_sample(process.pid())?;
    let sim1 = crate::bench::proc_sample(sim_pid)?;
    let w = window(bench).await?;
    let stats = process.admin.stats().await?;
    let t1 = unix_ms();
    let kcp_writes = bench.kcp_writes("admin", t0, t1);
    process.stop().await;
    // The window covers about one pass per Kyma (one round).
    let passes = stats.passes.max(1) as f64;
    let periods = passes / n as f64;
    let row = |label: &str, r: &Reached| {
        let [p50, p99, max] = r.dist();
        vec![
            label.to_owned(),
            p50,
            p99,
            max,
            w.stats.total_requests.to_string(),
            f2(w.per_skr(w.stats.total_requests)),
            w.stats.writes.to_string(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            w.verbs(),
        ]
    };
    eprintln!(
        "baseline: window {wall:.0}s, {} passes, pass p50 {:.2}s, queue lag p50 {:.0}s p99 {:.0}s",
        stats.passes, stats.pass_seconds.p50, stats.queue_lag_seconds.p50, stats.queue_lag_seconds.p99
    );
    let [nm50, nm99, nm_max] = nm.dist();
    Ok(BaselineRows {
        one: row(&format!("baseline ({}s period): 1 MT update (all three changes at once)", period.as_secs()), &one),
        release: row("baseline: release 10 MTs + 1 MRM (same window)", &rel),
        new_module: vec![format!("baseline ({}s period)", period.as_secs()), nm50, nm99, nm_max],
        steady: vec![
            format!("baseline, {} workers, period {}s", args.baseline_workers, period.as_secs()),
            f2(periods),
            f2(w.per_skr(w.stats.total_requests) / periods),
            w.stats.writes.to_string(),
            format!("{} (harness writes only)", kcp_writes.1),
            "0".into(),
            f2((cpu1.cpu_seconds - cpu0.cpu_seconds) / periods),
            f1(cpu1.peak_rss_mib),
            f2((sim1.cpu_seconds - sim0.cpu_seconds) / periods),
            w.verbs(),
        ],
    })
}

/// Calibration: one replica syncs `--calibrate-skrs` real SKR apiservers and as many simulated
/// SKRs (no injected latency) at the same time, Kyma for Kyma with the same labels. Request
/// counts by verb per phase (cold start, two resyncs, one MT update) from the real SKRs' audit
/// logs and from the simulator's counters; then per-request latency of each request kind the
/// sync makes, measured by a probe client against a real SKR and a simulated one.
async fn calibrate(args: &RunArgs, dir: &std::path::Path, report: &mut Report) -> Result<()> {
    let k = args.calibrate_skrs;
    let mut bench = Bench::start(dir).await?;
    bench.install_catalog().await?;
    bench.start_sim(&Faults::default()).await?;
    eprintln!("starting {k} SKR apiservers");
    let mut skrs = Vec::new();
    for chunk in (0..k).collect::<Vec<_>>().chunks(4) {
        let started = futures::future::try_join_all(chunk.iter().map(|i| bench.start_real_skr_named(*i))).await?;
        skrs.extend(started);
    }
    let mut planned = Vec::new();
    for (i, skr) in skrs.iter().enumerate() {
        let name = format!("real-{}", crate::bench::kyma_name(i));
        planned.push((i, name, skr.try_kubeconfig_yaml(&format!("skr-admin-{i}"), &["system:masters"])?));
    }
    for i in 0..k {
        let name = format!("sim-{}", crate::bench::kyma_name(i));
        let kc = bench.sim_kubeconfig_for(&name)?;
        planned.push((i, name, kc));
    }
    bench.create_kymas(planned).await?;
    let resync = 20;
    let extra = vec!["--resync-period".to_owned(), format!("{resync}s"), "--resync-jitter".to_owned(), "0".to_owned()];
    let sim = bench.sim()?.admin();
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
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
            skr.admin_client(),
            crate::bench::SYNC_NS,
            &catalogsync::catalog::CatalogKind::ModuleTemplate.api_resource(),
        );
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

    let mut rows = Vec::new();
    let mut identical = true;
    for (phase, real, simulated) in &phases {
        let keys: std::collections::BTreeSet<&String> = real.keys().chain(simulated.keys()).collect();
        for key in keys {
            let (r, s) = (real.get(key).copied().unwrap_or(0), simulated.get(key).copied().unwrap_or(0));
            identical &= r == s;
            rows.push(vec![
                phase.clone(),
                key.clone(),
                r.to_string(),
                s.to_string(),
                if r == s { "=".into() } else { "differs".into() },
            ]);
        }
    }
    report.section(
        &format!("Calibration: request counts, {k} real SKRs vs {k} simulated SKRs, one replica"),
        &table(&["phase", "request", "real apiservers (audit log)", "simulator", ""], &rows),
    );

    // Latency probe.
    let real_client =
        testenv::client_from_kubeconfig_yaml(&skrs[0].try_kubeconfig_yaml("probe", &["system:masters"])?).await?;
    let sim_client = testenv::client_from_kubeconfig_yaml(
        &bench.sim_kubeconfig_for(&format!("sim-{}", crate::bench::kyma_name(0)))?,
    )
    .await?;
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
        let r = response_bytes(&real_client, meta).await?;
        let s = response_bytes(&sim_client, meta).await?;
        size_rows.push(vec![what.to_owned(), r.to_string(), s.to_string(), f2(s as f64 / r.max(1) as f64)]);
    }
    report.section(
        "Calibration: response sizes of one SKR's lists (bytes of JSON)",
        &table(&["request", "real SKR apiserver", "simulator", "simulator / real"], &size_rows),
    );
    let lat_rows: Vec<Vec<String>> = probes
        .iter()
        .enumerate()
        .map(|(i, (kind, _))| {
            let ms = |d: &Percentiles| format!("{} / {}", f2(d.p50 * 1000.0), f2(d.p99 * 1000.0));
            vec![(*kind).into(), ms(&real[i]), ms(&bare[i]), ms(&slowed[i])]
        })
        .collect();
    report.section(
        "Calibration: per-request latency (probe client, 100 requests each; p50 / p99 in milliseconds)",
        &table(
            &[
                "request",
                "real SKR apiserver",
                "simulator, no injected latency",
                &format!("simulator, {} ms injected", args.latency_ms),
            ],
            &lat_rows,
        ),
    );
    ensure!(identical, "request counts differ between the real SKRs and the simulator (see the table)");
    Ok(())
}

/// Requests by "<verb> <resource>".
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
    use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
    let ar = catalogsync::catalog::CatalogKind::ModuleTemplate.api_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), crate::bench::SYNC_NS, &ar);
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
            Probe::GetNamespace => drop(namespaces.get_metadata_opt(crate::bench::SYNC_NS).await?),
        }
        if i >= 5 {
            samples.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(Percentiles::of(&samples))
}

/// Bytes of one list of the SKR's ModuleTemplates, metadata-only or full.
async fn response_bytes(client: &kube::Client, meta_only: bool) -> Result<usize> {
    let ar = catalogsync::catalog::CatalogKind::ModuleTemplate.api_resource();
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client.clone(), crate::bench::SYNC_NS, &ar);
    let request = kube::core::Request::new(api.resource_url());
    let lp = kube::api::ListParams::default();
    let req = if meta_only { request.list_metadata(&lp)? } else { request.list(&lp)? };
    Ok(client.request_text(req).await?.len())
}

/// Requests per "<audit verb> <resource>" in the audit logs between two instants, by
/// catalogsync (its User-Agent).
fn audit_counts(paths: &[PathBuf], from_ms: u64, to_ms: u64) -> BTreeMap<String, u64> {
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
fn sim_counts(stats: &SimStats) -> BTreeMap<String, u64> {
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

/// The smoke scenario: 50 Kymas, 2 replicas, a short latency; the rollout, one propagation,
/// a new module, and a baseline round. Fails when any step does.
async fn smoke(dir: &std::path::Path, report: &mut Report) -> Result<()> {
    let n = 50;
    let mut bench = Bench::start(dir).await?;
    bench.install_catalog().await?;
    bench.start_sim(&Faults { latency_ms: 5.0, ..Faults::default() }).await?;
    bench.add_sim_kymas(n).await?;
    let timeout = Duration::from_secs(120);
    let rollout = start_replicas(&mut bench, &replica_ids(2, 0), &[], timeout).await?;
    let one = propagate(&bench, &[("moduletemplates", probe_mt())], "smoke-one", timeout).await?;
    ensure!(
        one.window.stats.writes as usize == n,
        "expected {n} SKR writes for one MT update, saw {}",
        one.window.stats.writes
    );
    let nm = new_module(&bench, timeout).await?;
    bench.terminate_all().await?;
    let baseline = bench.start_baseline(Duration::from_secs(300), 25, true).await?;
    let deadline = Instant::now() + timeout;
    let stats = loop {
        let s = baseline.admin.stats().await?;
        if s.first_round_done_unix_ms.is_some() {
            break s;
        }
        ensure!(Instant::now() < deadline, "the baseline did not finish a round within {}s", timeout.as_secs());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    baseline.stop().await;
    ensure!(stats.passes as usize >= n, "baseline: {} passes for {n} Kymas", stats.passes);
    report.section(
        "Smoke",
        &table(
            &["check", "result"],
            &[
                vec![format!("rollout to {n} SKRs, 2 replicas (s)"), f1(rollout)],
                vec![
                    "one MT update: p50 / p99 / max (s)".into(),
                    format!("{} / {} / {}", f2(one.latencies.p50), f2(one.latencies.p99), f2(one.latencies.max)),
                ],
                vec!["one MT update: SKR writes".into(), one.window.stats.writes.to_string()],
                vec!["new module: p99 (s)".into(), nm[2].clone()],
                vec!["baseline round: passes, requests".into(), format!("{}, {}", stats.passes, stats.requests_total)],
                vec!["baseline pass p50 (s)".into(), f2(stats.pass_seconds.p50)],
            ],
        ),
    );
    Ok(())
}
