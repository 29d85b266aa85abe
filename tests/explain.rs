//! `catalogsync explain` against real apiservers, run as the built binary under catalogsync's
//! ServiceAccount identity and the RBAC of `deploy/rbac/`:
//!
//! - every reason it gives for a catalog entry a Kyma does not get, and a desired set equal to
//!   what the controller computes (`desired_set` on the same KCP objects) and what a
//!   controller run wrote to the SKR;
//! - with `--skr`, an SKR holding a tampered copy, a missing one, an extra managed one and a
//!   user-owned one, read without a single write;
//! - the failures: no such Kyma (exit 1, nothing on stdout), no access Secret, an unreachable
//!   SKR, an SKR that refuses, and access Secrets pointing where the controller refuses to go
//!   (exit 3, the KCP part printed, no connection made, nothing of the Secret printed).
//!
//! Malformed catalog objects cannot pass the CRDs' schemas, so the unit tests of
//! `catalog::explain` cover those.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use catalogsync::catalog::{Snapshot, desired_set};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::hostile::{Behaviour, HostileSkr};
use testenv::scenario::{MRM, MT, Scenario, labelled, mrm, mt};

const PROMPT: Duration = Duration::from_secs(20);
/// Longest an explain run may take: a few KCP lists and, with `--skr`, two SKR lists.
const EXPLAIN_TIMEOUT: Duration = Duration::from_secs(60);
const BETA: &str = "operator.kyma-project.io/beta";
const INTERNAL: &str = "operator.kyma-project.io/internal";
const REGION: &str = "kyma-project.io/region";
const RESTRICTED: &str = "sap-btp,east-only,nosel,emptysel,badsel";

/// One catalog entry per reason (the comments name the verdict for a plain Kyma in `eu`).
fn catalog() -> Vec<Value> {
    let with_spec = |mut body: Value, key: &str, value: Value| {
        body["spec"][key] = value;
        body
    };
    let selected =
        |module: &str, selector: Value| with_spec(mrm(module, &[("regular", "1.0.0")]), "kymaSelector", selector);
    let mut legacy = mt("legacy", "1.0.0");
    legacy["spec"].as_object_mut().map(|s| s.remove("moduleName"));
    let mut istio = with_spec(mrm("istio", &[]), "mandatory", json!({"version": "1.20.0"}));
    istio["spec"].as_object_mut().map(|s| s.remove("channels"));
    vec![
        // Desired, with an old version no channel offers (not_referenced).
        mt("api-gateway", "2.9.0"),
        mt("api-gateway", "2.10.0"),
        mt("api-gateway", "2.11.0"),
        mrm("api-gateway", &[("regular", "2.10.0"), ("fast", "2.11.0")]),
        // Desired with its beta channel cut (template_beta); the beta MT is not desired (beta).
        mt("btp-operator", "1.1.0"),
        labelled(mt("btp-operator", "1.2.0"), BETA, "true"),
        mrm("btp-operator", &[("regular", "1.1.0"), ("fast", "1.2.0")]),
        // Internal only: no channel survives.
        labelled(mt("serverless", "1.6.0"), INTERNAL, "true"),
        mrm("serverless", &[("experimental", "1.6.0")]),
        // Mandatory.
        with_spec(mt("istio", "1.20.0"), "mandatory", json!(true)),
        istio,
        // Restricted, matching.
        mt("sap-btp", "1.0.0"),
        selected("sap-btp", json!({"matchLabels": {REGION: "eu"}})),
        // Restricted, not matching.
        mt("east-only", "1.0.0"),
        selected("east-only", json!({"matchLabels": {REGION: "us"}})),
        // Restricted without a selector, and with an empty one.
        mt("nosel", "1.0.0"),
        mrm("nosel", &[("regular", "1.0.0")]),
        mt("emptysel", "1.0.0"),
        selected("emptysel", json!({})),
        // Restricted with an invalid selector.
        mt("badsel", "1.0.0"),
        selected("badsel", json!({"matchExpressions": [{"key": REGION, "operator": "Like", "values": ["eu"]}]})),
        // A selector on a module that is not restricted.
        mt("keda", "1.0.0"),
        selected("keda", json!({"matchLabels": {REGION: "eu"}})),
        // A channel whose version has no ModuleTemplate.
        mrm("ghost", &[("regular", "3.0.0")]),
        // Old-style.
        legacy,
    ]
}

/// Runs the catalogsync binary with `args`, the KCP kubeconfig at `kubeconfig` and no other
/// environment (so nothing of the test's environment sets a flag). Returns exit code, stdout
/// and stderr.
async fn catalogsync(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let run = tokio::process::Command::new(testenv::catalogsync_bin())
        .args(args)
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(EXPLAIN_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("catalogsync {args:?} did not end within {EXPLAIN_TIMEOUT:?}"))
        .expect("run catalogsync");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("UTF-8 output");
    (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
}

/// `catalogsync explain <kyma> -o json` for scenario `s` with the flags of its controller and
/// `extra`.
async fn explain(s: &Scenario, kyma: &str, extra: &[&str]) -> (i32, String, String) {
    let kubeconfig = testenv::catalogsync_kubeconfig(&testenv::env().kcp, s.dir.path());
    let mut args = vec![
        "explain",
        kyma,
        "-o",
        "json",
        "--kcp-namespace",
        &s.ns,
        "--sync-namespace",
        &s.sync_ns,
        "--restricted-modules",
        RESTRICTED,
        "--skr-request-timeout",
        "3s",
    ];
    if !extra.iter().any(|a| a.starts_with("--skr-allowed-destinations")) {
        args.extend_from_slice(&["--skr-allowed-destinations", testenv::SKR_DESTINATIONS]);
    }
    args.extend_from_slice(extra);
    catalogsync(&kubeconfig, &args).await
}

fn parse(stdout: &str, stderr: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("stdout is no JSON ({e}):\n{stdout}\nstderr:\n{stderr}"))
}

/// `name` -> `reason` of the entries of a verdict list (`null` reasons as "").
fn reasons(list: &Value) -> BTreeMap<String, String> {
    list.as_array()
        .expect("a list of verdicts")
        .iter()
        .map(|v| (v["name"].as_str().expect("a name").to_owned(), v["reason"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

fn strings(value: &Value) -> BTreeSet<String> {
    value.as_array().expect("a list").iter().map(|v| v.as_str().expect("a string").to_owned()).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// What the controller's filter computes for `labels`, from the KCP objects as they are now.
async fn controller_desired(s: &Scenario, labels: &[(&str, &str)]) -> (BTreeSet<String>, BTreeSet<String>) {
    let list = |plural| async move {
        s.catalog_api(plural).list(&ListParams::default()).await.expect("list the catalog").items
    };
    let (mts, mrms): (Vec<DynamicObject>, Vec<DynamicObject>) = (list(MT).await, list(MRM).await);
    let snapshot = Snapshot::build(&mts, &mrms, &s.sync_ns);
    let labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let restricted = RESTRICTED.split(',').map(str::to_owned).collect();
    let (desired, _) = desired_set(&snapshot, &labels, &restricted);
    (desired.release_metas.into_keys().collect(), desired.templates.into_keys().collect())
}

#[tokio::test]
async fn explains_every_reason_and_agrees_with_the_controller() {
    let env = testenv::env();
    let mut s = Scenario::new("explain").await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    let eu = [(REGION, "eu")];
    s.add_kyma("eu", &env.skr_a, &eu).await.expect("kyma");

    let (code, stdout, stderr) = explain(&s, "eu", &[]).await;
    assert_eq!(code, 0, "stderr: {stderr}");
    let report = parse(&stdout, &stderr);
    assert_eq!(
        report["kyma"],
        json!({"name": "eu", "namespace": s.ns, "beta": false, "internal": false, "leftAlone": null})
    );
    let release_metas = reasons(&report["moduleReleaseMetas"]);
    let expected: BTreeMap<String, String> = [
        ("api-gateway", ""),
        ("btp-operator", ""),
        ("sap-btp", ""),
        ("serverless", "no_channel_survives"),
        ("istio", "mandatory"),
        ("east-only", "selector_does_not_match"),
        ("nosel", "restricted_without_selector"),
        ("emptysel", "restricted_empty_selector"),
        ("badsel", "invalid_selector"),
        ("keda", "selector_on_unrestricted_module"),
        ("ghost", "no_channel_survives"),
    ]
    .iter()
    .map(|(n, r)| ((*n).to_owned(), (*r).to_owned()))
    .collect();
    assert_eq!(release_metas, expected);
    let templates = reasons(&report["moduleTemplates"]);
    let expected: BTreeMap<String, String> = [
        ("api-gateway-2.9.0", "not_referenced"),
        ("api-gateway-2.10.0", ""),
        ("api-gateway-2.11.0", ""),
        ("btp-operator-1.1.0", ""),
        ("btp-operator-1.2.0", "beta"),
        ("serverless-1.6.0", "internal"),
        ("istio-1.20.0", "mandatory"),
        ("sap-btp-1.0.0", ""),
        ("east-only-1.0.0", "not_referenced"),
        ("nosel-1.0.0", "not_referenced"),
        ("emptysel-1.0.0", "not_referenced"),
        ("badsel-1.0.0", "not_referenced"),
        ("keda-1.0.0", "not_referenced"),
    ]
    .iter()
    .map(|(n, r)| ((*n).to_owned(), (*r).to_owned()))
    .collect();
    assert_eq!(templates, expected);
    assert_eq!(strings(&report["oldStyleTemplates"]), set(&["legacy-1.0.0"]));
    assert_eq!(report["malformed"], json!([]));

    // The channels say why they are cut.
    let channels = |name: &str| {
        let mrm = report["moduleReleaseMetas"].as_array().expect("list").iter().find(|m| m["name"] == name).cloned();
        mrm.unwrap_or_else(|| panic!("no {name}"))["channels"].clone()
    };
    assert_eq!(channels("btp-operator")[1]["reason"], "template_beta");
    assert_eq!(channels("serverless")[0]["reason"], "template_internal");
    assert_eq!(
        channels("ghost")[0],
        json!({"channel": "regular", "version": "3.0.0", "template": "ghost-3.0.0", "survives": false, "reason": "no_template"})
    );
    let badsel = report["moduleReleaseMetas"].as_array().expect("list").iter().find(|m| m["name"] == "badsel").cloned();
    assert!(badsel.expect("badsel")["detail"].as_str().is_some_and(|d| d.contains("unknown operator")));

    // The desired set is the controller's filter on the same objects ...
    let (want_mrms, want_mts) = controller_desired(&s, &eu).await;
    assert_eq!(strings(&report["desired"]["moduleReleaseMetas"]), want_mrms);
    assert_eq!(strings(&report["desired"]["moduleTemplates"]), want_mts);
    assert_eq!(want_mrms, set(&["api-gateway", "btp-operator", "sap-btp"]));
    // ... and what a controller run writes to the SKR.
    s.start(&["--restricted-modules", RESTRICTED]).expect("start");
    s.await_condition("eu", "True", "CatalogSynced", PROMPT).await;
    assert_eq!(s.skr_names(&env.skr_a, MRM).await, want_mrms);
    assert_eq!(s.skr_names(&env.skr_a, MT).await, want_mts);
    let synced = s.catalogsync.as_mut().expect("started").terminate(PROMPT).await.expect("stops");
    assert!(synced.success(), "the controller exited with {synced}");

    // Now the SKR drifts: a copy is changed, one deleted, a managed one left over, one made by
    // someone else.
    let skr_mts = s.skr_api(&env.skr_a, MT);
    let tamper = json!({"spec": {"info": {"repository": "https://example.com/tampered", "documentation": "x"}}});
    skr_mts.patch("api-gateway-2.10.0", &PatchParams::default(), &Patch::Merge(&tamper)).await.expect("tamper");
    skr_mts.delete("btp-operator-1.1.0", &DeleteParams::default()).await.expect("delete");
    let copy_of = |module: &str, version: &str| {
        let mut body = mt(module, version);
        body["metadata"]["namespace"] = json!(s.sync_ns);
        body
    };
    let managed = PatchParams::apply(catalogsync::api::SKR_FIELD_MANAGER).force();
    skr_mts.patch("stale-1.0.0", &managed, &Patch::Apply(&copy_of("stale", "1.0.0"))).await.expect("stale copy");
    let someone = PatchParams::apply("someone-else");
    skr_mts.patch("mine-1.0.0", &someone, &Patch::Apply(&copy_of("mine", "1.0.0"))).await.expect("user object");

    let (code, stdout, stderr) = explain(&s, "eu", &["--skr"]).await;
    assert_eq!(code, 0, "a disagreeing SKR is no failure; stderr: {stderr}");
    let skr = &parse(&stdout, &stderr)["skr"];
    assert_eq!(skr["error"], json!(null));
    assert_eq!(skr["accessSecret"], "eu");
    assert_eq!(skr["agrees"], false);
    let mut in_agreement = want_mts.clone();
    in_agreement.remove("api-gateway-2.10.0");
    in_agreement.remove("btp-operator-1.1.0");
    let mts = &skr["moduleTemplates"];
    assert_eq!(strings(&mts["inAgreement"]), in_agreement);
    assert_eq!(strings(&mts["different"]), set(&["api-gateway-2.10.0"]));
    assert_eq!(strings(&mts["missing"]), set(&["btp-operator-1.1.0"]));
    assert_eq!(strings(&mts["extra"]), set(&["stale-1.0.0"]));
    assert_eq!(strings(&mts["userOwned"]), set(&["mine-1.0.0"]));
    let mrms = &skr["moduleReleaseMetas"];
    assert_eq!(strings(&mrms["inAgreement"]), want_mrms);
    for bucket in ["missing", "different", "extra", "userOwned"] {
        assert_eq!(mrms[bucket], json!([]), "{bucket}");
    }

    // The table says the same.
    let kubeconfig = testenv::catalogsync_kubeconfig(&env.kcp, s.dir.path());
    let (code, table, stderr) = catalogsync(
        &kubeconfig,
        &[
            "explain",
            "eu",
            "--skr",
            "--kcp-namespace",
            &s.ns,
            "--sync-namespace",
            &s.sync_ns,
            "--restricted-modules",
            RESTRICTED,
            "--skr-allowed-destinations",
            testenv::SKR_DESTINATIONS,
        ],
    )
    .await;
    assert_eq!(code, 0, "stderr: {stderr}");
    for line in [
        "ModuleTemplate different (a sync applies it): api-gateway-2.10.0",
        "ModuleTemplate missing (a sync applies it): btp-operator-1.1.0",
        "ModuleTemplate extra (a sync prunes it): stale-1.0.0",
        "ModuleTemplate user-owned (never touched): mine-1.0.0",
    ] {
        assert!(table.lines().any(|l| l == line), "no line {line:?} in\n{table}");
    }
    assert!(table.contains("selector_does_not_match"), "{table}");

    // explain only read the SKR.
    let ours: Vec<_> = env
        .skr_a
        .read_audit_events()
        .into_iter()
        .filter(|e| e.user_agent.as_deref().is_some_and(|a| a.starts_with("catalogsync/") && a.contains("(explain)")))
        .collect();
    assert!(ours.iter().any(|e| e.verb == "list"), "explain listed nothing in the SKR");
    let writes: Vec<_> = ours.iter().filter(|e| !matches!(e.verb.as_str(), "get" | "list")).collect();
    assert!(writes.is_empty(), "explain wrote to the SKR: {writes:?}");
}

#[tokio::test]
async fn a_kyma_that_does_not_exist_explains_nothing() {
    let s = Scenario::new("explain-none").await.expect("scenario");
    let (code, stdout, stderr) = explain(&s, "nowhere", &["--skr"]).await;
    assert_eq!(code, 1, "stdout: {stdout}");
    assert_eq!(stdout, "");
    assert!(stderr.contains(&format!("kyma nowhere does not exist in namespace {}", s.ns)), "{stderr}");
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// Each SKR failure prints the KCP part, exits 3 and names the reason the controller's
/// condition would give; a Secret pointing where the controller refuses to go is refused
/// without a connection, and nothing of any Secret is printed.
#[tokio::test]
async fn skr_failures_print_the_kcp_part_and_name_the_reason() {
    const TOKEN: &str = "explain-secret-token-4b1d";
    let env = testenv::env();
    let s = Scenario::new("explain-fail").await.expect("scenario");
    s.apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])]).await.expect("catalog");
    let refusing = HostileSkr::start(loopback(1), Behaviour::Record).expect("a refusing SKR");
    let outside = HostileSkr::start(loopback(2), Behaviour::Record).expect("an SKR outside the allowed destinations");
    let closed = testenv::process::free_port().expect("a free port");
    let with_token = |server: &str, ca: &str| {
        testenv::controlplane::render_kubeconfig(
            "skr",
            server,
            ca,
            "admin",
            &testenv::controlplane::token_credentials(TOKEN),
        )
    };
    let cases: Vec<(&str, Option<String>, &str, &str)> = vec![
        ("no-secret", None, "AccessSecretMissing", "found no access secret labelled"),
        (
            "unreachable",
            Some(with_token(&format!("https://127.0.0.1:{closed}"), refusing.ca_pem())),
            "SkrUnreachable",
            "failed to list ModuleTemplate objects in the SKR",
        ),
        (
            "refusing",
            Some(refusing.kubeconfig_with_token(TOKEN)),
            "SkrForbidden",
            "failed to list ModuleTemplate objects in the SKR",
        ),
        (
            "outside",
            Some(outside.kubeconfig_with_token(TOKEN)),
            "AccessSecretInvalid",
            "clusters[0].cluster.server is a loopback address, which --skr-allowed-destinations does not allow",
        ),
        (
            "kcp",
            Some(with_token(&env.kcp.url(), env.kcp.ca_pem())),
            "AccessSecretInvalid",
            "clusters[0].cluster.server is the KCP apiserver",
        ),
        (
            "plain-http",
            Some(with_token(&refusing.url().replace("https://", "http://"), refusing.ca_pem())),
            "AccessSecretInvalid",
            "clusters[0].cluster.server",
        ),
    ];
    for (kyma, kubeconfig, _, _) in &cases {
        if let Some(kubeconfig) = kubeconfig {
            s.put_secret(kyma, kyma, kubeconfig).await.expect("secret");
        }
        s.add_kyma_without_secret(kyma, &[]).await.expect("kyma");
    }
    for (kyma, _, reason, message) in &cases {
        // 127.0.0.1 is allowed, 127.0.0.2 is not (as in tests/security.rs).
        let (code, stdout, stderr) = explain(&s, kyma, &["--skr", "--skr-allowed-destinations", "127.0.0.1/32"]).await;
        assert_eq!(code, 3, "{kyma}: stdout {stdout}\nstderr {stderr}");
        let report = parse(&stdout, &stderr);
        assert_eq!(strings(&report["desired"]["moduleTemplates"]), set(&["keda-1.0.0"]), "{kyma}: the KCP part");
        let error = &report["skr"]["error"];
        assert_eq!(error["reason"], *reason, "{kyma}: {error}");
        assert!(error["message"].as_str().is_some_and(|m| m.contains(message)), "{kyma}: {error}");
        assert!(stderr.contains(reason) && stderr.contains(message), "{kyma}: {stderr}");
        assert_eq!(report["skr"]["agrees"], json!(null), "{kyma}");
        for text in [&stdout, &stderr] {
            assert!(!text.contains(TOKEN) && !text.contains(&TOKEN[..12]), "{kyma}: the Secret's token is printed");
        }
    }
    assert_eq!(outside.connections(), 0, "explain connected to a server the controller refuses");
    let requests = refusing.recorded();
    assert!(!requests.is_empty(), "the refusing SKR was asked nothing");
    assert!(requests.iter().all(|r| r.method == "GET"), "explain sent more than reads: {requests:?}");
}
