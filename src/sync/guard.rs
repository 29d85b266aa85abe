//! The shrink guard in the catalog loop: reads the notes on the coordinator Lease, asks the pure
//! [`decide`] whether a new catalog state may be published, reports a hold (WARN log,
//! `catalogsync_catalog_shrink_held`), and records what was published on the Lease. The rules
//! are in [`crate::catalog::guard`]; the design in `docs/architecture.md` ("The shrink
//! guard").

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::api::{CONFIRM_SHRINK_ANNOTATION, COORDINATOR_LEASE, KCP_FIELD_MANAGER, PUBLISHED_CATALOG_ANNOTATION};
use crate::catalog::CatalogKind;
use crate::catalog::guard::{CatalogCounts, Check, HoldReason, LeaseNotes, Publish, Verdict, decide};
use crate::metrics::{CatalogMetrics, ReachableState};
use crate::sync::state::CatalogState;

/// How often a held state is decided again (to see a confirmation) and a failed record of the
/// published counts is retried. One GET of the coordinator Lease per replica per period, only
/// while a hold lasts; a confirmation takes effect within it.
pub const GUARD_RECHECK: Duration = Duration::from_secs(2);

/// The flag that sets the threshold, named in the hold's log line.
const THRESHOLD_FLAG: &str = "--catalog-shrink-threshold";

/// Longest annotation value quoted in a log line (a human wrote it).
const ANNOTATION_LOG_CHARS: usize = 64;

/// The shrink guard's configuration: the threshold and where the coordinator Lease lives.
#[derive(Clone)]
pub struct ShrinkGuard {
    threshold: f64,
    /// Longest wait for one request to the coordinator Lease (`--kcp-request-timeout`). The
    /// catalog loop waits for it (the catalog watches are not polled meanwhile); a KCP that
    /// does not answer within it is treated like an error.
    timeout: Duration,
    namespace: String,
    leases: Api<Lease>,
}

impl ShrinkGuard {
    /// A guard with `--catalog-shrink-threshold` `threshold` that keeps its notes on the
    /// coordinator Lease in `namespace` (`--lease-namespace`), each request bounded by
    /// `timeout`.
    pub fn new(threshold: f64, kcp: Client, namespace: &str, timeout: Duration) -> Self {
        Self { threshold, timeout, namespace: namespace.to_owned(), leases: Api::namespaced(kcp, namespace) }
    }

    /// Whether the guard does anything (a threshold below 1).
    pub fn is_on(&self) -> bool {
        self.threshold < 1.0
    }

    async fn read(&self) -> Result<LeaseRead, GuardLeaseError> {
        let lease = tokio::time::timeout(self.timeout, self.leases.get_opt(COORDINATOR_LEASE))
            .await
            .map_err(|_| GuardLeaseError::TimedOut)?
            .map_err(GuardLeaseError::ReadLease)?;
        Ok(LeaseRead::of(lease.as_ref()))
    }

    /// Records `counts` as the published catalog and, when `remove_confirmation`, removes the
    /// confirmation, but only from the version of the Lease it was read from, so that a newer
    /// one a human just wrote stays.
    async fn record(
        &self,
        counts: CatalogCounts,
        read: &LeaseRead,
        remove_confirmation: bool,
    ) -> Result<(), GuardLeaseError> {
        let mut annotations = Map::new();
        annotations.insert(PUBLISHED_CATALOG_ANNOTATION.to_owned(), json!(counts.to_string()));
        let mut metadata = Map::new();
        if remove_confirmation {
            annotations.insert(CONFIRM_SHRINK_ANNOTATION.to_owned(), Value::Null);
            metadata.insert("resourceVersion".to_owned(), json!(read.resource_version));
        }
        metadata.insert("annotations".to_owned(), Value::Object(annotations));
        let params = PatchParams { field_manager: Some(KCP_FIELD_MANAGER.to_owned()), ..PatchParams::default() };
        let patch = json!({ "metadata": metadata });
        tokio::time::timeout(self.timeout, self.leases.patch(COORDINATOR_LEASE, &params, &Patch::Merge(&patch)))
            .await
            .map_err(|_| GuardLeaseError::TimedOut)?
            .map(|_| ())
            .map_err(GuardLeaseError::RecordCatalog)
    }
}

/// Why the guard could not use the coordinator Lease.
#[derive(Debug, thiserror::Error)]
pub enum GuardLeaseError {
    /// Reading the coordinator Lease failed.
    #[error("failed to read the coordinator lease")]
    ReadLease(#[source] kube::Error),
    /// Writing the published counts to the coordinator Lease failed.
    #[error("failed to record the published catalog on the coordinator lease")]
    RecordCatalog(#[source] kube::Error),
    /// The KCP did not answer a request for the coordinator Lease in time.
    #[error("timed out waiting for the coordinator lease")]
    TimedOut,
}

/// The guard's annotations of the coordinator Lease as read.
#[derive(Debug, Clone, Default)]
struct LeaseRead {
    exists: bool,
    resource_version: Option<String>,
    recorded: Option<String>,
    confirmation: Option<String>,
}

impl LeaseRead {
    fn of(lease: Option<&Lease>) -> Self {
        let Some(lease) = lease else { return Self::default() };
        let annotation = |key: &str| lease.metadata.annotations.as_ref().and_then(|a| a.get(key)).cloned();
        Self {
            exists: true,
            resource_version: lease.metadata.resource_version.clone(),
            recorded: annotation(PUBLISHED_CATALOG_ANNOTATION),
            confirmation: annotation(CONFIRM_SHRINK_ANNOTATION),
        }
    }

    /// The notes; a value that does not parse counts as absent.
    fn notes(&self) -> LeaseNotes {
        LeaseNotes {
            recorded: self.recorded.as_deref().and_then(|v| v.parse().ok()),
            confirmed: self.confirmation.as_deref().and_then(|v| v.parse().ok()),
        }
    }
}

/// A state the guard let through, with what the loop reports after publishing it.
pub(crate) struct Approved {
    /// The state to publish.
    pub state: CatalogState,
    counts: CatalogCounts,
    because: Publish,
    read: Option<LeaseRead>,
}

/// A state held back.
struct Held {
    state: CatalogState,
    /// What was reported last: the reason, the baseline and the held counts.
    reported: (HoldReason, Option<CatalogCounts>, CatalogCounts),
    /// The confirmation last reported as not matching.
    ignored_confirmation: Option<String>,
}

/// The guard's state in one catalog loop.
pub(crate) struct Gate {
    guard: Option<ShrinkGuard>,
    metrics: CatalogMetrics,
    restricted_modules: BTreeSet<String>,
    /// The counts of the state published last.
    published: Option<CatalogCounts>,
    held: Option<Held>,
    /// A record on the Lease that failed and is retried.
    record_due: Option<Record>,
    next_recheck: Instant,
}

/// What to write to the Lease after a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    /// The published counts.
    counts: CatalogCounts,
    /// A confirmation of other counts that was on the Lease when they were decided: it is
    /// spent, and removed if the Lease still holds it. One a human writes later is not.
    spent: Option<String>,
}

impl Gate {
    /// The gate of a loop with `guard` (`None`: no guard, every state is published).
    pub fn new(guard: Option<ShrinkGuard>, metrics: CatalogMetrics, restricted_modules: BTreeSet<String>) -> Self {
        Self {
            guard,
            metrics,
            restricted_modules,
            published: None,
            held: None,
            record_due: None,
            next_recheck: Instant::now(),
        }
    }

    /// When the loop should wake up without a catalog change: while a state is held or a
    /// record is due.
    pub fn recheck_at(&self) -> Option<Instant> {
        (self.held.is_some() || self.record_due.is_some()).then_some(self.next_recheck)
    }

    /// Whether the guard is on and `state` has fewer reachable objects of some kind than the
    /// state published last: the loop decides such a state only once its burst of changes is
    /// over, so that a long deletion is judged whole, not in steps that each stay within the
    /// threshold.
    pub fn shrinks(&self, state: &CatalogState) -> bool {
        let on = self.guard.as_ref().is_some_and(ShrinkGuard::is_on);
        on && self.published.is_some_and(|published| {
            CatalogCounts::reachable(&state.snapshot, &self.restricted_modules).is_smaller_than(&published)
        })
    }

    /// The held state, to decide it again.
    pub fn held_state(&self) -> Option<CatalogState> {
        self.held.as_ref().map(|h| h.state.clone())
    }

    /// The new state equals the published one: whatever was held is gone.
    pub fn restored(&mut self) {
        if let Some(held) = self.held.take() {
            let (_, _, counts) = held.reported;
            info!(because = "restored", held = %counts, "Catalog no longer held back");
        }
        self.metrics.shrink_held(false);
        if let Some(published) = self.published {
            self.set_counts(ReachableState::Latest, published);
        }
    }

    /// Decides whether `state` may be published: `Some` to publish it, `None` when it is held
    /// (reported here; the published state stays).
    pub async fn check(&mut self, state: CatalogState) -> Option<Approved> {
        let counts = CatalogCounts::reachable(&state.snapshot, &self.restricted_modules);
        self.set_counts(ReachableState::Latest, counts);
        let guard = match &self.guard {
            Some(guard) if guard.is_on() => guard,
            _ => return Some(Approved { state, counts, because: Publish::GuardOff, read: None }),
        };
        let read = guard.read().await;
        let check = Check {
            threshold: guard.threshold,
            published: self.published,
            notes: read.as_ref().ok().map(LeaseRead::notes),
            new: counts,
        };
        match decide(&check) {
            Verdict::Publish(because) => Some(Approved { state, counts, because, read: read.ok() }),
            Verdict::Hold { reason, baseline, fraction } => {
                self.hold(state, counts, (reason, baseline, fraction), read);
                None
            }
        }
    }

    /// Reports a hold (once per distinct hold) and keeps the state to decide it again.
    fn hold(
        &mut self,
        state: CatalogState,
        counts: CatalogCounts,
        (reason, baseline, fraction): (HoldReason, Option<CatalogCounts>, f64),
        read: Result<LeaseRead, GuardLeaseError>,
    ) {
        let (threshold, namespace) =
            self.guard.as_ref().map(|g| (g.threshold, g.namespace.clone())).unwrap_or_default();
        let reported = (reason, baseline, counts);
        let previous = self.held.take();
        if previous.as_ref().map(|h| h.reported) != Some(reported) {
            let published = baseline.map_or_else(|| "none".to_owned(), |b| b.to_string());
            let error = read.as_ref().err().map(|e| e as &dyn std::error::Error);
            warn!(
                reason = reason.as_str(),
                %published,
                new = %counts,
                fraction,
                threshold,
                flag = THRESHOLD_FLAG,
                lease = COORDINATOR_LEASE,
                lease_namespace = %namespace,
                annotation = CONFIRM_SHRINK_ANNOTATION,
                error,
                "Holding back a catalog state that lost too much; nothing is pruned"
            );
        }
        let confirmation = read.ok().and_then(|r| r.confirmation);
        let mut ignored_confirmation = previous.and_then(|h| h.ignored_confirmation);
        if let Some(value) = confirmation.filter(|v| v.parse::<CatalogCounts>().ok() != Some(counts))
            && ignored_confirmation.as_ref() != Some(&value)
        {
            warn!(
                confirmation = %crate::text::bounded(&value, ANNOTATION_LOG_CHARS),
                new = %counts,
                annotation = CONFIRM_SHRINK_ANNOTATION,
                "Ignoring a shrink confirmation that does not name the held catalog's counts"
            );
            ignored_confirmation = Some(value);
        }
        self.metrics.shrink_held(true);
        self.held = Some(Held { state, reported, ignored_confirmation });
        self.next_recheck = Instant::now() + GUARD_RECHECK;
    }

    /// Notes that `approved` was published: the baseline, the metrics, the end of a hold, and
    /// the record on the Lease.
    pub async fn published(&mut self, approved: Approved) {
        let Approved { counts, because, read, .. } = approved;
        if because == Publish::Confirmed {
            info!(new = %counts, annotation = CONFIRM_SHRINK_ANNOTATION, "Publishing a catalog shrink a human confirmed");
        }
        self.published = Some(counts);
        if self.held.take().is_some() {
            let because = if because == Publish::Confirmed { "confirmed" } else { "within_threshold" };
            info!(because, new = %counts, "Catalog no longer held back");
        }
        self.metrics.shrink_held(false);
        self.set_counts(ReachableState::Published, counts);
        if self.guard.as_ref().is_some_and(ShrinkGuard::is_on) {
            let spent = read
                .as_ref()
                .and_then(|r| r.confirmation.clone())
                .filter(|v| v.parse::<CatalogCounts>().ok() != Some(counts));
            self.record(Record { counts, spent }).await;
        }
    }

    /// Retries a failed record on the Lease.
    pub async fn retry_record(&mut self) {
        if let Some(record) = self.record_due.take() {
            self.record(record).await;
        }
    }

    /// Writes the published counts to the Lease unless it holds them already, and removes the
    /// confirmation the publish spent: once another catalog is published, an old confirmation
    /// must not approve a later shrink. Reads the Lease first: the write carries the version
    /// read as a precondition when it removes the confirmation, and the coordinator renews the
    /// Lease every retry period.
    async fn record(&mut self, record: Record) {
        let Some(guard) = self.guard.clone() else { return };
        let counts = record.counts;
        let result = async {
            let read = guard.read().await?;
            if !read.exists {
                // The coordinator creates it within a retry period of its election.
                debug!(lease = COORDINATOR_LEASE, "Coordinator Lease not there yet; recording the catalog later");
                return Ok(false);
            }
            if let Some(remove) = record_write(&record, &read) {
                guard.record(counts, &read, remove).await?;
                if remove {
                    info!(
                        published = %counts,
                        annotation = CONFIRM_SHRINK_ANNOTATION,
                        "Removed a shrink confirmation for other counts"
                    );
                }
            }
            Ok::<_, GuardLeaseError>(true)
        }
        .await;
        let done = match result {
            Ok(done) => done,
            Err(error) => {
                warn!(
                    error = &error as &dyn std::error::Error,
                    published = %counts,
                    "Failed to record the published catalog; retrying"
                );
                false
            }
        };
        if !done {
            self.record_due = Some(record);
            self.next_recheck = Instant::now() + GUARD_RECHECK;
        }
    }

    fn set_counts(&self, state: ReachableState, counts: CatalogCounts) {
        for kind in CatalogKind::ALL {
            self.metrics.reachable(kind, state, counts.of(kind));
        }
    }
}

/// Whether the Lease as `read` needs a write for `record`: `None` when it records the counts
/// already and does not hold the spent confirmation, else `Some(remove)`, with `remove` true
/// when the spent confirmation is still there.
fn record_write(record: &Record, read: &LeaseRead) -> Option<bool> {
    let remove = record.spent.is_some() && read.confirmation == record.spent;
    let recorded = read.recorded.as_deref() == Some(record.counts.to_string().as_str());
    (!recorded || remove).then_some(remove)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(recorded: Option<&str>, confirmation: Option<&str>) -> LeaseRead {
        LeaseRead {
            exists: true,
            resource_version: Some("7".into()),
            recorded: recorded.map(str::to_owned),
            confirmation: confirmation.map(str::to_owned),
        }
    }

    const THREE: CatalogCounts = CatalogCounts { release_metas: 3, templates: 9 };

    fn published(spent: Option<&str>) -> Record {
        Record { counts: THREE, spent: spent.map(str::to_owned) }
    }

    #[test]
    fn a_lease_that_records_the_published_counts_is_left_alone() {
        assert_eq!(record_write(&published(None), &read(Some("mrm=3,mt=9"), None)), None);
        // The confirmation that let these counts through is not spent: it stays, for
        // replicas that have not seen it yet.
        assert_eq!(record_write(&published(None), &read(Some("mrm=3,mt=9"), Some("mrm=3,mt=9"))), None);
    }

    #[test]
    fn other_recorded_counts_are_overwritten() {
        assert_eq!(record_write(&published(None), &read(None, None)), Some(false));
        assert_eq!(record_write(&published(None), &read(Some("mrm=10,mt=30"), None)), Some(false));
        assert_eq!(record_write(&published(None), &read(Some("garbage"), Some("mrm=3,mt=9"))), Some(false));
    }

    #[test]
    fn a_confirmation_there_when_another_catalog_was_published_is_removed() {
        let spent = published(Some("mrm=1,mt=1"));
        assert_eq!(record_write(&spent, &read(Some("mrm=10,mt=30"), Some("mrm=1,mt=1"))), Some(true));
        assert_eq!(record_write(&spent, &read(Some("mrm=3,mt=9"), Some("mrm=1,mt=1"))), Some(true));
        let garbage = published(Some("yes please"));
        assert_eq!(record_write(&garbage, &read(Some("mrm=3,mt=9"), Some("yes please"))), Some(true));
    }

    #[test]
    fn a_confirmation_written_after_the_publish_stays() {
        // A retry must not remove what a human wrote for a hold that began since.
        assert_eq!(record_write(&published(None), &read(Some("mrm=10,mt=30"), Some("mrm=1,mt=1"))), Some(false));
        let spent = published(Some("mrm=1,mt=1"));
        assert_eq!(record_write(&spent, &read(Some("mrm=3,mt=9"), Some("mrm=2,mt=2"))), None);
    }

    #[test]
    fn unparsable_annotations_count_as_absent() {
        let notes = read(Some("mrm=3"), Some("all of it")).notes();
        assert_eq!(notes, LeaseNotes::default());
        assert_eq!(read(Some("mrm=3,mt=9"), None).notes().recorded, Some(THREE));
    }
}
