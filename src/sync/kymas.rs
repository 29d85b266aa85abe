//! What this replica knows of each Kyma it syncs, in one place: failures in a row (for
//! backoff), the fingerprint of the catalog last synced to its SKR, whether it is requeued for a
//! catalog change and not yet synced (the queue depth of its shard), and the access to its SKR
//! with that SKR's sync state. One record per Kyma, under one lock, so forgetting a Kyma
//! forgets all of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::catalog::{CatalogKind, Comparison};
use crate::error::Result;
use crate::metrics::{EvictionReason, SkrClientMetrics, SyncMetrics};
use crate::skr::{Recalled, SecretRef, SkrConnector, SkrEntry};

/// What is kept of one SKR across restarts and handovers (in a shard record,
/// [`crate::sync::recall`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// `uid/resourceVersion` of the access Secret the SKR was reached with.
    pub secret_version: String,
    /// The state.
    pub state: Recalled,
}

/// The records of the Kymas this replica syncs, keyed by Kyma name.
pub struct KymaRecords {
    inner: Mutex<Records>,
    sync_metrics: SyncMetrics,
    skr_metrics: SkrClientMetrics,
}

#[derive(Default)]
struct Records {
    by_kyma: HashMap<String, Record>,
    /// Requeued Kymas per shard (the shard's queue depth).
    pending_per_shard: HashMap<u32, usize>,
}

/// What is known of one Kyma.
#[derive(Default)]
struct Record {
    /// Failed syncs in a row.
    failures: u32,
    /// Fingerprint of the catalog last synced successfully.
    synced: Option<u64>,
    /// The shard of the Kyma while it is requeued for a catalog change and not yet synced.
    pending: Option<u32>,
    /// The access to its SKR, with the SKR's sync state.
    skr: Option<Arc<SkrEntry>>,
    /// What its last sync found, for the scrape-time gauges.
    findings: Option<Findings>,
    /// What the replica that held its SKR before kept of the SKR, until its first sync here.
    recalled: Option<Box<Kept>>,
}

impl Record {
    fn is_empty(&self) -> bool {
        self.failures == 0
            && self.synced.is_none()
            && self.pending.is_none()
            && self.skr.is_none()
            && self.findings.is_none()
            && self.recalled.is_none()
    }
}

/// What the last sync of one Kyma found, summed per shard by the scrape-time gauges
/// (`catalogsync_kyma_condition_contested`, `catalogsync_shadow_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Findings {
    /// The Kyma's shard.
    pub shard: u32,
    /// Another manager keeps the Kyma's `ModuleCatalog` condition.
    pub contested: bool,
    /// The last comparison of shadow mode.
    pub shadow: Option<ShadowCounts>,
}

/// How far an SKR is from the desired catalog: per kind (in [`CatalogKind::ALL`] order),
/// the objects missing, different and extra.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShadowCounts {
    /// Desired objects absent from the SKR.
    pub missing: [u64; 2],
    /// Desired objects the SKR holds with other content.
    pub different: [u64; 2],
    /// Managed copies that are not desired.
    pub extra: [u64; 2],
}

impl ShadowCounts {
    /// The counts of a comparison.
    pub fn of(comparison: &Comparison) -> Self {
        let mut out = Self::default();
        for (i, kind) in CatalogKind::ALL.into_iter().enumerate() {
            let c = comparison.of(kind);
            let n = |v: &Vec<String>| u64::try_from(v.len()).unwrap_or(u64::MAX);
            out.missing[i] = n(&c.missing);
            out.different[i] = n(&c.different);
            out.extra[i] = n(&c.extra);
        }
        out
    }

    /// Whether the SKR holds exactly the desired catalog.
    pub fn agrees(&self) -> bool {
        [self.missing, self.different, self.extra].iter().flatten().all(|n| *n == 0)
    }
}

/// The findings of one shard's Kymas, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardFindings {
    /// Kymas whose `ModuleCatalog` condition another manager keeps.
    pub contested: u64,
    /// SKRs in agreement (shadow mode).
    pub agree: u64,
    /// SKRs not in agreement (shadow mode).
    pub disagree: u64,
    /// The objects of the SKRs not in agreement, summed.
    pub objects: ShadowCounts,
}

/// The queue depth of one shard after a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Depth {
    /// Shard.
    pub shard: u32,
    /// Pending Kymas in it.
    pub depth: usize,
}

impl Records {
    fn record(&mut self, kyma: &str) -> &mut Record {
        self.by_kyma.entry(kyma.to_owned()).or_default()
    }

    /// Applies `change` to the record of `kyma` and drops the record if nothing is left in it.
    fn change<T>(&mut self, kyma: &str, change: impl FnOnce(&mut Record) -> T) -> T {
        let record = self.record(kyma);
        let out = change(record);
        if record.is_empty() {
            self.by_kyma.remove(kyma);
        }
        out
    }

    /// Takes `kyma` off its shard's queue, if it was on one; returns the shard's new depth.
    fn unqueue(&mut self, kyma: &str) -> Option<Depth> {
        let shard = self.by_kyma.get_mut(kyma)?.pending.take()?;
        let left = self.pending_per_shard.get(&shard).map_or(0, |n| n.saturating_sub(1));
        if left == 0 {
            self.pending_per_shard.remove(&shard);
        } else {
            self.pending_per_shard.insert(shard, left);
        }
        Some(Depth { shard, depth: left })
    }

    fn clean(&mut self, kyma: &str) {
        if self.by_kyma.get(kyma).is_some_and(Record::is_empty) {
            self.by_kyma.remove(kyma);
        }
    }

    fn cached_skrs(&self) -> usize {
        self.by_kyma.values().filter(|r| r.skr.is_some()).count()
    }
}

impl KymaRecords {
    /// No records yet; queue depths and SKR accesses are reported to these metrics.
    pub fn new(sync_metrics: SyncMetrics, skr_metrics: SkrClientMetrics) -> Self {
        Self { inner: Mutex::default(), sync_metrics, skr_metrics }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // Every critical section leaves the records consistent, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn report_depth(&self, depth: Option<Depth>) {
        if let Some(Depth { shard, depth }) = depth {
            self.sync_metrics.queue_depth(shard, depth);
        }
    }

    /// The fingerprint last synced to `kyma`'s SKR, if any.
    pub fn synced_fingerprint(&self, kyma: &str) -> Option<u64> {
        self.lock().by_kyma.get(kyma).and_then(|r| r.synced)
    }

    /// Marks `kyma` (of `shard`) as requeued for a catalog change; returns its shard's queue
    /// depth.
    pub fn mark_pending(&self, kyma: &str, shard: u32) -> Depth {
        let depth = {
            let mut records = self.lock();
            records.unqueue(kyma);
            records.record(kyma).pending = Some(shard);
            let depth = records.pending_per_shard.entry(shard).or_default();
            *depth += 1;
            Depth { shard, depth: *depth }
        };
        self.report_depth(Some(depth));
        depth
    }

    /// Records the end of a sync of `kyma`: `synced` is the fingerprint it established, or
    /// `None` when it failed. Takes the Kyma off its shard's queue; returns the new depth.
    pub fn finish(&self, kyma: &str, synced: Option<u64>) -> Option<Depth> {
        let depth = {
            let mut records = self.lock();
            let depth = records.unqueue(kyma);
            records.change(kyma, |r| {
                r.synced = synced;
                if synced.is_some() {
                    r.failures = 0;
                }
            });
            depth
        };
        self.report_depth(depth);
        depth
    }

    /// How many syncs of `kyma` failed in a row (not counting one that just ended).
    pub fn failures(&self, kyma: &str) -> u32 {
        self.lock().by_kyma.get(kyma).map_or(0, |r| r.failures)
    }

    /// Counts one more failed sync of `kyma`; returns how many failed in a row.
    pub fn record_failure(&self, kyma: &str) -> u32 {
        self.lock().change(kyma, |r| {
            r.failures = r.failures.saturating_add(1);
            r.failures
        })
    }

    /// Forgets the progress of `kyma` (failures, synced fingerprint, its place in the queue) and
    /// keeps its SKR access. Returns its shard's new queue depth.
    pub fn forget_progress(&self, kyma: &str) -> Option<Depth> {
        let depth = {
            let mut records = self.lock();
            let depth = records.unqueue(kyma);
            if let Some(r) = records.by_kyma.get_mut(kyma) {
                r.failures = 0;
                r.synced = None;
                r.findings = None;
            }
            records.clean(kyma);
            depth
        };
        self.report_depth(depth);
        depth
    }

    /// Forgets everything of `kyma`, its SKR access included (counted as an eviction for
    /// `reason`).
    pub fn forget(&self, kyma: &str, reason: EvictionReason) {
        self.forget_progress(kyma);
        self.evict_skr(kyma, reason);
    }

    /// The access to `kyma`'s SKR for the access Secret `secret`: the one kept for this Secret
    /// version, or a new one from `connector` (which then replaces any older one).
    ///
    /// # Errors
    /// Those of [`SkrConnector::connect`].
    pub async fn skr(&self, kyma: &str, secret: &SecretRef, connector: &SkrConnector) -> Result<Arc<SkrEntry>> {
        let version = &secret.version;
        let kept = self.lock().by_kyma.get(kyma).and_then(|r| r.skr.clone());
        if let Some(entry) = kept.filter(|e| e.secret_version == *version) {
            return Ok(entry);
        }
        let mut entry = connector.connect(secret).await?;
        let (entry, replaced, cached) = {
            let mut records = self.lock();
            let record = records.record(kyma);
            // Kept for this Secret version only: another version may name another cluster.
            if let Some(kept) = record.recalled.take().filter(|k| k.secret_version == *version) {
                entry.state.get_mut().recalled = Some(kept.state);
            }
            let entry = Arc::new(entry);
            let replaced = record.skr.replace(Arc::clone(&entry)).is_some();
            (entry, replaced, records.cached_skrs())
        };
        if replaced {
            self.skr_metrics.evicted(EvictionReason::SecretChanged);
        }
        self.skr_metrics.cached_clients(cached);
        Ok(entry)
    }

    /// Whether the next sync of `kyma`'s SKR may plan from memory alone
    /// ([`crate::skr::SkrState::trusts_memory`]); false while a sync of it holds its state.
    pub fn trusts_memory(&self, kyma: &str, trust_for: std::time::Duration) -> bool {
        let entry = self.lock().by_kyma.get(kyma).and_then(|r| r.skr.clone());
        entry.is_some_and(|e| e.state.try_lock().is_ok_and(|state| state.trusts_memory(trust_for)))
    }

    /// When `kyma`'s SKR is due to be listed again ([`crate::skr::SkrState::verify_in`]);
    /// `None` while a sync of it holds its state, or when it was never verified.
    pub fn verify_in(&self, kyma: &str, trust_for: std::time::Duration) -> Option<std::time::Duration> {
        let entry = self.lock().by_kyma.get(kyma).and_then(|r| r.skr.clone());
        entry.and_then(|e| e.state.try_lock().ok().and_then(|state| state.verify_in(trust_for)))
    }

    /// Takes what a previous holder kept of these Kymas' SKRs
    /// ([`crate::sync::recall::ShardMemory`]): the first sync of each SKR here uses it.
    pub fn recall(&self, kept: impl IntoIterator<Item = (String, Kept)>) {
        let mut records = self.lock();
        for (kyma, kept) in kept {
            let record = records.record(&kyma);
            if record.skr.is_none() {
                record.recalled = Some(Box::new(kept));
            }
            records.clean(&kyma);
        }
    }

    /// What to keep of the SKRs of `kymas` for the next holder: the state of those that no
    /// sync holds now ([`crate::skr::SkrState::remembered`]), and what the last holder kept
    /// of those not synced here yet (a shard taken and given up again at once, as when the
    /// replicas stop one after another, passes its record on rather than an empty one).
    pub fn remembered<'a>(&self, kymas: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, Kept> {
        let records = self.lock();
        kymas
            .into_iter()
            .filter_map(|kyma| {
                let record = records.by_kyma.get(kyma)?;
                let kept = match &record.skr {
                    Some(entry) => {
                        let state = entry.state.try_lock().ok()?.remembered()?;
                        Kept { secret_version: entry.secret_version.clone(), state }
                    }
                    None => (**record.recalled.as_ref()?).clone(),
                };
                Some((kyma.to_owned(), kept))
            })
            .collect()
    }

    /// Lets go of `kyma` when its shard was given up: its SKR access, what was recalled of
    /// it, and its findings, so the scrape-time gauges of this replica no longer count a
    /// Kyma another replica now syncs (they are added up across replicas).
    pub fn release(&self, kyma: &str) {
        if let Some(r) = self.lock().by_kyma.get_mut(kyma) {
            r.findings = None;
        }
        self.evict_skr(kyma, EvictionReason::Released);
    }

    /// Drops the access to `kyma`'s SKR (and anything recalled of it), counting why.
    pub fn evict_skr(&self, kyma: &str, reason: EvictionReason) {
        let (evicted, cached) = {
            let mut records = self.lock();
            if let Some(r) = records.by_kyma.get_mut(kyma) {
                r.recalled = None;
            }
            let evicted = records.by_kyma.get_mut(kyma).and_then(|r| r.skr.take()).is_some();
            records.clean(kyma);
            (evicted, records.cached_skrs())
        };
        if evicted {
            self.skr_metrics.evicted(reason);
            self.skr_metrics.cached_clients(cached);
        }
    }

    /// Records whether another manager keeps `kyma`'s condition; returns whether that is
    /// new (it was not contested before), so it is reported once per contest.
    pub fn set_contested(&self, kyma: &str, shard: u32, contested: bool) -> bool {
        self.lock().change(kyma, |r| {
            let findings = r.findings.get_or_insert(Findings { shard, ..Findings::default() });
            let new = contested && !findings.contested;
            findings.shard = shard;
            findings.contested = contested;
            new
        })
    }

    /// Records the last shadow comparison of `kyma`'s SKR; returns whether it differs from
    /// the one before.
    pub fn set_shadow(&self, kyma: &str, shard: u32, counts: ShadowCounts) -> bool {
        self.lock().change(kyma, |r| {
            let findings = r.findings.get_or_insert(Findings { shard, ..Findings::default() });
            findings.shard = shard;
            findings.shadow.replace(counts) != Some(counts)
        })
    }

    /// The findings of every shard with a Kyma that has some, summed per shard.
    pub fn findings(&self) -> BTreeMap<u32, ShardFindings> {
        let mut out: BTreeMap<u32, ShardFindings> = BTreeMap::new();
        for found in self.lock().by_kyma.values().filter_map(|r| r.findings) {
            let shard = out.entry(found.shard).or_default();
            shard.contested += u64::from(found.contested);
            if let Some(counts) = found.shadow {
                if counts.agrees() {
                    shard.agree += 1;
                } else {
                    shard.disagree += 1;
                }
                for i in 0..2 {
                    shard.objects.missing[i] += counts.missing[i];
                    shard.objects.different[i] += counts.different[i];
                    shard.objects.extra[i] += counts.extra[i];
                }
            }
        }
        out
    }

    /// Number of Kymas with a record.
    pub fn len(&self) -> usize {
        self.lock().by_kyma.len()
    }

    /// Whether no Kyma has a record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn records() -> KymaRecords {
        let metrics = Metrics::new().expect("metrics");
        KymaRecords::new(metrics.sync.clone(), metrics.skr.clone())
    }

    #[test]
    fn queue_depth_per_shard() {
        let book = records();
        assert_eq!(book.mark_pending("a", 1).depth, 1);
        assert_eq!(book.mark_pending("b", 1).depth, 2);
        assert_eq!(book.mark_pending("c", 2).depth, 1);
        // Requeued again, or moved to another shard: counted once, where it is now.
        assert_eq!(book.mark_pending("a", 1).depth, 2);
        assert_eq!(book.mark_pending("b", 2).depth, 2);
        assert_eq!(book.finish("a", Some(7)).map(|d| (d.shard, d.depth)), Some((1, 0)));
        assert_eq!(book.synced_fingerprint("a"), Some(7));
        assert_eq!(book.forget_progress("b").map(|d| (d.shard, d.depth)), Some((2, 1)));
        assert!(book.finish("a", None).is_none(), "not pending any more");
        assert_eq!(book.finish("c", None).map(|d| (d.shard, d.depth)), Some((2, 0)));
    }

    #[test]
    fn forget_drops_everything_kept_of_a_kyma() {
        let book = records();
        book.mark_pending("gone", 3);
        book.mark_pending("other", 3);
        assert_eq!(book.record_failure("gone"), 1);
        assert_eq!(book.record_failure("gone"), 2);
        book.finish("synced", Some(9));
        book.mark_pending("synced", 3);

        // Its shard's depth drops by one, and nothing of it is left.
        assert_eq!(book.forget_progress("gone").map(|d| (d.shard, d.depth)), Some((3, 2)));
        assert!(!book.lock().by_kyma.contains_key("gone"), "no record left");
        assert_eq!(book.synced_fingerprint("gone"), None);
        assert_eq!(book.record_failure("gone"), 1, "a Kyma re-created under the name starts afresh");

        // A synced, pending Kyma: fingerprint and pending entry go; forgetting twice is a no-op.
        assert_eq!(book.forget_progress("synced").map(|d| (d.shard, d.depth)), Some((3, 1)));
        assert_eq!(book.synced_fingerprint("synced"), None);
        assert!(book.forget_progress("synced").is_none(), "not pending any more");
        assert!(book.forget_progress("never-seen").is_none());
        assert_eq!(book.forget_progress("other").map(|d| (d.shard, d.depth)), Some((3, 0)));
        assert!(!book.lock().pending_per_shard.contains_key(&3), "no stuck depth");
        book.forget("gone", EvictionReason::Deleted);
        assert!(book.is_empty(), "every record is gone");
    }

    #[test]
    fn a_released_kyma_is_no_longer_counted_in_the_findings() {
        let book = records();
        book.set_contested("a", 1, true);
        book.set_shadow("a", 1, ShadowCounts::default());
        book.set_shadow("b", 1, ShadowCounts::default());
        assert_eq!(book.findings().get(&1).map(|f| (f.contested, f.agree)), Some((1, 2)));
        book.release("a");
        assert_eq!(book.findings().get(&1).map(|f| (f.contested, f.agree)), Some((0, 1)));
        book.release("b");
        assert!(book.findings().is_empty(), "{:?}", book.findings());
    }

    #[test]
    fn findings_are_summed_per_shard_and_a_contest_is_new_once() {
        let book = records();
        assert!(book.set_contested("a", 1, true), "newly contested");
        assert!(!book.set_contested("a", 1, true), "still contested: not new");
        book.set_contested("b", 1, false);
        let behind = ShadowCounts { missing: [1, 0], different: [0, 2], extra: [0, 1] };
        book.set_shadow("b", 1, behind);
        book.set_shadow("c", 2, ShadowCounts::default());
        let found = book.findings();
        assert_eq!(found[&1], ShardFindings { contested: 1, agree: 0, disagree: 1, objects: behind });
        assert_eq!(found[&2], ShardFindings { agree: 1, ..ShardFindings::default() });
        book.forget("b", EvictionReason::Released);
        assert_eq!(book.findings()[&1].disagree, 0, "a released Kyma leaves the sums");
        assert!(!book.set_contested("a", 1, false), "no longer contested");
        assert!(book.set_contested("a", 1, true), "contested anew");
    }

    #[test]
    fn a_record_not_synced_here_yet_is_passed_on_and_a_release_drops_it() {
        let book = records();
        let kept = |secret: &str| Kept {
            secret_version: secret.to_owned(),
            state: crate::skr::Recalled { kinds: [(CatalogKind::ModuleTemplate, 7)].into() },
        };
        book.recall([("a".to_owned(), kept("s/1")), ("b".to_owned(), kept("s/2"))]);
        // Progress comes and goes without touching it.
        book.mark_pending("a", 1);
        book.forget_progress("a");
        let passed_on = book.remembered(["a", "b", "never-seen"]);
        assert_eq!(passed_on.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(passed_on["b"], kept("s/2"));
        book.evict_skr("a", EvictionReason::Released);
        book.forget("b", EvictionReason::Released);
        assert!(book.remembered(["a", "b"]).is_empty());
        assert!(book.is_empty(), "nothing left behind");
    }

    #[test]
    fn a_failed_sync_keeps_the_failure_count_and_a_success_clears_it() {
        let book = records();
        book.record_failure("k");
        book.finish("k", None);
        assert_eq!(book.record_failure("k"), 2);
        book.finish("k", Some(1));
        assert_eq!(book.record_failure("k"), 1);
    }
}
