//! `fleet`: the fleet-scale performance harness (`docs/performance.md`).
//!
//! One binary, three roles:
//!
//! - `fleet run <scenario>` drives everything: a real KCP apiserver with thousands of Kymas and
//!   their access Secrets, the 25 x 3 catalog, catalogsync replicas as real processes, the SKR
//!   simulator and the lifecycle-manager baseline, and prints one table per scenario;
//! - `fleet sim` is the SKR simulator: one process that answers for many SKRs (one per bearer
//!   token), with injectable latency and errors, counting every request;
//! - `fleet baseline` reproduces lifecycle-manager's in-loop catalog sync (a full re-apply of
//!   the desired catalog to every SKR every pass) as the reference to compare against, and
//!   with `--reconcile` the rest of its Kyma reconcile's SKR and KCP requests.
//!
//! Run it through `hack/fleet.sh`, which builds the release binaries first.

mod baseline;
mod bench;
mod scenarios;
mod sim;
mod stats;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Fleet-scale performance harness for catalogsync.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a scenario and print its tables (also written to `<dir>/report.md`, and as typed
    /// rows to `<dir>/report.json`).
    Run(scenarios::RunArgs),
    /// Serve the SKR simulator (started by `run`; useful alone for debugging).
    Sim(sim::SimArgs),
    /// Check a running simulator with a kube client (request shapes catalogsync and the
    /// baseline use).
    SimCheck(sim::CheckArgs),
    /// Run the lifecycle-manager baseline against a KCP (started by `run`).
    Baseline(baseline::BaselineArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => scenarios::run(args).await,
            Command::Sim(args) => sim::serve(args).await,
            Command::SimCheck(args) => sim::check(args).await,
            Command::Baseline(args) => baseline::run(args).await,
        }
    })
}
