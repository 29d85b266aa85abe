//! A node agent: the part of a scheduler and a kubelet that the deployment tests need, so
//! that the pods the real Deployment and ReplicaSet controllers create from `deploy/` run as
//! catalogsync processes.
//!
//! It registers one Ready Node, binds every unscheduled pod of its namespace to it and runs
//! each bound pod's one container as a process of the catalogsync binary (the only image it
//! knows). What a container runtime and kubelet would do, and what stands in for it here:
//!
//! | kubelet | here |
//! | --- | --- |
//! | image `.../catalogsync:<tag>` | the binary under test, with the container's `command`/`args` |
//! | `env`, with `fieldRef` (downward API) | the same values, and no other variable of the test |
//! | ServiceAccount token mounted for in-cluster config | a token from the TokenRequest API, bound to the pod, in a kubeconfig (`KUBECONFIG`) |
//! | a network namespace and IP per pod | a loopback address per pod (`127.0.1.N`, the pod IP), on which catalogsync listens at the container's port (`CATALOGSYNC_HTTP_ADDR`); SKRs on loopback, allowed through `CATALOGSYNC_SKR_ALLOWED_DESTINATIONS=127.0.0.0/8` |
//! | readiness and liveness probes (`httpGet`) | the same probes with the pod's timings, against the pod IP |
//! | `restartPolicy: Always` | a container that exits while its pod is not deleted is restarted |
//! | deletion: SIGTERM, SIGKILL after the grace period, then the final delete | the same |
//!
//! Not enforced: security contexts (users, read-only root), resources, volumes.
//! The agent polls the pod list (every [`SYNC_INTERVAL`]) rather than watching: it is test
//! infrastructure, and polling keeps it simple and its reactions bounded.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Node, Pod, Probe, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::controlplane::ControlPlane;
use super::http;
use super::process::ManagedProcess;
use super::runner::catalogsync_bin;

/// How often the agent compares the pods in the API with the processes it runs.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(250);
/// Wait before a container that exited is started again (a kubelet backs off from 10 s; the
/// tests only need it not to spin).
const RESTART_DELAY: Duration = Duration::from_secs(1);
/// Lifetime of the ServiceAccount tokens handed to pods.
const TOKEN_SECONDS: i64 = 3600;
/// The Node's name.
pub const NODE_NAME: &str = "catalogsync-test-node";

/// What the tests can see of one pod the agent ran.
#[derive(Clone, Debug)]
pub struct PodRun {
    /// Pod name (the replica's identity).
    pub name: String,
    /// The HTTP address of its container: the pod IP (a loopback address) and the
    /// container port.
    pub http: SocketAddr,
    /// Whether its readiness probe passes now.
    pub ready: bool,
    /// Whether its container runs now.
    pub running: bool,
    /// Container restarts (exits while the pod was not deleted).
    pub restarts: u32,
    /// How the last container process ended, once it has.
    pub exit: Option<ExitStatus>,
    /// For a deleted pod: whether its process exited within the grace period after SIGTERM
    /// (`false`: it was SIGKILLed), and how long it took.
    pub terminated: Option<(bool, Duration)>,
    /// Its log file.
    pub log: PathBuf,
}

/// The node agent; stops (SIGKILLing what it runs) on drop.
pub struct NodeAgent {
    runs: Arc<Mutex<BTreeMap<String, PodRun>>>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl NodeAgent {
    /// Registers the Node and starts the agent for the pods in `namespace` of `cp`; pod
    /// logs and kubeconfigs go into `dir`.
    ///
    /// # Errors
    /// Fails when the Node cannot be registered.
    pub async fn start(cp: &'static ControlPlane, namespace: &str, dir: &Path) -> Result<Self> {
        let client = cp.admin_client();
        register_node(&client).await?;
        let runs = Arc::new(Mutex::new(BTreeMap::new()));
        let cancel = CancellationToken::new();
        let mut agent = Agent {
            client,
            cp,
            namespace: namespace.to_owned(),
            dir: dir.to_path_buf(),
            pods: BTreeMap::new(),
            next_ip: 1,
            runs: Arc::clone(&runs),
        };
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = agent.sync().await {
                    eprintln!("node agent: {e:#}");
                }
                agent.publish();
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(SYNC_INTERVAL) => {}
                }
            }
            // Dropping the agent's pods SIGKILLs their processes.
        });
        Ok(Self { runs, cancel, task: Some(task) })
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PodRun>> {
        self.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every pod the agent has run (also deleted ones), by name.
    pub fn runs(&self) -> BTreeMap<String, PodRun> {
        self.lock().clone()
    }

    /// One pod's run.
    pub fn run(&self, pod: &str) -> Option<PodRun> {
        self.lock().get(pod).cloned()
    }

    /// The pods whose container runs now and passes its readiness probe.
    pub fn ready_pods(&self) -> Vec<String> {
        self.lock().values().filter(|r| r.running && r.ready).map(|r| r.name.clone()).collect()
    }

    /// GETs `path` from pod `pod`'s container port; returns status code and body.
    ///
    /// # Errors
    /// Fails when the agent never ran that pod or the request fails.
    pub async fn http_get(&self, pod: &str, path: &str) -> Result<(u16, String)> {
        let addr = self.run(pod).with_context(|| format!("the node agent never ran pod {pod}"))?.http;
        http::get(addr, path).await
    }

    /// Stops the agent and SIGKILLs what it runs.
    pub async fn stop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Creates the Node (fine if it exists) and marks it Ready.
async fn register_node(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux"}},
    });
    nodes
        .patch(NODE_NAME, &PatchParams::apply("node-agent").force(), &Patch::Apply(&node))
        .await
        .context("failed to register the node")?;
    let now = Timestamp::now().to_string();
    let status = json!({"status": {
        "capacity": {"cpu": "2", "memory": "24Gi", "pods": "110"},
        "allocatable": {"cpu": "2", "memory": "24Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "node agent of the catalogsync tests", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE_NAME}],
    }});
    nodes
        .patch_status(NODE_NAME, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("failed to mark the node Ready")?;
    Ok(())
}

/// Probe bookkeeping, kubelet style: a result changes after `threshold` equal outcomes in a row.
#[derive(Clone, Debug)]
struct ProbeState {
    path: String,
    port: u16,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
    next: Instant,
    successes: u32,
    failures: u32,
}

impl ProbeState {
    fn from(probe: &Probe, container: &Container, started: Instant) -> Result<Self> {
        let get = probe.http_get.as_ref().context("only httpGet probes are supported")?;
        let port = container_port(container, &get.port)?;
        let secs = |v: Option<i32>, default: i32| Duration::from_secs(u64::try_from(v.unwrap_or(default)).unwrap_or(1));
        Ok(Self {
            path: get.path.clone().unwrap_or_else(|| "/".to_owned()),
            port,
            period: secs(probe.period_seconds, 10),
            timeout: secs(probe.timeout_seconds, 1),
            success_threshold: u32::try_from(probe.success_threshold.unwrap_or(1)).unwrap_or(1),
            failure_threshold: u32::try_from(probe.failure_threshold.unwrap_or(3)).unwrap_or(3),
            next: started + secs(probe.initial_delay_seconds, 0),
            successes: 0,
            failures: 0,
        })
    }

    /// Records one outcome; returns the new result when it changed (`Some(true)`: now
    /// passing, `Some(false)`: now failing).
    fn record(&mut self, ok: bool, was_passing: bool) -> Option<bool> {
        if ok {
            self.successes += 1;
            self.failures = 0;
            (!was_passing && self.successes >= self.success_threshold).then_some(true)
        } else {
            self.failures += 1;
            self.successes = 0;
            (was_passing && self.failures >= self.failure_threshold).then_some(false)
        }
    }
}

/// A container port given as a number or by name.
fn container_port(
    container: &Container,
    port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
) -> Result<u16> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match port {
        IntOrString::Int(n) => u16::try_from(*n).context("probe port out of range"),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .with_context(|| format!("container has no port named {name}")),
    }
}

/// How a container is started: program, arguments, the whole environment.
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Launch {
    fn spawn(&self, name: &str, log: &Path) -> Result<ManagedProcess> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).env_clear().envs(self.env.iter().map(|(k, v)| (k, v)));
        ManagedProcess::spawn(name, cmd, log)
    }
}

/// One pod bound to this node.
struct PodProcess {
    uid: String,
    ip: Ipv4Addr,
    port: u16,
    container: String,
    image: String,
    launch: Launch,
    log: PathBuf,
    process: Option<ManagedProcess>,
    started: Timestamp,
    restarts: u32,
    exit: Option<ExitStatus>,
    restart_at: Option<Instant>,
    ready: bool,
    live: bool,
    readiness: Option<ProbeState>,
    liveness: Option<ProbeState>,
    /// SIGTERM sent at, grace period.
    terminating: Option<(Instant, Duration)>,
    terminated: Option<(bool, Duration)>,
    status_dirty: bool,
}

struct Agent {
    client: Client,
    cp: &'static ControlPlane,
    namespace: String,
    dir: PathBuf,
    pods: BTreeMap<String, PodProcess>,
    next_ip: u32,
    runs: Arc<Mutex<BTreeMap<String, PodRun>>>,
}

impl Agent {
    fn api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// One pass: bind, start, probe, restart, terminate.
    async fn sync(&mut self) -> Result<()> {
        let pods = self.api().list(&ListParams::default()).await.context("failed to list pods")?.items;
        let mut seen = Vec::new();
        for pod in &pods {
            let name = pod.name_any();
            let uid = pod.uid().unwrap_or_default();
            seen.push((name.clone(), uid.clone()));
            let spec = pod.spec.as_ref();
            let deleting = pod.metadata.deletion_timestamp.is_some();
            // One pod's failure is logged and retried on the next pass; the others go on.
            let done = match spec.and_then(|s| s.node_name.as_deref()) {
                None if !deleting => self.bind(&name).await,
                Some(NODE_NAME) if deleting => self.terminate(pod).await,
                Some(NODE_NAME) if !self.pods.contains_key(&name) => self.admit(pod).await,
                _ => Ok(()),
            };
            if let Err(e) = done {
                eprintln!("node agent: pod {name}: {e:#}");
            }
        }
        // Pods gone from the API (deleted with grace 0 elsewhere): stop their processes.
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(name, p)| !seen.iter().any(|(n, uid)| n == *name && *uid == p.uid))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(mut p) = self.pods.remove(&name) {
                if let Some(mut process) = p.process.take() {
                    p.exit = process.kill();
                }
                self.record(&name, &p);
            }
        }
        self.supervise();
        self.probe().await;
        self.write_statuses().await;
        Ok(())
    }

    async fn bind(&self, pod: &str) -> Result<()> {
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
        });
        match self.api().create_subresource::<Value, Value>("binding", pod, &PostParams::default(), &binding).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e).with_context(|| format!("failed to bind pod {pod}")),
        }
    }

    /// Takes a pod bound to this node: a token, a kubeconfig, an IP, then its container.
    async fn admit(&mut self, pod: &Pod) -> Result<()> {
        let name = pod.name_any();
        let spec = pod.spec.as_ref().context("pod without spec")?;
        anyhow::ensure!(spec.containers.len() == 1, "the node agent runs pods of one container");
        let container = spec.containers[0].clone();
        let service_account = spec.service_account_name.clone().unwrap_or_else(|| "default".to_owned());
        let ip = Ipv4Addr::new(127, 0, 1, u8::try_from(self.next_ip % 250 + 1).unwrap_or(1));
        self.next_ip += 1;
        let port =
            container.ports.iter().flatten().next().map_or(8080, |p| u16::try_from(p.container_port).unwrap_or(8080));
        let now = Instant::now();
        let readiness = container.readiness_probe.as_ref().map(|p| ProbeState::from(p, &container, now)).transpose()?;
        let liveness = container.liveness_probe.as_ref().map(|p| ProbeState::from(p, &container, now)).transpose()?;
        let kubeconfig = self.dir.join(format!("{name}.kubeconfig"));
        let launch = launch(pod, &container, ip, port, &kubeconfig)?;
        let uid = pod.uid().unwrap_or_default();
        let token = self.token(&name, &uid, &service_account).await?;
        let user = format!("system:serviceaccount:{}:{service_account}", self.namespace);
        std::fs::write(&kubeconfig, self.cp.kubeconfig_yaml_with_token(&user, &token))
            .with_context(|| format!("failed to write {}", kubeconfig.display()))?;
        let log = self.dir.join(format!("{name}.log"));
        let process = launch.spawn(&name, &log)?;
        let p = PodProcess {
            uid,
            ip,
            port,
            container: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            launch,
            log,
            process: Some(process),
            started: Timestamp::now(),
            restarts: 0,
            exit: None,
            restart_at: None,
            ready: false,
            live: true,
            readiness,
            liveness,
            terminating: None,
            terminated: None,
            status_dirty: true,
        };
        self.pods.insert(name, p);
        Ok(())
    }

    /// A token of the pod's ServiceAccount bound to the pod (it stops working with the pod).
    async fn token(&self, pod: &str, uid: &str, service_account: &str) -> Result<String> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(TOKEN_SECONDS),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    name: Some(pod.to_owned()),
                    uid: Some(uid.to_owned()),
                }),
            },
            ..TokenRequest::default()
        };
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace);
        let answer = sas
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .with_context(|| format!("failed to request a token of ServiceAccount {service_account} for pod {pod}"))?;
        answer.status.map(|s| s.token).context("a TokenRequest answer without a token")
    }

    /// SIGTERM once, SIGKILL after the grace period, then the final delete.
    async fn terminate(&mut self, pod: &Pod) -> Result<()> {
        let name = pod.name_any();
        let Some(p) = self.pods.get_mut(&name) else {
            // Never started here (or already finished): let the delete complete.
            return self.finish(&name, pod.uid().as_deref()).await;
        };
        let grace = Duration::from_secs(
            pod.metadata
                .deletion_grace_period_seconds
                .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or(30),
        );
        let (since, grace) = *p.terminating.get_or_insert_with(|| {
            p.restart_at = None;
            if let Some(process) = &p.process {
                let _ = process.signal("TERM");
            }
            (Instant::now(), grace)
        });
        let exited = match &mut p.process {
            Some(process) => match process.exit_status() {
                Some(status) => {
                    p.exit = Some(status);
                    p.terminated = Some((true, since.elapsed()));
                    true
                }
                None if since.elapsed() >= grace => {
                    p.exit = process.kill();
                    p.terminated = Some((false, since.elapsed()));
                    true
                }
                None => false,
            },
            None => {
                p.terminated.get_or_insert((true, since.elapsed()));
                true
            }
        };
        if exited {
            p.process = None;
            p.ready = false;
            let uid = p.uid.clone();
            if let Some(p) = self.pods.remove(&name) {
                self.record(&name, &p);
            }
            self.finish(&name, Some(&uid)).await?;
        }
        Ok(())
    }

    /// The kubelet's final delete of a terminated pod.
    async fn finish(&self, name: &str, uid: Option<&str>) -> Result<()> {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: uid.map(|uid| Preconditions { uid: Some(uid.to_owned()), resource_version: None }),
            ..DeleteParams::default()
        };
        match self.api().delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(e).with_context(|| format!("failed to delete pod {name}")),
        }
    }

    /// Restarts containers that exited (restartPolicy Always) or failed their liveness probe.
    fn supervise(&mut self) {
        for (name, p) in &mut self.pods {
            if p.terminating.is_some() {
                continue;
            }
            if let Some(process) = &mut p.process
                && let Some(status) = process.exit_status()
            {
                eprintln!("node agent: container of pod {name} exited ({status}); restarting it");
                p.exit = Some(status);
                p.process = None;
                p.ready = false;
                p.restart_at = Some(Instant::now() + RESTART_DELAY);
                p.status_dirty = true;
            }
            if p.process.is_none() && p.restart_at.is_some_and(|at| Instant::now() >= at) {
                p.restart_at = None;
                p.restarts += 1;
                p.started = Timestamp::now();
                let now = Instant::now();
                for probe in [&mut p.readiness, &mut p.liveness].into_iter().flatten() {
                    probe.next = now;
                    probe.successes = 0;
                    probe.failures = 0;
                }
                p.live = true;
                match p.launch.spawn(name, &p.log) {
                    Ok(process) => p.process = Some(process),
                    Err(e) => {
                        eprintln!("node agent: failed to restart pod {name}: {e:#}");
                        p.restart_at = Some(Instant::now() + RESTART_DELAY);
                    }
                }
                p.status_dirty = true;
            }
        }
    }

    /// Runs the probes that are due, all at once.
    async fn probe(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (name, p) in &self.pods {
            if p.process.is_none() || p.terminating.is_some() {
                continue;
            }
            for (liveness, probe) in [(false, &p.readiness), (true, &p.liveness)] {
                if let Some(probe) = probe
                    && probe.next <= now
                {
                    due.push((
                        name.clone(),
                        liveness,
                        SocketAddr::from((p.ip, probe.port)),
                        probe.path.clone(),
                        probe.timeout,
                    ));
                }
            }
        }
        let results =
            futures::future::join_all(due.into_iter().map(|(name, liveness, addr, path, timeout)| async move {
                let ok = matches!(
                    tokio::time::timeout(timeout, http::get(addr, &path)).await,
                    Ok(Ok((code, _))) if (200..400).contains(&code)
                );
                (name, liveness, ok)
            }))
            .await;
        for (name, liveness, ok) in results {
            let Some(p) = self.pods.get_mut(&name) else { continue };
            let (state, passing) = if liveness { (&mut p.liveness, p.live) } else { (&mut p.readiness, p.ready) };
            let Some(state) = state else { continue };
            state.next = Instant::now() + state.period;
            match state.record(ok, passing) {
                Some(now_passing) if liveness => {
                    p.live = now_passing;
                    if !now_passing && let Some(process) = &mut p.process {
                        eprintln!("node agent: liveness probe of pod {name} failed; killing its container");
                        let _ = process.kill();
                    }
                }
                Some(now_passing) => {
                    p.ready = now_passing;
                    p.status_dirty = true;
                }
                None => {}
            }
        }
    }

    /// Writes the status of every pod whose state changed.
    async fn write_statuses(&mut self) {
        let api = self.api();
        let names: Vec<String> = self.pods.iter().filter(|(_, p)| p.status_dirty).map(|(n, _)| n.clone()).collect();
        for name in names {
            let Some(p) = self.pods.get(&name) else { continue };
            let status = pod_status(p);
            match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await {
                Ok(_) => {
                    if let Some(p) = self.pods.get_mut(&name) {
                        p.status_dirty = false;
                    }
                }
                Err(e) => eprintln!("node agent: failed to write the status of pod {name}: {e}"),
            }
        }
    }

    fn record(&self, name: &str, p: &PodProcess) {
        let run = PodRun {
            name: name.to_owned(),
            http: SocketAddr::from((p.ip, p.port)),
            ready: p.ready,
            running: p.process.is_some(),
            restarts: p.restarts,
            exit: p.exit,
            terminated: p.terminated,
            log: p.log.clone(),
        };
        self.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name.to_owned(), run);
    }

    /// Publishes the state of every pod still here.
    fn publish(&mut self) {
        for (name, p) in &self.pods {
            self.record(name, p);
        }
    }
}

/// The pod status a kubelet would report.
fn pod_status(p: &PodProcess) -> Value {
    let now = Timestamp::now().to_string();
    let flag = |b: bool| if b { "True" } else { "False" };
    let running = p.process.is_some();
    let state = if running {
        json!({"running": {"startedAt": p.started.to_string()}})
    } else {
        json!({"waiting": {"reason": "CrashLoopBackOff"}})
    };
    json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": p.ip.to_string(),
        "podIPs": [{"ip": p.ip.to_string()}],
        "startTime": p.started.to_string(),
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag(p.ready), "lastTransitionTime": now},
            {"type": "Ready", "status": flag(p.ready), "lastTransitionTime": now},
        ],
        "containerStatuses": [{
            "name": p.container,
            "image": p.image,
            "imageID": "",
            "ready": p.ready,
            "started": running,
            "restartCount": p.restarts,
            "state": state,
        }],
    }})
}

/// The program an image stands for: the catalogsync binary for any `.../catalogsync[:tag]`.
fn program(image: &str) -> Result<PathBuf> {
    let repository = image.split('@').next().unwrap_or(image);
    let last = repository.rsplit('/').next().unwrap_or(repository);
    let name = last.split(':').next().unwrap_or(last);
    anyhow::ensure!(name == "catalogsync", "the node agent runs only the catalogsync image, not {image}");
    Ok(catalogsync_bin())
}

/// A value of the downward API.
fn field_value(pod: &Pod, ip: Ipv4Addr, path: &str) -> Result<String> {
    let spec = pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" => ip.to_string(),
        "status.hostIP" => "127.0.0.1".to_owned(),
        other => anyhow::bail!("the node agent does not serve fieldRef {other}"),
    })
}

/// The container's command line and environment, as the runtime would start it.
fn launch(pod: &Pod, c: &Container, ip: Ipv4Addr, port: u16, kubeconfig: &Path) -> Result<Launch> {
    let image = c.image.as_deref().context("container without image")?;
    let program = program(image)?;
    // `command` would replace the image's entrypoint (the binary itself): only its arguments
    // after the program name can be honoured.
    let mut args: Vec<String> = c.command.iter().flatten().skip(1).cloned().collect();
    args.extend(c.args.iter().flatten().cloned());
    let mut env = Vec::new();
    for var in c.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                let field =
                    from.field_ref.as_ref().with_context(|| format!("env {}: only fieldRef is supported", var.name))?;
                field_value(pod, ip, &field.field_path)?
            }
            (None, None) => String::new(),
        };
        env.push((var.name.clone(), value));
    }
    env.push(("KUBECONFIG".to_owned(), kubeconfig.display().to_string()));
    env.push(("CATALOGSYNC_HTTP_ADDR".to_owned(), SocketAddr::from((ip, port)).to_string()));
    // The test SKRs listen on loopback: where a pod network would route to public SKR
    // addresses, the replicas are allowed loopback instead.
    env.push(("CATALOGSYNC_SKR_ALLOWED_DESTINATIONS".to_owned(), super::SKR_DESTINATIONS.to_owned()));
    Ok(Launch { program, args, env })
}
