//! What a replica keeps of its SKRs across restarts and handovers: when it gives up a shard
//! (a drain, or shutdown) it writes, for each SKR of the shard whose last sync succeeded, a
//! digest of its memory of the SKR ([`crate::catalog::KindMemory::digest`]) into a ConfigMap
//! of the shard in its own namespace; the replica that claims the shard next reads it, and
//! its first sync of each SKR verifies the SKR with metadata-only lists instead of full ones
//! wherever every copy still has the resourceVersion the record names
//! ([`crate::catalog::KindMemory::recall`]).
//!
//! A resourceVersion names one content of one object, so a record can be stale but never
//! wrong: a copy written since has another resourceVersion, and its kind is listed in full as
//! in any cold sync. A record is kept per access-Secret version (another version may name
//! another cluster). A record that is missing, unreadable or of another format is ignored:
//! the SKRs are then verified with full lists. Nothing of a Secret but its UID and
//! resourceVersion is written.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::api::{KCP_FIELD_MANAGER, Kyma};
use crate::catalog::CatalogKind;
use crate::skr::Recalled;
use crate::sync::kymas::{Kept, KymaRecords};

/// The key of the record in a shard's ConfigMap.
pub const MEMORY_KEY: &str = "skrs.json";

/// The format of the record; a record of another format is ignored.
const FORMAT: u32 = 1;

/// Bytes a record may take; a ConfigMap holds at most 1 MiB. At about 150 bytes per SKR, a
/// shard of up to about 6,000 SKRs fits; the SKRs beyond are left out (verified in full).
const MAX_RECORD_BYTES: usize = 900 * 1024;

/// The name of the ConfigMap of `shard`.
pub fn config_map_name(shard: u32) -> String {
    format!("catalogsync-shard-{shard}-memory")
}

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    format: u32,
    /// Per Kyma name.
    skrs: BTreeMap<String, StoredSkr>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredSkr {
    secret: String,
    /// Per kind name: the memory digest as hex.
    kinds: BTreeMap<String, String>,
}

/// Encodes `kept` as a record: the Kymas in name order, as many as fit in
/// [`MAX_RECORD_BYTES`]. Returns the record and how many were left out.
fn encode(kept: &BTreeMap<String, Kept>) -> (String, usize) {
    let mut skrs = BTreeMap::new();
    let mut size = 64;
    let mut left_out = 0;
    for (kyma, kept) in kept {
        let stored = StoredSkr {
            secret: kept.secret_version.clone(),
            kinds: kept.state.kinds.iter().map(|(kind, d)| (kind.as_str().to_owned(), format!("{d:032x}"))).collect(),
        };
        let entry = kyma.len() + serde_json::to_string(&stored).map_or(0, |s| s.len()) + 8;
        if size + entry > MAX_RECORD_BYTES {
            left_out += 1;
            continue;
        }
        size += entry;
        skrs.insert(kyma.clone(), stored);
    }
    let text = serde_json::to_string(&Record { format: FORMAT, skrs }).unwrap_or_default();
    (text, left_out)
}

/// Decodes a record; entries that do not parse are skipped.
fn decode(text: &str) -> Result<BTreeMap<String, Kept>, String> {
    let record: Record = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if record.format != FORMAT {
        return Err(format!("format {} is not {FORMAT}", record.format));
    }
    let kind = |name: &str| CatalogKind::ALL.into_iter().find(|k| k.as_str() == name);
    Ok(record
        .skrs
        .into_iter()
        .filter_map(|(kyma, stored)| {
            let kinds = stored
                .kinds
                .iter()
                .map(|(name, hex)| Some((kind(name)?, u128::from_str_radix(hex, 16).ok()?)))
                .collect::<Option<BTreeMap<_, _>>>()?;
            Some((kyma, Kept { secret_version: stored.secret, state: Recalled { kinds } }))
        })
        .collect())
}

/// Reads and writes the shards' records in the KCP.
#[derive(Clone)]
pub struct ShardMemory {
    api: Api<ConfigMap>,
    timeout: Duration,
    records: Arc<KymaRecords>,
}

impl ShardMemory {
    /// Records kept in ConfigMaps of `api`'s namespace, each request bounded by `timeout`, of
    /// the SKR states in `records`.
    pub fn new(api: Api<ConfigMap>, timeout: Duration, records: Arc<KymaRecords>) -> Self {
        Self { api, timeout, records }
    }

    /// Keeps the state of the SKRs of `kymas`, the Kymas of `shard`, for the next holder of the
    /// shard. Called when no sync of the shard runs any more, before the shard is released.
    ///
    /// What this replica knows of an SKR replaces the stored entry; a stored entry of an SKR
    /// it knows nothing of (a shard taken before the Kyma cache held its Kymas, or given up
    /// before their first sync) is carried on, unless the Kyma is gone (`complete`: the Kyma
    /// cache finished its first list, so a Kyma missing from `kymas` was deleted). A record
    /// that would not change is not written again.
    pub async fn keep(&self, shard: u32, kymas: &[ObjectRef<Kyma>], complete: bool) {
        let kept = self.records.remembered(kymas.iter().map(|k| k.name.as_str()));
        let stored = self.read(shard).await;
        let ours: HashSet<&str> = kymas.iter().map(|k| k.name.as_str()).collect();
        let Some(next) = carried_on(stored, kept, |kyma| !complete || ours.contains(kyma)) else {
            debug!(shard, "The shard's SKR record is unchanged");
            return;
        };
        self.save(shard, &next).await;
    }

    /// Hands what the last holder of `shard` kept of the SKRs of `kymas` (the shard's Kymas)
    /// to their first syncs here. Called when the shard is taken, before its Kymas are
    /// requeued.
    pub async fn recall(&self, shard: u32, kymas: &[ObjectRef<Kyma>]) {
        let mut kept = self.load(shard).await;
        let ours: HashSet<&str> = kymas.iter().map(|k| k.name.as_str()).collect();
        kept.retain(|kyma, _| ours.contains(kyma.as_str()));
        self.records.recall(kept);
    }

    /// Writes the record of `shard`. A failure is logged: the next holder then verifies the
    /// shard's SKRs in full.
    async fn save(&self, shard: u32, kept: &BTreeMap<String, Kept>) {
        let (text, left_out) = encode(kept);
        if left_out > 0 {
            warn!(shard, left_out, "Shard record full; the SKRs left out will be verified in full");
        }
        let name = config_map_name(shard);
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": { "app.kubernetes.io/managed-by": "catalogsync", "app.kubernetes.io/component": "shard-memory" },
            },
            "data": { MEMORY_KEY: text },
        });
        let (params, patch) = (PatchParams::apply(KCP_FIELD_MANAGER).force(), Patch::Apply(&body));
        let apply = self.api.patch(&name, &params, &patch);
        match crate::kcp::bounded(self.timeout, apply).await {
            Ok(_) => debug!(shard, skrs = kept.len() - left_out, "Kept the shard's SKR record"),
            Err(error) => {
                warn!(shard, error = &error as &dyn std::error::Error, "Failed to keep the shard's SKR record")
            }
        }
    }

    /// Reads the record of `shard`: what was kept per Kyma, empty when there is none or it
    /// cannot be read (logged).
    async fn load(&self, shard: u32) -> BTreeMap<String, Kept> {
        match self.read(shard).await {
            Stored::Record(kept) => {
                info!(shard, skrs = kept.len(), "Read the shard's SKR record");
                kept
            }
            Stored::None | Stored::Unknown => BTreeMap::new(),
        }
    }

    /// The record of `shard` as stored; read and decode failures are logged.
    async fn read(&self, shard: u32) -> Stored {
        let name = config_map_name(shard);
        let found = match crate::kcp::bounded(self.timeout, self.api.get_opt(&name)).await {
            Ok(found) => found,
            Err(error) => {
                warn!(shard, error = &error as &dyn std::error::Error, "Failed to read the shard's SKR record");
                return Stored::Unknown;
            }
        };
        let Some(text) = found.as_ref().and_then(|cm| cm.data.as_ref()).and_then(|d| d.get(MEMORY_KEY)) else {
            return Stored::None;
        };
        match decode(text) {
            Ok(kept) => Stored::Record(kept),
            Err(error) => {
                warn!(shard, %error, "Ignored an unreadable shard SKR record; its SKRs will be verified in full");
                Stored::None
            }
        }
    }
}

/// A shard's record as read from the KCP.
#[derive(Debug)]
enum Stored {
    /// No record, or one that cannot be used.
    None,
    /// The record could not be read.
    Unknown,
    /// What was kept per Kyma.
    Record(BTreeMap<String, Kept>),
}

/// The record to write when what this replica knows of a shard's SKRs is `kept` and the
/// stored record is `stored`: `kept`, plus each stored entry of a Kyma `kept` lacks for which
/// `carry` holds; `None` when that is what is stored already, or when nothing is known and
/// the stored record could not be read (an empty record must not replace one unread).
fn carried_on(
    stored: Stored,
    mut kept: BTreeMap<String, Kept>,
    carry: impl Fn(&str) -> bool,
) -> Option<BTreeMap<String, Kept>> {
    let stored = match stored {
        Stored::Record(stored) => stored,
        Stored::None if kept.is_empty() => return None,
        Stored::Unknown if kept.is_empty() => return None,
        Stored::None | Stored::Unknown => return Some(kept),
    };
    let unchanged = stored.clone();
    for (kyma, entry) in stored {
        if !kept.contains_key(&kyma) && carry(&kyma) {
            kept.insert(kyma, entry);
        }
    }
    (kept != unchanged).then_some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(secret: &str, digests: [u128; 2]) -> Kept {
        let kinds = CatalogKind::ALL.into_iter().zip(digests).collect();
        Kept { secret_version: secret.into(), state: Recalled { kinds } }
    }

    #[test]
    fn a_record_reads_back_what_was_written() {
        let all: BTreeMap<String, Kept> =
            [("a".to_owned(), kept("uid-a/17", [u128::MAX, 0])), ("b".to_owned(), kept("uid-b/3", [1, 2]))].into();
        let (text, left_out) = encode(&all);
        assert_eq!(left_out, 0);
        assert_eq!(decode(&text).expect("decodes"), all);
    }

    #[test]
    fn a_full_record_leaves_out_what_does_not_fit() {
        let all: BTreeMap<String, Kept> =
            (0..10_000).map(|i| (format!("kyma-{i:05}"), kept(&format!("{i}/{i}"), [1, 2]))).collect();
        let (text, left_out) = encode(&all);
        assert!(text.len() <= MAX_RECORD_BYTES, "{}", text.len());
        assert!(left_out > 0);
        assert_eq!(decode(&text).expect("decodes").len(), all.len() - left_out);
    }

    #[test]
    fn broken_records_and_entries_are_ignored() {
        assert!(decode("not json").is_err());
        assert!(decode(r#"{"format":2,"skrs":{}}"#).is_err());
        let text = r#"{"format":1,"skrs":{
            "bad-hex":{"secret":"s","kinds":{"ModuleTemplate":"zz"}},
            "bad-kind":{"secret":"s","kinds":{"Secret":"01"}},
            "good":{"secret":"s","crds":"0a","kinds":{"ModuleTemplate":"01","ModuleReleaseMeta":"02"}}}}"#;
        let kept = decode(text).expect("decodes");
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["good"], "a record of an older release (crds) still reads");
        assert_eq!(kept["good"].state.kinds[&CatalogKind::ModuleReleaseMeta], 2);
    }

    /// A shard taken before the Kyma cache held its Kymas, and given up again, knows none of
    /// its SKRs: the good record stays as it is rather than being replaced by an empty one.
    #[test]
    fn an_empty_or_partial_record_never_replaces_a_good_one() {
        let good: BTreeMap<String, Kept> =
            [("a".to_owned(), kept("uid-a/1", [1, 2])), ("b".to_owned(), kept("uid-b/1", [3, 4]))].into();
        let stored = || Stored::Record(good.clone());
        assert_eq!(carried_on(stored(), BTreeMap::new(), |_| true), None, "nothing known: nothing written");
        // Only `a` synced here since: `b` is carried on.
        let a = kept("uid-a/1", [5, 6]);
        let next = carried_on(stored(), [("a".to_owned(), a.clone())].into(), |_| true).expect("a changed");
        assert_eq!(next["a"], a);
        assert_eq!(next["b"], good["b"], "the entry of an SKR not synced here is carried on");
        // `b` deleted (the Kyma cache is complete and lacks it): dropped.
        let next = carried_on(stored(), [("a".to_owned(), a.clone())].into(), |k| k == "a").expect("changed");
        assert_eq!(next.keys().collect::<Vec<_>>(), ["a"]);
        // What is stored already is not written again.
        assert_eq!(carried_on(stored(), [("a".to_owned(), good["a"].clone())].into(), |_| true), None);
    }

    #[test]
    fn a_record_that_could_not_be_read_is_not_replaced_by_nothing() {
        let a: BTreeMap<String, Kept> = [("a".to_owned(), kept("uid-a/1", [1, 2]))].into();
        assert_eq!(carried_on(Stored::Unknown, BTreeMap::new(), |_| true), None);
        assert_eq!(carried_on(Stored::None, BTreeMap::new(), |_| true), None);
        assert_eq!(carried_on(Stored::Unknown, a.clone(), |_| true), Some(a.clone()));
        assert_eq!(carried_on(Stored::None, a.clone(), |_| true), Some(a));
    }
}
