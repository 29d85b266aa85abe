//! The Kyma controller as controller-runtime runs KLM's: the Kyma watch feeds the work queue,
//! `--workers` workers take Kymas off it and requeue them after each pass, and a tracker
//! notes when every Kyma known at start had its first pass.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use catalogsync::api::Kyma;
use catalogsync::kcp::until_ready;
use futures::{StreamExt, future};
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::kcp::{key_of, watch_kymas};
use super::pass::reconcile;
use super::queue::WorkQueue;
use super::{Ctx, SHUTDOWN_TIMEOUT, lock};
use crate::stats::unix_ms;

/// How often the first-round tracker drops Kymas deleted before their first pass.
const FIRST_ROUND_POLL: Duration = Duration::from_millis(200);

/// Runs the Kyma controller (watch, work queue, workers) and the first-round tracker until
/// `shutdown`.
pub(super) async fn run_controller(
    kcp: &Client,
    namespace: &str,
    workers: u16,
    ctx: Arc<Ctx>,
    shutdown: CancellationToken,
) {
    let (kyma_store, events) = watch_kymas(kcp, namespace);
    let queue = WorkQueue::new();
    let watch = tokio::spawn({
        let (ctx, queue, stop) = (ctx.clone(), queue.clone(), shutdown.clone());
        async move {
            tokio::pin!(events);
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    () = stop.cancelled() => return,
                };
                match event {
                    Some(Ok(kyma)) => {
                        let key = key_of(&kyma);
                        ctx.schedule.mark_due(&key, Instant::now());
                        queue.add(&key);
                    }
                    Some(Err(error)) => warn!(error = &error as &dyn std::error::Error, "Kyma watch failed; retrying"),
                    None => return,
                }
            }
        }
    });
    *lock(&ctx.kymas) = Some(kyma_store.clone());
    *lock(&ctx.queue) = Some(queue.clone());

    let tracker = tokio::spawn(track_first_round(ctx.clone(), kyma_store.clone(), shutdown.clone()));
    let timers = tokio::spawn({
        let (queue, stop) = (queue.clone(), shutdown.clone());
        async move { queue.run_timers(&stop).await }
    });
    // As controller-runtime, workers start once the Kyma cache has synced: the store shows
    // the initial list only when it is complete, and a key taken before would find no Kyma.
    let synced = tokio::select! {
        ready = until_ready(&kyma_store) => ready,
        () = shutdown.cancelled() => false,
    };
    if synced {
        ctx.stats.started_unix_ms.store(unix_ms(), Ordering::Relaxed);
    }
    let workers: Vec<_> = (0..if synced { workers } else { 0 })
        .map(|_| tokio::spawn(work(ctx.clone(), queue.clone(), kyma_store.clone(), shutdown.clone())))
        .collect();
    shutdown.cancelled().await;
    // Let in-flight passes finish, but not forever.
    if tokio::time::timeout(SHUTDOWN_TIMEOUT, future::join_all(workers)).await.is_err() {
        warn!("In-flight passes did not finish in time");
    }
    for task in [watch, tracker, timers] {
        task.abort();
    }
}

/// One worker: takes the next Kyma off the queue, runs its pass, requeues it (controller-
/// runtime's `processNextWorkItem`), until `shutdown`.
async fn work(ctx: Arc<Ctx>, queue: Arc<WorkQueue>, kymas: Store<Kyma>, shutdown: CancellationToken) {
    while let Some(key) = queue.get(&shutdown).await {
        let kyma = key.split_once('/').and_then(|(ns, name)| kymas.get(&ObjectRef::new(name).within(ns)));
        let requeue = match kyma {
            Some(kyma) => match reconcile(kyma, &ctx).await {
                Ok(()) => ctx.schedule.requeue_after_success(&key),
                Err(_) => ctx.schedule.requeue_after_failure(&key),
            },
            // Deleted: nothing to do, and no requeue.
            None => {
                ctx.schedule.forget(&key);
                None
            }
        };
        if let Some(delay) = requeue {
            queue.add_at(&key, tokio::time::Instant::now() + delay);
        }
        queue.done(&key);
    }
}

/// Drops Kymas deleted before their first pass from the first round, once the Kyma cache has
/// synced and fixed the set of Kymas known at start; with `--once`, ends the run when the
/// round is done.
async fn track_first_round(ctx: Arc<Ctx>, kymas: Store<Kyma>, shutdown: CancellationToken) {
    if !until_ready(&kymas).await {
        return;
    }
    let known: HashSet<String> = kymas.state().iter().map(|k| key_of(k)).collect();
    info!(kymas = known.len(), "Kyma cache synced");
    ctx.schedule.start_first_round(&known);
    loop {
        tokio::select! {
            () = ctx.schedule.once_done().cancelled() => {
                shutdown.cancel();
                return;
            }
            () = tokio::time::sleep(FIRST_ROUND_POLL) => {}
        }
        let present: HashSet<String> = kymas.state().iter().map(|k| key_of(k)).collect();
        if ctx.schedule.drop_deleted(&present) && !ctx.schedule.is_once() {
            return;
        }
    }
}
