//! A real Prometheus server for the tests: the `prometheus` binary (`$PROMETHEUS`, built by
//! `hack/prometheus.sh`, which `hack/test.sh` runs) started with a configuration and rule files in
//! a test directory, and a client of its HTTP API (`/api/v1/query`, `/api/v1/targets`,
//! `/api/v1/rules`, `/api/v1/alerts`), plus where to find `promtool`.
//!
//! The configuration is JSON, which Prometheus reads as the YAML it is a subset of. The caller
//! passes each scrape configuration as a value, so any service discovery works:
//! [`static_scrape_config`] for fixed targets, or for pods on a node
//!
//! ```ignore
//! let options = PrometheusOptions::new(listen)
//!     .file("kcp.kubeconfig", &kubeconfig_yaml) // relative paths in the config resolve here
//!     .scrape(serde_json::json!({
//!         "job_name": "catalogsync",
//!         "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": "kcp.kubeconfig",
//!                                    "namespaces": {"names": ["catalogsync-system"]}}],
//!     }))
//!     .rule_file("catalogsync-rules.yaml", &rules)
//!     .command_prefix(["nsenter", "-t", &pid, "-n", "-m", "--"]) // run in another netns
//!     .api_addr(forwarded); // where this process reaches --web.listen-address
//! let prometheus = Prometheus::start(options, Some(env.dir())).await?;
//! ```
//!
//! # Caveats
//! Prometheus hands discovered targets to its scrapers every 5 s, so a target is first
//! scraped up to about 5 s after the server starts or the target is discovered: start the
//! server before the workload when the test should be quick. Scraped samples are visible to
//! queries and rules once [`Target::last_scrape`] has moved; a rate needs two of them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::process::{ManagedProcess, TestDir};

/// Environment variable naming the `prometheus` binary (else it is looked up on `PATH`).
pub const PROMETHEUS_ENV: &str = "PROMETHEUS";
/// Environment variable naming the `promtool` binary (else it is looked up on `PATH`).
pub const PROMTOOL_ENV: &str = "PROMTOOL";
/// How long [`Prometheus::start`] waits for `/-/ready` unless told otherwise. A cold start on a
/// busy machine takes about a second.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one API request may take.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// How often [`Prometheus::start`] asks `/-/ready`.
const READY_POLL: Duration = Duration::from_millis(100);

/// The `prometheus` server binary: `$PROMETHEUS`, else `prometheus` on `PATH`.
///
/// # Errors
/// When neither names an executable file; the message says how to install it.
pub fn prometheus_bin() -> Result<PathBuf> {
    tool(PROMETHEUS_ENV, "prometheus")
}

/// The `promtool` binary: `$PROMTOOL`, else `promtool` on `PATH`.
///
/// # Errors
/// When neither names an executable file; the message says how to install it.
pub fn promtool_bin() -> Result<PathBuf> {
    tool(PROMTOOL_ENV, "promtool")
}

fn tool(env_var: &str, name: &str) -> Result<PathBuf> {
    let hint = "run `eval \"$(hack/prometheus.sh)\"` to build it (hack/test.sh does)";
    if let Some(path) = std::env::var_os(env_var).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        anyhow::ensure!(path.is_file(), "{name} not found at {} (from {env_var}); {hint}", path.display());
        return Ok(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not on PATH and {env_var} is not set: {hint}"))
}

/// One `scrape_configs` entry with fixed targets (`host:port`), each series labelled with
/// `labels` (for example `pod`, which the dashboard groups by and which the ServiceMonitor
/// adds in a cluster). Scrapes `/metrics` over plain HTTP.
pub fn static_scrape_config(job: &str, targets: &[SocketAddr], labels: &[(&str, &str)]) -> Value {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let targets: Vec<String> = targets.iter().map(ToString::to_string).collect();
    json!({
        "job_name": job,
        "metrics_path": "/metrics",
        "static_configs": [{"targets": targets, "labels": labels}],
    })
}

/// What to start a [`Prometheus`] with. Build it with [`PrometheusOptions::new`] and the
/// `with`-style methods; every field is public for callers that need more.
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    /// `--web.listen-address`, in the network namespace the server runs in.
    pub listen: SocketAddr,
    /// Where this process reaches that address (a forwarder into another network namespace);
    /// `None`: at `listen`.
    pub api: Option<SocketAddr>,
    /// A command the server is run under (`["nsenter", "-t", "<pid>", "-n", "-m", "--"]`);
    /// empty: run directly.
    pub command_prefix: Vec<String>,
    /// `global.scrape_interval`; the scrape timeout is the same (it may not be longer).
    pub scrape_interval: Duration,
    /// `global.evaluation_interval` of the rule groups.
    pub evaluation_interval: Duration,
    /// The `scrape_configs` entries.
    pub scrape_configs: Vec<Value>,
    /// Rule files by file name, written next to the configuration and listed in `rule_files`.
    pub rule_files: Vec<(String, String)>,
    /// Further files by name, written next to the configuration before the start (kubeconfigs,
    /// CA bundles, tokens): relative paths in the configuration resolve against its directory.
    pub files: Vec<(String, String)>,
    /// How long to wait for `/-/ready`.
    pub ready_timeout: Duration,
}

impl PrometheusOptions {
    /// A server listening on `listen`, scraping and evaluating every second, with no scrape
    /// configurations or rules yet.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            api: None,
            command_prefix: Vec::new(),
            scrape_interval: Duration::from_secs(1),
            evaluation_interval: Duration::from_secs(1),
            scrape_configs: Vec::new(),
            rule_files: Vec::new(),
            files: Vec::new(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
        }
    }

    /// Adds a `scrape_configs` entry (see [`static_scrape_config`]).
    #[must_use]
    pub fn scrape(mut self, config: Value) -> Self {
        self.scrape_configs.push(config);
        self
    }

    /// Adds a rule file (`groups:` YAML or JSON) under `name`.
    #[must_use]
    pub fn rule_file(mut self, name: &str, content: &str) -> Self {
        self.rule_files.push((name.to_owned(), content.to_owned()));
        self
    }

    /// Adds a file under `name` next to the configuration.
    #[must_use]
    pub fn file(mut self, name: &str, content: &str) -> Self {
        self.files.push((name.to_owned(), content.to_owned()));
        self
    }

    /// Runs the server under `prefix` (empty: directly).
    #[must_use]
    pub fn command_prefix<S: Into<String>>(mut self, prefix: impl IntoIterator<Item = S>) -> Self {
        self.command_prefix = prefix.into_iter().map(Into::into).collect();
        self
    }

    /// Reaches the HTTP API at `addr` instead of the listen address.
    #[must_use]
    pub fn api_addr(mut self, addr: SocketAddr) -> Self {
        self.api = Some(addr);
        self
    }

    /// Sets the scrape and the rule evaluation interval.
    #[must_use]
    pub fn intervals(mut self, scrape: Duration, evaluation: Duration) -> Self {
        self.scrape_interval = scrape;
        self.evaluation_interval = evaluation;
        self
    }

    /// The configuration file's content (JSON, which Prometheus reads as YAML).
    pub fn config(&self) -> String {
        let rule_files: Vec<&str> = self.rule_files.iter().map(|(name, _)| name.as_str()).collect();
        let config = json!({
            "global": {
                "scrape_interval": prometheus_duration(self.scrape_interval),
                "scrape_timeout": prometheus_duration(self.scrape_interval),
                "evaluation_interval": prometheus_duration(self.evaluation_interval),
            },
            "rule_files": rule_files,
            "scrape_configs": self.scrape_configs,
        });
        serde_json::to_string_pretty(&config).unwrap_or_else(|e| panic!("a JSON value serialises: {e}"))
    }
}

/// A duration as Prometheus writes one: whole milliseconds (`1500ms`).
fn prometheus_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// A running Prometheus server. Killed on drop; its directory (configuration, rule files, TSDB,
/// log) is removed then unless `CATALOGSYNC_KEEP_TEST_DIRS=1`.
pub struct Prometheus {
    process: ManagedProcess,
    dir: TestDir,
    api: SocketAddr,
}

impl Prometheus {
    /// Writes the configuration, rule files and files of `options` into a new test directory
    /// (under `parent`, or the system temp dir), starts [`prometheus_bin`] on them and waits
    /// until it answers `/-/ready`.
    ///
    /// # Errors
    /// When the binary is missing, the configuration cannot be written, the server exits or
    /// is not ready within `options.ready_timeout` (the message carries its log's tail).
    pub async fn start(options: PrometheusOptions, parent: Option<&Path>) -> Result<Self> {
        let bin = prometheus_bin()?;
        let dir = TestDir::new("prometheus", parent)?;
        let write = |name: &str, content: &str| -> Result<PathBuf> {
            anyhow::ensure!(!name.contains('/'), "file name {name} must not contain a slash");
            let path = dir.path().join(name);
            std::fs::write(&path, content).with_context(|| format!("failed to write {}", path.display()))?;
            Ok(path)
        };
        for (name, content) in options.rule_files.iter().chain(&options.files) {
            write(name, content)?;
        }
        let config = write("prometheus.yml", &options.config())?;
        let mut args: Vec<OsString> = options.command_prefix.iter().map(OsString::from).collect();
        args.push(bin.into_os_string());
        args.extend(
            [
                format!("--config.file={}", config.display()),
                format!("--storage.tsdb.path={}", dir.path().join("data").display()),
                format!("--web.listen-address={}", options.listen),
                "--log.level=info".to_owned(),
            ]
            .map(OsString::from),
        );
        let mut command = Command::new(&args[0]);
        command.args(&args[1..]).current_dir(dir.path());
        let process = ManagedProcess::spawn("prometheus", command, &dir.path().join("prometheus.log"))?;
        let mut prometheus = Self { process, dir, api: options.api.unwrap_or(options.listen) };
        prometheus.wait_ready(options.ready_timeout).await?;
        Ok(prometheus)
    }

    /// Waits until the server answers `GET /-/ready` with 200.
    ///
    /// # Errors
    /// When it exits first or `timeout` passes; the message carries its log's tail.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.exit_status() {
                bail!(
                    "prometheus exited with {status} before it was ready; log {}:\n{}",
                    self.log_path().display(),
                    self.log_tail(30)
                );
            }
            if let Ok((200, _)) = super::http::request(self.api, "GET", "/-/ready", None, READY_POLL * 10).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "prometheus did not become ready at http://{}/-/ready within {}s; log {}:\n{}",
                    self.api,
                    timeout.as_secs_f64(),
                    self.log_path().display(),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Where this process reaches the HTTP API.
    pub fn api_addr(&self) -> SocketAddr {
        self.api
    }

    /// The directory of the configuration, rule files, TSDB and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The PID (of the command prefix, when there is one).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The server's log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// `GET path` of the HTTP API: the `data` of a `"status": "success"` answer.
    ///
    /// # Errors
    /// When the request fails or the answer is not a success (its `error` is in the message).
    pub async fn api_get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let (status, body) = super::http::request(self.api, "GET", path, None, API_TIMEOUT).await?;
        let answer: Value = serde_json::from_slice(&body)
            .with_context(|| format!("GET {path}: HTTP {status}, not JSON: {}", String::from_utf8_lossy(&body)))?;
        if answer["status"] != "success" {
            bail!("GET {path}: HTTP {status}, {}: {}", answer["errorType"], answer["error"]);
        }
        serde_json::from_value(answer["data"].clone()).with_context(|| format!("GET {path}: unexpected data"))
    }

    /// An instant query at the current time: its series (a scalar result is one series
    /// without labels).
    ///
    /// # Errors
    /// When the query fails (a PromQL error is in the message) or returns a matrix or string.
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>> {
        let data: QueryData = self.api_get(&format!("/api/v1/query?query={}", percent_encode(promql))).await?;
        match data.result_type.as_str() {
            "vector" => Vec::<VectorSample>::deserialize(&data.result)
                .map(|v| {
                    v.into_iter().map(|s| Sample { metric: s.metric, at: s.value.0, value: s.value.value() }).collect()
                })
                .context("unexpected vector result"),
            "scalar" => {
                let point = Point::deserialize(&data.result).context("unexpected scalar result")?;
                Ok(vec![Sample { metric: BTreeMap::new(), at: point.0, value: point.value() }])
            }
            other => bail!("query {promql} returned a {other}, not an instant vector"),
        }
    }

    /// The active scrape targets.
    ///
    /// # Errors
    /// When the request fails.
    pub async fn targets(&self) -> Result<Vec<Target>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Targets {
            active_targets: Vec<Target>,
        }
        Ok(self.api_get::<Targets>("/api/v1/targets?state=active").await?.active_targets)
    }

    /// The loaded rule groups with the state of every rule.
    ///
    /// # Errors
    /// When the request fails.
    pub async fn rule_groups(&self) -> Result<Vec<RuleGroup>> {
        #[derive(Deserialize)]
        struct Groups {
            groups: Vec<RuleGroup>,
        }
        Ok(self.api_get::<Groups>("/api/v1/rules").await?.groups)
    }

    /// The pending and firing alerts.
    ///
    /// # Errors
    /// When the request fails.
    pub async fn alerts(&self) -> Result<Vec<Alert>> {
        #[derive(Deserialize)]
        struct Alerts {
            alerts: Vec<Alert>,
        }
        Ok(self.api_get::<Alerts>("/api/v1/alerts").await?.alerts)
    }
}

/// One series of an instant query's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its labels (`__name__` included when the expression keeps it).
    pub metric: BTreeMap<String, String>,
    /// The evaluation time, in Unix seconds.
    pub at: f64,
    /// The value (NaN and infinities as Prometheus reports them).
    pub value: f64,
}

impl Sample {
    /// [`Sample::at`] as a timestamp (to the millisecond, Prometheus' resolution).
    pub fn time(&self) -> Timestamp {
        let millis = (self.at * 1000.0).round() as i64;
        Timestamp::from_millisecond(millis).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueryData {
    result_type: String,
    result: Value,
}

#[derive(Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: Point,
}

/// `[<unix time>, "<value>"]`.
#[derive(Deserialize)]
struct Point(f64, String);

impl Point {
    /// The value; Go's `NaN`, `+Inf` and `-Inf` parse as Rust's.
    fn value(&self) -> f64 {
        self.1.parse().unwrap_or(f64::NAN)
    }
}

/// An active scrape target.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The job (`job_name`).
    pub scrape_pool: String,
    /// The URL scraped.
    pub scrape_url: String,
    /// The target's labels after relabelling.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub health: String,
    /// The last scrape's error, empty after a good one.
    #[serde(default)]
    pub last_error: String,
    /// When the last scrape started (RFC 3339; the zero time before the first).
    pub last_scrape: String,
}

impl Target {
    /// [`Target::last_scrape`] parsed.
    pub fn last_scrape_time(&self) -> Option<Timestamp> {
        self.last_scrape.parse().ok()
    }
}

/// A loaded rule group.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleGroup {
    /// Its name.
    pub name: String,
    /// The rule file it comes from.
    pub file: String,
    /// Its rules.
    pub rules: Vec<Rule>,
    /// When it was last evaluated (RFC 3339; the zero time before the first).
    pub last_evaluation: String,
}

impl RuleGroup {
    /// [`RuleGroup::last_evaluation`] parsed.
    pub fn last_evaluation_time(&self) -> Option<Timestamp> {
        self.last_evaluation.parse().ok()
    }
}

/// One rule of a [`RuleGroup`].
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// The alert's or recorded series' name.
    pub name: String,
    /// `alerting` or `recording`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its expression.
    pub query: String,
    /// `ok`, `err` or `unknown` (not evaluated yet).
    pub health: String,
    /// The last evaluation's error.
    #[serde(default)]
    pub last_error: String,
    /// For an alerting rule: `inactive`, `pending` or `firing`.
    #[serde(default)]
    pub state: String,
}

/// A pending or firing alert.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// Its labels (`alertname` included).
    pub labels: BTreeMap<String, String>,
    /// Its annotations, rendered.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// `pending` or `firing`.
    pub state: String,
    /// The expression's value, as text.
    #[serde(default)]
    pub value: String,
}

/// Percent-encodes everything but RFC 3986's unreserved characters, for a query parameter.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(percent_encode("sum(x{a=\"b\"}) > 0"), "sum%28x%7Ba%3D%22b%22%7D%29%20%3E%200");
        assert_eq!(percent_encode("a_b-c.d~"), "a_b-c.d~");
    }

    #[test]
    fn the_config_lists_rule_files_and_scrape_configs_with_a_timeout_within_the_interval() {
        let target: SocketAddr = "127.0.0.1:8080".parse().expect("address");
        let options = PrometheusOptions::new("127.0.0.1:9090".parse().expect("address"))
            .intervals(Duration::from_millis(1500), Duration::from_secs(2))
            .scrape(static_scrape_config("catalogsync", &[target], &[("pod", "a")]))
            .rule_file("rules.yaml", "groups: []");
        let config: Value = serde_json::from_str(&options.config()).expect("JSON");
        assert_eq!(config["global"]["scrape_interval"], "1500ms");
        assert_eq!(config["global"]["scrape_timeout"], "1500ms");
        assert_eq!(config["global"]["evaluation_interval"], "2000ms");
        assert_eq!(config["rule_files"], json!(["rules.yaml"]));
        assert_eq!(config["scrape_configs"][0]["static_configs"][0]["targets"], json!(["127.0.0.1:8080"]));
        assert_eq!(config["scrape_configs"][0]["static_configs"][0]["labels"]["pod"], "a");
    }

    #[test]
    fn values_parse_like_go_writes_them() {
        assert!(Point(0.0, "NaN".to_owned()).value().is_nan());
        assert_eq!(Point(0.0, "+Inf".to_owned()).value(), f64::INFINITY);
        assert_eq!(Point(0.0, "-Inf".to_owned()).value(), f64::NEG_INFINITY);
        assert_eq!(Point(0.0, "0.25".to_owned()).value(), 0.25);
    }

    #[test]
    fn go_timestamps_parse() {
        let t: Timestamp = "2026-01-02T03:04:05.123456789+01:00".parse().expect("RFC 3339 with offset");
        assert_eq!(t.to_string(), "2026-01-02T02:04:05.123456789Z");
        assert!("0001-01-01T00:00:00Z".parse::<Timestamp>().is_ok());
    }
}
