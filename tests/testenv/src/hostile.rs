//! A hostile (or merely watched) SKR for tests: an HTTPS server on a loopback address of the
//! test's choosing, with a CA of its own, that records every request and gives every request
//! the same answer, chosen by a [`Behaviour`]. The answers are a 403, huge lists (with and
//! without a Content-Length), a body that never ends, a body that trickles one byte per
//! second, a huge error body full of control characters, or a small answer that comes late.
//!
//! It does not need the kube-apiserver binaries. Point a client at it with
//! [`HostileSkr::kubeconfig_with_token`], which is shaped like the kubeconfigs of
//! [`ControlPlane`](super::controlplane::ControlPlane).
//!
//! ```ignore
//! let skr = HostileSkr::start("127.0.0.2".parse()?, Behaviour::EndlessBody)?;
//! let secret_yaml = skr.kubeconfig_with_token("t0ken");
//! // ... hand it to catalogsync, then:
//! assert_eq!(skr.connections(), 0, "a rejected kubeconfig must not even connect");
//! ```
//!
//! # What is counted
//! - [`HostileSkr::connections`]: every TCP connection accepted, counted *before* the TLS
//!   handshake. A client that rejects the certificate, or a plain TCP connect that sends
//!   nothing, is counted too.
//! - [`HostileSkr::handshakes`]: connections whose TLS handshake completed.
//! - [`HostileSkr::request_count`] and [`HostileSkr::recorded`]: HTTP requests (method,
//!   path and query, headers, as soon as they arrive; then the body, read to its end before
//!   the answer starts).
//!
//! # Memory
//! Big bodies are generated while they are sent, in pieces of at most [`CHUNK`] bytes, and a
//! piece is produced only when the connection can take it. So the server holds a few chunks
//! per connection whatever the size, and an endless body goes exactly as fast as the client
//! reads. A client that hangs up ends its connection quietly.
//!
//! # Lifetime
//! Like [`TcpProxy`](super::proxy::TcpProxy), the server runs on a thread of its own with its
//! own tokio runtime, so it works the same under any test runtime and keeps serving while the
//! test's runtime blocks. Dropping the [`HostileSkr`] closes the listener, ends every
//! connection (endless bodies included), and joins the thread before `drop` returns.

use std::convert::Infallible;
use std::iter;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use futures::{Stream, StreamExt as _};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::controlplane::{render_kubeconfig, token_credentials};
use super::pki::{CertKey, Pki};

/// The string [`Behaviour::HugeErrorBody`] puts at the start, in the middle and at the end
/// of its message, so a test can tell which parts of it reached a log, an Event or a status.
pub const MARKER: &str = "HOSTILE-MARKER";

/// The message of the [`Behaviour::Record`] 403 Status.
pub const FORBIDDEN_MESSAGE: &str = "hostile test server";

/// The largest piece of a body generated at once: big enough that generating costs nothing
/// next to TLS, small enough that a connection holds little memory.
pub const CHUNK: usize = 64 * 1024;

/// How much of each request body [`Recorded::body`] keeps: enough for any apply payload a test
/// wants to look at, bounded so an endless upload cannot eat the test's memory.
pub const MAX_RECORDED_BODY: usize = 1024 * 1024;

/// How often [`Behaviour::Trickle`] sends its next byte.
pub const TRICKLE_INTERVAL: Duration = Duration::from_secs(1);

/// A connection that has not finished its TLS handshake by then is closed, so a client
/// that connects and sends nothing does not hold a task until the server is dropped.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The user entry of [`HostileSkr::kubeconfig_with_token`].
const KUBECONFIG_USER: &str = "hostile";

/// What the server answers to every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// 403 with a small Kubernetes `Status` (reason `Forbidden`, message
    /// [`FORBIDDEN_MESSAGE`]): for tests where no request may reach the server at all.
    Record,
    /// 200, `application/json`, with a Content-Length: a valid Kubernetes `List` of
    /// `bytes` bytes (exactly, when `bytes` is at least 204; else the smallest such list,
    /// with one item), its items ConfigMaps of about [`CHUNK`] bytes each, mostly a
    /// padding string.
    HugeList {
        /// The body size.
        bytes: usize,
    },
    /// [`Behaviour::HugeList`] with chunked transfer encoding and no Content-Length, so the
    /// client cannot reject it by its announced size.
    HugeListChunked {
        /// The body size.
        bytes: usize,
    },
    /// 200, `application/json`, chunked, and the body never ends: the start of a `List`
    /// whose first item has a padding string that never closes, sent as fast as the client
    /// reads, until it hangs up or the server is dropped.
    EndlessBody,
    /// 200, `application/json`, chunked, one byte every [`TRICKLE_INTERVAL`] (the first at
    /// once), forever: the bytes of [`Behaviour::EndlessBody`].
    Trickle,
    /// 500 with a Content-Length: a Kubernetes `Status` JSON of `bytes` bytes (at least
    /// 172) whose message starts, has in its middle and ends with [`MARKER`]. Between the
    /// markers it repeats ANSI colour sequences (`\u001b[31m`), newlines and tabs, written as
    /// JSON escapes, so the body is valid JSON and the parsed message holds the raw control
    /// characters.
    HugeErrorBody {
        /// The body size.
        bytes: usize,
    },
    /// Waits `delay`, then answers 200 with an empty `List`.
    Slow {
        /// How long each request waits for its answer.
        delay: Duration,
    },
}

impl Behaviour {
    /// The exact length of the body this behaviour sends, or `None` for the bodies that
    /// never end ([`Behaviour::EndlessBody`], [`Behaviour::Trickle`]).
    pub fn body_len(&self) -> Option<usize> {
        match *self {
            Self::Record => Some(FORBIDDEN_BODY.len()),
            Self::HugeList { bytes } | Self::HugeListChunked { bytes } => Some(ListPlan::new(bytes).total),
            Self::EndlessBody | Self::Trickle => None,
            Self::HugeErrorBody { bytes } => Some(ErrorPlan::new(bytes).total()),
            Self::Slow { .. } => Some(EMPTY_LIST.len()),
        }
    }
}

/// One request as the server received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path and query, e.g. `/api/v1/namespaces?limit=500`.
    pub path_and_query: String,
    /// Every header in the order received, names lower case, values decoded lossily as UTF-8.
    pub headers: Vec<(String, String)>,
    /// The first [`MAX_RECORDED_BODY`] bytes of the request body. Filled in once the whole
    /// body has arrived (the server reads every body before it answers).
    pub body: Vec<u8>,
    /// The size of the request body as far as it arrived.
    pub body_len: usize,
}

impl Recorded {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// State shared between the [`HostileSkr`] handle and its thread.
struct Shared {
    behaviour: Behaviour,
    connections: AtomicUsize,
    handshakes: AtomicUsize,
    open: AtomicUsize,
    body_bytes: AtomicU64,
    requests: Mutex<Vec<Recorded>>,
}

impl Shared {
    fn requests(&self) -> std::sync::MutexGuard<'_, Vec<Recorded>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the head of `request` and returns its index in the record.
    fn record<B>(&self, request: &Request<B>) -> usize {
        let uri = request.uri();
        let recorded = Recorded {
            method: request.method().as_str().to_owned(),
            path_and_query: uri.path_and_query().map_or_else(|| uri.to_string(), ToString::to_string),
            headers: request
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
                .collect(),
            body: Vec::new(),
            body_len: 0,
        };
        let mut requests = self.requests();
        requests.push(recorded);
        requests.len() - 1
    }

    /// Reads the body of request `index` to its end (or until the client hangs up) and
    /// records it. Reading it all lets the client finish sending before the answer, so a big
    /// upload gets the answer rather than a reset.
    async fn record_body(&self, index: usize, mut body: Incoming) {
        let (mut kept, mut len) = (Vec::new(), 0);
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                len += data.len();
                let room = MAX_RECORDED_BODY.saturating_sub(kept.len());
                kept.extend_from_slice(&data[..room.min(data.len())]);
            }
        }
        if let Some(recorded) = self.requests().get_mut(index) {
            recorded.body = kept;
            recorded.body_len = len;
        }
    }
}

/// A running hostile SKR on `<loopback ip>:<free port>`. Stopped on drop (see the module docs).
pub struct HostileSkr {
    addr: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostileSkr {
    /// Starts a server on `ip:<free port>` with a fresh CA and a serving certificate for `ip`
    /// (an IP SAN), answering every request as `behaviour` says. Any `127.x.y.z` works on
    /// Linux, so tests can tell servers apart by address.
    ///
    /// # Errors
    /// Fails when `ip` is not a loopback address, or when the certificates, the port, the
    /// runtime or the thread cannot be had.
    pub fn start(ip: IpAddr, behaviour: Behaviour) -> Result<Self> {
        ensure!(ip.is_loopback(), "a hostile SKR listens on loopback addresses only, not on {ip}");
        let pki = Pki::generate("hostile-skr")?;
        let acceptor = tls_acceptor(&pki.issue_serving(&[&ip.to_string()])?)?;
        let listener = std::net::TcpListener::bind((ip, 0)).with_context(|| format!("failed to bind {ip}:0"))?;
        listener.set_nonblocking(true).context("failed to make the listener non-blocking")?;
        let addr = listener.local_addr().context("failed to read the listener address")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to build the hostile SKR's tokio runtime")?;
        let listener = {
            let _in_runtime = runtime.enter();
            TcpListener::from_std(listener).context("failed to register the listener with the runtime")?
        };
        let shared = Arc::new(Shared {
            behaviour,
            connections: AtomicUsize::new(0),
            handshakes: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            body_bytes: AtomicU64::new(0),
            requests: Mutex::new(Vec::new()),
        });
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("hostile-skr-{}", addr.port()))
            .spawn(move || {
                // Dropping the runtime afterwards drops whatever task is left.
                runtime.block_on(accept_loop(listener, acceptor, thread_shared, shutdown_rx));
            })
            .context("failed to spawn the hostile SKR thread")?;
        Ok(Self { addr, ca_pem: pki.ca_pem, shared, shutdown: Some(shutdown_tx), thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<ip>:<port>` (IPv6 in brackets).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig for this server: one cluster (`server` [`HostileSkr::url`],
    /// `certificate-authority-data` the CA), one user with bearer `token`, one context, and
    /// `current-context` set to it. Same shape as
    /// [`ControlPlane::kubeconfig_yaml_with_token`](super::controlplane::ControlPlane::kubeconfig_yaml_with_token).
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let name = format!("hostile-{}", self.addr.port());
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

    /// Connections open right now (in the handshake or being served).
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// HTTP requests received so far.
    pub fn request_count(&self) -> usize {
        self.shared.requests().len()
    }

    /// The requests received so far, in order.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.shared.requests().clone()
    }

    /// Body bytes handed to connections so far, over all requests. Runs ahead of what
    /// clients have read by what fits into buffers (hyper's and the sockets').
    pub fn body_bytes_sent(&self) -> u64 {
        self.shared.body_bytes.load(Ordering::SeqCst)
    }
}

impl Drop for HostileSkr {
    fn drop(&mut self) {
        drop(self.shutdown.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for HostileSkr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostileSkr")
            .field("addr", &self.addr)
            .field("behaviour", &self.shared.behaviour)
            .field("connections", &self.connections())
            .field("requests", &self.request_count())
            .finish_non_exhaustive()
    }
}

/// A TLS acceptor serving `serving`, offering HTTP/1.1 only (ALPN), with no client
/// authentication. Shared with [`SkrFront`](super::front::SkrFront).
pub(crate) fn tls_acceptor(serving: &CertKey) -> Result<TlsAcceptor> {
    let cert =
        CertificateDer::from_pem_slice(serving.cert_pem.as_bytes()).context("failed to parse the certificate")?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).context("failed to parse the key")?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("failed to choose TLS versions")?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .context("failed to configure the serving certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

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

/// Counts a connection as open while alive.
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(shared))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve_connection(stream: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let _open = OpenGuard::new(&shared);
    let _ = stream.set_nodelay(true);
    let Ok(Ok(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else {
        return; // Counted in `connections` already; nothing else to do.
    };
    shared.handshakes.fetch_add(1, Ordering::SeqCst);
    let service = hyper::service::service_fn(move |request| respond(Arc::clone(&shared), request));
    // An error here is the client hanging up (mid-body, too) or sending garbage: the
    // connection ends either way, and the test looks at the counters, not at this.
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
}

/// The body of every response.
type Body = UnsyncBoxBody<Bytes, Infallible>;

async fn respond(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let index = shared.record(&request);
    shared.record_body(index, request.into_body()).await;
    let response = match shared.behaviour {
        Behaviour::Record => answer(StatusCode::FORBIDDEN, None, small_body(&shared, FORBIDDEN_BODY.as_bytes())),
        Behaviour::HugeList { bytes } => {
            let plan = ListPlan::new(bytes);
            answer(StatusCode::OK, Some(plan.total), streamed(&shared, futures::stream::iter(plan.chunks())))
        }
        Behaviour::HugeListChunked { bytes } => {
            answer(StatusCode::OK, None, streamed(&shared, futures::stream::iter(ListPlan::new(bytes).chunks())))
        }
        Behaviour::EndlessBody => answer(StatusCode::OK, None, streamed(&shared, futures::stream::iter(endless()))),
        Behaviour::Trickle => answer(StatusCode::OK, None, streamed(&shared, trickle())),
        Behaviour::HugeErrorBody { bytes } => {
            let plan = ErrorPlan::new(bytes);
            let total = plan.total();
            answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                Some(total),
                streamed(&shared, futures::stream::iter(plan.chunks())),
            )
        }
        Behaviour::Slow { delay } => {
            tokio::time::sleep(delay).await;
            answer(StatusCode::OK, None, small_body(&shared, EMPTY_LIST.as_bytes()))
        }
    };
    Ok(response)
}

/// A JSON response; with an explicit Content-Length when `content_length` is given, else
/// hyper sends the size of a [`small_body`] or chunks a [`streamed`] one.
fn answer(status: StatusCode, content_length: Option<usize>, body: Body) -> Response<Body> {
    let mut response = Response::builder().status(status).header(CONTENT_TYPE, "application/json");
    if let Some(len) = content_length {
        response = response.header(CONTENT_LENGTH, len);
    }
    response.body(body).expect("a status, a static content type and a number make a valid response")
}

fn small_body(shared: &Shared, body: &'static [u8]) -> Body {
    shared.body_bytes.fetch_add(body.len() as u64, Ordering::SeqCst);
    Full::new(Bytes::from_static(body)).boxed_unsync()
}

/// A body polled from `chunks` only when the connection can take more, counting what it hands
/// out. hyper stops polling it (and drops it) when the client hangs up.
fn streamed(shared: &Arc<Shared>, chunks: impl Stream<Item = Bytes> + Send + 'static) -> Body {
    let shared = Arc::clone(shared);
    let frames = chunks.map(move |chunk| {
        shared.body_bytes.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        Ok(Frame::data(chunk))
    });
    StreamBody::new(frames).boxed_unsync()
}

/// The [`Behaviour::Record`] body.
const FORBIDDEN_BODY: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"hostile test server","reason":"Forbidden","details":{},"code":403}"#;

/// The [`Behaviour::Slow`] body.
const EMPTY_LIST: &str = r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"1"},"items":[]}"#;

const LIST_HEAD: &str = r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"1"},"items":["#;
const LIST_TAIL: &str = "]}";
const ITEM_TAIL: &str = r#""}}"#;

/// The start of item `index`, up to its open padding string. The index has a fixed width, so
/// every item head has the same length (up to 10^12 items).
fn item_head(index: usize) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"hostile-{index:012}","namespace":"default"}},"data":{{"padding":""#
    )
}

/// `x`s, sliced for padding without allocating.
pub(crate) static PADDING: [u8; CHUNK] = [b'x'; CHUNK];

/// `len` bytes of `block` repeated, in pieces of at most `block.len()` bytes. The last piece is
/// a prefix of `block`.
pub(crate) fn repeat_block(block: Bytes, len: usize) -> impl Iterator<Item = Bytes> + Send + 'static {
    let step = block.len().max(1);
    (0..len).step_by(step).map(move |offset| block.slice(..step.min(len - offset)))
}

fn padding(len: usize) -> impl Iterator<Item = Bytes> + Send + 'static {
    repeat_block(Bytes::from_static(&PADDING), len)
}

/// How a [`Behaviour::HugeList`] body of a given size is laid out.
#[derive(Clone, Copy, Debug)]
struct ListPlan {
    items: usize,
    /// Padding bytes over all items.
    padding: usize,
    total: usize,
}

impl ListPlan {
    /// As many items of about [`CHUNK`] bytes as `bytes` needs, padded to make exactly
    /// `bytes`. Exact because each item (but a lone one) gets at least `CHUNK / 2` bytes
    /// of budget, far more than its own overhead of about 130.
    fn new(bytes: usize) -> Self {
        let fixed = LIST_HEAD.len() + LIST_TAIL.len();
        let per_item = item_head(0).len() + ITEM_TAIL.len();
        let available = bytes.saturating_sub(fixed);
        let items = available.div_ceil(CHUNK).max(1);
        let needed = items * per_item + (items - 1); // The items and the commas between them.
        let padding = available.saturating_sub(needed);
        Self { items, padding, total: fixed + needed + padding }
    }

    fn chunks(self) -> impl Iterator<Item = Bytes> + Send + 'static {
        let items = (0..self.items).flat_map(move |index| {
            let head = if index == 0 { item_head(index) } else { format!(",{}", item_head(index)) };
            let pad = self.padding / self.items + usize::from(index < self.padding % self.items);
            iter::once(Bytes::from(head))
                .chain(padding(pad))
                .chain(iter::once(Bytes::from_static(ITEM_TAIL.as_bytes())))
        });
        iter::once(Bytes::from_static(LIST_HEAD.as_bytes()))
            .chain(items)
            .chain(iter::once(Bytes::from_static(LIST_TAIL.as_bytes())))
    }
}

/// The [`Behaviour::EndlessBody`] bytes: a list whose first padding string never closes.
fn endless() -> impl Iterator<Item = Bytes> + Send + 'static {
    iter::once(Bytes::from(format!("{LIST_HEAD}{}", item_head(0)))).chain(iter::repeat(Bytes::from_static(&PADDING)))
}

/// The [`Behaviour::Trickle`] bytes: those of [`endless`], one per [`TRICKLE_INTERVAL`].
fn trickle() -> impl Stream<Item = Bytes> + Send + 'static {
    let bytes = endless().flat_map(|chunk| (0..chunk.len()).map(move |i| chunk.slice(i..=i)));
    let mut interval = tokio::time::interval(TRICKLE_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold((bytes, interval), |(mut bytes, mut interval)| async move {
        interval.tick().await;
        let byte = bytes.next()?;
        Some((byte, (bytes, interval)))
    })
}

/// One unit of the [`Behaviour::HugeErrorBody`] message between the markers, as JSON
/// escapes: a red "hostile", a reset, a bell, a newline, a carriage return and a tab.
pub(crate) const CONTROL_UNIT: &str = r"\u001b[31mhostile\u001b[0m\u0007\n\r\t";

/// [`CONTROL_UNIT`] repeated to about [`CHUNK`] bytes, a whole number of times, so slices of
/// whole units of it never split an escape.
pub(crate) static CONTROL_BLOCK: LazyLock<Bytes> =
    LazyLock::new(|| Bytes::from(CONTROL_UNIT.repeat(CHUNK / CONTROL_UNIT.len())));

/// How a [`Behaviour::HugeErrorBody`] body of a given size is laid out:
/// `head MARKER fill MARKER fill MARKER tail`.
#[derive(Clone, Copy, Debug)]
struct ErrorPlan {
    first_fill: usize,
    second_fill: usize,
}

impl ErrorPlan {
    fn head() -> String {
        format!(r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{MARKER}"#)
    }

    fn tail() -> String {
        format!(r#"{MARKER}","reason":"InternalError","details":{{}},"code":500}}"#)
    }

    fn new(bytes: usize) -> Self {
        let fill = bytes.saturating_sub(Self::head().len() + MARKER.len() + Self::tail().len());
        Self { first_fill: fill / 2, second_fill: fill - fill / 2 }
    }

    fn total(self) -> usize {
        Self::head().len() + self.first_fill + MARKER.len() + self.second_fill + Self::tail().len()
    }

    fn chunks(self) -> impl Iterator<Item = Bytes> + Send + 'static {
        iter::once(Bytes::from(Self::head()))
            .chain(control_fill(self.first_fill))
            .chain(iter::once(Bytes::from_static(MARKER.as_bytes())))
            .chain(control_fill(self.second_fill))
            .chain(iter::once(Bytes::from(Self::tail())))
    }
}

/// `len` bytes of whole [`CONTROL_UNIT`]s, then `x`s for the rest.
fn control_fill(len: usize) -> impl Iterator<Item = Bytes> + Send + 'static {
    let whole = len - len % CONTROL_UNIT.len();
    repeat_block(CONTROL_BLOCK.clone(), whole).chain(padding(len - whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(chunks: impl Iterator<Item = Bytes>) -> Vec<u8> {
        chunks.flat_map(|chunk| chunk.to_vec()).collect()
    }

    #[test]
    fn lists_have_the_planned_size_and_parse() {
        for bytes in [0, 10, 203, 204, 300, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 10 * CHUNK] {
            let plan = ListPlan::new(bytes);
            let body = collect(plan.chunks());
            assert_eq!(body.len(), plan.total, "{bytes}: {plan:?}");
            if bytes >= 204 {
                assert_eq!(body.len(), bytes, "{plan:?}");
            }
            let list: serde_json::Value = serde_json::from_slice(&body).expect("a list is JSON");
            assert_eq!(list["kind"], "List");
            assert_eq!(list["items"].as_array().map(Vec::len), Some(plan.items));
            assert!(plan.chunks().all(|chunk| chunk.len() <= CHUNK));
        }
    }

    #[test]
    fn error_bodies_have_the_planned_size_three_markers_and_control_characters() {
        for bytes in [0, 171, 172, 500, CHUNK + 3, 5 * CHUNK + 1] {
            let plan = ErrorPlan::new(bytes);
            let body = collect(plan.chunks());
            assert_eq!(body.len(), plan.total());
            if bytes >= 172 {
                assert_eq!(body.len(), bytes);
            }
            let status: serde_json::Value = serde_json::from_slice(&body).expect("a Status is JSON");
            let message = status["message"].as_str().expect("a message");
            assert_eq!(message.matches(MARKER).count(), 3);
            assert!(message.starts_with(MARKER) && message.ends_with(MARKER));
            if bytes >= 500 {
                assert!(message.contains("\u{1b}[31m") && message.contains('\n'), "{message:?}");
            }
        }
    }
}
