//! A real Kubernetes node for the deployment tests: containerd and runc run the pods, the
//! kubelet and kube-proxy (built from the Kubernetes Go modules like the apiserver,
//! `hack/k8s-bins.sh`) manage them, and kube-scheduler binds them.
//!
//! # Where it runs
//! Everything that has an address other than loopback lives in a network namespace that
//! [`Node::start`] creates, together with a private mount namespace: a holder process
//! (`unshare --net --mount`) keeps both alive, and containerd, the kubelet and kube-proxy
//! enter them with `nsenter`. In that network namespace:
//!
//! | address | what |
//! | --- | --- |
//! | [`NODE_IP`] | the node's InternalIP; the kubelet listens there |
//! | [`KCP_ADDRESS`] | the apiserver's advertise address, so the endpoint of the `kubernetes` Service (`10.0.0.1:443`, which kube-proxy maps to it); a forwarder relays it to the KCP's loopback port |
//! | [`SKR_ADDRESS`] | the SKR apiservers, relayed the same way to their loopback ports |
//! | [`POD_CIDR`] | the pods, on a CNI bridge |
//!
//! The forwarders are tasks of the test process whose listening sockets were opened inside
//! the namespace (`setns` on a short-lived thread). The test reaches pod and Prometheus
//! addresses the other way round, through loopback ports that [`Node::forward`] opens.
//! Nothing is bound to the machine's own interfaces and no route of the host changes; the
//! bridge, the pods' veths and kube-proxy's iptables rules all disappear with the namespace.
//!
//! # Host settings
//! Some settings are global: the kubelet sets six kernel sysctls ([`HOST_SYSCTLS`]) and
//! creates pod cgroups (under a cgroup root of this node's own). [`Node::start`] saves the
//! sysctls first and writes a cleanup script that kills every process of the node (found by
//! its mount namespace and its cgroups: containerd's shims outlive containerd), removes the
//! cgroups and writes the saved sysctls back. It runs when the node is dropped and, through
//! a watchdog, when the test process dies in any other way; [`Node::shutdown`] runs it and
//! checks that the host is as it was.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::json;
use tokio::task::JoinHandle;

use super::controlplane::{ControlPlane, ControlPlaneOptions, KUBERNETES_SERVICE_IP};
use super::process::{ManagedProcess, TestDir, Watchdog, k8s_binary};

/// The Node's name.
pub const NODE_NAME: &str = "catalogsync-test-node";
/// The node's InternalIP, inside the node's network namespace.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 217, 0, 10);
/// The KCP apiserver's advertise address, inside the node's network namespace.
pub const KCP_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 217, 0, 1);
/// Where the pods reach the SKR apiservers, inside the node's network namespace.
pub const SKR_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 217, 0, 2);
/// The pods' addresses (CNI bridge and host-local IPAM).
pub const POD_CIDR: &str = "10.218.0.0/24";
/// The sandbox image containerd runs for every pod (packed by `hack/image.sh pause`).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// The global sysctls the kubelet sets (`setupKernelTunables`), saved and restored.
pub const HOST_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
/// How long the node may take to become Ready (12 s measured on an idle machine).
pub const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The options the shared test environment needs for pods on a [`Node`] to reach its
/// control planes: the KCP advertises [`KCP_ADDRESS`] and mounts ServiceAccount tokens, and
/// every serving certificate names the addresses the pods use.
pub fn env_options() -> super::EnvOptions {
    super::EnvOptions {
        kcp: ControlPlaneOptions {
            advertise_address: Some(KCP_ADDRESS.into()),
            extra_sans: vec![KCP_ADDRESS.into(), KUBERNETES_SERVICE_IP],
            service_account_admission: true,
        },
        skr: ControlPlaneOptions { extra_sans: vec![SKR_ADDRESS.into()], ..ControlPlaneOptions::default() },
    }
}

/// What a pod watcher saw of one pod over its life.
#[derive(Clone, Debug, Default)]
pub struct PodRecord {
    /// The pod's IP, once it had one.
    pub ip: Option<IpAddr>,
    /// Whether its Ready condition is true now.
    pub ready: bool,
    /// The highest container restart count reported.
    pub restarts: i32,
    /// When its deletion was asked for (metadata.deletionTimestamp minus the grace period).
    pub deletion_requested: Option<Timestamp>,
    /// The grace period of that deletion.
    pub grace_seconds: Option<i64>,
    /// The last terminated state the kubelet reported for its container: exit code, reason
    /// and when it finished.
    pub terminated: Option<(i32, String, Timestamp)>,
    /// Whether the pod is gone from the API.
    pub gone: bool,
}

/// How the kernel sees one process running in a pod of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerProcess {
    /// Its PID on the host.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`).
    pub comm: String,
    /// Real, effective, saved and filesystem user IDs (`Uid:` of `/proc/<pid>/status`).
    pub uids: String,
    /// Its effective capabilities (`CapEff:`, hex).
    pub cap_eff: String,
    /// `NoNewPrivs:` (1: no privilege escalation).
    pub no_new_privs: String,
    /// `Seccomp:` (2: a filter is loaded).
    pub seccomp: String,
    /// Whether its root file system is mounted read-only.
    pub root_read_only: bool,
}

/// A real node; see the module docs. Stops everything and restores the host on drop.
pub struct Node {
    dir: TestDir,
    holder: ManagedProcess,
    netns: File,
    daemons: Vec<ManagedProcess>,
    cleanup: PathBuf,
    janitor: Option<Watchdog>,
    saved_sysctls: Vec<(String, String)>,
    cgroup: String,
    tasks: Vec<JoinHandle<()>>,
    forwards: Mutex<BTreeMap<SocketAddr, SocketAddr>>,
    pods: Arc<Mutex<BTreeMap<String, PodRecord>>>,
    kcp_port: u16,
    down: bool,
}

impl Node {
    /// Starts the node for `kcp` (whose options came from [`env_options`]), relays the
    /// `skrs` into its network namespace, imports the OCI `images` (archives from
    /// `hack/image.sh`; the pause image among them) into its containerd, waits until the
    /// Node is Ready and watches the pods of `namespace`.
    ///
    /// # Errors
    /// Fails when a tool is missing (the message names the Debian packages), the machine
    /// does not allow namespaces or cgroups, or the node is not Ready within
    /// [`NODE_READY_TIMEOUT`] (the message carries the kubelet's log).
    pub async fn start(
        kcp: &ControlPlane,
        skrs: &[&ControlPlane],
        images: &[PathBuf],
        namespace: &str,
    ) -> Result<Self> {
        check_prerequisites()?;
        let dir = TestDir::new("node", Some(kcp.dir()))?;
        let d = dir.path().to_path_buf();
        for sub in ["containerd", "kubelet", "pod-logs", "cni/net.d", "cni/ipam", "forward"] {
            std::fs::create_dir_all(d.join(sub)).with_context(|| format!("failed to create {sub} in the node dir"))?;
        }
        let cgroup = format!("catalogsync-node-{}-{:08x}", std::process::id(), rand::random::<u32>());
        let saved_sysctls = read_sysctls()?;
        let saved: String = saved_sysctls.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        std::fs::write(d.join("sysctls.saved"), saved).context("failed to save the sysctls")?;
        let cleanup = d.join("cleanup.sh");
        std::fs::write(&cleanup, cleanup_script(&d, &cgroup)).context("failed to write the cleanup script")?;
        // From here on, however this process ends, the cleanup runs.
        let janitor = Watchdog::run_at_exit(&cleanup)?;
        create_cgroup_root(&cgroup)?;

        let holder = start_holder(&d)?;
        let netns = File::open(format!("/proc/{}/ns/net", holder.pid())).context("failed to open the node's netns")?;
        let mntns = std::fs::read_link(format!("/proc/{}/ns/mnt", holder.pid())).context("node mount namespace")?;
        ensure!(
            std::fs::read_link("/proc/self/ns/mnt").ok().as_ref() != Some(&mntns),
            "the node's holder did not get a mount namespace of its own"
        );
        std::fs::write(d.join("mntns"), mntns.to_string_lossy().as_bytes()).context("failed to record the mount ns")?;

        let mut node = Self {
            dir,
            holder,
            netns,
            daemons: Vec::new(),
            cleanup,
            janitor: Some(janitor),
            saved_sysctls,
            cgroup,
            tasks: Vec::new(),
            forwards: Mutex::new(BTreeMap::new()),
            pods: Arc::new(Mutex::new(BTreeMap::new())),
            kcp_port: kcp.port(),
            down: false,
        };
        node.relay(SocketAddr::new(KCP_ADDRESS.into(), kcp.port()), kcp.port())?;
        for skr in skrs {
            node.relay(SocketAddr::new(SKR_ADDRESS.into(), skr.port()), skr.port())?;
        }
        node.start_containerd(images).await?;
        node.start_kubelet(kcp)?;
        node.start_kube_proxy(kcp)?;
        node.start_scheduler(kcp)?;
        node.await_ready(kcp).await?;
        node.watch_pods(kcp, namespace);
        Ok(node)
    }

    /// The node's directory (daemon logs, containerd's and the kubelet's state, pod logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The URL at which pods reach `skr`.
    pub fn skr_url(skr: &ControlPlane) -> String {
        format!("https://{SKR_ADDRESS}:{}", skr.port())
    }

    /// A command that runs inside the node's network and mount namespaces.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let prefix = self.command_prefix();
        let mut cmd = Command::new(&prefix[0]);
        cmd.args(&prefix[1..]).arg(program);
        cmd
    }

    /// The command prefix of [`Node::command`]: `nsenter` into the node's namespaces.
    pub fn command_prefix(&self) -> Vec<String> {
        ["nsenter", "-t", &self.holder.pid().to_string(), "-n", "-m", "--"].map(str::to_owned).to_vec()
    }

    /// A kubeconfig for the KCP as admin, for processes inside the node's network namespace.
    pub fn kcp_kubeconfig(&self, kcp: &ControlPlane, user: &str) -> Result<PathBuf> {
        let yaml =
            kcp.kubeconfig_yaml_at(&format!("https://{KCP_ADDRESS}:{}", self.kcp_port), user, &["system:masters"])?;
        let path = self.dir().join(format!("{}.kubeconfig", user.replace(':', "-")));
        std::fs::write(&path, yaml).with_context(|| format!("failed to write {}", path.display()))?;
        Ok(path)
    }

    /// A loopback address of this process that leads to `target` inside the node's network
    /// namespace (a pod's port, or a server run with [`Node::command`]). One per target.
    ///
    /// # Errors
    /// Fails when no loopback port can be bound.
    pub fn forward(&self, target: SocketAddr) -> Result<SocketAddr> {
        let mut forwards = self.forwards.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(local) = forwards.get(&target) {
            return Ok(*local);
        }
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("failed to bind a forward")?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let netns = self.netns.try_clone()?;
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Ok(netns) = netns.try_clone() else { return };
                tokio::spawn(async move {
                    let Ok(Ok(outbound)) = tokio::task::spawn_blocking(move || connect_in(&netns, target)).await else {
                        return;
                    };
                    let Ok(mut outbound) = tokio::net::TcpStream::from_std(outbound) else { return };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        forwards.insert(target, local);
        Ok(local)
    }

    /// `GET path` from `addr` inside the node's network namespace (a pod IP and port).
    ///
    /// # Errors
    /// As [`super::http::get`].
    pub async fn http_get(&self, addr: SocketAddr, path: &str) -> Result<(u16, String)> {
        super::http::get(self.forward(addr)?, path).await
    }

    /// What the pod watcher saw of every pod so far.
    pub fn pods(&self) -> BTreeMap<String, PodRecord> {
        self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// What the pod watcher saw of `pod`.
    pub fn pod(&self, pod: &str) -> Option<PodRecord> {
        self.pods().remove(pod)
    }

    /// The log of `pod`'s container `container` (all its runs), as the kubelet wrote it.
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        let prefix = format!("{namespace}_{pod}_");
        let Ok(entries) = std::fs::read_dir(self.dir().join("pod-logs")) else { return String::new() };
        let mut text = String::new();
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let dir = entry.path().join(container);
                let mut files: Vec<PathBuf> =
                    std::fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
                files.sort();
                for file in files {
                    text.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
                }
            }
        }
        text
    }

    /// The processes that run in the node's pods now (found through the pod cgroups).
    pub fn container_processes(&self) -> Vec<ContainerProcess> {
        let mut pids = std::collections::BTreeSet::new();
        for dir in cgroup_dirs(&self.cgroup) {
            collect_cgroup_pids(&dir, &mut pids);
        }
        pids.into_iter().filter_map(container_process).collect()
    }

    /// The last `lines` lines of each daemon's log, for failure messages.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for daemon in &self.daemons {
            out.push_str(&format!("--- {} ---\n{}\n", daemon.name(), daemon.log_tail(lines)));
        }
        out
    }

    /// Stops everything, restores the host settings and checks that the host is as before:
    /// the saved sysctls have their values again, no process of the node is left, its cgroups
    /// are gone. Returns the sysctls the node had changed (and were restored).
    ///
    /// # Errors
    /// When something could not be restored; the message says what.
    pub fn shutdown(mut self) -> Result<Vec<String>> {
        let changed: Vec<String> = read_sysctls()?
            .into_iter()
            .zip(&self.saved_sysctls)
            .filter(|(now, saved)| now.1 != saved.1)
            .map(|(now, saved)| format!("{} {} -> {} (restored)", now.0, saved.1, now.1))
            .collect();
        self.stop()?;
        let now = read_sysctls()?;
        ensure!(now == self.saved_sysctls, "sysctls not restored: now {now:?}, before {:?}", self.saved_sysctls);
        let left: Vec<PathBuf> = cgroup_dirs(&self.cgroup).into_iter().filter(|p| p.exists()).collect();
        ensure!(left.is_empty(), "cgroups of the node left behind: {left:?}");
        let mntns = std::fs::read_to_string(self.dir().join("mntns")).unwrap_or_default();
        let in_ns = processes_in_mount_ns(&mntns);
        ensure!(in_ns.is_empty(), "processes of the node left: {in_ns:?}");
        Ok(changed)
    }

    fn stop(&mut self) -> Result<()> {
        if self.down {
            return Ok(());
        }
        self.down = true;
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let status = Command::new("/bin/sh").arg(&self.cleanup).status().context("failed to run the node cleanup")?;
        for daemon in &mut self.daemons {
            daemon.kill();
        }
        self.holder.kill();
        if let Some(mut janitor) = self.janitor.take() {
            janitor.disarm();
        }
        ensure!(status.success(), "the node cleanup script failed ({status}); see {}", self.cleanup.display());
        Ok(())
    }

    /// Relays `listen` (inside the namespace) to the loopback `port` of this process's
    /// network namespace.
    fn relay(&mut self, listen: SocketAddr, port: u16) -> Result<()> {
        let listener = bind_in(&self.netns, listen)?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        self.tasks.push(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }));
        Ok(())
    }

    fn spawn_daemon(&mut self, name: &str, cmd: Command) -> Result<()> {
        let log = self.dir().join(format!("{name}.log"));
        self.daemons.push(ManagedProcess::spawn(name, cmd, &log)?);
        Ok(())
    }

    async fn start_containerd(&mut self, images: &[PathBuf]) -> Result<()> {
        let d = self.dir().to_path_buf();
        let config = containerd_config(&d);
        std::fs::write(d.join("containerd.toml"), config)?;
        std::fs::write(d.join("cni/net.d/10-catalogsync-test.conflist"), cni_config(&d))?;
        let mut cmd = self.command("containerd");
        cmd.arg("--config").arg(d.join("containerd.toml"));
        self.spawn_daemon("containerd", cmd)?;
        let socket = d.join("containerd.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok =
                Command::new("ctr").arg("-a").arg(&socket).arg("version").output().is_ok_and(|o| o.status.success());
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!("containerd did not answer within 30 s:\n{}", self.log_tails(30));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for image in images {
            let out = Command::new("ctr")
                .arg("-a")
                .arg(&socket)
                .args(["-n", "k8s.io", "images", "import", "--no-unpack"])
                .arg(image)
                .output()
                .context("failed to run ctr images import")?;
            ensure!(
                out.status.success(),
                "ctr images import {} failed: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn start_kubelet(&mut self, kcp: &ControlPlane) -> Result<()> {
        let d = self.dir().to_path_buf();
        let kubeconfig = self.kcp_kubeconfig(kcp, &format!("system:node:{NODE_NAME}"))?;
        std::fs::write(d.join("ca.crt"), kcp.ca_pem())?;
        std::fs::write(d.join("kubelet.yaml"), kubelet_config(&d, &self.cgroup))?;
        let bin = k8s_binary("TEST_ASSET_KUBELET", "kubelet")?;
        let mut cmd = self.command(bin);
        cmd.arg(format!("--config={}", d.join("kubelet.yaml").display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}", d.join("kubelet").display()))
            .arg(format!("--cert-dir={}", d.join("kubelet/pki").display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg("--v=2");
        self.spawn_daemon("kubelet", cmd)
    }

    fn start_kube_proxy(&mut self, kcp: &ControlPlane) -> Result<()> {
        let d = self.dir().to_path_buf();
        let kubeconfig = self.kcp_kubeconfig(kcp, "system:kube-proxy")?;
        std::fs::write(d.join("kube-proxy.yaml"), kube_proxy_config(&kubeconfig))?;
        let bin = k8s_binary("TEST_ASSET_KUBE_PROXY", "kube-proxy")?;
        let mut cmd = self.command(bin);
        cmd.arg(format!("--config={}", d.join("kube-proxy.yaml").display())).arg("--v=2");
        self.spawn_daemon("kube-proxy", cmd)
    }

    fn start_scheduler(&mut self, kcp: &ControlPlane) -> Result<()> {
        let bin = k8s_binary("TEST_ASSET_KUBE_SCHEDULER", "kube-scheduler")?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--kubeconfig={}", kcp.admin_kubeconfig_path().display()))
            .arg("--leader-elect=false")
            .arg("--secure-port=0")
            .arg("--v=2");
        self.spawn_daemon("kube-scheduler", cmd)
    }

    async fn await_ready(&mut self, kcp: &ControlPlane) -> Result<()> {
        let nodes: Api<NodeObject> = Api::all(kcp.admin_client());
        let started = Instant::now();
        loop {
            if let Ok(node) = nodes.get(NODE_NAME).await {
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if ready {
                    eprintln!("node {NODE_NAME} Ready {:.1}s after start", started.elapsed().as_secs_f64());
                    return Ok(());
                }
            }
            for daemon in &mut self.daemons {
                if !daemon.is_running() {
                    bail!("{} exited while the node started:\n{}", daemon.name(), daemon.log_tail(40));
                }
            }
            if started.elapsed() > NODE_READY_TIMEOUT {
                bail!("node {NODE_NAME} not Ready within {NODE_READY_TIMEOUT:?}:\n{}", self.log_tails(40));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn watch_pods(&mut self, kcp: &ControlPlane, namespace: &str) {
        let pods: Api<Pod> = Api::namespaced(kcp.admin_client(), namespace);
        let records = self.pods.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()));
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let mut records = records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match event {
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => record(&mut records, &pod),
                    watcher::Event::Delete(pod) => {
                        record(&mut records, &pod);
                        if let Some(name) = pod.metadata.name {
                            records.entry(name).or_default().gone = true;
                        }
                    }
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        }));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("node cleanup: {e:#}");
        }
    }
}

fn record(records: &mut BTreeMap<String, PodRecord>, pod: &Pod) {
    let Some(name) = pod.metadata.name.clone() else { return };
    let entry = records.entry(name).or_default();
    let status = pod.status.clone().unwrap_or_default();
    if let Some(ip) = status.pod_ip.as_deref().and_then(|ip| ip.parse().ok()) {
        entry.ip = Some(ip);
    }
    entry.ready = status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
    for container in status.container_statuses.unwrap_or_default() {
        entry.restarts = entry.restarts.max(container.restart_count);
        if let Some(t) = container.state.and_then(|s| s.terminated) {
            let finished = t.finished_at.map_or_else(Timestamp::now, |f| f.0);
            entry.terminated = Some((t.exit_code, t.reason.unwrap_or_default(), finished));
        }
    }
    if let (Some(at), Some(grace), None) =
        (&pod.metadata.deletion_timestamp, pod.metadata.deletion_grace_period_seconds, entry.deletion_requested)
    {
        entry.deletion_requested = at.0.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(grace)).ok();
        entry.grace_seconds = Some(grace);
    }
}

fn collect_cgroup_pids(dir: &Path, pids: &mut std::collections::BTreeSet<u32>) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_cgroup_pids(&entry.path(), pids);
        }
    }
}

fn container_process(pid: u32) -> Option<ContainerProcess> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    // Fields: ID, parent, major:minor, root, mount point, options, ...
    let root_read_only = mountinfo
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/"))
        .is_some_and(|l| l.split(' ').nth(5).is_some_and(|options| options.split(',').any(|o| o == "ro")));
    Some(ContainerProcess {
        pid,
        comm: std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim().to_owned(),
        uids: field("Uid:")?,
        cap_eff: field("CapEff:")?,
        no_new_privs: field("NoNewPrivs:")?,
        seccomp: field("Seccomp:")?,
        root_read_only,
    })
}

/// Binds `addr` inside the network namespace `netns`.
fn bind_in(netns: &File, addr: SocketAddr) -> Result<std::net::TcpListener> {
    let netns = netns.try_clone()?;
    std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
        rustix::thread::move_into_link_name_space(netns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))?;
        std::net::TcpListener::bind(addr)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread binding {addr} in the node's netns panicked"))?
    .with_context(|| format!("failed to bind {addr} in the node's network namespace"))
}

/// Connects to `addr` inside the network namespace `netns`, on a thread of its own that
/// ends with the connection made (a thread's namespace cannot be shared with the runtime).
fn connect_in(netns: &File, addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    let netns = netns.try_clone()?;
    std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
        rustix::thread::move_into_link_name_space(netns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))?;
        let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nonblocking(true)?;
        Ok(stream)
    })
    .join()
    .map_err(|_| std::io::Error::other("the connecting thread panicked"))?
}

fn check_prerequisites() -> Result<()> {
    ensure!(rustix::process::geteuid().is_root(), "a real node needs root (namespaces, cgroups, mounts)");
    let tools = [
        ("containerd", "containerd"),
        ("containerd-shim-runc-v2", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("iptables", "iptables"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
    ];
    let missing: Vec<String> = tools
        .iter()
        .filter(|(tool, _)| !on_path(tool))
        .map(|(tool, pkg)| format!("{tool} (Debian package {pkg})"))
        .collect();
    ensure!(missing.is_empty(), "the test node needs: {}", missing.join(", "));
    for plugin in ["bridge", "host-local", "loopback"] {
        ensure!(
            Path::new(CNI_BIN_DIR).join(plugin).exists(),
            "CNI plugin {plugin} missing in {CNI_BIN_DIR} (Debian package containernetworking-plugins)"
        );
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// Where Debian's containernetworking-plugins installs the CNI plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";

fn read_sysctls() -> Result<Vec<(String, String)>> {
    HOST_SYSCTLS
        .iter()
        .map(|key| {
            let value = std::fs::read_to_string(Path::new("/proc/sys").join(key))
                .with_context(|| format!("failed to read sysctl {key}"))?;
            Ok(((*key).to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// The cgroup v1 hierarchies (and the v2 one, in hybrid mode) mounted under `/sys/fs/cgroup`.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else { return Vec::new() };
    let mut dirs: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.join("cgroup.procs").exists()).collect();
    if Path::new("/sys/fs/cgroup/cgroup.procs").exists() {
        dirs.push(PathBuf::from("/sys/fs/cgroup"));
    }
    dirs
}

fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    cgroup_hierarchies().into_iter().map(|h| h.join(name)).collect()
}

fn create_cgroup_root(name: &str) -> Result<()> {
    for dir in cgroup_dirs(name) {
        std::fs::create_dir_all(&dir).with_context(|| format!("failed to create cgroup {}", dir.display()))?;
    }
    Ok(())
}

fn processes_in_mount_ns(mntns: &str) -> Vec<u32> {
    if mntns.trim().is_empty() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/mnt")).is_ok_and(|l| l.to_string_lossy() == mntns.trim())
        })
        .collect()
}

/// Starts the holder of the node's namespaces and waits until it has set up its network.
fn start_holder(d: &Path) -> Result<ManagedProcess> {
    let ready = d.join("holder.ready");
    let setup = format!(
        r#"set -e
ip link set lo up
# The node's "NIC": one end of a veth pair whose other end stays unplugged in the namespace.
ip link add node0 type veth peer name node0-peer
ip link set node0-peer up
for a in {NODE_IP} {KCP_ADDRESS} {SKR_ADDRESS}; do ip addr add "$a/32" dev node0; done
ip link set node0 up
ip route add default dev node0
# Private /run (containerd's shim sockets, the pods' netns mounts) and /var/lib (the CNI
# result cache, /var/lib/cni): nothing of the node is written there on the host.
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /var/lib
touch {ready}
exec sleep infinity"#,
        ready = shell_quote(&ready.display().to_string()),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--net", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", &setup]);
    let mut holder = ManagedProcess::spawn("node-namespaces", cmd, &d.join("holder.log"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        if !holder.is_running() || Instant::now() > deadline {
            bail!("the node's namespaces could not be set up: {}", holder.log_tail(20));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(holder)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The cleanup script; see the module docs. Idempotent.
fn cleanup_script(d: &Path, cgroup: &str) -> String {
    let d = shell_quote(&d.display().to_string());
    format!(
        r#"#!/bin/sh
# Stops every process of the test node and restores the host settings it changed.
d={d}
cg={cgroup}
mnt=$(cat "$d/mntns" 2>/dev/null || true)
# Never the host's own mount namespace.
if [ "$mnt" = "$(readlink /proc/1/ns/mnt)" ] || [ "$mnt" = "$(readlink /proc/self/ns/mnt)" ]; then mnt=; fi
i=0
while [ $i -lt 50 ]; do
  pids=
  if [ -n "$mnt" ]; then
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$mnt" ] && pids="$pids ${{p#/proc/}}"
    done
  fi
  for c in /sys/fs/cgroup/*/"$cg" /sys/fs/cgroup/"$cg"; do
    [ -d "$c" ] && pids="$pids $(find "$c" -name cgroup.procs -exec cat {{}} + 2>/dev/null | tr '\n' ' ')"
  done
  [ -z "$(echo $pids)" ] && break
  kill -KILL $pids 2>/dev/null
  sleep 0.1
  i=$((i + 1))
done
for c in /sys/fs/cgroup/*/"$cg" /sys/fs/cgroup/"$cg"; do
  [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {{}} + 2>/dev/null
done
if [ -f "$d/sysctls.saved" ]; then
  while read -r key value; do printf '%s\n' "$value" > "/proc/sys/$key"; done < "$d/sysctls.saved"
fi
status=0
for c in /sys/fs/cgroup/*/"$cg" /sys/fs/cgroup/"$cg"; do
  if [ -d "$c" ]; then echo "cgroup $c left" >&2; status=1; fi
done
exit $status
"#
    )
}

fn containerd_config(d: &Path) -> String {
    let p = |s: &str| d.join(s).display().to_string();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{ttrpc}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni}"
"#,
        root = p("containerd/root"),
        state = p("containerd/state"),
        socket = p("containerd.sock"),
        ttrpc = p("containerd.ttrpc.sock"),
        cni = p("cni/net.d"),
    )
}

fn cni_config(d: &Path) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "catalogsync-test",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": d.join("cni/ipam").display().to_string(),
                },
            },
        ],
    })
    .to_string()
}

fn kubelet_config(d: &Path, cgroup: &str) -> String {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{cgroup}"),
        "containerRuntimeEndpoint": format!("unix://{}", d.join("containerd.sock").display()),
        "address": NODE_IP.to_string(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "x509": {"clientCAFile": d.join("ca.crt").display().to_string()},
            "webhook": {"enabled": false},
            "anonymous": {"enabled": false},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": false,
        "clusterDNS": [],
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "podLogsDir": d.join("pod-logs").display().to_string(),
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "nodeStatusUpdateFrequency": "2s",
        "serializeImagePulls": false,
        "resolvConf": "",
    })
    .to_string()
}

fn kube_proxy_config(kubeconfig: &Path) -> String {
    json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig.display().to_string()},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP.to_string(),
        "clusterCIDR": POD_CIDR,
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        // Leave the global conntrack settings alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": false},
    })
    .to_string()
}
