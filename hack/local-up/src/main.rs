//! `local-up`: a KCP and two SKRs on this machine, with CRDs, RBAC, a sample catalog, two
//! Kymas and their access Secrets, and catalogsync running against them. Run it through
//! `hack/local-up.sh`, which builds the binaries first; Ctrl-C stops everything.
//!
//! Everything lives under one directory (default `~/.cache/catalogsync/local-up`), wiped at
//! start and kept after exit so logs and audit logs can be read afterwards.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use catalogsync::api::{BETA_LABEL, INTERNAL_LABEL, KUBECONFIG_KEY, KYMA_NAME_LABEL};
use clap::Parser;
use serde_json::json;

use testenv::{Catalogsync, ControlPlane, Etcd};

/// Namespace of Kymas, access Secrets and the catalog in the KCP.
const KCP_NAMESPACE: &str = "kcp-system";
/// catalogsync's HTTP address (metrics and probes).
const HTTP_ADDR: &str = "127.0.0.1:8080";
/// The catalogsync command line. Kept in one place: the flags are still settling.
/// The local SKRs listen on loopback, which the default `--skr-allowed-destinations`
/// (`public`) refuses.
const CATALOGSYNC_ARGS: &[&str] = &[
    "run",
    "--kcp-namespace",
    KCP_NAMESPACE,
    "--http-addr",
    HTTP_ADDR,
    "--resync-period",
    "60s",
    "--skr-allowed-destinations",
    "127.0.0.0/8",
];
/// Marker file that identifies a directory `local-up` may wipe.
const MARKER: &str = ".catalogsync-local-up";
/// How long catalogsync gets to shut down after SIGTERM.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// Starts a local KCP and two SKRs and runs catalogsync against them until Ctrl-C.
#[derive(Parser, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct Args {
    /// With a subcommand, acts on control planes another `local-up` started.
    #[command(subcommand)]
    command: Option<Command>,
    /// Directory for all files (wiped at start, kept after exit). Default:
    /// `$XDG_CACHE_HOME/catalogsync/local-up` or `~/.cache/catalogsync/local-up`.
    #[arg(long, env = "CATALOGSYNC_LOCAL_UP_DIR")]
    dir: Option<PathBuf>,
    /// Do not start catalogsync (run it yourself, e.g. under a debugger, with the printed
    /// kubeconfig).
    #[arg(long, env = "CATALOGSYNC_LOCAL_UP_NO_CONTROLLER")]
    no_controller: bool,
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

/// One Kyma of the demo and the SKR it points at.
struct KymaSpec {
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
}

const KYMAS: [KymaSpec; 2] = [
    KymaSpec { name: "kyma-one", labels: &[] },
    KymaSpec { name: "kyma-two", labels: &[(BETA_LABEL, "true"), (INTERNAL_LABEL, "true")] },
];

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(Command::Klm(klm)) = args.command {
        return run_klm(klm).await;
    }
    let base = args.dir.clone().unwrap_or_else(default_dir);
    prepare_dir(&base)?;
    testenv::process::keep_dirs_quietly();
    let started = Instant::now();

    let etcd = Etcd::start(Some(&base)).await?;
    let (kcp, skr1, skr2) = tokio::try_join!(
        ControlPlane::start_in("kcp", &etcd, Some(&base)),
        ControlPlane::start_in("skr-1", &etcd, Some(&base)),
        ControlPlane::start_in("skr-2", &etcd, Some(&base)),
    )?;
    let skrs = [&skr1, &skr2];
    println!("control planes ready after {:.1}s", started.elapsed().as_secs_f64());

    setup_kcp(&kcp, &skrs).await?;
    let kubeconfigs = write_kubeconfigs(&base, &kcp, &skrs)?;
    let mut controller = if args.no_controller {
        None
    } else {
        let bin = testenv::catalogsync_bin();
        if !bin.is_file() {
            bail!("{} not found; build it with `cargo build --bin catalogsync`", bin.display());
        }
        Some(Catalogsync::spawn_bin(&bin, CATALOGSYNC_ARGS, &[], &kubeconfigs.catalogsync, Some(&base))?)
    };
    print_summary(&base, &kubeconfigs, controller.as_ref());

    wait_for_ctrl_c(controller.as_mut()).await;
    println!("\nstopping");
    if let Some(mut controller) = controller {
        match controller.terminate(SHUTDOWN_TIMEOUT).await {
            Ok(status) => println!("catalogsync exited: {status}"),
            Err(e) => println!("{e}"),
        }
    }
    drop((skr2, skr1, kcp));
    drop(etcd);
    println!("stopped; files kept in {}", base.display());
    Ok(())
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
async fn setup_kcp(kcp: &ControlPlane, skrs: &[&ControlPlane; 2]) -> Result<()> {
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
    for (kyma, skr) in KYMAS.iter().zip(skrs) {
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
        println!("Kyma {} -> {} ({})", kyma.name, skr.name(), skr.url());
    }
    testenv::apply_docs(&client, docs).await?;
    Ok(())
}

/// Kubeconfig files written for the user and for catalogsync.
struct Kubeconfigs {
    kcp: PathBuf,
    skrs: Vec<(String, PathBuf)>,
    catalogsync: PathBuf,
}

fn write_kubeconfigs(base: &Path, kcp: &ControlPlane, skrs: &[&ControlPlane; 2]) -> Result<Kubeconfigs> {
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

fn print_summary(base: &Path, kubeconfigs: &Kubeconfigs, controller: Option<&Catalogsync>) {
    let kcp = kubeconfigs.kcp.display();
    println!("\n== local-up is running (files in {}) ==", base.display());
    println!("kubeconfigs (admin):");
    println!("  kcp:   {kcp}");
    for (name, path) in &kubeconfigs.skrs {
        println!("  {name}: {}", path.display());
    }
    println!("  catalogsync's identity ({}): {}", testenv::CATALOGSYNC_USER, kubeconfigs.catalogsync.display());
    match controller {
        Some(c) => {
            println!("catalogsync: pid {}, log {}", c.pid(), c.log_path().display());
            println!("  {}", CATALOGSYNC_ARGS.join(" "));
            println!("metrics: http://{HTTP_ADDR}/metrics   (also /readyz, /livez)");
        }
        None => println!(
            "catalogsync not started; run it with:\n  KUBECONFIG={} cargo run -- {}",
            kubeconfigs.catalogsync.display(),
            CATALOGSYNC_ARGS.join(" ")
        ),
    }
    println!("try:");
    for (_, path) in &kubeconfigs.skrs {
        println!("  kubectl --kubeconfig {} get moduletemplates,modulereleasemetas -n kyma-system", path.display());
    }
    println!("  kubectl --kubeconfig {kcp} get kymas -n {KCP_NAMESPACE} -o yaml");
    println!("  kubectl --kubeconfig {kcp} get moduletemplates,modulereleasemetas -n {KCP_NAMESPACE}");
    println!("  kubectl --kubeconfig {kcp} get leases -A");
    println!("audit logs: {}/catalogsync-*/audit.log", base.display());
    println!("Ctrl-C stops everything.");
}

/// Waits for Ctrl-C, reporting (once) if catalogsync exits by itself meanwhile.
async fn wait_for_ctrl_c(mut controller: Option<&mut Catalogsync>) {
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut reported = false;
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return,
            _ = ticker.tick() => {
                if let Some(c) = controller.as_deref_mut()
                    && !reported
                    && let Some(status) = c.exit_status()
                {
                    reported = true;
                    println!(
                        "\ncatalogsync exited by itself ({status}); the clusters keep running until Ctrl-C. Log {}:\n{}",
                        c.log_path().display(),
                        testenv::process::log_tail(c.log_path(), 20)
                    );
                }
            }
        }
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
    let skrs = [client("skr-1").await?, client("skr-2").await?];
    let what = if args.changed { "changed: status without ModuleCatalog, no catalog sync" } else { "as today" };
    println!("writing as lifecycle-manager ({what}) every {:?}; Ctrl-C stops", args.period);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut pass = 0_u64;
    loop {
        pass += 1;
        for (kyma, skr) in KYMAS.iter().zip(&skrs) {
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
