//! The shared state of the simulator: the SKR registry (one store per bearer token, created
//! with the seed content on first sight), the faults, the counters, and the admin queries
//! over them (stats, marks, objects).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use super::stats::Stats;
use super::store::{Interner, Res, SeedObject, Skr, lock};
use super::{Faults, MARK_ANNOTATION, Marks, SimStats, SkrCounts};
use crate::stats::unix_ms;

/// Faults in effect, in the form the request path needs.
#[derive(Debug, Default)]
pub(super) struct FaultState {
    pub latency: Duration,
    pub jitter: Duration,
    pub error_rate: f64,
    pub down: HashSet<String>,
}

impl From<&Faults> for FaultState {
    fn from(f: &Faults) -> Self {
        let ms = |v: f64| Duration::from_secs_f64((v.max(0.0)) / 1000.0);
        Self {
            latency: ms(f.latency_ms),
            jitter: ms(f.jitter_ms),
            error_rate: f.error_rate.clamp(0.0, 1.0),
            down: f.down.iter().cloned().collect(),
        }
    }
}

/// One simulated SKR, shared between its requests.
pub(super) type SharedSkr = Arc<Mutex<Skr>>;

/// Everything the SKR server and the admin server share.
pub(super) struct Sim {
    skrs: Mutex<HashMap<Arc<str>, SharedSkr>>,
    seed: Vec<SeedObject>,
    /// Content interner of every SKR.
    pub interner: Interner,
    /// Request counters.
    pub stats: Stats,
    faults: RwLock<Arc<FaultState>>,
    rng_seed: u64,
    rng_counter: AtomicU64,
}

/// splitmix64: a fast, well-mixed hash of a counter, for deterministic fault rolls.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Sim {
    pub fn new(seed: Vec<SeedObject>, interner: Interner, faults: &Faults, rng_seed: u64) -> Self {
        Self {
            skrs: Mutex::default(),
            seed,
            interner,
            stats: Stats::default(),
            faults: RwLock::new(Arc::new(FaultState::from(faults))),
            rng_seed,
            rng_counter: AtomicU64::new(0),
        }
    }

    /// The SKR of `token`, created with the seed content when new.
    pub fn skr(&self, token: &str) -> SharedSkr {
        let mut skrs = lock(&self.skrs);
        if let Some(skr) = skrs.get(token) {
            return skr.clone();
        }
        let now = unix_ms();
        let mut skr = Skr::default();
        for object in &self.seed {
            skr.seed(object, now, &self.interner);
        }
        let skr = Arc::new(Mutex::new(skr));
        skrs.insert(Arc::from(token), skr.clone());
        skr
    }

    /// The SKR of `token`, if it exists.
    pub fn find(&self, token: &str) -> Option<SharedSkr> {
        lock(&self.skrs).get(token).cloned()
    }

    fn all(&self) -> Vec<(Arc<str>, SharedSkr)> {
        lock(&self.skrs).iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    pub fn faults(&self) -> Arc<FaultState> {
        self.faults.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn set_faults(&self, faults: &Faults) {
        *self.faults.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(FaultState::from(faults));
    }

    /// A uniform number in `[0, 1)`, deterministic in the sequence of calls for a given seed.
    pub fn random(&self) -> f64 {
        let n = self.rng_counter.fetch_add(1, Ordering::Relaxed);
        let x = (splitmix64(self.rng_seed ^ splitmix64(n)) >> 11) as f64;
        x / (1u64 << 53) as f64
    }

    pub fn stats(&self, per_skr: bool) -> SimStats {
        let totals = self.stats.totals();
        let all = self.all();
        let per_skr = per_skr.then(|| {
            all.iter().map(|(token, skr)| (token.to_string(), lock(skr).counts.clone())).collect::<BTreeMap<_, _>>()
        });
        SimStats {
            skrs: all.len(),
            total_requests: totals.total_requests,
            requests: totals.requests,
            writes: totals.writes,
            changed_writes: totals.changed_writes,
            injected_errors: totals.injected_errors,
            handshakes: totals.handshakes,
            resumed_handshakes: totals.resumed_handshakes,
            service_us: totals.service_us,
            per_skr,
        }
    }

    /// Zeroes every counter, global and per SKR; the stored objects stay.
    pub fn reset(&self) {
        self.stats.reset();
        for (_, skr) in self.all() {
            lock(&skr).counts = SkrCounts::default();
        }
    }

    /// Which SKRs hold `name` of `res` (in any namespace) with the mark annotation equal to
    /// `value` (or at all), and since when.
    pub fn marks(&self, res: Res, name: &str, value: Option<&str>) -> Marks {
        let all = self.all();
        let mut first_held_unix_ms = Vec::new();
        for (_, skr) in &all {
            let skr = lock(skr);
            let held = skr
                .named(res, name)
                .filter_map(|e| match value {
                    None => Some(e.created_ms),
                    Some(v) => (e.annotation(MARK_ANNOTATION) == Some(v)).then_some(e.mark_since_ms),
                })
                .min();
            first_held_unix_ms.extend(held);
        }
        first_held_unix_ms.sort_unstable();
        Marks { skrs: all.len(), holding: first_held_unix_ms.len(), first_held_unix_ms }
    }

    /// Sorted names of the objects of `res` the SKR of `token` holds; `None` for an unknown
    /// token.
    pub fn objects(&self, token: &str, res: Res) -> Option<Vec<String>> {
        let skr = self.find(token)?;
        let skr = lock(&skr);
        let mut names: Vec<String> = skr.names(res).map(|(_, n)| n.to_owned()).collect();
        names.sort();
        Some(names)
    }
}
