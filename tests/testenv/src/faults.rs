//! Faults for the tests of fixed trust bugs (`tests/trust_faults.rs`):
//!
//! - [`DelayFront`]: an HTTPS front before a real SKR apiserver that forwards every request
//!   as the Kyma's own SKR identity (chosen by the bearer token the client sends) and holds
//!   the writes of one replica (picked by its User-Agent) for a while before it forwards
//!   them. A held write is forwarded even when its client gave up on it meanwhile, as a
//!   request already on the wire still lands: the SKR's audit log then shows it with the
//!   time it really reached the apiserver, as the Kyma's user and the replica's User-Agent,
//!   which is what the invariant checker reads.
//! - [`StatusWritesRefused`]: a ValidatingAdmissionPolicy and binding in the KCP that refuse
//!   every write of catalogsync's identity to `kymas/status` in one namespace, so that every
//!   `ModuleCatalog` condition write fails while everything else works. Deleted on drop.
//! - [`apply_condition_by_hand`]: the `ModuleCatalog` condition server-side applied to a
//!   Kyma's status by a field manager of the test's choosing, as an operator would.
//! - [`ShiftableClock`]: libfaketime with its offset in a file, so a running catalogsync's
//!   wall clock can be moved forward while its monotonic clock stays true.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::controlplane::{ControlPlane, render_kubeconfig, token_credentials};
use super::hostile::{HANDSHAKE_TIMEOUT, tls_acceptor};
use super::pki::Pki;

/// How long forwarding one request upstream (connect, send, read the whole answer) may take
/// before the client gets 502: the upstream is a local apiserver.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest request or answer body the front reads whole: far above what the tests'
/// catalog needs.
const MAX_BODY: usize = 32 << 20;

/// The user entry of [`DelayFront::kubeconfig`].
const KUBECONFIG_USER: &str = "delay-front";

/// Request headers not forwarded: the client's credentials (the front authenticates by the
/// identity the token names), its view of the host, compression, and hop-by-hop headers.
const DROPPED_REQUEST_HEADERS: [HeaderName; 9] = [
    header::AUTHORIZATION,
    header::HOST,
    header::ACCEPT_ENCODING,
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::CONTENT_LENGTH,
];

/// Response headers not passed back (the front sends the whole body with its own length).
const DROPPED_RESPONSE_HEADERS: [HeaderName; 5] =
    [header::CONNECTION, header::TRAILER, header::TRANSFER_ENCODING, header::UPGRADE, header::CONTENT_LENGTH];

/// One write the front held back, as it saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldWrite {
    /// The SKR user it was forwarded as (the identity its bearer token names).
    pub user: String,
    /// The client's User-Agent.
    pub user_agent: String,
    /// `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    /// The request path.
    pub path: String,
    /// When the front had the whole request.
    pub received: Timestamp,
    /// When it sent the request upstream, after the hold (`None` while held).
    pub forwarded: Option<Timestamp>,
    /// When the upstream's answer was read (`None` before).
    pub answered: Option<Timestamp>,
    /// The upstream's status code (`None` before the answer, 0 when forwarding failed).
    pub status: Option<u16>,
}

/// The SKR identity one bearer token stands for.
struct Identity {
    user: String,
    connector: TlsConnector,
}

/// Which writes are held, and for how long.
#[derive(Clone, Debug)]
struct Hold {
    user_agent_contains: String,
    delay: Duration,
}

struct Shared {
    upstream: SocketAddr,
    authority: HeaderValue,
    identities: BTreeMap<String, Identity>,
    hold: Mutex<Option<Hold>>,
    held: Mutex<Vec<HeldWrite>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running front on `127.0.0.1:<free port>` before a control plane; stopped on drop, which
/// also drops the writes it still holds.
pub struct DelayFront {
    addr: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DelayFront {
    /// Starts a front before `upstream` with a CA of its own. `identities` maps bearer
    /// tokens to SKR users: a request with token `t` is forwarded with a client certificate
    /// (issued by `upstream`'s CA) of the user `t` maps to, in group `system:masters`, as the
    /// harness's access Secrets do. A request with another token gets 401.
    ///
    /// # Errors
    /// Fails when a certificate, the port, the runtime or the thread cannot be had.
    pub fn start(upstream: &ControlPlane, identities: &[(&str, &str)]) -> Result<Self> {
        let pki = Pki::generate("delay-front")?;
        let acceptor = tls_acceptor(&pki.issue_serving(&["127.0.0.1"])?)?;
        let upstream_pki = upstream.pki();
        let mut by_token = BTreeMap::new();
        for (token, user) in identities {
            let cert = upstream_pki.issue_client(user, &["system:masters"])?;
            let connector = client_connector(&upstream_pki.ca_der, &cert.cert_pem, &cert.key_pem)?;
            by_token.insert((*token).to_owned(), Identity { user: (*user).to_owned(), connector });
        }
        let upstream_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream.port()));
        let shared = Arc::new(Shared {
            upstream: upstream_addr,
            authority: HeaderValue::from_str(&upstream_addr.to_string()).context("an address is a valid Host")?,
            identities: by_token,
            hold: Mutex::new(None),
            held: Mutex::new(Vec::new()),
        });
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("failed to bind 127.0.0.1:0")?;
        listener.set_nonblocking(true).context("failed to make the listener non-blocking")?;
        let addr = listener.local_addr().context("failed to read the listener address")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to build the delay front's tokio runtime")?;
        let listener = {
            let _in_runtime = runtime.enter();
            TcpListener::from_std(listener).context("failed to register the listener with the runtime")?
        };
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("delay-front-{}", addr.port()))
            .spawn(move || {
                // Dropping the runtime afterwards drops every task left: connections and the
                // writes still held.
                runtime.block_on(accept_loop(listener, acceptor, thread_shared, shutdown_rx));
            })
            .context("failed to spawn the delay front's thread")?;
        Ok(Self { addr, ca_pem: pki.ca_pem, shared, shutdown: Some(shutdown_tx), thread: Some(thread) })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// A kubeconfig for this front with bearer `token` (one of the identities it was started
    /// with), shaped like the harness's other SKR kubeconfigs.
    pub fn kubeconfig(&self, token: &str) -> String {
        let name = format!("delay-front-{}", self.addr.port());
        render_kubeconfig(&name, &self.url(), &self.ca_pem, KUBECONFIG_USER, &token_credentials(token))
    }

    /// From now on, holds every write (POST, PUT, PATCH, DELETE) whose User-Agent names
    /// replica `identity` (catalogsync's User-Agent is `catalogsync/<version> (<identity>)
    /// ...`) for `delay` before it forwards it. Other requests pass at once.
    pub fn hold_writes_of(&self, identity: &str, delay: Duration) {
        *lock(&self.shared.hold) = Some(Hold { user_agent_contains: format!("({identity})"), delay });
    }

    /// Holds no write received from now on; writes held already keep their time.
    pub fn stop_holding(&self) {
        *lock(&self.shared.hold) = None;
    }

    /// Every write held so far, in the order received.
    pub fn held(&self) -> Vec<HeldWrite> {
        lock(&self.shared.held).clone()
    }
}

impl Drop for DelayFront {
    fn drop(&mut self) {
        drop(self.shutdown.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A TLS client configuration that trusts `ca_der` and authenticates with the given
/// certificate, speaking HTTP/1.1.
fn client_connector(ca_der: &[u8], cert_pem: &str, key_pem: &str) -> Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca_der.to_vec())).context("failed to trust the upstream's CA")?;
    let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).context("failed to parse a client certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("failed to parse a client key")?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("failed to choose TLS versions")?
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![cert], key)
        .context("failed to configure a client certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(stream, acceptor.clone(), Arc::clone(&shared)));
                }
                // E.g. out of file descriptors; try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

async fn serve_connection(stream: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else { return };
    let service = hyper::service::service_fn(move |request| handle(Arc::clone(&shared), request));
    // An error here is the client hanging up (a sync that timed out drops its connection):
    // the connection ends, the writes it sent are forwarded all the same.
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
}

/// A Kubernetes `Status` answer.
fn status_answer(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("delay front: {message}"), "code": code.as_u16(),
    });
    let mut response = Response::new(Full::new(Bytes::from(status.to_string())));
    *response.status_mut() = code;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ").map(str::trim)
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (mut parts, body) = request.into_parts();
    let Some(token) = bearer(&parts.headers).map(str::to_owned) else {
        return Ok(status_answer(StatusCode::UNAUTHORIZED, "no bearer token"));
    };
    if !shared.identities.contains_key(&token) {
        return Ok(status_answer(StatusCode::UNAUTHORIZED, "unknown token"));
    }
    // The whole request first: a held write must not depend on its client any more.
    let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Ok(status_answer(StatusCode::BAD_REQUEST, &format!("failed to read the request: {e}"))),
    };
    let user_agent = parts.headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let is_write = matches!(parts.method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE);
    let delay = lock(&shared.hold)
        .as_ref()
        .filter(|hold| is_write && user_agent.contains(&hold.user_agent_contains))
        .map(|hold| hold.delay);
    let index = delay.map(|_| {
        let mut held = lock(&shared.held);
        held.push(HeldWrite {
            user: shared.identities.get(&token).map(|i| i.user.clone()).unwrap_or_default(),
            user_agent: user_agent.clone(),
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
            received: Timestamp::now(),
            forwarded: None,
            answered: None,
            status: None,
        });
        held.len() - 1
    });
    for name in &DROPPED_REQUEST_HEADERS {
        parts.headers.remove(name);
    }
    parts.headers.insert(header::HOST, shared.authority.clone());

    // Forwarded by a task of its own, which outlives the client's connection: a request on
    // the wire lands whether or not its sender still waits for the answer.
    let (answer_tx, answer_rx) = oneshot::channel();
    let task_shared = Arc::clone(&shared);
    tokio::spawn(async move {
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let note = |f: &dyn Fn(&mut HeldWrite)| {
            if let Some(i) = index
                && let Some(w) = lock(&task_shared.held).get_mut(i)
            {
                f(w);
            }
        };
        note(&|w| w.forwarded = Some(Timestamp::now()));
        let identity = task_shared.identities.get(&token);
        let result = match identity {
            Some(identity) => tokio::time::timeout(
                UPSTREAM_TIMEOUT,
                forward(task_shared.upstream, &identity.connector, Request::from_parts(parts, Full::new(body))),
            )
            .await
            .unwrap_or_else(|_| Err(anyhow!("no answer from the upstream within {UPSTREAM_TIMEOUT:?}"))),
            None => Err(anyhow!("unknown token")),
        };
        let code = result.as_ref().map_or(0, |r| r.status().as_u16());
        note(&|w| {
            w.answered = Some(Timestamp::now());
            w.status = Some(code);
        });
        let _ = answer_tx.send(result);
    });
    Ok(match answer_rx.await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => status_answer(StatusCode::BAD_GATEWAY, &format!("{e:#}")),
        Err(_) => status_answer(StatusCode::BAD_GATEWAY, "the forwarding task ended"),
    })
}

/// Sends `request` to `upstream` on a new connection authenticated by `connector` and reads
/// the whole answer.
async fn forward(
    upstream: SocketAddr,
    connector: &TlsConnector,
    request: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>> {
    let tcp = TcpStream::connect(upstream).await.with_context(|| format!("failed to connect to {upstream}"))?;
    let _ = tcp.set_nodelay(true);
    let tls = connector
        .connect(ServerName::from(IpAddr::from(Ipv4Addr::LOCALHOST)), tcp)
        .await
        .context("TLS with the upstream failed")?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.context("HTTP with the upstream failed")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = sender.send_request(request).await.context("the upstream did not answer")?;
    let (mut parts, body) = response.into_parts();
    let body = http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| anyhow!("failed to read the upstream's answer: {e}"))?
        .to_bytes();
    for name in &DROPPED_RESPONSE_HEADERS {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}

// ---------------------------------------------------------------------------------------------

/// A ValidatingAdmissionPolicy and its binding that refuse every write (`UPDATE`, which a
/// patch is too) of `kymas/status` by one user in one namespace: nothing else is affected,
/// so other tests sharing the KCP are not. Both are deleted on drop.
pub struct StatusWritesRefused {
    /// The policy's name; its refusals (403) name it.
    pub policy: String,
    binding: String,
}

impl StatusWritesRefused {
    /// Installs the policy and binding for writes of `user` to `kymas/status` in `namespace`,
    /// named after the namespace.
    ///
    /// # Errors
    /// Fails when they cannot be applied.
    pub async fn install(admin: &Client, namespace: &str, user: &str) -> Result<Self> {
        let policy = format!("refuse-kyma-status-{namespace}");
        let binding = format!("refuse-kyma-status-{namespace}");
        let installed = Self { policy: policy.clone(), binding: binding.clone() };
        let policy_doc = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["operator.kyma-project.io"],
                    "apiVersions": ["*"],
                    "operations": ["UPDATE"],
                    "resources": ["kymas/status"],
                }]},
                "matchConditions": [{
                    "name": "is-the-user",
                    "expression": format!("request.userInfo.username == '{user}'"),
                }],
                "validations": [{
                    "expression": "false",
                    "reason": "Forbidden",
                    "message": "the test refuses every Kyma status write of this user here",
                }],
            },
        });
        let binding_doc = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": binding},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
        });
        super::apply_docs(admin, vec![policy_doc, binding_doc]).await.context("failed to apply the policy")?;
        Ok(installed)
    }

    /// Waits until `as_user` (an API of the namespace's Kymas as the refused user) gets the
    /// policy's 403 for a dry-run status patch of Kyma `kyma`: the apiserver has loaded the
    /// policy and its binding.
    ///
    /// # Panics
    /// On timeout.
    pub async fn await_in_force(&self, as_user: &Api<DynamicObject>, kyma: &str, timeout: Duration) {
        let params = PatchParams::default().dry_run();
        let patch = Patch::Merge(json!({"status": {"activeChannel": "probe"}}));
        super::await_condition(timeout, &format!("admission policy {} to be in force", self.policy), || async {
            matches!(
                as_user.patch_status(kyma, &params, &patch).await,
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(&self.policy)
            )
        })
        .await;
    }
}

impl Drop for StatusWritesRefused {
    fn drop(&mut self) {
        let (policy, binding) = (self.policy.clone(), self.binding.clone());
        let deleted = super::block_on_own_thread(async move {
            let admin = super::env().kcp.admin_client();
            let params = DeleteParams::default();
            Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone()).delete(&binding, &params).await?;
            Api::<ValidatingAdmissionPolicy>::all(admin).delete(&policy, &params).await?;
            Ok(())
        });
        if let Err(e) = deleted {
            eprintln!("failed to delete admission policy {}: {e:#}", self.policy);
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// Server-side applies (forced) the `ModuleCatalog` condition with `status`, `reason` and
/// `message` to Kyma `kyma`'s status as field manager `manager`, as an operator would with
/// `kubectl apply --server-side --subresource=status`.
///
/// # Errors
/// Fails when the apply fails.
pub async fn apply_condition_by_hand(
    kymas: &Api<DynamicObject>,
    kyma: &str,
    manager: &str,
    (status, reason, message): (&str, &str, &str),
) -> Result<()> {
    let body = json!({
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "Kyma",
        "metadata": {"name": kyma},
        "status": {"conditions": [{
            "type": "ModuleCatalog", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": Timestamp::now().to_string(),
        }]},
    });
    kymas
        .patch_status(kyma, &PatchParams::apply(manager).force(), &Patch::Apply(&body))
        .await
        .with_context(|| format!("failed to apply the condition of {kyma} as {manager}"))?;
    Ok(())
}

/// The managed-fields entry of `manager` on `kyma`'s status subresource: its operation and
/// time.
///
/// # Errors
/// Fails when the Kyma cannot be read.
pub async fn status_manager_entry(
    kymas: &Api<DynamicObject>,
    kyma: &str,
    manager: &str,
) -> Result<Option<(String, Option<Timestamp>)>> {
    let obj = kymas.get(kyma).await.with_context(|| format!("failed to read {kyma}"))?;
    Ok(obj.metadata.managed_fields.unwrap_or_default().into_iter().find_map(|e| {
        (e.manager.as_deref() == Some(manager) && e.subresource.as_deref() == Some("status"))
            .then(|| (e.operation.unwrap_or_default(), e.time.map(|t| t.0)))
    }))
}

// ---------------------------------------------------------------------------------------------

/// A wall-clock offset for a catalogsync process that the test may change while it runs:
/// libfaketime reads the offset from a file (`FAKETIME_TIMESTAMP_FILE`, re-read every
/// second), and leaves the monotonic clock alone (`FAKETIME_DONT_FAKE_MONOTONIC`), so
/// timers, timeouts and the fence deadline keep real time while `SystemTime::now` jumps.
pub struct ShiftableClock {
    file: PathBuf,
    preload: String,
}

impl ShiftableClock {
    /// A clock file `faketime.rc` in `dir`, offset 0.
    ///
    /// # Errors
    /// Fails when libfaketime is not installed or the file cannot be written.
    pub fn new(dir: &Path) -> Result<Self> {
        let preload = super::process::libfaketime()?.display().to_string();
        let clock = Self { file: dir.join("faketime.rc"), preload };
        clock.set(Duration::ZERO)?;
        Ok(clock)
    }

    /// The environment to spawn the process with.
    pub fn envs(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".to_owned(), self.preload.clone()),
            ("FAKETIME_TIMESTAMP_FILE".to_owned(), self.file.display().to_string()),
            ("FAKETIME_CACHE_DURATION".to_owned(), "1".to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ]
    }

    /// Sets the offset of the process's wall clock to `ahead` (whole seconds); it takes
    /// effect within a second.
    ///
    /// # Errors
    /// Fails when the file cannot be written.
    pub fn set(&self, ahead: Duration) -> Result<()> {
        // Written whole to a new file and renamed, so a read never sees half of it.
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("+{}\n", ahead.as_secs()))
            .with_context(|| format!("failed to write {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.file).with_context(|| format!("failed to replace {}", self.file.display()))
    }
}
