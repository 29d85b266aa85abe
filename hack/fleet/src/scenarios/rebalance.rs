//! Shards moving between running replicas: a fourth replica joins three, then leaves on
//! SIGTERM; how many shards and SKRs move, how long until settled, how long SKRs are unowned.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::rows::{RebalanceRow, Traffic};
use super::setup::{await_idle, traffic};
use crate::bench::{Bench, metric};

/// Shards of the ring (catalogsync's default `--shards`).
const SHARDS: usize = 64;

/// Rebalance 3 -> 4 -> 3 with the three replicas running.
pub(super) async fn rebalance(bench: &mut Bench) -> Result<Vec<RebalanceRow>> {
    eprintln!("rebalance 3 -> 4 -> 3");
    let mut rows = Vec::new();
    let sim = bench.sim()?.admin;
    // 3 -> 4
    sim.reset().await?;
    let before = handover_totals(bench).await;
    let t = Instant::now();
    bench.spawn_replica("catalogsync-3", &[])?;
    let unowned = watch_until_settled(bench, 4, Duration::from_secs(300)).await?;
    let settle = t.elapsed().as_secs_f64();
    // The owned-SKR gauge is set once the new holder's first syncs of a shard ran.
    await_idle(bench, Duration::from_secs(300)).await?;
    let port = bench.replicas.get("catalogsync-3").context("replica catalogsync-3")?.http_port;
    let moved = Moved {
        shards: metric(port, "catalogsync_shards_held", &[]).await,
        skrs: metric(port, "catalogsync_shard_owned_clusters", &[]).await,
    };
    let w = traffic(bench).await?;
    let after = handover_totals(bench).await;
    rows.push(row("3 -> 4 (scale up)", &moved, settle, before, after, unowned, w));
    // 4 -> 3
    sim.reset().await?;
    let before = handover_totals(bench).await;
    let t = Instant::now();
    let leaving_port = bench.replicas.get("catalogsync-3").context("replica catalogsync-3")?.http_port;
    let leaving = Moved {
        shards: metric(leaving_port, "catalogsync_shards_held", &[]).await,
        skrs: metric(leaving_port, "catalogsync_shard_owned_clusters", &[]).await,
    };
    let mut leaver = bench.replicas.remove("catalogsync-3").context("replica catalogsync-3")?;
    let term = leaver.process.terminate(Duration::from_secs(40));
    let watch = watch_until_settled(bench, 3, Duration::from_secs(300));
    let (term, unowned) = tokio::join!(term, watch);
    term?;
    let unowned = unowned?;
    let settle = t.elapsed().as_secs_f64();
    await_idle(bench, Duration::from_secs(300)).await?;
    let w = traffic(bench).await?;
    let after = handover_totals(bench).await;
    rows.push(row("4 -> 3 (SIGTERM)", &leaving, settle, before, after, unowned, w));
    Ok(rows)
}

/// What moved in one step, from the moving replica's gauges.
struct Moved {
    shards: f64,
    skrs: f64,
}

/// Sum and count of the handover duration histogram over the replicas.
#[derive(Clone, Copy)]
struct Handovers {
    sum: f64,
    count: f64,
}

/// Max SKRs unowned at once, and seconds with any.
#[derive(Clone, Copy)]
struct Unowned {
    max: f64,
    seconds: f64,
}

/// The handover totals of the running replicas.
async fn handover_totals(bench: &Bench) -> Handovers {
    Handovers {
        sum: bench.metric_sum("catalogsync_shard_handover_duration_seconds_sum", &[]).await,
        count: bench.metric_sum("catalogsync_shard_handover_duration_seconds_count", &[]).await,
    }
}

/// The row of one step.
fn row(
    change: &str,
    moved: &Moved,
    settle: f64,
    before: Handovers,
    after: Handovers,
    unowned: Unowned,
    traffic: Traffic,
) -> RebalanceRow {
    let count = (after.count - before.count).max(0.0);
    let mean = if count > 0.0 { (after.sum - before.sum) / count } else { 0.0 };
    RebalanceRow {
        change: change.into(),
        shards_moved: gauge(moved.shards),
        skrs_moved: gauge(moved.skrs),
        settle_seconds: settle,
        handovers: gauge(count),
        handover_mean_seconds: mean,
        max_unowned: gauge(unowned.max),
        unowned_seconds: unowned.seconds,
        traffic,
    }
}

/// A count read from a metric (a float in the exposition).
fn gauge(value: f64) -> u64 {
    value.max(0.0).round() as u64
}

/// Samples the coordinator's unowned-SKR gauge every 100 ms until `replicas` replicas hold all
/// shards between them and nothing is unowned.
async fn watch_until_settled(bench: &Bench, replicas: usize, timeout: Duration) -> Result<Unowned> {
    let deadline = Instant::now() + timeout;
    let mut unowned_total = Unowned { max: 0.0, seconds: 0.0 };
    let tick = Duration::from_millis(100);
    loop {
        let mut held = Vec::new();
        let mut unowned = 0.0;
        for r in bench.replicas.values() {
            held.push(metric(r.http_port, "catalogsync_shards_held", &[]).await);
            unowned += metric(r.http_port, "catalogsync_unowned_clusters", &[]).await;
        }
        unowned_total.max = unowned_total.max.max(unowned);
        if unowned > 0.0 {
            unowned_total.seconds += tick.as_secs_f64();
        }
        let total: f64 = held.iter().sum();
        let balanced = held.iter().all(|h| *h >= (SHARDS / replicas) as f64);
        if held.len() == replicas && total >= SHARDS as f64 && balanced && unowned == 0.0 {
            return Ok(unowned_total);
        }
        if Instant::now() > deadline {
            bail!("shards did not settle on {replicas} replicas within {}s: held {held:?}", timeout.as_secs());
        }
        tokio::time::sleep(tick).await;
    }
}
