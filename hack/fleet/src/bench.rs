//! The bench environment: one etcd and a real KCP apiserver holding the catalog, thousands of
//! Kymas and their access Secrets; the SKR side served by the simulator (or by real SKR
//! apiservers, for the calibration); catalogsync replicas and the baseline as real processes,
//! measured through `/proc` and their `/metrics`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde::Serialize;
use serde_json::{Value, json};

use crate::baseline::{BaselineAdmin, BaselineStats, Reconcile};
use crate::sim::{Faults, SimAdmin};
use crate::stats::{Percentiles, nearest_rank, unix_ms};
use catalogsync::api::KYMA_NAME_LABEL;
use catalogsync::catalog::CatalogKind;
use testenv::process::free_port;
use testenv::{
    self, CATALOGSYNC_GROUPS, CATALOGSYNC_USER, Catalogsync, ControlPlane, Etcd, ManagedProcess, apply_docs,
    catalogsync_bin, parse_yaml_docs,
};

/// Namespace of the Kymas, Secrets and catalog in the KCP (what `deploy/rbac/` grants).
pub const KCP_NS: &str = "kcp-system";
/// Namespace of catalogsync's Leases (what `deploy/rbac/` grants).
pub const LEASE_NS: &str = "catalogsync-system";
/// Namespace of the copies in every SKR.
pub const SYNC_NS: &str = testenv::fixtures::fleet::SYNC_NAMESPACE;
/// Field manager of the harness's own KCP writes.
pub const AUTHOR: &str = "fleet-bench";
/// The KCP user of the baseline (a cluster admin, as lifecycle-manager is in effect), apart
/// from the harness's `admin` so the audit log tells their writes apart.
pub const BASELINE_USER: &str = "lifecycle-manager";
/// Kymas and Secrets created at once.
const CREATE_CONCURRENCY: usize = 32;

/// CPU time and memory of one process, from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    /// User + system CPU seconds since the process started.
    pub cpu_seconds: f64,
    /// Resident set size now, MiB.
    pub rss_mib: f64,
    /// Peak resident set size (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
}

/// Reads [`ProcSample`] of `pid`.
///
/// # Errors
/// Fails when the process is gone.
pub fn proc_sample(pid: u32) -> Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("no process {pid}"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or_default();
    // `after` starts at field 3 (state), so field n is index n - 3. Clock ticks are 100 Hz on Linux.
    let cpu_seconds = (ticks(14 - 3) + ticks(15 - 3)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_default()
    };
    Ok(ProcSample { cpu_seconds, rss_mib: kib("VmRSS:") / 1024.0, peak_rss_mib: kib("VmHWM:") / 1024.0 })
}

/// Resets the peak resident set size (`VmHWM`) of `pid` to its current RSS (`clear_refs`,
/// value 5), so that a later [`proc_sample`] shows the peak since now.
///
/// # Errors
/// Fails when the process is gone or the kernel refuses.
pub fn reset_peak_rss(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").with_context(|| format!("resetting the peak RSS of {pid}"))
}

/// A Kyma name shaped like a runtime ID (a UUID), deterministic in `i`.
pub fn kyma_name(i: usize) -> String {
    let h = xxhash_rust::xxh3::xxh3_128(&(i as u64).to_le_bytes());
    let hex = format!("{h:032x}");
    format!("{}-{}-4{}-8{}-{}", &hex[0..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32])
}

/// Whether Kyma number `i` has the beta flag (one in ten) and the internal flag (one in twenty).
fn kyma_flags(i: usize) -> (bool, bool) {
    (i % 10 == 3, i % 20 == 7)
}

/// The SKR simulator as a child process.
pub struct Sim {
    process: ManagedProcess,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The CA of its serving certificate, PEM.
    pub ca_pem: String,
    /// Its admin API.
    pub admin: SimAdmin,
}

impl Sim {
    /// The PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// One catalogsync replica.
pub struct Replica {
    /// The process.
    pub process: Catalogsync,
    /// Its HTTP port (metrics, probes).
    pub http_port: u16,
}

/// The baseline as a child process.
pub struct Baseline {
    process: ManagedProcess,
    /// Its stats API.
    pub admin: BaselineAdmin,
}

impl Baseline {
    /// The PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops it (SIGTERM, then SIGKILL after 20 s).
    pub async fn stop(mut self) {
        let _ = self.process.terminate(Duration::from_secs(20)).await;
    }

    /// Polls its stats until `done` holds for them, and returns them.
    ///
    /// # Errors
    /// Fails when the stats cannot be read, or after `timeout`, naming `what` was awaited.
    pub async fn await_stats(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&BaselineStats) -> bool,
    ) -> Result<BaselineStats> {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.admin.stats().await?;
            if done(&stats) {
                return Ok(stats);
            }
            if Instant::now() > deadline {
                bail!(
                    "the baseline did not reach {what} within {}s ({} passes, {} queued)",
                    timeout.as_secs(),
                    stats.passes,
                    stats.queued
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until every Kyma known at its start had a pass, and returns the stats then.
    ///
    /// # Errors
    /// As [`Baseline::await_stats`].
    pub async fn await_round(&self, timeout: Duration) -> Result<BaselineStats> {
        self.await_stats("the end of its first round", timeout, |s| s.first_round_done_unix_ms.is_some()).await
    }
}

/// The whole environment of one `fleet run`.
pub struct Bench {
    /// Everything is written under here.
    pub dir: PathBuf,
    /// The etcd of the KCP and of any real SKR apiserver.
    etcd: Etcd,
    /// The KCP apiserver.
    pub kcp: ControlPlane,
    /// An admin client of the KCP.
    pub client: Client,
    /// The simulator, when started.
    pub sim: Option<Sim>,
    /// Running replicas by identity.
    pub replicas: BTreeMap<String, Replica>,
    /// Kyma names, in creation order.
    pub kymas: Vec<String>,
    /// Flags every replica gets after the fixed ones.
    pub replica_args: Vec<String>,
    replica_kubeconfig: PathBuf,
    baseline_kubeconfig: PathBuf,
}

impl Bench {
    /// Starts etcd and the KCP under `dir` and installs the CRDs, `deploy/rbac/` and the
    /// namespaces.
    ///
    /// # Errors
    /// Fails when a server does not start or an object cannot be written.
    pub async fn start(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let etcd = Etcd::start(Some(dir)).await?;
        let kcp = ControlPlane::start_in("kcp", &etcd, Some(dir)).await?;
        let client = kcp.admin_client();
        for ns in [KCP_NS, LEASE_NS] {
            testenv::create_namespace(&client, ns).await?;
        }
        testenv::install_catalogsync_crds(&kcp).await?;
        let mut docs = Vec::new();
        for file in testenv::apply::yaml_files(&testenv::rbac_dir())? {
            docs.extend(parse_yaml_docs(&std::fs::read_to_string(&file)?)?);
        }
        apply_docs(&client, docs).await.context("failed to apply deploy/rbac")?;
        let replica_kubeconfig =
            testenv::write_kubeconfig(dir, "catalogsync", &kcp.kubeconfig_yaml(CATALOGSYNC_USER, CATALOGSYNC_GROUPS));
        let baseline_kubeconfig =
            testenv::write_kubeconfig(dir, "baseline", &kcp.kubeconfig_yaml(BASELINE_USER, &["system:masters"]));
        Ok(Self {
            dir: dir.to_path_buf(),
            etcd,
            kcp,
            client,
            sim: None,
            replicas: BTreeMap::new(),
            kymas: Vec::new(),
            replica_args: Vec::new(),
            replica_kubeconfig,
            baseline_kubeconfig,
        })
    }

    fn catalog_api(&self, plural: &str) -> Api<DynamicObject> {
        let kind = if plural == CatalogKind::ModuleTemplate.plural() {
            CatalogKind::ModuleTemplate
        } else {
            CatalogKind::ModuleReleaseMeta
        };
        let ar = kind.api_resource();
        Api::namespaced_with(self.client.clone(), KCP_NS, &ar)
    }

    /// Writes the 25 x 3 catalog of `catalogsync::fixtures::fleet` into the KCP.
    ///
    /// # Errors
    /// Fails when an object cannot be written.
    pub async fn install_catalog(&self) -> Result<()> {
        let (mts, mrms) = testenv::fixtures::fleet::catalog();
        for obj in mts.iter().chain(mrms.iter()) {
            self.apply_catalog_object(obj).await?;
        }
        Ok(())
    }

    /// Applies one catalog object (its KCP identity metadata stripped).
    ///
    /// # Errors
    /// Fails when the KCP refuses it.
    pub async fn apply_catalog_object(&self, obj: &DynamicObject) -> Result<()> {
        let types = obj.types.clone().context("catalog object without type")?;
        let name = obj.metadata.name.clone().context("catalog object without name")?;
        let mut body = json!({
            "apiVersion": types.api_version,
            "kind": types.kind,
            "metadata": {"name": name, "namespace": KCP_NS},
        });
        if let Some(labels) = &obj.metadata.labels {
            body["metadata"]["labels"] = json!(labels);
        }
        if let Some(annotations) = &obj.metadata.annotations {
            body["metadata"]["annotations"] = json!(annotations);
        }
        if let Some(spec) = obj.data.get("spec") {
            body["spec"] = spec.clone();
        }
        let plural = if types.kind == "ModuleTemplate" { "moduletemplates" } else { "modulereleasemetas" };
        self.catalog_api(plural)
            .patch(&name, &PatchParams::apply(AUTHOR).force(), &Patch::Apply(&body))
            .await
            .with_context(|| format!("failed to apply {plural} {name}"))?;
        Ok(())
    }

    /// Sets annotation `key` of a KCP catalog object (a merge patch).
    ///
    /// # Errors
    /// Fails when the KCP refuses it.
    pub async fn annotate(&self, plural: &str, name: &str, key: &str, value: &str) -> Result<()> {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.catalog_api(plural)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("failed to annotate {plural} {name}"))?;
        Ok(())
    }

    /// Starts the simulator with `faults`, seeded with the two catalog CRDs (as the KCP
    /// serves them) and the sync namespace, as every SKR holds them already.
    ///
    /// # Errors
    /// Fails when it does not start within 30 s.
    pub async fn start_sim(&mut self, faults: &Faults) -> Result<()> {
        let seed = self.skr_seed().await?;
        let seed_path = self.dir.join("sim-seed.json");
        std::fs::write(&seed_path, serde_json::to_vec(&seed)?)?;
        let pki_dir = self.dir.join("sim-pki");
        let log = self.dir.join("sim.log");
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("sim")
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .arg("--self-signed-dir")
            .arg(&pki_dir)
            .arg("--seed-file")
            .arg(&seed_path)
            .args(["--latency", &format!("{}ms", faults.latency_ms)])
            .args(["--error-rate", &faults.error_rate.to_string()]);
        let process = ManagedProcess::spawn("sim", cmd, &log)?;
        let line = first_json_line(&log, Duration::from_secs(30), "the simulator's address line").await?;
        let listen = line["listen"].as_str().context("no listen address")?.to_owned();
        let admin: std::net::SocketAddr = line["admin"].as_str().context("no admin address")?.parse()?;
        let ca_pem = std::fs::read_to_string(pki_dir.join("ca.pem")).context("the simulator's CA")?;
        self.sim = Some(Sim { process, url: format!("https://{listen}"), ca_pem, admin: SimAdmin::new(admin) });
        Ok(())
    }

    /// What every SKR holds before catalogsync or the baseline first talks to it: the catalog
    /// CRDs as the KCP has them (catalogsync compares with those) and the sync namespace.
    async fn skr_seed(&self) -> Result<Value> {
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(self.client.clone());
        let mut seed = vec![json!({"manager": "lifecycle-manager", "object": {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYNC_NS}}})];
        for name in catalogsync::sync::executor::skr_crd_names() {
            let crd = crds.get(&name).await.with_context(|| format!("KCP CRD {name}"))?;
            let body = catalogsync::sync::executor::SkrCrds::render(&crd);
            seed.push(json!({"manager": "catalog-sync", "object": body}));
        }
        Ok(Value::Array(seed))
    }

    /// Starts real SKR apiserver `skr-<i>` on the bench's etcd and writes the seed every
    /// simulated SKR starts with (the catalog CRDs, the sync namespace) into it.
    ///
    /// # Errors
    /// Fails when it does not start or refuses the seed.
    pub async fn start_real_skr(&self, i: usize) -> Result<ControlPlane> {
        let name = &format!("skr-{i}");
        let skr = ControlPlane::start_in(name, &self.etcd, Some(&self.dir)).await?;
        let seed = self.skr_seed().await?;
        let docs: Vec<Value> = seed.as_array().into_iter().flatten().map(|e| e["object"].clone()).collect();
        apply_docs(&skr.admin_client(), docs).await.with_context(|| format!("failed to seed {name}"))?;
        Ok(skr)
    }

    /// The simulator.
    ///
    /// # Errors
    /// Fails when it was not started.
    pub fn sim(&self) -> Result<&Sim> {
        self.sim.as_ref().context("the simulator is not running")
    }

    /// The kubeconfig of simulated SKR `token` (a Kyma's SKR has the Kyma's name).
    ///
    /// # Errors
    /// Fails when the simulator is not running.
    pub fn sim_kubeconfig(&self, token: &str) -> Result<String> {
        let sim = self.sim()?;
        let q = |s: &str| Value::from(s).to_string();
        Ok(format!(
            "apiVersion: v1
kind: Config
clusters:
- name: skr
  cluster:
    server: {url}
    certificate-authority-data: {ca}
users:
- name: skr
  user:
    token: {token}
contexts:
- name: skr
  context:
    cluster: skr
    user: skr
current-context: skr
",
            url = q(&sim.url),
            ca = testenv::pki::base64(sim.ca_pem.as_bytes()),
            token = q(token),
        ))
    }

    /// Creates `count` more Kymas (continuing the numbering), each with an access Secret for
    /// its SKR in the simulator. Prints progress.
    ///
    /// # Errors
    /// Fails when one cannot be created.
    pub async fn add_sim_kymas(&mut self, count: usize) -> Result<()> {
        let first = self.kymas.len();
        let planned: Vec<(usize, String, String)> = (first..first + count)
            .map(|i| {
                let name = kyma_name(i);
                self.sim_kubeconfig(&name).map(|kc| (i, name, kc))
            })
            .collect::<Result<_>>()?;
        self.create_kymas(planned).await
    }

    /// Creates Kymas whose access Secrets hold the given kubeconfigs. Prints progress.
    ///
    /// # Errors
    /// Fails when one cannot be created.
    pub async fn create_kymas(&mut self, planned: Vec<(usize, String, String)>) -> Result<()> {
        let started = Instant::now();
        let total = planned.len();
        let client = self.client.clone();
        let kymas: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), KCP_NS, &ApiResource::erase::<catalogsync::api::Kyma>(&()));
        let secrets: Api<Secret> = Api::namespaced(client, KCP_NS);
        let done = std::sync::atomic::AtomicUsize::new(0);
        futures::stream::iter(planned.iter().map(Ok::<_, anyhow::Error>))
            .try_for_each_concurrent(CREATE_CONCURRENCY, |(i, name, kubeconfig)| {
                let (kymas, secrets, done) = (&kymas, &secrets, &done);
                async move {
                    let secret = json!({
                        "apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": format!("kubeconfig-{name}"), "namespace": KCP_NS,
                                     "labels": {KYMA_NAME_LABEL: name}},
                        "stringData": {"config": kubeconfig},
                    });
                    secrets
                        .patch(
                            &format!("kubeconfig-{name}"),
                            &PatchParams::apply(AUTHOR).force(),
                            &Patch::Apply(&secret),
                        )
                        .await
                        .with_context(|| format!("failed to write the Secret of {name}"))?;
                    let (beta, internal) = kyma_flags(*i);
                    let mut labels = testenv::fixtures::fleet::kyma_labels(beta, internal);
                    labels.insert("kyma-project.io/runtime-id".to_owned(), name.clone());
                    let kyma = json!({
                        "apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Kyma",
                        "metadata": {"name": name, "namespace": KCP_NS, "labels": labels},
                        "spec": {"channel": "regular"},
                    });
                    kymas
                        .patch(name, &PatchParams::apply(AUTHOR).force(), &Patch::Apply(&kyma))
                        .await
                        .with_context(|| format!("failed to write Kyma {name}"))?;
                    let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if n % 1000 == 0 || n == total {
                        eprintln!("  kymas: {n}/{total} created ({:.0}s)", started.elapsed().as_secs_f64());
                    }
                    Ok(())
                }
            })
            .await?;
        self.kymas.extend(planned.into_iter().map(|(_, name, _)| name));
        Ok(())
    }

    /// Starts replica `identity` (release or debug binary next to this one) with the bench
    /// flags and `extra`.
    ///
    /// # Errors
    /// Fails when it cannot be spawned.
    pub fn spawn_replica(&mut self, identity: &str, extra: &[String]) -> Result<()> {
        let http_port = free_port()?;
        let http_addr = format!("127.0.0.1:{http_port}");
        let mut args: Vec<String> = [
            "run",
            "--kcp-namespace",
            KCP_NS,
            "--sync-namespace",
            SYNC_NS,
            "--lease-namespace",
            LEASE_NS,
            "--restricted-modules",
            testenv::fixtures::fleet::RESTRICTED_MODULE,
            "--http-addr",
            &http_addr,
            "--identity",
            identity,
            "--log-filter",
            "info,kube_leader_election=warn",
            // The simulated SKRs listen on loopback.
            "--skr-allowed-destinations",
            "127.0.0.0/8",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(self.replica_args.iter().cloned());
        args.extend(extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let dir = self.dir.join("replicas");
        std::fs::create_dir_all(&dir)?;
        // A wrapper (a profiler, say) can stand in for the binary; it gets the same arguments.
        let bin = std::env::var_os("FLEET_CATALOGSYNC_BIN").map(PathBuf::from).unwrap_or_else(catalogsync_bin);
        let process =
            Catalogsync::spawn_bin(&bin, &args, &[("RUST_LOG", "info")], &self.replica_kubeconfig, Some(&dir))
                .with_context(|| format!("failed to spawn replica {identity}"))?;
        self.replicas.insert(identity.to_owned(), Replica { process, http_port });
        Ok(())
    }

    /// Waits until every replica answers `/readyz` with 200.
    ///
    /// # Errors
    /// Fails after `timeout`, or when a replica exited.
    pub async fn await_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        for (id, replica) in &mut self.replicas {
            loop {
                if !replica.process.is_running() {
                    bail!("replica {id} exited; log {}", replica.process.log_path().display());
                }
                if matches!(testenv::http::get_local(replica.http_port, "/readyz").await, Ok((200, _))) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("replica {id} not ready within {}s", timeout.as_secs());
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(())
    }

    /// SIGTERMs every replica.
    ///
    /// # Errors
    /// Fails when one did not exit in time.
    pub async fn terminate_all(&mut self) -> Result<()> {
        let ids: Vec<String> = self.replicas.keys().cloned().collect();
        let results = futures::future::join_all(ids.iter().map(|id| {
            let replica = self.replicas.remove(id);
            async move {
                match replica {
                    Some(mut r) => r.process.terminate(Duration::from_secs(40)).await.map(|_| ()),
                    None => Ok(()),
                }
            }
        }))
        .await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }

    /// The sum over all replicas of metric `name` whose labels contain every fragment.
    pub async fn metric_sum(&self, name: &str, labels: &[&str]) -> f64 {
        let mut total = 0.0;
        for replica in self.replicas.values() {
            total += metric(replica.http_port, name, labels).await;
        }
        total
    }

    /// [`ProcSample`] of every running replica, by identity.
    pub fn replica_samples(&self) -> BTreeMap<String, ProcSample> {
        self.replicas.iter().filter_map(|(id, r)| proc_sample(r.process.pid()).ok().map(|s| (id.clone(), s))).collect()
    }

    /// Resets the peak RSS of every replica ([`reset_peak_rss`]).
    ///
    /// # Errors
    /// Fails when a replica's peak cannot be reset.
    pub fn reset_replica_peaks(&self) -> Result<()> {
        self.replicas.values().try_for_each(|r| reset_peak_rss(r.process.pid()))
    }

    /// Starts the baseline against this KCP, reproducing the `reconcile` parts of KLM's Kyma
    /// reconcile.
    ///
    /// # Errors
    /// Fails when it does not start within 30 s.
    pub async fn start_baseline(
        &self,
        period: Duration,
        workers: usize,
        once: bool,
        reconcile: Reconcile,
    ) -> Result<Baseline> {
        let log = self.dir.join("baseline.log");
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("baseline")
            .arg("--kubeconfig")
            .arg(&self.baseline_kubeconfig)
            .args(["--kcp-namespace", KCP_NS, "--sync-namespace", SYNC_NS])
            .args(["--restricted-modules", testenv::fixtures::fleet::RESTRICTED_MODULE])
            .args(["--period", &format!("{}s", period.as_secs())])
            .args(["--workers", &workers.to_string(), "--admin", "127.0.0.1:0"])
            .args(["--reconcile", reconcile.as_str()]);
        if once {
            cmd.arg("--once");
        }
        let process = ManagedProcess::spawn("baseline", cmd, &log)?;
        let line = first_json_line(&log, Duration::from_secs(30), "the baseline's address line").await?;
        let admin: std::net::SocketAddr = line["admin"].as_str().context("no admin address")?.parse()?;
        Ok(Baseline { process, admin: BaselineAdmin::new(admin) })
    }

    /// KCP write requests (create, update, patch, delete) by `user` since `since_ms`, split
    /// into Lease writes and all others, from the KCP audit log.
    pub fn kcp_writes(&self, user: &str, since_ms: u64, until_ms: u64) -> (usize, usize) {
        let events = testenv::read_audit_log(&self.kcp.audit_log_path()).unwrap_or_default();
        let mut leases = 0;
        let mut other = 0;
        for e in events.iter().filter(|e| e.stage == "ResponseComplete" && e.is_write() && e.user.username == user) {
            let at = e
                .request_received_timestamp
                .parse::<k8s_openapi::jiff::Timestamp>()
                .map(|t| t.as_millisecond() as u64)
                .unwrap_or_default();
            if at < since_ms || at > until_ms {
                continue;
            }
            if e.resource() == "leases" {
                leases += 1;
            } else {
                other += 1;
            }
        }
        (leases, other)
    }
}

/// The sum of metric `name` whose labels contain every fragment, from `127.0.0.1:<port>/metrics`;
/// 0 when it cannot be read.
pub async fn metric(port: u16, name: &str, labels: &[&str]) -> f64 {
    let Ok((_, body)) = testenv::http::get_local(port, "/metrics").await else { return 0.0 };
    testenv::fleet::metric_sum(&body, name, labels)
}

/// Waits for the first line of `log` that parses as a JSON object.
async fn first_json_line(log: &Path, timeout: Duration, what: &str) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(v) = text.lines().find_map(|l| serde_json::from_str::<Value>(l).ok().filter(Value::is_object)) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {}s waiting for {what}; log {}:\n{}", timeout.as_secs(), log.display(), text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Watches every SKR of the simulator until each holds `name` of `resource` with mark
/// `value` (or at all when `None`); returns each SKR's latency in seconds from `t0_ms`.
///
/// # Errors
/// Fails after `timeout`, saying how many SKRs hold it.
pub async fn await_marks(
    sim: &SimAdmin,
    resource: &str,
    name: &str,
    value: Option<&str>,
    expected: usize,
    t0_ms: u64,
    timeout: Duration,
) -> Result<Vec<f64>> {
    let reached = marks_until(sim, resource, name, value, expected, t0_ms, Instant::now() + timeout).await?;
    if reached.latencies.len() < expected {
        bail!(
            "timed out after {}s: {} of {expected} SKRs hold {resource}/{name} (mark {value:?})",
            timeout.as_secs(),
            reached.latencies.len()
        );
    }
    Ok(reached.latencies)
}

/// The SKRs that held a mark by the end of a bounded window.
#[derive(Debug, Clone)]
pub struct Reached {
    /// Latency in seconds from the change, per SKR that holds it.
    pub latencies: Vec<f64>,
    /// SKRs expected to hold it.
    pub expected: usize,
    /// The window's length from the change, seconds.
    pub window_secs: f64,
}

impl Reached {
    /// p50 / p99 / max over all expected SKRs, those still without it counted as later than
    /// the window.
    pub fn spread(&self) -> Spread {
        let mut v = self.latencies.clone();
        v.sort_by(f64::total_cmp);
        let n = self.expected.max(v.len()).max(1);
        let at =
            |q: f64| v.get(nearest_rank(n, q)).map_or(Latency::LaterThan(self.window_secs), |x| Latency::Seconds(*x));
        Spread { p50: at(0.5), p99: at(0.99), max: at(1.0) }
    }
}

/// How long a change took to reach a quantile of the SKRs expected to get it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Latency {
    /// Reached after this many seconds.
    Seconds(f64),
    /// Not reached within the window watched, this many seconds long.
    LaterThan(f64),
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Latency::Seconds(s) => write!(f, "{s:.2}"),
            Latency::LaterThan(window) => write!(f, "> {window:.0}"),
        }
    }
}

/// The p50, p99 and max latency of a change over the SKRs expected to get it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Median.
    pub p50: Latency,
    /// 99th percentile.
    pub p99: Latency,
    /// The last SKR.
    pub max: Latency,
}

impl From<&Percentiles> for Spread {
    /// Latencies every expected SKR reached, in seconds.
    fn from(p: &Percentiles) -> Spread {
        Spread { p50: Latency::Seconds(p.p50), p99: Latency::Seconds(p.p99), max: Latency::Seconds(p.max) }
    }
}

/// Like [`await_marks`], but stops at `until` and returns how far the mark got.
///
/// # Errors
/// Fails when the simulator cannot be asked.
pub async fn marks_until(
    sim: &SimAdmin,
    resource: &str,
    name: &str,
    value: Option<&str>,
    expected: usize,
    t0_ms: u64,
    until: Instant,
) -> Result<Reached> {
    let mut last_report = Instant::now();
    loop {
        let marks = sim.marks(resource, name, value).await?;
        let now = Instant::now();
        if marks.holding >= expected || now >= until {
            let window_secs = (unix_ms().saturating_sub(t0_ms)) as f64 / 1000.0;
            let latencies =
                marks.first_held_unix_ms.iter().map(|t| (t.saturating_sub(t0_ms)) as f64 / 1000.0).collect();
            return Ok(Reached { latencies, expected, window_secs });
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!("  {} of {expected} SKRs hold {resource}/{name}", marks.holding);
            last_report = now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the replicas have finished at least `syncs` successful syncs in total and none
/// is in flight or queued.
///
/// # Errors
/// Fails after `timeout`.
pub async fn await_synced(bench: &Bench, syncs: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_report = Instant::now();
    loop {
        let done = bench.metric_sum("catalogsync_sync_runs_total", &["result=\"success\""]).await as usize;
        let in_flight = bench.metric_sum("catalogsync_syncs_in_flight", &[]).await as usize;
        if done >= syncs && in_flight == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {}s: {done} of {syncs} syncs done, {in_flight} in flight", timeout.as_secs());
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!("  {done} of {syncs} syncs done, {in_flight} in flight");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skrs_still_without_a_mark_count_as_later_than_the_window() {
        let all = Reached { latencies: (1..=100).map(f64::from).collect(), expected: 100, window_secs: 600.0 };
        let text = |s: Spread| [s.p50, s.p99, s.max].map(|l| l.to_string());
        assert_eq!(text(all.spread()), ["50.00".to_owned(), "99.00".into(), "100.00".into()]);
        let most = Reached { latencies: (1..=98).map(f64::from).collect(), expected: 100, window_secs: 600.0 };
        assert_eq!(text(most.spread()), ["50.00".to_owned(), "> 600".into(), "> 600".into()]);
        assert_eq!(most.spread().p99, Latency::LaterThan(600.0));
        let d = Percentiles::of(&(1..=100).map(f64::from).collect::<Vec<_>>());
        assert_eq!((d.p50, d.p99, d.max), (50.0, 99.0, 100.0));
    }
}
