//! The SKR simulator: one process that answers, over HTTPS, for many SKR kube-apiservers at
//! once, so catalogsync replicas and the baseline can be driven against thousands of SKRs on
//! one machine.
//!
//! - **Identity.** Each SKR is named by the bearer token of the request (the kubeconfig of SKR
//!   `x` carries `token: x`). A token seen for the first time creates its SKR with the seed
//!   content (`--seed-file`). No token gives 401.
//! - **API.** Namespaces, CustomResourceDefinitions, and the namespaced ModuleTemplates,
//!   ModuleReleaseMetas and Kymas (`operator.kyma-project.io/v1beta2`), the latter served only
//!   while the SKR holds their CRD: get, list (in a namespace or across all), metadata-only get
//!   and list (`Accept: ...;as=PartialObjectMetadata[List]`), watch (ADDED per match, then open
//!   until `timeoutSeconds`, capped at 5 s), server-side apply, replace (409 on a stale
//!   resourceVersion), create (409 AlreadyExists) and delete; for Kymas also a replace of the
//!   `/status` subresource, which lifecycle-manager's Kyma reconcile sends. Field selectors on
//!   `metadata.name`/`metadata.namespace` and equality label selectors are honoured. Anything
//!   else is 404. See [`store`] for the write semantics.
//! - **Memory.** Object content is interned across SKRs by a content hash, so 5,000 SKRs
//!   holding the same catalog share one copy; per object only the server metadata is kept.
//! - **Faults.** Latency plus uniform jitter before every SKR answer, a deterministic fraction
//!   of 500 InternalError answers, and a list of SKRs answering 503; all replaceable at run
//!   time through the admin API. Note that kube-rs clients retry 503 (and 429, 504) by default,
//!   up to 15 times with exponential backoff from 5 ms, so a down SKR costs a default client
//!   several requests per call.
//! - **Admin.** A plain-HTTP JSON API (see [`admin`]) with counters, per-key service-time
//!   percentiles, per-SKR counts, propagation marks ([`MARK_ANNOTATION`]) and stored names;
//!   [`SimAdmin`] is its client.
//!
//! Serving 5,000+ keep-alive TLS connections needs file descriptors: the harness must raise
//! `ulimit -n` (the simulator does not; unsafe code is forbidden here).
//!
//! ```text
//! fleet sim --listen 127.0.0.1:6443 --admin 127.0.0.1:6444 --self-signed-dir /tmp/sim-pki
//! {"listen":"127.0.0.1:6443","admin":"127.0.0.1:6444"}
//! fleet sim-check --url https://127.0.0.1:6443 --ca /tmp/sim-pki/ca.pem --admin 127.0.0.1:6444
//! ```

mod admin;
mod check;
mod render;
mod server;
mod state;
mod stats;
mod store;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use catalogsync::config::parse_duration;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket};

use crate::stats::Percentiles;

pub use admin::SimAdmin;
pub use check::{CheckArgs, check};

/// Annotation whose value [`SimAdmin::marks`] tracks: the harness sets it on a KCP
/// ModuleTemplate, catalogsync copies it, and the simulator records when each SKR first held
/// each value.
pub const MARK_ANNOTATION: &str = "fleet.catalogsync.io/mark";

/// Faults injected into SKR requests (never into admin requests).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default)]
pub struct Faults {
    /// Delay before every SKR answer, in milliseconds.
    pub latency_ms: f64,
    /// Uniform extra delay in `[0, jitter_ms)`, in milliseconds.
    pub jitter_ms: f64,
    /// Fraction of SKR requests answered with 500 InternalError (0..1).
    pub error_rate: f64,
    /// Tokens of SKRs that answer every request with 503 ServiceUnavailable.
    pub down: Vec<String>,
}

/// Request counts of one SKR.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct SkrCounts {
    /// Requests, faulted ones included.
    pub requests: u64,
    /// Apply, replace, create and delete requests that reached the store (no-ops and
    /// refused writes included).
    pub writes: u64,
    /// Writes that changed stored state.
    pub changed_writes: u64,
}

/// Counters of the simulator since start or the last reset.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SimStats {
    /// SKRs created so far (never reset).
    pub skrs: usize,
    /// SKR requests (admin requests are not counted; neither are requests without a token).
    pub total_requests: u64,
    /// Requests by `"<verb> <resource>"`: verb one of `get`, `get-meta`, `list`, `list-meta`,
    /// `watch`, `apply`, `replace`, `replace-status`, `create`, `delete` (`other` for
    /// unsupported methods); resource the plural (`namespaces`, `customresourcedefinitions`,
    /// `moduletemplates`, `modulereleasemetas`, `kymas`, or `other` for unknown paths).
    /// Faulted requests included.
    pub requests: BTreeMap<String, u64>,
    /// Apply, replace, create and delete requests that reached the store (no-op applies and
    /// refused writes included; faulted ones not).
    pub writes: u64,
    /// Writes that changed stored state.
    pub changed_writes: u64,
    /// Requests answered with an injected 500 or 503.
    pub injected_errors: u64,
    /// TLS handshakes completed (every SKR shares the simulator's listener).
    #[serde(default)]
    pub handshakes: u64,
    /// Of them, resumed sessions (no certificate sent or signed).
    #[serde(default)]
    pub resumed_handshakes: u64,
    /// Server-side time from request received to response ready, excluding injected latency,
    /// by the same key as `requests` (faulted requests are not measured; for a watch, the time
    /// to the response head). Percentiles in microseconds, from log buckets (error below 1%;
    /// `max` is exact).
    pub service_us: BTreeMap<String, Percentiles>,
    /// Counts per SKR token, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_skr: Option<BTreeMap<String, SkrCounts>>,
}

/// Which SKRs hold an object with a given mark.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// SKRs existing.
    pub skrs: usize,
    /// SKRs holding the object (with the mark value, when one was given).
    pub holding: usize,
    /// Per holding SKR, sorted: the unix time (ms) of the write that last changed the mark
    /// value (or created the object); without a value, the creation time.
    pub first_held_unix_ms: Vec<u64>,
}

/// One entry of a `--seed-file` (a JSON array of these).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SeedEntry {
    /// Field manager recorded for the object (operation Apply).
    pub manager: String,
    /// The full Kubernetes object (Namespace, CustomResourceDefinition, ModuleTemplate or
    /// ModuleReleaseMeta).
    pub object: Value,
}

/// `fleet sim` flags.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// HTTPS address of the SKR API. Port 0 picks a free port; the bound addresses are printed
    /// to stdout as one JSON line `{"listen":"...","admin":"..."}`.
    #[arg(long, env = "FLEET_SIM_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Plain-HTTP address of the admin API.
    #[arg(long, env = "FLEET_SIM_ADMIN", default_value = "127.0.0.1:0")]
    pub admin: SocketAddr,
    /// PEM serving certificate (chain) for 127.0.0.1.
    #[arg(long, env = "FLEET_SIM_TLS_CERT", requires = "tls_key", help_heading = "TLS")]
    pub tls_cert: Option<PathBuf>,
    /// PEM (PKCS#8) private key of the serving certificate.
    #[arg(long, env = "FLEET_SIM_TLS_KEY", requires = "tls_cert", help_heading = "TLS")]
    pub tls_key: Option<PathBuf>,
    /// Without `--tls-cert`/`--tls-key`: directory holding `ca.pem`, `server.pem` and
    /// `server-key.pem`; a fresh CA and a server certificate for 127.0.0.1 and localhost are
    /// generated there when they are absent. Put `ca.pem` into the SKR kubeconfigs.
    #[arg(long, env = "FLEET_SIM_SELF_SIGNED_DIR", help_heading = "TLS")]
    pub self_signed_dir: Option<PathBuf>,
    /// Delay added before answering every SKR request, such as `20ms`.
    #[arg(long, env = "FLEET_SIM_LATENCY", default_value = "0ms", value_parser = parse_duration, help_heading = "Faults")]
    pub latency: Duration,
    /// Uniform extra delay, up to this much, on top of `--latency`.
    #[arg(long, env = "FLEET_SIM_JITTER", default_value = "0ms", value_parser = parse_duration, help_heading = "Faults")]
    pub jitter: Duration,
    /// Fraction (0..1) of SKR requests answered with 500 InternalError.
    #[arg(long, env = "FLEET_SIM_ERROR_RATE", default_value_t = 0.0, value_parser = parse_rate, help_heading = "Faults")]
    pub error_rate: f64,
    /// Seed of the fault and jitter rolls (deterministic in request order).
    #[arg(long, env = "FLEET_SIM_RNG_SEED", default_value_t = 0, help_heading = "Faults")]
    pub rng_seed: u64,
    /// JSON array of `{"manager": "...", "object": {...}}` every new SKR starts with.
    #[arg(long, env = "FLEET_SIM_SEED_FILE")]
    pub seed_file: Option<PathBuf>,
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("invalid rate {text:?}: use a number from 0 to 1")),
    }
}

/// PEM files of a self-signed simulator PKI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate (for kubeconfigs).
    pub ca: PathBuf,
    /// The serving certificate.
    pub cert: PathBuf,
    /// The serving key (PKCS#8).
    pub key: PathBuf,
}

/// Returns the PKI files in `dir`, generating a fresh CA and serving certificate (for
/// 127.0.0.1 and localhost) when any is missing.
///
/// # Errors
/// When generation or writing fails.
pub fn ensure_self_signed(dir: &Path) -> Result<TlsFiles> {
    let files = TlsFiles { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server-key.pem") };
    if [&files.ca, &files.cert, &files.key].iter().all(|p| p.exists()) {
        return Ok(files);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let pki = testenv::pki::Pki::generate("fleet-sim")?;
    for (path, pem) in
        [(&files.ca, &pki.ca_pem), (&files.cert, &pki.serving.cert_pem), (&files.key, &pki.serving.key_pem)]
    {
        std::fs::write(path, pem).with_context(|| format!("failed to write {}", path.display()))?;
    }
    Ok(files)
}

fn load_seed(path: Option<&Path>, interner: &store::Interner) -> Result<Vec<store::SeedObject>> {
    let Some(path) = path else { return Ok(Vec::new()) };
    let text = std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))?;
    let entries: Vec<SeedEntry> =
        serde_json::from_slice(&text).with_context(|| format!("failed to parse {}", path.display()))?;
    let now = crate::stats::unix_ms();
    let mut seed = entries
        .into_iter()
        .map(|e| {
            store::SeedObject::new(&e.manager, e.object, now, interner)
                .map_err(|err| anyhow::anyhow!("invalid seed object in {}: {}", path.display(), err.message))
        })
        .collect::<Result<Vec<_>>>()?;
    // CRDs and namespaces first, as an apiserver would need them.
    seed.sort_by_key(|s| s.res.namespaced());
    Ok(seed)
}

/// Listen backlog: thousands of clients connect at once when a run starts; the kernel caps
/// it at `net.core.somaxconn`.
const BACKLOG: u32 = 8192;

fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr).with_context(|| format!("failed to bind {addr}"))?;
    socket.listen(BACKLOG).with_context(|| format!("failed to listen on {addr}"))
}

/// Serves the SKR API and the admin API until killed.
///
/// # Errors
/// When the TLS material, the seed file or an address is unusable, or a server fails.
pub async fn serve(args: SimArgs) -> Result<()> {
    let SimArgs { listen, admin, tls_cert, tls_key, self_signed_dir, latency, jitter, error_rate, rng_seed, seed_file } =
        args;
    let (cert, key) = match (tls_cert, tls_key, self_signed_dir) {
        (Some(cert), Some(key), _) => (cert, key),
        (_, _, Some(dir)) => {
            let files = ensure_self_signed(&dir)?;
            (files.cert, files.key)
        }
        _ => anyhow::bail!("give --tls-cert and --tls-key, or --self-signed-dir"),
    };
    let acceptor = server::acceptor(&cert, &key)?;
    let interner = store::Interner::default();
    let seed = load_seed(seed_file.as_deref(), &interner)?;
    let faults = Faults {
        latency_ms: latency.as_secs_f64() * 1000.0,
        jitter_ms: jitter.as_secs_f64() * 1000.0,
        error_rate,
        down: Vec::new(),
    };
    let seeded = seed.len();
    let sim = Arc::new(state::Sim::new(seed, interner, &faults, rng_seed));
    let skr_listener = bind(listen)?;
    let admin_listener = bind(admin)?;
    let (listen, admin) = (skr_listener.local_addr()?, admin_listener.local_addr()?);
    println!(r#"{{"listen":"{listen}","admin":"{admin}"}}"#);
    eprintln!("fleet sim: serving the SKR API on {listen} and the admin API on {admin} with {seeded} seed objects");
    tokio::try_join!(server::run(skr_listener, acceptor, sim.clone()), admin::run(admin_listener, sim))?;
    Ok(())
}
