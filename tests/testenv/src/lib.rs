//! catalogsync's test environment: real kube-apiserver and etcd processes and a KCP and SKRs for
//! end-to-end tests (kube-apiserver and etcd built by `hack/k8s-bins.sh`; see "Prerequisites" in
//! README.md), the catalogsync binary as a child process, hostile SKRs (fixed ones and a seeded
//! fuzzer's), forwarding SKR fronts, a kubelet node, the invariant checker, a Prometheus
//! server, and the catalog fixtures (re-exported from `catalogsync::fixtures`).
//! The integration tests under `tests/`, the benches, `hack/local-up` and the fleet harness
//! (`hack/fleet`) all use it.
//!
//! ```ignore
//! #[tokio::test]
//! async fn copies_reach_the_skr() {
//!     let env = testenv::env();                     // started once per test binary
//!     testenv::install_catalogsync_crds(&env.kcp).await.expect("CRDs");
//!     let kcp = env.kcp.admin_client();             // a fresh client per runtime
//!     let kubeconfig = testenv::catalogsync_kubeconfig(&env.kcp, env.dir());
//!     let mut cs = testenv::Catalogsync::spawn(&["run"], &[], &kubeconfig).expect("spawn");
//!     testenv::await_condition(Duration::from_secs(10), "...", || async { true }).await;
//! }
//! ```
//!
//! Binaries come from `TEST_ASSET_KUBE_APISERVER`/`TEST_ASSET_ETCD` (or
//! `KUBEBUILDER_ASSETS`): `eval "$(hack/k8s-bins.sh)"`. Set `CATALOGSYNC_KEEP_TEST_DIRS=1` to
//! keep logs, audit logs and etcd data. Child processes never outlive the process that started
//! them (see [`process`]).
// A test environment reports a broken setup by panicking, as the tests it serves do.
#![allow(clippy::panic)]

pub use catalogsync::fixtures;

pub mod apply;
pub mod audit;
pub mod controllers;
pub mod controlplane;
pub mod docs;
pub mod drift;
pub mod etcd;
pub mod faults;
pub mod fleet;
pub mod front;
pub mod fuzz;
pub mod hostile;
pub mod http;
pub mod invariants;
pub mod klm;
pub mod kustomize;
pub mod monitoring;
pub mod node;
pub mod pki;
pub mod process;
pub mod prometheus;
pub mod proxy;
pub mod runner;
pub mod scenario;
pub mod sharded;
pub mod wait;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

pub use self::{
    apply::{
        HARNESS_FIELD_MANAGER, apply_docs, apply_yaml, apply_yaml_dir, install_crds, install_crds_yaml, parse_yaml_docs,
    },
    audit::{AuditEvent, ObjectRef, read_audit_log},
    controlplane::{ControlPlane, ControlPlaneOptions, KUBERNETES_SERVICE_IP, client_from_kubeconfig_yaml},
    etcd::Etcd,
    process::{ManagedProcess, TestDir, Watchdog, repo_root},
    runner::{Catalogsync, catalogsync_bin},
    wait::{await_condition, wait_until},
};

/// Whether this runs in CI: `CI` is set and not empty (`.ci/run` sets it).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// A tool that `test` needs, or `None` to skip it: outside CI a missing tool skips the test
/// with a note on stderr saying how to get it, so that `cargo test` works on a bare machine;
/// in CI ([`in_ci`]) nothing may be skipped.
///
/// # Panics
/// In CI, when the tool is missing.
pub fn tool_or_skip(test: &str, tool: Result<PathBuf>) -> Option<PathBuf> {
    match tool {
        Ok(path) => Some(path),
        Err(e) if in_ci() => panic!("{test}: {e:#} (CI is set, so the test may not be skipped)"),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e:#}");
            None
        }
    }
}

/// Namespace of catalogsync's ServiceAccount in `deploy/rbac/`.
pub const CATALOGSYNC_NAMESPACE: &str = "catalogsync-system";
/// `--skr-allowed-destinations` of every catalogsync the tests run: the test SKRs listen on
/// loopback, which the default (`public`) refuses. The KCP apiserver stays refused all the
/// same (catalogsync never allows its own KCP).
pub const SKR_DESTINATIONS: &str = "127.0.0.0/8";
/// User name catalogsync runs as in tests: its ServiceAccount.
pub const CATALOGSYNC_USER: &str = "system:serviceaccount:catalogsync-system:catalogsync";
/// Groups of that ServiceAccount (the apiserver adds `system:authenticated` itself).
pub const CATALOGSYNC_GROUPS: &[&str] =
    &["system:serviceaccounts", "system:serviceaccounts:catalogsync-system", "system:authenticated"];

/// The shared environment of one test binary: one etcd, a KCP and two SKRs.
pub struct TestEnv {
    /// The etcd all control planes store into (each under its own prefix).
    pub etcd: Etcd,
    /// The control-plane cluster.
    pub kcp: ControlPlane,
    /// First remote cluster.
    pub skr_a: ControlPlane,
    /// Second remote cluster.
    pub skr_b: ControlPlane,
    base: TestDir,
    _janitor: Option<Watchdog>,
    started_in: Duration,
}

impl TestEnv {
    /// Starts etcd and then the KCP and both SKRs in parallel, all under one directory that
    /// is removed after the process exits (unless `CATALOGSYNC_KEEP_TEST_DIRS=1`).
    ///
    /// # Errors
    /// Fails when any of them does not start.
    pub async fn start() -> Result<Self> {
        Self::start_with(EnvOptions::default()).await
    }

    /// [`TestEnv::start`] with the KCP and the SKRs started with `options`.
    ///
    /// # Errors
    /// Fails when any of them does not start.
    pub async fn start_with(options: EnvOptions) -> Result<Self> {
        let started = Instant::now();
        let base = TestDir::new("env", None)?;
        let janitor = base.remove_at_exit()?;
        let etcd = Etcd::start(Some(base.path())).await?;
        let (kcp, skr_a, skr_b) = tokio::try_join!(
            ControlPlane::start_with("kcp", &etcd, Some(base.path()), options.kcp),
            ControlPlane::start_with("skr-a", &etcd, Some(base.path()), options.skr.clone()),
            ControlPlane::start_with("skr-b", &etcd, Some(base.path()), options.skr),
        )?;
        let started_in = started.elapsed();
        eprintln!("test environment started in {:.1}s (dir {})", started_in.as_secs_f64(), base.path().display());
        Ok(Self { etcd, kcp, skr_a, skr_b, base, _janitor: janitor, started_in })
    }

    /// The directory everything lives under; free for tests to write into.
    pub fn dir(&self) -> &Path {
        self.base.path()
    }

    /// How long [`TestEnv::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Starts one more SKR on the shared etcd, owned by the caller (killed on drop).
    ///
    /// # Errors
    /// Fails when it does not start.
    pub async fn start_extra_skr(&self, name: &str) -> Result<ControlPlane> {
        ControlPlane::start_in(name, &self.etcd, Some(self.base.path())).await
    }
}

/// The shared environment, started on first use. Callable from any test, sync or async: it
/// starts on a thread of its own with its own runtime, so nothing in it is bound to the
/// runtime of the test that happened to come first.
///
/// # Panics
/// When the environment cannot start (the message says why, e.g. a missing binary). A later
/// call tries again.
pub fn env() -> &'static TestEnv {
    ENV.get_or_init(|| {
        let options = ENV_OPTIONS.get().cloned().unwrap_or_default();
        block_on_own_thread(TestEnv::start_with(options)).expect("start the test environment")
    })
}

static ENV: OnceLock<TestEnv> = OnceLock::new();
static ENV_OPTIONS: OnceLock<EnvOptions> = OnceLock::new();

/// How the shared environment's control planes are started; see [`configure_env`].
#[derive(Clone, Debug, Default)]
pub struct EnvOptions {
    /// Options of the KCP.
    pub kcp: ControlPlaneOptions,
    /// Options of both SKRs.
    pub skr: ControlPlaneOptions,
}

/// Sets the options [`env()`] starts the shared environment with. For a test binary whose
/// tests all need them (the real node's); call it before the first [`env()`].
///
/// # Panics
/// When the environment has started already or was configured differently before.
pub fn configure_env(options: EnvOptions) {
    assert!(ENV.get().is_none(), "configure_env after the test environment started");
    let set = ENV_OPTIONS.get_or_init(|| options.clone());
    assert_eq!(format!("{set:?}"), format!("{options:?}"), "the test environment is configured differently");
}

/// Runs `future` to completion on a new thread with a new current-thread runtime.
///
/// # Errors
/// The future's error, or an error if the thread panicked or no runtime could be built.
pub fn block_on_own_thread<T: Send + 'static>(future: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to build a tokio runtime")?;
        runtime.block_on(future)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread starting the test environment panicked"))?
}

/// Writes `yaml` to `<dir>/<name>.kubeconfig` and returns the path.
///
/// # Panics
/// When the file cannot be written.
pub fn write_kubeconfig(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, yaml).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
    path
}

/// A kubeconfig for catalogsync's ServiceAccount identity ([`CATALOGSYNC_USER`] in
/// [`CATALOGSYNC_GROUPS`]) on `cp`, written to `<dir>/catalogsync-<cp name>.kubeconfig`.
/// Its permissions are exactly what `deploy/rbac/` grants.
pub fn catalogsync_kubeconfig(cp: &ControlPlane, dir: &Path) -> PathBuf {
    let yaml = cp.kubeconfig_yaml(CATALOGSYNC_USER, CATALOGSYNC_GROUPS);
    write_kubeconfig(dir, &format!("catalogsync-{}", cp.name()), &yaml)
}

/// `deploy/crds/` of this repository.
pub fn crds_dir() -> PathBuf {
    repo_root().join("deploy/crds")
}

/// `deploy/rbac/` of this repository.
pub fn rbac_dir() -> PathBuf {
    repo_root().join("deploy/rbac")
}

/// Installs catalogsync's CRDs into `cp`: from `deploy/crds/` when it has YAML files, else
/// generated by `catalogsync::api::crds_yaml()`. Waits until they are established.
///
/// # Errors
/// Fails when they cannot be applied or do not become established.
pub async fn install_catalogsync_crds(cp: &ControlPlane) -> Result<Vec<String>> {
    let dir = crds_dir();
    if apply::yaml_files(&dir).is_ok_and(|files| !files.is_empty()) {
        install_crds(cp, &dir).await
    } else {
        let yaml = catalogsync::api::crds_yaml().context("failed to generate the CRDs")?;
        install_crds_yaml(cp, &yaml).await
    }
}

/// A name unique within this test binary run: `<prefix>-<6 hex digits>`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// Creates namespace `name` (fine if it exists). Namespaces are never deleted here: with
/// no controller-manager they would stay Terminating forever anyway.
///
/// # Errors
/// Fails on any error but AlreadyExists.
pub async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("failed to create namespace {name}")),
    }
}
