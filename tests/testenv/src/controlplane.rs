//! One kube-apiserver ("control plane") with its own PKI, port, etcd prefix, audit log and
//! directory, started with envtest's flag set.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kube::Client;

use super::audit::{AUDIT_POLICY, AuditEvent, read_audit_log};
use super::etcd::Etcd;
use super::pki::{CertKey, Pki, base64};
use super::process::{ManagedProcess, TestDir, free_port, k8s_binary};

/// How long an apiserver may take to answer `/readyz` with 200. It takes 5-15 s alone on
/// 2 cores; three starting at once next to a compiler need the rest.
pub const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(90);

/// How a control plane differs from the default: loopback only, no ServiceAccount admission.
/// The deployment tests run pods on a real node in a network namespace of their own; those
/// pods reach the apiserver through the `kubernetes` Service at an address in that namespace.
#[derive(Clone, Debug, Default)]
pub struct ControlPlaneOptions {
    /// `--advertise-address`, the endpoint of the `kubernetes` Service (the apiserver refuses
    /// a loopback one for it). It need not be local: a forwarder in the node's network
    /// namespace listens there. Default `127.0.0.1`.
    pub advertise_address: Option<IpAddr>,
    /// More IP SANs for the serving certificate: the addresses clients in the node's network
    /// namespace connect to, and the `kubernetes` Service's cluster IP.
    pub extra_sans: Vec<IpAddr>,
    /// Turns the ServiceAccount admission plugin on, so that pods get their ServiceAccount
    /// token volume (in-cluster configuration) as in a real cluster.
    pub service_account_admission: bool,
}

/// The `kubernetes` Service's cluster IP: the first address of `--service-cluster-ip-range`.
pub const KUBERNETES_SERVICE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

/// A kube-apiserver process. `stop` and `restart` keep its port, certificates, etcd prefix
/// (so its data) and directory; drop kills it.
pub struct ControlPlane {
    name: String,
    dir: TestDir,
    port: u16,
    pki: Pki,
    bin: PathBuf,
    etcd_url: String,
    etcd_prefix: String,
    options: ControlPlaneOptions,
    process: Mutex<Option<ManagedProcess>>,
    last_ready_after: Mutex<Duration>,
}

impl ControlPlane {
    /// Starts an apiserver named `name` on `etcd`, in a new directory in the system temp dir.
    ///
    /// # Errors
    /// See [`ControlPlane::start_in`].
    pub async fn start(name: &str, etcd: &Etcd) -> Result<Self> {
        Self::start_in(name, etcd, None).await
    }

    /// Starts an apiserver named `name` on `etcd`, in a new directory under `parent`, and
    /// waits until it is ready.
    ///
    /// # Errors
    /// Fails when the binary (`TEST_ASSET_KUBE_APISERVER` or `KUBEBUILDER_ASSETS`) is
    /// missing, files cannot be written, or it is not ready within
    /// [`APISERVER_READY_TIMEOUT`] (the message carries the tail of its log).
    pub async fn start_in(name: &str, etcd: &Etcd, parent: Option<&Path>) -> Result<Self> {
        Self::start_with(name, etcd, parent, ControlPlaneOptions::default()).await
    }

    /// [`ControlPlane::start_in`] with `options`.
    ///
    /// # Errors
    /// See [`ControlPlane::start_in`].
    pub async fn start_with(
        name: &str,
        etcd: &Etcd,
        parent: Option<&Path>,
        options: ControlPlaneOptions,
    ) -> Result<Self> {
        let bin = k8s_binary("TEST_ASSET_KUBE_APISERVER", "kube-apiserver")?;
        let dir = TestDir::new(name, parent)?;
        let sans: Vec<String> = options.extra_sans.iter().map(ToString::to_string).collect();
        let pki = Pki::generate_with_sans(name, &sans)?;
        let port = free_port()?;
        let etcd_prefix = format!("/{name}-{:016x}", rand::random::<u64>());
        let cp = Self {
            name: name.to_owned(),
            dir,
            port,
            pki,
            bin,
            etcd_url: etcd.url(),
            etcd_prefix,
            options,
            process: Mutex::new(None),
            last_ready_after: Mutex::new(Duration::ZERO),
        };
        cp.write_files()?;
        cp.restart().await?;
        Ok(cp)
    }

    fn write_files(&self) -> Result<()> {
        let files = [
            ("ca.crt", self.pki.ca_pem.as_str()),
            ("apiserver.crt", self.pki.serving.cert_pem.as_str()),
            ("apiserver.key", self.pki.serving.key_pem.as_str()),
            ("admin.crt", self.pki.admin.cert_pem.as_str()),
            ("admin.key", self.pki.admin.key_pem.as_str()),
            ("sa.key", self.pki.sa_private_pem.as_str()),
            ("sa.pub", self.pki.sa_public_pem.as_str()),
            ("audit-policy.yaml", AUDIT_POLICY),
        ];
        std::fs::create_dir_all(self.cert_dir()).context("failed to create the cert dir")?;
        for (file, content) in files {
            let path = self.cert_dir().join(file);
            std::fs::write(&path, content).with_context(|| format!("failed to write {}", path.display()))?;
        }
        let kubeconfig = self.kubeconfig_yaml_for("admin", &self.pki.admin);
        std::fs::write(self.admin_kubeconfig_path(), kubeconfig).context("failed to write the admin kubeconfig")?;
        Ok(())
    }

    fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    fn command(&self) -> Command {
        let pki = self.cert_dir();
        let p = |f: &str| pki.join(f).display().to_string();
        let mut cmd = Command::new(&self.bin);
        cmd.arg(format!("--etcd-servers={}", self.etcd_url))
            .arg(format!("--etcd-prefix={}", self.etcd_prefix))
            .arg(format!("--cert-dir={}", pki.display()))
            .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
            .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
            .arg(format!("--client-ca-file={}", p("ca.crt")))
            .arg(format!("--secure-port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!(
                "--advertise-address={}",
                self.options.advertise_address.unwrap_or(Ipv4Addr::LOCALHOST.into())
            ))
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--allow-privileged=true");
        if !self.options.service_account_admission {
            cmd.arg("--disable-admission-plugins=ServiceAccount");
        }
        cmd.arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-issuer=https://127.0.0.1:{}", self.port))
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!("--service-account-signing-key-file={}", p("sa.key")))
            .arg(format!("--audit-policy-file={}", p("audit-policy.yaml")))
            .arg(format!("--audit-log-path={}", self.audit_log_path().display()))
            .arg("--audit-log-mode=blocking")
            .arg("--audit-log-format=json")
            .arg("--audit-log-maxsize=0");
        cmd
    }

    fn process(&self) -> MutexGuard<'_, Option<ManagedProcess>> {
        self.process.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The control plane's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its directory: `pki/`, `kube-apiserver.log`, `audit.log`, `admin.kubeconfig`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its URL, `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its etcd prefix.
    pub fn etcd_prefix(&self) -> &str {
        &self.etcd_prefix
    }

    /// The CA certificate (PEM) that signs the serving and client certificates.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// The CA certificate's file.
    pub fn ca_path(&self) -> PathBuf {
        self.cert_dir().join("ca.crt")
    }

    /// The PKI, to issue more client certificates.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The apiserver's log (stdout and stderr, appended across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("kube-apiserver.log")
    }

    /// The audit log (JSON lines, appended across restarts).
    pub fn audit_log_path(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// An admin kubeconfig (cert files referenced by path) in its directory.
    pub fn admin_kubeconfig_path(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// How long the last (re)start took until `/readyz` answered 200.
    pub fn last_ready_after(&self) -> Duration {
        *self.last_ready_after.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A `kube::Config` for `admin` (group `system:masters`).
    pub fn admin_config(&self) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().expect("a 127.0.0.1 URL is a valid URI"));
        config.root_cert = Some(vec![self.pki.ca_der.clone()]);
        config.auth_info.client_certificate = Some(self.cert_dir().join("admin.crt").display().to_string());
        config.auth_info.client_key = Some(self.cert_dir().join("admin.key").display().to_string());
        config.connect_timeout = Some(Duration::from_secs(5));
        config
    }

    /// A new admin client. Clients are bound to the tokio runtime they are created in, and
    /// each `#[tokio::test]` has its own, so this builds a fresh one per call (cheap).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn admin_client(&self) -> Client {
        Client::try_from(self.admin_config()).expect("a client from an in-memory admin config")
    }

    /// A new client for `user` in `groups` (see [`Pki::issue_client`] for the group limit).
    ///
    /// # Errors
    /// Fails when the certificate cannot be issued or the kubeconfig not loaded.
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> Result<Client> {
        let yaml = self.try_kubeconfig_yaml(user, groups)?;
        client_from_kubeconfig_yaml(&yaml).await
    }

    /// A kubeconfig with the CA and a freshly issued client certificate for `user` in
    /// `groups` embedded; cluster and context are named after this control plane.
    ///
    /// # Panics
    /// When the certificate cannot be issued (more than two groups).
    pub fn kubeconfig_yaml(&self, user: &str, groups: &[&str]) -> String {
        self.try_kubeconfig_yaml(user, groups).expect("issue a client certificate")
    }

    /// [`ControlPlane::kubeconfig_yaml`] without the panic.
    ///
    /// # Errors
    /// Fails when the certificate cannot be issued.
    pub fn try_kubeconfig_yaml(&self, user: &str, groups: &[&str]) -> Result<String> {
        let cert = self.pki.issue_client(user, groups)?;
        Ok(self.kubeconfig_yaml_for(user, &cert))
    }

    /// [`ControlPlane::try_kubeconfig_yaml`] with another server URL: an address at which
    /// this apiserver is relayed (inside a test node's network namespace).
    ///
    /// # Errors
    /// Fails when the certificate cannot be issued.
    pub fn kubeconfig_yaml_at(&self, server: &str, user: &str, groups: &[&str]) -> Result<String> {
        let cert = self.pki.issue_client(user, groups)?;
        Ok(render_kubeconfig(&self.name, server, &self.pki.ca_pem, user, &cert_credentials(&cert)))
    }

    /// A kubeconfig that authenticates as whoever bearer `token` names (a ServiceAccount
    /// token from the TokenRequest API, as a kubelet hands one to a pod); the user entry is
    /// named `user`.
    pub fn kubeconfig_yaml_with_token(&self, user: &str, token: &str) -> String {
        self.kubeconfig_yaml_with(user, &token_credentials(token))
    }

    fn kubeconfig_yaml_for(&self, user: &str, cert: &CertKey) -> String {
        self.kubeconfig_yaml_with(user, &cert_credentials(cert))
    }

    fn kubeconfig_yaml_with(&self, user: &str, credentials: &str) -> String {
        render_kubeconfig(&self.name, &self.url(), &self.pki.ca_pem, user, credentials)
    }

    /// The audit events so far.
    ///
    /// # Panics
    /// When the log cannot be read or parsed.
    pub fn read_audit_events(&self) -> Vec<AuditEvent> {
        read_audit_log(&self.audit_log_path()).expect("read the audit log")
    }

    /// Whether the apiserver process runs.
    pub fn is_running(&self) -> bool {
        self.process().as_mut().is_some_and(ManagedProcess::is_running)
    }

    /// Kills the apiserver (SIGKILL, as a crash would) and waits for it to exit. Port,
    /// certificates, data and directory stay. A no-op when it is not running.
    pub fn stop(&self) {
        if let Some(mut process) = self.process().take() {
            process.kill();
        }
    }

    /// Starts the apiserver again with the same port, certificates and etcd prefix (after
    /// stopping it if it runs) and waits until it is ready.
    ///
    /// # Errors
    /// Fails when it cannot be spawned or is not ready within [`APISERVER_READY_TIMEOUT`].
    pub async fn restart(&self) -> Result<()> {
        self.stop();
        let started = Instant::now();
        let process =
            ManagedProcess::spawn(&format!("kube-apiserver {}", self.name), self.command(), &self.log_path())?;
        *self.process() = Some(process);
        self.wait_ready(started).await?;
        let took = started.elapsed();
        *self.last_ready_after.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = took;
        eprintln!("control plane {} ready at {} after {:.1}s", self.name, self.url(), took.as_secs_f64());
        Ok(())
    }

    async fn wait_ready(&self, started: Instant) -> Result<()> {
        let client = self.admin_client();
        loop {
            let exited = self.process().as_mut().and_then(ManagedProcess::exit_status);
            if let Some(status) = exited {
                bail!(
                    "kube-apiserver {} exited with {status} before it became ready; log {}:\n{}",
                    self.name,
                    self.log_path().display(),
                    super::process::log_tail(&self.log_path(), 40)
                );
            }
            let request = http::Request::get("/readyz").body(Vec::new()).expect("a static request");
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
                return Ok(());
            }
            if started.elapsed() > APISERVER_READY_TIMEOUT {
                bail!(
                    "timed out after {}s waiting for kube-apiserver {} to answer GET /readyz with 200; log {}:\n{}",
                    APISERVER_READY_TIMEOUT.as_secs(),
                    self.name,
                    self.log_path().display(),
                    super::process::log_tail(&self.log_path(), 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A client from kubeconfig YAML (its current context).
///
/// # Errors
/// Fails when the YAML is not a usable kubeconfig.
pub async fn client_from_kubeconfig_yaml(yaml: &str) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml).context("failed to parse a kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .context("failed to load a kubeconfig")?;
    Client::try_from(config).context("failed to build a client")
}

/// The user fields of a kubeconfig for a client certificate.
fn cert_credentials(cert: &CertKey) -> String {
    format!(
        "    client-certificate-data: {}\n    client-key-data: {}",
        base64(cert.cert_pem.as_bytes()),
        base64(cert.key_pem.as_bytes())
    )
}

/// A kubeconfig with one cluster and one context, both named `name`, and one user named
/// `user`: the cluster is `server`, trusting the CA `ca_pem` (embedded as
/// `certificate-authority-data`); `credentials` are the user's fields, each line indented by
/// four spaces (see [`token_credentials`]).
pub fn render_kubeconfig(name: &str, server: &str, ca_pem: &str, user: &str, credentials: &str) -> String {
    let q = quoted;
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {url}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
{credentials}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {user}
current-context: {name}
",
        name = q(name),
        url = q(server),
        ca = base64(ca_pem.as_bytes()),
        user = q(user),
    )
}

/// The user fields of a kubeconfig that authenticates with bearer `token`, for
/// [`render_kubeconfig`].
pub fn token_credentials(token: &str) -> String {
    format!("    token: {}", quoted(token))
}

/// `s` as a double-quoted YAML (JSON) string.
fn quoted(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}
