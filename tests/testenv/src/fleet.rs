//! Several catalogsync replicas on one scenario, for the sharding tests: a [`Scenario`] (KCP
//! namespace, RBAC, sync namespace) with many Kymas spread over the given SKRs, each with its
//! own access Secret and client identity, and replicas started, killed and terminated by
//! identity. A replica's KCP traffic can go through a [`TcpProxy`] to cut it off.
//!
//! ```ignore
//! let env = testenv::env();
//! let mut fleet = Fleet::new("shard", &[&env.skr_a, &env.skr_b], 20).await?;
//! let args = fleet.sharding_args(8);
//! let flags: Vec<&str> = args.iter().map(String::as_str).collect();
//! fleet.spawn_replica("r0", &flags)?;
//! fleet.spawn_replica_via_proxy("r1", &flags)?;
//! fleet.proxy("r1").expect("proxied").cut();
//! fleet.kill("r0");
//! let report = check_invariants(&fleet.invariant_input(|ns, name| shard_of(ns, name, 8), options))?;
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context as _, Result};
use catalogsync::sharding::table::{self, Table};
use futures::TryStreamExt as _;

use super::controlplane::ControlPlane;
use super::invariants::{InvariantInput, InvariantOptions};
use super::process::free_port;
use super::proxy::{TcpProxy, kubeconfig_via, local};
use super::runner::{Catalogsync, catalogsync_bin};
use super::scenario::{FAST_TIMINGS, Scenario};
use super::{CATALOGSYNC_GROUPS, CATALOGSYNC_USER, env, write_kubeconfig};

/// How long [`Fleet::terminate`] waits for a replica to exit after SIGTERM.
pub const TERMINATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Flags every replica gets before its own: [`FAST_TIMINGS`], with an SKR request timeout
/// that fits [`Fleet::sharding_args`] (renew deadline + SKR request timeout must not exceed the
/// lease duration).
pub fn replica_base_args() -> Vec<String> {
    FAST_TIMINGS.iter().chain(&["--skr-request-timeout", "2s"]).map(|s| (*s).to_owned()).collect()
}

/// How many Kymas [`Fleet::new`] creates at once.
const CREATE_CONCURRENCY: usize = 8;

/// One Kyma of a fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetKyma {
    /// Kyma name, `kyma-000`, `kyma-001`, ...
    pub name: String,
    /// Name of the SKR its access Secret reaches.
    pub skr: String,
    /// The user its access Secret authenticates as in that SKR.
    pub user: String,
}

/// One replica: its process, HTTP port, kubeconfig and (optional) KCP proxy.
struct Replica {
    process: Catalogsync,
    http_port: u16,
    kubeconfig: PathBuf,
    proxy: Option<TcpProxy>,
}

/// A scenario with many Kymas and several catalogsync replicas.
pub struct Fleet {
    /// The scenario: KCP namespace, sync namespace, admin client, directory.
    pub scenario: Scenario,
    /// The Kymas, in name order.
    pub kymas: Vec<FleetKyma>,
    /// Flags every replica gets before the caller's; edit before spawning to change timings
    /// (clap rejects a flag given twice).
    pub base_args: Vec<String>,
    skr_audit_logs: Vec<PathBuf>,
    replicas: BTreeMap<String, Replica>,
    /// Replicas replaced by a new one of the same identity (kept for their logs).
    retired: Vec<(String, Catalogsync)>,
}

impl Fleet {
    /// A new scenario (namespace prefix `prefix`) with `kymas` Kymas `kyma-000`, ... spread
    /// round-robin over `skrs`, each with its own access Secret and client identity
    /// ([`Scenario::skr_user`]).
    ///
    /// # Errors
    /// Fails when the scenario or a Kyma cannot be created, or `skrs` is empty.
    pub async fn new(prefix: &str, skrs: &[&ControlPlane], kymas: usize) -> Result<Self> {
        Self::with_scenario(Scenario::new(prefix).await?, skrs, kymas).await
    }

    /// [`Fleet::new`] on a given scenario.
    ///
    /// # Errors
    /// Fails when a Kyma cannot be created, or `skrs` is empty.
    pub async fn with_scenario(scenario: Scenario, skrs: &[&ControlPlane], kymas: usize) -> Result<Self> {
        anyhow::ensure!(!skrs.is_empty(), "a fleet needs at least one SKR");
        let mut fleet = Self {
            scenario,
            kymas: Vec::new(),
            base_args: replica_base_args(),
            skr_audit_logs: Vec::new(),
            replicas: BTreeMap::new(),
            retired: Vec::new(),
        };
        fleet.add_kymas(skrs, kymas).await?;
        Ok(fleet)
    }

    /// The KCP namespace of the Kymas.
    pub fn ns(&self) -> &str {
        &self.scenario.ns
    }

    /// The Kyma names.
    pub fn kyma_names(&self) -> Vec<String> {
        self.kymas.iter().map(|k| k.name.clone()).collect()
    }

    /// The shard of each Kyma's SKR user, by `shard_of(namespace, name)` (pass the real shard
    /// function, e.g. `|ns, name| catalogsync::sharding::ring::shard_of(ns, name, shards)`).
    pub fn shard_of_user(&self, shard_of: impl Fn(&str, &str) -> u32) -> BTreeMap<String, u32> {
        self.kymas.iter().map(|k| (k.user.clone(), shard_of(self.ns(), &k.name))).collect()
    }

    /// The input of `invariants::check_invariants` for this fleet: the KCP audit log, the
    /// audit logs of its SKRs and [`Fleet::shard_of_user`].
    pub fn invariant_input(&self, shard_of: impl Fn(&str, &str) -> u32, options: InvariantOptions) -> InvariantInput {
        InvariantInput {
            kcp_audit_log: env().kcp.audit_log_path(),
            skr_audit_logs: self.skr_audit_logs.clone(),
            shard_of_user: self.shard_of_user(shard_of),
            options,
        }
    }

    /// The sharding flags of the tests: `--shards <shards> --lease-namespace <ns>
    /// --lease-duration 6s --renew-deadline 4s --retry-period 1s`
    /// ([`super::sharded::LEASE_DURATION`], [`super::sharded::RETRY_PERIOD`]), with the Leases
    /// in the scenario namespace, where `deploy/rbac/` grants them.
    pub fn sharding_args(&self, shards: u32) -> Vec<String> {
        let lease_duration = format!("{}s", super::sharded::LEASE_DURATION.as_secs());
        let retry_period = format!("{}s", super::sharded::RETRY_PERIOD.as_secs());
        let args = ["--lease-duration", &lease_duration, "--renew-deadline", "4s", "--retry-period", &retry_period];
        let mut out =
            vec!["--shards".to_owned(), shards.to_string(), "--lease-namespace".to_owned(), self.ns().to_owned()];
        out.extend(args.iter().map(|s| (*s).to_owned()));
        out
    }

    /// Starts replica `identity`: `catalogsync run --kcp-namespace <ns> --sync-namespace
    /// <sync ns> --http-addr 127.0.0.1:<own free port> --identity <identity>`, then
    /// [`Fleet::base_args`], then `extra_args` (e.g. the sharding flags), as catalogsync's
    /// ServiceAccount against the KCP directly.
    ///
    /// # Errors
    /// Fails when a replica of that identity still runs, or it cannot be spawned.
    pub fn spawn_replica(&mut self, identity: &str, extra_args: &[&str]) -> Result<&mut Catalogsync> {
        self.spawn(identity, identity, extra_args, None, &[])
    }

    /// [`Fleet::spawn_replica`] under the name `key` in this fleet, running as `--identity
    /// identity` (so two processes can share one identity) with extra environment `envs`
    /// (for example a clock offset through libfaketime).
    ///
    /// # Errors
    /// As [`Fleet::spawn_replica`].
    pub fn spawn_replica_as(
        &mut self,
        key: &str,
        identity: &str,
        extra_args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<&mut Catalogsync> {
        self.spawn(key, identity, extra_args, None, envs)
    }

    /// [`Fleet::spawn_replica`] with the replica's KCP traffic through a new [`TcpProxy`]
    /// ([`Fleet::proxy`]), so the test can cut it off from the KCP alone.
    ///
    /// # Errors
    /// As [`Fleet::spawn_replica`], or when the proxy cannot start.
    pub fn spawn_replica_via_proxy(&mut self, identity: &str, extra_args: &[&str]) -> Result<&TcpProxy> {
        let proxy = TcpProxy::try_start(local(env().kcp.port()))?;
        self.spawn(identity, identity, extra_args, Some(proxy), &[])?;
        self.proxy(identity).context("the proxy of the replica just spawned")
    }

    fn spawn(
        &mut self,
        key: &str,
        identity: &str,
        extra_args: &[&str],
        proxy: Option<TcpProxy>,
        envs: &[(&str, &str)],
    ) -> Result<&mut Catalogsync> {
        if let Some(mut old) = self.replicas.remove(key) {
            if old.process.is_running() {
                self.replicas.insert(key.to_owned(), old);
                anyhow::bail!("replica {key} still runs; kill or terminate it first");
            }
            self.retired.push((key.to_owned(), old.process));
        }
        let env = env();
        let mut yaml = env.kcp.kubeconfig_yaml(CATALOGSYNC_USER, CATALOGSYNC_GROUPS);
        if let Some(proxy) = &proxy {
            yaml = kubeconfig_via(&yaml, proxy.addr());
        }
        let file_name: String =
            key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
        let kubeconfig = write_kubeconfig(self.scenario.dir.path(), &format!("replica-{file_name}"), &yaml);
        let http_port = free_port()?;
        let http_addr = format!("127.0.0.1:{http_port}");
        let mut args: Vec<&str> = vec![
            "run",
            "--kcp-namespace",
            &self.scenario.ns,
            "--sync-namespace",
            &self.scenario.sync_ns,
            "--http-addr",
            &http_addr,
            "--identity",
            identity,
        ];
        args.extend(self.base_args.iter().map(String::as_str));
        // The test SKRs listen on loopback, which the default (`public`) refuses; a test may
        // give its own list instead (the flag appends, so both would widen it).
        let all_args = self.base_args.iter().map(String::as_str).chain(extra_args.iter().copied());
        if !all_args.clone().any(|a| a.starts_with("--skr-allowed-destinations")) {
            args.extend_from_slice(&["--skr-allowed-destinations", super::SKR_DESTINATIONS]);
        }
        args.extend_from_slice(extra_args);
        let process =
            Catalogsync::spawn_bin(&catalogsync_bin(), &args, envs, &kubeconfig, Some(self.scenario.dir.path()))
                .with_context(|| format!("failed to spawn replica {key}"))?;
        let replica = self.replicas.entry(key.to_owned()).or_insert(Replica { process, http_port, kubeconfig, proxy });
        Ok(&mut replica.process)
    }

    fn replica(&self, identity: &str) -> Result<&Replica> {
        self.replicas.get(identity).with_context(|| format!("no replica {identity}"))
    }

    /// Identities of all replicas spawned (running or not), in order.
    pub fn replicas(&self) -> Vec<String> {
        self.replicas.keys().cloned().collect()
    }

    /// Identities of the replicas that still run.
    pub fn running_replicas(&mut self) -> Vec<String> {
        self.replicas.iter_mut().filter_map(|(id, r)| r.process.is_running().then(|| id.clone())).collect()
    }

    /// Whether replica `identity` runs.
    pub fn is_running(&mut self, identity: &str) -> bool {
        self.replicas.get_mut(identity).is_some_and(|r| r.process.is_running())
    }

    /// The process of replica `identity`.
    pub fn process(&mut self, identity: &str) -> Option<&mut Catalogsync> {
        self.replicas.get_mut(identity).map(|r| &mut r.process)
    }

    /// The HTTP port of replica `identity`.
    pub fn http_port(&self, identity: &str) -> Option<u16> {
        self.replicas.get(identity).map(|r| r.http_port)
    }

    /// The kubeconfig replica `identity` runs with.
    pub fn kubeconfig(&self, identity: &str) -> Option<PathBuf> {
        self.replicas.get(identity).map(|r| r.kubeconfig.clone())
    }

    /// The KCP proxy of replica `identity`, if it was spawned via one.
    pub fn proxy(&self, identity: &str) -> Option<&TcpProxy> {
        self.replicas.get(identity).and_then(|r| r.proxy.as_ref())
    }

    /// Sends SIGKILL to replica `identity` (as a crash would) and reaps it.
    pub fn kill(&mut self, identity: &str) -> Option<ExitStatus> {
        self.replicas.get_mut(identity).and_then(|r| r.process.kill())
    }

    /// Sends SIGTERM to replica `identity` and waits up to [`TERMINATE_TIMEOUT`] for it to exit.
    ///
    /// # Errors
    /// Fails when there is no such replica or it did not exit in time (it is killed then).
    pub async fn terminate(&mut self, identity: &str) -> Result<ExitStatus> {
        self.terminate_within(identity, TERMINATE_TIMEOUT).await
    }

    /// [`Fleet::terminate`] with a timeout.
    ///
    /// # Errors
    /// As [`Fleet::terminate`].
    pub async fn terminate_within(&mut self, identity: &str, timeout: Duration) -> Result<ExitStatus> {
        let replica = self.replicas.get_mut(identity).with_context(|| format!("no replica {identity}"))?;
        replica.process.terminate(timeout).await.with_context(|| format!("replica {identity}"))
    }

    /// GETs `path` of replica `identity`'s HTTP server; returns status code and body.
    ///
    /// # Errors
    /// Fails when there is no such replica or the request fails.
    pub async fn http_get(&self, identity: &str, path: &str) -> Result<(u16, String)> {
        super::http::get_local(self.replica(identity)?.http_port, path).await
    }

    /// Waits until replica `identity` answers `/readyz` with 200.
    ///
    /// # Panics
    /// On timeout.
    pub async fn await_ready(&self, identity: &str, timeout: Duration) {
        self.await_http_ok(identity, "/readyz", timeout).await;
    }

    /// Waits until replica `identity` answers `path` with 200 (e.g. `/healthz`: it serves).
    ///
    /// # Panics
    /// On timeout.
    pub async fn await_http_ok(&self, identity: &str, path: &str, timeout: Duration) {
        super::await_condition(timeout, &format!("replica {identity} {path} to be 200"), || async {
            matches!(self.http_get(identity, path).await, Ok((200, _)))
        })
        .await;
    }

    /// Sum of the values of a metric's series of replica `identity` whose labels contain all
    /// of `labels` (`key="value"` fragments); 0 when it cannot be read.
    pub async fn metric(&self, identity: &str, name: &str, labels: &[&str]) -> f64 {
        let Ok((_, body)) = self.http_get(identity, "/metrics").await else { return 0.0 };
        metric_sum(&body, name, labels)
    }

    /// The log of replica `identity` so far ("" when there is none).
    pub fn log(&self, identity: &str) -> String {
        self.replicas.get(identity).map(|r| r.process.log()).unwrap_or_default()
    }

    /// Creates more Kymas (continuing the numbering) round-robin over `skrs`.
    ///
    /// # Errors
    /// Fails when a Kyma cannot be created.
    pub async fn add_kymas(&mut self, skrs: &[&ControlPlane], count: usize) -> Result<Vec<FleetKyma>> {
        anyhow::ensure!(!skrs.is_empty(), "no SKRs given");
        let first = self.kymas.len();
        let planned: Vec<(FleetKyma, &ControlPlane)> = (first..first + count)
            .map(|i| {
                let name = format!("kyma-{i:03}");
                let skr = skrs[i % skrs.len()];
                (FleetKyma { user: self.scenario.skr_user(&name), skr: skr.name().to_owned(), name }, skr)
            })
            .collect();
        let scenario = &self.scenario;
        futures::stream::iter(planned.iter().map(Ok))
            .try_for_each_concurrent(CREATE_CONCURRENCY, |(kyma, skr)| async move {
                scenario.add_kyma(&kyma.name, skr, &[]).await.with_context(|| format!("failed to add {}", kyma.name))
            })
            .await?;
        for skr in skrs {
            let path = skr.audit_log_path();
            if !self.skr_audit_logs.contains(&path) {
                self.skr_audit_logs.push(path);
            }
        }
        let added: Vec<FleetKyma> = planned.into_iter().map(|(kyma, _)| kyma).collect();
        self.kymas.extend(added.iter().cloned());
        Ok(added)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let all =
                self.retired.iter().map(|(id, p)| (id, p)).chain(self.replicas.iter().map(|(id, r)| (id, &r.process)));
            for (identity, process) in all {
                let log = process.log();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- log of replica {identity} of fleet {} (last 40 lines) ---", self.scenario.ns);
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// Sum of the values of metric `name` in a Prometheus text exposition, over the series whose
/// labels contain all of `labels` (`key="value"` fragments).
pub fn metric_sum(exposition: &str, name: &str, labels: &[&str]) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| labels.iter().all(|frag| l.contains(frag)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Fleet {
    /// The shard table of this fleet's Leases, as `catalogsync shards` prints it.
    ///
    /// # Errors
    /// Fails when the Leases or Kymas cannot be listed.
    pub async fn shard_table(&self) -> Result<Table> {
        Ok(table::read(&self.scenario.kcp, self.ns(), self.ns()).await?)
    }

    /// Waits up to `timeout` until all `shards` shards are held, as desired, by exactly the
    /// live members `replicas`, none above the cap `ceil(shards / replicas)`; returns the
    /// table.
    pub async fn await_converged(&self, replicas: &[&str], shards: u32, timeout: Duration) -> Table {
        let want: BTreeSet<String> = replicas.iter().map(|s| (*s).to_owned()).collect();
        let cap = shards.div_ceil(replicas.len() as u32) as usize;
        super::await_condition(timeout, &format!("all {shards} shards held by {want:?}"), || async {
            let t = self.shard_table().await.ok()?;
            let ok = t.rows.len() == shards as usize
                && t.rows.iter().all(|r| r.state == "held" && want.contains(&r.holder))
                && want.iter().all(|m| t.rows.iter().filter(|r| &r.holder == m).count() <= cap)
                && t.members.iter().cloned().collect::<BTreeSet<_>>() == want;
            ok.then_some(t)
        })
        .await
    }
}

/// The holder of each shard in `table`.
pub fn holders(table: &Table) -> BTreeMap<u32, String> {
    table.rows.iter().map(|r| (r.shard, r.holder.clone())).collect()
}
