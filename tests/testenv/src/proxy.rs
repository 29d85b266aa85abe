//! A TCP proxy in front of an apiserver, so a test can cut one client (a catalogsync replica)
//! off from it and heal the link again, without touching the apiserver or other clients.
//!
//! It forwards raw bytes, so TLS passes through end to end: the apiserver's serving
//! certificate is for `127.0.0.1`, and a kubeconfig whose `server:` points at the proxy's
//! `127.0.0.1:<port>` ([`kubeconfig_via`]) still verifies.
//!
//! The proxy runs on a thread of its own with its own tokio runtime, so it keeps forwarding
//! whatever the test's runtime does (blocks, sleeps, or ends) and whichever runtime the test
//! happens to run on. Dropping the [`TcpProxy`] stops it and closes its connections.
//!
//! Modes:
//! - [`ProxyMode::Forward`]: every connection is forwarded to the upstream.
//! - [`ProxyMode::Cut`] ([`TcpProxy::cut`]): open connections are reset (TCP RST) at once, and
//!   new ones are accepted and reset immediately. A client fails fast with "connection reset"
//!   (the listener stays bound, so the port cannot be taken by someone else meanwhile).
//! - [`ProxyMode::Stall`] ([`TcpProxy::stall`]): a black hole. Open connections stop being
//!   forwarded but stay open; new ones are accepted and never answered. A client's requests
//!   hang until its own timeouts fire, as behind a dead network path.
//!
//! [`TcpProxy::heal`] forwards new connections again; connections that were stalled are
//! reset then (they cannot resume mid-stream).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// What the proxy does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward bytes both ways.
    Forward,
    /// Reset open and new connections at once (clients fail fast).
    Cut,
    /// Hold open and new connections without forwarding anything (clients hang).
    Stall,
}

/// State shared between the [`TcpProxy`] handle and its thread.
struct Shared {
    mode: watch::Sender<ProxyMode>,
    open: AtomicUsize,
    accepted: AtomicU64,
    reset: AtomicU64,
}

/// A running TCP proxy from `127.0.0.1:<free port>` to an upstream address. Stopped on drop.
pub struct TcpProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpProxy {
    /// Starts a proxy to `upstream` on `127.0.0.1:<free port>`, forwarding.
    ///
    /// # Panics
    /// When no port can be bound or the thread cannot be started.
    pub fn start(upstream: SocketAddr) -> Self {
        Self::try_start(upstream).expect("start a TCP proxy")
    }

    /// [`TcpProxy::start`] without the panic.
    ///
    /// # Errors
    /// Fails when no port can be bound or the thread or its runtime cannot be started.
    pub fn try_start(upstream: SocketAddr) -> Result<Self> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("failed to bind 127.0.0.1:0")?;
        listener.set_nonblocking(true).context("failed to make the proxy listener non-blocking")?;
        let addr = listener.local_addr().context("failed to read the proxy address")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to build the proxy's tokio runtime")?;
        let shared = Arc::new(Shared {
            mode: watch::Sender::new(ProxyMode::Forward),
            open: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            reset: AtomicU64::new(0),
        });
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("tcp-proxy-{}", addr.port()))
            .spawn(move || {
                // Dropping the runtime afterwards drops (closes) every connection task.
                runtime.block_on(accept_loop(listener, upstream, thread_shared, shutdown_rx));
            })
            .context("failed to spawn the proxy thread")?;
        Ok(Self { addr, upstream, shared, shutdown: Some(shutdown_tx), thread: Some(thread) })
    }

    /// The address clients connect to: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`, the URL of an apiserver behind this proxy.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The address connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.shared.mode.borrow()
    }

    /// Resets all open connections at once and every new one right after accepting it, until
    /// [`TcpProxy::heal`]. Clients see "connection reset" within milliseconds.
    pub fn cut(&self) {
        self.set_mode(ProxyMode::Cut);
    }

    /// Stops forwarding without closing anything: open and new connections hang until
    /// [`TcpProxy::heal`] or [`TcpProxy::cut`] (both reset them).
    pub fn stall(&self) {
        self.set_mode(ProxyMode::Stall);
    }

    /// Forwards new connections again.
    pub fn heal(&self) {
        self.set_mode(ProxyMode::Forward);
    }

    /// Whether the proxy does not forward ([`ProxyMode::Cut`] or [`ProxyMode::Stall`]).
    pub fn is_cut(&self) -> bool {
        self.mode() != ProxyMode::Forward
    }

    /// Sets the mode; open connections react at once.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.shared.mode.send_replace(mode);
    }

    /// Connections open right now (forwarded or held).
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections accepted so far (in any mode).
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections the proxy has reset so far (by [`TcpProxy::cut`], or on heal after a stall).
    pub fn reset_connections(&self) -> u64 {
        self.shared.reset.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        drop(self.shutdown.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `127.0.0.1:<port>`, e.g. the upstream address of `ControlPlane::port()`.
pub fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Rewrites every `server:` URL of a kubeconfig to point at `proxy` (keeping the scheme and
/// any path), leaving everything else as it is. Works on the kubeconfigs of this harness
/// (block style, one `server:` key per line, value quoted or not).
pub fn kubeconfig_via(yaml: &str, proxy: SocketAddr) -> String {
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.split_inclusive('\n') {
        let content = line.trim_end_matches(['\n', '\r']);
        let eol = &line[content.len()..];
        let trimmed = content.trim_start();
        let indent = &content[..content.len() - trimmed.len()];
        let Some(value) = trimmed.strip_prefix("server:") else {
            out.push_str(line);
            continue;
        };
        let url = value.trim().trim_matches(['"', '\'']);
        let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
        let path = rest.find('/').map_or("", |i| &rest[i..]);
        out.push_str(&format!("{indent}server: \"{scheme}://{proxy}{path}\"{eol}"));
    }
    out
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

async fn accept_loop(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let Ok(listener) = TcpListener::from_std(listener) else { return };
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(_) => {
                // E.g. out of file descriptors; try again shortly.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let mode = shared.mode.subscribe();
        if *mode.borrow() == ProxyMode::Cut {
            reset(client, &shared);
            continue;
        }
        tokio::spawn(serve(client, upstream, Arc::clone(&shared), mode));
    }
}

/// Forwards one connection until it ends or the mode leaves [`ProxyMode::Forward`].
async fn serve(mut client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>, mut mode: watch::Receiver<ProxyMode>) {
    let _open = OpenGuard::new(&shared);
    let _ = client.set_nodelay(true);
    let changed = {
        let forward = async {
            let mut server = TcpStream::connect(upstream).await?;
            let _ = server.set_nodelay(true);
            tokio::io::copy_bidirectional(&mut client, &mut server).await
        };
        tokio::select! {
            biased;
            changed = mode.wait_for(|m| *m != ProxyMode::Forward) => changed.map(|m| *m).ok(),
            _ = forward => return, // Ended (either side closed, or the upstream is unreachable).
        }
    };
    match changed {
        Some(ProxyMode::Stall) => {
            // Hold the connection, read nothing, until the mode changes; then reset it.
            let _ = mode.wait_for(|m| *m != ProxyMode::Stall).await;
            reset(client, &shared);
        }
        Some(_) => reset(client, &shared),
        None => {} // The proxy is shutting down.
    }
}

/// Closes a connection with a TCP RST, so the peer fails at once.
fn reset(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_zero_linger();
    drop(stream);
    shared.reset.fetch_add(1, Ordering::SeqCst);
}
