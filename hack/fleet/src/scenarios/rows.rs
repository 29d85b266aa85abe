//! The typed rows of the report's tables: what the scenarios measure and assert on, numbers
//! as numbers, and how each row becomes the cells of its Markdown table (the one place that
//! formats them).

use std::collections::BTreeMap;

use serde::Serialize;

use super::report::{Row, f1, f2};
use crate::bench::{ProcSample, Spread};
use crate::sim::SimStats;
use crate::stats::Percentiles;

/// The simulator's traffic over a measurement window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Traffic {
    /// SKRs the window's traffic is spread over (the bench's Kymas).
    pub skrs: usize,
    /// SKR requests.
    pub requests: u64,
    /// SKR writes that reached the simulator's store.
    pub writes: u64,
    /// Requests by verb (`get`, `list-meta`, `apply`, ...).
    pub by_verb: BTreeMap<String, u64>,
    /// Requests by verb and resource, as the simulator keys them (`apply namespaces`, ...).
    pub by_request: BTreeMap<String, u64>,
    /// TLS handshakes.
    pub handshakes: u64,
    /// Of them, resumed sessions.
    pub resumed_handshakes: u64,
}

impl Traffic {
    /// The traffic in the simulator's `stats`, spread over `skrs` SKRs.
    pub fn new(stats: &SimStats, skrs: usize) -> Traffic {
        let mut by_verb: BTreeMap<String, u64> = BTreeMap::new();
        for (key, v) in &stats.requests {
            *by_verb.entry(key.split(' ').next().unwrap_or(key).to_owned()).or_default() += v;
        }
        Traffic {
            skrs,
            requests: stats.total_requests,
            writes: stats.writes,
            by_verb,
            by_request: stats.requests.clone(),
            handshakes: stats.handshakes,
            resumed_handshakes: stats.resumed_handshakes,
        }
    }

    /// `v` per SKR.
    pub fn per_skr(&self, v: u64) -> f64 {
        v as f64 / self.skrs.max(1) as f64
    }

    /// The "by verb" cell.
    pub fn verbs(&self) -> String {
        let mut verbs: Vec<String> = self.by_verb.iter().map(|(k, v)| format!("{k} {v}")).collect();
        verbs.push(format!("TLS handshakes {} ({} resumed)", self.handshakes, self.resumed_handshakes));
        verbs.join(", ")
    }
}

/// `values` with `format`, joined by ` / `.
fn joined(values: &[f64], format: fn(f64) -> String) -> String {
    values.iter().map(|v| format(*v)).collect::<Vec<_>>().join(" / ")
}

/// A value or `-`.
fn or_dash(value: Option<f64>, format: fn(f64) -> String) -> String {
    value.map_or_else(|| "-".to_owned(), format)
}

/// Until every SKR synced after a start or after Kymas were added.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutRow {
    /// Kymas (those added, when `added`).
    pub kymas: usize,
    /// Whether `kymas` were added while the replicas ran.
    pub added: bool,
    /// Replicas.
    pub replicas: usize,
    /// Seconds until every SKR synced.
    pub seconds: f64,
    /// What was started.
    pub what: String,
    /// The simulator's traffic meanwhile, where it was measured alone.
    pub traffic: Option<Traffic>,
}

impl RolloutRow {
    /// The table's header.
    pub const HEADER: [&str; 7] =
        ["Kymas", "replicas", "seconds until every SKR synced", "SKR requests / SKR", "SKR writes", "by verb", "what"];
}

impl Row for RolloutRow {
    fn cells(&self) -> Vec<String> {
        let kymas = if self.added { format!("+{}", self.kymas) } else { self.kymas.to_string() };
        let (per_skr, writes, verbs) = match &self.traffic {
            Some(t) => (f2(t.requests as f64 / t.skrs.max(1) as f64), t.writes.to_string(), t.verbs()),
            None => ("-".into(), "-".into(), "-".into()),
        };
        vec![kymas, self.replicas.to_string(), f1(self.seconds), per_skr, writes, verbs, self.what.clone()]
    }
}

/// One propagation: a change made in the KCP until every SKR holds it.
#[derive(Debug, Clone, Serialize)]
pub struct PropagationRow {
    /// Who propagated what.
    pub run: String,
    /// Over every SKR.
    pub latency: Spread,
    /// The simulator's traffic meanwhile.
    pub traffic: Traffic,
    /// Objects changed (catalogsync's runs; the baseline's window mixes changes).
    pub objects: Option<usize>,
    /// CPU seconds of all replicas (catalogsync's runs).
    pub replica_cpu_seconds: Option<f64>,
    /// CPU seconds of the simulator (catalogsync's runs).
    pub sim_cpu_seconds: Option<f64>,
}

impl PropagationRow {
    /// The table's header.
    pub const HEADER: [&str; 12] = [
        "run",
        "p50 s",
        "p99 s",
        "max s",
        "SKR requests",
        "requests / SKR",
        "SKR writes",
        "writes / SKR / object",
        "replica CPU s (all)",
        "replica CPU ms / SKR",
        "simulator CPU s",
        "by verb",
    ];
}

impl Row for PropagationRow {
    fn cells(&self) -> Vec<String> {
        let t = &self.traffic;
        vec![
            self.run.clone(),
            self.latency.p50.to_string(),
            self.latency.p99.to_string(),
            self.latency.max.to_string(),
            t.requests.to_string(),
            f2(t.per_skr(t.requests)),
            t.writes.to_string(),
            or_dash(self.objects.map(|o| t.per_skr(t.writes) / o as f64), f2),
            or_dash(self.replica_cpu_seconds, f1),
            or_dash(self.replica_cpu_seconds.map(|cpu| 1000.0 * cpu / t.skrs.max(1) as f64), f2),
            or_dash(self.sim_cpu_seconds, f1),
            t.verbs(),
        ]
    }
}

/// How the single update's p99 scales with replicas, at two SKR latencies.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRow {
    /// Replicas.
    pub replicas: usize,
    /// p99 seconds at the normal SKR latency.
    pub p99_seconds: f64,
    /// Speed-up over 1 replica, when measured.
    pub speedup_vs_1: Option<f64>,
    /// Speed-up over 3 replicas, when measured.
    pub speedup_vs_3: Option<f64>,
    /// p99 seconds at the slow SKR latency.
    pub slow_p99_seconds: f64,
    /// Speed-up over 1 replica at the slow SKR latency, when measured.
    pub slow_speedup_vs_1: Option<f64>,
    /// Speed-up over 3 replicas at the slow SKR latency, when measured.
    pub slow_speedup_vs_3: Option<f64>,
}

impl ScalingRow {
    /// The rows from the p99s (normal, slow SKR latency) by replica count.
    pub fn all(p99s: &BTreeMap<usize, (f64, f64)>) -> Vec<ScalingRow> {
        let ratio = |base: usize, pick: fn(&(f64, f64)) -> f64, mine: f64| p99s.get(&base).map(|b| pick(b) / mine);
        p99s.iter()
            .map(|(&replicas, &(p99, slow))| ScalingRow {
                replicas,
                p99_seconds: p99,
                speedup_vs_1: ratio(1, |b| b.0, p99),
                speedup_vs_3: ratio(3, |b| b.0, p99),
                slow_p99_seconds: slow,
                slow_speedup_vs_1: ratio(1, |b| b.1, slow),
                slow_speedup_vs_3: ratio(3, |b| b.1, slow),
            })
            .collect()
    }

    /// The table's header, naming both SKR latencies.
    pub fn header(latency_ms: f64, slow_latency_ms: f64) -> Vec<String> {
        vec![
            "replicas".to_owned(),
            format!("p99 s, {latency_ms} ms SKR latency"),
            "speed-up vs 1".to_owned(),
            "speed-up vs 3".to_owned(),
            format!("p99 s, {slow_latency_ms} ms SKR latency"),
            "speed-up vs 1".to_owned(),
            "speed-up vs 3".to_owned(),
        ]
    }
}

impl Row for ScalingRow {
    fn cells(&self) -> Vec<String> {
        vec![
            self.replicas.to_string(),
            f2(self.p99_seconds),
            or_dash(self.speedup_vs_1, f2),
            or_dash(self.speedup_vs_3, f2),
            f2(self.slow_p99_seconds),
            or_dash(self.slow_speedup_vs_1, f2),
            or_dash(self.slow_speedup_vs_3, f2),
        ]
    }
}

/// A new module (MRM + MT created) until every SKR holds it.
#[derive(Debug, Clone, Serialize)]
pub struct NewModuleRow {
    /// Who propagated it.
    pub run: String,
    /// Over every SKR.
    pub latency: Spread,
}

impl NewModuleRow {
    /// The table's header.
    pub const HEADER: [&str; 4] = ["run", "p50 s", "p99 s", "max s"];
}

impl Row for NewModuleRow {
    fn cells(&self) -> Vec<String> {
        vec![self.run.clone(), self.latency.p50.to_string(), self.latency.p99.to_string(), self.latency.max.to_string()]
    }
}

/// One MT update while SKR requests fail and some SKRs are down.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRow {
    /// SKRs.
    pub skrs: usize,
    /// SKRs down (503) during the update.
    pub down: usize,
    /// Seconds until the healthy SKRs held the update.
    pub healthy: Percentiles,
    /// Requests answered with an injected error.
    pub injected_errors: u64,
    /// Seconds from the down SKRs' return until all of them held it.
    pub recovered_seconds: f64,
}

impl FaultRow {
    /// The table's header.
    pub const HEADER: [&str; 5] = [
        "SKRs",
        "down",
        "healthy SKRs: p50 / p99 / max s",
        "injected errors",
        "down SKRs hold it after they are back: s",
    ];
}

impl Row for FaultRow {
    fn cells(&self) -> Vec<String> {
        let h = &self.healthy;
        vec![
            self.skrs.to_string(),
            self.down.to_string(),
            format!("{} / {} / {}", f2(h.p50), f2(h.p99), f2(h.max)),
            self.injected_errors.to_string(),
            f1(self.recovered_seconds),
        ]
    }
}

/// Shards moving between replicas.
#[derive(Debug, Clone, Serialize)]
pub struct RebalanceRow {
    /// The move.
    pub change: String,
    /// Shards moved.
    pub shards_moved: u64,
    /// SKRs moved.
    pub skrs_moved: u64,
    /// Seconds until the shards settled.
    pub settle_seconds: f64,
    /// Handovers completed.
    pub handovers: u64,
    /// Their mean claim duration, seconds.
    pub handover_mean_seconds: f64,
    /// Most SKRs unowned at once.
    pub max_unowned: u64,
    /// Seconds with any SKR unowned.
    pub unowned_seconds: f64,
    /// The simulator's traffic meanwhile.
    pub traffic: Traffic,
}

impl RebalanceRow {
    /// The table's header.
    pub const HEADER: [&str; 9] = [
        "move",
        "shards moved",
        "SKRs moved",
        "seconds until settled",
        "handovers (claim duration mean s)",
        "unowned SKRs: max, seconds",
        "SKR requests",
        "SKR writes",
        "by verb",
    ];
}

impl Row for RebalanceRow {
    fn cells(&self) -> Vec<String> {
        vec![
            self.change.clone(),
            self.shards_moved.to_string(),
            self.skrs_moved.to_string(),
            f1(self.settle_seconds),
            format!("{} ({})", self.handovers, f2(self.handover_mean_seconds)),
            format!("{}, {}", self.max_unowned, f1(self.unowned_seconds)),
            self.traffic.requests.to_string(),
            self.traffic.writes.to_string(),
            self.traffic.verbs(),
        ]
    }
}

/// Resyncs with nothing changed, over a few periods.
#[derive(Debug, Clone, Serialize)]
pub struct SteadyRow {
    /// Who resynced, how.
    pub run: String,
    /// Periods the window covers: the configured count for catalogsync, passes / Kymas for
    /// the baseline.
    pub periods: f64,
    /// The simulator's traffic over the window.
    pub traffic: Traffic,
    /// KCP writes other than Leases.
    pub kcp_writes: u64,
    /// KCP Lease writes.
    pub kcp_lease_writes: u64,
    /// CPU seconds per period, per process.
    pub cpu_seconds_per_period: Vec<f64>,
    /// Peak RSS, MiB, per process, from its start to the window's start.
    pub start_peak_rss_mib: Vec<f64>,
    /// Peak RSS, MiB, per process, within the window.
    pub peak_rss_mib: Vec<f64>,
    /// The simulator's CPU seconds per period.
    pub sim_cpu_seconds_per_period: f64,
}

impl SteadyRow {
    /// The table's header.
    pub const HEADER: [&str; 11] = [
        "run",
        "periods",
        "SKR requests / SKR / period",
        "SKR writes",
        "KCP writes (non-Lease)",
        "KCP Lease writes",
        "CPU s / period, per replica",
        "peak RSS MiB before the window, per replica",
        "peak RSS MiB in the window, per replica",
        "simulator CPU s / period",
        "by verb",
    ];
}

impl Row for SteadyRow {
    fn cells(&self) -> Vec<String> {
        let t = &self.traffic;
        let periods = if self.periods.fract() == 0.0 { format!("{:.0}", self.periods) } else { f2(self.periods) };
        vec![
            self.run.clone(),
            periods,
            f2(t.per_skr(t.requests) / self.periods),
            t.writes.to_string(),
            self.kcp_writes.to_string(),
            self.kcp_lease_writes.to_string(),
            joined(&self.cpu_seconds_per_period, f2),
            joined(&self.start_peak_rss_mib, f1),
            joined(&self.peak_rss_mib, f1),
            f2(self.sim_cpu_seconds_per_period),
            t.verbs(),
        ]
    }
}

/// One side of the Kyma reconcile comparison: a round of the baseline's reconcile (every
/// Kyma due at once, so the workers are busy throughout), or catalogsync's steady state.
/// Per-unit columns divide by passes, or by SKRs times resync periods.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileRow {
    /// Who, doing what.
    pub run: String,
    /// What one unit is: a Kyma's pass, or an SKR's resync period.
    pub unit: &'static str,
    /// Units in the window.
    pub units: f64,
    /// The window, seconds.
    pub window_seconds: f64,
    /// Pass durations, seconds (the baseline).
    pub pass_seconds: Option<Percentiles>,
    /// Passes per second over the round (the baseline).
    pub kymas_per_second: Option<f64>,
    /// The simulator's traffic over the window.
    pub traffic: Traffic,
    /// KCP writes of the run's processes other than Leases.
    pub kcp_writes: u64,
    /// CPU seconds over the window, per process.
    pub cpu_seconds: Vec<f64>,
    /// The simulator's CPU seconds over the window.
    pub sim_cpu_seconds: f64,
}

impl ReconcileRow {
    /// The table's header.
    pub const HEADER: [&str; 13] = [
        "run",
        "unit",
        "units",
        "window s",
        "pass p50 / p99 s",
        "Kymas/s",
        "SKR requests / unit",
        "SKR writes / unit",
        "KCP writes / unit",
        "CPU s, per process",
        "CPU ms / unit",
        "simulator CPU ms / unit",
        "SKR requests / unit, by request",
    ];

    /// catalogsync's steady state as a row of this table: one unit per SKR and period.
    pub fn from_steady(steady: &SteadyRow) -> ReconcileRow {
        let skr_periods = steady.periods * steady.traffic.skrs as f64;
        ReconcileRow {
            run: steady.run.clone(),
            unit: "SKR period",
            units: skr_periods,
            window_seconds: 0.0,
            pass_seconds: None,
            kymas_per_second: None,
            traffic: steady.traffic.clone(),
            kcp_writes: steady.kcp_writes,
            cpu_seconds: steady.cpu_seconds_per_period.iter().map(|c| c * steady.periods).collect(),
            sim_cpu_seconds: steady.sim_cpu_seconds_per_period * steady.periods,
        }
    }

    /// `v` per unit.
    fn per_unit(&self, v: f64) -> f64 {
        v / self.units.max(1.0)
    }
}

impl Row for ReconcileRow {
    fn cells(&self) -> Vec<String> {
        let t = &self.traffic;
        let per = |v: u64| f2(self.per_unit(v as f64));
        let pass = self.pass_seconds.as_ref().map(|p| format!("{} / {}", f2(p.p50), f2(p.p99)));
        let by_request: Vec<String> =
            t.by_request.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} {}", per(*v))).collect();
        vec![
            self.run.clone(),
            self.unit.to_owned(),
            format!("{:.0}", self.units),
            or_dash(Some(self.window_seconds).filter(|w| *w > 0.0), f1),
            pass.unwrap_or_else(|| "-".to_owned()),
            or_dash(self.kymas_per_second, f2),
            per(t.requests),
            per(t.writes),
            per(self.kcp_writes),
            joined(&self.cpu_seconds, f1),
            f2(1000.0 * self.per_unit(self.cpu_seconds.iter().sum())),
            f2(1000.0 * self.per_unit(self.sim_cpu_seconds)),
            by_request.join(", "),
        ]
    }
}

/// Replica memory at a fleet size.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// Kymas.
    pub kymas: usize,
    /// Replicas.
    pub replicas: usize,
    /// Peak RSS, MiB, per replica.
    pub peak_rss_mib: Vec<f64>,
    /// The largest of them.
    pub max_peak_rss_mib: f64,
    /// RSS now, MiB, per replica.
    pub rss_mib: Vec<f64>,
}

impl MemoryRow {
    /// The table's header.
    pub const HEADER: [&str; 5] = ["Kymas", "replicas", "peak RSS MiB per replica", "max", "RSS now MiB"];

    /// The row of `samples` (one per replica).
    pub fn new(kymas: usize, replicas: usize, samples: &BTreeMap<String, ProcSample>) -> MemoryRow {
        let peak_rss_mib: Vec<f64> = samples.values().map(|s| s.peak_rss_mib).collect();
        let max_peak_rss_mib = peak_rss_mib.iter().copied().fold(0.0, f64::max);
        let rss_mib = samples.values().map(|s| s.rss_mib).collect();
        MemoryRow { kymas, replicas, peak_rss_mib, max_peak_rss_mib, rss_mib }
    }
}

impl Row for MemoryRow {
    fn cells(&self) -> Vec<String> {
        vec![
            self.kymas.to_string(),
            self.replicas.to_string(),
            joined(&self.peak_rss_mib, f1),
            f1(self.max_peak_rss_mib),
            joined(&self.rss_mib, f1),
        ]
    }
}

/// Requests of one kind in one calibration phase, real SKR apiservers vs the simulator.
#[derive(Debug, Clone, Serialize)]
pub struct RequestCountRow {
    /// The phase.
    pub phase: String,
    /// `"<audit verb> <resource>"`.
    pub request: String,
    /// Counted in the real SKRs' audit logs.
    pub real: u64,
    /// Counted by the simulator.
    pub simulated: u64,
}

impl RequestCountRow {
    /// The table's header.
    pub const HEADER: [&str; 5] = ["phase", "request", "real apiservers (audit log)", "simulator", ""];

    /// Whether both sides saw as many.
    pub fn is_identical(&self) -> bool {
        self.real == self.simulated
    }
}

impl Row for RequestCountRow {
    fn cells(&self) -> Vec<String> {
        let same = if self.is_identical() { "=" } else { "differs" };
        vec![self.phase.clone(), self.request.clone(), self.real.to_string(), self.simulated.to_string(), same.into()]
    }
}

/// The size of one list response, real SKR apiserver vs the simulator.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseSizeRow {
    /// The request.
    pub request: String,
    /// Bytes of JSON from a real SKR apiserver.
    pub real_bytes: usize,
    /// Bytes of JSON from the simulator.
    pub simulated_bytes: usize,
}

impl ResponseSizeRow {
    /// The table's header.
    pub const HEADER: [&str; 4] = ["request", "real SKR apiserver", "simulator", "simulator / real"];
}

impl Row for ResponseSizeRow {
    fn cells(&self) -> Vec<String> {
        vec![
            self.request.clone(),
            self.real_bytes.to_string(),
            self.simulated_bytes.to_string(),
            f2(self.simulated_bytes as f64 / self.real_bytes.max(1) as f64),
        ]
    }
}

/// Per-request latency of one request kind, in seconds.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeLatencyRow {
    /// The request.
    pub request: String,
    /// Against a real SKR apiserver.
    pub real: Percentiles,
    /// Against the simulator without injected latency.
    pub simulated: Percentiles,
    /// Against the simulator with injected latency.
    pub simulated_slow: Percentiles,
}

impl ProbeLatencyRow {
    /// The table's header, naming the injected latency.
    pub fn header(latency_ms: f64) -> Vec<String> {
        vec![
            "request".to_owned(),
            "real SKR apiserver".to_owned(),
            "simulator, no injected latency".to_owned(),
            format!("simulator, {latency_ms} ms injected"),
        ]
    }
}

impl Row for ProbeLatencyRow {
    fn cells(&self) -> Vec<String> {
        let ms = |p: &Percentiles| format!("{} / {}", f2(p.p50 * 1000.0), f2(p.p99 * 1000.0));
        vec![self.request.clone(), ms(&self.real), ms(&self.simulated), ms(&self.simulated_slow)]
    }
}

/// What the smoke run measured.
#[derive(Debug, Clone, Serialize)]
pub struct SmokeResult {
    /// Kymas (SKRs).
    pub kymas: usize,
    /// Replicas.
    pub replicas: usize,
    /// Seconds until every SKR synced.
    pub rollout_seconds: f64,
    /// Seconds until every SKR held one MT update.
    pub one_mt: Percentiles,
    /// SKR writes of that update.
    pub one_mt_writes: u64,
    /// A new module until every SKR held it.
    pub new_module: Spread,
    /// The baseline's passes in its round.
    pub baseline_passes: u64,
    /// The baseline's SKR requests in its round.
    pub baseline_requests: u64,
    /// The baseline's median pass, seconds.
    pub baseline_pass_p50_seconds: f64,
}

impl SmokeResult {
    /// The table's header.
    pub const HEADER: [&str; 2] = ["check", "result"];

    /// One row per check.
    pub fn checks(&self) -> Vec<Vec<String>> {
        let one = &self.one_mt;
        vec![
            vec![format!("rollout to {} SKRs, {} replicas (s)", self.kymas, self.replicas), f1(self.rollout_seconds)],
            vec![
                "one MT update: p50 / p99 / max (s)".into(),
                format!("{} / {} / {}", f2(one.p50), f2(one.p99), f2(one.max)),
            ],
            vec!["one MT update: SKR writes".into(), self.one_mt_writes.to_string()],
            vec!["new module: p99 (s)".into(), self.new_module.p99.to_string()],
            vec![
                "baseline round: passes, requests".into(),
                format!("{}, {}", self.baseline_passes, self.baseline_requests),
            ],
            vec!["baseline pass p50 (s)".into(), f2(self.baseline_pass_p50_seconds)],
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Latency;

    fn traffic() -> Traffic {
        Traffic {
            skrs: 100,
            requests: 250,
            writes: 100,
            by_verb: [("apply".to_owned(), 100), ("list-meta".to_owned(), 150)].into(),
            by_request: [("apply moduletemplates".to_owned(), 100), ("list-meta moduletemplates".to_owned(), 150)]
                .into(),
            handshakes: 3,
            resumed_handshakes: 1,
        }
    }

    #[test]
    fn a_catalogsync_propagation_row_has_every_column_and_the_baseline_dashes_what_it_does_not_measure() {
        let catalogsync = PropagationRow {
            run: "catalogsync".into(),
            latency: (&Percentiles { count: 100, p50: 1.0, p90: 2.0, p99: 3.0, max: 4.0 }).into(),
            traffic: traffic(),
            objects: Some(2),
            replica_cpu_seconds: Some(1.25),
            sim_cpu_seconds: Some(0.5),
        };
        assert_eq!(
            catalogsync.cells(),
            [
                "catalogsync",
                "1.00",
                "3.00",
                "4.00",
                "250",
                "2.50",
                "100",
                "0.50",
                "1.2",
                "12.50",
                "0.5",
                "apply 100, list-meta 150, TLS handshakes 3 (1 resumed)"
            ]
        );
        let later =
            Spread { p50: Latency::Seconds(1.0), p99: Latency::LaterThan(1800.0), max: Latency::LaterThan(1800.0) };
        let baseline = PropagationRow {
            run: "baseline".into(),
            latency: later,
            traffic: traffic(),
            objects: None,
            replica_cpu_seconds: None,
            sim_cpu_seconds: None,
        };
        assert_eq!(baseline.cells()[1..4], ["1.00", "> 1800", "> 1800"]);
        assert_eq!(baseline.cells()[7..11], ["-", "-", "-", "-"]);
        assert_eq!(baseline.cells().len(), PropagationRow::HEADER.len());
    }

    fn steady(periods: f64) -> SteadyRow {
        SteadyRow {
            run: "r".into(),
            periods,
            traffic: traffic(),
            kcp_writes: 7,
            kcp_lease_writes: 9,
            cpu_seconds_per_period: vec![0.5, 0.25],
            start_peak_rss_mib: vec![110.0, 121.0],
            peak_rss_mib: vec![100.0, 120.04],
            sim_cpu_seconds_per_period: 0.1,
        }
    }

    #[test]
    fn steady_rows_show_configured_periods_whole_and_estimated_ones_with_decimals() {
        let catalogsync = steady(3.0).cells();
        assert_eq!(catalogsync[1..9], ["3", "0.83", "100", "7", "9", "0.50 / 0.25", "110.0 / 121.0", "100.0 / 120.0"]);
        let baseline = steady(0.8).cells();
        assert_eq!(baseline[1..5], ["0.80", "3.12", "100", "7"]);
    }

    #[test]
    fn reconcile_rows_divide_by_passes_or_by_skr_periods() {
        let round = ReconcileRow {
            run: "baseline".into(),
            unit: "pass",
            units: 100.0,
            window_seconds: 20.0,
            pass_seconds: Some(Percentiles { count: 100, p50: 0.5, p90: 0.7, p99: 0.9, max: 1.0 }),
            kymas_per_second: Some(5.0),
            traffic: traffic(),
            kcp_writes: 100,
            cpu_seconds: vec![2.0],
            sim_cpu_seconds: 1.0,
        };
        assert_eq!(
            round.cells(),
            [
                "baseline",
                "pass",
                "100",
                "20.0",
                "0.50 / 0.90",
                "5.00",
                "2.50",
                "1.00",
                "1.00",
                "2.0",
                "20.00",
                "10.00",
                "apply moduletemplates 1.00, list-meta moduletemplates 1.50"
            ]
        );
        // 3 periods over 100 SKRs: 300 units; CPU per period times 3, per replica.
        let catalogsync = ReconcileRow::from_steady(&steady(3.0)).cells();
        assert_eq!(catalogsync[1..5], ["SKR period", "300", "-", "-"]);
        assert_eq!(catalogsync[6..12], ["0.83", "0.33", "0.02", "1.5 / 0.8", "7.50", "1.00"]);
        assert_eq!(catalogsync.len(), ReconcileRow::HEADER.len());
    }

    #[test]
    fn added_kymas_are_shown_with_a_plus() {
        let row =
            RolloutRow { kymas: 4000, added: true, replicas: 3, seconds: 61.26, what: "grown".into(), traffic: None };
        assert_eq!(row.cells(), ["+4000", "3", "61.3", "-", "-", "-", "grown"]);
    }

    #[test]
    fn speed_ups_need_the_base_replica_count() {
        let rows = ScalingRow::all(&[(1, (8.0, 40.0)), (3, (4.0, 10.0))].into());
        assert_eq!(rows[0].cells(), ["1", "8.00", "1.00", "0.50", "40.00", "1.00", "0.25"]);
        assert_eq!(rows[1].cells(), ["3", "4.00", "2.00", "1.00", "10.00", "4.00", "1.00"]);
        let only_five = ScalingRow::all(&[(5, (2.0, 5.0))].into());
        assert_eq!(only_five[0].cells()[2..4], ["-", "-"]);
    }
}
