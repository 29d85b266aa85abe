//! Faults in what catalogsync trusts, each once a bug, on real apiservers with catalogsync as
//! a process:
//!
//! - a Kyma whose `ModuleCatalog` condition cannot be written still has its SKR verified once
//!   per resync period (the drift bound of docs/architecture.md);
//! - the contested and shadow gauges, summed over replicas, count each Kyma once after its
//!   shard moved to another replica;
//! - a hand apply of the condition silences catalogsync only while it is fresh (R6.3a of
//!   docs/catalog-rules.md);
//! - a write still on its way to an SKR when its sync timed out lands before the shard is
//!   released, so the next holder never writes beside it (Guarantee 1).
//!
//! The tests run one at a time: several run replicas, and two of them measure time bounds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use catalogsync::api::{DESIRED_HOLDER_ANNOTATION, KCP_FIELD_MANAGER, Kyma, member_lease_name};
use catalogsync::sharding::ring::shard_of;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::faults::{DelayFront, HeldWrite, ShiftableClock, StatusWritesRefused, apply_condition_by_hand};
use testenv::fleet::{Fleet, FleetKyma, holders};
use testenv::invariants::{InvariantReport, SkrWrite, overlapping_writers, read_skr_writes};
use testenv::process::free_port;
use testenv::scenario::{MRM, MT, mrm, mt};
use testenv::sharded::{CONVERGE, ShardedFleet};
use testenv::{CATALOGSYNC_GROUPS, CATALOGSYNC_USER, ControlPlane};

/// What a first sync, a condition write or a metric may take to show up.
const PROMPT: Duration = Duration::from_secs(40);

/// The field manager of the conditions applied by hand.
const BY_HAND: &str = "sre-by-hand";

/// The condition applied by hand: status, reason, message.
const HAND_CONDITION: (&str, &str, &str) = ("True", "VerifiedByHand", "checked by hand during an incident");

/// The tests of this file run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The one-module catalog every test starts with.
fn catalog(version: &str) -> Vec<Value> {
    vec![mt("keda", version), mrm("keda", &[("regular", version)])]
}

/// Sets `flag` to `value` in `args` (replacing its value when it is there: clap refuses a
/// flag given twice).
fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    match args.iter().position(|a| a == flag) {
        Some(i) if i + 1 < args.len() => args[i + 1] = value.to_owned(),
        _ => args.extend([flag.to_owned(), value.to_owned()]),
    }
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).expect("a duration in range")).expect("a time in range")
}

/// `to - from` in seconds (negative when `to` is earlier).
fn secs(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

fn kymas_api(client: kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, ns, &ApiResource::erase::<Kyma>(&()))
}

// ---------------------------------------------------------------------------------------------
// The drift bound while every condition write fails

/// The resync period of the drift-bound test.
const RESYNC: Duration = Duration::from_secs(10);
/// The longest time between two listing syncs of one SKR: a resync period, its jitter (at
/// most 10%), and the time a sync and the audit log take on a busy machine.
const LIST_BOUND: Duration = Duration::from_secs(10 + 1 + 5);
/// What a repair may take from the drift, made right after a listing sync: the same.
const REPAIR_BOUND: Duration = LIST_BOUND;

/// The times catalogsync listed the ModuleTemplates of `sync_ns` in `skr` as `user` (one per
/// listing sync: the pages of one list are within a second).
fn listing_syncs(skr: &ControlPlane, user: &str, sync_ns: &str) -> Vec<Timestamp> {
    let mut times: Vec<Timestamp> = Vec::new();
    for e in skr.read_audit_events() {
        if e.user.username == user && e.verb == "list" && e.resource() == MT && e.namespace() == Some(sync_ns) {
            let t: Timestamp = e.request_received_timestamp.parse().expect("a timestamp");
            if times.last().is_none_or(|last| secs(*last, t) > 1.0) {
                times.push(t);
            }
        }
    }
    times
}

/// Waits for the first listing sync after the one at `last`, at most until `last` plus
/// [`LIST_BOUND`]; returns its time.
async fn await_listing_after(skr: &ControlPlane, user: &str, sync_ns: &str, last: Timestamp) -> Timestamp {
    let deadline = plus(last, LIST_BOUND);
    let left = Duration::try_from(Timestamp::now().duration_until(deadline)).unwrap_or_default();
    let what = format!(
        "a listing sync of the SKR within {}s of the one at {last} (a failed condition write must not delay the \
         resync)",
        LIST_BOUND.as_secs()
    );
    testenv::await_condition(left, &what, || async {
        listing_syncs(skr, user, sync_ns).into_iter().find(|t| secs(last, *t) > 1.0)
    })
    .await
}

/// Fixed: a failed condition write lost the requeue at the end of the trust in the SKR's
/// memory. `error_policy` requeued after the backoff only, so with every condition write
/// failing the SKR was listed again only after the backoff: drift waited the resync period
/// plus the backoff, not one resync period. (The failure count is reset by the sync that
/// succeeded before the condition write, so the backoff was `--backoff-min` times 0.5 to 1,
/// at most `--backoff-max`; this test sets `--backoff-min 60s` so that the backoff alone is
/// far beyond the bound. With the default 5 s the drift waited about 5 s more.)
///
/// Here an admission policy in the KCP refuses every status write of catalogsync's identity
/// in the test's namespace, with `--resync-period 10s`, `--backoff-min 60s` and
/// `--backoff-max 5m`. Asserted and printed: the SKR is listed again within a resync period
/// (plus jitter and slack) of the last list, a deleted copy and a changed copy are each
/// repaired within that bound of the drift, and the condition was never written (every
/// attempt refused).
#[tokio::test]
async fn drift_is_repaired_within_a_resync_period_while_every_condition_write_fails() {
    let _serial = SERIAL.lock().await;
    let env = testenv::env();
    let skr = &env.skr_b;
    let mut f = Fleet::new("cond-refused", &[skr], 1).await.expect("fleet");
    f.scenario.apply_catalog(&catalog("1.0.0")).await.expect("catalog");
    let kyma = f.kymas[0].clone();
    let sync_ns = f.scenario.sync_ns.clone();

    let refused = StatusWritesRefused::install(&f.scenario.kcp, f.ns(), CATALOGSYNC_USER).await.expect("policy");
    let as_catalogsync = env.kcp.client_for(CATALOGSYNC_USER, CATALOGSYNC_GROUPS).await.expect("a client");
    refused.await_in_force(&kymas_api(as_catalogsync, f.ns()), &kyma.name, PROMPT).await;

    set_flag(&mut f.base_args, "--backoff-min", "60s");
    set_flag(&mut f.base_args, "--backoff-max", "5m");
    let mut args = f.sharding_args(4);
    args.extend(["--resync-period".to_owned(), format!("{}s", RESYNC.as_secs())]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    f.spawn_replica("r1", &args).expect("spawn");
    f.scenario.await_skr_names(skr, MT, &["keda-1.0.0"], PROMPT).await;
    let refused_writes =
        || async { f.metric("r1", "catalogsync_sync_errors_total", &[r#"reason="ConditionWriteFailed""#]).await };
    testenv::await_condition(PROMPT, "a refused condition write", || async { refused_writes().await >= 1.0 }).await;
    let first = testenv::await_condition(PROMPT, "the first listing sync", || async {
        listing_syncs(skr, &kyma.user, &sync_ns).first().copied()
    })
    .await;

    // No drift: the next listing sync comes within the bound.
    let second = await_listing_after(skr, &kyma.user, &sync_ns, first).await;
    eprintln!("listing syncs {:.1}s apart while every condition write fails", secs(first, second));

    // A copy deleted right after a listing sync is back within the bound.
    let copies = f.scenario.skr_api(skr, MT);
    copies.delete("keda-1.0.0", &DeleteParams::default()).await.expect("delete the copy");
    let deleted = Instant::now();
    testenv::await_condition(REPAIR_BOUND, "the deleted copy restored", || async {
        copies.get_opt("keda-1.0.0").await.ok().flatten().is_some()
    })
    .await;
    eprintln!("deleted copy restored {:.1}s after the deletion", deleted.elapsed().as_secs_f64());
    let third = await_listing_after(skr, &kyma.user, &sync_ns, second).await;
    eprintln!("listing syncs {:.1}s apart", secs(second, third));

    // A copy changed right after a listing sync is rewritten within the bound.
    let spec = copies.get("keda-1.0.0").await.expect("the copy").data["spec"].clone();
    let edit = json!({"spec": {"requiresDowntime": !spec["requiresDowntime"].as_bool().unwrap_or(false)}});
    copies.patch("keda-1.0.0", &PatchParams::default(), &Patch::Merge(&edit)).await.expect("change the copy");
    let changed = Instant::now();
    testenv::await_condition(REPAIR_BOUND, "the changed copy rewritten", || async {
        copies.get("keda-1.0.0").await.is_ok_and(|c| c.data["spec"] == spec)
    })
    .await;
    eprintln!("changed copy rewritten {:.1}s after the change", changed.elapsed().as_secs_f64());
    let fourth = await_listing_after(skr, &kyma.user, &sync_ns, third).await;
    eprintln!("listing syncs {:.1}s apart", secs(third, fourth));

    // The condition was never written: every attempt catalogsync made was refused.
    assert!(f.scenario.condition(&kyma.name).await.is_none(), "a ModuleCatalog condition was written");
    let denied = env
        .kcp
        .read_audit_events()
        .into_iter()
        .filter(|e| e.user.username == CATALOGSYNC_USER && e.namespace() == Some(f.ns()) && e.is_write())
        // The test's own dry runs as that user (waiting for the policy) aside.
        .filter(|e| !e.request_uri.contains("dryRun="))
        .filter(|e| {
            e.object_ref.as_ref().is_some_and(|o| o.resource == "kymas" && o.subresource.as_deref() == Some("status"))
        })
        .map(|e| e.code())
        .collect::<Vec<_>>();
    assert!(denied.len() >= 4 && denied.iter().all(|c| *c == 403), "catalogsync's status writes: {denied:?}");
    let counted = refused_writes().await;
    eprintln!("{} condition writes refused (403), {counted} counted as ConditionWriteFailed", denied.len());
}

// ---------------------------------------------------------------------------------------------
// The contested and shadow gauges across a handover

const SHARDS: u32 = 8;
const KYMAS: usize = 16;

/// The number of `f`'s Kymas in the shards each replica holds, by the shard table.
async fn kymas_held(f: &ShardedFleet) -> BTreeMap<String, f64> {
    let holder = holders(&f.table().await);
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for k in &f.kymas {
        let h = holder.get(&shard_of(f.ns(), &k.name, f.shards)).cloned().unwrap_or_default();
        *out.entry(h).or_default() += 1.0;
    }
    out
}

/// Waits until gauge `name` (`labels`; summed over its series) of each replica reads what
/// `want` says for it; panics with what each read last.
async fn await_per_replica(f: &Fleet, name: &str, labels: &[&str], want: &BTreeMap<String, f64>) {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let mut got = BTreeMap::new();
        for r in want.keys() {
            got.insert(r.clone(), f.metric(r, name, labels).await);
        }
        if &got == want {
            eprintln!("{name}{labels:?} per replica: {got:?} (sum {})", got.values().sum::<f64>());
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} per replica is {got:?} after {}s, expected {want:?}: the Kymas of the shards each holds",
            CONVERGE.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A sharded fleet of [`KYMAS`] Kymas over both SKRs whose conditions are applied by hand
/// (fresh, so each is contested).
async fn contested_fleet(prefix: &str) -> ShardedFleet {
    let env = testenv::env();
    let f = ShardedFleet::new(prefix, &[&env.skr_a, &env.skr_b], KYMAS, SHARDS, PROMPT).await;
    let kymas = f.scenario.kymas();
    for k in &f.kymas {
        apply_condition_by_hand(&kymas, &k.name, BY_HAND, HAND_CONDITION).await.expect("apply by hand");
    }
    f
}

/// Fixed: the old holder of a shard kept exporting `catalogsync_kyma_condition_contested`
/// (and `catalogsync_shadow_*`) for the Kymas of a shard it gave up, until its next resync of
/// each, while the new holder counted them too: summed over the replicas, as the dashboards
/// and alerts do, a contested Kyma counted twice after a handover.
///
/// Every Kyma's condition is applied by hand (fresh, so contested); replicas run with
/// `--resync-period 1h`, so no resync hides the old holder's leftovers. One replica syncs
/// all 16 Kymas, then a second and a third join and shards move to them. Asserted and
/// printed after each step: every replica's gauge equals the number of Kymas in the shards
/// it holds, so the sum is 16.
#[tokio::test]
async fn contested_kymas_are_counted_once_after_their_shards_moved() {
    let _serial = SERIAL.lock().await;
    let mut f = contested_fleet("contest-move").await;
    let mut args = f.args();
    args.extend(["--resync-period", "1h"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut running: Vec<&str> = Vec::new();
    for r in ["r1", "r2", "r3"] {
        f.spawn_replica(r, &args).expect("spawn");
        running.push(r);
        f.await_converged(&running).await;
        let want = kymas_held(&f).await;
        await_per_replica(&f, "catalogsync_kyma_condition_contested", &[], &want).await;
    }
    // Left alone throughout: still the condition applied by hand.
    for k in &f.kymas {
        let c = f.scenario.condition(&k.name).await.expect("the condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), (HAND_CONDITION.0, HAND_CONDITION.1), "{}", k.name);
    }
    f.check(false);
}

/// The same fix in `--mode shadow`: the old holder dropped the shadow verdicts (and contests)
/// of the Kymas of a shard it gave up only at its next resync of each. Two shadow replicas
/// (`--resync-period 1h`), the second joining after the first compared all 16 SKRs: each
/// replica's `catalogsync_shadow_skrs` (agree and disagree together) and
/// `catalogsync_kyma_condition_contested` equal the number of Kymas in the shards it holds.
#[tokio::test]
async fn shadow_verdicts_are_counted_once_after_their_shards_moved() {
    let _serial = SERIAL.lock().await;
    let env = testenv::env();
    // Shadow mode writes nothing, so the SKRs must have the catalog CRDs for it to compare.
    for skr in [&env.skr_a, &env.skr_b] {
        testenv::install_catalogsync_crds(skr).await.expect("CRDs in the SKR");
    }
    let mut f = contested_fleet("shadow-move").await;
    let mut args = f.args();
    args.extend(["--resync-period", "1h", "--mode", "shadow"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut running: Vec<&str> = Vec::new();
    for r in ["s1", "s2"] {
        f.spawn_replica(r, &args).expect("spawn");
        running.push(r);
        f.await_converged(&running).await;
        let want = kymas_held(&f).await;
        await_per_replica(&f, "catalogsync_shadow_skrs", &[], &want).await;
        await_per_replica(&f, "catalogsync_kyma_condition_contested", &[], &want).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A stale hand apply of the condition

/// Fixed: an `Apply` owner of the `ModuleCatalog` condition other than catalogsync silenced
/// catalogsync's condition forever, also a one-off hand apply: the condition could say `True`
/// for an SKR that had been unreachable for days. Now a contest counts only while the other
/// applier's managed-fields time is less than 15 minutes old (`CONTEST_STALE_AFTER`).
///
/// catalogsync syncs a Kyma (`True`/`CatalogSynced`); the condition is applied by hand as
/// `sre-by-hand` (forced, status subresource); then the SKR becomes unreachable (its access
/// Secret points at a closed loopback port). (a) While the hand apply is fresh, the condition
/// stays as applied by hand, `catalogsync_kyma_condition_contested` is 1, and the failures
/// show in `catalogsync_sync_errors_total{reason="SkrUnreachable"}` and the log. (b) Once the
/// hand apply is more than 15 minutes old, catalogsync writes `False`/`SkrUnreachable`.
///
/// Waiting 15 minutes is not an option, so the replica runs under libfaketime with its
/// wall-clock offset in a file, and the test moves its clock 16 minutes ahead while it runs.
/// The age of the hand apply is the replica's clock minus the time the KCP wrote into its
/// managed-fields entry, so this is what 16 minutes passing looks like to it; its monotonic
/// clock (timers, fencing, backoff) is not faked, and the member Lease's renew time shows
/// that the shift took. The same process is used before and after, so nothing but the clock
/// differs between (a) and (b).
#[tokio::test]
async fn a_stale_hand_apply_silences_the_condition_no_longer() {
    let _serial = SERIAL.lock().await;
    let env = testenv::env();
    let skr = &env.skr_a;
    let mut f = Fleet::new("contest-stale", &[skr], 1).await.expect("fleet");
    f.scenario.apply_catalog(&catalog("1.0.0")).await.expect("catalog");
    let kyma = f.kymas[0].name.clone();
    let clock = ShiftableClock::new(f.scenario.dir.path()).expect("libfaketime (hack/test.sh installs it)");
    let mut args = f.sharding_args(4);
    args.extend(["--resync-period", "2s"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let envs = clock.envs();
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    f.spawn_replica_as("r1", "r1", &args, &envs).expect("spawn");
    f.scenario.await_condition(&kyma, "True", "CatalogSynced", PROMPT).await;

    let kymas = f.scenario.kymas();
    apply_condition_by_hand(&kymas, &kyma, BY_HAND, HAND_CONDITION).await.expect("apply by hand");
    let entry = testenv::faults::status_manager_entry(&kymas, &kyma, BY_HAND).await.expect("read the Kyma");
    let (operation, applied_at) = entry.expect("a managed-fields entry of the hand apply");
    assert_eq!(operation, "Apply");
    let applied_at = applied_at.expect("a managed-fields time");

    let closed = free_port().expect("a free port");
    let unreachable = f.scenario.skr_kubeconfig(&kyma, skr).replace(&skr.url(), &format!("https://127.0.0.1:{closed}"));
    f.scenario.put_secret(&kyma, &kyma, &unreachable).await.expect("break the access Secret");
    let errors = || async { f.metric("r1", "catalogsync_sync_errors_total", &[r#"reason="SkrUnreachable""#]).await };
    let contested = || async { f.metric("r1", "catalogsync_kyma_condition_contested", &[]).await };

    // (a) Fresh: left alone, but the failures are counted and logged.
    testenv::await_condition(PROMPT, "three failed syncs of the unreachable SKR", || async { errors().await >= 3.0 })
        .await;
    assert_eq!(contested().await, 1.0, "the fresh hand apply is a contest");
    let c = f.scenario.condition(&kyma).await.expect("the condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        HAND_CONDITION,
        "the condition applied by hand was changed while fresh"
    );
    let log = f.log("r1");
    let failures = log.lines().filter(|l| l.contains("Failed to sync catalog") && l.contains("SkrUnreachable")).count();
    assert!(failures >= 3, "the log shows {failures} failed syncs with SkrUnreachable");
    assert_eq!(
        log.matches("Another field manager keeps applying the condition").count(),
        1,
        "the contest is logged once"
    );
    // The condition may not say it, so the first failure in a row gets its Warning Event,
    // and only the first.
    let events = f.scenario.kyma_events(&kyma).await;
    let unreachable: Vec<_> = events.iter().filter(|e| e.reason.as_deref() == Some("SkrUnreachable")).collect();
    assert_eq!(unreachable.len(), 1, "one SkrUnreachable Event on the Kyma: {events:?}");
    assert!(unreachable[0].series.is_none(), "published once, not for every failure: {:?}", unreachable[0]);
    eprintln!(
        "fresh hand apply ({:.0}s old): condition left as applied by hand, contested 1, one Warning Event, {} SkrUnreachable errors, {failures} logged",
        secs(applied_at, Timestamp::now()),
        errors().await
    );

    // (b) 16 minutes later, as the replica sees it: the contest is over.
    clock.set(Duration::from_secs(16 * 60)).expect("move the clock");
    let shifted = Instant::now();
    let c = f.scenario.await_condition(&kyma, "False", "SkrUnreachable", PROMPT).await;
    eprintln!(
        "stale hand apply: catalogsync wrote False/SkrUnreachable {:.1}s after its clock moved 16 min ahead \
         (lastTransitionTime {} by its clock, hand apply at {applied_at})",
        shifted.elapsed().as_secs_f64(),
        c.last_transition_time.0
    );
    testenv::await_condition(PROMPT, "the contest to end", || async { contested().await == 0.0 }).await;
    let ours = testenv::faults::status_manager_entry(&kymas, &kyma, KCP_FIELD_MANAGER).await.expect("read the Kyma");
    assert_eq!(ours.map(|(op, _)| op).as_deref(), Some("Apply"), "catalogsync applied the condition");
    let leases: Api<Lease> = Api::namespaced(f.scenario.kcp.clone(), f.ns());
    let ahead = testenv::await_condition(PROMPT, "the member Lease renewed by the shifted clock", || async {
        let renewed = leases.get(&member_lease_name("r1")).await.ok()?.spec?.renew_time?;
        let ahead = secs(Timestamp::now(), renewed.0);
        eprintln!("renew time {ahead:.0}s ahead");
        (ahead > 15.0 * 60.0).then_some(ahead)
    })
    .await;
    eprintln!("the replica's member Lease renew time is {ahead:.0}s ahead of the KCP's clock");
}

// ---------------------------------------------------------------------------------------------
// A write in flight past its sync's timeout

/// How long the front holds the writes of the replica that gives up the shard: longer than
/// `--sync-timeout` (the sync is dropped while its write is on the way), shorter than
/// `--skr-request-timeout` (the longest a request may be under way).
const HOLD: Duration = Duration::from_secs(8);

/// Timings of the in-flight tests: the request timeout well above [`HOLD`], the sync
/// timeout well below; the lease duration as `validate()` requires for them.
fn in_flight_args(ns: &str) -> (Vec<String>, Vec<String>) {
    let base = [
        "--catalog-debounce",
        "200ms",
        "--backoff-min",
        "5s",
        "--backoff-max",
        "10s",
        "--sync-timeout",
        "3s",
        "--skr-request-timeout",
        "12s",
        "--drain-timeout",
        "12s",
        "--shutdown-timeout",
        "40s",
    ];
    let sharding = [
        "--shards",
        "8",
        "--lease-namespace",
        ns,
        "--lease-duration",
        "16s",
        "--renew-deadline",
        "4s",
        "--retry-period",
        "1s",
    ];
    (base.map(str::to_owned).to_vec(), sharding.map(str::to_owned).to_vec())
}

/// A fleet with one Kyma in each of [`SHARDS`] shards, every one reaching `skr-b` through
/// one [`DelayFront`] as its own SKR identity, and the timings of [`in_flight_args`].
async fn fleet_behind_a_front(prefix: &str) -> (ShardedFleet, DelayFront, Vec<String>) {
    let env = testenv::env();
    let skr = &env.skr_b;
    let mut f = ShardedFleet::new(prefix, &[skr], 0, SHARDS, PROMPT).await;
    let mut by_shard: BTreeMap<u32, String> = BTreeMap::new();
    for i in 0.. {
        let name = format!("kyma-{i:03}");
        by_shard.entry(shard_of(f.ns(), &name, SHARDS)).or_insert(name);
        if by_shard.len() == SHARDS as usize {
            break;
        }
    }
    let names: Vec<String> = by_shard.into_values().collect();
    let users: Vec<(String, String)> = names.iter().map(|n| (n.clone(), f.scenario.skr_user(n))).collect();
    let identities: Vec<(&str, &str)> = users.iter().map(|(t, u)| (t.as_str(), u.as_str())).collect();
    let front = DelayFront::start(skr, &identities).expect("start the front");
    for (name, user) in &users {
        f.scenario.put_secret(name, name, &front.kubeconfig(name)).await.expect("access Secret");
        f.scenario.add_kyma_without_secret(name, &[]).await.expect("Kyma");
        f.kymas.push(FleetKyma { name: name.clone(), skr: skr.name().to_owned(), user: user.clone() });
    }
    let (base, sharding) = in_flight_args(f.ns());
    f.base_args = base;
    (f, front, sharding)
}

/// Releases keda `version` while `front` holds the writes of `replica`, and waits until
/// `replica` held at least one write and every sync of a Kyma with a held write timed out.
async fn release_with_held_writes(f: &ShardedFleet, front: &DelayFront, replica: &str, version: &str) {
    front.hold_writes_of(replica, HOLD);
    f.scenario.apply_catalog(&catalog(version)).await.expect("catalog change");
    testenv::await_condition(PROMPT, &format!("{replica}'s syncs to time out with writes held"), || async {
        let held: BTreeSet<String> = front.held().into_iter().map(|w| w.user).collect();
        let timed_out = f.metric(replica, "catalogsync_sync_errors_total", &[r#"reason="SkrUnreachable""#]).await;
        !held.is_empty() && timed_out >= held.len() as f64
    })
    .await;
}

/// Waits until every held write has been answered by the SKR; returns them.
async fn await_held_landed(front: &DelayFront) -> Vec<HeldWrite> {
    testenv::await_condition(HOLD * 3, "every held write to reach the SKR", || async {
        let held = front.held();
        held.iter().all(|w| w.answered.is_some()).then_some(held)
    })
    .await
}

/// Waits until every Kyma is synced with keda `version`: its condition is `True` and the SKR
/// holds exactly that version.
async fn await_synced_with(f: &ShardedFleet, version: &str) {
    let skr = &testenv::env().skr_b;
    f.scenario.await_skr_names(skr, MT, &[&format!("keda-{version}")], CONVERGE).await;
    f.scenario.await_skr_names(skr, MRM, &["keda"], CONVERGE).await;
    f.await_all_synced().await;
}

/// SKR writes by two different replicas as one SKR user whose intervals overlap.
fn overlapping_writes(f: &Fleet) -> Vec<String> {
    let input = f.invariant_input(|_, _| 0, Default::default());
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

/// For each write `from` held: its Kyma's shard, when it reached the SKR, and when `from`'s
/// tenure of that shard ended (the first Lease write after it that names another holder).
fn landings(
    f: &ShardedFleet,
    report: &InvariantReport,
    held: &[HeldWrite],
    from: &str,
) -> Vec<(u32, Timestamp, Option<Timestamp>)> {
    let kyma_of: BTreeMap<&str, &str> = f.kymas.iter().map(|k| (k.user.as_str(), k.name.as_str())).collect();
    held.iter()
        .map(|w| {
            let shard = shard_of(f.ns(), kyma_of.get(w.user.as_str()).expect("a Kyma of the fleet"), SHARDS);
            let landed = w.answered.expect("answered");
            let ended = report
                .timelines
                .get(&shard)
                .and_then(|t| t.iter().find(|c| c.time > w.received && c.holder != from))
                .map(|c| c.time);
            eprintln!(
                "held write {} {} as {}: received {}, reached the SKR {} ({:.1}s later), {from}'s tenure of shard {shard} \
                 ended {}",
                w.method,
                w.path.rsplit('/').next().unwrap_or_default(),
                w.user,
                w.received,
                landed,
                secs(w.received, landed),
                ended.map_or_else(|| "never".to_owned(), |e| format!("{e} ({:+.1}s after it landed)", secs(landed, e))),
            );
            (shard, landed, ended)
        })
        .collect()
}

/// The invariant check, the overlap count, and the counts printed.
fn check_one_writer(f: &ShardedFleet) -> InvariantReport {
    let report = f.check(false);
    let overlaps = overlapping_writes(f);
    eprintln!(
        "one writer per SKR: {} violations, {} overlapping writers, {} SKR writes checked",
        report.violations.len(),
        overlaps.len(),
        report.skr_writes_checked
    );
    assert!(overlaps.is_empty(), "two writers at once:\n{}", overlaps.join("\n"));
    report
}

/// Fixed: a shard was released as soon as no sync of it was in flight, but a sync that timed
/// out (or a prune stream that was dropped) stops counting as in flight while the write it
/// sent may still be on its way: the release came at once, and the write landed in the next
/// holder's tenure. Now a shard is released no sooner than its last SKR write allowed plus
/// `--skr-request-timeout`.
///
/// Two replicas; every Kyma reaches `skr-b` through a front that holds r1's writes for 8 s
/// (`--sync-timeout 3s`, `--skr-request-timeout 12s`). A release makes r1 write; its syncs
/// time out with the writes on the way; then r1 is stopped gracefully (SIGTERM: drain,
/// release), r2 takes its shards, and a second release makes r2 write to every SKR.
/// Asserted and printed: the held writes reached the SKR after the stop began (when, before
/// the fix, the shards were released), each before r1's tenure of its shard ended; the
/// audit-log invariant checker finds no violation and no overlapping writers; r2 wrote as
/// every SKR user whose write was held. (Before the fix r1 released its shards 0.2 s after
/// SIGTERM and the checker found each held write landing in r2's tenure.)
#[tokio::test]
async fn a_write_in_flight_past_its_sync_timeout_lands_before_a_stopping_replica_releases() {
    let _serial = SERIAL.lock().await;
    let (mut f, front, sharding) = fleet_behind_a_front("inflight-stop").await;
    let sharding: Vec<&str> = sharding.iter().map(String::as_str).collect();
    for r in ["r1", "r2"] {
        f.spawn_replica(r, &sharding).expect("spawn");
    }
    f.await_converged(&["r1", "r2"]).await;
    f.await_all_synced().await;

    release_with_held_writes(&f, &front, "r1", "1.1.0").await;
    let stop_began = Timestamp::now();
    f.process("r1").expect("r1").signal("TERM").expect("SIGTERM r1");
    testenv::await_condition(Duration::from_secs(60), "r1 to exit after SIGTERM", || {
        let running = f.is_running("r1");
        async move { !running }
    })
    .await;
    let status = f.process("r1").and_then(|p| p.exit_status()).expect("exited");
    assert!(status.success(), "r1 exited with {status}");
    eprintln!("r1 exited {:.1}s after SIGTERM", secs(stop_began, Timestamp::now()));
    f.await_converged(&["r2"]).await;
    await_synced_with(&f, "1.1.0").await;
    // The new holder writes to every SKR: a release after the handover.
    let took = f.release_everywhere("1.2.0").await;
    eprintln!("a release after the handover reached the SKR in {:.1}s", took.as_secs_f64());
    await_synced_with(&f, "1.2.0").await;

    let held = await_held_landed(&front).await;
    let report = check_one_writer(&f);
    let landed = landings(&f, &report, &held, "r1");
    assert!(
        landed.iter().any(|(_, at, _)| *at > stop_began),
        "no held write reached the SKR after r1's stop began: the fault was not exercised"
    );
    for (shard, at, ended) in &landed {
        assert!(ended.is_some_and(|e| e > *at), "a held write of shard {shard} landed at {at}, after r1 gave it up");
    }
    assert_taken_over(&report, &held, "r2");
}

/// Checks that `taker` wrote as the SKR user of every held write (the next holder wrote to
/// those SKRs), and prints it.
fn assert_taken_over(report: &InvariantReport, held: &[HeldWrite], taker: &str) {
    let users: BTreeSet<&str> = held.iter().map(|w| w.user.as_str()).collect();
    let without: Vec<&&str> =
        users.iter().filter(|u| !report.writers_per_user.get(**u).is_some_and(|w| w.contains(taker))).collect();
    assert!(without.is_empty(), "{taker} never wrote as {without:?}");
    eprintln!("{taker} wrote as each of the {} SKR users whose writes were held", users.len());
}

/// The same fix on a rebalance: r1 syncs every Kyma alone; the front holds its writes for 8 s
/// and its syncs time out with the writes on the way; r2 joins at that moment, the
/// coordinator moves half of the shards to it (drain, release, claim). Before the fix, a
/// drained shard with no sync in flight was released at once. Asserted and printed: at least
/// one held write of a moved shard reached the SKR after the handover of its shard began
/// (the desired holder set to r2), each held write landed before r1's tenure of its shard
/// ended, the invariant checker finds no violation and no overlapping writers, and r2
/// (after a second release) wrote as every SKR user of a moved shard whose write was held.
#[tokio::test]
async fn a_write_in_flight_past_its_sync_timeout_lands_before_a_rebalance_releases() {
    let _serial = SERIAL.lock().await;
    let (mut f, front, sharding) = fleet_behind_a_front("inflight-move").await;
    let sharding: Vec<&str> = sharding.iter().map(String::as_str).collect();
    f.spawn_replica("r1", &sharding).expect("spawn r1");
    f.await_converged(&["r1"]).await;
    f.await_all_synced().await;

    release_with_held_writes(&f, &front, "r1", "1.1.0").await;
    let joined = Timestamp::now();
    f.spawn_replica("r2", &sharding).expect("spawn r2");
    let table = f.await_converged(&["r1", "r2"]).await;
    front.stop_holding();
    eprintln!("shards balanced {:.1}s after r2 was started", secs(joined, Timestamp::now()));
    await_synced_with(&f, "1.1.0").await;
    let took = f.release_everywhere("1.2.0").await;
    eprintln!("a release after the handover reached the SKR in {:.1}s", took.as_secs_f64());
    await_synced_with(&f, "1.2.0").await;

    let held = await_held_landed(&front).await;
    let report = check_one_writer(&f);
    let moved: BTreeSet<u32> = holders(&table).into_iter().filter(|(_, h)| h == "r2").map(|(s, _)| s).collect();
    let landed = landings(&f, &report, &held, "r1");
    let handover_began = |shard: u32| {
        report.timelines.get(&shard).and_then(|t| {
            t.iter()
                .find(|c| c.time > joined && c.annotations.get(DESIRED_HOLDER_ANNOTATION).is_some_and(|d| d == "r2"))
                .map(|c| c.time)
        })
    };
    let across: Vec<String> = landed
        .iter()
        .filter(|(shard, at, _)| moved.contains(shard) && handover_began(*shard).is_some_and(|began| *at > began))
        .map(|(shard, at, _)| format!("shard {shard} at {at}"))
        .collect();
    eprintln!("held writes of moved shards that landed after their handover began: {across:?}");
    assert!(
        !across.is_empty(),
        "no held write of a moved shard landed during its handover: the fault was not exercised"
    );
    for (shard, at, ended) in &landed {
        if moved.contains(shard) {
            assert!(
                ended.is_some_and(|e| e > *at),
                "a held write of shard {shard} landed at {at}, after r1 gave it up"
            );
        }
    }
    let kyma_of: BTreeMap<&str, &str> = f.kymas.iter().map(|k| (k.user.as_str(), k.name.as_str())).collect();
    let held_moved: Vec<HeldWrite> = held
        .into_iter()
        .filter(|w| kyma_of.get(w.user.as_str()).is_some_and(|k| moved.contains(&shard_of(f.ns(), k, SHARDS))))
        .collect();
    assert_taken_over(&report, &held_moved, "r2");
}
