//! Measurement primitives shared by the simulator, the baseline and the harness: the one
//! [`Percentiles`] shape they serve over HTTP and the report uses, the nearest-rank rule
//! behind it, and wall-clock timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Percentiles of a set of samples (all zero when empty). The unit is the one of the field
/// holding it: seconds for the baseline's pass durations, microseconds for the simulator's
/// service times.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// The nearest-rank percentiles of `values`, in any order.
    pub fn of(values: &[f64]) -> Percentiles {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted.get(nearest_rank(sorted.len(), q)).copied().unwrap_or_default();
        Percentiles {
            count: sorted.len() as u64,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: sorted.last().copied().unwrap_or_default(),
        }
    }
}

/// The index of quantile `q` among `n` sorted values by the nearest-rank rule (0 when `n` is
/// 0).
pub fn nearest_rank(n: usize, q: f64) -> usize {
    (((n as f64) * q).ceil() as usize).clamp(1, n.max(1)) - 1
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let p = Percentiles::of(&(1..=100).rev().map(|ms| f64::from(ms) / 1000.0).collect::<Vec<_>>());
        assert_eq!(p.count, 100);
        assert!((p.p50 - 0.050).abs() < 1e-9 && (p.p99 - 0.099).abs() < 1e-9 && (p.max - 0.1).abs() < 1e-9, "{p:?}");
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn the_serialized_shape_is_the_one_the_harness_parses() {
        let json = serde_json::to_value(Percentiles { count: 1, p50: 0.5, p90: 0.9, p99: 0.99, max: 1.0 }).unwrap();
        assert_eq!(json, serde_json::json!({"count": 1, "p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}));
    }
}
