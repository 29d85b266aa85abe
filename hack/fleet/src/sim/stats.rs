//! Request counters and service-time histograms, lock-free: one slot per
//! (verb, resource) pair, each with an atomic count and a log-bucket histogram.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::store::Res;
use crate::stats::Percentiles;

/// Request verbs, as in the stats keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verb {
    Get,
    GetMeta,
    List,
    ListMeta,
    Watch,
    Apply,
    Replace,
    /// PUT to the `/status` subresource.
    ReplaceStatus,
    Create,
    Delete,
    Other,
}

impl Verb {
    const ALL: [Verb; 11] = [
        Verb::Get,
        Verb::GetMeta,
        Verb::List,
        Verb::ListMeta,
        Verb::Watch,
        Verb::Apply,
        Verb::Replace,
        Verb::ReplaceStatus,
        Verb::Create,
        Verb::Delete,
        Verb::Other,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::GetMeta => "get-meta",
            Verb::List => "list",
            Verb::ListMeta => "list-meta",
            Verb::Watch => "watch",
            Verb::Apply => "apply",
            Verb::Replace => "replace",
            Verb::ReplaceStatus => "replace-status",
            Verb::Create => "create",
            Verb::Delete => "delete",
            Verb::Other => "other",
        }
    }
}

/// Resource slots: the served resources plus "other" (unknown paths).
const RES_SLOTS: usize = Res::ALL.len() + 1;
const SLOTS: usize = Verb::ALL.len() * RES_SLOTS;

/// Histogram bucket ratio: a value in bucket `i` lies in `[R^i, R^(i+1))` ns, and the bucket is
/// reported as its geometric middle, so the error is below 1%.
const RATIO: f64 = 1.02;
/// `1.02^1500` ns is about 2.3 hours: far above any request.
const BUCKETS: usize = 1500;

struct Histogram {
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    max_ns: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }

    fn record(&self, ns: u64) {
        let ns = ns.max(1);
        let i = ((ns as f64).ln() / RATIO.ln()) as usize;
        if let Some(b) = self.buckets.get(i.min(BUCKETS - 1)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
        self.max_ns.store(0, Ordering::Relaxed);
    }

    /// Percentiles in microseconds.
    fn percentiles(&self) -> Percentiles {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let count: u64 = counts.iter().sum();
        let max = self.max_ns.load(Ordering::Relaxed) as f64 / 1000.0;
        let at = |q: f64| -> f64 {
            let rank = ((q * count as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    let mid = RATIO.powf(i as f64 + 0.5) / 1000.0;
                    return mid.min(max);
                }
            }
            max
        };
        if count == 0 {
            return Percentiles::default();
        }
        Percentiles { count, p50: at(0.5), p90: at(0.9), p99: at(0.99), max }
    }
}

/// Global counters of SKR requests.
pub(super) struct Stats {
    total: AtomicU64,
    requests: Vec<AtomicU64>,
    service: Vec<Histogram>,
    writes: AtomicU64,
    changed_writes: AtomicU64,
    injected_errors: AtomicU64,
    handshakes: AtomicU64,
    resumed_handshakes: AtomicU64,
}

/// Totals read from [`Stats`].
pub(super) struct Totals {
    pub total_requests: u64,
    pub requests: BTreeMap<String, u64>,
    pub writes: u64,
    pub changed_writes: u64,
    pub injected_errors: u64,
    pub handshakes: u64,
    pub resumed_handshakes: u64,
    pub service_us: BTreeMap<String, Percentiles>,
}

fn slot(verb: Verb, res: Option<Res>) -> usize {
    let verb_index = Verb::ALL.iter().position(|v| *v == verb).unwrap_or(Verb::ALL.len() - 1);
    verb_index * RES_SLOTS + res.map_or(RES_SLOTS - 1, Res::index)
}

fn key(i: usize) -> String {
    let verb = Verb::ALL.get(i / RES_SLOTS).copied().unwrap_or(Verb::Other);
    let res = Res::ALL.get(i % RES_SLOTS).map_or("other", |r| r.plural());
    format!("{} {res}", verb.as_str())
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            total: AtomicU64::new(0),
            requests: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            service: (0..SLOTS).map(|_| Histogram::new()).collect(),
            writes: AtomicU64::new(0),
            changed_writes: AtomicU64::new(0),
            injected_errors: AtomicU64::new(0),
            handshakes: AtomicU64::new(0),
            resumed_handshakes: AtomicU64::new(0),
        }
    }
}

impl Stats {
    /// Counts one SKR request.
    pub fn request(&self, verb: Verb, res: Option<Res>) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.requests.get(slot(verb, res)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records the service time of one request.
    pub fn service(&self, verb: Verb, res: Option<Res>, took: Duration) {
        if let Some(h) = self.service.get(slot(verb, res)) {
            h.record(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        }
    }

    /// Counts one write that reached the store.
    pub fn write(&self, changed: bool) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if changed {
            self.changed_writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one injected error (500 or 503).
    pub fn injected_error(&self) {
        self.injected_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one completed TLS handshake, and whether it resumed a session.
    pub fn handshake(&self, resumed: bool) {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        if resumed {
            self.resumed_handshakes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Zeroes every counter.
    pub fn reset(&self) {
        for c in [
            &self.total,
            &self.writes,
            &self.changed_writes,
            &self.injected_errors,
            &self.handshakes,
            &self.resumed_handshakes,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        for c in &self.requests {
            c.store(0, Ordering::Relaxed);
        }
        for h in &self.service {
            h.reset();
        }
    }

    /// Reads every counter; keys with no requests are left out.
    pub fn totals(&self) -> Totals {
        let mut requests = BTreeMap::new();
        let mut service_us = BTreeMap::new();
        for (i, c) in self.requests.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                requests.insert(key(i), n);
            }
            if let Some(h) = self.service.get(i)
                && h.count.load(Ordering::Relaxed) > 0
            {
                service_us.insert(key(i), h.percentiles());
            }
        }
        Totals {
            total_requests: self.total.load(Ordering::Relaxed),
            requests,
            writes: self.writes.load(Ordering::Relaxed),
            changed_writes: self.changed_writes.load(Ordering::Relaxed),
            injected_errors: self.injected_errors.load(Ordering::Relaxed),
            handshakes: self.handshakes.load(Ordering::Relaxed),
            resumed_handshakes: self.resumed_handshakes.load(Ordering::Relaxed),
            service_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_two_percent() {
        let h = Histogram::new();
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        let p = h.percentiles();
        assert_eq!(p.count, 1000);
        assert!((p.p50 - 500.0).abs() / 500.0 < 0.02, "{p:?}");
        assert!((p.p99 - 990.0).abs() / 990.0 < 0.02, "{p:?}");
        assert!((p.max - 1000.0).abs() < f64::EPSILON);
    }

    #[test]
    fn keys_name_verb_and_resource() {
        assert_eq!(key(slot(Verb::ListMeta, Some(Res::ModuleTemplates))), "list-meta moduletemplates");
        assert_eq!(key(slot(Verb::ReplaceStatus, Some(Res::Kymas))), "replace-status kymas");
        assert_eq!(key(slot(Verb::Other, None)), "other other");
    }
}
