//! One writer per SKR through operator mistakes and KCP trouble, not only clean crashes:
//! two processes under one identity, member and shard Leases deleted or edited by hand, a
//! replica whose wall clock is off, and every replica cut from the KCP at once. Replicas run
//! as processes against real apiservers; the audit-log invariant checker judges every SKR
//! write, and each test also checks that catalog changes made during the fault reach every
//! SKR.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use catalogsync::api::{
    CONFIG_LEASE, MEMBER_LEFT_ANNOTATION, MEMBER_NONCE_ANNOTATION, member_lease_name, shard_lease_name,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use testenv::fleet::{Fleet, holders};
use testenv::invariants::{InvariantOptions, SkrWrite, overlapping_writers, read_skr_writes};
use testenv::scenario::{mrm, mt};
use testenv::sharded::{CONVERGE, LEASE_DURATION, RETRY_PERIOD, ShardedFleet};

const SHARDS: u32 = 8;
const KYMAS: usize = 16;
const PROMPT: Duration = Duration::from_secs(40);

/// The tests of this file run one at a time: each runs several replicas on two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fleet(prefix: &str) -> ShardedFleet {
    let env = testenv::env();
    ShardedFleet::new(prefix, &[&env.skr_a, &env.skr_b], KYMAS, SHARDS, PROMPT).await
}

/// [`ShardedFleet::check`], and no shard unowned for longer than a takeover takes.
fn check(f: &ShardedFleet) -> testenv::invariants::InvariantReport {
    let report = f.check(false);
    let bound = LEASE_DURATION + Duration::from_secs(5);
    assert!(report.longest_unowned <= bound, "a shard was unowned for {:?} (bound {bound:?})", report.longest_unowned);
    report
}

/// Waits until replica `key` reports through the gauge `metric` that it is kept out, and
/// checks that it is not ready and its log says `why`.
async fn await_kept_out(f: &Fleet, key: &str, metric: &str, why: &str) {
    testenv::await_condition(PROMPT, &format!("{key} to report {metric}"), || async {
        f.metric(key, metric, &[]).await == 1.0
    })
    .await;
    let (code, body) = f.http_get(key, "/readyz").await.expect("readyz");
    assert_eq!(code, 503, "{key} must not be ready: {body}");
    assert!(f.log(key).contains(why), "the log of {key} does not say: {why}");
}

/// A second process with the identity of a running replica stays fenced and not ready,
/// writes nothing while the first runs, and takes over only after the first is gone.
#[tokio::test]
async fn two_processes_with_one_identity_never_write_together() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("twin").await;
    f.spawn("r1");
    f.await_converged(&["r1"]).await;
    f.await_all_synced().await;

    let args = f.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    f.spawn_replica_as("r1-twin", "r1", &args, &[]).expect("spawn the twin");
    await_kept_out(
        &f,
        "r1-twin",
        "catalogsync_member_identity_conflict",
        "Another process renews the member Lease of this identity",
    )
    .await;
    let took = f.release_everywhere("1.1.0").await;
    eprintln!("a release with the twin running reached every SKR in {:.1}s", took.as_secs_f64());
    assert_eq!(
        f.metric("r1", "catalogsync_member_identity_conflict", &[]).await,
        0.0,
        "the first process is unaffected"
    );

    // The first process dies; the twin takes over once it saw the member Lease unchanged for
    // a lease duration, and waits out the old process's requests before writing.
    let killed = Instant::now();
    f.kill("r1");
    let took = f.release_everywhere("1.2.0").await;
    eprintln!("after the first process was killed, a release reached every SKR in {:.1}s", took.as_secs_f64());
    // The twin counts a lease duration from the last renewal it saw, which came at most a
    // retry period before the kill.
    assert!(
        killed.elapsed() >= LEASE_DURATION - RETRY_PERIOD,
        "the twin cannot have taken over before a lease duration after the first process's last renewal"
    );
    f.await_converged(&["r1"]).await;
    assert_eq!(f.metric("r1-twin", "catalogsync_member_identity_conflict", &[]).await, 0.0);

    // The two processes share an identity, so the checker sees one replica; the SKR audit
    // logs tell them apart by the process nonce in the user agent.
    check(&f);
    let env = testenv::env();
    let mut processes: BTreeMap<String, (Timestamp, Timestamp)> = BTreeMap::new();
    for skr in [&env.skr_a, &env.skr_b] {
        let events = skr.read_audit_events();
        let writes = events.iter().filter(|e| e.is_write() && e.namespace() == Some(f.scenario.sync_ns.as_str()));
        for e in writes {
            let Some(process) = e.user_agent.as_deref().and_then(|ua| ua.split("process/").nth(1)) else { continue };
            let received: Timestamp = e.request_received_timestamp.parse().expect("a timestamp");
            let done: Timestamp = e.stage_timestamp.parse().expect("a timestamp");
            let span = processes.entry(process.to_owned()).or_insert((received, done));
            span.0 = span.0.min(received);
            span.1 = span.1.max(done);
        }
    }
    eprintln!("SKR writes per process (first received, last completed): {processes:?}");
    assert_eq!(processes.len(), 2, "both processes wrote, one after the other: {processes:?}");
    let mut spans: Vec<(Timestamp, Timestamp)> = processes.into_values().collect();
    spans.sort();
    assert!(spans[0].1 < spans[1].0, "the twin wrote while the first process still did: {spans:?}");
}

/// A member Lease deleted by hand moves no shard: its holder counts as alive for a lease
/// duration after the deletion was seen, and recreates the Lease at its next renewal.
#[tokio::test]
async fn a_member_lease_deleted_by_hand_moves_nothing() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("member-del").await;
    for r in ["r1", "r2"] {
        f.spawn(r);
    }
    let before = holders(&f.await_converged(&["r1", "r2"]).await);
    f.await_all_synced().await;
    let forced = f.metric_sum(&["r1", "r2"], "catalogsync_shard_forced_takeovers_total").await;

    for round in 0..3 {
        f.leases().delete(&member_lease_name("r1"), &DeleteParams::default()).await.expect("delete member Lease");
        tokio::time::sleep(LEASE_DURATION / 2).await;
        eprintln!("round {round}: member Lease of r1 deleted");
    }
    let took = f.release_everywhere("1.1.0").await;
    eprintln!("a release during the deletions reached every SKR in {:.1}s", took.as_secs_f64());
    tokio::time::sleep(LEASE_DURATION * 2).await;

    let after = holders(&f.table().await);
    assert_eq!(before, after, "shards moved after member Lease deletions");
    let forced_after = f.metric_sum(&["r1", "r2"], "catalogsync_shard_forced_takeovers_total").await;
    assert_eq!(forced_after, forced, "a shard was force-released");
    check(&f);
}

/// A member Lease marked as left by hand while its process lives moves nothing: the
/// coordinator believes a left mark only from a member that holds no shard, and the live
/// process takes the mark off again at its next renewal. No SKR has two writers meanwhile.
#[tokio::test]
async fn a_member_lease_marked_left_by_hand_moves_nothing() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("member-left").await;
    for r in ["r1", "r2"] {
        f.spawn(r);
    }
    let before = holders(&f.await_converged(&["r1", "r2"]).await);
    f.await_all_synced().await;

    for round in 0..3 {
        let lease = f.leases().get(&member_lease_name("r1")).await.expect("member Lease");
        let nonce = lease.metadata.annotations.as_ref().and_then(|a| a.get(MEMBER_NONCE_ANNOTATION)).cloned();
        let nonce = nonce.expect("the Lease names its process");
        let patch = serde_json::json!({"metadata": {"annotations": {MEMBER_LEFT_ANNOTATION: nonce}}});
        f.leases()
            .patch(&member_lease_name("r1"), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("mark the member Lease as left");
        tokio::time::sleep(LEASE_DURATION / 2).await;
        eprintln!("round {round}: member Lease of r1 marked as left by hand");
    }
    let took = f.release_everywhere("1.1.0").await;
    eprintln!("a release during the marks reached every SKR in {:.1}s", took.as_secs_f64());
    tokio::time::sleep(LEASE_DURATION).await;

    let after = holders(&f.table().await);
    assert_eq!(before, after, "shards moved after the member Lease was marked as left by hand");
    assert!(f.log("r1").contains("marked as left by someone else"), "r1 did not notice the mark");
    let report = check(&f);
    eprintln!("double writers: {}, SKR writes checked: {}", report.violations.len(), report.skr_writes_checked);
}

/// A shadow replica started in the Lease namespace of an active one (an overlay applied
/// to the wrong namespace, or a cutover's rolling update) holds no shard: it stays fenced,
/// says why, and every Kyma is synced by the active replica; once the active replica is
/// gone it takes part again.
#[tokio::test]
async fn a_shadow_replica_beside_an_active_one_holds_no_shard() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("mixed-mode").await;
    f.spawn("r1");
    f.await_converged(&["r1"]).await;
    let args = f.args();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend(["--mode", "shadow"]);
    f.spawn_replica("s1", &args).expect("spawn the shadow replica");
    testenv::await_condition(PROMPT, "the shadow replica to say why it stays out", || async {
        f.log("s1").contains("An active replica lives in this Lease namespace")
    })
    .await;
    let took = f.release_everywhere("1.1.0").await;
    eprintln!("a release with a shadow replica beside reached every SKR in {:.1}s", took.as_secs_f64());
    let table = f.await_converged(&["r1"]).await;
    assert!(holders(&table).values().all(|h| h == "r1"), "the shadow replica holds shards: {table:?}");
    let (code, _) = f.http_get("s1", "/readyz").await.expect("readyz");
    assert_eq!(code, 503, "the shadow replica must not be ready beside an active one");

    // The active replica leaves: the shadow replica takes part again.
    f.terminate("r1").await.expect("stop r1");
    f.await_converged(&["s1"]).await;
    check(&f);
}

/// Shard Leases deleted, handed to another replica, or released by hand: the old holder stops
/// at once, the new one writes only after the old one's requests ended, and every shard
/// ends up held again.
#[tokio::test]
async fn shard_leases_edited_by_hand_keep_one_writer() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("shard-edit").await;
    for r in ["r1", "r2"] {
        f.spawn(r);
    }
    let t = f.await_converged(&["r1", "r2"]).await;
    f.await_all_synced().await;
    let of_r1: Vec<u32> = t.rows.iter().filter(|r| r.holder == "r1").map(|r| r.shard).collect();
    assert!(of_r1.len() >= 3, "r1 holds {of_r1:?}");
    let (handed, deleted, unheld) = (of_r1[0], of_r1[1], of_r1[2]);
    let api = f.leases();
    let name = shard_lease_name;

    // A release in flight while the Leases are edited keeps the holders busy writing.
    f.scenario.apply_catalog(&[mt("keda", "1.1.0"), mrm("keda", &[("regular", "1.1.0")])]).await.expect("change");
    let merge = |holder: &str| Patch::Merge(serde_json::json!({"spec": {"holderIdentity": holder}}));
    api.patch(&name(handed), &PatchParams::default(), &merge("r2")).await.expect("hand a shard to r2");
    api.delete(&name(deleted), &DeleteParams::default()).await.expect("delete a shard Lease");
    api.patch(&name(unheld), &PatchParams::default(), &merge("")).await.expect("release a shard by hand");
    let edited = Instant::now();

    let took = f.release_everywhere("1.2.0").await;
    eprintln!("a release after the edits reached every SKR in {:.1}s", took.as_secs_f64());
    f.await_converged(&["r1", "r2"]).await;
    eprintln!("all shards held again {:.1}s after the edits", edited.elapsed().as_secs_f64());
    f.await_all_synced().await;
    let report = check(&f);
    eprintln!("longest unowned window: {:.1}s", report.longest_unowned.as_secs_f64());
}

/// A replica whose wall clock is two minutes ahead keeps its shards, and takes nobody's:
/// liveness is judged by when Lease changes were observed, not by comparing clocks.
#[tokio::test]
async fn a_skewed_clock_forces_no_takeover() {
    let _serial = SERIAL.lock().await;
    let faketime = testenv::process::libfaketime().expect("libfaketime (hack/test.sh installs it)");
    let mut f = fleet("skew").await;
    let args = f.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let preload = faketime.display().to_string();
    let skewed = [("LD_PRELOAD", preload.as_str()), ("FAKETIME", "+120"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")];
    f.spawn_replica_as("ahead", "ahead", &args, &skewed).expect("spawn the skewed replica");
    f.spawn("r2");
    let before = holders(&f.await_converged(&["ahead", "r2"]).await);
    f.await_all_synced().await;
    // The skew is real: the replica writes renew times two minutes ahead of the KCP's clock.
    let member = f.leases().get(&member_lease_name("ahead")).await.expect("member Lease of the skewed replica");
    let renewed = member.spec.and_then(|s| s.renew_time).expect("a renew time").0;
    let ahead = renewed.duration_since(Timestamp::now()).as_secs_f64();
    assert!(ahead > 100.0, "libfaketime did not move the replica's clock: its renew time is {ahead:.0}s ahead");
    let took = f.release_everywhere("1.1.0").await;
    eprintln!("a release with a skewed replica reached every SKR in {:.1}s", took.as_secs_f64());
    tokio::time::sleep(LEASE_DURATION * 3).await;

    assert_eq!(holders(&f.table().await), before, "shards moved");
    let forced = f.metric_sum(&["ahead", "r2"], "catalogsync_shard_forced_takeovers_total").await;
    assert_eq!(forced, 0.0, "a live replica's shards were force-released");
    let coordinators = f.metric_sum(&["ahead", "r2"], "catalogsync_is_coordinator").await;
    assert_eq!(coordinators, 1.0, "exactly one coordinator");
    check(&f);
}

/// Every replica cut from the KCP for longer than the lease duration, then healed: nobody
/// writes while fenced, and no shard moves.
#[tokio::test]
async fn a_kcp_outage_of_every_replica_moves_no_shard() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("outage").await;
    let args = f.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for r in ["r1", "r2", "r3"] {
        f.spawn_replica_via_proxy(r, &args).expect("spawn via proxy");
    }
    let before = holders(&f.await_converged(&["r1", "r2", "r3"]).await);
    f.await_all_synced().await;
    let assignments = f.metric_sum(&["r1", "r2", "r3"], "catalogsync_shard_assignments_total").await;

    for r in ["r1", "r2", "r3"] {
        f.proxy(r).expect("proxy").cut();
    }
    let cut = Instant::now();
    testenv::await_condition(PROMPT, "every replica to fence itself", || async {
        let mut fenced = 0.0;
        for r in ["r1", "r2", "r3"] {
            fenced += f.metric(r, "catalogsync_member_fenced", &[]).await;
        }
        fenced == 3.0
    })
    .await;
    tokio::time::sleep((LEASE_DURATION * 2).saturating_sub(cut.elapsed())).await;
    for r in ["r1", "r2", "r3"] {
        f.proxy(r).expect("proxy").heal();
    }
    eprintln!("KCP cut for {:.1}s, healed", cut.elapsed().as_secs_f64());

    let took = f.release_everywhere("1.1.0").await;
    eprintln!("a release after the outage reached every SKR in {:.1}s", took.as_secs_f64());
    let after = holders(&f.await_converged(&["r1", "r2", "r3"]).await);
    let moved = before.iter().filter(|(s, h)| after.get(s) != Some(h)).count();
    let assigned = f.metric_sum(&["r1", "r2", "r3"], "catalogsync_shard_assignments_total").await - assignments;
    eprintln!("after the outage: {moved} shards moved, {assigned} assignments");
    assert_eq!(moved, 0, "shards moved: before {before:?}, after {after:?}");
    assert_eq!(assigned, 0.0, "the coordinator reassigned shards after the outage");
    let report = check(&f);
    eprintln!("longest unowned window: {:.1}s", report.longest_unowned.as_secs_f64());
}

/// KCP traffic stalled (connections held open, nothing answered) for one replica, then for
/// all: every KCP request is cut off at `--kcp-request-timeout`, so the member loop keeps
/// trying (its failed renewals count up), the replica fences itself and is not ready; when
/// the traffic flows again it renews and rejoins. No double writer throughout.
#[tokio::test]
async fn a_stalled_kcp_hangs_no_loop() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("stall").await;
    let mut args = f.args();
    args.extend(["--kcp-request-timeout", "1s"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for r in ["r1", "r2"] {
        f.spawn_replica_via_proxy(r, &args).expect("spawn via proxy");
    }
    f.await_converged(&["r1", "r2"]).await;
    f.await_all_synced().await;

    // One replica stalled: it fences itself, keeps renewing in vain, and is not ready.
    let errors = f.metric("r2", "catalogsync_member_renewals_total", &["result=\"error\""]).await;
    f.proxy("r2").expect("proxy").stall();
    testenv::await_condition(PROMPT, "r2 to fence itself", || async {
        f.metric("r2", "catalogsync_member_fenced", &[]).await == 1.0
    })
    .await;
    testenv::await_condition(PROMPT, "r2's failed renewals to keep counting", || async {
        f.metric("r2", "catalogsync_member_renewals_total", &["result=\"error\""]).await >= errors + 3.0
    })
    .await;
    let (code, _) = f.http_get("r2", "/readyz").await.expect("readyz");
    assert_eq!(code, 503, "a fenced replica is not ready");
    let (code, body) = f.http_get("r2", "/livez").await.expect("livez");
    assert_eq!(code, 200, "a stalled KCP must not make the replica restart: {body}");
    f.await_converged(&["r1"]).await;
    let took = f.release_everywhere("1.1.0").await;
    eprintln!("with r2 stalled, a release reached every SKR in {:.1}s", took.as_secs_f64());
    f.proxy("r2").expect("proxy").heal();
    testenv::await_condition(PROMPT, "r2 to be ready again", || async {
        matches!(f.http_get("r2", "/readyz").await, Ok((200, _)))
    })
    .await;
    f.await_converged(&["r1", "r2"]).await;

    // Everyone stalled, then healed: nothing moves.
    let before = holders(&f.table().await);
    for r in ["r1", "r2"] {
        f.proxy(r).expect("proxy").stall();
    }
    testenv::await_condition(PROMPT, "both replicas to fence themselves", || async {
        f.metric("r1", "catalogsync_member_fenced", &[]).await + f.metric("r2", "catalogsync_member_fenced", &[]).await
            == 2.0
    })
    .await;
    tokio::time::sleep(LEASE_DURATION).await;
    for r in ["r1", "r2"] {
        f.proxy(r).expect("proxy").heal();
    }
    let took = f.release_everywhere("1.2.0").await;
    eprintln!("after the whole KCP stalled, a release reached every SKR in {:.1}s", took.as_secs_f64());
    let after = holders(&f.await_converged(&["r1", "r2"]).await);
    let moved = before.iter().filter(|(s, h)| after.get(s) != Some(h)).count();
    eprintln!("shards moved by the stall of both: {moved}");
    assert_eq!(moved, 0, "shards moved: before {before:?}, after {after:?}");
    let report = check(&f);
    eprintln!("longest unowned window: {:.1}s", report.longest_unowned.as_secs_f64());
}

/// SKR writes by two different replicas as one SKR user whose intervals (received to
/// completed) overlap: the double-writer check that needs no shard mapping, for tests in
/// which the shard count changes.
fn overlapping_writes(f: &Fleet) -> Vec<String> {
    let input = f.invariant_input(|_, _| 0, InvariantOptions::default());
    let mut writes: Vec<SkrWrite> = Vec::new();
    for log in &input.skr_audit_logs {
        writes.extend(read_skr_writes(log).expect("read an SKR audit log"));
    }
    let mut by_user: BTreeMap<&str, Vec<(u32, &SkrWrite, &String)>> = BTreeMap::new();
    for w in &writes {
        if let (Some(replica), true) = (&w.replica, input.shard_of_user.contains_key(&w.user)) {
            by_user.entry(w.user.as_str()).or_default().push((0, w, replica));
        }
    }
    by_user.values_mut().flat_map(|w| overlapping_writers(w)).collect()
}

/// Changing `--shards` by the documented procedure: record the new count in the config Lease,
/// then run replicas with it. A replica with another count than the recorded one stays
/// fenced and not ready; the old replicas fence themselves once the count changed; the new
/// ones take over every Kyma; no SKR ever has two writers at once.
#[tokio::test]
async fn changing_the_shard_count_never_has_two_writers() {
    let _serial = SERIAL.lock().await;
    let mut f = fleet("reshard").await;
    for r in ["r1", "r2"] {
        f.spawn(r);
    }
    f.await_converged(&["r1", "r2"]).await;
    f.await_all_synced().await;

    // A replica with another --shards (a rolling update that changes it) stays out.
    let four = f.sharding_args(4);
    let four: Vec<&str> = four.iter().map(String::as_str).collect();
    f.spawn_replica_as("new", "new", &four, &[]).expect("spawn a replica with 4 shards");
    await_kept_out(
        &f,
        "new",
        "catalogsync_shard_count_mismatch",
        "differs from the shard count recorded in the config Lease",
    )
    .await;
    let took = f.release_everywhere("1.1.0").await;
    eprintln!("with a mismatched replica running, a release reached every SKR in {:.1}s", took.as_secs_f64());

    // The procedure: record the new count; the old replicas fence themselves, the new one
    // takes over once their member Leases count as expired.
    let changed = Instant::now();
    let patch = serde_json::json!({"metadata": {"annotations": {"catalogsync.kyma-project.io/shards": "4"}}});
    f.leases().patch(CONFIG_LEASE, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("record 4");
    for r in ["r1", "r2"] {
        testenv::await_condition(PROMPT, &format!("{r} to fence itself"), || async {
            f.metric(r, "catalogsync_member_fenced", &[]).await == 1.0
        })
        .await;
    }
    testenv::await_condition(CONVERGE, "the 4-shard replica to hold all 4 shards", || async {
        let t = f.shard_table().await.ok()?;
        (t.rows.len() == 4 && t.rows.iter().all(|r| r.holder == "new" && r.state == "held")).then_some(())
    })
    .await;
    eprintln!("the new shard count took over {:.1}s after it was recorded", changed.elapsed().as_secs_f64());
    let took = f.release_everywhere("1.2.0").await;
    eprintln!("after the change, a release reached every SKR in {:.1}s", took.as_secs_f64());
    f.await_all_synced().await;
    for r in ["r1", "r2"] {
        let status = f.terminate(r).await.expect("terminate an old replica");
        assert!(status.success(), "{r} exited with {status}");
    }
    let overlaps = overlapping_writes(&f);
    assert!(overlaps.is_empty(), "two writers at once:\n{}", overlaps.join("\n"));
}
