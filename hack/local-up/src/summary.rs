//! What `local-up` prints about the replicas and their shards: plain functions of the shard
//! table (`catalogsync::sharding::table`, the view `catalogsync shards` prints), the replicas
//! started and the Kymas' conditions.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::path::Path;

use catalogsync::sharding::table::Table;

/// One replica as started: its identity and HTTP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// `--identity`.
    pub identity: String,
    /// `--http-addr`.
    pub http_addr: SocketAddr,
}

impl ReplicaInfo {
    /// The URL of `path` on its HTTP server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http_addr)
    }
}

/// One Kyma of the demo, the SKR it points at, and whether its `ModuleCatalog` condition says
/// the catalog is synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KymaState {
    /// Kyma name.
    pub name: String,
    /// Name of its SKR control plane.
    pub skr: String,
    /// `ModuleCatalog` is `True`.
    pub synced: bool,
}

/// How far the replicas are with sharing the shards and syncing the Kymas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Replicas that have a live member Lease, of those running.
    pub live: usize,
    /// Replicas running.
    pub replicas: usize,
    /// The shard count (0 before the first replica recorded it).
    pub shards: u32,
    /// Shards held, as desired, by a running replica.
    pub held: usize,
    /// Shards on their way to another holder.
    pub moving: usize,
    /// Whether every running replica holds between 1 and `ceil(shards / replicas)` shards.
    pub balanced: bool,
    /// Kymas whose catalog is synced.
    pub synced: usize,
    /// Kymas.
    pub kymas: usize,
}

impl Progress {
    /// Reads the progress off the shard table, for the replicas `running` (identities).
    pub fn of(table: &Table, running: &[&str], kymas: &[KymaState]) -> Self {
        let running_set: BTreeSet<&str> = running.iter().copied().collect();
        let holdings = table.holdings();
        let n = u32::try_from(running.len()).unwrap_or(u32::MAX).max(1);
        let cap = table.shards.div_ceil(n) as usize;
        let least = usize::from(n <= table.shards);
        let balanced = running.iter().all(|r| {
            let held = holdings.get(r).map_or(0, |h| h.shards.len());
            (least..=cap).contains(&held)
        });
        Self {
            live: table.members.iter().filter(|m| running_set.contains(m.as_str())).count(),
            replicas: running.len(),
            shards: table.shards,
            held: table.rows.iter().filter(|r| r.state == "held" && running_set.contains(r.holder.as_str())).count(),
            moving: table.rows.iter().filter(|r| r.state == "moving").count(),
            balanced,
            synced: kymas.iter().filter(|k| k.synced).count(),
            kymas: kymas.len(),
        }
    }

    /// Every running replica is live and holds its share, every shard is held as desired, and
    /// every Kyma is synced.
    pub fn is_done(&self) -> bool {
        self.replicas > 0
            && self.live == self.replicas
            && self.shards > 0
            && self.held == self.shards as usize
            && self.balanced
            && self.synced == self.kymas
    }
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} replicas live, ", self.live, self.replicas)?;
        if self.shards == 0 {
            write!(f, "no shard Leases yet")?;
        } else {
            write!(f, "{}/{} shards held", self.held, self.shards)?;
            if self.moving > 0 {
                write!(f, " ({} moving)", self.moving)?;
            }
        }
        write!(f, ", {}/{} Kymas synced", self.synced, self.kymas)
    }
}

/// Who holds which shard and syncs which Kyma: the coordinator, then per replica its HTTP
/// address, its shard count and its Kymas with their SKRs, then the shard numbers per replica.
/// A replica in `replicas` that holds nothing is listed with 0 shards; a holder that is not in
/// `replicas` (a leftover of an earlier run) is listed too.
pub fn assignment(table: &Table, replicas: &[ReplicaInfo], kymas: &[KymaState], kcp_namespace: &str) -> String {
    let holdings = table.holdings();
    let mut kymas_of: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for k in kymas {
        let holder = table.row_of(kcp_namespace, &k.name).map_or("", |r| r.holder.as_str());
        let state = if k.synced { "" } else { ", not synced yet" };
        kymas_of.entry(holder).or_default().push(format!("{} ({}{state})", k.name, k.skr));
    }
    let mut rows: Vec<(String, String, usize, String)> = replicas
        .iter()
        .map(|r| {
            let shards = holdings.get(r.identity.as_str()).map_or(0, |h| h.shards.len());
            let kymas = kymas_of.get(r.identity.as_str()).map(|k| k.join(", ")).unwrap_or_default();
            (r.identity.clone(), r.http_addr.to_string(), shards, kymas)
        })
        .collect();
    let known: BTreeSet<&str> = replicas.iter().map(|r| r.identity.as_str()).collect();
    for (holder, h) in holdings.iter().filter(|(id, _)| !id.is_empty() && !known.contains(*id)) {
        let kymas = kymas_of.get(holder).map(|k| k.join(", ")).unwrap_or_default();
        rows.push(((*holder).to_owned(), "-".to_owned(), h.shards.len(), kymas));
    }

    let mut out = String::new();
    let coordinator = if table.coordinator.is_empty() { "<none>" } else { &table.coordinator };
    let _ = writeln!(out, "coordinator: {coordinator}");
    let iw = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max("REPLICA".len());
    let hw = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max("HTTP".len());
    let _ = writeln!(out, "{:<iw$}  {:<hw$}  {:>6}  KYMAS (SKR)", "REPLICA", "HTTP", "SHARDS");
    for (identity, http, shards, kymas) in &rows {
        let kymas = if kymas.is_empty() { "-" } else { kymas };
        let _ = writeln!(out, "{identity:<iw$}  {http:<hw$}  {shards:>6}  {kymas}");
    }
    if let Some(h) = holdings.get("") {
        let kymas = kymas_of.get("").map(|k| k.join(", ")).unwrap_or_else(|| "-".to_owned());
        let _ = writeln!(out, "{:<iw$}  {:<hw$}  {:>6}  {kymas}", "<unheld>", "-", h.shards.len());
    }
    let _ = writeln!(out, "shards held:");
    for (identity, _, _, _) in &rows {
        let shards = holdings.get(identity.as_str()).map(|h| ranges(&h.shards)).unwrap_or_else(|| "none".to_owned());
        let _ = writeln!(out, "  {identity:<iw$}  {shards}");
    }
    out
}

/// Shard numbers as ranges: `[0, 1, 2, 5, 7, 8]` is `0-2, 5, 7-8`.
pub fn ranges(shards: &[u32]) -> String {
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    if parts.is_empty() { "none".to_owned() } else { parts.join(", ") }
}

/// The commands to look at the shards again, and each replica's metrics URL.
pub fn look_again(
    catalogsync_bin: &Path,
    kcp_kubeconfig: &Path,
    lease_namespace: &str,
    kcp_namespace: &str,
    replicas: &[ReplicaInfo],
) -> String {
    let kcp = kcp_kubeconfig.display();
    let mut out = String::new();
    let _ = writeln!(out, "look again:");
    let _ = writeln!(
        out,
        "  KUBECONFIG={kcp} {} shards --lease-namespace {lease_namespace} --kcp-namespace {kcp_namespace}",
        catalogsync_bin.display()
    );
    let _ = writeln!(out, "  kubectl --kubeconfig {kcp} get leases -n {lease_namespace}");
    if let Some(first) = replicas.first() {
        let _ = writeln!(out, "  curl -s {}   (one replica's view of every shard)", first.url("/debug/shards"));
    }
    let _ = writeln!(out, "metrics (also /readyz, /livez, /debug/shards):");
    let iw = replicas.iter().map(|r| r.identity.len()).max().unwrap_or(0);
    for r in replicas {
        let _ = writeln!(out, "  {:<iw$}  {}", r.identity, r.url("/metrics"));
    }
    out
}

/// About how much memory `local-up` needs, in MiB: etcd, the KCP and `skrs` SKR
/// kube-apiservers, and `replicas` debug builds of catalogsync.
pub fn memory_needed_mib(skrs: usize, replicas: usize) -> u64 {
    const ETCD_MIB: u64 = 150;
    const APISERVER_MIB: u64 = 300;
    const REPLICA_MIB: u64 = 50;
    ETCD_MIB + APISERVER_MIB * (skrs as u64 + 1) + REPLICA_MIB * replicas as u64
}

/// A warning when `available_mib` (MemAvailable) is short of [`memory_needed_mib`].
pub fn memory_warning(skrs: usize, replicas: usize, available_mib: u64) -> Option<String> {
    let needed = memory_needed_mib(skrs, replicas);
    (needed > available_mib).then(|| {
        format!(
            "WARNING: {skrs} SKRs and {replicas} replicas need about {needed} MiB of memory (about 300 MiB per \
             kube-apiserver), and only {available_mib} MiB are available; pass fewer --skrs if the control planes \
             do not come up"
        )
    })
}

#[cfg(test)]
mod tests {
    use catalogsync::sharding::table::Row;

    use super::*;

    const NS: &str = "kcp-system";

    fn replicas(n: usize) -> Vec<ReplicaInfo> {
        (0..n)
            .map(|i| ReplicaInfo {
                identity: format!("catalogsync-{i}"),
                http_addr: SocketAddr::from(([127, 0, 0, 1], 8080 + u16::try_from(i).expect("small"))),
            })
            .collect()
    }

    /// A table of `shards` shards held round-robin by `holders` (all live), state `held`.
    fn table(shards: u32, holders: &[&str]) -> Table {
        let rows = (0..shards)
            .map(|shard| {
                let holder = if holders.is_empty() { "" } else { holders[shard as usize % holders.len()] };
                Row {
                    shard,
                    holder: holder.to_owned(),
                    desired: holder.to_owned(),
                    skrs: 0,
                    state: if holder.is_empty() { "unowned" } else { "held" },
                }
            })
            .collect();
        Table {
            coordinator: holders.first().map(|h| (*h).to_owned()).unwrap_or_default(),
            members: holders.iter().map(|h| (*h).to_owned()).collect(),
            shards,
            rows,
        }
    }

    fn kymas(n: usize, synced: bool) -> Vec<KymaState> {
        (1..=n).map(|i| KymaState { name: format!("kyma-{i}"), skr: format!("skr-{i}"), synced }).collect()
    }

    #[test]
    fn progress_is_done_once_every_shard_is_held_by_a_live_replica_within_the_cap_and_every_kyma_is_synced() {
        let running = ["catalogsync-0", "catalogsync-1", "catalogsync-2"];
        let done = Progress::of(&table(64, &running), &running, &kymas(6, true));
        assert!(done.is_done(), "{done}");
        assert_eq!(done.to_string(), "3/3 replicas live, 64/64 shards held, 6/6 Kymas synced");

        let unsynced = Progress::of(&table(64, &running), &running, &kymas(6, false));
        assert!(!unsynced.is_done(), "{unsynced}");

        let one_holds_all = Progress::of(&table(64, &running[..1]), &running, &kymas(6, true));
        assert!(!one_holds_all.is_done(), "the others joined but hold nothing yet: {one_holds_all}");
        assert_eq!(one_holds_all.to_string(), "1/3 replicas live, 64/64 shards held, 6/6 Kymas synced");

        let mut moving = table(64, &running);
        moving.rows[3].desired = "catalogsync-2".to_owned();
        moving.rows[3].state = "moving";
        let p = Progress::of(&moving, &running, &kymas(6, true));
        assert!(!p.is_done());
        assert_eq!(p.to_string(), "3/3 replicas live, 63/64 shards held (1 moving), 6/6 Kymas synced");

        let empty = Progress::of(&table(0, &[]), &running, &kymas(6, false));
        assert!(!empty.is_done());
        assert_eq!(empty.to_string(), "0/3 replicas live, no shard Leases yet, 0/6 Kymas synced");
    }

    #[test]
    fn assignment_lists_each_replica_with_its_address_shard_count_and_kymas() {
        let infos = replicas(3);
        let running: Vec<&str> = infos.iter().map(|r| r.identity.as_str()).collect();
        let t = table(64, &running);
        let ks = kymas(6, true);
        let text = assignment(&t, &infos, &ks, NS);
        assert!(text.starts_with("coordinator: catalogsync-0\n"), "{text}");
        assert!(text.contains("REPLICA        HTTP            SHARDS  KYMAS (SKR)"), "{text}");
        assert!(text.contains("catalogsync-0  127.0.0.1:8080      22  "), "{text}");
        assert!(text.contains("catalogsync-2  127.0.0.1:8082      21  "), "{text}");
        // Every Kyma is listed once, on the line of the replica holding its shard.
        for k in &ks {
            let holder = &t.row_of(NS, &k.name).expect("shard").holder;
            let line = text.lines().find(|l| l.starts_with(holder.as_str())).expect("the holder's line");
            assert!(line.contains(&format!("{} ({})", k.name, k.skr)), "{k:?} not on {line:?}");
            assert_eq!(text.matches(&format!("{} (", k.name)).count(), 1, "{text}");
        }
        assert!(text.contains("shards held:\n  catalogsync-0  0, 3, 6, 9,"), "{text}");
    }

    #[test]
    fn assignment_shows_unheld_shards_idle_replicas_and_unsynced_kymas() {
        let infos = replicas(2);
        let t = table(4, &[]);
        let text = assignment(&t, &infos, &kymas(1, false), NS);
        assert!(text.contains("coordinator: <none>"), "{text}");
        assert!(text.contains("catalogsync-1  127.0.0.1:8081       0  -"), "{text}");
        assert!(text.contains("<unheld>       -                    4  kyma-1 (skr-1, not synced yet)"), "{text}");
        assert!(text.contains("  catalogsync-0  none"), "{text}");
    }

    #[test]
    fn ranges_join_consecutive_shards() {
        assert_eq!(ranges(&[7, 0, 1, 2, 5, 8]), "0-2, 5, 7-8");
        assert_eq!(ranges(&[3]), "3");
        assert_eq!(ranges(&[]), "none");
    }

    #[test]
    fn look_again_prints_the_shards_command_and_every_metrics_url() {
        let text = look_again(
            Path::new("target/debug/catalogsync"),
            Path::new("dir/kubeconfigs/kcp.kubeconfig"),
            "catalogsync-system",
            NS,
            &replicas(3),
        );
        assert!(text.contains(
            "KUBECONFIG=dir/kubeconfigs/kcp.kubeconfig target/debug/catalogsync shards --lease-namespace \
             catalogsync-system --kcp-namespace kcp-system"
        ));
        for port in 8080..8083 {
            assert!(text.contains(&format!("http://127.0.0.1:{port}/metrics")), "{text}");
        }
    }

    #[test]
    fn memory_warning_only_when_short() {
        assert_eq!(memory_needed_mib(2, 1), 150 + 900 + 50);
        assert!(memory_warning(2, 1, 4096).is_none());
        let warning = memory_warning(8, 3, 1024).expect("short");
        assert!(warning.contains("8 SKRs and 3 replicas need about 3000 MiB"), "{warning}");
    }
}
