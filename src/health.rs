//! Liveness of the loops correctness depends on: the member Lease loop and the shard agent
//! beat a [`Heartbeat`] every round, and `/healthz` (`/livez`) fails when one has been silent
//! for too long, so the kubelet restarts a replica whose loop hangs instead of leaving it up,
//! fenced or holding shards it no longer works on. A KCP outage does not stop the beats (every
//! KCP request is bounded, see [`crate::kcp`]), so it never restarts a replica by itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::{Duration, Instant};

/// One loop's sign of progress.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    name: &'static str,
    epoch: Instant,
    /// Milliseconds after `epoch` of the last beat.
    last_ms: Arc<AtomicU64>,
    max_silence: Duration,
}

impl Heartbeat {
    /// A heartbeat that beats now and counts as stale after `max_silence` without a beat.
    pub fn new(name: &'static str, max_silence: Duration) -> Self {
        Self { name, epoch: Instant::now(), last_ms: Arc::new(AtomicU64::new(0)), max_silence }
    }

    /// The loop made progress.
    pub fn beat(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Release);
    }

    /// The loop's name, for the liveness answer.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// How long since the last beat.
    pub fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Acquire));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Whether the loop has been silent for longer than allowed.
    pub fn is_stale(&self) -> bool {
        self.silence() > self.max_silence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stale_after_the_allowed_silence() {
        let hb = Heartbeat::new("agent", Duration::from_secs(30));
        assert!(!hb.is_stale());
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(!hb.is_stale());
        hb.beat();
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(!hb.is_stale());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(hb.is_stale());
        hb.beat();
        assert!(!hb.is_stale());
    }
}
