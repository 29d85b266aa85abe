//! Tests of the sharding test helpers against real apiservers: the TCP proxy (forward, cut,
//! stall, heal), the invariant checker on real audit logs (Lease bodies at
//! `RequestResponse`), and the fleet of replicas. The checker's unit tests (synthetic audit
//! lines) live in `common/invariants.rs` and run in this binary too.

use catalogsync::api::shard_lease_name;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use testenv::fleet::Fleet;
use testenv::invariants::{InvariantInput, InvariantOptions, check_invariants, read_lease_writes};
use testenv::proxy::{ProxyMode, TcpProxy, kubeconfig_via, local};

/// How fast a request through a cut proxy must fail.
const FAIL_FAST: Duration = Duration::from_secs(10);

async fn list_namespaces(client: &Client) -> kube::Result<usize> {
    Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items.len())
}

#[tokio::test]
async fn proxy_forwards_fails_fast_when_cut_and_heals() {
    let env = testenv::env();
    let proxy = TcpProxy::start(local(env.kcp.port()));
    assert_eq!(proxy.mode(), ProxyMode::Forward);
    let yaml = kubeconfig_via(&env.kcp.kubeconfig_yaml("via-proxy", &["system:masters"]), proxy.addr());
    assert!(yaml.contains(&format!("server: \"{}\"", proxy.url())), "{yaml}");
    let client = testenv::client_from_kubeconfig_yaml(&yaml).await.expect("a client through the proxy");

    // TLS passes through: the apiserver's certificate for 127.0.0.1 verifies on the proxy's port.
    list_namespaces(&client).await.expect("list namespaces through the proxy");
    assert!(proxy.accepted_connections() >= 1);
    assert!(proxy.open_connections() >= 1, "the client keeps its connection open");
    let seen = env.kcp.read_audit_events().iter().any(|e| e.user.username == "via-proxy" && e.verb == "list");
    assert!(seen, "the request through the proxy reached the KCP as its own user");

    // Cut: the open (pooled) connection is reset, and so is every new one.
    proxy.cut();
    assert!(proxy.is_cut());
    for attempt in ["pooled connection", "fresh client"] {
        let client = match attempt {
            "pooled connection" => client.clone(),
            _ => testenv::client_from_kubeconfig_yaml(&yaml).await.expect("a fresh client"),
        };
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(30), list_namespaces(&client)).await;
        let took = started.elapsed();
        assert!(matches!(result, Ok(Err(_))), "{attempt}: a request through a cut proxy must fail, got {result:?}");
        assert!(took < FAIL_FAST, "{attempt}: failing took {took:?}, more than {FAIL_FAST:?}");
        eprintln!("{attempt}: failed after {took:?}: {:?}", result.ok().and_then(Result::err));
    }
    assert!(proxy.reset_connections() >= 2, "reset {}", proxy.reset_connections());

    // Heal: requests work again (the same client reconnects).
    proxy.heal();
    assert!(!proxy.is_cut());
    testenv::await_condition(Duration::from_secs(10), "a list through the healed proxy", || async {
        list_namespaces(&client).await.is_ok()
    })
    .await;
}

#[tokio::test]
async fn stalled_proxy_hangs_requests_until_healed() {
    let env = testenv::env();
    let proxy = TcpProxy::start(local(env.kcp.port()));
    let yaml = kubeconfig_via(&env.kcp.kubeconfig_yaml("via-stalled-proxy", &["system:masters"]), proxy.addr());
    let client = testenv::client_from_kubeconfig_yaml(&yaml).await.expect("a client through the proxy");
    list_namespaces(&client).await.expect("list namespaces through the proxy");

    proxy.stall();
    assert!(proxy.is_cut());
    let hung = tokio::time::timeout(Duration::from_secs(2), list_namespaces(&client)).await;
    assert!(hung.is_err(), "a request through a stalled proxy should hang, got {hung:?}");
    let fresh = testenv::client_from_kubeconfig_yaml(&yaml).await.expect("a fresh client");
    let hung = tokio::time::timeout(Duration::from_secs(2), list_namespaces(&fresh)).await;
    assert!(hung.is_err(), "a new connection through a stalled proxy should hang, got {hung:?}");

    proxy.heal();
    testenv::await_condition(Duration::from_secs(10), "a list through the healed proxy", || async {
        list_namespaces(&client).await.is_ok()
    })
    .await;
    testenv::await_condition(Duration::from_secs(5), "the stalled connections to be reset on heal", || async {
        proxy.reset_connections() >= 2
    })
    .await;
}

#[test]
fn kubeconfig_via_rewrites_only_server_urls() {
    let proxy = local(40_001);
    let yaml = "apiVersion: v1\nclusters:\n- name: kcp\n  cluster:\n    server: \"https://127.0.0.1:6443\"\n    \
                certificate-authority-data: abc\n- name: other\n  cluster:\n    server: https://localhost:7443/prefix\n\
                users:\n- name: server-admin\n  user:\n    token: server:x\n";
    let rewritten = kubeconfig_via(yaml, proxy);
    assert_eq!(
        rewritten,
        "apiVersion: v1\nclusters:\n- name: kcp\n  cluster:\n    server: \"https://127.0.0.1:40001\"\n    \
         certificate-authority-data: abc\n- name: other\n  cluster:\n    server: \"https://127.0.0.1:40001/prefix\"\n\
         users:\n- name: server-admin\n  user:\n    token: server:x\n"
    );
}

/// A client for `user` in `cp` (admin there) whose requests carry `user_agent`.
async fn client_with_user_agent(cp: &testenv::ControlPlane, user: &str, user_agent: &str) -> Client {
    let yaml = cp.kubeconfig_yaml(user, &["system:masters"]);
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("a kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("a config");
    config.headers.push((http::header::USER_AGENT, http::HeaderValue::from_str(user_agent).expect("a header value")));
    Client::try_from(config).expect("a client")
}

async fn write_config_map(client: &Client, ns: &str, name: &str) {
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        data: Some(BTreeMap::from([("k".to_owned(), name.to_owned())])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns).create(&PostParams::default(), &cm).await.expect("create");
}

#[tokio::test]
async fn invariant_checker_reads_lease_history_and_skr_writes_from_real_audit_logs() {
    let env = testenv::env();
    let kcp = env.kcp.admin_client();
    let ns = testenv::unique_name("leases");
    testenv::create_namespace(&kcp, &ns).await.expect("lease namespace");
    let skr_ns = testenv::unique_name("writes");
    testenv::create_namespace(&env.skr_a.admin_client(), &skr_ns).await.expect("SKR namespace");
    let user = format!("skr-writer-{ns}-kyma-000");
    let as_a = client_with_user_agent(&env.skr_a, &user, "catalogsync/0.1.0 (replica-a)").await;
    let as_b = client_with_user_agent(&env.skr_a, &user, "catalogsync/0.1.0 (replica-b)").await;
    let leases = Api::<Lease>::namespaced(kcp.clone(), &ns);

    // a holds shard 0 and writes; releases it; writes again (a violation); b takes it and writes.
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(shard_lease_name(0)),
            annotations: Some(BTreeMap::from([("catalogsync.test/desired".to_owned(), "replica-a".to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("replica-a".to_owned()),
            lease_duration_seconds: Some(6),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await.expect("create the shard Lease");
    write_config_map(&as_a, &skr_ns, "by-a-while-holder").await;

    let mut released = leases.get(&shard_lease_name(0)).await.expect("get the shard Lease");
    released.spec.get_or_insert_default().holder_identity = Some(String::new());
    leases.replace(&shard_lease_name(0), &PostParams::default(), &released).await.expect("release (update)");
    write_config_map(&as_a, &skr_ns, "by-a-after-release").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let take = serde_json::json!({"spec": {"holderIdentity": "replica-b", "renewTime": MicroTime(Timestamp::now())}});
    leases.patch(&shard_lease_name(0), &PatchParams::default(), &Patch::Merge(&take)).await.expect("take over (patch)");
    write_config_map(&as_b, &skr_ns, "by-b-while-holder").await;

    // The Lease bodies are in the audit log (blocking mode: before the responses arrived).
    let writes = read_lease_writes(&env.kcp.audit_log_path()).expect("read Lease writes");
    let ours: Vec<_> = writes.iter().filter(|w| w.namespace == ns).collect();
    assert_eq!(ours.iter().map(|w| w.verb.as_str()).collect::<Vec<_>>(), ["create", "update", "patch"]);
    assert_eq!(ours[0].code, 201);
    assert_eq!(ours[0].user, "admin");
    assert_eq!(ours[0].shard(), Some(0));
    assert_eq!(ours[0].lease_duration_seconds, Some(6));
    assert!(ours[0].renew_time.is_some());
    assert_eq!(ours[0].annotations.get("catalogsync.test/desired").map(String::as_str), Some("replica-a"));

    let report = check_invariants(&InvariantInput {
        kcp_audit_log: env.kcp.audit_log_path(),
        skr_audit_logs: vec![env.skr_a.audit_log_path()],
        shard_of_user: BTreeMap::from([(user.clone(), 0)]),
        options: InvariantOptions { lease_namespace: Some(ns.clone()), ..InvariantOptions::default() },
    })
    .expect("check the invariants");
    eprintln!("{report}");
    assert_eq!(report.holder_sequence(0), ["replica-a", "", "replica-b"], "{report}");
    assert_eq!(report.skr_writes_checked, 3, "{report}");
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(
        report.violations[0].contains("by-a-after-release")
            && report.violations[0].contains("\"replica-a\"")
            && report.violations[0].contains("holder then \"\""),
        "{report}"
    );
    let writers: Vec<&str> = report.writers_per_user[&user].iter().map(String::as_str).collect();
    assert_eq!(writers, ["replica-a", "replica-b"]);
    assert_eq!(report.multi_writer_users, std::slice::from_ref(&user));
    assert_eq!(report.longest_unowned_shard, Some(0), "{report}");
    assert!(report.longest_unowned >= Duration::from_millis(300), "{report}");
    assert!(report.longest_unowned < Duration::from_secs(10), "{report}");
}

#[tokio::test]
async fn fleet_creates_kymas_and_runs_replicas_by_identity() {
    let env = testenv::env();
    let mut fleet = Fleet::new("fleet", &[&env.skr_a, &env.skr_b], 3).await.expect("a fleet");
    assert_eq!(fleet.kyma_names(), ["kyma-000", "kyma-001", "kyma-002"]);
    let skrs: Vec<&str> = fleet.kymas.iter().map(|k| k.skr.as_str()).collect();
    assert_eq!(skrs, ["skr-a", "skr-b", "skr-a"]);
    let kymas = fleet.scenario.kymas().list(&ListParams::default()).await.expect("list Kymas");
    assert_eq!(kymas.items.len(), 3);
    let secrets = Api::<Secret>::namespaced(fleet.scenario.kcp.clone(), fleet.ns())
        .list(&ListParams::default())
        .await
        .expect("list Secrets");
    let mut names: Vec<String> = secrets.items.iter().map(ResourceExt::name_any).collect();
    names.sort();
    assert_eq!(names, fleet.kyma_names(), "one access Secret per Kyma");
    let users = fleet.shard_of_user(|_, name| u32::from(name.ends_with('1')));
    assert_eq!(users.len(), 3);
    assert_eq!(users[&fleet.scenario.skr_user("kyma-001")], 1);

    let args = fleet.sharding_args(4);
    let flags: Vec<&str> = args.iter().map(String::as_str).collect();
    fleet.spawn_replica("r0", &flags).expect("spawn r0");
    assert!(fleet.spawn_replica("r0", &flags).is_err(), "a second r0 while r0 runs");
    fleet.spawn_replica_via_proxy("r1", &flags).expect("spawn r1 via a proxy");
    assert_ne!(fleet.http_port("r0"), fleet.http_port("r1"));
    assert!(fleet.proxy("r0").is_none());
    assert_eq!(fleet.replicas(), ["r0", "r1"]);
    // Readiness is the controller's business; the harness needs the processes serving.
    fleet.await_http_ok("r0", "/healthz", Duration::from_secs(30)).await;
    fleet.await_http_ok("r1", "/healthz", Duration::from_secs(30)).await;
    let proxy = fleet.proxy("r1").expect("r1's proxy");
    testenv::await_condition(Duration::from_secs(30), "r1 to reach the KCP through its proxy", || async {
        proxy.accepted_connections() >= 1
    })
    .await;
    let kubeconfig = std::fs::read_to_string(fleet.kubeconfig("r1").expect("r1's kubeconfig")).expect("read it");
    assert!(kubeconfig.contains(&proxy.url()), "{kubeconfig}");

    // Whether the exit is clean is the controller's business; the harness needs it to end.
    let status = fleet.terminate("r0").await.expect("r0 exits on SIGTERM");
    eprintln!("r0 exited with {status} after SIGTERM");
    let killed = fleet.kill("r1").expect("r1's exit status");
    assert!(!killed.success(), "SIGKILL: {killed}");
    assert!(fleet.running_replicas().is_empty());
    fleet.spawn_replica("r0", &flags).expect("r0 again after it exited");
    assert!(fleet.is_running("r0"));
    assert_eq!(fleet.running_replicas(), ["r0"]);
}
