//! Tests of the forwarding SKR front (`testenv::front`) against a real SKR apiserver: it
//! forwards as the apiserver's admin whatever token the client has, rewrites only the JSON
//! answers it is told to, answers itself with bodies of the announced size (that they are
//! generated in pieces is a unit test of the module), and closes its port on drop. The clients are kube clients built from the front's
//! own kubeconfig, as catalogsync builds them from an access Secret.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::{Value, json};
use testenv::front::{Answer, Handling, Piece, SkrFront, Verdict};

/// Bound on every request through the front (moving tens of MiB in a debug build included).
const WAIT: Duration = Duration::from_secs(60);

const MIB: usize = 1024 * 1024;

/// `127.0.0.<last>`: each test uses its own address.
fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

async fn client(front: &SkrFront) -> Client {
    testenv::client_from_kubeconfig_yaml(&front.kubeconfig_with_token("any-token-will-do"))
        .await
        .expect("a client from the front's kubeconfig")
}

#[tokio::test]
async fn forwards_reads_and_writes_as_the_upstream_admin_whatever_the_token() {
    let env = testenv::env();
    let front = SkrFront::forwarding(loopback(61), &env.skr_b).expect("start a front");
    let client = client(&front).await;

    let namespaces = tokio::time::timeout(WAIT, Api::<Namespace>::all(client.clone()).list(&ListParams::default()))
        .await
        .expect("an answer in time")
        .expect("namespaces listed through the front");
    assert!(namespaces.items.iter().any(|ns| ns.metadata.name.as_deref() == Some("default")));

    let name = testenv::unique_name("front");
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client, "default").create(&PostParams::default(), &cm).await.expect("created");
    let upstream = Api::<ConfigMap>::namespaced(env.skr_b.admin_client(), "default");
    let stored = upstream.get(&name).await.expect("the write reached the upstream");
    assert_eq!(stored.data.and_then(|d| d.get("k").cloned()).as_deref(), Some("v"));

    assert_eq!((front.forwarded(), front.requests(), front.failed()), (2, 2, 0));
    let seen = front.recent();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.handling == Handling::Forwarded && s.status < 300), "{seen:?}");
    assert_eq!(seen[1].head.method, http::Method::POST);
    assert_eq!(front.upstream_connections(), 1, "one client connection, one upstream connection");
}

#[tokio::test]
async fn rewrites_the_json_answers_it_is_told_to_and_passes_errors_unchanged() {
    let env = testenv::env();
    let front = SkrFront::start(loopback(62), &env.skr_b, |head| {
        if head.path.starts_with("/api/v1/namespaces") {
            Verdict::rewrite(|head, value: &mut Value| {
                value["metadata"]["annotations"] = json!({"front": head.path});
            })
        } else {
            Verdict::Forward
        }
    })
    .expect("start a front");
    let api = Api::<Namespace>::all(client(&front).await);

    let default = api.get("default").await.expect("default through the front");
    let annotations = default.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get("front").map(String::as_str), Some("/api/v1/namespaces/default"));

    let missing = api.get("no-such-namespace").await.expect_err("a 404");
    assert!(matches!(&missing, kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound"), "{missing:?}");
    assert_eq!((front.rewritten(), front.forwarded()), (2, 0));
}

#[tokio::test]
async fn answers_itself_with_bodies_of_the_announced_size() {
    const FILL: usize = 40 * MIB;
    let env = testenv::env();
    let pages = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&pages);
    let front = SkrFront::start(loopback(63), &env.skr_b, move |head| {
        if head.is_list_of("configmaps") {
            counted.fetch_add(1, Ordering::SeqCst);
            let pieces = vec![
                Piece::text(
                    r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":""#,
                ),
                Piece::fill(b'q', FILL),
                Piece::text(r#""}}]}"#),
            ];
            Verdict::Answer(Answer::pieces(StatusCode::OK, pieces))
        } else {
            Verdict::Forward
        }
    })
    .expect("start a front");
    let client = client(&front).await;

    let request = http::Request::get("/api/v1/namespaces/default/configmaps").body(kube::client::Body::empty());
    let response = tokio::time::timeout(WAIT, client.send(request.expect("a request")))
        .await
        .expect("an answer in time")
        .expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    let announced: usize =
        response.headers()[http::header::CONTENT_LENGTH].to_str().expect("ASCII").parse().expect("a number");
    let (mut body, mut len) = (response.into_body(), 0);
    while let Some(frame) = tokio::time::timeout(WAIT, body.frame()).await.expect("the body in time") {
        len += frame.expect("a frame").into_data().map_or(0, |data| data.len());
    }
    assert_eq!(len, announced);
    assert!(len > FILL, "{len}");
    assert_eq!(front.answered_bytes(), len as u64);
    assert_eq!((pages.load(Ordering::SeqCst), front.answered(), front.upstream_connections()), (1, 1, 0));

    let addr = front.addr();
    drop(front);
    let connect = tokio::net::TcpStream::connect(addr).await;
    assert!(connect.is_err(), "the port is still open after drop");
}
