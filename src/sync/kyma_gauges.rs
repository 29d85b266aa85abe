//! Scrape-time gauges of what the last syncs of this replica's Kymas found
//! ([`KymaRecords::findings`]): Kymas whose `ModuleCatalog` condition another field manager
//! keeps, and in shadow mode how far each shard's SKRs are from the desired catalog. A Kyma
//! leaves the sums when this replica forgets it (deleted, released, its shard handed over).

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts};

use crate::catalog::CatalogKind;
use crate::sync::kymas::KymaRecords;

/// Registers on `registry` `catalogsync_kyma_condition_contested` and the
/// `catalogsync_shadow_*` gauges, computed at each scrape from the records of this replica's
/// Kymas.
///
/// # Errors
/// Fails when called twice on one registry.
pub fn register(registry: &prometheus::Registry, kymas: Arc<KymaRecords>) -> prometheus::Result<()> {
    registry.register(Box::new(KymaCollector::new(kymas)?))
}

const CONTESTED: (&str, &str) = (
    "catalogsync_kyma_condition_contested",
    "Kymas whose ModuleCatalog condition another field manager keeps applying; catalogsync leaves it to that manager.",
);
const SHADOW_SKRS: (&str, &str) = (
    "catalogsync_shadow_skrs",
    "Shadow mode: SKRs whose last comparison agreed or disagreed with the desired catalog.",
);
const SHADOW_OBJECTS: (&str, &str) = (
    "catalogsync_shadow_objects",
    "Shadow mode: catalog objects missing from, different in or extra in the SKRs, at their last comparison.",
);

/// The gauges of one scrape.
struct Gauges {
    contested: IntGaugeVec,
    skrs: IntGaugeVec,
    objects: IntGaugeVec,
}

impl Gauges {
    fn new() -> prometheus::Result<Self> {
        Ok(Self {
            contested: IntGaugeVec::new(Opts::new(CONTESTED.0, CONTESTED.1), &["shard"])?,
            skrs: IntGaugeVec::new(Opts::new(SHADOW_SKRS.0, SHADOW_SKRS.1), &["shard", "agreement"])?,
            objects: IntGaugeVec::new(Opts::new(SHADOW_OBJECTS.0, SHADOW_OBJECTS.1), &["shard", "kind", "difference"])?,
        })
    }

    fn parts(&self) -> [&IntGaugeVec; 3] {
        [&self.contested, &self.skrs, &self.objects]
    }
}

/// `catalogsync_kyma_condition_contested{shard}`, `catalogsync_shadow_skrs{shard,agreement}`
/// and `catalogsync_shadow_objects{shard,kind,difference}`.
pub struct KymaCollector {
    kymas: Arc<KymaRecords>,
    descs: Vec<Desc>,
}

impl KymaCollector {
    /// A collector over the records of this replica's Kymas.
    ///
    /// # Errors
    /// None in practice: the metric names and help texts are valid.
    pub fn new(kymas: Arc<KymaRecords>) -> prometheus::Result<Self> {
        let descs = Gauges::new()?.parts().iter().flat_map(|g| g.desc()).cloned().collect();
        Ok(Self { kymas, descs })
    }

    fn families(&self) -> prometheus::Result<Vec<MetricFamily>> {
        let gauges = Gauges::new()?;
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for (shard, found) in self.kymas.findings() {
            let shard = shard.to_string();
            gauges.contested.with_label_values(&[shard.as_str()]).set(int(found.contested));
            if found.agree + found.disagree == 0 {
                continue;
            }
            gauges.skrs.with_label_values(&[shard.as_str(), "agree"]).set(int(found.agree));
            gauges.skrs.with_label_values(&[shard.as_str(), "disagree"]).set(int(found.disagree));
            for (i, kind) in CatalogKind::ALL.into_iter().enumerate() {
                let o = &found.objects;
                for (difference, n) in [("missing", o.missing[i]), ("different", o.different[i]), ("extra", o.extra[i])]
                {
                    gauges.objects.with_label_values(&[shard.as_str(), kind.as_str(), difference]).set(int(n));
                }
            }
        }
        Ok(gauges.parts().iter().flat_map(|g| g.collect()).collect())
    }
}

impl Collector for KymaCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.families().unwrap_or_else(|error| {
            tracing::warn!(error = &error as &dyn std::error::Error, "Failed to compute the Kyma gauges");
            Vec::new()
        })
    }
}
