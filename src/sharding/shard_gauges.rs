//! Scrape-time gauges of the shard agent's state: computed from the view the agent publishes
//! ([`ShardsDebug`], also served at `/debug/shards`) whenever `/metrics` is scraped, so a
//! shard's series is there exactly while this replica holds it.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, IntGauge, IntGaugeVec, Opts};
use tokio::sync::watch;

use crate::sharding::agent::{ShardState, ShardsDebug};

/// Registers the gauges of the view the shard agent publishes on `registry`
/// (`catalogsync_shard_owned_clusters`, `catalogsync_shards_held`,
/// `catalogsync_shard_drain_oldest_seconds`).
///
/// # Errors
/// Fails when called twice on one registry.
pub fn register(registry: &prometheus::Registry, view: watch::Receiver<ShardsDebug>) -> prometheus::Result<()> {
    registry.register(Box::new(ShardCollector::new(view)?))
}

const OWNED: (&str, &str) = ("catalogsync_shard_owned_clusters", "SKRs (Kymas) in each shard this replica holds.");
const HELD: (&str, &str) = ("catalogsync_shards_held", "Shards this replica holds and works on.");
const DRAIN_OLDEST: (&str, &str) = (
    "catalogsync_shard_drain_oldest_seconds",
    "How long the longest-draining shard of this replica has been draining, in seconds (0 when none drains).",
);

/// The gauges of one scrape.
struct Gauges {
    owned: IntGaugeVec,
    held: IntGauge,
    drain_oldest: Gauge,
}

impl Gauges {
    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            owned: IntGaugeVec::new(Opts::new(OWNED.0, OWNED.1), &["shard"])?,
            held: IntGauge::new(HELD.0, HELD.1)?,
            drain_oldest: Gauge::new(DRAIN_OLDEST.0, DRAIN_OLDEST.1)?,
        })
    }

    fn descs(&self) -> Vec<Desc> {
        [self.owned.desc(), self.held.desc(), self.drain_oldest.desc()].into_iter().flatten().cloned().collect()
    }

    fn families(&self) -> Vec<MetricFamily> {
        [self.owned.collect(), self.held.collect(), self.drain_oldest.collect()].into_iter().flatten().collect()
    }
}

/// `catalogsync_shard_owned_clusters{shard}`, `catalogsync_shards_held` and
/// `catalogsync_shard_drain_oldest_seconds`, from the shard agent's published view.
pub struct ShardCollector {
    view: watch::Receiver<ShardsDebug>,
    descs: Vec<Desc>,
}

impl ShardCollector {
    /// A collector over the view the shard agent publishes.
    ///
    /// # Errors
    /// None in practice: the metric names and help texts are valid.
    pub fn new(view: watch::Receiver<ShardsDebug>) -> prometheus::Result<Self> {
        Ok(Self { view, descs: Gauges::new()?.descs() })
    }

    fn gauges(&self) -> prometheus::Result<Gauges> {
        let gauges = Gauges::new()?;
        let view = self.view.borrow();
        let now = tokio::time::Instant::now();
        let mut held = 0;
        let mut oldest_drain = 0.0_f64;
        for row in &view.rows {
            match row.state {
                ShardState::Active => {
                    held += 1;
                    let clusters = i64::try_from(row.clusters).unwrap_or(i64::MAX);
                    gauges.owned.with_label_values(&[row.shard.to_string().as_str()]).set(clusters);
                }
                ShardState::Draining => {
                    let since = row.draining_since.map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64());
                    oldest_drain = oldest_drain.max(since);
                }
                ShardState::Idle | ShardState::Pending => {}
            }
        }
        gauges.held.set(held);
        gauges.drain_oldest.set(oldest_drain);
        Ok(gauges)
    }
}

impl Collector for ShardCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        match self.gauges() {
            Ok(gauges) => gauges.families(),
            Err(error) => {
                tracing::warn!(error = &error as &dyn std::error::Error, "Failed to compute the shard gauges");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::sharding::agent::ShardRow;

    fn families(registry: &prometheus::Registry) -> BTreeMap<String, MetricFamily> {
        registry.gather().into_iter().map(|f| (f.name().to_owned(), f)).collect()
    }

    /// The label sets (`key=value`) of `name`'s series.
    fn series(registry: &prometheus::Registry, name: &str) -> BTreeSet<Vec<String>> {
        families(registry).get(name).map_or_else(BTreeSet::new, |f| {
            f.get_metric()
                .iter()
                .map(|m| m.get_label().iter().map(|l| format!("{}={}", l.name(), l.value())).collect())
                .collect()
        })
    }

    fn row(shard: u32, state: ShardState, clusters: usize) -> ShardRow {
        ShardRow {
            shard,
            holder: String::new(),
            desired: String::new(),
            state,
            draining_since: None,
            in_flight: 0,
            clusters,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shard_gauges_are_read_from_the_published_view_at_scrape_time() {
        let m = prometheus::Registry::new();
        let (tx, rx) = watch::channel(ShardsDebug::default());
        register(&m, rx).expect("collector registers");
        let gauge = |name: &str| families(&m).get(name).map(|f| f.get_metric()[0].get_gauge().get_value());
        assert_eq!(gauge("catalogsync_shards_held"), Some(0.0));
        assert_eq!(gauge("catalogsync_shard_drain_oldest_seconds"), Some(0.0));
        assert!(series(&m, "catalogsync_shard_owned_clusters").is_empty());

        let mut draining = row(2, ShardState::Draining, 4);
        draining.draining_since = Some(tokio::time::Instant::now());
        tx.send_replace(ShardsDebug {
            rows: vec![
                row(0, ShardState::Active, 7),
                row(1, ShardState::Idle, 3),
                draining,
                row(3, ShardState::Active, 0),
            ],
            ..ShardsDebug::default()
        });
        tokio::time::advance(std::time::Duration::from_secs(4)).await;
        assert_eq!(gauge("catalogsync_shards_held"), Some(2.0));
        assert_eq!(gauge("catalogsync_shard_drain_oldest_seconds"), Some(4.0));
        let owned = &families(&m)["catalogsync_shard_owned_clusters"];
        let by_shard: BTreeMap<String, f64> = owned
            .get_metric()
            .iter()
            .map(|s| (s.get_label()[0].value().to_owned(), s.get_gauge().get_value()))
            .collect();
        assert_eq!(by_shard, BTreeMap::from([("0".to_owned(), 7.0), ("3".to_owned(), 0.0)]));

        // Shard 0 moved away: its series is gone at the next scrape.
        tx.send_replace(ShardsDebug { rows: vec![row(3, ShardState::Active, 1)], ..ShardsDebug::default() });
        assert_eq!(series(&m, "catalogsync_shard_owned_clusters"), BTreeSet::from([vec!["shard=3".to_owned()]]));
        assert_eq!(gauge("catalogsync_shard_drain_oldest_seconds"), Some(0.0));
    }
}
