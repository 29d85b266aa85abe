use base64::Engine as _;
use proptest::prelude::*;

use super::*;

/// A token no message may ever contain.
const TOKEN: &str = "sEcReT-t0ken-4f9a1c";

fn b64(data: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A self-signed certificate and its key, as PEM.
fn cert_and_key() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["skr.example".into()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    (cert.pem(), key.serialize_pem())
}

/// A kubeconfig with `cluster` and `user` as the bodies of its one cluster and user.
fn kubeconfig(cluster: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: skr\n\
         clusters:\n- name: skr\n  cluster:\n{cluster}\n\
         users:\n- name: admin\n  user:\n{user}\n\
         contexts:\n- name: skr\n  context: {{cluster: skr, user: admin}}\n"
    )
}

fn ca_cluster() -> String {
    let (ca, _) = cert_and_key();
    format!("    server: https://api.skr.example:6443/prefix\n    certificate-authority-data: {}", b64(&ca))
}

fn token_user() -> String {
    format!("    token: {TOKEN}")
}

fn problem(text: &str) -> KubeconfigProblem {
    let problem = parse(text.as_bytes(), InsecureTls::Refuse).expect_err("rejected");
    assert!(!problem.to_string().contains(TOKEN), "the token leaked into {problem}");
    problem
}

#[test]
fn a_token_kubeconfig_is_accepted_with_only_what_is_used() {
    let kc = parse(kubeconfig(&ca_cluster(), &token_user()).as_bytes(), InsecureTls::Refuse).expect("accepted");
    assert_eq!(kc.server.to_string(), "https://api.skr.example:6443/prefix");
    assert_eq!((kc.host.clone(), kc.port), (ServerHost::Name("api.skr.example".into()), 6443));
    assert_eq!(kc.server_field, "clusters[0].cluster.server");
    assert_eq!(kc.roots.as_ref().map(Vec::len), Some(1));
    assert!(!kc.insecure);
    assert_eq!(kc.credentials, Credentials::Token(TOKEN.into()));
    assert!(!format!("{kc:?}").contains(TOKEN), "Debug redacts the credentials");
}

#[test]
fn a_client_certificate_kubeconfig_is_accepted() {
    let (cert, key) = cert_and_key();
    let user = format!("    client-certificate-data: {}\n    client-key-data: {}", b64(&cert), b64(&key));
    let cluster = "    server: https://10.1.2.3\n    tls-server-name: api.skr.example";
    let kc = parse(kubeconfig(cluster, &user).as_bytes(), InsecureTls::Refuse).expect("accepted");
    assert_eq!((kc.host.clone(), kc.port), (ServerHost::Ip("10.1.2.3".parse().expect("ip")), 443));
    assert_eq!(kc.roots, None, "no CA: the system roots");
    assert_eq!(kc.tls_server_name.as_deref(), Some("api.skr.example"));
    assert!(matches!(kc.credentials, Credentials::Certificate { .. }));
}

#[test]
fn every_way_to_reach_a_file_a_command_or_another_identity_is_refused() {
    let cluster = ca_cluster();
    let cases: Vec<(String, &str)> = vec![
        (
            kubeconfig(&cluster, "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"),
            "users[0].user.tokenFile",
        ),
        (
            kubeconfig(
                &cluster,
                "    exec:\n      command: /bin/sh\n      args: ['-c', 'touch marker']\n      apiVersion: client.authentication.k8s.io/v1",
            ),
            "users[0].user.exec",
        ),
        (kubeconfig(&cluster, "    auth-provider: {name: oidc, config: {}}"), "users[0].user.auth-provider"),
        (kubeconfig(&cluster, "    client-certificate: /etc/cert\n    client-key: /dev/zero"), "users[0].user.client-"),
        (kubeconfig(&cluster, "    username: admin\n    password: hunter2"), "users[0].user."),
        (kubeconfig(&cluster, &format!("{}\n    as: system:admin", token_user())), "users[0].user.as"),
        (
            kubeconfig("    server: https://api.skr.example\n    certificate-authority: /dev/zero", &token_user()),
            "clusters[0].cluster.certificate-authority",
        ),
        (
            kubeconfig("    server: https://api.skr.example\n    insecure-skip-tls-verify: true", &token_user()),
            "clusters[0].cluster.insecure-skip-tls-verify",
        ),
        (
            kubeconfig(&format!("{cluster}\n    proxy-url: http://proxy:3128"), &token_user()),
            "clusters[0].cluster.proxy-url",
        ),
        (kubeconfig("    server: http://api.skr.example", &token_user()), "clusters[0].cluster.server"),
        (kubeconfig("    server: https://user:pw@api.skr.example", &token_user()), "clusters[0].cluster.server"),
    ];
    for (text, field) in cases {
        let problem = problem(&text);
        assert!(problem.to_string().contains(field), "{problem} does not name {field}");
        assert!(
            matches!(problem, KubeconfigProblem::Forbidden { .. }),
            "{field}: refused as forbidden, got {problem:?}"
        );
        assert!(!problem.to_string().contains("/dev/zero") && !problem.to_string().contains("/bin/sh"));
    }
}

#[test]
fn unused_entries_are_checked_too() {
    let text = format!(
        "apiVersion: v1\ncurrent-context: a\n\
         clusters: [{{name: c, cluster: {{server: 'https://skr.example'}}}}]\n\
         users: [{{name: u, user: {{token: {TOKEN}}}}}, {{name: spare, user: {{exec: {{command: /bin/sh}}}}}}]\n\
         contexts: [{{name: a, context: {{cluster: c, user: u}}}}]\n"
    );
    assert_eq!(
        problem(&text),
        KubeconfigProblem::Forbidden {
            field: "users[1].user.exec".into(),
            why: "exec credential plugins are never run; use token or client-certificate-data"
        }
    );
}

#[test]
fn insecure_tls_only_behind_the_flag() {
    let text = kubeconfig("    server: https://skr.example\n    insecure-skip-tls-verify: true", &token_user());
    assert!(matches!(problem(&text), KubeconfigProblem::Forbidden { .. }));
    let kc = parse(text.as_bytes(), InsecureTls::Allow).expect("accepted with the flag");
    assert!(kc.insecure);
    let off = kubeconfig(&format!("{}\n    insecure-skip-tls-verify: false", ca_cluster()), &token_user());
    assert!(!parse(off.as_bytes(), InsecureTls::Refuse).expect("false is fine").insecure);
}

#[test]
fn unknown_fields_are_refused_without_quoting_them() {
    let text = kubeconfig(&ca_cluster(), &format!("{}\n    {TOKEN}: x", token_user()));
    assert_eq!(
        problem(&text),
        KubeconfigProblem::UnknownField { parent: "users[0].user".into(), allowed: USER_ALLOWED }
    );
}

#[test]
fn the_context_must_be_clear() {
    let two = format!(
        "clusters: [{{name: c, cluster: {{server: 'https://skr.example'}}}}]\n\
         users: [{{name: u, user: {{token: {TOKEN}}}}}]\n\
         contexts: [{{name: a, context: {{cluster: c, user: u}}}}, {{name: b, context: {{cluster: c, user: u}}}}]\n"
    );
    assert!(matches!(problem(&two), KubeconfigProblem::NoContext { .. }));
    assert!(parse(format!("current-context: b\n{two}").as_bytes(), InsecureTls::Refuse).is_ok());
    assert!(matches!(problem(&format!("current-context: z\n{two}")), KubeconfigProblem::NoContext { .. }));
    let none = format!(
        "clusters: [{{name: c, cluster: {{server: 'https://skr.example'}}}}]\nusers: [{{name: u, user: {{token: {TOKEN}}}}}]\n"
    );
    assert!(parse(none.as_bytes(), InsecureTls::Refuse).is_ok(), "one cluster and one user need no context");
    let dangling = format!(
        "clusters: [{{name: c, cluster: {{server: 'https://skr.example'}}}}]\nusers: [{{name: u, user: {{token: {TOKEN}}}}}]\n\
         contexts: [{{name: a, context: {{cluster: nope, user: u}}}}]\n"
    );
    assert_eq!(
        problem(&dangling),
        KubeconfigProblem::Invalid { field: "contexts[0].context.cluster".into(), why: "names no entry of clusters" }
    );
}

#[test]
fn broken_yaml_reports_a_line_and_no_content() {
    let text = format!("apiVersion: v1\nusers:\n- name: u\n  user:\n    token: {TOKEN}\n  - oops: [\n");
    let problem = problem(&text);
    assert!(matches!(problem, KubeconfigProblem::NotYaml { line: Some(_) }), "{problem:?}");
    assert!(problem.to_string().starts_with("the kubeconfig is not valid YAML (line "), "{problem}");
    assert_eq!(parse(&[0xff, 0xfe, 0x00], InsecureTls::Refuse).err(), Some(KubeconfigProblem::NotUtf8));
}

#[test]
fn yaml_tags_read_no_files() {
    let text = kubeconfig(&ca_cluster(), "    token: !include /etc/hostname");
    match parse(text.as_bytes(), InsecureTls::Refuse) {
        Ok(kc) => assert_eq!(kc.credentials, Credentials::Token("/etc/hostname".into()), "taken literally"),
        Err(problem) => assert!(!problem.to_string().contains("/etc/hostname"), "{problem}"),
    }
}

#[test]
fn bad_certificate_data_is_named() {
    let cluster = "    server: https://skr.example\n    certificate-authority-data: bm90IGEgY2VydA==";
    assert_eq!(
        problem(&kubeconfig(cluster, &token_user())),
        KubeconfigProblem::Invalid {
            field: "clusters[0].cluster.certificate-authority-data".into(),
            why: "holds no PEM certificate"
        }
    );
    let (cert, _) = cert_and_key();
    let user = format!("    client-certificate-data: {}\n    client-key-data: {}", b64(&cert), b64(TOKEN));
    assert_eq!(
        problem(&kubeconfig(&ca_cluster(), &user)),
        KubeconfigProblem::Invalid { field: "users[0].user.client-key-data".into(), why: "holds no PEM private key" }
    );
    let both = format!("{}\n    client-certificate-data: {}", token_user(), b64(&cert));
    assert!(matches!(problem(&kubeconfig(&ca_cluster(), &both)), KubeconfigProblem::Invalid { .. }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever way a kubeconfig holding a token is broken (cut short, a byte replaced), the
    /// problem reported never contains the token.
    #[test]
    fn no_broken_kubeconfig_quotes_its_token(cut in 0usize..400, at in 0usize..400, byte in any::<u8>()) {
        let mut text = kubeconfig("    server: https://skr.example", &token_user()).into_bytes();
        if at < text.len() {
            text[at] = byte;
        }
        text.truncate(cut.max(1));
        if let Err(problem) = parse(&text, InsecureTls::Refuse) {
            prop_assert!(!problem.to_string().contains(TOKEN), "{}", problem);
            prop_assert!(!problem.to_string().contains(&TOKEN[..8]), "{}", problem);
        }
    }
}
