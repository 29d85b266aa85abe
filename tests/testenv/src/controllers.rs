//! kube-controller-manager as a child process, for the tests that run the Deployment and the
//! HorizontalPodAutoscaler of `deploy/` for real: its Deployment, ReplicaSet, HPA and
//! disruption (PodDisruptionBudget) controllers act on them exactly as in a cluster. Pods
//! then need a node to run on: see [`super::node::Node`], whose not-ready taint the node
//! lifecycle controller lifts, and whose pods' ServiceAccount token volumes need the
//! `kube-root-ca.crt` ConfigMap that the root CA publisher writes into every namespace. The
//! EndpointSlices of the metrics Service are what Prometheus discovers the pods through.

use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use super::controlplane::ControlPlane;
use super::process::{ManagedProcess, TestDir, k8s_binary};

/// The controllers the deployment tests need (the 1.35 names).
pub const CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "horizontal-pod-autoscaler-controller",
    "disruption-controller",
    "endpointslice-controller",
    "node-lifecycle-controller",
    "root-ca-certificate-publisher-controller",
];

/// The namespace controller (the 1.35 name), for
/// [`ControllerManager::start_namespace_controller`].
pub const NAMESPACE_CONTROLLER: &str = "namespace-controller";

/// How often the HPA controller re-evaluates each HPA. The default is 15 s; the tests change
/// an HPA's bounds and wait for the replica count to follow.
pub const HPA_SYNC_PERIOD: Duration = Duration::from_secs(1);

/// A running kube-controller-manager. Killed on drop.
pub struct ControllerManager {
    process: ManagedProcess,
    _dir: TestDir,
}

impl ControllerManager {
    /// Starts kube-controller-manager (`$TEST_ASSET_KUBE_CONTROLLER_MANAGER`, or
    /// `$KUBEBUILDER_ASSETS/kube-controller-manager`; `hack/k8s-bins.sh` builds it) against
    /// `cp` as admin, running [`CONTROLLERS`], without leader election and without a serving
    /// port of its own.
    ///
    /// # Errors
    /// Fails when the binary is missing or cannot be spawned.
    pub fn start(cp: &ControlPlane) -> Result<Self> {
        let bin = k8s_binary("TEST_ASSET_KUBE_CONTROLLER_MANAGER", "kube-controller-manager")?;
        let dir = TestDir::new("kube-controller-manager", Some(cp.dir()))?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--kubeconfig={}", cp.admin_kubeconfig_path().display()))
            .arg(format!("--controllers={}", CONTROLLERS.join(",")))
            .arg("--leader-elect=false")
            .arg("--secure-port=0")
            .arg(format!("--root-ca-file={}", cp.ca_path().display()))
            .arg(format!("--horizontal-pod-autoscaler-sync-period={}s", HPA_SYNC_PERIOD.as_secs()))
            .arg("--v=2");
        let log = dir.path().join("kube-controller-manager.log");
        let process = ManagedProcess::spawn("kube-controller-manager", cmd, &log)?;
        Ok(Self { process, _dir: dir })
    }

    /// Starts kube-controller-manager against `cp` as admin running the namespace controller
    /// alone ([`NAMESPACE_CONTROLLER`]), without leader election and without a serving port:
    /// a namespace deleted in `cp` then goes away as in a cluster (its contents deleted, then
    /// the namespace finalized) instead of staying Terminating.
    ///
    /// # Errors
    /// Fails when the binary is missing or cannot be spawned.
    pub fn start_namespace_controller(cp: &ControlPlane) -> Result<Self> {
        let bin = k8s_binary("TEST_ASSET_KUBE_CONTROLLER_MANAGER", "kube-controller-manager")?;
        let dir = TestDir::new("namespace-controller", Some(cp.dir()))?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--kubeconfig={}", cp.admin_kubeconfig_path().display()))
            .arg(format!("--controllers={NAMESPACE_CONTROLLER}"))
            .arg("--leader-elect=false")
            .arg("--secure-port=0")
            .arg("--v=2");
        let log = dir.path().join("kube-controller-manager.log");
        let process = ManagedProcess::spawn("kube-controller-manager", cmd, &log)?;
        Ok(Self { process, _dir: dir })
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Whether it still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }
}
