//! Scrape-time gauges of the coordinator: whether this replica leads, and the SKRs without an
//! owner, from what the coordinator last published ([`CoordinatorView`]) and the Kymas in the
//! cache now, whenever `/metrics` is scraped. A replica that does not coordinate publishes no
//! unowned shard, so it reports 0.

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, IntGauge};
use tokio::sync::watch;

use crate::api::Kyma;
use crate::sharding::ShardView;
use crate::sharding::coordinator::CoordinatorView;

/// Registers on `registry` the gauges computed at each scrape from what the coordinator
/// publishes and the Kymas of `kymas` (`catalogsync_is_coordinator`,
/// `catalogsync_unowned_clusters`, `catalogsync_unowned_oldest_seconds`).
///
/// # Errors
/// Fails when called twice on one registry.
pub fn register(
    registry: &prometheus::Registry,
    coordinator: watch::Receiver<CoordinatorView>,
    kymas: Store<Kyma>,
    view: ShardView,
) -> prometheus::Result<()> {
    registry.register(Box::new(CoordinatorCollector::new(coordinator, kymas, view)?))
}

const LEADING: (&str, &str) = ("catalogsync_is_coordinator", "1 when this replica is the coordinator, else 0.");
const CLUSTERS: (&str, &str) =
    ("catalogsync_unowned_clusters", "SKRs whose shard has no live holder (coordinator only; 0 elsewhere).");
const OLDEST: (&str, &str) = (
    "catalogsync_unowned_oldest_seconds",
    "Age of the oldest shard without a live holder, in seconds (coordinator only; 0 elsewhere).",
);

/// `catalogsync_is_coordinator`, `catalogsync_unowned_clusters` and
/// `catalogsync_unowned_oldest_seconds`.
pub struct CoordinatorCollector {
    coordinator: watch::Receiver<CoordinatorView>,
    kymas: Store<Kyma>,
    view: ShardView,
    descs: Vec<Desc>,
}

fn gauges() -> prometheus::Result<(IntGauge, IntGauge, Gauge)> {
    Ok((IntGauge::new(LEADING.0, LEADING.1)?, IntGauge::new(CLUSTERS.0, CLUSTERS.1)?, Gauge::new(OLDEST.0, OLDEST.1)?))
}

impl CoordinatorCollector {
    /// A collector over what the coordinator publishes, counting the Kymas of `kymas` by their
    /// shard in `view`.
    ///
    /// # Errors
    /// None in practice: the metric names and help texts are valid.
    pub fn new(
        coordinator: watch::Receiver<CoordinatorView>,
        kymas: Store<Kyma>,
        view: ShardView,
    ) -> prometheus::Result<Self> {
        let (leading, clusters, oldest) = gauges()?;
        let descs = [leading.desc(), clusters.desc(), oldest.desc()].into_iter().flatten().cloned().collect();
        Ok(Self { coordinator, kymas, view, descs })
    }

    fn families(&self) -> prometheus::Result<Vec<MetricFamily>> {
        let (leading, clusters, oldest) = gauges()?;
        let published = self.coordinator.borrow();
        leading.set(i64::from(published.leading));
        let unowned = &published.unowned_since;
        if !unowned.is_empty() {
            let n = self
                .kymas
                .state()
                .iter()
                .filter(|k| {
                    let shard = self.view.shard_of(&k.namespace().unwrap_or_default(), &k.name_any());
                    unowned.contains_key(&shard)
                })
                .count();
            clusters.set(i64::try_from(n).unwrap_or(i64::MAX));
            let now = tokio::time::Instant::now();
            let age = unowned.values().map(|t| now.saturating_duration_since(*t).as_secs_f64()).fold(0.0, f64::max);
            oldest.set(age);
        }
        Ok([leading.collect(), clusters.collect(), oldest.collect()].into_iter().flatten().collect())
    }
}

impl Collector for CoordinatorCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        match self.families() {
            Ok(families) => families,
            Err(error) => {
                tracing::warn!(error = &error as &dyn std::error::Error, "Failed to compute the coordinator gauges");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;

    fn value(families: &[MetricFamily], name: &str) -> f64 {
        let family = families.iter().find(|f| f.name() == name).expect("family");
        let metric = &family.get_metric()[0];
        metric.get_gauge().get_value()
    }

    #[tokio::test(start_paused = true)]
    async fn leadership_and_the_kymas_of_unowned_shards_are_read_at_scrape_time() {
        let view = ShardView::new(4);
        let (kymas, mut writer) = reflector::store::<Kyma>();
        writer.apply_watcher_event(&Event::Init);
        let names: Vec<String> = (0..20).map(|i| format!("kyma-{i}")).collect();
        for name in &names {
            let mut k = Kyma::new(name, Default::default());
            k.metadata.namespace = Some("kcp-system".into());
            writer.apply_watcher_event(&Event::InitApply(k));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let (tx, rx) = watch::channel(CoordinatorView::default());
        let collector = CoordinatorCollector::new(rx, kymas, view.clone()).expect("collector");

        let families = collector.collect();
        assert_eq!(value(&families, LEADING.0), 0.0, "not leading");
        assert_eq!(value(&families, CLUSTERS.0), 0.0, "nothing unowned");
        assert_eq!(value(&families, OLDEST.0), 0.0);

        let since = tokio::time::Instant::now();
        tx.send_replace(CoordinatorView { leading: true, unowned_since: [(1, since)].into() });
        tokio::time::advance(Duration::from_secs(3)).await;
        let in_shard_1 = names.iter().filter(|n| view.shard_of("kcp-system", n) == 1).count();
        let families = collector.collect();
        assert_eq!(value(&families, LEADING.0), 1.0);
        assert_eq!(value(&families, CLUSTERS.0), in_shard_1 as f64);
        assert_eq!(value(&families, OLDEST.0), 3.0);

        // The coordinator steps down: nothing is unowned in its view any more.
        tx.send_replace(CoordinatorView::default());
        let families = collector.collect();
        let values = [LEADING.0, CLUSTERS.0, OLDEST.0].map(|name| value(&families, name));
        assert_eq!(values, [0.0, 0.0, 0.0]);
    }
}
