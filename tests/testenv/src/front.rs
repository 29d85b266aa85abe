//! A forwarding TLS front for attack tests: an HTTPS server on a loopback address of the
//! test's choosing, with a CA of its own, that plays an SKR apiserver by forwarding every
//! request to a real kube-apiserver of the test environment ([`ControlPlane`]). A
//! test-supplied interceptor looks at the head of each request ([`RequestHead`]) and decides
//! ([`Verdict`]) whether to forward it unchanged, to forward it and rewrite the JSON answer, or
//! to answer it itself with a body the test provides ([`Answer`]), generated while it is
//! sent.
//!
//! So a test can make an otherwise real SKR lie in one place only: a list that never ends, a
//! name of 7 MiB, a `resourceVersion` of 1 MiB, while namespaces, CRDs and applies reach the
//! real apiserver.
//!
//! ```ignore
//! let front = SkrFront::start(ip, &env.skr_b, |head: &RequestHead| {
//!     if head.is_list_of("moduletemplates") {
//!         Verdict::Answer(Answer::json(StatusCode::OK, &json!({"kind": "List", "items": []})))
//!     } else {
//!         Verdict::Forward
//!     }
//! })?;
//! s.put_secret("attacked", "attacked", &front.kubeconfig_with_token("any"));
//! ```
//!
//! # Upstream
//! Requests go to the control plane's `127.0.0.1:<port>` over TLS (trusting its CA),
//! authenticated with its admin client certificate (group `system:masters`). Whatever
//! credentials the client sent are dropped first, so [`SkrFront::kubeconfig_with_token`] may
//! carry any token. Each client connection gets one upstream connection, opened at its first
//! forwarded request and opened again when the upstream closed it. `Accept-Encoding` is
//! dropped too, so answers to rewrite come uncompressed.
//!
//! # What is counted and kept
//! Counters of connections, handshakes, requests and how each was handled
//! ([`SkrFront::forwarded`], [`SkrFront::rewritten`], [`SkrFront::answered`],
//! [`SkrFront::failed`]), the body bytes of its own answers handed out
//! ([`SkrFront::answered_bytes`]), and the heads of the last [`MAX_RECENT`] requests with
//! their texts cut to [`MAX_RECORDED_TEXT`] bytes ([`SkrFront::recent`]). Request bodies are
//! never kept. So what it records is bounded, however long a test hammers it.
//!
//! # Memory
//! Forwarded bodies stream through in both directions. An [`Answer`] is generated while it
//! is sent, in pieces of at most [`CHUNK`] bytes, and a piece is produced only when the
//! connection can take it, so a body of a gigabyte costs a few chunks. An answer to rewrite
//! is the one thing held whole (it must be parsed): up to [`MAX_REWRITE`] bytes, plus what
//! the rewrite adds.
//!
//! # Lifetime
//! As [`HostileSkr`](super::hostile::HostileSkr): the server runs on a thread of its own with
//! its own tokio runtime, so it serves whatever the test's runtime does. Dropping the
//! [`SkrFront`] closes the listener, ends every connection (upstream ones included) and joins
//! the thread before `drop` returns.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, ensure};
use futures::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::controlplane::{ControlPlane, render_kubeconfig, token_credentials};
use super::hostile::{HANDSHAKE_TIMEOUT, tls_acceptor};
use super::pki::Pki;

/// The largest piece of an [`Answer`] generated at once, as in
/// [`hostile::CHUNK`](super::hostile::CHUNK).
pub const CHUNK: usize = 64 * 1024;

/// The largest upstream answer a [`Verdict::Rewrite`] reads: a rewrite must hold the answer
/// whole to parse it. A larger one fails the request with 502.
pub const MAX_REWRITE: usize = 64 << 20;

/// How many request heads [`SkrFront::recent`] keeps (the newest).
pub const MAX_RECENT: usize = 256;

/// How much of each text of a kept request head (path, query, headers) is kept, in bytes.
pub const MAX_RECORDED_TEXT: usize = 1024;

/// How long opening an upstream connection (TCP, TLS, HTTP) may take before the request
/// fails with 502: the upstream is a local apiserver, which answers in milliseconds.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The user entry of [`SkrFront::kubeconfig_with_token`].
const KUBECONFIG_USER: &str = "front";

/// Request headers never forwarded: the client's credentials (the front authenticates
/// itself), the client's view of the host, compression (a rewrite needs plain JSON) and
/// hop-by-hop headers.
const DROPPED_REQUEST_HEADERS: [HeaderName; 8] = [
    header::AUTHORIZATION,
    header::HOST,
    header::ACCEPT_ENCODING,
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Response headers never passed back: hop-by-hop ones (hyper frames the body itself).
const DROPPED_RESPONSE_HEADERS: [HeaderName; 4] =
    [header::CONNECTION, header::TRAILER, header::TRANSFER_ENCODING, header::UPGRADE];

/// The head of one request, as the interceptor sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// `GET`, `PATCH`, ...
    pub method: Method,
    /// The path, e.g. `/apis/operator.kyma-project.io/v1beta2/namespaces/x/moduletemplates`.
    pub path: String,
    /// The raw query without `?` (empty when there is none).
    pub query: String,
    /// The `Accept` header (empty when absent).
    pub accept: String,
    /// The `Content-Type` header (empty when absent).
    pub content_type: String,
}

impl RequestHead {
    fn of<B>(request: &Request<B>) -> Self {
        let header = |name: HeaderName| {
            request.headers().get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).unwrap_or_default()
        };
        Self {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
            query: request.uri().query().unwrap_or_default().to_owned(),
            accept: header(header::ACCEPT),
            content_type: header(header::CONTENT_TYPE),
        }
    }

    /// The first value of query parameter `key`, percent-decoded (`None` when absent).
    pub fn query_param(&self, key: &str) -> Option<String> {
        self.query
            .split('&')
            .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
            .find(|(k, _)| percent_decode(k) == key)
            .map(|(_, v)| percent_decode(v))
    }

    /// The `continue` token of a paged list (`None` on a first page).
    pub fn continue_token(&self) -> Option<String> {
        self.query_param("continue").filter(|t| !t.is_empty())
    }

    /// Whether this is a LIST (not a watch) of the resource with plural `plural`, in a
    /// namespace or cluster-wide, metadata-only or full.
    pub fn is_list_of(&self, plural: &str) -> bool {
        let watch = self.query_param("watch").is_some_and(|w| w == "true" || w == "1");
        self.method == Method::GET && !watch && self.segments().last() == Some(&plural)
    }

    /// Whether the client asked for metadata only (`Accept:
    /// application/json;as=PartialObjectMetadataList;...` or `...;as=PartialObjectMetadata;...`).
    pub fn is_metadata_only(&self) -> bool {
        self.accept.contains("as=PartialObjectMetadata")
    }

    /// Whether this is a server-side apply (`PATCH` with `application/apply-patch+yaml`) of
    /// one object of the resource with plural `plural`.
    pub fn is_apply_to(&self, plural: &str) -> bool {
        let segments = self.segments();
        self.method == Method::PATCH
            && self.content_type.starts_with("application/apply-patch")
            && segments.len() >= 2
            && segments.get(segments.len() - 2) == Some(&plural)
    }

    fn segments(&self) -> Vec<&str> {
        self.path.split('/').filter(|s| !s.is_empty()).collect()
    }

    /// The head with every text cut to [`MAX_RECORDED_TEXT`] bytes, as kept.
    fn cut(&self) -> Self {
        Self {
            method: self.method.clone(),
            path: cut(&self.path),
            query: cut(&self.query),
            accept: cut(&self.accept),
            content_type: cut(&self.content_type),
        }
    }
}

/// `text` cut to at most [`MAX_RECORDED_TEXT`] bytes, on a character boundary.
fn cut(text: &str) -> String {
    let mut end = text.len().min(MAX_RECORDED_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Decodes `%XX` escapes and `+` (as a space), as in a form-encoded query; bytes that do not
/// make UTF-8 are replaced.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let escaped = bytes
            .get(i + 1..i + 3)
            .filter(|_| b == b'%')
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(decoded) => {
                out.push(decoded);
                i += 3;
            }
            None => {
                out.push(if b == b'+' { b' ' } else { b });
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Rewrites a parsed JSON answer in place, given the head of the request it answers.
pub type Rewriter = Arc<dyn Fn(&RequestHead, &mut Value) + Send + Sync>;

/// What the front does with one request.
pub enum Verdict {
    /// Forward it and pass the answer back unchanged (streamed).
    Forward,
    /// Forward it, read the answer whole (at most [`MAX_REWRITE`] bytes), and when it is a
    /// 2xx JSON answer, pass it back as the rewriter left it (with a new Content-Length);
    /// any other answer is passed back unchanged.
    Rewrite(Rewriter),
    /// Do not forward it; read the request body to its end (discarding it) and send this.
    Answer(Answer),
}

impl Verdict {
    /// [`Verdict::Rewrite`] with `rewriter`.
    pub fn rewrite(rewriter: impl Fn(&RequestHead, &mut Value) + Send + Sync + 'static) -> Self {
        Self::Rewrite(Arc::new(rewriter))
    }
}

/// One piece of an [`Answer`] built with [`Answer::pieces`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// These bytes.
    Text(Bytes),
    /// `len` times `byte`, generated in pieces of at most [`CHUNK`] bytes.
    Fill {
        /// The byte repeated.
        byte: u8,
        /// How many times.
        len: usize,
    },
}

impl Piece {
    /// A text piece.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text(Bytes::from(text.into()))
    }

    /// A fill piece: `len` times `byte`.
    pub fn fill(byte: u8, len: usize) -> Self {
        Self::Fill { byte, len }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Text(bytes) => bytes.len(),
            Self::Fill { len, .. } => *len,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn chunks(self) -> Box<dyn Iterator<Item = Bytes> + Send> {
        match self {
            Self::Text(bytes) => Box::new(std::iter::once(bytes).filter(|b| !b.is_empty())),
            Self::Fill { byte, len } => Box::new(fill(byte, len)),
        }
    }
}

/// `len` times `byte`, in pieces of at most [`CHUNK`] bytes sliced from one block, so a
/// fill of any size allocates one block.
pub fn fill(byte: u8, len: usize) -> impl Iterator<Item = Bytes> + Send + 'static {
    let block = Bytes::from(vec![byte; CHUNK.min(len)]);
    (0..len).step_by(CHUNK).map(move |offset| block.slice(..CHUNK.min(len - offset)))
}

/// An answer the front sends itself: a status, `Content-Type: application/json`, and a body
/// generated while it is sent.
pub struct Answer {
    status: StatusCode,
    content_length: Option<usize>,
    chunks: Box<dyn Iterator<Item = Bytes> + Send>,
}

impl Answer {
    /// `body` serialized, with its Content-Length.
    pub fn json(status: StatusCode, body: &Value) -> Self {
        Self::pieces(status, vec![Piece::text(body.to_string())])
    }

    /// The concatenation of `pieces`, with its exact Content-Length, generated piece by piece.
    pub fn pieces(status: StatusCode, pieces: Vec<Piece>) -> Self {
        let content_length = Some(pieces.iter().map(Piece::len).sum());
        Self { status, content_length, chunks: Box::new(pieces.into_iter().flat_map(Piece::chunks)) }
    }

    /// The bytes of `chunks`, sent with chunked transfer encoding (no Content-Length), as the
    /// client reads them: the body may be of any size, or never end.
    pub fn chunked(status: StatusCode, chunks: impl Iterator<Item = Bytes> + Send + 'static) -> Self {
        Self { status, content_length: None, chunks: Box::new(chunks) }
    }

    /// Its status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Its Content-Length (`None`: chunked).
    pub fn content_length(&self) -> Option<usize> {
        self.content_length
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("status", &self.status)
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

/// How the front handled a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// [`Verdict::Forward`], and the upstream answered.
    Forwarded,
    /// [`Verdict::Rewrite`], and the upstream answered.
    Rewritten,
    /// [`Verdict::Answer`].
    Answered,
    /// Forwarding failed (no upstream connection, no answer, an answer too large to rewrite):
    /// the client got 502.
    Failed,
}

/// One request as [`SkrFront::recent`] keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its head, texts cut to [`MAX_RECORDED_TEXT`] bytes.
    pub head: RequestHead,
    /// How it was handled.
    pub handling: Handling,
    /// The status of the answer the client got.
    pub status: u16,
}

/// The interceptor of a front.
type Interceptor = Box<dyn Fn(&RequestHead) -> Verdict + Send + Sync>;

/// State shared between the [`SkrFront`] handle and its thread.
struct Shared {
    interceptor: Interceptor,
    upstream: Upstream,
    connections: AtomicUsize,
    handshakes: AtomicUsize,
    requests: AtomicUsize,
    forwarded: AtomicUsize,
    rewritten: AtomicUsize,
    answered: AtomicUsize,
    failed: AtomicUsize,
    upstream_connections: AtomicUsize,
    answered_bytes: AtomicU64,
    recent: Mutex<VecDeque<Seen>>,
}

impl Shared {
    fn recent(&self) -> MutexGuard<'_, VecDeque<Seen>> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, head: &RequestHead, handling: Handling, status: StatusCode) {
        let counter = match handling {
            Handling::Forwarded => &self.forwarded,
            Handling::Rewritten => &self.rewritten,
            Handling::Answered => &self.answered,
            Handling::Failed => &self.failed,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        let mut recent = self.recent();
        if recent.len() == MAX_RECENT {
            recent.pop_front();
        }
        recent.push_back(Seen { head: head.cut(), handling, status: status.as_u16() });
    }
}

/// A running front on `<loopback ip>:<free port>` before a control plane. Stopped on drop
/// (see the module docs).
pub struct SkrFront {
    addr: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SkrFront {
    /// Starts a front on `ip:<free port>` with a fresh CA and a serving certificate for `ip`
    /// (an IP SAN), forwarding to `upstream` as its admin, with `interceptor` deciding about
    /// each request. It is called on the front's thread, once per request, before anything
    /// is forwarded; keep it quick (a body it answers with is generated later, while sent).
    ///
    /// # Errors
    /// Fails when `ip` is not a loopback address, or when the certificates, the upstream's
    /// TLS configuration, the port, the runtime or the thread cannot be had.
    pub fn start(
        ip: IpAddr,
        upstream: &ControlPlane,
        interceptor: impl Fn(&RequestHead) -> Verdict + Send + Sync + 'static,
    ) -> Result<Self> {
        ensure!(ip.is_loopback(), "an SKR front listens on loopback addresses only, not on {ip}");
        let pki = Pki::generate("skr-front")?;
        let acceptor = tls_acceptor(&pki.issue_serving(&[&ip.to_string()])?)?;
        let upstream = Upstream::of(upstream)?;
        let listener = std::net::TcpListener::bind((ip, 0)).with_context(|| format!("failed to bind {ip}:0"))?;
        listener.set_nonblocking(true).context("failed to make the listener non-blocking")?;
        let addr = listener.local_addr().context("failed to read the listener address")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to build the SKR front's tokio runtime")?;
        let listener = {
            let _in_runtime = runtime.enter();
            TcpListener::from_std(listener).context("failed to register the listener with the runtime")?
        };
        let shared = Arc::new(Shared {
            interceptor: Box::new(interceptor),
            upstream,
            connections: AtomicUsize::new(0),
            handshakes: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            forwarded: AtomicUsize::new(0),
            rewritten: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            upstream_connections: AtomicUsize::new(0),
            answered_bytes: AtomicU64::new(0),
            recent: Mutex::new(VecDeque::with_capacity(MAX_RECENT)),
        });
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("skr-front-{}", addr.port()))
            .spawn(move || {
                // Dropping the runtime afterwards drops whatever task is left, the upstream
                // connections' included.
                runtime.block_on(accept_loop(listener, acceptor, thread_shared, shutdown_rx));
            })
            .context("failed to spawn the SKR front thread")?;
        Ok(Self { addr, ca_pem: pki.ca_pem, shared, shutdown: Some(shutdown_tx), thread: Some(thread) })
    }

    /// [`SkrFront::start`] with an interceptor that forwards everything.
    ///
    /// # Errors
    /// As [`SkrFront::start`].
    pub fn forwarding(ip: IpAddr, upstream: &ControlPlane) -> Result<Self> {
        Self::start(ip, upstream, |_| Verdict::Forward)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<ip>:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The address requests are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream.addr
    }

    /// A kubeconfig for this front: one cluster (`server` [`SkrFront::url`],
    /// `certificate-authority-data` the front's CA), one user with bearer `token` (any token
    /// will do, the front drops it), one context, and `current-context` set to it. Shaped like
    /// [`HostileSkr::kubeconfig_with_token`](super::hostile::HostileSkr::kubeconfig_with_token).
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let name = format!("front-{}", self.addr.port());
        render_kubeconfig(&name, &self.url(), &self.ca_pem, KUBECONFIG_USER, &token_credentials(token))
    }

    /// TCP connections accepted so far, including those whose TLS handshake failed.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections whose TLS handshake completed so far.
    pub fn handshakes(&self) -> usize {
        self.shared.handshakes.load(Ordering::SeqCst)
    }

    /// HTTP requests received so far (counted as their head arrives).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Requests forwarded unchanged whose answer arrived.
    pub fn forwarded(&self) -> usize {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Requests forwarded whose answer was rewritten (or would have been: a non-2xx or
    /// non-JSON answer passes unchanged).
    pub fn rewritten(&self) -> usize {
        self.shared.rewritten.load(Ordering::SeqCst)
    }

    /// Requests the front answered itself.
    pub fn answered(&self) -> usize {
        self.shared.answered.load(Ordering::SeqCst)
    }

    /// Requests answered with 502 because forwarding failed.
    pub fn failed(&self) -> usize {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// Connections opened to the upstream so far.
    pub fn upstream_connections(&self) -> usize {
        self.shared.upstream_connections.load(Ordering::SeqCst)
    }

    /// Body bytes of the front's own answers handed to connections so far. Runs ahead of
    /// what clients have read by what fits into buffers.
    pub fn answered_bytes(&self) -> u64 {
        self.shared.answered_bytes.load(Ordering::SeqCst)
    }

    /// The last [`MAX_RECENT`] requests, oldest first.
    pub fn recent(&self) -> Vec<Seen> {
        self.shared.recent().iter().cloned().collect()
    }
}

impl Drop for SkrFront {
    fn drop(&mut self) {
        drop(self.shutdown.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for SkrFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkrFront")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream())
            .field("requests", &self.requests())
            .field("forwarded", &self.forwarded())
            .field("rewritten", &self.rewritten())
            .field("answered", &self.answered())
            .field("failed", &self.failed())
            .finish_non_exhaustive()
    }
}

/// Where and how the front reaches its control plane.
struct Upstream {
    addr: SocketAddr,
    authority: HeaderValue,
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl Upstream {
    /// The admin of `cp` at `127.0.0.1:<port>`, trusting its CA, speaking HTTP/1.1.
    fn of(cp: &ControlPlane) -> Result<Self> {
        let pki = cp.pki();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(pki.ca_der.clone())).context("failed to trust the upstream's CA")?;
        let cert = CertificateDer::from_pem_slice(pki.admin.cert_pem.as_bytes())
            .context("failed to parse the upstream's admin certificate")?;
        let key = PrivateKeyDer::from_pem_slice(pki.admin.key_pem.as_bytes())
            .context("failed to parse the upstream's admin key")?;
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .context("failed to choose TLS versions")?
                .with_root_certificates(roots)
                .with_client_auth_cert(vec![cert], key)
                .context("failed to configure the upstream's admin certificate")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, cp.port()));
        Ok(Self {
            addr,
            authority: HeaderValue::from_str(&addr.to_string()).context("an address is a valid Host")?,
            connector: TlsConnector::from(Arc::new(config)),
            server_name: ServerName::from(IpAddr::from(Ipv4Addr::LOCALHOST)),
        })
    }

    /// A new HTTP/1.1 connection; its driver runs as a task of the front's runtime until
    /// the sender is dropped or the upstream closes it.
    async fn connect(&self) -> Result<SendRequest<Incoming>> {
        let connect = async {
            let tcp =
                TcpStream::connect(self.addr).await.with_context(|| format!("failed to connect to {}", self.addr))?;
            let _ = tcp.set_nodelay(true);
            let tls =
                self.connector.connect(self.server_name.clone(), tcp).await.context("TLS with the upstream failed")?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .context("HTTP with the upstream failed")?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            anyhow::Ok(sender)
        };
        tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| anyhow!("no upstream connection within {UPSTREAM_CONNECT_TIMEOUT:?}"))?
    }
}

/// The upstream connection of one client connection, made at its first forwarded request.
type Link = tokio::sync::Mutex<Option<SendRequest<Incoming>>>;

/// Accepts connections until `shutdown` fires (or its sender is dropped); then the connection
/// tasks are aborted with the [`JoinSet`].
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    connections.spawn(serve_connection(stream, acceptor.clone(), Arc::clone(&shared)));
                }
                // E.g. out of file descriptors; try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

async fn serve_connection(stream: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else {
        return; // Counted in `connections` already.
    };
    shared.handshakes.fetch_add(1, Ordering::SeqCst);
    let link: Arc<Link> = Arc::default();
    let service = hyper::service::service_fn(move |request| handle(Arc::clone(&shared), Arc::clone(&link), request));
    // An error here is the client hanging up (mid-body, too) or sending garbage: the
    // connection ends either way.
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
}

/// The error of a response body: the upstream's, or none.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response.
type Body = UnsyncBoxBody<Bytes, BoxError>;

async fn handle(
    shared: Arc<Shared>,
    link: Arc<Link>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let head = RequestHead::of(&request);
    let verdict = (shared.interceptor)(&head);
    let (handling, response) = match verdict {
        Verdict::Forward => match forward(&shared, &link, request).await {
            Ok(response) => (Handling::Forwarded, response.map(|body| body.map_err(BoxError::from).boxed_unsync())),
            Err(err) => (Handling::Failed, bad_gateway(&err)),
        },
        Verdict::Rewrite(rewriter) => {
            let rewritten = match forward(&shared, &link, request).await {
                Ok(response) => rewrite(response, &head, &rewriter).await,
                Err(err) => Err(err),
            };
            match rewritten {
                Ok(response) => (Handling::Rewritten, response),
                Err(err) => (Handling::Failed, bad_gateway(&err)),
            }
        }
        Verdict::Answer(answer) => {
            drain(request.into_body()).await;
            (Handling::Answered, own_answer(&shared, answer))
        }
    };
    shared.note(&head, handling, response.status());
    Ok(response)
}

/// Sends `request` upstream on the client connection's upstream connection (made or made
/// again as needed) and returns the answer with its body still to be read.
async fn forward(shared: &Shared, link: &Link, request: Request<Incoming>) -> Result<Response<Incoming>> {
    let (mut parts, body) = request.into_parts();
    strip(&mut parts.headers, &DROPPED_REQUEST_HEADERS);
    parts.headers.insert(header::HOST, shared.upstream.authority.clone());
    let request = Request::from_parts(parts, body);

    let mut link = link.lock().await;
    // The last answer on this connection was read to its end before the client could send
    // this request (HTTP/1.1), so a connection that is not ready now has been closed.
    let reusable = match link.as_mut() {
        Some(sender) => sender.ready().await.is_ok(),
        None => false,
    };
    if !reusable {
        *link = Some(shared.upstream.connect().await?);
        shared.upstream_connections.fetch_add(1, Ordering::SeqCst);
    }
    let sender = link.as_mut().context("the upstream connection was just made")?;
    let response = sender.send_request(request).await.context("the upstream did not answer")?;
    let (mut parts, body) = response.into_parts();
    strip(&mut parts.headers, &DROPPED_RESPONSE_HEADERS);
    Ok(Response::from_parts(parts, body))
}

fn strip(headers: &mut HeaderMap, names: &[HeaderName]) {
    for name in names {
        headers.remove(name);
    }
}

/// Reads `response` whole and passes a 2xx JSON answer through `rewriter`.
async fn rewrite(response: Response<Incoming>, head: &RequestHead, rewriter: &Rewriter) -> Result<Response<Body>> {
    let (mut parts, body) = response.into_parts();
    let bytes = Limited::new(body, MAX_REWRITE)
        .collect()
        .await
        .map_err(|e| anyhow!("failed to read the upstream's answer to rewrite (at most {MAX_REWRITE} bytes): {e}"))?
        .to_bytes();
    let parsed = parts.status.is_success().then(|| serde_json::from_slice::<Value>(&bytes).ok()).flatten();
    let body = match parsed {
        Some(mut value) => {
            rewriter(head, &mut value);
            Bytes::from(serde_json::to_vec(&value).context("failed to serialize the rewritten answer")?)
        }
        None => bytes,
    };
    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Ok(Response::from_parts(parts, Full::new(body).map_err(|never| match never {}).boxed_unsync()))
}

/// Reads a request body to its end (or until the client hangs up), keeping nothing, so the
/// client finishes sending before the answer.
async fn drain(mut body: Incoming) {
    while let Some(Ok(_)) = body.frame().await {}
}

/// A response for `answer`, polled from its chunks only when the connection can take more,
/// counting what it hands out.
fn own_answer(shared: &Arc<Shared>, answer: Answer) -> Response<Body> {
    let counted = Arc::clone(shared);
    let frames = futures::stream::iter(answer.chunks).map(move |chunk| {
        counted.answered_bytes.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        Ok::<_, BoxError>(Frame::data(chunk))
    });
    let mut response = Response::builder().status(answer.status).header(header::CONTENT_TYPE, "application/json");
    if let Some(len) = answer.content_length {
        response = response.header(header::CONTENT_LENGTH, len);
    }
    response
        .body(StreamBody::new(frames).boxed_unsync())
        .expect("a status, a static content type and a number make a valid response")
}

/// 502 with a Kubernetes `Status` saying why forwarding failed.
fn bad_gateway(err: &anyhow::Error) -> Response<Body> {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("skr front: {err:#}"), "reason": "BadGateway", "code": 502,
    });
    Response::builder()
        .status(StatusCode::BAD_GATEWAY)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(status.to_string())).map_err(|never| match never {}).boxed_unsync())
        .expect("a status, a static content type and a body make a valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: Method, uri: &str, accept: &str, content_type: &str) -> RequestHead {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::ACCEPT, accept)
            .header(header::CONTENT_TYPE, content_type)
            .body(())
            .expect("a request");
        RequestHead::of(&request)
    }

    const MTS: &str = "/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates";

    #[test]
    fn heads_tell_lists_metadata_lists_and_applies_apart() {
        let meta = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        let list = head(Method::GET, &format!("{MTS}?limit=500&continue=a%2Bb%3D"), meta, "");
        assert!(list.is_list_of("moduletemplates") && list.is_metadata_only());
        assert_eq!(list.continue_token().as_deref(), Some("a+b="));
        assert_eq!(list.query_param("limit").as_deref(), Some("500"));
        assert!(!list.is_list_of("modulereleasemetas"));

        let full = head(Method::GET, &format!("{MTS}?limit=50"), "application/json", "");
        assert!(full.is_list_of("moduletemplates") && !full.is_metadata_only());
        assert_eq!(full.continue_token(), None);

        let watch = head(Method::GET, &format!("{MTS}?watch=true"), "", "");
        assert!(!watch.is_list_of("moduletemplates"));
        let get = head(Method::GET, &format!("{MTS}/keda-1.0.0"), "", "");
        assert!(!get.is_list_of("moduletemplates"));
        let crd =
            head(Method::GET, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/moduletemplates.x", "", "");
        assert!(!crd.is_list_of("moduletemplates"));

        let apply =
            head(Method::PATCH, &format!("{MTS}/keda-1.0.0?fieldManager=x"), "", "application/apply-patch+yaml");
        assert!(apply.is_apply_to("moduletemplates") && !apply.is_list_of("moduletemplates"));
        let merge = head(Method::PATCH, &format!("{MTS}/keda-1.0.0"), "", "application/merge-patch+json");
        assert!(!merge.is_apply_to("moduletemplates"));
    }

    #[test]
    fn kept_heads_are_cut() {
        let long = format!("{MTS}?continue={}", "t".repeat(10 * MAX_RECORDED_TEXT));
        let cut = head(Method::GET, &long, "", "").cut();
        assert_eq!(cut.query.len(), MAX_RECORDED_TEXT);
        assert_eq!(super::cut("äöü"), "äöü");
    }

    #[test]
    fn pieces_have_their_announced_length_in_bounded_chunks() {
        let pieces = vec![Piece::text("{\"name\":\""), Piece::fill(b'q', 3 * CHUNK + 5), Piece::text("\"}")];
        let answer = Answer::pieces(StatusCode::OK, pieces);
        let announced = answer.content_length().expect("a length");
        let chunks: Vec<Bytes> = answer.chunks.collect();
        assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= CHUNK));
        let body: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
        assert_eq!(body.len(), announced);
        let value: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(value["name"].as_str().map(str::len), Some(3 * CHUNK + 5));
        assert_eq!(fill(b'x', 0).count(), 0);
        assert_eq!(Answer::pieces(StatusCode::OK, vec![Piece::text("")]).chunks.count(), 0);
    }
}
