//! [`ShardView`]: the ownership gate every reconcile and every SKR write consults.
//!
//! A replica may write to the SKR of a Kyma only while (a) the Kyma's shard is active here
//! (this replica holds the shard's Lease and is not draining it), (b) its own member Lease was
//! renewed within the renew deadline (self-fencing: checked against the clock on every call,
//! not only when a renewal fails), and (c) the replica is not shutting down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

use crate::sharding::ring::shard_of;

/// The shared ownership state of one replica.
#[derive(Clone)]
pub struct ShardView {
    inner: Arc<Inner>,
}

struct Inner {
    shards: u32,
    epoch: Instant,
    /// Milliseconds after `epoch` until which SKR writes are allowed; 0 means fenced.
    fence_deadline_ms: AtomicU64,
    stopping: AtomicBool,
    active: Vec<AtomicBool>,
    in_flight: Vec<AtomicUsize>,
    /// Per shard, milliseconds after `epoch` of the last write allowed by
    /// [`ShardView::may_write`], plus one (0: none yet).
    last_write_ms: Vec<AtomicU64>,
    /// Woken when a sync ends, so a draining shard is released as soon as it is idle.
    idle: Notify,
    /// Set when a renewal ends a fenced period; the agent then gives up its shards.
    lapsed: AtomicBool,
    /// Fenced periods ended so far (the coordinator starts over after each).
    lapses: AtomicU64,
}

impl std::fmt::Debug for ShardView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardView").field("shards", &self.inner.shards).field("fenced", &self.is_fenced()).finish()
    }
}

impl ShardView {
    /// A view over `shards` shards that owns nothing and is fenced until its first renewal.
    pub fn new(shards: u32) -> Self {
        let shards = shards.max(1);
        Self {
            inner: Arc::new(Inner {
                shards,
                epoch: Instant::now(),
                fence_deadline_ms: AtomicU64::new(0),
                stopping: AtomicBool::new(false),
                active: (0..shards).map(|_| AtomicBool::new(false)).collect(),
                in_flight: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
                last_write_ms: (0..shards).map(|_| AtomicU64::new(0)).collect(),
                idle: Notify::new(),
                lapsed: AtomicBool::new(false),
                lapses: AtomicU64::new(0),
            }),
        }
    }

    /// A view of one shard that is active and never fenced: for a single replica without
    /// Leases, and for tests.
    pub fn single_replica() -> Self {
        let view = Self::new(1);
        view.set_active(0, true);
        view.inner.fence_deadline_ms.store(u64::MAX, Ordering::Release);
        view
    }

    /// Number of shards.
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// The shard of a Kyma.
    pub fn shard_of(&self, namespace: &str, name: &str) -> u32 {
        shard_of(namespace, name, self.inner.shards)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether SKR writes are stopped because the member Lease was not renewed in time.
    pub fn is_fenced(&self) -> bool {
        self.now_ms() >= self.inner.fence_deadline_ms.load(Ordering::Acquire)
    }

    /// Records a successful member Lease renewal whose request was sent at `sent`: writes are
    /// allowed until `sent + renew_deadline`.
    ///
    /// A renewal after the deadline had passed does not bring the shards back: they are all
    /// deactivated here, before writes are allowed again, and the agent must confirm each
    /// with a Lease write (its cache may have gone stale meanwhile).
    pub fn renewed(&self, sent: Instant, renew_deadline: Duration) {
        if self.is_fenced() && self.inner.fence_deadline_ms.load(Ordering::Acquire) > 0 {
            for a in &self.inner.active {
                a.store(false, Ordering::Release);
            }
            self.inner.lapsed.store(true, Ordering::Release);
            self.inner.lapses.fetch_add(1, Ordering::AcqRel);
        }
        let deadline = (sent + renew_deadline).saturating_duration_since(self.inner.epoch);
        let ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
        self.inner.fence_deadline_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// How many fenced periods have ended so far (see [`ShardView::renewed`]); unlike
    /// [`ShardView::take_lapse`], reading it consumes nothing.
    pub fn lapses(&self) -> u64 {
        self.inner.lapses.load(Ordering::Acquire)
    }

    /// Whether a fenced period ended since the last call (see [`ShardView::renewed`]).
    pub fn take_lapse(&self) -> bool {
        self.inner.lapsed.swap(false, Ordering::AcqRel)
    }

    /// Stops all SKR writes at once and for good (shutdown).
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
    }

    /// Whether [`ShardView::stop`] was called.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }

    /// Marks a shard active (held and not draining) or not.
    pub fn set_active(&self, shard: u32, active: bool) {
        if let Some(a) = self.inner.active.get(shard as usize) {
            a.store(active, Ordering::Release);
        }
    }

    /// Whether a shard is active here (ignoring fencing).
    pub fn is_active(&self, shard: u32) -> bool {
        self.inner.active.get(shard as usize).is_some_and(|a| a.load(Ordering::Acquire))
    }

    /// Syncs of a shard running now.
    pub fn in_flight(&self, shard: u32) -> usize {
        self.inner.in_flight.get(shard as usize).map_or(0, |n| n.load(Ordering::Acquire))
    }

    /// Whether the Kyma `namespace/name` belongs to this replica right now.
    pub fn owns(&self, namespace: &str, name: &str) -> bool {
        self.owns_shard(self.shard_of(namespace, name))
    }

    /// Whether `shard` may be worked on right now.
    pub fn owns_shard(&self, shard: u32) -> bool {
        !self.is_stopping() && !self.is_fenced() && self.is_active(shard)
    }

    /// Whether a write to the SKR of `namespace/name` is allowed right now; checked right
    /// before every SKR write. An allowed write is noted for its shard: a request sent may
    /// still land until the request timeout after it, even when its sync was dropped, so a
    /// shard is released no sooner ([`ShardView::since_last_write`]).
    pub fn may_write(&self, namespace: &str, name: &str) -> bool {
        let shard = self.shard_of(namespace, name);
        let allowed = self.owns_shard(shard);
        if allowed && let Some(last) = self.inner.last_write_ms.get(shard as usize) {
            let ms = u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
            last.fetch_max(ms + 1, Ordering::AcqRel);
        }
        allowed
    }

    /// How long ago the last write to an SKR of `shard` was allowed (`None`: never).
    pub fn since_last_write(&self, shard: u32) -> Option<std::time::Duration> {
        let ms = self.inner.last_write_ms.get(shard as usize)?.load(Ordering::Acquire).checked_sub(1)?;
        Some(self.inner.epoch.elapsed().saturating_sub(std::time::Duration::from_millis(ms)))
    }

    /// Starts a sync of the Kyma's SKR if its shard is ours; the guard counts it as in flight
    /// until dropped, so a draining shard is released only when its syncs are done.
    pub fn begin(&self, namespace: &str, name: &str) -> Option<SyncGuard> {
        let shard = self.shard_of(namespace, name);
        let counter = self.inner.in_flight.get(shard as usize)?;
        counter.fetch_add(1, Ordering::AcqRel);
        // Checked after counting, so a drain that saw zero in flight cannot miss this sync.
        if self.owns_shard(shard) {
            Some(SyncGuard { view: self.clone(), shard })
        } else {
            self.end(shard);
            None
        }
    }

    fn end(&self, shard: u32) {
        if let Some(c) = self.inner.in_flight.get(shard as usize) {
            c.fetch_sub(1, Ordering::AcqRel);
        }
        self.inner.idle.notify_waiters();
    }

    /// Resolves when some sync ends.
    pub async fn sync_ended(&self) {
        self.inner.idle.notified().await;
    }
}

/// A sync in flight; see [`ShardView::begin`].
pub struct SyncGuard {
    view: ShardView,
    shard: u32,
}

impl SyncGuard {
    /// The shard of the synced Kyma.
    pub fn shard(&self) -> u32 {
        self.shard
    }
}

impl Drop for SyncGuard {
    fn drop(&mut self) {
        self.view.end(self.shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fences_itself_when_the_renew_deadline_passes() {
        let view = ShardView::new(4);
        view.set_active(view.shard_of("ns", "k"), true);
        assert!(!view.owns("ns", "k"), "fenced before the first renewal");
        view.renewed(Instant::now(), Duration::from_secs(10));
        assert!(view.owns("ns", "k"));
        tokio::time::advance(Duration::from_millis(9_900)).await;
        assert!(view.may_write("ns", "k"));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(!view.may_write("ns", "k"), "no write after the renew deadline without a renewal");
        view.renewed(Instant::now(), Duration::from_secs(10));
        assert!(!view.may_write("ns", "k"), "a renewal after a lapse does not restore shards");
        assert!(view.take_lapse());
        assert!(!view.take_lapse());
        view.set_active(view.shard_of("ns", "k"), true);
        assert!(view.may_write("ns", "k"));
        view.stop();
        assert!(!view.may_write("ns", "k"));
    }

    #[test]
    fn begin_counts_in_flight_only_for_owned_shards() {
        let view = ShardView::single_replica();
        let guard = view.begin("ns", "k").expect("owned");
        assert_eq!(view.in_flight(guard.shard()), 1);
        drop(guard);
        assert_eq!(view.in_flight(0), 0);
        view.set_active(0, false);
        assert!(view.begin("ns", "k").is_none());
        assert_eq!(view.in_flight(0), 0);
    }

    #[test]
    fn an_allowed_write_is_noted_for_its_shard_and_a_refused_one_is_not() {
        let view = ShardView::single_replica();
        assert_eq!(view.since_last_write(0), None);
        view.set_active(0, false);
        assert!(!view.may_write("ns", "k"));
        assert_eq!(view.since_last_write(0), None, "a refused write is not noted");
        view.set_active(0, true);
        assert!(view.may_write("ns", "k"));
        let since = view.since_last_write(0).expect("noted");
        assert!(since < std::time::Duration::from_secs(5), "{since:?}");
    }
}
