//! `local-up`: a KCP and SKRs on this machine (real kube-apiservers on one etcd), with CRDs,
//! RBAC, a sample catalog, one Kyma and access Secret per SKR, and catalogsync replicas running
//! against them, sharing the SKRs through their Leases as in a cluster. Run it through
//! `hack/local-up.sh`, which builds the binaries first; Ctrl-C stops everything.
//!
//! Everything lives under one directory (default `~/.cache/catalogsync/local-up`), wiped at
//! start and kept after exit so logs and audit logs can be read afterwards.

mod replicas;
mod signals;
mod summary;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use catalogsync::api::{BETA_LABEL, INTERNAL_LABEL, KUBECONFIG_KEY, KYMA_NAME_LABEL, Kyma, MODULE_CATALOG_CONDITION};
use catalogsync::sharding::table::{self, Table};
use clap::Parser;
use futures::{StreamExt as _, TryStreamExt as _};
use serde_json::json;

use testenv::{ControlPlane, Etcd};

use self::replicas::{LEASE_NAMESPACE, MAX_REPLICAS, Replica};
use self::signals::Interrupts;
use self::summary::{KymaState, Progress, ReplicaInfo};

/// Namespace of Kymas, access Secrets and the catalog in the KCP.
const KCP_NAMESPACE: &str = "kcp-system";
/// Marker file that identifies a directory `local-up` may wipe.
const MARKER: &str = ".catalogsync-local-up";
/// How long the replicas get to shut down after SIGTERM (catalogsync's own
/// `--shutdown-timeout` is 20s).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Most SKRs `--skrs` accepts: each is a kube-apiserver of about 300 MiB.
const MAX_SKRS: usize = 8;
/// How many kube-apiservers start at once (each is busy for a few CPU seconds at start).
const START_CONCURRENCY: usize = 4;
/// How often the shard table and the Kymas are read while the replicas run.
const POLL_PERIOD: Duration = Duration::from_secs(2);
/// After this long without every shard held and every Kyma synced, say where to look.
const HINT_AFTER: Duration = Duration::from_secs(180);

/// Starts a local KCP and SKRs and runs catalogsync replicas against them until Ctrl-C.
#[derive(Parser, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    long_about = "Starts a local KCP and SKRs (real kube-apiservers on one etcd), installs the CRDs, the RBAC of \
                  deploy/rbac/ and the sample catalog (hack/sample/catalog.yaml), creates one Kyma with its access \
                  Secret per SKR (kyma-one -> skr-1, kyma-two -> skr-2, ...; kyma-two, kyma-four, ... are labelled \
                  beta and internal), and runs catalogsync replicas against them under its ServiceAccount identity \
                  until Ctrl-C.\n\n\
                  The replicas share the SKRs as in a cluster, through the member, shard and coordinator Leases in \
                  catalogsync-system. Replica i is catalogsync-i, serves HTTP (metrics, probes, /debug/shards) on \
                  127.0.0.1:8080+i and logs to <dir>/catalogsync-i/catalogsync.log. Once every shard is held and \
                  every Kyma synced, local-up prints who holds which shard and syncs which Kyma, and the commands \
                  to look again.\n\n\
                  Ctrl-C sends SIGTERM to every replica (each hands its shards back and deletes its member Lease), \
                  waits for them, then stops the control planes; Ctrl-C again kills the replicas at once.",
    after_help = "Examples:\n  hack/local-up.sh                          one replica, two SKRs\n  \
                  hack/local-up.sh --replicas 3 --skrs 6    three replicas sharing six SKRs\n  \
                  hack/local-up.sh --no-controller          the clusters only; prints the command to run catalogsync"
)]
struct Args {
    /// With a subcommand, acts on control planes another `local-up` started.
    #[command(subcommand)]
    command: Option<Command>,
    /// Directory for all files (wiped at start, kept after exit). Default:
    /// `$XDG_CACHE_HOME/catalogsync/local-up` or `~/.cache/catalogsync/local-up`.
    #[arg(long, env = "CATALOGSYNC_LOCAL_UP_DIR")]
    dir: Option<PathBuf>,
    /// Do not start catalogsync (run it yourself, e.g. under a debugger, with the printed
    /// kubeconfig and command).
    #[arg(long, env = "CATALOGSYNC_LOCAL_UP_NO_CONTROLLER", conflicts_with = "replicas")]
    no_controller: bool,
    /// Number of catalogsync replicas (1 to 16). Each has its own identity (catalogsync-0, ...),
    /// HTTP port (8080, 8081, ...) and log file; they split the SKRs among themselves through
    /// the shard Leases.
    #[arg(long, env = "CATALOGSYNC_LOCAL_UP_REPLICAS", default_value = "1", value_parser = parse_replicas)]
    replicas: usize,
    /// Number of SKRs (1 to 8), each a kube-apiserver of about 300 MiB on the one etcd, with
    /// one Kyma and access Secret each.
    #[arg(long, env = "CATALOGSYNC_LOCAL_UP_SKRS", default_value = "2", value_parser = parse_skrs)]
    skrs: usize,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Writes as lifecycle-manager does today, against the control planes a running
    /// `local-up` started (in the same `--dir`), every `--period` until Ctrl-C: per Kyma, the
    /// SKR's namespace and catalog CRDs, the catalog copies (its body, field manager
    /// `catalog-sync`, forced; orphans pruned cluster-wide), and the Kyma's whole status,
    /// `ModuleCatalog` condition included (owner `lifecycle-manager`, forced). For following
    /// docs/migration.md on this machine.
    Klm(KlmArgs),
}

#[derive(clap::Args, Debug)]
struct KlmArgs {
    /// The directory of the running `local-up`.
    #[arg(long, env = "CATALOGSYNC_LOCAL_UP_DIR")]
    dir: Option<PathBuf>,
    /// Time between two passes over the Kymas (lifecycle-manager requeues a Ready Kyma after
    /// 5 minutes; shorter here to see it happen).
    #[arg(long, default_value = "30s", value_parser = catalogsync::config::parse_duration)]
    period: Duration,
    /// lifecycle-manager changed as docs/migration.md says: no catalog sync, and a status
    /// without the `ModuleCatalog` condition.
    #[arg(long)]
    changed: bool,
}

fn parse_count(s: &str, what: &str, max: usize, why: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("{s:?} is not a number of {what}"))?;
    match n {
        0 => Err(format!("at least one of the {what} is needed")),
        n if n > max => Err(format!("at most {max} {what}: {why}")),
        n => Ok(n),
    }
}

fn parse_replicas(s: &str) -> Result<usize, String> {
    parse_count(s, "replicas", MAX_REPLICAS, "they listen on 127.0.0.1:8080 and up, and 64 shards spread thin")
}

fn parse_skrs(s: &str) -> Result<usize, String> {
    let needed = s.parse().map_or(0, |n| summary::memory_needed_mib(n, 1));
    let why = format!(
        "each is a kube-apiserver of about 300 MiB, all on one etcd and this machine's cores ({s} would need about \
         {needed} MiB); the sharding tests (tests/sharding.rs) cover more SKRs with fewer apiservers"
    );
    parse_count(s, "SKRs", MAX_SKRS, &why)
}

/// Names of the Kymas, one per SKR, in SKR order.
const KYMA_NAMES: [&str; MAX_SKRS] =
    ["kyma-one", "kyma-two", "kyma-three", "kyma-four", "kyma-five", "kyma-six", "kyma-seven", "kyma-eight"];
/// The labels of every second Kyma (`kyma-two`, `kyma-four`, ...).
const BETA_AND_INTERNAL: &[(&str, &str)] = &[(BETA_LABEL, "true"), (INTERNAL_LABEL, "true")];

/// One Kyma of the demo and the SKR it points at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KymaSpec {
    name: &'static str,
    skr: String,
    labels: &'static [(&'static str, &'static str)],
}

/// The Kymas of `skrs` SKRs: `kyma-one` -> `skr-1`, `kyma-two` -> `skr-2` (labelled beta and
/// internal), ...; at most [`MAX_SKRS`].
fn kymas(skrs: usize) -> Vec<KymaSpec> {
    KYMA_NAMES
        .iter()
        .take(skrs)
        .enumerate()
        .map(|(i, name)| KymaSpec {
            name,
            skr: format!("skr-{}", i + 1),
            labels: if i % 2 == 1 { BETA_AND_INTERNAL } else { &[] },
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(Command::Klm(klm)) = args.command {
        return run_klm(klm).await;
    }
    let replicas = if args.no_controller { Vec::new() } else { replicas::infos(args.replicas) };
    replicas::check_addresses_free(&replicas)?;
    let bin = testenv::catalogsync_bin();
    if !args.no_controller && !bin.is_file() {
        bail!("{} not found; build it with `cargo build --bin catalogsync`", bin.display());
    }
    if let Some(available) = available_memory_mib()
        && let Some(warning) = summary::memory_warning(args.skrs, replicas.len(), available)
    {
        println!("{warning}");
    }
    let kymas = kymas(args.skrs);
    let base = args.dir.clone().unwrap_or_else(default_dir);
    prepare_dir(&base)?;
    testenv::process::keep_dirs_quietly();
    let mut interrupts = Interrupts::new()?;
    let started = Instant::now();

    println!("starting etcd, the KCP and {} SKRs", kymas.len());
    let (etcd, kcp, skrs) = tokio::select! {
        planes = start_control_planes(&base, &kymas) => planes?,
        () = interrupts.recv() => {
            println!("\ninterrupted while starting the control planes; stopped. Files in {}", base.display());
            return Ok(());
        }
    };
    println!("control planes ready after {:.1}s", started.elapsed().as_secs_f64());

    setup_kcp(&kcp, &skrs, &kymas).await?;
    let kubeconfigs = write_kubeconfigs(&base, &kcp, &skrs)?;
    let mut running = replicas::spawn_all(&bin, &replicas, KCP_NAMESPACE, &kubeconfigs.catalogsync, &base)?;
    let paths = Paths { base, bin, kubeconfigs };
    print_summary(&paths, &running);

    if running.is_empty() {
        interrupts.recv().await;
    } else {
        watch(&kcp, &mut running, &kymas, &mut interrupts, &paths).await;
    }
    let stopping = Instant::now();
    println!("\nstopping");
    if !running.is_empty() {
        let what = replicas_word(replicas::running(&mut running).len());
        println!("stopping {what} with SIGTERM (each hands its shards back; Ctrl-C again kills them)");
        replicas::stop_all(&mut running, &mut interrupts, SHUTDOWN_TIMEOUT).await;
        report_leases(&kcp).await;
    }
    let names: Vec<&str> = std::iter::once("kcp").chain(skrs.iter().map(ControlPlane::name)).collect();
    println!("stopping the control planes ({}) and etcd", names.join(", "));
    drop(skrs);
    drop(kcp);
    drop(etcd);
    println!("stopped in {:.1}s; files kept in {}", stopping.elapsed().as_secs_f64(), paths.base.display());
    Ok(())
}

/// "1 replica", "3 replicas".
fn replicas_word(n: usize) -> String {
    if n == 1 { "1 replica".to_owned() } else { format!("{n} replicas") }
}

/// Starts etcd, then the KCP and one SKR per Kyma, [`START_CONCURRENCY`] at a time.
async fn start_control_planes(base: &Path, kymas: &[KymaSpec]) -> Result<(Etcd, ControlPlane, Vec<ControlPlane>)> {
    let etcd = Etcd::start(Some(base)).await?;
    let names: Vec<&str> = std::iter::once("kcp").chain(kymas.iter().map(|k| k.skr.as_str())).collect();
    let mut planes: Vec<ControlPlane> = futures::stream::iter(names)
        .map(|name| ControlPlane::start_in(name, &etcd, Some(base)))
        .buffered(START_CONCURRENCY)
        .try_collect()
        .await?;
    let skrs = planes.split_off(1);
    let kcp = planes.pop().context("the KCP was started first")?;
    Ok((etcd, kcp, skrs))
}

/// MemAvailable from /proc/meminfo, in MiB.
fn available_memory_mib() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

fn default_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("catalogsync/local-up")
}

/// Wipes `dir` if it is ours (or empty), and marks it as ours.
fn prepare_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let empty =
            std::fs::read_dir(dir).with_context(|| format!("failed to read {}", dir.display()))?.next().is_none();
        if !empty && !dir.join(MARKER).exists() {
            bail!(
                "{} is not empty and was not created by local-up ({MARKER} missing); refusing to wipe it",
                dir.display()
            );
        }
        std::fs::remove_dir_all(dir).with_context(|| format!("failed to wipe {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    std::fs::write(dir.join(MARKER), "").context("failed to write the marker file")?;
    Ok(())
}

/// CRDs, RBAC, the sample catalog, and a Kyma plus access Secret per SKR.
async fn setup_kcp(kcp: &ControlPlane, skrs: &[ControlPlane], kymas: &[KymaSpec]) -> Result<()> {
    let crds = testenv::install_catalogsync_crds(kcp).await?;
    println!("installed CRDs into the KCP: {}", crds.join(", "));
    let client = kcp.admin_client();
    // The RBAC's Role lives in the KCP namespace, which a real KCP already has.
    testenv::create_namespace(&client, KCP_NAMESPACE).await?;
    testenv::create_namespace(&client, testenv::CATALOGSYNC_NAMESPACE).await?;
    let rbac = testenv::rbac_dir();
    if rbac.is_dir() {
        let n = testenv::apply_yaml_dir(kcp, &rbac).await?;
        println!("applied {n} RBAC objects from {}", rbac.display());
    } else {
        println!("WARNING: {} does not exist; binding catalogsync's identity to cluster-admin instead", rbac.display());
        testenv::apply_docs(&client, vec![json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "catalogsync-local-up-cluster-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": testenv::CATALOGSYNC_USER}],
        })])
        .await?;
    }
    let catalog = testenv::repo_root().join("hack/sample/catalog.yaml");
    let yaml = std::fs::read_to_string(&catalog).with_context(|| format!("failed to read {}", catalog.display()))?;
    let n = testenv::apply_yaml(kcp, &yaml).await?;
    println!("applied {n} catalog objects from {}", catalog.display());

    let mut docs = Vec::new();
    for (kyma, skr) in kymas.iter().zip(skrs) {
        let labels: serde_json::Map<String, serde_json::Value> =
            kyma.labels.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
        docs.push(json!({
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "kind": "Kyma",
            "metadata": {"name": kyma.name, "namespace": KCP_NAMESPACE, "labels": labels},
            "spec": {"channel": "regular"},
        }));
        let kubeconfig = skr.try_kubeconfig_yaml(kyma.name, &["system:masters"])?;
        docs.push(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": kyma.name, "namespace": KCP_NAMESPACE, "labels": {KYMA_NAME_LABEL: kyma.name}},
            "data": {KUBECONFIG_KEY: testenv::pki::base64(kubeconfig.as_bytes())},
        }));
        let labelled = if kyma.labels.is_empty() { "" } else { ", labelled beta and internal" };
        println!("Kyma {} -> {} ({}{labelled})", kyma.name, skr.name(), skr.url());
    }
    testenv::apply_docs(&client, docs).await?;
    Ok(())
}

/// Where things are: the directory, the catalogsync binary and the kubeconfigs.
struct Paths {
    base: PathBuf,
    bin: PathBuf,
    kubeconfigs: Kubeconfigs,
}

/// Kubeconfig files written for the user and for catalogsync.
struct Kubeconfigs {
    kcp: PathBuf,
    skrs: Vec<(String, PathBuf)>,
    catalogsync: PathBuf,
}

fn write_kubeconfigs(base: &Path, kcp: &ControlPlane, skrs: &[ControlPlane]) -> Result<Kubeconfigs> {
    let dir = base.join("kubeconfigs");
    std::fs::create_dir_all(&dir).context("failed to create the kubeconfig dir")?;
    let admin = |cp: &ControlPlane| -> Result<PathBuf> {
        Ok(testenv::write_kubeconfig(&dir, cp.name(), &cp.try_kubeconfig_yaml("admin", &["system:masters"])?))
    };
    Ok(Kubeconfigs {
        kcp: admin(kcp)?,
        skrs: skrs.iter().map(|s| Ok((s.name().to_owned(), admin(s)?))).collect::<Result<_>>()?,
        catalogsync: testenv::write_kubeconfig(
            &dir,
            "catalogsync",
            &kcp.try_kubeconfig_yaml(testenv::CATALOGSYNC_USER, testenv::CATALOGSYNC_GROUPS)?,
        ),
    })
}

fn print_summary(paths: &Paths, running: &[Replica]) {
    let Paths { base, bin, kubeconfigs } = paths;
    let kcp = kubeconfigs.kcp.display();
    println!("\n== local-up is running (files in {}) ==", base.display());
    println!("kubeconfigs (admin):");
    let width = kubeconfigs.skrs.iter().map(|(name, _)| name.len()).max().unwrap_or(0).max(3);
    println!("  {:<width$}  {kcp}", "kcp");
    for (name, path) in &kubeconfigs.skrs {
        println!("  {name:<width$}  {}", path.display());
    }
    println!("  catalogsync's identity ({}): {}", testenv::CATALOGSYNC_USER, kubeconfigs.catalogsync.display());
    if running.is_empty() {
        let first = &replicas::infos(1)[0];
        println!(
            "catalogsync not started; run it with:\n  KUBECONFIG={} cargo run -- {}",
            kubeconfigs.catalogsync.display(),
            replicas::args(first, KCP_NAMESPACE).join(" ")
        );
        println!(
            "  (more replicas: another --identity and --http-addr each; they share the shards through the Leases)"
        );
    } else {
        println!("catalogsync: {}, Leases in {LEASE_NAMESPACE}:", replicas_word(running.len()));
        for r in running {
            println!(
                "  {}: pid {}, http://{}, log {}",
                r.info.identity,
                r.pid(),
                r.info.http_addr,
                r.log_path().display()
            );
        }
        let args = replicas::args(&running[0].info, KCP_NAMESPACE);
        println!("  {} {}", bin.display(), args.join(" "));
    }
    println!("try:");
    for (_, path) in &kubeconfigs.skrs {
        println!("  kubectl --kubeconfig {} get moduletemplates,modulereleasemetas -n kyma-system", path.display());
    }
    println!("  kubectl --kubeconfig {kcp} get kymas -n {KCP_NAMESPACE} -o yaml");
    println!("  kubectl --kubeconfig {kcp} get moduletemplates,modulereleasemetas -n {KCP_NAMESPACE}");
    if running.is_empty() {
        // With replicas, these come with the shard summary once they are done.
        println!("  kubectl --kubeconfig {kcp} get leases -n {LEASE_NAMESPACE}");
        println!(
            "  KUBECONFIG={kcp} {} shards --lease-namespace {LEASE_NAMESPACE} --kcp-namespace {KCP_NAMESPACE}",
            bin.display()
        );
    }
    println!("audit logs: {}/catalogsync-*/audit.log", base.display());
    if running.is_empty() {
        println!("Ctrl-C stops everything.");
    }
}

/// Reads the shard table and the Kymas' `ModuleCatalog` conditions.
async fn observe(kcp: &kube::Client, kymas: &[KymaSpec]) -> Result<(Table, Vec<KymaState>)> {
    let table = table::read(kcp, LEASE_NAMESPACE, KCP_NAMESPACE).await.context("failed to read the Leases")?;
    let api: kube::Api<Kyma> = kube::Api::namespaced(kcp.clone(), KCP_NAMESPACE);
    let listed = api.list(&Default::default()).await.context("failed to list the Kymas")?.items;
    let synced = |name: &str| {
        listed.iter().filter(|k| k.metadata.name.as_deref() == Some(name)).any(|k| {
            let conditions = k.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
            conditions.iter().any(|c| c.type_ == MODULE_CATALOG_CONDITION && c.status == "True")
        })
    };
    let states = kymas
        .iter()
        .map(|k| KymaState { name: k.name.to_owned(), skr: k.skr.clone(), synced: synced(k.name) })
        .collect();
    Ok((table, states))
}

/// Until Ctrl-C: reports replicas that exit by themselves, prints the progress while the
/// replicas share the shards and sync the Kymas, and who holds which shard each time they are
/// done.
async fn watch(
    kcp: &ControlPlane,
    running: &mut [Replica],
    kymas: &[KymaSpec],
    interrupts: &mut Interrupts,
    paths: &Paths,
) {
    let client = kcp.admin_client();
    let started = Instant::now();
    let who = if running.len() == 1 { "the replica".to_owned() } else { format!("the {} replicas", running.len()) };
    println!("\nwaiting for {who} to take the shards and sync the {} Kymas", kymas.len());
    let mut ticker = tokio::time::interval(POLL_PERIOD);
    let mut last = String::new();
    // The assignment printed last (empty while not done), and whether none was printed yet.
    let mut printed = String::new();
    let mut first = true;
    let mut hinted = false;
    loop {
        tokio::select! {
            () = interrupts.recv() => return,
            _ = ticker.tick() => {}
        }
        replicas::report_exits(running);
        let infos: Vec<ReplicaInfo> = replicas::running(running);
        let alive: Vec<&str> = infos.iter().map(|r| r.identity.as_str()).collect();
        let observed = tokio::time::timeout(Duration::from_secs(5), observe(&client, kymas)).await;
        let (table, states) = match observed {
            Ok(Ok(observed)) => observed,
            Ok(Err(e)) => {
                println!("  {e:#}");
                continue;
            }
            Err(_) => {
                println!("  the KCP did not answer within 5s");
                continue;
            }
        };
        let progress = Progress::of(&table, &alive, &states);
        let line = progress.to_string();
        let elapsed = started.elapsed().as_secs_f64();
        if progress.is_done() {
            // Printed again whenever it changes: a replica that stops hands its shards over
            // within one poll, so the change may never show as a progress line.
            let assignment = summary::assignment(&table, &infos, &states, KCP_NAMESPACE);
            if assignment != printed {
                let again = if first { "" } else { " now" };
                println!("\n== who holds which shard{again} ({line}, after {elapsed:.1}s) ==");
                print!("{assignment}");
                if first {
                    print!(
                        "{}",
                        summary::look_again(&paths.bin, &paths.kubeconfigs.kcp, LEASE_NAMESPACE, KCP_NAMESPACE, &infos)
                    );
                    first = false;
                }
                println!("Ctrl-C stops everything.");
                printed = assignment;
            }
        } else {
            if line != last {
                println!("  [{elapsed:>6.1}s] {line}");
            }
            printed.clear();
            if !hinted && started.elapsed() > HINT_AFTER {
                hinted = true;
                println!(
                    "  still not done after {}s; the replicas' logs are in {}/catalogsync-*/catalogsync.log",
                    HINT_AFTER.as_secs(),
                    paths.base.display()
                );
            }
        }
        last = line;
    }
}

/// Prints whether the stopped replicas left their Leases as a graceful shutdown should: no
/// shard held, no member live.
async fn report_leases(kcp: &ControlPlane) {
    match table::read(&kcp.admin_client(), LEASE_NAMESPACE, KCP_NAMESPACE).await {
        Ok(t) => {
            let held: Vec<String> = t
                .holdings()
                .iter()
                .filter(|(holder, _)| !holder.is_empty())
                .map(|(holder, h)| format!("{} by {holder}", h.shards.len()))
                .collect();
            if held.is_empty() && t.members.is_empty() {
                println!("  all {} shard Leases released, no member Lease live", t.rows.len());
            }
            if !held.is_empty() {
                println!("  shards still held until their holder's member Lease expires: {}", held.join(", "));
            }
            if !t.members.is_empty() {
                println!("  member Leases still live: {}", t.members.join(", "));
            }
        }
        Err(e) => println!("  could not read the Leases: {e}"),
    }
}

/// `local-up klm`: lifecycle-manager's writes, every `--period`, until Ctrl-C.
async fn run_klm(args: KlmArgs) -> Result<()> {
    let base = args.dir.unwrap_or_else(default_dir);
    let kubeconfigs = base.join("kubeconfigs");
    let client = |name: &str| {
        let path = kubeconfigs.join(format!("{name}.kubeconfig"));
        async move {
            let yaml = std::fs::read_to_string(&path).with_context(|| {
                format!("{} not found: is `hack/local-up.sh` running with this --dir?", path.display())
            })?;
            let config = kube::config::Kubeconfig::from_yaml(&yaml)?;
            let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await?;
            Ok::<_, anyhow::Error>(kube::Client::try_from(config)?)
        }
    };
    let kcp = client("kcp").await?;
    // As many SKRs as that local-up started: the kubeconfigs skr-1, skr-2, ... it wrote.
    let kymas: Vec<KymaSpec> =
        kymas(MAX_SKRS).into_iter().filter(|k| kubeconfigs.join(format!("{}.kubeconfig", k.skr)).is_file()).collect();
    if kymas.is_empty() {
        bail!("no SKR kubeconfig in {}: is `hack/local-up.sh` running with this --dir?", kubeconfigs.display());
    }
    let mut skrs = Vec::with_capacity(kymas.len());
    for kyma in &kymas {
        skrs.push(client(&kyma.skr).await?);
    }
    let what = if args.changed { "changed: status without ModuleCatalog, no catalog sync" } else { "as today" };
    println!("writing as lifecycle-manager ({what}) every {:?}; Ctrl-C stops", args.period);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut pass = 0_u64;
    loop {
        pass += 1;
        for (kyma, skr) in kymas.iter().zip(&skrs) {
            let labels = kyma.labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
            match klm_pass(&kcp, skr, kyma.name, &labels, args.changed).await {
                Ok(done) => println!("pass {pass}: {}: {done}", kyma.name),
                Err(e) => println!("pass {pass}: {}: failed: {e:#}", kyma.name),
            }
        }
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            () = tokio::time::sleep(args.period) => {}
        }
    }
}

/// One lifecycle-manager pass over one Kyma.
async fn klm_pass(
    kcp: &kube::Client,
    skr: &kube::Client,
    kyma: &str,
    labels: &std::collections::BTreeMap<String, String>,
    changed: bool,
) -> Result<String> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    let mut status = testenv::klm::klm_status_body(kyma, KCP_NAMESPACE, 1, true);
    let mut done = String::new();
    if changed {
        let conditions = status["status"]["conditions"].as_array_mut().context("conditions")?;
        conditions.retain(|c| c["type"] != "ModuleCatalog");
    } else {
        let writer = testenv::klm::KlmCatalogWriter::for_kyma(
            kcp.clone(),
            KCP_NAMESPACE,
            skr.clone(),
            "kyma-system",
            labels,
            &Default::default(),
        )
        .await?;
        writer.setup().await?;
        let pass = writer.pass().await?;
        done = format!("{} applied, {} pruned; ", pass.applied, pass.deleted);
    }
    let ar = kube::api::ApiResource::erase::<catalogsync::api::Kyma>(&());
    let kymas: Api<DynamicObject> = Api::namespaced_with(kcp.clone(), KCP_NAMESPACE, &ar);
    let params = PatchParams::apply(testenv::klm::KLM_STATUS_MANAGER).force();
    kymas.patch_status(kyma, &params, &Patch::Apply(&status)).await.context("status write")?;
    Ok(format!("{done}status written"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("local-up").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_are_one_replica_and_two_skrs() {
        let args = parse(&[]).expect("no flags");
        assert_eq!((args.replicas, args.skrs, args.no_controller), (1, 2, false));
        let names: Vec<&str> = kymas(args.skrs).iter().map(|k| k.name).collect();
        assert_eq!(names, ["kyma-one", "kyma-two"], "the Kymas of the docs");
    }

    #[test]
    fn replicas_and_skrs_are_flags() {
        let args = parse(&["--replicas", "3", "--skrs", "6"]).expect("valid");
        assert_eq!((args.replicas, args.skrs), (3, 6));
        let args = parse(&["--skrs", "8", "--no-controller"]).expect("the clusters only, with eight SKRs");
        assert!(args.no_controller);
    }

    #[test]
    fn too_many_or_no_skrs_or_replicas_are_refused_with_the_reason() {
        let err = parse(&["--skrs", "9"]).expect_err("more than 8").to_string();
        assert!(err.contains("at most 8 SKRs: each is a kube-apiserver of about 300 MiB"), "{err}");
        let err = parse(&["--skrs", "0"]).expect_err("none").to_string();
        assert!(err.contains("at least one of the SKRs is needed"), "{err}");
        let err = parse(&["--replicas", "17"]).expect_err("more than 16").to_string();
        assert!(err.contains("at most 16 replicas"), "{err}");
        let err = parse(&["--replicas", "three"]).expect_err("not a number").to_string();
        assert!(err.contains("\"three\" is not a number of replicas"), "{err}");
    }

    #[test]
    fn no_controller_and_replicas_do_not_go_together() {
        let err = parse(&["--no-controller", "--replicas", "2"]).expect_err("conflict").to_string();
        assert!(err.contains("cannot be used with"), "{err}");
    }

    #[test]
    fn the_klm_subcommand_still_parses() {
        let args = parse(&["klm", "--period", "20s", "--changed"]).expect("klm");
        let Some(Command::Klm(klm)) = args.command else { panic!("not klm") };
        assert_eq!((klm.period, klm.changed), (Duration::from_secs(20), true));
    }

    #[test]
    fn every_second_kyma_is_labelled_beta_and_internal_and_each_has_its_own_skr() {
        let all = kymas(MAX_SKRS);
        assert_eq!(all.len(), MAX_SKRS);
        for (i, k) in all.iter().enumerate() {
            assert_eq!(k.skr, format!("skr-{}", i + 1));
            assert_eq!(k.labels.is_empty(), i % 2 == 0, "{k:?}");
        }
        assert_eq!(all[1].name, "kyma-two");
        assert_eq!(kymas(3).len(), 3);
    }
}
