//! Smoke test of the test harness itself: the shared KCP and SKRs start, answer, are
//! isolated from each other, audit every request, survive a restart and enforce RBAC.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};

#[tokio::test]
async fn harness_starts_isolated_audited_restartable_control_planes() {
    let started = Instant::now();
    let env = testenv::env();
    eprintln!(
        "env() returned after {:.1}s (start itself {:.1}s; apiservers ready after kcp {:.1}s, skr-a {:.1}s, skr-b {:.1}s)",
        started.elapsed().as_secs_f64(),
        env.started_in().as_secs_f64(),
        env.kcp.last_ready_after().as_secs_f64(),
        env.skr_a.last_ready_after().as_secs_f64(),
        env.skr_b.last_ready_after().as_secs_f64(),
    );

    for cp in [&env.kcp, &env.skr_a, &env.skr_b] {
        let version = cp.admin_client().apiserver_version().await.expect("GET /version");
        assert_eq!(version.git_version, "v1.35.4", "version of {}", cp.name());
        Api::<Namespace>::all(cp.admin_client()).list(&ListParams::default()).await.expect("list namespaces");
    }

    // CRDs go into the KCP only; the control planes share etcd but not data.
    let names = testenv::install_catalogsync_crds(&env.kcp).await.expect("install CRDs into the KCP");
    assert!(names.iter().any(|n| n == "moduletemplates.operator.kyma-project.io"), "installed {names:?}");
    for skr in [&env.skr_a, &env.skr_b] {
        let crds = Api::<CustomResourceDefinition>::all(skr.admin_client())
            .list(&ListParams::default())
            .await
            .expect("list CRDs");
        assert!(crds.items.is_empty(), "{} has CRDs it should not: {:?}", skr.name(), crds.items);
    }

    // Every request is in the audit log, with its user, by the time the response arrives.
    let ns = testenv::unique_name("smoke");
    testenv::create_namespace(&env.kcp.admin_client(), &ns).await.expect("create a namespace");
    let events = env.kcp.read_audit_events();
    let create = events
        .iter()
        .find(|e| e.verb == "create" && e.resource() == "namespaces" && e.name() == Some(ns.as_str()))
        .unwrap_or_else(|| panic!("no audit event for creating namespace {ns} among {} events", events.len()));
    assert_eq!(create.user.username, "admin");
    assert_eq!(create.code(), 201);
    assert_eq!(create.stage, "ResponseComplete");

    // An SKR can be stopped (its clients fail) and restarted with its data.
    let restart_started = Instant::now();
    env.skr_b.stop();
    assert!(env.skr_b.admin_client().apiserver_version().await.is_err(), "skr-b answers while stopped");
    env.skr_b.restart().await.expect("restart skr-b");
    eprintln!("skr-b stop + restart took {:.1}s", restart_started.elapsed().as_secs_f64());
    testenv::await_condition(Duration::from_secs(10), "skr-b to answer /version after restart", || async {
        env.skr_b.admin_client().apiserver_version().await.is_ok()
    })
    .await;

    // RBAC is enforced: an issued identity with no bindings may not list Secrets.
    let client = env.kcp.client_for("nobody", &["some-team"]).await.expect("client for nobody");
    match Api::<Secret>::namespaced(client, "default").list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("listing Secrets as nobody should be forbidden, got {other:?}"),
    }
    let denied = env.kcp.read_audit_events().into_iter().any(|e| e.user.username == "nobody" && e.code() == 403);
    assert!(denied, "no audit event for the forbidden request");

    // Kubeconfig data fields are standard base64 (RFC 4648 test vectors).
    for (input, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
        assert_eq!(testenv::pki::base64(input.as_bytes()), want);
    }

    // The catalogsync identity carries both ServiceAccount groups.
    let path = testenv::catalogsync_kubeconfig(&env.kcp, env.dir());
    let yaml = std::fs::read_to_string(&path).expect("read the catalogsync kubeconfig");
    let sa = testenv::client_from_kubeconfig_yaml(&yaml).await.expect("catalogsync client");
    let _ = Api::<Secret>::namespaced(sa, "default").list(&ListParams::default()).await;
    let sa_event = env
        .kcp
        .read_audit_events()
        .into_iter()
        .rfind(|e| e.user.username == testenv::CATALOGSYNC_USER)
        .expect("an audit event of the catalogsync identity");
    for group in testenv::CATALOGSYNC_GROUPS {
        assert!(sa_event.user.groups.iter().any(|g| g == group), "group {group} missing in {:?}", sa_event.user.groups);
    }
}
