//! Failure isolation end to end (docs/catalog-rules.md sections 5 and 6, and "Failure
//! isolation" in docs/architecture.md): an unreachable SKR, bad access Secrets, a rotated
//! Secret, Kymas that must be left alone, and a graceful shutdown, each next to a healthy Kyma
//! that must keep getting its catalog. Real apiservers, catalogsync as a process.

use std::time::{Duration, Instant};

use catalogsync::sharding::ring::shard_of;
use serde_json::Value;
use testenv::scenario::{MRM, MT, Scenario, mrm, mt};
use testenv::{AuditEvent, ControlPlane};

/// Catalog changes must arrive well within this, without a periodic resync.
const PROMPT: Duration = Duration::from_secs(15);
const SKIP_RECONCILIATION: &str = "operator.kyma-project.io/skip-reconciliation";
/// `--shards` of [`Scenario::start`].
const SCENARIO_SHARDS: u32 = 4;

/// The catalog every scenario starts with.
fn base_catalog() -> Vec<Value> {
    vec![
        mt("api-gateway", "2.10.0"),
        mrm("api-gateway", &[("regular", "2.10.0")]),
        mt("btp-operator", "1.1.0"),
        mrm("btp-operator", &[("regular", "1.1.0")]),
    ]
}
const BASE_MTS: &[&str] = &["api-gateway-2.10.0", "btp-operator-1.1.0"];
const BASE_MRMS: &[&str] = &["api-gateway", "btp-operator"];

/// A catalog change: a new module `module` with one version on the regular channel.
fn new_module(module: &str, version: &str) -> Vec<Value> {
    vec![mt(module, version), mrm(module, &[("regular", version)])]
}

/// The names `base` plus `extra`.
fn names<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

/// The audit events of `skr` from position `from` on, with their position.
fn audit_since(skr: &ControlPlane, from: usize) -> Vec<(usize, AuditEvent)> {
    skr.read_audit_events().into_iter().enumerate().skip(from).collect()
}

/// The writes among `events` made by `user`.
fn writes_by<'a>(events: &'a [(usize, AuditEvent)], user: &'a str) -> Vec<&'a (usize, AuditEvent)> {
    events.iter().filter(|(_, e)| e.user.username == user && e.is_write()).collect()
}

fn describe(events: &[&(usize, AuditEvent)]) -> Vec<String> {
    events
        .iter()
        .map(|(i, e)| format!("#{i} {} {} {:?}/{:?} -> {}", e.user.username, e.verb, e.namespace(), e.name(), e.code()))
        .collect()
}

/// One stopped SKR apiserver: its Kyma reports `SkrUnreachable` (condition and Event) while
/// another Kyma keeps getting catalog changes promptly; after the restart it recovers alone.
#[tokio::test]
async fn unreachable_skr_does_not_block_others_and_recovers() {
    let env = testenv::env();
    // A dedicated SKR, so no other test sees it go down.
    let skr_down = env.start_extra_skr("skr-down").await.expect("start skr-down");
    let mut s = Scenario::new("iso-down").await.expect("scenario");
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("down", &skr_down, &[]).await.expect("kyma");
    s.start(&[]).expect("start");

    s.await_skr_names(&env.skr_a, MT, BASE_MTS, PROMPT).await;
    s.await_skr_names(&skr_down, MT, BASE_MTS, PROMPT).await;
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    s.await_condition("down", "True", "CatalogSynced", PROMPT).await;

    skr_down.stop();
    assert!(skr_down.admin_client().apiserver_version().await.is_err(), "skr-down still answers");

    // First change: the down Kyma's sync fails, the healthy one's succeeds.
    let started = Instant::now();
    s.apply_catalog(&new_module("serverless", "1.6.0")).await.expect("change 1");
    s.await_skr_names(&env.skr_a, MT, &names(BASE_MTS, &["serverless-1.6.0"]), PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &names(BASE_MRMS, &["serverless"]), PROMPT).await;
    eprintln!("change 1 reached the healthy SKR after {:.1}s", started.elapsed().as_secs_f64());
    let cond = s.await_condition("down", "False", "SkrUnreachable", PROMPT).await;
    assert!(!cond.message.is_empty(), "SkrUnreachable without a message: {cond:?}");
    let event = s.await_kyma_event("down", "SkrUnreachable", PROMPT).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"), "{event:?}");
    assert!(
        s.kyma_events("healthy").await.iter().all(|e| e.reason.as_deref() != Some("SkrUnreachable")),
        "the healthy Kyma got an SkrUnreachable event"
    );

    // Second change while the down Kyma keeps failing (backing off): still prompt.
    let started = Instant::now();
    s.apply_catalog(&new_module("keda", "1.3.0")).await.expect("change 2");
    s.await_skr_names(&env.skr_a, MT, &names(BASE_MTS, &["serverless-1.6.0", "keda-1.3.0"]), PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &names(BASE_MRMS, &["serverless", "keda"]), PROMPT).await;
    eprintln!("change 2 reached the healthy SKR after {:.1}s", started.elapsed().as_secs_f64());
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    let cond = s.condition("down").await.expect("condition of down");
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("False", "SkrUnreachable"), "{cond:?}");
    assert!(s.catalogsync_running(), "catalogsync exited");

    // Back up: the down Kyma recovers without any other nudge.
    skr_down.restart().await.expect("restart skr-down");
    let started = Instant::now();
    s.await_condition("down", "True", "CatalogSynced", PROMPT).await;
    eprintln!("the down Kyma recovered {:.1}s after its SKR was ready", started.elapsed().as_secs_f64());
    s.await_skr_names(&skr_down, MT, &names(BASE_MTS, &["serverless-1.6.0", "keda-1.3.0"]), PROMPT).await;
    s.await_skr_names(&skr_down, MRM, &names(BASE_MRMS, &["serverless", "keda"]), PROMPT).await;
    assert!(s.catalogsync_running(), "catalogsync exited");
}

/// Missing, ambiguous and invalid access Secrets each fail only their own Kyma, with their
/// reason and an Event; a healthy Kyma keeps syncing; fixing a Secret heals its Kyma without
/// a restart.
#[tokio::test]
async fn bad_access_secrets_fail_only_their_kyma_and_heal_when_fixed() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-secret").await.expect("scenario");
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma_without_secret("missing", &[]).await.expect("kyma");
    for secret in ["ambiguous-1", "ambiguous-2"] {
        s.put_secret(secret, "ambiguous", &s.skr_kubeconfig("ambiguous", &env.skr_b)).await.expect("secret");
    }
    s.add_kyma_without_secret("ambiguous", &[]).await.expect("kyma");
    s.put_secret("invalid", "invalid", "this is: [not a kubeconfig").await.expect("secret");
    s.add_kyma_without_secret("invalid", &[]).await.expect("kyma");
    s.start(&[]).expect("start");

    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(&env.skr_a, MT, BASE_MTS, PROMPT).await;
    let bad = [
        ("missing", "AccessSecretMissing"),
        ("ambiguous", "AccessSecretAmbiguous"),
        ("invalid", "AccessSecretInvalid"),
    ];
    for (kyma, reason) in bad {
        let cond = s.await_condition(kyma, "False", reason, PROMPT).await;
        assert!(!cond.message.is_empty(), "{kyma}: condition without a message: {cond:?}");
        let event = s.await_kyma_event(kyma, reason, PROMPT).await;
        assert_eq!(event.type_.as_deref(), Some("Warning"), "{event:?}");
    }
    let cond = s.condition("ambiguous").await.expect("condition");
    assert!(cond.message.contains("ambiguous-1") && cond.message.contains("ambiguous-2"), "{cond:?}");
    assert!(s.catalogsync_running(), "catalogsync exited");

    // The healthy Kyma still gets catalog changes.
    s.apply_catalog(&new_module("serverless", "1.6.0")).await.expect("change");
    s.await_skr_names(&env.skr_a, MT, &names(BASE_MTS, &["serverless-1.6.0"]), PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &names(BASE_MRMS, &["serverless"]), PROMPT).await;
    assert!(s.catalogsync_running(), "catalogsync exited");

    // Fix each Secret; each Kyma heals without a restart, reaching skr-b as its own identity.
    // The second Secret of the ambiguous Kyma loses its label and so leaves the label-selected
    // watch.
    let before = env.skr_b.read_audit_events().len();
    s.put_secret("missing", "missing", &s.skr_kubeconfig("missing", &env.skr_b)).await.expect("secret");
    s.unlabel_secret("ambiguous-2").await.expect("unlabel secret");
    s.put_secret("invalid", "invalid", &s.skr_kubeconfig("invalid", &env.skr_b)).await.expect("secret");
    for (kyma, _) in bad {
        s.await_condition(kyma, "True", "CatalogSynced", PROMPT).await;
    }
    s.await_skr_names(&env.skr_b, MT, &names(BASE_MTS, &["serverless-1.6.0"]), PROMPT).await;
    s.await_skr_names(&env.skr_b, MRM, &names(BASE_MRMS, &["serverless"]), PROMPT).await;
    let events = audit_since(&env.skr_b, before);
    for (kyma, _) in bad {
        let user = s.skr_user(kyma);
        assert!(
            events.iter().any(|(_, e)| e.user.username == user && e.code() == 200),
            "no successful request by {user} in skr-b after the fix"
        );
    }

    // A deleted Secret is noticed at once, not at the next resync (5 minutes): its Kyma is
    // reconciled and finds none.
    s.delete_secret("healthy").await.expect("delete secret");
    s.await_condition("healthy", "False", "AccessSecretMissing", PROMPT).await;
    assert!(s.catalogsync_running(), "catalogsync exited");
}

/// A rotated access Secret is picked up: after the rotation only the new identity writes.
#[tokio::test]
async fn rotated_access_secret_is_picked_up() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-rotate").await.expect("scenario");
    let user_x = format!("{}-user-x", s.ns);
    let user_y = format!("{}-user-y", s.ns);
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.put_secret("rotating", "rotating", &env.skr_b.kubeconfig_yaml(&user_x, &["system:masters"])).await.expect("x");
    s.add_kyma_without_secret("rotating", &[]).await.expect("kyma");
    s.start(&[]).expect("start");

    s.await_condition("rotating", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(&env.skr_b, MT, BASE_MTS, PROMPT).await;
    s.await_skr_names(&env.skr_b, MRM, BASE_MRMS, PROMPT).await;
    let x_writes = audit_since(&env.skr_b, 0)
        .into_iter()
        .filter(|(_, e)| e.user.username == user_x && e.is_write() && e.namespace() == Some(s.sync_ns.as_str()))
        .count();
    assert!(x_writes > 0, "{user_x} made no write in {} before the rotation", s.sync_ns);

    // Rotate. The Secret change alone makes catalogsync connect as Y (a sync that finds
    // everything in place); wait for that before changing the catalog, so the change cannot
    // race the Secret watch.
    let rotated_at = env.skr_b.read_audit_events().len();
    s.put_secret("rotating", "rotating", &env.skr_b.kubeconfig_yaml(&user_y, &["system:masters"])).await.expect("y");
    testenv::await_condition(PROMPT, &format!("a request by {user_y} in skr-b"), || async {
        audit_since(&env.skr_b, rotated_at).iter().any(|(_, e)| e.user.username == user_y)
    })
    .await;

    s.apply_catalog(&new_module("serverless", "1.6.0")).await.expect("change");
    s.await_skr_names(&env.skr_b, MT, &names(BASE_MTS, &["serverless-1.6.0"]), PROMPT).await;
    s.await_skr_names(&env.skr_b, MRM, &names(BASE_MRMS, &["serverless"]), PROMPT).await;
    s.await_condition("rotating", "True", "CatalogSynced", PROMPT).await;

    let events = audit_since(&env.skr_b, rotated_at);
    let y_writes: Vec<_> =
        writes_by(&events, &user_y).into_iter().filter(|(_, e)| e.namespace() == Some(s.sync_ns.as_str())).collect();
    for (plural, name) in [(MT, "serverless-1.6.0"), (MRM, "serverless")] {
        assert!(
            y_writes.iter().any(|(_, e)| e.resource() == plural && e.name() == Some(name) && e.code() < 300),
            "no successful write of {plural} {name} by {user_y}; writes by it: {:?}",
            describe(&y_writes)
        );
    }
    let first_y_write = y_writes.first().map(|(i, _)| *i).expect("a write by Y");
    let x_late: Vec<_> = events.iter().filter(|(i, e)| *i > first_y_write && e.user.username == user_x).collect();
    assert!(x_late.is_empty(), "{user_x} still made requests after {user_y}'s first write: {:?}", describe(&x_late));
}

/// A Kyma labelled `skip-reconciliation: "true"` gets no SKR write at all, while a healthy
/// Kyma of the same scenario gets every catalog change.
#[tokio::test]
async fn skip_reconciliation_kyma_gets_no_skr_write() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-skip").await.expect("scenario");
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("skipped", &env.skr_b, &[(SKIP_RECONCILIATION, "true")]).await.expect("kyma");
    s.start(&[]).expect("start");

    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(&env.skr_a, MT, BASE_MTS, PROMPT).await;
    testenv::await_condition(PROMPT, "catalogsync to leave the skipped Kyma alone", || async {
        s.metric("catalogsync_kymas_skipped_total", &["reason=\"skip_reconciliation\""]).await >= 1.0
    })
    .await;

    // Catalog changes: a new module and a new version of an existing one.
    let mut change = new_module("serverless", "1.6.0");
    change.push(mt("btp-operator", "1.2.0"));
    change.push(mrm("btp-operator", &[("regular", "1.1.0"), ("fast", "1.2.0")]));
    s.apply_catalog(&change).await.expect("change");
    let want_mts = names(BASE_MTS, &["serverless-1.6.0", "btp-operator-1.2.0"]);
    s.await_skr_names(&env.skr_a, MT, &want_mts, PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &names(BASE_MRMS, &["serverless"]), PROMPT).await;
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    // Proving that something does NOT happen: the healthy Kyma already has the change, so a
    // write for the skipped one would have happened by now; one more second of grace.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let user = s.skr_user("skipped");
    let events = audit_since(&env.skr_b, 0);
    let writes = writes_by(&events, &user);
    assert!(writes.is_empty(), "writes by the skipped Kyma's identity in skr-b: {:?}", describe(&writes));
    assert!(s.skr_names(&env.skr_b, MT).await.is_empty(), "copies in skr-b {}", s.sync_ns);
    assert!(s.skr_names(&env.skr_b, MRM).await.is_empty(), "copies in skr-b {}", s.sync_ns);
    assert!(s.catalogsync_running(), "catalogsync exited");
}

/// A Kyma being deleted (kept by a finalizer) gets no SKR write at all after its deletion:
/// catalog changes (an added module, a removed one) neither apply nor prune in its SKR.
#[tokio::test]
async fn deleting_kyma_gets_no_skr_write() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-deleting").await.expect("scenario");
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma_with_finalizers("deleting", &env.skr_b, &[], &["test/keep"]).await.expect("kyma");
    s.start(&[]).expect("start");

    // It syncs normally first.
    s.await_condition("deleting", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(&env.skr_b, MT, BASE_MTS, PROMPT).await;
    s.await_skr_names(&env.skr_b, MRM, BASE_MRMS, PROMPT).await;
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    let user = s.skr_user("deleting");
    assert!(!writes_by(&audit_since(&env.skr_b, 0), &user).is_empty(), "{user} never wrote to skr-b");

    let deleted_at = env.skr_b.read_audit_events().len();
    s.delete_kyma("deleting").await.expect("delete");
    let kyma = s.kymas().get("deleting").await.expect("the Kyma stays while its finalizer is there");
    assert!(kyma.metadata.deletion_timestamp.is_some(), "no deletionTimestamp: {:?}", kyma.metadata);
    testenv::await_condition(PROMPT, "catalogsync to leave the deleting Kyma alone", || async {
        s.metric("catalogsync_kymas_skipped_total", &["reason=\"deleting\""]).await >= 1.0
    })
    .await;

    // Catalog changes: one module added, one removed.
    s.apply_catalog(&new_module("serverless", "1.6.0")).await.expect("change");
    s.delete_catalog(MRM, "btp-operator").await.expect("delete mrm");
    s.delete_catalog(MT, "btp-operator-1.1.0").await.expect("delete mt");
    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "serverless-1.6.0"], PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "serverless"], PROMPT).await;
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    // Proving that something does NOT happen: the healthy Kyma already has the change, so a
    // write for the deleting one would have happened by now; one more second of grace.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let events = audit_since(&env.skr_b, deleted_at);
    let writes = writes_by(&events, &user);
    assert!(writes.is_empty(), "writes by the deleting Kyma's identity after its deletion: {:?}", describe(&writes));
    // Its SKR keeps what it had: nothing applied, nothing pruned.
    assert_eq!(s.skr_names(&env.skr_b, MT).await, BASE_MTS.iter().map(|n| (*n).to_owned()).collect());
    assert_eq!(s.skr_names(&env.skr_b, MRM).await, BASE_MRMS.iter().map(|n| (*n).to_owned()).collect());
    assert!(s.catalogsync_running(), "catalogsync exited");
}

/// A Kyma deleted without finalizers (so never seen with a `deletionTimestamp`) is forgotten
/// at once: its cached SKR access is dropped (eviction reason `deleted`), and the healthy
/// Kyma next to it keeps its access and its catalog changes.
#[tokio::test]
async fn kyma_deleted_without_finalizers_is_forgotten() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-gone").await.expect("scenario");
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("kyma");
    s.start(&[]).expect("start");
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    let clients = || async { s.metric("catalogsync_skr_clients", &[]).await };
    let deleted = || async { s.metric("catalogsync_skr_client_evictions_total", &["reason=\"deleted\""]).await };
    let before = clients().await;
    let deleted_before = deleted().await;
    assert_eq!(before, 1.0, "the healthy Kyma's access is cached");

    s.add_kyma("gone", &env.skr_b, &[]).await.expect("kyma");
    s.await_condition("gone", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(&env.skr_b, MT, BASE_MTS, PROMPT).await;
    testenv::await_condition(PROMPT, "the second Kyma's access cached", || async { clients().await == before + 1.0 })
        .await;

    s.delete_kyma("gone").await.expect("delete");
    assert!(s.kymas().get_opt("gone").await.expect("get").is_none(), "no finalizer: gone at once");
    let started = Instant::now();
    testenv::await_condition(PROMPT, "the deleted Kyma's access dropped", || async {
        clients().await == before && deleted().await == deleted_before + 1.0
    })
    .await;
    eprintln!("the deleted Kyma was forgotten {:.2}s after its deletion", started.elapsed().as_secs_f64());

    // The healthy Kyma kept its access and still gets catalog changes; the deleted one is not
    // synced again (its access Secret is still there) and leaves no queue depth.
    let before_change = env.skr_b.read_audit_events().len();
    s.apply_catalog(&new_module("serverless", "1.6.0")).await.expect("change");
    s.await_skr_names(&env.skr_a, MT, &names(BASE_MTS, &["serverless-1.6.0"]), PROMPT).await;
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(clients().await, before);
    assert_eq!(deleted().await, deleted_before + 1.0, "evicted once");
    assert_eq!(s.metric("catalogsync_queue_depth", &[]).await, 0.0, "a stuck queue depth");
    let user = s.skr_user("gone");
    let events = audit_since(&env.skr_b, before_change);
    let late = writes_by(&events, &user);
    assert!(late.is_empty(), "writes by the deleted Kyma's identity: {:?}", describe(&late));
    assert!(s.catalogsync_running(), "catalogsync exited");
}

/// A Kyma requeued by a catalog change and deleted (without finalizers) before its sync ran
/// leaves no queue depth behind. With `--concurrency 1` and Kymas whose SKRs stop answering
/// keeping the one worker busy, the requeued Kyma waits in the queue when it is deleted (the
/// test says whether it saw that); either way its shard's depth must end at 0.
#[tokio::test]
async fn deleted_pending_kyma_leaves_no_queue_depth() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-pending").await.expect("scenario");
    // An "SKR" that accepts TCP connections but never answers: each sync against it hangs for
    // the request timeout (3 s) and fails, then backs off (at most 3 s) and hangs again.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hole_url = format!("https://127.0.0.1:{}", black_hole.local_addr().expect("addr").port());
    let ns = s.ns.clone();
    let shard = |name: &str| shard_of(&ns, name, SCENARIO_SHARDS);
    let hanging = ["hanging-0", "hanging-1"];
    let busy: std::collections::BTreeSet<u32> = hanging.iter().map(|h| shard(h)).collect();
    let gone = (0..).map(|i| format!("gone-{i}")).find(|n| !busy.contains(&shard(n))).expect("a shard of its own");
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    for h in hanging {
        s.add_kyma(h, &env.skr_a, &[]).await.expect("kyma");
    }
    s.add_kyma(&gone, &env.skr_b, &[]).await.expect("kyma");
    s.start(&["--concurrency", "1"]).expect("start");
    for k in hanging.iter().copied().chain([gone.as_str()]) {
        s.await_condition(k, "True", "CatalogSynced", PROMPT).await;
    }

    // The hanging Kymas' SKRs stop answering: their syncs now occupy the one worker.
    for h in hanging {
        let kubeconfig = s.skr_kubeconfig(h, &env.skr_a).replace(&env.skr_a.url(), &hole_url);
        s.put_secret(h, h, &kubeconfig).await.expect("secret");
    }
    s.await_condition(hanging[0], "False", "SkrUnreachable", PROMPT).await;

    let depth_of_gone = format!("shard=\"{}\"", shard(&gone));
    let depth = || async { s.metric("catalogsync_queue_depth", &[&depth_of_gone]).await };
    s.apply_catalog(&new_module("serverless", "1.6.0")).await.expect("change");
    // Poll until the change requeued it (its shard holds only it), or it already synced.
    let deadline = Instant::now() + PROMPT;
    let mut pending = false;
    while Instant::now() < deadline {
        if depth().await >= 1.0 {
            pending = true;
            break;
        }
        if s.skr_names(&env.skr_b, MT).await.contains("serverless-1.6.0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.delete_kyma(&gone).await.expect("delete");
    let deleted_at = Instant::now();
    eprintln!("the Kyma was {}pending in the queue when deleted", if pending { "" } else { "not " });
    testenv::await_condition(PROMPT, "no queue depth left in the deleted Kyma's shard", || async {
        depth().await == 0.0
    })
    .await;
    eprintln!("its shard's queue depth was 0 {:.2}s after the deletion", deleted_at.elapsed().as_secs_f64());
    // Long enough for the busy worker to have reached the deleted Kyma's requeue.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(depth().await, 0.0, "a stuck queue depth");
    assert!(s.catalogsync_running(), "catalogsync exited");
    drop(black_hole);
}

/// SIGTERM ends catalogsync with exit status 0 within 10 s, also with a sync hanging on an
/// SKR that accepts connections but never answers and a Kyma failing in backoff.
#[tokio::test]
async fn sigterm_shuts_down_gracefully() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-term").await.expect("scenario");
    // An "SKR" that accepts TCP connections (the kernel completes the handshake) but never
    // answers: a sync against it hangs until its timeouts.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hole_url = format!("https://127.0.0.1:{}", black_hole.local_addr().expect("addr").port());
    let hole_kubeconfig = s.skr_kubeconfig("hanging", &env.skr_a).replace(&env.skr_a.url(), &hole_url);
    assert!(hole_kubeconfig.contains(&hole_url), "the kubeconfig does not point to the black hole");

    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma_without_secret("missing", &[]).await.expect("kyma");
    s.put_secret("hanging", "hanging", &hole_kubeconfig).await.expect("secret");
    s.add_kyma_without_secret("hanging", &[]).await.expect("kyma");
    s.start(&[]).expect("start");

    s.await_ready(PROMPT).await;
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    s.await_condition("missing", "False", "AccessSecretMissing", PROMPT).await;
    testenv::await_condition(PROMPT, "a sync in flight (the hanging SKR)", || async {
        s.metric("catalogsync_syncs_in_flight", &[]).await >= 1.0
    })
    .await;

    let started = Instant::now();
    let cs = s.catalogsync.as_mut().expect("started");
    let status = cs.terminate(Duration::from_secs(10)).await.expect("exit within 10s of SIGTERM");
    eprintln!("catalogsync exited with {status} {:.1}s after SIGTERM", started.elapsed().as_secs_f64());
    assert_eq!(status.code(), Some(0), "exit status {status}; log:\n{}", s.log());
    drop(black_hole);
}

/// An access Secret deleted, or joined by a second one, takes its credentials and what the
/// replica kept of the SKR out of the replica: its cached access is dropped (the
/// `catalogsync_skr_clients` gauge counts only the healthy Kyma's), and the shard records
/// written at shutdown name neither Kyma.
#[tokio::test]
async fn a_gone_or_ambiguous_access_secret_leaves_no_credentials_behind() {
    let env = testenv::env();
    let mut s = Scenario::new("iso-forget").await.expect("scenario");
    s.apply_catalog(&base_catalog()).await.expect("catalog");
    s.add_kyma("kept", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("gone", &env.skr_b, &[]).await.expect("kyma");
    s.add_kyma("doubled", &env.skr_b, &[]).await.expect("kyma");
    s.start(&["--resync-period", "1h"]).expect("start");
    for kyma in ["kept", "gone", "doubled"] {
        s.await_condition(kyma, "True", "CatalogSynced", PROMPT).await;
    }
    testenv::await_condition(PROMPT, "three SKR accesses cached", || async {
        s.metric("catalogsync_skr_clients", &[]).await == 3.0
    })
    .await;

    s.delete_secret("gone").await.expect("delete secret");
    s.put_secret("doubled-2", "doubled", &s.skr_kubeconfig("doubled", &env.skr_b)).await.expect("secret");
    s.await_condition("gone", "False", "AccessSecretMissing", PROMPT).await;
    s.await_condition("doubled", "False", "AccessSecretAmbiguous", PROMPT).await;
    testenv::await_condition(PROMPT, "only the healthy Kyma's SKR access cached", || async {
        s.metric("catalogsync_skr_clients", &[]).await == 1.0
    })
    .await;

    let status = s.catalogsync.as_mut().expect("running").terminate(Duration::from_secs(30)).await.expect("stop");
    assert!(status.success(), "catalogsync exited with {status}");
    let records = s.shard_records_text().await.expect("the shard records");
    assert!(records.contains("\"kept\""), "the healthy Kyma's SKR is kept: {records}");
    for kyma in ["gone", "doubled"] {
        assert!(!records.contains(&format!("\"{kyma}\"")), "{kyma} is still in a shard record: {records}");
    }
}
