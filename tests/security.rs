//! Hostile access Secrets and hostile SKRs (docs/operations.md, "Security model"), each
//! attack tried for real: catalogsync runs as a process against the real KCP and SKR
//! apiservers, a test server of our own plays the target or the hostile SKR, and a healthy
//! Kyma beside the attacked ones must keep syncing.
//!
//! Bounds these tests state and check:
//! - a rejected kubeconfig makes no connection at all to where it points;
//! - the replica's peak RSS stays under [`RSS_BOUND_MIB`], whatever the Secrets point at
//!   (`/dev/zero` included) or the SKRs send (bodies of 64 MiB, endless or trickled ones);
//! - no log line is longer than [`LOG_LINE_BOUND`] bytes;
//! - a token of a Secret appears in no condition, Event, log line, metric or `/debug/shards`.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::hostile::{Behaviour, HostileSkr};
use testenv::pki::base64;
use testenv::scenario::{MRM, MT, Scenario, mrm, mt};

/// A failure must show in the condition well within this.
const PROMPT: Duration = Duration::from_secs(20);

/// Peak RSS (VmHWM) a replica may reach in these tests, in MiB. An idle replica of the
/// tests is about 20-30 MiB; the SKR answer limit is 8 MiB per answer.
const RSS_BOUND_MIB: u64 = 150;

/// Longest log line accepted, in bytes: a condition message is at most 1,024 characters and
/// SKR-sent text at most 256.
const LOG_LINE_BOUND: usize = 4096;

/// The SKR request timeout the scenarios run with (`Scenario::start`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

fn catalog() -> Vec<Value> {
    vec![mt("api-gateway", "2.10.0"), mrm("api-gateway", &[("regular", "2.10.0")])]
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// A kubeconfig for `server` (trusting `ca_pem`) whose user has `user_fields` (lines
/// indented by four spaces).
fn kubeconfig(server: &str, ca_pem: &str, user_fields: &str) -> String {
    testenv::controlplane::render_kubeconfig("skr", server, ca_pem, "admin", user_fields)
}

/// Every kubeconfig form that must be refused points at a server catalogsync is allowed to
/// reach (127.0.0.1), so only the allowlist stands between it and the request; one more
/// points at a server outside `--skr-allowed-destinations` (127.0.0.2), one at the KCP
/// itself. None of them may make a single connection, run a command or read a file; each
/// fails its own Kyma with `AccessSecretInvalid` naming the field; the healthy Kyma syncs.
#[tokio::test]
async fn refused_kubeconfigs_reach_nothing_and_fail_alone() {
    let env = testenv::env();
    let target = HostileSkr::start(loopback(1), Behaviour::Record).expect("target");
    let outside = HostileSkr::start(loopback(2), Behaviour::Record).expect("outside target");
    let mut s = Scenario::new("sec-kubeconfig").await.expect("scenario");
    let dir = s.dir.path().to_path_buf();

    // A token in a file the tokenFile form names; a marker the exec form would create.
    let token_file = dir.join("stolen-token");
    std::fs::write(&token_file, "file-token-7a3f9e").expect("token file");
    let marker = dir.join("exec-ran");
    let cert_file = dir.join("client.crt");
    std::fs::write(&cert_file, "not read").expect("cert file");

    let (url, ca) = (target.url(), target.ca_pem().to_owned());
    let exec = format!(
        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: ['-c', 'touch {} && echo {{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"x\"}}}}']",
        marker.display()
    );
    let with_ca = kubeconfig(&url, &ca, "    token: fine");
    let ca_line = format!("    certificate-authority-data: {}", base64(ca.as_bytes()));
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "token-file",
            kubeconfig(&url, &ca, &format!("    tokenFile: {}", token_file.display())),
            "users[0].user.tokenFile",
        ),
        ("exec", kubeconfig(&url, &ca, &exec), "users[0].user.exec"),
        (
            "auth-provider",
            kubeconfig(&url, &ca, "    auth-provider:\n      name: oidc\n      config: {id-token: x}"),
            "users[0].user.auth-provider",
        ),
        (
            "file-paths",
            with_ca.replace(&ca_line, "    certificate-authority: /dev/zero").replace(
                "    token: fine",
                &format!("    client-certificate: {}\n    client-key: /dev/zero", cert_file.display()),
            ),
            "clusters[0].cluster.certificate-authority",
        ),
        (
            "client-key-file",
            kubeconfig(
                &url,
                &ca,
                &format!("    client-certificate: {}\n    client-key: /dev/zero", cert_file.display()),
            ),
            "users[0].user.client-",
        ),
        (
            "insecure",
            with_ca.replace(&ca_line, "    insecure-skip-tls-verify: true"),
            "clusters[0].cluster.insecure-skip-tls-verify",
        ),
        (
            "plain-http",
            kubeconfig(&url.replace("https://", "http://"), &ca, "    token: fine"),
            "clusters[0].cluster.server",
        ),
        (
            "outside",
            kubeconfig(&outside.url(), outside.ca_pem(), "    token: fine"),
            "clusters[0].cluster.server is a loopback address, which --skr-allowed-destinations does not allow",
        ),
        (
            // The KCP's own CA, so a connection would reach its audit log.
            "kcp",
            kubeconfig(&env.kcp.url(), env.kcp.ca_pem(), "    token: fine"),
            "clusters[0].cluster.server is the KCP apiserver",
        ),
    ];
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("healthy kyma");
    for (kyma, config, _) in &cases {
        s.put_secret(kyma, kyma, config).await.expect("secret");
        s.add_kyma_without_secret(kyma, &[]).await.expect("kyma");
    }
    // 127.0.0.1 (the SKR apiservers and the target) is allowed; 127.0.0.2 is not.
    s.start(&["--skr-allowed-destinations", "127.0.0.1/32"]).expect("start");

    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0"], PROMPT).await;
    for (kyma, _, field) in &cases {
        let cond = s.await_condition(kyma, "False", "AccessSecretInvalid", PROMPT).await;
        assert!(cond.message.contains(field), "{kyma}: the condition does not name {field}: {}", cond.message);
        for secret in ["file-token-7a3f9e", "/dev/zero", "/bin/sh", "fine"] {
            assert!(!cond.message.contains(secret), "{kyma}: the condition quotes the Secret: {}", cond.message);
        }
        let event = s.await_kyma_event(kyma, "AccessSecretInvalid", PROMPT).await;
        assert!(event.note.as_deref().is_some_and(|n| n.contains(field)), "{kyma}: {event:?}");
    }
    // Failed syncs retry with backoff (0.5 s to 3 s here): give them a few rounds.
    tokio::time::sleep(Duration::from_secs(4)).await;

    assert_eq!(target.connections(), 0, "a refused kubeconfig connected: {:?}", target.recorded());
    assert_eq!(outside.connections(), 0, "a server outside the allowed destinations was contacted");
    assert!(!marker.exists(), "the exec plugin ran");
    let kcp_requests = env
        .kcp
        .read_audit_events()
        .into_iter()
        .filter(|e| e.user.username.is_empty() || e.user.username == "system:anonymous")
        .count();
    assert_eq!(kcp_requests, 0, "someone reached the KCP without credentials");
    let rss = s.peak_rss_mib();
    eprintln!("peak RSS of the replica with {} refused kubeconfigs: {rss} MiB", cases.len());
    assert!(rss < RSS_BOUND_MIB, "peak RSS {rss} MiB (bound {RSS_BOUND_MIB} MiB)");
    let long = s.long_log_lines(LOG_LINE_BOUND);
    assert!(long.is_empty(), "log lines over {LOG_LINE_BOUND} bytes: {long:?}");
    assert!(!s.log().contains("file-token-7a3f9e"), "the file's token is in the log");

    // The healthy Kyma still gets catalog changes.
    s.apply_catalog(&[mt("keda", "1.3.0"), mrm("keda", &[("regular", "1.3.0")])]).await.expect("change");
    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "keda-1.3.0"], PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "keda"], PROMPT).await;
    assert!(s.catalogsync_running(), "catalogsync exited");
}

/// A kubeconfig that does not parse, holding a token (and a client-side `kubectl apply`
/// annotation holding it again): the token is in no condition, Event, log line, metric or
/// `/debug/shards` output.
#[tokio::test]
async fn a_broken_kubeconfig_leaks_its_token_nowhere() {
    const TOKEN: &str = "leaky-token-c0ffee-5d1e";
    let env = testenv::env();
    let mut s = Scenario::new("sec-leak").await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("healthy kyma");
    // Broken on the line after the token: YAML parsers like to quote the lines around.
    let broken = format!(
        "apiVersion: v1\nclusters:\n- name: skr\n  cluster:\n    server: https://127.0.0.1:1\nusers:\n- name: u\n  user:\n    token: {TOKEN}\n  - [broken\n"
    );
    s.put_secret("broken", "broken", &broken).await.expect("secret");
    let annotated = serde_json::json!({"metadata": {"annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": format!("{{\"stringData\":{{\"config\":\"token: {TOKEN}\"}}}}"),
    }}});
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(s.kcp.clone(), &s.ns)
        .patch("broken", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&annotated))
        .await
        .expect("annotate");
    s.add_kyma_without_secret("broken", &[]).await.expect("kyma");
    s.start(&[]).expect("start");

    let cond = s.await_condition("broken", "False", "AccessSecretInvalid", PROMPT).await;
    assert!(cond.message.contains("the kubeconfig is not valid YAML (line"), "{}", cond.message);
    s.await_kyma_event("broken", "AccessSecretInvalid", PROMPT).await;
    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;

    let mut places: Vec<(String, String)> = vec![("condition".into(), cond.message.clone())];
    for event in s.kyma_events("broken").await {
        places.push(("event".into(), serde_json::to_string(&event).expect("json")));
    }
    places.push(("log".into(), s.log()));
    places.push(("metrics".into(), s.http_get("/metrics").await.expect("metrics").1));
    places.push(("debug/shards".into(), s.http_get("/debug/shards").await.expect("debug").1));
    let kyma = s.kymas().get("broken").await.expect("kyma");
    places.push(("kyma".into(), serde_json::to_string(&kyma).expect("json")));
    for (place, text) in &places {
        assert!(!text.is_empty() || place == "debug/shards", "nothing read from {place}");
        assert!(!text.contains(TOKEN), "the token is in the {place}");
        assert!(!text.contains(&TOKEN[..10]), "part of the token is in the {place}");
    }
    let long = s.long_log_lines(LOG_LINE_BOUND);
    assert!(long.is_empty(), "log lines over {LOG_LINE_BOUND} bytes: {long:?}");
}

/// Hostile SKRs of our own: a list far over the limit (with and without a Content-Length),
/// an endless body, a body trickled at one byte per second, a 10 MB error body. Each fails
/// only its own Kyma with a clear reason within the request timeout; the replica's RSS stays
/// bounded, its log lines short; the healthy Kyma keeps syncing.
#[tokio::test]
async fn hostile_skrs_fail_alone_within_bounds() {
    let env = testenv::env();
    let hostile: Vec<(&str, HostileSkr, &str)> = vec![
        (
            "huge-list",
            HostileSkr::start(loopback(1), Behaviour::HugeList { bytes: 64 << 20 }).expect("start"),
            "SkrResponseTooLarge",
        ),
        (
            "huge-chunked",
            HostileSkr::start(loopback(1), Behaviour::HugeListChunked { bytes: 64 << 20 }).expect("start"),
            "SkrResponseTooLarge",
        ),
        ("endless", HostileSkr::start(loopback(1), Behaviour::EndlessBody).expect("start"), "SkrResponseTooLarge"),
        ("trickle", HostileSkr::start(loopback(1), Behaviour::Trickle).expect("start"), "SkrUnreachable"),
        (
            "error-body",
            HostileSkr::start(loopback(1), Behaviour::HugeErrorBody { bytes: 10_000_000 }).expect("start"),
            "CrdSyncFailed",
        ),
    ];
    let mut s = Scenario::new("sec-hostile").await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("healthy kyma");
    for (kyma, server, _) in &hostile {
        s.put_secret(kyma, kyma, &server.kubeconfig_with_token("hostile-test")).await.expect("secret");
        s.add_kyma_without_secret(kyma, &[]).await.expect("kyma");
    }
    let started = Instant::now();
    s.start(&[]).expect("start");

    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    for (kyma, server, reason) in &hostile {
        let cond = s.await_condition(kyma, "False", reason, PROMPT).await;
        eprintln!(
            "{kyma}: {reason} after {:.1}s, {} requests, {} MB sent: {}",
            started.elapsed().as_secs_f64(),
            server.request_count(),
            server.body_bytes_sent() / 1_000_000,
            cond.message
        );
        assert!(cond.message.chars().count() <= 1024 + 3, "{kyma}: condition message of {} chars", cond.message.len());
        assert!(!cond.message.chars().any(char::is_control), "{kyma}: control characters in {:?}", cond.message);
        assert!(server.request_count() > 0, "{kyma}: the hostile SKR was never asked");
    }
    let cond = s.condition("error-body").await.expect("condition");
    assert!(cond.message.contains("HOSTILE-MARKER"), "the error body's start is quoted: {}", cond.message);
    let cond = s.condition("huge-list").await.expect("condition");
    assert!(cond.message.contains("larger than 8388608 bytes"), "{}", cond.message);

    // Several rounds of retries against every hostile SKR at once.
    let retries_until = Instant::now() + REQUEST_TIMEOUT * 3;
    s.apply_catalog(&[mt("keda", "1.3.0"), mrm("keda", &[("regular", "1.3.0")])]).await.expect("change");
    let change = Instant::now();
    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "keda-1.3.0"], PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "keda"], PROMPT).await;
    eprintln!("a catalog change reached the healthy SKR in {:.1}s", change.elapsed().as_secs_f64());
    tokio::time::sleep(retries_until.saturating_duration_since(Instant::now())).await;

    let rss = s.peak_rss_mib();
    eprintln!("peak RSS of the replica against the hostile SKRs: {rss} MiB");
    assert!(rss < RSS_BOUND_MIB, "peak RSS {rss} MiB (bound {RSS_BOUND_MIB} MiB)");
    let long = s.long_log_lines(LOG_LINE_BOUND);
    assert!(long.is_empty(), "log lines over {LOG_LINE_BOUND} bytes: {long:?}");
    assert!(s.catalogsync_running(), "catalogsync exited");
    let errors = s.metric("catalogsync_sync_errors_total", &["reason=\"SkrResponseTooLarge\""]).await;
    assert!(errors >= 3.0, "SkrResponseTooLarge counted {errors} times");
}
