//! controller-runtime's work queue (client-go `workqueue`), as lifecycle-manager's Kyma
//! controller uses it: first in, first out; a key is queued at most once; a key is never
//! handed to two workers at once (added again while being processed, it is queued when the
//! worker is done); a delayed add keeps the earliest time asked for.
//!
//! kube's `Controller` schedules differently (a delay queue, no FIFO order among due keys):
//! saturated, it runs requeued keys while others still wait for their first pass, which is not
//! what lifecycle-manager does.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The queue. Clone the `Arc` for workers and the delay task.
#[derive(Default)]
pub(super) struct WorkQueue {
    state: Mutex<State>,
    /// A key was queued.
    ready: Notify,
    /// A delayed add became the earliest.
    rescheduled: Notify,
}

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    /// Queued, or added while processing (to be queued when done).
    dirty: HashSet<String>,
    processing: HashSet<String>,
    /// Delayed adds: the earliest time per key.
    waiting: HashMap<String, Instant>,
    /// The same, ordered by time (entries superseded in `waiting` are skipped).
    timers: BinaryHeap<Reverse<(Instant, String)>>,
}

impl WorkQueue {
    pub(super) fn new() -> Arc<WorkQueue> {
        Arc::new(WorkQueue::default())
    }

    /// Queues `key` unless it is queued already (`Add`).
    pub(super) fn add(&self, key: &str) {
        let mut state = self.lock();
        if !state.dirty.insert(key.to_owned()) || state.processing.contains(key) {
            return;
        }
        state.queue.push_back(key.to_owned());
        drop(state);
        self.ready.notify_one();
    }

    /// Queues `key` at `at`, or earlier if an earlier delayed add is pending (`AddAfter`).
    pub(super) fn add_at(&self, key: &str, at: Instant) {
        if at <= Instant::now() {
            self.add(key);
            return;
        }
        let mut state = self.lock();
        if state.waiting.get(key).is_some_and(|t| *t <= at) {
            return;
        }
        state.waiting.insert(key.to_owned(), at);
        let earliest = state.timers.peek().is_none_or(|Reverse((t, _))| at < *t);
        state.timers.push(Reverse((at, key.to_owned())));
        drop(state);
        if earliest {
            self.rescheduled.notify_one();
        }
    }

    /// The next key, in FIFO order, marked as processing (`Get`); `None` once `stop` is
    /// cancelled, even with keys still queued.
    pub(super) async fn get(&self, stop: &CancellationToken) -> Option<String> {
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if stop.is_cancelled() {
                return None;
            }
            if let Some(key) = self.pop() {
                return Some(key);
            }
            tokio::select! {
                () = notified => {}
                () = stop.cancelled() => return None,
            }
        }
    }

    fn pop(&self) -> Option<String> {
        let mut state = self.lock();
        let key = state.queue.pop_front()?;
        state.dirty.remove(&key);
        state.processing.insert(key.clone());
        Some(key)
    }

    /// Ends the processing of `key` (`Done`): queued again if added meanwhile.
    pub(super) fn done(&self, key: &str) {
        let mut state = self.lock();
        state.processing.remove(key);
        if state.dirty.contains(key) {
            state.queue.push_back(key.to_owned());
            drop(state);
            self.ready.notify_one();
        }
    }

    /// Moves due delayed adds into the queue until `stop` (the delaying queue's loop).
    pub(super) async fn run_timers(&self, stop: &CancellationToken) {
        loop {
            let rescheduled = self.rescheduled.notified();
            tokio::pin!(rescheduled);
            rescheduled.as_mut().enable();
            let next = self.release_due(Instant::now());
            tokio::select! {
                () = sleep_until(next) => {}
                () = rescheduled => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Queues every delayed add due at `now`; returns the time of the next one.
    fn release_due(&self, now: Instant) -> Option<Instant> {
        let mut due = Vec::new();
        let next = {
            let mut state = self.lock();
            while let Some(Reverse((at, _))) = state.timers.peek()
                && *at <= now
            {
                let Some(Reverse((at, key))) = state.timers.pop() else { break };
                // Superseded by an earlier add of the same key (already released or pending).
                if state.waiting.get(&key) == Some(&at) {
                    state.waiting.remove(&key);
                    due.push(key);
                }
            }
            state.timers.peek().map(|Reverse((at, _))| *at)
        };
        for key in due {
            self.add(&key);
        }
        next
    }

    /// Keys queued and not yet taken by a worker.
    pub(super) fn len(&self) -> usize {
        self.lock().queue.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn drain(queue: &WorkQueue) -> Vec<String> {
        std::iter::from_fn(|| queue.pop()).collect()
    }

    #[test]
    fn keys_come_out_in_order_once() {
        let queue = WorkQueue::new();
        for key in ["a", "b", "a", "c", "b"] {
            queue.add(key);
        }
        assert_eq!(drain(&queue), ["a", "b", "c"]);
    }

    #[test]
    fn a_key_added_while_processing_waits_for_done() {
        let queue = WorkQueue::new();
        queue.add("a");
        queue.add("b");
        assert_eq!(queue.pop().as_deref(), Some("a"));
        queue.add("a");
        queue.add("a");
        // Not handed out again while a worker holds it.
        assert_eq!(drain(&queue), ["b"]);
        queue.add("c");
        queue.done("a");
        assert_eq!(drain(&queue), ["c", "a"]);
        // Done without a new add: nothing is queued.
        queue.done("a");
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_add_keeps_the_earliest_time() {
        let queue = WorkQueue::new();
        let t0 = Instant::now();
        queue.add_at("late", t0 + Duration::from_secs(300));
        queue.add_at("a", t0 + Duration::from_secs(300));
        queue.add_at("a", t0 + Duration::from_secs(5));
        queue.add_at("a", t0 + Duration::from_secs(60));
        assert_eq!(queue.release_due(t0 + Duration::from_secs(4)), Some(t0 + Duration::from_secs(5)));
        assert_eq!(queue.len(), 0);
        assert_eq!(queue.release_due(t0 + Duration::from_secs(5)), Some(t0 + Duration::from_secs(300)));
        assert_eq!(drain(&queue), ["a"]);
        // The superseded 60 s and 300 s entries of "a" release nothing.
        assert_eq!(queue.release_due(t0 + Duration::from_secs(300)), None);
        assert_eq!(drain(&queue), ["late"]);
    }

    #[tokio::test(start_paused = true)]
    async fn workers_get_delayed_keys_when_due_and_stop_when_told() {
        let queue = WorkQueue::new();
        let stop = CancellationToken::new();
        let timers = tokio::spawn({
            let (queue, stop) = (queue.clone(), stop.clone());
            async move { queue.run_timers(&stop).await }
        });
        let t0 = Instant::now();
        queue.add_at("b", t0 + Duration::from_secs(10));
        queue.add_at("a", t0 + Duration::from_secs(2));
        assert_eq!(queue.get(&stop).await.as_deref(), Some("a"));
        assert_eq!(Instant::now() - t0, Duration::from_secs(2));
        assert_eq!(queue.get(&stop).await.as_deref(), Some("b"));
        assert_eq!(Instant::now() - t0, Duration::from_secs(10));
        let waiting = tokio::spawn({
            let (queue, stop) = (queue.clone(), stop.clone());
            async move { queue.get(&stop).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.add("c");
        queue.add("d");
        stop.cancel();
        // The waiting worker may have taken "c" before the stop; nothing is handed out after.
        let last = waiting.await.ok().flatten();
        assert!(matches!(last.as_deref(), None | Some("c")), "{last:?}");
        assert_eq!(queue.get(&stop).await, None);
        timers.await.ok();
    }
}
