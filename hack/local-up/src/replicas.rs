//! The catalogsync replicas of `local-up`: their command lines, starting them, noticing one
//! that exits by itself, and stopping them all.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use testenv::Catalogsync;

use crate::signals::Interrupts;
use crate::summary::ReplicaInfo;

/// Namespace of the member, shard and coordinator Leases: that of catalogsync's ServiceAccount,
/// where `deploy/rbac/` grants them, as in a cluster.
pub const LEASE_NAMESPACE: &str = testenv::CATALOGSYNC_NAMESPACE;
/// HTTP port of the first replica; replica `i` listens on this plus `i`.
pub const FIRST_HTTP_PORT: u16 = 8080;
/// Most replicas `--replicas` accepts.
pub const MAX_REPLICAS: usize = 16;
/// catalogsync's resync period here: shorter than the default, to see resyncs happen.
const RESYNC_PERIOD: &str = "60s";

/// The identities and HTTP addresses of `n` replicas: `catalogsync-0` on 127.0.0.1:8080,
/// `catalogsync-1` on 127.0.0.1:8081, ...
pub fn infos(n: usize) -> Vec<ReplicaInfo> {
    (0..n)
        .map(|i| ReplicaInfo {
            identity: format!("catalogsync-{i}"),
            http_addr: SocketAddr::from((
                [127, 0, 0, 1],
                FIRST_HTTP_PORT.saturating_add(u16::try_from(i).unwrap_or(0)),
            )),
        })
        .collect()
}

/// The command line of one replica. Identity, HTTP address and Lease namespace are given as
/// flags, so that `POD_NAME` or `POD_NAMESPACE` in the caller's environment cannot make two
/// replicas one. The local SKRs listen on loopback, which the default
/// `--skr-allowed-destinations` (`public`) refuses.
pub fn args(replica: &ReplicaInfo, kcp_namespace: &str) -> Vec<String> {
    [
        "run",
        "--kcp-namespace",
        kcp_namespace,
        "--identity",
        &replica.identity,
        "--http-addr",
        &replica.http_addr.to_string(),
        "--lease-namespace",
        LEASE_NAMESPACE,
        "--resync-period",
        RESYNC_PERIOD,
        "--skr-allowed-destinations",
        testenv::SKR_DESTINATIONS,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Fails, naming the address, when one of the replicas' HTTP addresses is taken.
///
/// # Errors
/// The first address that cannot be bound.
pub fn check_addresses_free(replicas: &[ReplicaInfo]) -> Result<()> {
    for r in replicas {
        if let Err(e) = TcpListener::bind(r.http_addr) {
            bail!(
                "{} (the HTTP address of {}) is not free: {e}. Is another local-up or catalogsync running?",
                r.http_addr,
                r.identity
            );
        }
    }
    Ok(())
}

/// One running replica.
pub struct Replica {
    /// Identity and HTTP address.
    pub info: ReplicaInfo,
    process: Catalogsync,
    exit_reported: bool,
}

impl Replica {
    /// The PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }
}

/// Starts `replicas` with `bin`, as catalogsync's ServiceAccount (`kubeconfig`), each with its
/// files in `<dir>/<identity>/`.
///
/// # Errors
/// Fails when one cannot be spawned; those already started are killed.
pub fn spawn_all(
    bin: &Path,
    replicas: &[ReplicaInfo],
    kcp_namespace: &str,
    kubeconfig: &Path,
    dir: &Path,
) -> Result<Vec<Replica>> {
    replicas
        .iter()
        .map(|info| {
            let args = args(info, kcp_namespace);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let process = Catalogsync::spawn_in_dir(bin, &args, &[], kubeconfig, &dir.join(&info.identity))
                .with_context(|| format!("failed to start {}", info.identity))?;
            Ok(Replica { info: info.clone(), process, exit_reported: false })
        })
        .collect()
}

/// The replicas still running.
pub fn running(replicas: &mut [Replica]) -> Vec<ReplicaInfo> {
    replicas.iter_mut().filter_map(|r| r.process.is_running().then(|| r.info.clone())).collect()
}

/// Prints, once per replica, that it exited without being asked to by `local-up` (someone
/// sent it SIGTERM, or it failed), with the tail of its log when it failed.
pub fn report_exits(replicas: &mut [Replica]) {
    for r in replicas.iter_mut().filter(|r| !r.exit_reported) {
        let Some(status) = r.process.exit_status() else { continue };
        r.exit_reported = true;
        if status.success() {
            println!(
                "\n{} exited ({status}); the others take over its shards, the clusters keep running until Ctrl-C",
                r.info.identity
            );
        } else {
            println!(
                "\n{} failed ({status}); the others take over its shards once its member Lease expires, the clusters \
                 keep running until Ctrl-C. Log {}:\n{}\n",
                r.info.identity,
                r.log_path().display(),
                testenv::process::log_tail(r.log_path(), 20)
            );
        }
    }
}

/// Sends SIGTERM to every replica at once, so each hands its shards back and deletes its
/// member Lease, and waits up to `timeout` for all of them, printing each exit. Kills those
/// left after `timeout`, or at once on another Ctrl-C.
pub async fn stop_all(replicas: &mut [Replica], interrupts: &mut Interrupts, timeout: Duration) {
    let started = Instant::now();
    let mut waiting = Vec::new();
    for (i, r) in replicas.iter_mut().enumerate() {
        if let Some(status) = r.process.exit_status() {
            println!("  {} had exited already ({status})", r.info.identity);
        } else if let Err(e) = r.process.signal("TERM") {
            println!("  {}: {e:#}; killing it", r.info.identity);
            r.process.kill();
        } else {
            waiting.push(i);
        }
    }
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    loop {
        waiting.retain(|&i| {
            let r = &mut replicas[i];
            let Some(status) = r.process.exit_status() else { return true };
            let verdict = if status.success() { "" } else { "  <- not a clean exit, see its log" };
            println!("  {} exited after {:.1}s ({status}){verdict}", r.info.identity, started.elapsed().as_secs_f64());
            false
        });
        if waiting.is_empty() {
            return;
        }
        if started.elapsed() > timeout {
            println!("  not exited within {}s of SIGTERM; killing them:", timeout.as_secs());
            kill(replicas, &waiting, true);
            return;
        }
        tokio::select! {
            _ = ticker.tick() => {}
            () = interrupts.recv() => {
                println!("  Ctrl-C again: killing the replicas still running");
                kill(replicas, &waiting, false);
                return;
            }
        }
    }
}

/// SIGKILLs `replicas[i]` for each `i` in `which`, printing each (with its log's tail if
/// `with_log`).
fn kill(replicas: &mut [Replica], which: &[usize], with_log: bool) {
    for &i in which {
        let r = &mut replicas[i];
        r.process.kill();
        println!("  {} killed; its shards stay held until its member Lease expires", r.info.identity);
        if with_log {
            println!("{}", testenv::process::log_tail(r.log_path(), 20));
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[test]
    fn replicas_get_their_own_identity_and_port() {
        let replicas = infos(3);
        let ids: Vec<&str> = replicas.iter().map(|r| r.identity.as_str()).collect();
        assert_eq!(ids, ["catalogsync-0", "catalogsync-1", "catalogsync-2"]);
        let addrs: Vec<String> = replicas.iter().map(|r| r.http_addr.to_string()).collect();
        assert_eq!(addrs, ["127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8082"]);
    }

    #[test]
    fn replica_args_are_accepted_by_catalogsync_run() {
        let replica = &infos(2)[1];
        let mut argv = vec!["catalogsync".to_owned()];
        argv.extend(args(replica, "kcp-system"));
        let cli = catalogsync::config::Cli::try_parse_from(&argv).expect("catalogsync run accepts them");
        let catalogsync::config::Command::Run(run) = cli.command else { panic!("not run: {argv:?}") };
        assert_eq!(run.identity, "catalogsync-1");
        assert_eq!(run.http_addr.to_string(), "127.0.0.1:8081");
        assert_eq!(run.lease_namespace, LEASE_NAMESPACE);
    }
}
