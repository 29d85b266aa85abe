//! Command line and environment configuration. Every flag of `run` is also an environment
//! variable; `--help` explains each one.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::skr::destination::Rule;

/// catalogsync syncs Kyma's module catalog (ModuleTemplates and ModuleReleaseMetas) from the
/// KCP to every SKR, keeps it in sync on create, update and delete, and repairs drift.
#[derive(Debug, Parser)]
#[command(name = "catalogsync", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller against the KCP of the current kubeconfig (in-cluster config when
    /// run as a pod, else KUBECONFIG or ~/.kube/config).
    Run(Box<RunArgs>),
    /// Print the CRDs of Kyma, ModuleTemplate and ModuleReleaseMeta as YAML.
    Crds,
    /// Print the current shard assignment (shard, holder, desired holder, SKR count) from the
    /// Leases, using the current kubeconfig.
    Shards(ShardsArgs),
    /// Explain one Kyma's module catalog: what its SKR should hold and, for every catalog entry
    /// it does not get, why. With --skr, also what the SKR holds against that.
    #[command(
        long_about = "Explains one Kyma's module catalog, read from the KCP of the current kubeconfig: the \
                      ModuleReleaseMetas and ModuleTemplates its SKR should hold and, for every catalog entry it \
                      does not get, why (mandatory, beta, internal, restricted module whose selector does not \
                      match, invalid selector, selector on a module that is not restricted, no ModuleTemplate for \
                      a channel's version, not referenced by any surviving channel, old-style, malformed). This \
                      answers \"why doesn't my cluster have module X\".\n\n\
                      With --skr it also reads the SKR, through the Kyma's access Secret and under the same rules \
                      as the controller (kubeconfig allowlist, --skr-allowed-destinations, bounded answers), \
                      without writing anything, and compares what it holds with the desired catalog: in \
                      agreement, missing, different, extra (a managed copy the controller would prune) and \
                      user-owned, per kind. Nothing of the Secret is printed.\n\n\
                      Exit status: 0 when explained (whether or not the SKR agrees); 1 when the KCP part failed \
                      (no such Kyma, the KCP could not be read), with nothing on stdout; 3 when the KCP part was \
                      printed but the SKR could not be read (no or several access Secrets, a refused kubeconfig, \
                      an unreachable SKR), with the reason in the output and on stderr.",
        after_help = "Field names of -o json and every reason code: docs/explain.md."
    )]
    Explain(Box<ExplainArgs>),
}

/// Output format of `catalogsync explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Tables for people.
    Table,
    /// One JSON document with stable field names (docs/explain.md).
    Json,
}

/// Flags of `catalogsync explain`. The catalog and SKR access flags are those of `run`, with
/// the same environment variables and defaults, so that in the controller's pod `explain`
/// gives the controller's answer and refuses what the controller refuses.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// Name of the Kyma (in --kcp-namespace).
    #[arg(value_name = "KYMA")]
    pub kyma: String,

    /// Also read the Kyma's SKR and compare what it holds with the desired catalog.
    #[arg(long)]
    pub skr: bool,

    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: OutputFormat,

    /// Which catalog a Kyma gets and where its copies live.
    #[command(flatten)]
    pub catalog: CatalogFlags,

    /// Which SKR apiservers may be reached, and how much of an answer is read.
    #[command(flatten)]
    pub skr_access: SkrAccessArgs,

    /// Timeout of one request to the SKR.
    #[arg(long, env = "CATALOGSYNC_SKR_REQUEST_TIMEOUT", default_value = "3s", value_parser = parse_duration, help_heading = "SKR access")]
    pub skr_request_timeout: Duration,

    /// Timeout of the whole read of the SKR.
    #[arg(long, env = "CATALOGSYNC_SYNC_TIMEOUT", default_value = "60s", value_parser = parse_duration, help_heading = "SKR access")]
    pub sync_timeout: Duration,

    /// Timeout of one request to the KCP apiserver.
    #[arg(long, env = "CATALOGSYNC_KCP_REQUEST_TIMEOUT", default_value = "5s", value_parser = parse_duration, help_heading = "SKR access")]
    pub kcp_request_timeout: Duration,
}

/// The flags of SKR access: one definition for `run` and `explain`, so that `explain` refuses
/// what the controller refuses.
#[derive(Debug, Clone, Args)]
pub struct SkrAccessArgs {
    /// Where SKR apiservers may be, comma-separated: `public` (any public IP address), CIDRs
    /// (`10.250.0.0/16`), DNS suffixes (`.example.com`). A kubeconfig whose server is, or
    /// resolves to, anything else is rejected (AccessSecretInvalid). The KCP apiserver is
    /// never allowed. A name under a listed suffix may resolve to private addresses, never
    /// to loopback or link-local ones unless a listed CIDR covers them.
    #[arg(
        long,
        env = "CATALOGSYNC_SKR_ALLOWED_DESTINATIONS",
        value_delimiter = ',',
        default_value = "public",
        help_heading = "SKR access"
    )]
    pub skr_allowed_destinations: Vec<Rule>,

    /// Accept `insecure-skip-tls-verify: true` in SKR kubeconfigs. For local development
    /// only: the SKR's identity is then not verified. Reported by the metric
    /// catalogsync_skr_insecure_tls_allowed.
    #[arg(long, env = "CATALOGSYNC_ALLOW_INSECURE_SKR_TLS", help_heading = "SKR access")]
    pub allow_insecure_skr_tls: bool,

    /// Largest SKR answer read, in bytes (suffixes Ki, Mi, Gi). A larger one fails that
    /// sync (SkrResponseTooLarge) after at most this much was read. Lists are read in pages
    /// of 50 copies, so this bounds one page.
    #[arg(long, env = "CATALOGSYNC_SKR_MAX_RESPONSE_SIZE", default_value = "8Mi", value_parser = parse_size, help_heading = "SKR access")]
    pub skr_max_response_size: usize,

    /// Most bytes read from one SKR in one sync, every answer together (all pages of both
    /// kinds, apply answers, error bodies; suffixes Ki, Mi, Gi). A sync over it fails at once
    /// (SkrBudgetExceeded) and backs off as any failed sync. The default holds a cold
    /// verification of a catalog of 200 ModuleTemplates of 50 KB three times over.
    #[arg(long, env = "CATALOGSYNC_SKR_SYNC_BUDGET", default_value = "64Mi", value_parser = parse_size, help_heading = "SKR access")]
    pub skr_sync_budget: usize,
}

/// The flags that decide which catalog a Kyma gets and where its copies live: one definition
/// for `run` and `explain`, so that `explain` computes the controller's answer.
#[derive(Debug, Clone, Args)]
pub struct CatalogFlags {
    /// Namespace in the KCP that holds the Kymas, their access Secrets and the catalog.
    #[arg(long, env = "CATALOGSYNC_KCP_NAMESPACE", default_value = "kcp-system", help_heading = "Catalog")]
    pub kcp_namespace: String,

    /// Namespace in each SKR that receives the catalog copies (created if missing).
    #[arg(long, env = "CATALOGSYNC_SYNC_NAMESPACE", default_value = "kyma-system", help_heading = "Catalog")]
    pub sync_namespace: String,

    /// Comma-separated module names that only Kymas matching the module's
    /// ModuleReleaseMeta `spec.kymaSelector` may see.
    #[arg(
        long,
        env = "CATALOGSYNC_RESTRICTED_MODULES",
        value_delimiter = ',',
        default_value = "",
        hide_default_value = true,
        help_heading = "Catalog"
    )]
    pub restricted_modules: Vec<String>,
}

impl CatalogFlags {
    /// The restricted module names as a set, without empty entries.
    pub fn restricted_set(&self) -> BTreeSet<String> {
        restricted_set(&self.restricted_modules)
    }
}

/// Flags of `catalogsync shards`.
#[derive(Debug, Clone, Args)]
pub struct ShardsArgs {
    /// Namespace of catalogsync's Leases.
    #[arg(long, env = "POD_NAMESPACE", default_value = "catalogsync-system")]
    pub lease_namespace: String,
    /// Namespace of the Kymas.
    #[arg(long, env = "CATALOGSYNC_KCP_NAMESPACE", default_value = "kcp-system")]
    pub kcp_namespace: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

/// What a replica does with what it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Sync the catalog to every SKR and report on the Kyma's `ModuleCatalog` condition.
    Active,
    /// Compare only: everything runs (watches, shard Leases, desired sets, SKR reads), but
    /// nothing is written to an SKR and no condition or Event to the KCP. Each SKR's
    /// agreement with the desired catalog is exported as metrics (docs/migration.md).
    Shadow,
}

impl Mode {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Active => "active",
            Mode::Shadow => "shadow",
        }
    }
}

/// Flags of `catalogsync run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// `active` syncs the catalog and writes each Kyma's `ModuleCatalog` condition. `shadow`
    /// runs everything but writes nothing to any SKR and no condition or Event to the KCP (its
    /// own Leases aside); it compares what each SKR holds with what catalogsync would have it
    /// hold and exports that as metrics: the way to prove agreement with lifecycle-manager on a
    /// live fleet before taking the sync over (docs/migration.md).
    #[arg(long, env = "CATALOGSYNC_MODE", value_enum, default_value = "active", help_heading = "Sync")]
    pub mode: Mode,

    /// Which catalog a Kyma gets and where its copies live.
    #[command(flatten)]
    pub catalog: CatalogFlags,

    /// Largest share of the catalog one change may take away from the SKRs without a human's
    /// confirmation: a fraction of the modules (ModuleReleaseMetas) or of the versions
    /// (ModuleTemplates) that SKRs get, each kind on its own, compared with the catalog
    /// published last. A catalog state that loses more is held back (the previous one stays
    /// published, nothing is pruned) until the objects come back or someone confirms it on
    /// the coordinator Lease. 1 switches the guard off.
    #[arg(long, env = "CATALOGSYNC_CATALOG_SHRINK_THRESHOLD", default_value = "0.5", help_heading = "Catalog")]
    pub catalog_shrink_threshold: f64,

    /// How often every SKR is re-checked to repair drift, even without a KCP change.
    #[arg(long, env = "CATALOGSYNC_RESYNC_PERIOD", default_value = "5m", value_parser = parse_duration, help_heading = "Sync")]
    pub resync_period: Duration,

    /// Random extra delay added to each resync, as a fraction of the resync period, so SKRs
    /// do not all resync at once.
    #[arg(long, env = "CATALOGSYNC_RESYNC_JITTER", default_value = "0.1", help_heading = "Sync")]
    pub resync_jitter: f64,

    /// How long catalog changes are gathered before the affected SKRs are synced, so that a
    /// release touching several objects costs one sync per SKR.
    #[arg(long, env = "CATALOGSYNC_CATALOG_DEBOUNCE", default_value = "500ms", value_parser = parse_duration, help_heading = "Sync")]
    pub catalog_debounce: Duration,

    /// Most SKRs this replica syncs at the same time. A catalog change to a warm SKR costs
    /// one apply per changed object and mostly waits for the SKR, so many such syncs run at
    /// once; the syncs that list the SKR are bounded by --listing-concurrency.
    #[arg(long, env = "CATALOGSYNC_CONCURRENCY", default_value = "128", help_heading = "Sync")]
    pub concurrency: u16,

    /// Most syncs at the same time that list the SKR: every sync but a catalog change to a
    /// warm SKR (first syncs by this replica, resyncs, retries after a failure). Such a sync
    /// holds more (lists, often many applies, its connections) for longer.
    #[arg(long, env = "CATALOGSYNC_LISTING_CONCURRENCY", default_value = "64", help_heading = "Sync")]
    pub listing_concurrency: usize,

    /// Most requests in flight to one SKR at the same time.
    #[arg(long, env = "CATALOGSYNC_SKR_CONCURRENCY", default_value = "4", help_heading = "Sync")]
    pub skr_concurrency: usize,

    /// Most full lists of SKR copies this replica reads at the same time. A sync lists in full
    /// only when it is cold (the first sync of an SKR by this replica, or after a failure); a
    /// full list carries every copy of a kind, about 2 MB for a catalog of 25 modules, so this
    /// bounds memory when many SKRs sync cold at once (start-up, shard takeover).
    #[arg(long, env = "CATALOGSYNC_FULL_LIST_CONCURRENCY", default_value = "8", help_heading = "Sync")]
    pub full_list_concurrency: usize,

    /// Most applies to SKRs this replica has in flight at the same time, over all SKRs. Each
    /// holds its body (a ModuleTemplate copy is about 30 KB), so this bounds memory when many
    /// SKRs need many objects at once (a release). At least --skr-concurrency.
    #[arg(long, env = "CATALOGSYNC_APPLY_CONCURRENCY", default_value = "256", help_heading = "Sync")]
    pub apply_concurrency: usize,

    /// Timeout of one request to an SKR (connect, send and read).
    #[arg(long, env = "CATALOGSYNC_SKR_REQUEST_TIMEOUT", default_value = "3s", value_parser = parse_duration, help_heading = "Sync")]
    pub skr_request_timeout: Duration,

    /// Timeout of a whole sync of one SKR.
    #[arg(long, env = "CATALOGSYNC_SYNC_TIMEOUT", default_value = "60s", value_parser = parse_duration, help_heading = "Sync")]
    pub sync_timeout: Duration,

    /// First retry delay after a failed sync; doubles (with jitter) per failure in a row.
    #[arg(long, env = "CATALOGSYNC_BACKOFF_MIN", default_value = "5s", value_parser = parse_duration, help_heading = "Sync")]
    pub backoff_min: Duration,

    /// Longest retry delay after failed syncs.
    #[arg(long, env = "CATALOGSYNC_BACKOFF_MAX", default_value = "5m", value_parser = parse_duration, help_heading = "Sync")]
    pub backoff_max: Duration,

    /// Which SKR apiservers may be reached, and how much of an answer is read.
    #[command(flatten)]
    pub skr_access: SkrAccessArgs,

    /// Number of shards the SKR set is split into. Every replica must use the same value.
    #[arg(long, env = "CATALOGSYNC_SHARDS", default_value = "64", value_parser = clap::value_parser!(u32).range(1..=4096), help_heading = "Sharding")]
    pub shards: u32,

    /// Namespace of the member, shard and coordinator Leases and of the shard records
    /// (ConfigMaps catalogsync-shard-N-memory: what a replica keeps of a shard's SKRs for the
    /// next holder), the pod's namespace in a cluster.
    #[arg(long, env = "POD_NAMESPACE", default_value = "catalogsync-system", help_heading = "Sharding")]
    pub lease_namespace: String,

    /// How long a member Lease stays valid without renewal. A crashed replica's shards move
    /// after about this long. A whole number of seconds, as Leases store it.
    #[arg(long, env = "CATALOGSYNC_LEASE_DURATION", default_value = "15s", value_parser = parse_duration, help_heading = "Sharding")]
    pub lease_duration: Duration,

    /// How long after its last successful member Lease renewal a replica keeps writing to
    /// SKRs. Must leave room for one SKR request before the Lease expires:
    /// renew deadline + SKR request timeout <= lease duration.
    #[arg(long, env = "CATALOGSYNC_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration, help_heading = "Sharding")]
    pub renew_deadline: Duration,

    /// How often Leases are renewed and shard ownership is re-evaluated.
    #[arg(long, env = "CATALOGSYNC_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration, help_heading = "Sharding")]
    pub retry_period: Duration,

    /// Longest wait for in-flight syncs of a shard that moves to another replica before it
    /// is released anyway. At least the SKR request timeout.
    #[arg(long, env = "CATALOGSYNC_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration, help_heading = "Sharding")]
    pub drain_timeout: Duration,

    /// Timeout of one request to the KCP apiserver (Lease renewals and writes, access Secret
    /// reads, condition writes, Events). Watches are not affected.
    #[arg(long, env = "CATALOGSYNC_KCP_REQUEST_TIMEOUT", default_value = "5s", value_parser = parse_duration, help_heading = "Operations")]
    pub kcp_request_timeout: Duration,

    /// Address of the HTTP server for /metrics, /healthz, /readyz and /debug/shards.
    #[arg(long, env = "CATALOGSYNC_HTTP_ADDR", default_value = "0.0.0.0:8080", help_heading = "Operations")]
    pub http_addr: SocketAddr,

    /// Name of this replica: the pod name in a cluster. Used in events and logs.
    #[arg(long, env = "POD_NAME", default_value = "catalogsync", help_heading = "Operations")]
    pub identity: String,

    /// Log format.
    #[arg(long, env = "CATALOGSYNC_LOG_FORMAT", value_enum, default_value = "plain", help_heading = "Operations")]
    pub log_format: LogFormat,

    /// Log filter, in tracing's EnvFilter syntax (for example `info,catalogsync=debug`). The
    /// default quiets the election library, which logs every renewal attempt.
    #[arg(
        long,
        env = "CATALOGSYNC_LOG",
        default_value = "info,kube_leader_election=warn",
        help_heading = "Operations"
    )]
    pub log_filter: String,

    /// How long in-flight work may take to finish after SIGTERM.
    #[arg(long, env = "CATALOGSYNC_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = parse_duration, help_heading = "Operations")]
    pub shutdown_timeout: Duration,
}

impl RunArgs {
    /// Checks relations between flags that clap cannot.
    ///
    /// # Errors
    /// The first [`ConfigError`] found; its message names the offending flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.resync_jitter) {
            return Err(ConfigError::ResyncJitterOutOfRange);
        }
        if !(0.0..=1.0).contains(&self.catalog_shrink_threshold) {
            return Err(ConfigError::ShrinkThresholdOutOfRange);
        }
        if self.resync_period.is_zero() {
            return Err(ConfigError::ResyncPeriodZero);
        }
        if self.concurrency == 0
            || self.skr_concurrency == 0
            || self.full_list_concurrency == 0
            || self.apply_concurrency == 0
            || self.listing_concurrency == 0
        {
            return Err(ConfigError::ConcurrencyZero);
        }
        if self.apply_concurrency < self.skr_concurrency {
            return Err(ConfigError::ApplyConcurrencyBelowSkr);
        }
        if self.backoff_min > self.backoff_max {
            return Err(ConfigError::BackoffMinAboveMax);
        }
        if self.lease_duration.subsec_nanos() != 0 {
            return Err(ConfigError::LeaseDurationFraction(self.lease_duration));
        }
        if self.renew_deadline + self.skr_request_timeout > self.lease_duration {
            return Err(ConfigError::RenewDeadlineTooLong);
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ConfigError::RetryPeriodTooLong);
        }
        if self.kcp_request_timeout.is_zero() {
            return Err(ConfigError::KcpRequestTimeoutZero);
        }
        if self.drain_timeout < self.skr_request_timeout {
            return Err(ConfigError::DrainTimeoutTooShort);
        }
        if !is_dns_label(&self.identity) {
            return Err(ConfigError::InvalidIdentity(self.identity.clone()));
        }
        Ok(())
    }
}

/// A combination of `run` flags that clap accepts but catalogsync cannot run with. Each
/// message names the flags and the rule they break.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `--resync-jitter` is not a fraction.
    #[error("--resync-jitter must be between 0 and 1")]
    ResyncJitterOutOfRange,
    /// `--catalog-shrink-threshold` is not a fraction.
    #[error("--catalog-shrink-threshold must be between 0 and 1 (1 switches the guard off)")]
    ShrinkThresholdOutOfRange,
    /// `--resync-period` is zero.
    #[error("--resync-period must be positive")]
    ResyncPeriodZero,
    /// A concurrency flag is zero.
    #[error(
        "--concurrency, --listing-concurrency, --skr-concurrency, --full-list-concurrency and --apply-concurrency must be at least 1"
    )]
    ConcurrencyZero,
    /// `--apply-concurrency` is below `--skr-concurrency`.
    #[error(
        "--apply-concurrency must be at least --skr-concurrency: one sync takes the permits for its applies at once"
    )]
    ApplyConcurrencyBelowSkr,
    /// `--backoff-min` exceeds `--backoff-max`.
    #[error("--backoff-min must not exceed --backoff-max")]
    BackoffMinAboveMax,
    /// `--lease-duration` has a fraction of a second.
    #[error(
        "--lease-duration {0:?} must be a whole number of seconds: Leases store leaseDurationSeconds, so a \
         fraction would be cut off and could break --renew-deadline plus --skr-request-timeout <= \
         --lease-duration"
    )]
    LeaseDurationFraction(Duration),
    /// A fenced replica's last SKR request could outlive its member Lease.
    #[error(
        "--renew-deadline plus --skr-request-timeout must not exceed --lease-duration: a fenced \
         replica's last SKR request must end before its shards can move"
    )]
    RenewDeadlineTooLong,
    /// `--retry-period` is not shorter than `--renew-deadline`.
    #[error("--retry-period must be shorter than --renew-deadline")]
    RetryPeriodTooLong,
    /// `--kcp-request-timeout` is zero.
    #[error("--kcp-request-timeout must be positive")]
    KcpRequestTimeoutZero,
    /// `--drain-timeout` is shorter than `--skr-request-timeout`.
    #[error("--drain-timeout must be at least --skr-request-timeout")]
    DrainTimeoutTooShort,
    /// `--identity` cannot be part of a Lease name.
    #[error("--identity {0:?} must be a DNS label (lower-case alphanumerics and '-')")]
    InvalidIdentity(String),
}

/// A flag value that does not parse; the message quotes the text and shows the format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not a size.
    #[error("invalid size {0:?}: use bytes or a number with Ki, Mi or Gi, such as 8Mi")]
    Size(String),
    /// A size below the smallest that works.
    #[error("invalid size {0:?}: at least 64Ki (an SKR's error answers are read up to 64Ki)")]
    SizeTooSmall(String),
    /// Not a duration.
    #[error("invalid duration {0:?}: use a number with a unit, such as 500ms, 10s, 5m or 1h")]
    Duration(String),
}

/// `--restricted-modules` as a set, entries trimmed, empty ones dropped.
fn restricted_set(modules: &[String]) -> BTreeSet<String> {
    modules.iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()
}

/// Whether `s` can be part of a Lease name.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Parses sizes such as `8Mi`, `512Ki`, `1Gi` or `1048576` (bytes).
///
/// # Errors
/// [`ValueError::Size`] when the text is not such a size, [`ValueError::SizeTooSmall`] below
/// 64Ki.
pub fn parse_size(text: &str) -> Result<usize, ValueError> {
    let err = || ValueError::Size(text.to_owned());
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let value: usize = text[..digits].parse().map_err(|_| err())?;
    let unit = match &text[digits..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(err()),
    };
    let size = value.checked_mul(unit).ok_or_else(err)?;
    if size < 64 * 1024 {
        return Err(ValueError::SizeTooSmall(text.to_owned()));
    }
    Ok(size)
}

/// Parses durations such as `500ms`, `10s`, `5m`, `1h` or `1m30s`.
///
/// # Errors
/// [`ValueError::Duration`] when the text is not such a duration.
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let err = || ValueError::Duration(text.to_owned());
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value * 60),
            "h" => Duration::from_secs(value * 3600),
            _ => return Err(err()),
        };
        total += unit;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_run_flag_has_an_env_var() {
        let cmd = Cli::command();
        let run = cmd.find_subcommand("run").expect("run subcommand exists");
        for arg in run.get_arguments().filter(|a| a.get_long().is_some()) {
            assert!(arg.get_env().is_some(), "flag --{} has no env var", arg.get_id());
        }
    }

    #[test]
    fn explain_takes_run_flags_with_their_env_vars_and_defaults() {
        let cmd = Cli::command();
        let run = cmd.find_subcommand("run").expect("run subcommand exists");
        let explain = cmd.find_subcommand("explain").expect("explain subcommand exists");
        let mut shared = Vec::new();
        for arg in explain.get_arguments().filter(|a| a.get_long().is_some()) {
            let long = arg.get_long();
            match run.get_arguments().find(|r| r.get_long() == long) {
                Some(same) => {
                    assert_eq!(arg.get_env(), same.get_env(), "--{long:?} has another env var than in run");
                    assert_eq!(
                        arg.get_default_values(),
                        same.get_default_values(),
                        "--{long:?} has another default than in run"
                    );
                    shared.extend(long);
                }
                None => assert!(matches!(long, Some("skr" | "output")), "--{long:?} of explain is not a flag of run"),
            }
        }
        assert_eq!(
            shared,
            [
                "kcp-namespace",
                "sync-namespace",
                "restricted-modules",
                "skr-allowed-destinations",
                "allow-insecure-skr-tls",
                "skr-max-response-size",
                "skr-sync-budget",
                "skr-request-timeout",
                "sync-timeout",
                "kcp-request-timeout",
            ]
        );
    }

    #[test]
    fn explain_parses_like_run() {
        let cli = Cli::try_parse_from([
            "catalogsync",
            "explain",
            "kyma-1",
            "--skr",
            "-o",
            "json",
            "--restricted-modules",
            " a, ,b",
            "--skr-allowed-destinations",
            "127.0.0.0/8,public",
        ])
        .expect("flags parse");
        let Command::Explain(args) = cli.command else { unreachable!("explain was given") };
        assert_eq!(args.kyma, "kyma-1");
        assert!(args.skr);
        assert_eq!(args.output, OutputFormat::Json);
        assert_eq!(args.catalog.restricted_set(), BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        assert_eq!(args.skr_access.skr_allowed_destinations.len(), 2);
        let defaults = Cli::try_parse_from(["catalogsync", "explain", "k"]).expect("defaults parse");
        let Command::Explain(args) = defaults.command else { unreachable!("explain was given") };
        assert_eq!((args.output, args.skr), (OutputFormat::Table, false));
        assert!(Cli::try_parse_from(["catalogsync", "explain"]).is_err(), "the Kyma is required");
    }

    #[test]
    fn catalog_shrink_threshold_is_a_fraction_that_defaults_to_half() {
        let parse = |flags: &[&str]| {
            let cli = Cli::try_parse_from(["catalogsync", "run"].iter().chain(flags)).expect("flags parse");
            let Command::Run(args) = cli.command else { unreachable!("run was given") };
            args
        };
        assert_eq!(parse(&[]).catalog_shrink_threshold, 0.5);
        for ok in ["0", "0.25", "1"] {
            assert_eq!(parse(&["--catalog-shrink-threshold", ok]).validate(), Ok(()), "{ok}");
        }
        for bad in ["-0.1", "1.5", "NaN"] {
            let flag = format!("--catalog-shrink-threshold={bad}");
            let err = parse(&[&flag]).validate().expect_err(bad).to_string();
            assert!(err.contains("--catalog-shrink-threshold"), "{err}");
        }
    }

    #[test]
    fn concurrency_bounds_are_checked() {
        let parse = |flags: &[&str]| {
            let cli = Cli::try_parse_from(["catalogsync", "run"].iter().chain(flags)).expect("flags parse");
            let Command::Run(args) = cli.command else { unreachable!("run was given") };
            args.validate()
        };
        assert_eq!(parse(&[]), Ok(()));
        assert_eq!(parse(&["--listing-concurrency", "0"]), Err(ConfigError::ConcurrencyZero));
        assert_eq!(parse(&["--apply-concurrency", "4", "--skr-concurrency", "4"]), Ok(()));
        assert_eq!(
            parse(&["--apply-concurrency", "3", "--skr-concurrency", "4"]),
            Err(ConfigError::ApplyConcurrencyBelowSkr),
            "one sync takes up to --skr-concurrency apply permits at once"
        );
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("ten s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8Mi"), Ok(8 << 20));
        assert_eq!(parse_size("512Ki"), Ok(512 << 10));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("100000"), Ok(100_000));
        for bad in ["", "8MB", "Mi", "-1Mi", "1Ki", "99999999999999999999Gi"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_validate() {
        let cli = Cli::try_parse_from(["catalogsync", "run"]).expect("defaults parse");
        let Command::Run(args) = cli.command else { unreachable!("run was given") };
        assert_eq!(args.validate(), Ok(()));
        assert!(args.catalog.restricted_set().is_empty());
        assert_eq!(args.resync_period, Duration::from_secs(300));
        assert_eq!(args.skr_access.skr_allowed_destinations, [Rule::Public]);
        assert!(!args.skr_access.allow_insecure_skr_tls);
        assert_eq!(args.skr_access.skr_max_response_size, 8 << 20);
        assert_eq!(args.skr_access.skr_sync_budget, crate::skr::access::DEFAULT_SYNC_BUDGET);
    }

    fn run_args(flags: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from(["catalogsync", "run"].iter().chain(flags)).expect("flags parse");
        let Command::Run(args) = cli.command else { unreachable!("run was given") };
        *args
    }

    #[test]
    fn lease_duration_must_be_whole_seconds() {
        let err = run_args(&["--lease-duration", "12500ms", "--renew-deadline", "9s"])
            .validate()
            .expect_err("12.5 s")
            .to_string();
        assert!(err.contains("--lease-duration") && err.contains("whole number of seconds"), "{err}");
        let err = run_args(&["--lease-duration", "15s1ms"]).validate().expect_err("15.001 s").to_string();
        assert!(err.contains("whole number of seconds"), "{err}");
        // Whole seconds in any unit are fine.
        assert_eq!(run_args(&["--lease-duration", "16000ms"]).validate(), Ok(()));
        assert_eq!(run_args(&["--lease-duration", "1m"]).validate(), Ok(()));
    }

    #[test]
    fn lease_seconds_round_up() {
        let timing = |lease_duration| crate::sharding::Timing {
            lease_duration,
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(3),
            kcp_request_timeout: Duration::from_secs(5),
        };
        assert_eq!(timing(Duration::from_secs(15)).lease_secs(), 15);
        assert_eq!(timing(Duration::from_millis(12_500)).lease_secs(), 13, "never shorter than asked");
        assert_eq!(timing(Duration::from_millis(15_001)).lease_secs(), 16);
        assert_eq!(timing(Duration::from_millis(300)).lease_secs(), 1);
        assert_eq!(timing(Duration::ZERO).lease_secs(), 1, "a Lease needs at least a second");
        assert_eq!(timing(Duration::from_secs(u64::MAX)).lease_secs(), i32::MAX);
    }
}
