//! The flags of `fleet baseline` and the settings they become, split by the part of the
//! baseline that reads them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use catalogsync::skr::access::AccessSettings;
use catalogsync::skr::destination::Destinations;

use super::pass::PassSettings;
use super::schedule::RequeuePolicy;
use super::skr::SkrSettings;

/// Where the simulated SKRs are.
const LOOPBACK: &str = "127.0.0.0/8";

/// Which parts of KLM's Kyma reconcile a pass reproduces.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reconcile {
    /// The catalog sync alone (the baseline of the fleet tables).
    #[default]
    Catalog,
    /// The catalog sync and the SKR and KCP requests of the reconcile around it (namespace,
    /// CRDs, SKR Kyma, KCP and SKR Kyma status).
    Full,
    /// The full reconcile without its catalog part: what KLM would still do per Kyma if
    /// catalogsync took the catalog over.
    WithoutCatalog,
}

impl Reconcile {
    /// The value as the flag takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reconcile::Catalog => "catalog",
            Reconcile::Full => "full",
            Reconcile::WithoutCatalog => "without-catalog",
        }
    }

    /// Whether a pass syncs the catalog.
    pub fn has_catalog(self) -> bool {
        self != Reconcile::WithoutCatalog
    }

    /// Whether a pass sends the reconcile's requests other than the catalog's.
    pub fn has_rest(self) -> bool {
        self != Reconcile::Catalog
    }
}

/// Flags of `fleet baseline`. Defaults are KLM's production values.
#[derive(clap::Args, Debug, Clone)]
pub struct BaselineArgs {
    /// KCP kubeconfig file. Without it, the usual inference applies ($KUBECONFIG,
    /// ~/.kube/config, in-cluster).
    #[arg(long, env = "FLEET_BASELINE_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// KCP namespace of the Kymas, their access Secrets and the catalog (KLM's cache namespace).
    #[arg(long, env = "FLEET_BASELINE_KCP_NAMESPACE", default_value = "kcp-system")]
    pub kcp_namespace: String,
    /// SKR namespace the catalog copies are written to (KLM `--sync-namespace`).
    #[arg(long, env = "FLEET_BASELINE_SYNC_NAMESPACE", default_value = "kyma-system")]
    pub sync_namespace: String,
    /// Comma-separated restricted module names (KLM `--restricted-default-modules`): their
    /// MRMs reach only Kymas matched by the MRM's `kymaSelector`.
    #[arg(long, env = "FLEET_BASELINE_RESTRICTED_MODULES", value_delimiter = ',')]
    pub restricted_modules: Vec<String>,
    /// Requeue delay after a successful pass (KLM `--kyma-requeue-success-interval`), such as
    /// 300s, 5m or 500ms.
    #[arg(long, env = "FLEET_BASELINE_PERIOD", default_value = "300s", value_parser = catalogsync::config::parse_duration)]
    pub period: Duration,
    /// Which parts of KLM's Kyma reconcile each pass reproduces.
    #[arg(long, env = "FLEET_BASELINE_RECONCILE", value_enum, default_value_t = Reconcile::Catalog)]
    pub reconcile: Reconcile,
    /// Concurrent Kyma reconciles (KLM `--max-concurrent-kyma-reconciles` in production).
    #[arg(long, env = "FLEET_BASELINE_WORKERS", default_value_t = 25, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// Timeout of one SKR request (connect, and the whole request).
    #[arg(long, env = "FLEET_BASELINE_REQUEST_TIMEOUT", default_value = "10s", value_parser = catalogsync::config::parse_duration)]
    pub request_timeout: Duration,
    /// First requeue delay after a failed pass, doubled per failure in a row (KLM
    /// `--failure-base-delay`).
    #[arg(long, env = "FLEET_BASELINE_FAILURE_BASE_DELAY", default_value = "5s", value_parser = catalogsync::config::parse_duration)]
    pub failure_base_delay: Duration,
    /// Cap of the failure requeue delay (KLM `--failure-max-delay`).
    #[arg(long, env = "FLEET_BASELINE_FAILURE_MAX_DELAY", default_value = "30s", value_parser = catalogsync::config::parse_duration)]
    pub failure_max_delay: Duration,
    /// Requests per second of one SKR client, a token bucket as client-go's (KLM
    /// `--k8s-skr-client-qps`); 0 disables the limit.
    #[arg(long, env = "FLEET_BASELINE_SKR_QPS", default_value_t = 50.0)]
    pub skr_qps: f64,
    /// Token-bucket size of one SKR client (KLM `--k8s-skr-client-burst`).
    #[arg(long, env = "FLEET_BASELINE_SKR_BURST", default_value_t = 100)]
    pub skr_burst: u32,
    /// Most requests in flight to one SKR; 0 means unbounded, as KLM. KLM multiplexes its
    /// unbounded goroutines over one HTTP/2 connection; this client speaks HTTP/1.1, where
    /// each concurrent request holds its own connection, so the bound keeps connections (and
    /// TLS handshakes) per pass near KLM's while keeping most of its parallelism.
    #[arg(long, env = "FLEET_BASELINE_SKR_MAX_IN_FLIGHT", default_value_t = 32)]
    pub skr_max_in_flight: u32,
    /// Keep each SKR client, and its idle connections, between passes (rebuilt when the
    /// access Secret changes). Off by default: at a 5m period KLM's connection has been closed
    /// as idle (90s) before the next pass, and thousands of SKRs' idle HTTP/1.1 pools would
    /// exhaust file descriptors; the client is then built per pass and dropped after it.
    #[arg(long, env = "FLEET_BASELINE_SKR_KEEP_CONNECTIONS")]
    pub skr_keep_connections: bool,
    /// Plain-HTTP stats address (`GET /stats`, `POST /reset`). Once bound, one line
    /// `{"admin":"<addr>"}` is printed to stdout.
    #[arg(long, env = "FLEET_BASELINE_ADMIN", default_value = "127.0.0.1:0")]
    pub admin: SocketAddr,
    /// Run one pass per Kyma known at start, print the final stats line and exit.
    #[arg(long, env = "FLEET_BASELINE_ONCE")]
    pub once: bool,
    /// With `--once`: keep serving the admin endpoint this long after the round, so a poller
    /// sees the final stats (SIGTERM ends it early).
    #[arg(long, env = "FLEET_BASELINE_ONCE_LINGER", default_value = "5s", value_parser = catalogsync::config::parse_duration)]
    pub once_linger: Duration,
}

/// The flags, grouped by the part of the baseline that reads them.
pub(super) struct Settings {
    /// KCP kubeconfig file (`None`: inferred).
    pub kubeconfig: Option<PathBuf>,
    /// KCP namespace of the Kymas, their access Secrets and the catalog.
    pub kcp_namespace: String,
    /// The admin address to bind.
    pub admin: SocketAddr,
    /// Concurrent Kyma reconciles.
    pub workers: u16,
    /// One round, then exit.
    pub once: bool,
    /// With `once`: how long the admin endpoint outlives the round.
    pub once_linger: Duration,
    /// What every pass reads.
    pub pass: PassSettings,
    /// When a Kyma is due again.
    pub requeue: RequeuePolicy,
    /// How SKR clients are built and bounded.
    pub skr: SkrSettings,
}

impl From<BaselineArgs> for Settings {
    fn from(args: BaselineArgs) -> Settings {
        let BaselineArgs {
            kubeconfig,
            kcp_namespace,
            sync_namespace,
            restricted_modules,
            period,
            reconcile,
            workers,
            request_timeout,
            failure_base_delay,
            failure_max_delay,
            skr_qps,
            skr_burst,
            skr_max_in_flight,
            skr_keep_connections,
            admin,
            once,
            once_linger,
        } = args;
        Settings {
            kubeconfig,
            kcp_namespace,
            admin,
            workers,
            once,
            once_linger,
            pass: PassSettings {
                sync_namespace,
                restricted: restricted_modules
                    .iter()
                    .map(|m| m.trim())
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
                    .collect(),
                request_timeout,
                reconcile,
            },
            requeue: RequeuePolicy { period, backoff_min: failure_base_delay, backoff_max: failure_max_delay, once },
            skr: SkrSettings {
                access: AccessSettings {
                    // The simulated SKRs listen on loopback.
                    destinations: Arc::new(Destinations::new(vec![LOOPBACK.parse().expect("LOOPBACK is a CIDR")])),
                    ..AccessSettings::new(format!("klm-baseline/{}", env!("CARGO_PKG_VERSION")), request_timeout)
                },
                qps: skr_qps,
                burst: skr_burst,
                max_in_flight: skr_max_in_flight,
                keep_connections: skr_keep_connections,
            },
        }
    }
}
