//! Sharded replicas as separate processes against real apiservers: 40 Kymas over three SKR
//! control planes, each Kyma with its own client identity, replicas under the ServiceAccount
//! identity and RBAC of `deploy/rbac/`. The invariant checker reads the SKR audit logs and
//! the Lease history from the KCP audit log.

use std::time::{Duration, Instant};

use catalogsync::api::member_lease_name;
use catalogsync::sharding::ring::shard_of;
use catalogsync::sharding::table;
use testenv::fleet::{Fleet, holders};
use testenv::scenario::{mrm, mt};
use testenv::sharded::{CONVERGE, LEASE_DURATION, ShardedFleet};

const SHARDS: u32 = 32;
const KYMAS: usize = 40;
const PROMPT: Duration = Duration::from_secs(30);

/// The tests of this file run one at a time: each runs several replicas on two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fleet(prefix: &str) -> ShardedFleet {
    let env = testenv::env();
    ShardedFleet::new(prefix, &[&env.skr_a, &env.skr_b, skr_c()], KYMAS, SHARDS, PROMPT).await
}

/// A third SKR control plane, shared by the tests of this file.
fn skr_c() -> &'static testenv::ControlPlane {
    static SKR_C: std::sync::OnceLock<testenv::ControlPlane> = std::sync::OnceLock::new();
    SKR_C.get_or_init(|| {
        testenv::block_on_own_thread(async { testenv::env().start_extra_skr("skr-c").await }).expect("skr-c")
    })
}

async fn handovers_within(f: &Fleet, replicas: &[&str], bound: &str) -> (f64, f64) {
    let (mut total, mut within) = (0.0, 0.0);
    for r in replicas {
        total += f.metric(r, "catalogsync_shard_handover_duration_seconds_count", &[]).await;
        within +=
            f.metric(r, "catalogsync_shard_handover_duration_seconds_bucket", &[&format!("le=\"{bound}\"")]).await;
    }
    (total, within)
}

#[tokio::test]
async fn three_replicas_converge_and_each_skr_has_one_writer() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("shard3").await;
    for r in ["r1", "r2", "r3"] {
        f.spawn(r);
    }
    let t = f.await_converged(&["r1", "r2", "r3"]).await;
    f.await_all_synced().await;
    eprintln!("{}", table::render(&t));
    f.scenario
        .apply_catalog(&[mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.1.0")])])
        .await
        .expect("change");
    f.await_everywhere("keda-1.1.0").await;

    let report = f.check(true);
    // Every Kyma's SKR identity was written only by the replica holding its shard (a Kyma
    // whose SKR another Kyma had already brought up to date needed no write at all).
    let h = holders(&t);
    let mut written = 0;
    for k in &f.kymas {
        let writers = report.writers_per_user.get(&k.user).cloned().unwrap_or_default();
        let owner = &h[&shard_of(f.ns(), &k.name, SHARDS)];
        assert!(writers.iter().all(|w| w == owner), "writers of {}: {writers:?}, owner {owner}", k.name);
        written += usize::from(!writers.is_empty());
    }
    assert!(written >= 3, "only {written} Kymas wrote to their SKR");
    for r in ["r1", "r2", "r3"] {
        let owned = f.metric(r, "catalogsync_shard_owned_clusters", &[]).await;
        assert!(owned > 0.0, "{r} owns no SKR");
    }
}

#[tokio::test]
async fn scale_out_and_in_moves_only_the_moved_shards() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("scale").await;
    for r in ["r1", "r2", "r3"] {
        f.spawn(r);
    }
    let three = holders(&f.await_converged(&["r1", "r2", "r3"]).await);
    f.await_all_synced().await;

    // 3 -> 4: only shards going to the new replica move; a change made meanwhile arrives.
    f.spawn("r4");
    f.scenario
        .apply_catalog(&[mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.1.0")])])
        .await
        .expect("change");
    let four = holders(&f.await_converged(&["r1", "r2", "r3", "r4"]).await);
    let moved_out: Vec<u32> = (0..SHARDS).filter(|s| three[s] != four[s]).collect();
    assert!(moved_out.iter().all(|s| four[s] == "r4"), "shards moved between staying replicas: {moved_out:?}");
    let bound = (1.1 * f64::from(SHARDS) / 4.0).ceil() as usize;
    assert!(moved_out.len() <= bound, "3 -> 4 moved {} shards, bound {bound}", moved_out.len());
    f.await_everywhere("keda-1.1.0").await;

    // 4 -> 3 by SIGTERM: the leaving replica hands over at once, exits 0.
    let started = Instant::now();
    let status = f.terminate("r4").await.expect("terminate r4");
    assert!(status.success(), "r4 exited with {status}");
    f.scenario
        .apply_catalog(&[mt("keda", "1.2.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.2.0")])])
        .await
        .expect("change");
    let back = holders(&f.await_converged(&["r1", "r2", "r3"]).await);
    let scale_in = started.elapsed();
    // The leaving replica marked its member Lease as left rather than deleting it, so no
    // coordinator can miss that it left; the coordinator deletes it a lease duration later.
    testenv::await_condition(LEASE_DURATION + PROMPT, "the coordinator to delete r4's member Lease", || async {
        matches!(f.leases().get_opt(&member_lease_name("r4")).await, Ok(None))
    })
    .await;
    let moved_in: Vec<u32> = (0..SHARDS).filter(|s| four[s] != back[s]).collect();
    assert!(moved_in.iter().all(|s| four[s] == "r4"), "shards moved between staying replicas: {moved_in:?}");
    f.await_everywhere("keda-1.2.0").await;
    let (total, within) = handovers_within(&f, &["r1", "r2", "r3"], "2").await;
    let report = f.check(true);
    // A graceful handover, from the old holder's release to the new holder's claim, read from
    // the Lease history. (The metric also counts the drain before the release, which waits
    // for in-flight syncs and so depends on the machine's load: reported, not asserted.)
    let mut gaps = Vec::new();
    for timeline in report.timelines.values() {
        // (previous holder, when it released)
        let mut released: Option<(&str, k8s_openapi::jiff::Timestamp)> = None;
        let mut holder = "";
        for change in timeline {
            match (holder.is_empty(), change.holder.is_empty()) {
                (false, true) => released = Some((holder, change.time)),
                (true, false) => {
                    if let Some((_, at)) = released.take().filter(|(previous, _)| *previous != change.holder) {
                        gaps.push(change.time.duration_since(at).as_secs_f64());
                    }
                }
                _ => {}
            }
            holder = &change.holder;
        }
    }
    let longest_gap = gaps.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "moved 3->4: {} shards, 4->3: {} shards; scale-in converged after {:.1}s; {} graceful handovers, \
         release -> claim at most {longest_gap:.3}s; desired -> claim within 2s: {within}/{total}; \
         longest unowned window: {:?}",
        moved_out.len(),
        moved_in.len(),
        scale_in.as_secs_f64(),
        gaps.len(),
        report.longest_unowned
    );
    assert!(gaps.len() >= moved_out.len() + moved_in.len(), "handovers missing from the Lease history: {gaps:?}");
    assert!(longest_gap < 2.0, "a graceful handover took {longest_gap:.3}s from release to claim");
}

#[tokio::test]
async fn killed_replica_is_taken_over_within_the_lease_duration() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("kill").await;
    for r in ["r1", "r2", "r3"] {
        f.spawn(r);
    }
    let before = holders(&f.await_converged(&["r1", "r2", "r3"]).await);
    f.await_all_synced().await;
    let killed = Instant::now();
    f.kill("r2");
    let after = holders(&f.await_converged(&["r1", "r3"]).await);
    let failover = killed.elapsed();
    eprintln!("failover after SIGKILL: {:.1}s", failover.as_secs_f64());
    assert!(failover <= LEASE_DURATION + Duration::from_secs(5), "takeover took {failover:?}");
    for s in 0..SHARDS {
        if before[&s] != "r2" {
            assert_eq!(before[&s], after[&s], "shard {s} moved although its holder survived");
        }
    }
    f.scenario
        .apply_catalog(&[mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.1.0")])])
        .await
        .expect("change");
    f.await_everywhere("keda-1.1.0").await;
    f.check(true);
}

#[tokio::test]
async fn new_coordinator_moves_nothing_well_placed() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("coord").await;
    for r in ["r1", "r2", "r3"] {
        f.spawn(r);
    }
    let t = f.await_converged(&["r1", "r2", "r3"]).await;
    let coordinator = t.coordinator.clone();
    assert!(["r1", "r2", "r3"].contains(&coordinator.as_str()), "coordinator {coordinator:?}");
    let before = holders(&t);
    let rest: Vec<&str> = ["r1", "r2", "r3"].into_iter().filter(|r| *r != coordinator).collect();
    let mut assignments_before = 0.0;
    for r in &rest {
        assignments_before += f.metric(r, "catalogsync_shard_assignments_total", &[]).await;
    }
    f.kill(&coordinator);
    let after = f.await_converged(&rest).await;
    assert!(rest.contains(&after.coordinator.as_str()), "no new coordinator: {:?}", after.coordinator);
    let after = holders(&after);
    let moved: Vec<u32> = (0..SHARDS).filter(|s| before[s] != after[s]).collect();
    assert!(moved.iter().all(|s| before[s] == coordinator), "well-placed shards moved: {moved:?}");
    let mut assignments_after = 0.0;
    for r in &rest {
        assignments_after += f.metric(r, "catalogsync_shard_assignments_total", &[]).await;
    }
    let new_assignments = assignments_after - assignments_before;
    eprintln!("the new coordinator wrote {new_assignments} assignments; {} shards moved", moved.len());
    // It re-assigns the dead replica's shards and nothing else.
    assert!(
        new_assignments <= moved.len() as f64,
        "the new coordinator wrote {new_assignments} assignments for {} moved shards",
        moved.len()
    );
    f.check(true);
}

#[tokio::test]
async fn replica_cut_from_the_kcp_fences_itself_before_its_shards_move() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("cut").await;
    f.spawn("r1");
    f.spawn("r2");
    let args = f.sharding_args(SHARDS);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    f.spawn_replica_via_proxy("r3", &args).expect("r3 via proxy");
    f.await_converged(&["r1", "r2", "r3"]).await;
    f.await_all_synced().await;

    f.proxy("r3").expect("proxy").cut();
    let cut = Instant::now();
    // Changes during the cut keep r3 busy writing until it fences itself.
    f.scenario
        .apply_catalog(&[mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.0.0"), ("fast", "1.1.0")])])
        .await
        .expect("change");
    f.await_converged(&["r1", "r2"]).await;
    eprintln!("shards of the cut replica moved after {:.1}s", cut.elapsed().as_secs_f64());
    f.await_everywhere("keda-1.1.0").await;
    testenv::await_condition(PROMPT, "r3 reports itself fenced", || async {
        f.metric("r3", "catalogsync_member_fenced", &[]).await == 1.0
    })
    .await;

    f.proxy("r3").expect("proxy").heal();
    f.await_converged(&["r1", "r2", "r3"]).await;
    let report = f.check(true);
    eprintln!("longest unowned window: {:?}", report.longest_unowned);
}

#[tokio::test]
async fn rolling_restart_loses_no_catalog_change() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("roll").await;
    for r in ["a1", "a2", "a3"] {
        f.spawn(r);
    }
    f.await_converged(&["a1", "a2", "a3"]).await;
    f.await_all_synced().await;
    // Like a Deployment rollout: each old pod is replaced by a new one with a new name,
    // while the catalog keeps changing.
    let steps = [("a1", "b1", "1.1.0"), ("a2", "b2", "1.2.0"), ("a3", "b3", "1.3.0")];
    let mut live = vec!["a1", "a2", "a3"];
    for (old, new, version) in steps {
        f.spawn(new);
        let status = f.terminate(old).await.expect("terminate");
        assert!(status.success(), "{old} exited with {status}");
        f.scenario
            .apply_catalog(&[mt("keda", version), mrm("keda", &[("regular", "1.0.0"), ("fast", version)])])
            .await
            .expect("change");
        live.retain(|r| *r != old);
        live.push(new);
        f.await_converged(&live).await;
    }
    f.await_everywhere("keda-1.3.0").await;
    for k in &f.kymas {
        f.scenario.await_condition(&k.name, "True", "CatalogSynced", CONVERGE).await;
    }
    f.check(true);
}
