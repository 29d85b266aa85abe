//! The drift bound (docs/architecture.md, "The drift bound"): whatever a replica remembers, or
//! recalls from a shard record, every managed thing in an SKR (its copies, both catalog CRDs,
//! the sync namespace and its managed-by label) is verified at least once per resync period
//! and repaired when it differs: while the replica runs, after a graceful stop (the shard
//! record in use), after a crash, after the Kyma's shard moved to another replica, and with a
//! forged shard record. The sync namespace is also deleted outright in each of these
//! situations, with a real namespace controller (kube-controller-manager running
//! `namespace-controller` alone) finalizing it as in a cluster. Real apiservers, catalogsync
//! as a process; each repair is timed from the drift, the restarted replica being ready or the
//! handover (whichever is later), and its cost in SKR requests
//! (`catalogsync_skr_requests_total` of the repairing replica, by verb) is printed as one
//! `SUMMARY` line per situation.
//!
//! The CRDs are cluster-scoped in the SKR and every catalogsync of this binary verifies them
//! in the SKR it syncs, so the tests of this file run one at a time ([`SERIAL`]), each with
//! one scenario, and edit only `skr_b`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use catalogsync::api::shard_lease_name;
use catalogsync::sharding::ring::{assign, shard_of};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use testenv::controllers::ControllerManager;
use testenv::drift::{self, Drift, SkrRequests, SkrView, ZERO_DIGEST};
use testenv::fleet::{Fleet, metric_sum};
use testenv::scenario::{MT, Scenario, mrm, mt};

/// The resync period of these tests (`RESYNC_FLAG`).
const RESYNC: Duration = Duration::from_secs(10);
/// `--resync-period` of every catalogsync here: [`RESYNC`].
const RESYNC_FLAG: [&str; 2] = ["--resync-period", "10s"];

/// What a repair may take: one resync period, its jitter (at most 10%), and the time a sync
/// and the test's polling take on a busy machine.
const BOUND: Duration = Duration::from_secs(10 + 1 + 5);

/// A first sync after a start must be done well within this.
const PROMPT: Duration = Duration::from_secs(20);

/// How long a restart after a crash may wait before it takes its shards: the crashed
/// process's member Lease (8 s in a scenario) must be seen unchanged for a lease duration.
const LEASE_WAIT: Duration = Duration::from_secs(8 * 2);

/// How long the namespace controller may take to finalize a deleted namespace.
const NS_GONE: Duration = Duration::from_secs(30);

/// `--shards` of every catalogsync here (a scenario's default).
const SHARDS: u32 = 4;

/// The Kyma of the single-replica scenarios, and its copies.
const KYMA: &str = "k";
const MT_COPY: &str = "keda-1.0.0";

/// The tests of this file run one at a time (see the module docs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn catalog() -> Vec<serde_json::Value> {
    vec![mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]
}

/// A scenario with Kyma [`KYMA`] on `skr_b` and catalogsync started and synced.
async fn started(prefix: &str) -> (Scenario, SkrView) {
    let env = testenv::env();
    let mut s = Scenario::new(prefix).await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma(KYMA, &env.skr_b, &[]).await.expect("kyma");
    s.start(&RESYNC_FLAG).expect("start");
    s.await_condition(KYMA, "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(&env.skr_b, MT, &[MT_COPY], PROMPT).await;
    let view = SkrView::new(&env.skr_b, &s.sync_ns);
    assert!(view.repaired(&Drift::Crd).await, "the CRD as catalogsync writes it");
    (s, view)
}

/// Successful syncs of the replica serving HTTP on `port` (0 when it cannot be read).
async fn syncs(port: u16) -> f64 {
    match testenv::http::get_local(port, "/metrics").await {
        Ok((200, body)) => metric_sum(&body, "catalogsync_sync_runs_total", &["result=\"success\""]),
        _ => 0.0,
    }
}

/// Waits until the replica serving HTTP on `port` finished more than `than` successful syncs,
/// so that the requests read next include the whole repairing sync.
async fn await_syncs_above(port: u16, than: f64, what: &str) {
    testenv::await_condition(PROMPT, &format!("{what}: a successful sync after the repair"), || async {
        syncs(port).await > than
    })
    .await;
}

/// The SKR requests of the replica serving HTTP on `port`.
async fn requests(port: u16) -> SkrRequests {
    SkrRequests::read(port).await.expect("read the metrics")
}

/// Waits until the replica serving HTTP on `port` finishes a resync that lists (its list
/// count grows), so that the next one is a resync period away.
async fn await_fresh_resync(port: u16, what: &str) {
    let lists = requests(port).await.verb("list");
    testenv::await_condition(BOUND, &format!("{what}: a resync"), || async {
        requests(port).await.verb("list") > lists
    })
    .await;
}

/// Stops the scenario's catalogsync with SIGTERM: it hands its shards back and writes their
/// records.
async fn stop(s: &mut Scenario) {
    let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");
}

/// Drift repaired while the replica runs, warm and trusting its memory: timed from the
/// drift, costed by the requests of the repairing sync.
async fn repair_while_running(s: &Scenario, view: &SkrView, drifts: &[Drift], since: Instant, situation: &str) {
    let (before, runs) = (requests(s.http_port).await, syncs(s.http_port).await);
    let took = view.await_repaired(drifts, since, BOUND, situation).await;
    await_syncs_above(s.http_port, runs, situation).await;
    let cost = requests(s.http_port).await.since(&before);
    eprintln!("{}", drift::summary(situation, drifts, &took, BOUND, &cost));
    for t in took {
        assert!(t <= BOUND);
    }
}

/// Restarts the scenario's catalogsync and waits until it is ready (it holds its member
/// Lease; after a crash not before `LEASE_WAIT`), then until every drift is repaired:
/// timed from the restart and from ready, costed by everything the new process did.
async fn restart_and_repair(s: &mut Scenario, view: &SkrView, drifts: &[Drift], situation: &str) {
    let restarted = Instant::now();
    s.start(&RESYNC_FLAG).expect("restart");
    s.await_ready(LEASE_WAIT + PROMPT).await;
    let ready = Instant::now();
    let took = view.await_repaired(drifts, ready, BOUND, situation).await;
    await_syncs_above(s.http_port, 0.0, situation).await;
    let cost = requests(s.http_port).await;
    let to_ready = ready - restarted;
    eprintln!(
        "{} (from ready; the restart took {:.1}s to be ready)",
        drift::summary(situation, drifts, &took, BOUND, &cost),
        to_ready.as_secs_f64()
    );
    for t in took {
        assert!(t <= BOUND);
    }
    s.await_condition(KYMA, "True", "CatalogSynced", PROMPT).await;
}

/// The shard record the last graceful stop wrote for [`KYMA`]: its shard and the Kyma's
/// entry. The shard is also checked against the shard function.
async fn record_of_kyma(s: &Scenario) -> (u32, serde_json::Value) {
    let (shard, record) = drift::record_of(&s.kcp, &s.ns, KYMA).await.expect("the shard record of the Kyma");
    assert_eq!(shard, shard_of(&s.ns, KYMA, SHARDS), "the record is in the Kyma's shard");
    let entry = record["skrs"][KYMA].clone();
    eprintln!("shard {shard} record of {KYMA}: {entry}");
    (shard, entry)
}

/// The CRDs and the namespace label drift while the replica runs with a warm memory, after a
/// graceful stop (the shard record is used by the restart), after a crash, and with a forged
/// shard record (digests of all zeros; the real record's digests under a newer access Secret
/// version), a copy edited as well in the last two: each is repaired within one resync period.
#[tokio::test]
async fn crd_and_namespace_drift_is_repaired_within_one_resync_period() {
    let _serial = SERIAL.lock().await;
    let (mut s, view) = started("drift").await;
    // One resync period passes, so the next drift meets a warm replica with a trusted memory.
    tokio::time::sleep(RESYNC).await;

    // While it runs, right after a resync: the next one is a whole period away.
    await_fresh_resync(s.http_port, "running").await;
    let since = Instant::now();
    let drifts = [view.drift_crd().await, view.unlabel_namespace().await];
    repair_while_running(&s, &view, &drifts, since, "drift/running").await;

    // After a graceful stop: the restart uses the shard record the replica wrote.
    stop(&mut s).await;
    let drifts = [view.drift_crd().await, view.unlabel_namespace().await];
    restart_and_repair(&mut s, &view, &drifts, "drift/graceful restart").await;

    // After a crash: the restart finds only the record of the last graceful stop, stale by
    // now, and waits for the crashed process's member Lease to expire before it takes shards.
    s.catalogsync.as_mut().expect("running").kill();
    let drifts = [view.drift_crd().await, view.unlabel_namespace().await];
    restart_and_repair(&mut s, &view, &drifts, "drift/restart after a crash").await;

    // A forged record: digests of all zeros under the right access Secret version.
    stop(&mut s).await;
    let (shard, entry) = record_of_kyma(&s).await;
    let secret = entry["secret"].as_str().expect("the record names the Secret version");
    assert_eq!(secret, drift::secret_version(&s.kcp, &s.ns, KYMA).await.expect("secret"), "the record is current");
    let drifts = [view.drift_crd().await, view.unlabel_namespace().await, view.edit_copy(MT, MT_COPY).await];
    let forged = drift::record_for(KYMA, secret, ZERO_DIGEST, ZERO_DIGEST);
    drift::write_record(&s.kcp, &s.ns, shard, &forged).await.expect("forge the record");
    restart_and_repair(&mut s, &view, &drifts, "drift/forged record (zero digests)").await;
    assert!(s.log().contains("Read the shard's SKR record"), "the forged record was not read");

    // A forged record: the real record's digests, made to name the access Secret's new
    // version (the Secret changed while the replica was stopped, which alone would have
    // voided the record).
    stop(&mut s).await;
    let (shard, entry) = record_of_kyma(&s).await;
    let drifts = [view.drift_crd().await, view.unlabel_namespace().await, view.edit_copy(MT, MT_COPY).await];
    let secret = drift::bump_secret(&s.kcp, &s.ns, KYMA).await.expect("change the access Secret");
    let kinds = &entry["kinds"];
    let forged = drift::record_for(
        KYMA,
        &secret,
        kinds["ModuleTemplate"].as_str().expect("a digest"),
        kinds["ModuleReleaseMeta"].as_str().expect("a digest"),
    );
    drift::write_record(&s.kcp, &s.ns, shard, &forged).await.expect("forge the record");
    restart_and_repair(&mut s, &view, &drifts, "drift/forged record (real digests, new Secret version)").await;
    s.await_skr_names(&testenv::env().skr_b, MT, &[MT_COPY], PROMPT).await;
}

/// The sync namespace deleted (and finalized by a real namespace controller, its copies with
/// it) while the replica runs with a warm memory, after a graceful stop, after a crash, and
/// with a forged shard record: each time catalogsync recreates it, labelled, with the copies,
/// within one resync period.
#[tokio::test]
async fn namespace_deletion_is_repaired_within_one_resync_period() {
    let _serial = SERIAL.lock().await;
    let env = testenv::env();
    let namespace_controller = ControllerManager::start_namespace_controller(&env.skr_b).expect("namespace controller");
    let (mut s, view) = started("nsdel").await;
    tokio::time::sleep(RESYNC).await;

    // While it runs, right after a resync.
    await_fresh_resync(s.http_port, "running").await;
    let since = Instant::now();
    let drifts = [view.delete_namespace().await];
    let gone = view.await_namespace_gone(&drifts[0], since, NS_GONE, &namespace_controller).await;
    eprintln!("namespace deletion/running: the namespace controller finalized it after {:.1}s", gone.as_secs_f64());
    repair_while_running(&s, &view, &drifts, since, "namespace deletion/running").await;

    // After a graceful stop, a crash, and with a forged record: deleted and finalized while
    // no catalogsync runs.
    let situations = ["graceful restart", "restart after a crash", "forged record (zero digests)"];
    for situation in situations {
        let situation = format!("namespace deletion/{situation}");
        if situation.ends_with("crash") {
            s.catalogsync.as_mut().expect("running").kill();
        } else {
            stop(&mut s).await;
        }
        let since = Instant::now();
        let drifts = [view.delete_namespace().await];
        let gone = view.await_namespace_gone(&drifts[0], since, NS_GONE, &namespace_controller).await;
        eprintln!("{situation}: the namespace controller finalized it after {:.1}s", gone.as_secs_f64());
        if situation.contains("forged") {
            let (shard, entry) = record_of_kyma(&s).await;
            let secret = entry["secret"].as_str().expect("the record names the Secret version");
            let forged = drift::record_for(KYMA, secret, ZERO_DIGEST, ZERO_DIGEST);
            drift::write_record(&s.kcp, &s.ns, shard, &forged).await.expect("forge the record");
        }
        restart_and_repair(&mut s, &view, &drifts, &situation).await;
    }
}

/// Waits until `holder` holds `shard` by its shard Lease, and returns when it took it (the
/// Lease's `acquireTime`, written by the claim, on this machine's clock): the handover.
async fn await_holder(f: &Fleet, shard: u32, holder: &str, timeout: Duration) -> Instant {
    let leases: Api<Lease> = Api::namespaced(f.scenario.kcp.clone(), f.ns());
    let acquired = testenv::await_condition(timeout, &format!("shard {shard} held by {holder}"), || async {
        let spec = leases.get(&shard_lease_name(shard)).await.ok()?.spec?;
        (spec.holder_identity.as_deref() == Some(holder)).then_some(spec.acquire_time?.0)
    })
    .await;
    let age = Timestamp::now().duration_since(acquired).unsigned_abs();
    Instant::now().checked_sub(age).expect("a handover after this process started")
}

/// Drift while the Kyma's shard moves to another replica, repaired by the new holder within
/// one resync period of the handover: the CRD and the namespace label drift just before a
/// second replica joins and the coordinator moves the shard to it (the old holder drains it
/// and writes its record, the new one claims it and reads the record); then the sync
/// namespace is deleted (a namespace controller finalizes it) and the CRD drifts again just
/// before the new holder stops gracefully and the shard moves back to the first replica. The
/// drifts come right after the holder's resync, so the holder itself would not repair them
/// for a period.
#[tokio::test]
async fn drift_is_repaired_by_the_new_holder_after_a_rebalance() {
    let _serial = SERIAL.lock().await;
    let env = testenv::env();
    let namespace_controller = ControllerManager::start_namespace_controller(&env.skr_b).expect("namespace controller");
    let mut f = Fleet::new("rebalance", &[&env.skr_b], 1).await.expect("fleet");
    f.scenario.apply_catalog(&catalog()).await.expect("catalog");
    let kyma = f.kymas[0].name.clone();
    let shard = shard_of(f.ns(), &kyma, SHARDS);
    // The joining replica: an identity the coordinator moves the Kyma's shard to when it
    // joins r1, by the assignment function the coordinator runs.
    let alone: BTreeMap<u32, String> = (0..SHARDS).map(|s| (s, "r1".to_owned())).collect();
    let joiner = (2..50)
        .map(|i| format!("r{i}"))
        .find(|j| assign(SHARDS, &["r1".to_owned(), j.clone()], &alone).get(&shard) == Some(j))
        .expect("an identity the shard moves to");
    let mut args = f.sharding_args(SHARDS);
    args.extend(RESYNC_FLAG.map(str::to_owned));
    args.extend(["--drain-timeout", "3s"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    f.spawn_replica("r1", &args).expect("spawn r1");
    f.await_converged(&["r1"], SHARDS, PROMPT).await;
    f.scenario.await_condition(&kyma, "True", "CatalogSynced", PROMPT).await;
    f.scenario.await_skr_names(&env.skr_b, MT, &[MT_COPY], PROMPT).await;
    let view = SkrView::new(&env.skr_b, &f.scenario.sync_ns);
    tokio::time::sleep(RESYNC).await;

    // The shard moves to a joining replica.
    let situation = format!("drift/rebalance (shard {shard} moves from r1 to {joiner} as it joins)");
    let r1_port = f.http_port("r1").expect("r1");
    await_fresh_resync(r1_port, &situation).await;
    let drifted = Instant::now();
    let r1_before = requests(r1_port).await;
    let drifts = [view.drift_crd().await, view.unlabel_namespace().await];
    f.spawn_replica(&joiner, &args).expect("spawn the joining replica");
    let handover = await_holder(&f, shard, &joiner, PROMPT).await;
    let r1_writes = requests(r1_port).await.since(&r1_before).writes();
    assert_eq!(r1_writes, 0.0, "{situation}: r1 wrote before the handover; the test timing is off");
    let took = view.await_repaired(&drifts, handover, BOUND, &situation).await;
    let joiner_port = f.http_port(&joiner).expect("the joining replica");
    await_syncs_above(joiner_port, 0.0, &situation).await;
    let cost = requests(joiner_port).await;
    eprintln!(
        "{} (from the handover, {:.1}s after the drift; requests of {joiner})",
        drift::summary(&situation, &drifts, &took, BOUND, &cost),
        (handover - drifted).as_secs_f64()
    );
    f.await_converged(&["r1", &joiner], SHARDS, PROMPT).await;

    // The shard moves back as its holder stops gracefully, right after the namespace was
    // deleted: the namespace is still terminating when r1 takes the shard (the namespace
    // controller takes a few seconds to finalize it). Timed from the handover, which comes
    // after the drift.
    let situation = format!("namespace deletion/rebalance (shard {shard} moves from {joiner} back to r1 as it stops)");
    await_fresh_resync(joiner_port, &situation).await;
    let joiner_before = requests(joiner_port).await;
    let drifted = Instant::now();
    let drifts = [view.delete_namespace().await, view.drift_crd().await];
    let joiner_writes = requests(joiner_port).await.since(&joiner_before).writes();
    let (before, runs) = (requests(r1_port).await, syncs(r1_port).await);
    let status = f.terminate(&joiner).await.expect("stop the new holder");
    assert!(status.success(), "{joiner} exited with {status}");
    assert_eq!(joiner_writes, 0.0, "{situation}: {joiner} wrote before the handover; the test timing is off");
    let handover = await_holder(&f, shard, "r1", PROMPT).await;
    let (took, gone) = tokio::join!(
        view.await_repaired(&drifts, handover, BOUND, &situation),
        view.await_namespace_gone(&drifts[0], drifted, NS_GONE, &namespace_controller)
    );
    await_syncs_above(r1_port, runs, &situation).await;
    let cost = requests(r1_port).await.since(&before);
    eprintln!(
        "{} (from the handover, {:.1}s after the drift; the namespace controller finalized the namespace \
         {:.1}s after the drift; requests of r1)",
        drift::summary(&situation, &drifts, &took, BOUND, &cost),
        (handover - drifted).as_secs_f64(),
        gone.as_secs_f64()
    );
    f.scenario.await_condition(&kyma, "True", "CatalogSynced", PROMPT).await;
}

/// A shard record forged to match the drifted SKR: a copy is edited while the replica is
/// stopped, and the record is given the digests of the SKR as it now is (computed from the
/// KCP catalog and the SKR's resourceVersions with catalogsync's own functions, a method
/// first checked against the record the replica wrote itself). The copy must still be
/// repaired within one resync period of the restart.
#[tokio::test]
async fn a_record_forged_to_match_a_drifted_copy_does_not_stop_its_repair() {
    let _serial = SERIAL.lock().await;
    let (mut s, view) = started("forge-match").await;
    stop(&mut s).await;
    let (shard, entry) = record_of_kyma(&s).await;
    let (mt_digest, mrm_digest) = drift::digests_of_skr_as_it_is(&s.kcp, &s.ns, &view).await.expect("digests");
    assert_eq!(
        (entry["kinds"]["ModuleTemplate"].as_str(), entry["kinds"]["ModuleReleaseMeta"].as_str()),
        (Some(mt_digest.as_str()), Some(mrm_digest.as_str())),
        "the digests computed here are not the ones the replica writes"
    );
    let drifts = [view.edit_copy(MT, MT_COPY).await];
    let (mt_digest, mrm_digest) = drift::digests_of_skr_as_it_is(&s.kcp, &s.ns, &view).await.expect("digests");
    let secret = entry["secret"].as_str().expect("the record names the Secret version");
    let forged = drift::record_for(KYMA, secret, &mt_digest, &mrm_digest);
    drift::write_record(&s.kcp, &s.ns, shard, &forged).await.expect("forge the record");
    restart_and_repair(&mut s, &view, &drifts, "copy drift/forged record matching the drift").await;
}
