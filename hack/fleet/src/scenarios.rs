//! `fleet run`: the scenarios of `docs/performance.md`, each printing Markdown tables.
//!
//! - `fleet`: the fleet-scale pipeline on one KCP and one simulator: memory as Kymas grow,
//!   propagation with 1, 3 and 5 replicas, a new module, rebalance 3 -> 4 -> 3, steady state
//!   over 3 resync periods, and the lifecycle-manager baseline side by side;
//! - `propagation`: only the propagation runs (each replica count from a cold start), for
//!   iterating on sync speed without the whole pipeline;
//! - `baseline`: the lifecycle-manager baseline alone;
//! - `reconcile`: the baseline's whole Kyma reconcile with and without its catalog part,
//!   side by side with catalogsync's steady state (the load taken off the Kyma reconcile);
//! - `calibrate`: the same requests against real SKR apiservers and against the simulator;
//! - `smoke`: a small, fast run of the whole path (CI runs it so the harness does not rot).
//!
//! The scenarios are defined in [`fleet`], [`reconcile`], [`calibrate`] and [`smoke`]; the
//! measurements they are made of in [`propagation`], [`rebalance`], [`steady`], [`baseline`]
//! and [`reconcile`], on a bench set
//! up by [`setup`]. Each measurement returns typed rows ([`rows`]), which [`report`] renders
//! into `report.md` and writes as they are into `report.json`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, ensure};
use clap::{Args, ValueEnum};
use serde::Serialize;

use self::report::Report;

mod baseline;
mod calibrate;
mod fleet;
mod propagation;
mod rebalance;
mod reconcile;
mod report;
mod rows;
mod setup;
mod smoke;
mod steady;

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
    /// The Kyma reconcile: --kymas Kymas whose SKRs 3 replicas fill first; a round of the
    /// baseline's full reconcile, one without its catalog part, then catalogsync's steady
    /// state at --resync-secs (default 300).
    Reconcile,
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
    /// Resync period of the steady-state runs, seconds, passed to the replicas explicitly
    /// (default: 60 in the fleet scenario, 300 in the reconcile scenario).
    #[arg(long)]
    pub resync_secs: Option<u64>,
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
    let mut report = Report::new(&dir);
    let machine = Machine::describe(&args);
    report.section("Run", &machine.to_string(), &machine);
    let started = Instant::now();
    let result = match args.scenario {
        Scenario::Fleet => fleet::fleet(&args, &dir, &mut report).await,
        Scenario::Propagation => fleet::propagation_only(&args, &dir, &mut report).await,
        Scenario::Baseline => fleet::baseline_alone(&args, &dir, &mut report).await,
        Scenario::Reconcile => reconcile::reconcile(&args, &dir, &mut report).await,
        Scenario::Calibrate => calibrate::calibrate(&args, &dir, &mut report).await,
        Scenario::Smoke => smoke::smoke(&dir, &mut report).await,
    };
    eprintln!(
        "fleet run {:?}: {:.0}s; report {}",
        args.scenario,
        started.elapsed().as_secs_f64(),
        report.path().display()
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

/// The run and the machine it runs on: the report's first section.
#[derive(Debug, Serialize)]
struct Machine {
    /// The scenario.
    scenario: String,
    /// When the run started (RFC 3339).
    date: String,
    /// Cores available.
    cores: usize,
    /// The CPU model.
    cpu: String,
    /// `MemTotal` of `/proc/meminfo`, kB.
    mem_total_kb: Option<u64>,
    /// Every flag, as parsed.
    args: String,
}

impl Machine {
    fn describe(args: &RunArgs) -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find(|l| l.starts_with("model name"))
                    .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
            })
            .unwrap_or_default();
        let mem_total_kb = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| m.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()));
        Machine {
            scenario: format!("{:?}", args.scenario),
            date: k8s_openapi::jiff::Timestamp::now().to_string(),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            cpu,
            mem_total_kb,
            args: format!("{args:?}"),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Machine { scenario, date, cores, cpu, mem_total_kb, args } = self;
        let mem = mem_total_kb.map(|kb| kb.to_string()).unwrap_or_default();
        write!(f, "`fleet run {scenario}` at {date}: {cores} cores ({cpu}), MemTotal {mem} kB; {args}")
    }
}
