//! Tests of the hostile SKR (`common/hostile.rs`): each [`Behaviour`] answers as documented,
//! connections are counted even when TLS fails, and dropping the server closes its port and
//! every connection. No kube-apiserver is needed: the clients are kube clients built from the
//! server's own kubeconfig, as catalogsync builds them from an access Secret.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::client::Body;
use testenv::hostile::{Behaviour, FORBIDDEN_MESSAGE, HostileSkr, MARKER, MAX_RECORDED_BODY};
use testenv::process::rss_kib;
use testenv::proxy::kubeconfig_via;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Bound on every wait for something that should happen at once.
const WAIT: Duration = Duration::from_secs(10);

/// Bound on moving tens of MB through TLS in a debug build on a busy machine.
const TRANSFER: Duration = Duration::from_secs(60);

const MIB: usize = 1024 * 1024;

/// `127.0.0.<last>`: each test uses its own address, so a port freed by one test and taken by
/// another cannot confuse the "port is closed" check.
fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn start(last: u8, behaviour: Behaviour) -> HostileSkr {
    HostileSkr::start(loopback(last), behaviour).expect("start a hostile SKR")
}

async fn client(skr: &HostileSkr) -> Client {
    testenv::client_from_kubeconfig_yaml(&skr.kubeconfig_with_token("t0ken"))
        .await
        .expect("a client from its kubeconfig")
}

/// Sends `GET path` and returns the response as soon as its headers are in.
async fn get(client: &Client, path: &str) -> http::Response<Body> {
    let request = http::Request::get(path).body(Body::empty()).expect("a valid request");
    tokio::time::timeout(WAIT, client.send(request))
        .await
        .unwrap_or_else(|_| panic!("no response headers for GET {path} within {WAIT:?}"))
        .expect("a response")
}

fn header(response: &http::Response<Body>, name: http::header::HeaderName) -> Option<&str> {
    response.headers().get(name).map(|v| v.to_str().expect("an ASCII header"))
}

/// Reads frames until at least `at_least` body bytes arrived; returns them all.
async fn read_at_least(body: &mut Body, at_least: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let read = async {
        while got.len() < at_least {
            match body.frame().await {
                Some(Ok(frame)) => got.extend_from_slice(&frame.into_data().unwrap_or_default()),
                other => panic!("the body ended after {} bytes: {other:?}", got.len()),
            }
        }
    };
    tokio::time::timeout(TRANSFER, read)
        .await
        .unwrap_or_else(|_| panic!("fewer than {at_least} body bytes within {TRANSFER:?}"));
    got
}

/// Counts body bytes until `at_least` arrived without keeping them.
async fn count_at_least(body: &mut Body, at_least: usize) -> usize {
    let mut count = 0;
    let read = async {
        while count < at_least {
            match body.frame().await {
                Some(Ok(frame)) => count += frame.into_data().map_or(0, |data| data.len()),
                other => panic!("the body ended after {count} bytes: {other:?}"),
            }
        }
    };
    tokio::time::timeout(TRANSFER, read)
        .await
        .unwrap_or_else(|_| panic!("fewer than {at_least} body bytes within {TRANSFER:?}"));
    count
}

async fn await_closed(skr: &HostileSkr, after: &str) {
    testenv::await_condition(WAIT, &format!("the hostile SKR to close its connections after {after}"), || async {
        skr.open_connections() == 0
    })
    .await;
}

#[tokio::test]
async fn record_answers_403_and_records_every_request_with_its_headers() {
    let skr = start(2, Behaviour::Record);
    assert_eq!((skr.connections(), skr.request_count()), (0, 0));
    assert!(skr.url().starts_with("https://127.0.0.2:"), "{}", skr.url());
    let yaml = skr.kubeconfig_with_token("s3cret-token");
    assert!(yaml.contains(&format!("server: \"{}\"", skr.url())), "{yaml}");
    assert!(yaml.contains(&testenv::pki::base64(skr.ca_pem().as_bytes())), "{yaml}");
    assert!(yaml.contains("token: \"s3cret-token\""), "{yaml}");
    // The kubeconfig's CA verifies the serving certificate for 127.0.0.2.
    let client = testenv::client_from_kubeconfig_yaml(&yaml).await.expect("a client from the kubeconfig");

    let request = http::Request::get("/api/v1/namespaces?limit=5").body(Vec::new()).expect("a valid request");
    match tokio::time::timeout(WAIT, client.request_text(request)).await.expect("an answer") {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"), "{status:?}");
            assert_eq!(status.message, FORBIDDEN_MESSAGE);
        }
        other => panic!("expected a 403 Status, got {other:?}"),
    }
    let listed = tokio::time::timeout(WAIT, Api::<Namespace>::all(client).list(&ListParams::default().labels("a=b")))
        .await
        .expect("an answer");
    assert!(matches!(&listed, Err(kube::Error::Api(s)) if s.code == 403), "{listed:?}");

    assert_eq!(skr.request_count(), 2);
    let recorded = skr.recorded();
    assert_eq!(recorded[0].method, "GET");
    assert_eq!(recorded[0].path_and_query, "/api/v1/namespaces?limit=5");
    let list = &recorded[1].path_and_query;
    assert!(list.starts_with("/api/v1/namespaces?") && list.contains("labelSelector=a%3Db"), "{list}");
    for request in &recorded {
        assert_eq!(request.header("Authorization"), Some("Bearer s3cret-token"), "{request:?}");
        assert!(request.header("host").is_some_and(|h| h.starts_with("127.0.0.2")), "{request:?}");
    }
    assert!(recorded.iter().all(|r| r.body.is_empty() && r.body_len == 0), "{recorded:?}");
    assert!(skr.handshakes() >= 1 && skr.connections() >= skr.handshakes(), "{skr:?}");
    assert_eq!(skr.body_bytes_sent(), 2 * Behaviour::Record.body_len().expect("a finite body") as u64);
}

#[tokio::test]
async fn record_reads_and_records_request_bodies_keeping_at_most_a_bounded_prefix() {
    let skr = start(2, Behaviour::Record);
    let client = client(&skr).await;
    for len in [12, 3 * MIB] {
        let body = vec![b'y'; len];
        let request =
            http::Request::patch("/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates/m")
                .header(CONTENT_TYPE, "application/apply-patch+yaml")
                .body(body)
                .expect("a valid request");
        // The whole upload is read before the answer, so the client gets the 403, not a reset.
        match tokio::time::timeout(TRANSFER, client.request_text(request)).await.expect("an answer") {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
            other => panic!("expected a 403 Status after a {len}-byte upload, got {other:?}"),
        }
    }
    let recorded = skr.recorded();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0].method, "PATCH");
    assert_eq!(recorded[0].header("content-type"), Some("application/apply-patch+yaml"));
    assert_eq!((recorded[0].body.as_slice(), recorded[0].body_len), (b"yyyyyyyyyyyy".as_slice(), 12));
    assert_eq!((recorded[1].body.len(), recorded[1].body_len), (MAX_RECORDED_BODY, 3 * MIB));
}

#[tokio::test]
async fn huge_lists_have_the_requested_size_and_parse_with_and_without_content_length() {
    let bytes = 8 * MIB + 123;
    for behaviour in [Behaviour::HugeList { bytes }, Behaviour::HugeListChunked { bytes }] {
        let skr = start(3, behaviour);
        assert_eq!(behaviour.body_len(), Some(bytes));
        let client = client(&skr).await;
        let response = get(&client, "/apis/operator.kyma-project.io/v1beta2/moduletemplates").await;
        assert_eq!(response.status(), 200, "{behaviour:?}");
        assert_eq!(header(&response, CONTENT_TYPE), Some("application/json"));
        if matches!(behaviour, Behaviour::HugeList { .. }) {
            assert_eq!(header(&response, CONTENT_LENGTH), Some(bytes.to_string().as_str()));
        } else {
            assert_eq!(header(&response, CONTENT_LENGTH), None);
            assert_eq!(header(&response, TRANSFER_ENCODING), Some("chunked"));
        }
        let body = tokio::time::timeout(TRANSFER, response.into_body().collect())
            .await
            .unwrap_or_else(|_| panic!("{behaviour:?}: no whole body within {TRANSFER:?}"))
            .expect("a body")
            .to_bytes();
        assert_eq!(body.len(), bytes, "{behaviour:?}");
        let list: serde_json::Value = serde_json::from_slice(&body).expect("the body is JSON");
        assert_eq!(list["kind"], "List");
        assert_eq!(list["metadata"]["resourceVersion"], "1");
        let items = list["items"].as_array().expect("items");
        assert!(items.len() > 100, "{} items", items.len());
        assert!(items.iter().all(|item| item["data"]["padding"].as_str().is_some_and(|p| p.len() > 60_000)));
        assert_eq!(skr.body_bytes_sent(), bytes as u64);
    }
}

#[tokio::test]
async fn huge_lists_stop_quietly_when_the_client_hangs_up() {
    let bytes = 1 << 30;
    for behaviour in [Behaviour::HugeList { bytes }, Behaviour::HugeListChunked { bytes }] {
        let skr = start(4, behaviour);
        let client = client(&skr).await;
        let mut body = get(&client, "/").await.into_body();
        let got = read_at_least(&mut body, MIB).await;
        assert!(got.starts_with(br#"{"apiVersion":"v1","kind":"List""#));
        drop((body, client));
        await_closed(&skr, "the client hung up").await;
        // Generated as it goes: nowhere near the 1 GiB was produced.
        assert!(skr.body_bytes_sent() < 256 * MIB as u64, "{behaviour:?}: {} bytes produced", skr.body_bytes_sent());
    }
}

#[tokio::test]
async fn endless_body_streams_past_20_mb_as_fast_as_read_and_stops_when_the_client_hangs_up() {
    let skr = start(5, Behaviour::EndlessBody);
    assert_eq!(Behaviour::EndlessBody.body_len(), None);
    let client = client(&skr).await;
    let response = get(&client, "/apis/operator.kyma-project.io/v1beta2/moduletemplates?watch=true").await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, CONTENT_TYPE), Some("application/json"));
    assert_eq!(header(&response, CONTENT_LENGTH), None);
    let mut body = response.into_body();
    let started = Instant::now();
    let start = read_at_least(&mut body, 1024).await;
    assert!(start.starts_with(br#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"1"},"items":[{"#));
    let received = start.len() + count_at_least(&mut body, 20 * MIB).await;
    let took = started.elapsed();
    eprintln!("endless body: {} MiB in {:.2}s", received / MIB, took.as_secs_f64());

    // Back-pressure: the server produced only what the client read plus what buffers hold.
    let ahead = skr.body_bytes_sent().saturating_sub(received as u64);
    assert!(ahead < 32 * MIB as u64, "the server ran {ahead} bytes ahead of the client");
    drop((body, client));
    await_closed(&skr, "the client hung up").await;
    let produced = skr.body_bytes_sent();
    assert!(produced >= received as u64);
    assert_eq!(skr.request_count(), 1);
}

#[tokio::test]
async fn trickle_sends_about_one_byte_per_second() {
    let skr = start(6, Behaviour::Trickle);
    let client = client(&skr).await;
    let response = get(&client, "/api/v1/namespaces").await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, CONTENT_LENGTH), None);
    let mut body = response.into_body();
    let window = Duration::from_millis(3500);
    let deadline = tokio::time::Instant::now() + window;
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => break,
            Ok(Some(Ok(frame))) => got.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Ok(other) => panic!("the trickle ended after {} bytes: {other:?}", got.len()),
        }
    }
    // One at once, then one a second: 4 expected; a little slack for a busy machine.
    assert!((2..=5).contains(&got.len()), "{} bytes in {window:?}: {:?}", got.len(), String::from_utf8_lossy(&got));
    assert!(br#"{"apiVersion""#.starts_with(&got), "{:?}", String::from_utf8_lossy(&got));
    drop((body, client));
    await_closed(&skr, "the client hung up").await;
}

#[tokio::test]
async fn huge_error_body_is_a_500_of_the_requested_size_with_markers_and_control_characters() {
    let bytes = MIB + 7;
    let behaviour = Behaviour::HugeErrorBody { bytes };
    assert_eq!(behaviour.body_len(), Some(bytes));
    let skr = start(7, behaviour);
    let client = client(&skr).await;

    let response = get(&client, "/api/v1/namespaces").await;
    assert_eq!(response.status(), 500);
    assert_eq!(header(&response, CONTENT_LENGTH), Some(bytes.to_string().as_str()));
    let body = tokio::time::timeout(TRANSFER, response.into_body().collect())
        .await
        .expect("the whole error body")
        .expect("a body")
        .to_bytes();
    assert_eq!(body.len(), bytes);
    let text = std::str::from_utf8(&body).expect("UTF-8");
    let at: Vec<usize> = text.match_indices(MARKER).map(|(i, _)| i).collect();
    assert_eq!(at.len(), 3, "markers at {at:?}");
    assert!(at[0] < 100, "{at:?}");
    assert!(at[1].abs_diff(bytes / 2) < 100, "{at:?}");
    assert!(bytes - at[2] < 100, "{at:?}");
    let status: serde_json::Value = serde_json::from_slice(&body).expect("a JSON Status");
    assert_eq!((status["kind"].as_str(), status["code"].as_u64()), (Some("Status"), Some(500)));
    let message = status["message"].as_str().expect("a message");
    assert!(message.contains("\u{1b}[31m") && message.contains('\n') && message.contains('\r'));

    // What a kube client makes of it: an Api error carrying the whole message.
    let request = http::Request::get("/api/v1/namespaces").body(Vec::new()).expect("a valid request");
    match tokio::time::timeout(TRANSFER, client.request_text(request)).await.expect("an answer") {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 500);
            assert!(status.message.len() > bytes / 2, "{} bytes", status.message.len());
            assert!(status.message.starts_with(MARKER) && status.message.ends_with(MARKER));
        }
        other => panic!("expected a 500 Status, got {:?}", other.map(|t| t.len())),
    }
    assert_eq!(skr.request_count(), 2);
}

#[tokio::test]
async fn slow_answers_after_its_delay() {
    let delay = Duration::from_secs(1);
    let skr = start(8, Behaviour::Slow { delay });
    let client = client(&skr).await;
    let started = Instant::now();
    let request = http::Request::get("/api/v1/namespaces").body(Vec::new()).expect("a valid request");
    let text = tokio::time::timeout(WAIT, client.request_text(request)).await.expect("an answer").expect("a 200");
    assert!(started.elapsed() >= delay, "answered after {:?}", started.elapsed());
    let list: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn connections_are_counted_even_when_tls_fails() {
    let skr = start(9, Behaviour::Record);

    // Plain HTTP to the TLS port: the handshake fails and the server closes the connection.
    let mut plain = TcpStream::connect(skr.addr()).await.expect("connect");
    plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(WAIT, plain.read_to_end(&mut answer)).await;
    assert!(closed.is_ok(), "the server keeps a connection open that does not speak TLS");
    assert!(!answer.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&answer));

    // A TCP connect that sends nothing and hangs up.
    drop(TcpStream::connect(skr.addr()).await.expect("connect"));

    // A kubeconfig whose CA is not the server's: the client rejects the certificate.
    let other = start(9, Behaviour::Record);
    let yaml = kubeconfig_via(&other.kubeconfig_with_token("t"), skr.addr());
    let client = testenv::client_from_kubeconfig_yaml(&yaml).await.expect("a client");
    let result = tokio::time::timeout(WAIT, client.apiserver_version()).await.expect("fails fast");
    assert!(result.is_err(), "{result:?}");

    testenv::await_condition(WAIT, "3 connections to be counted", || async { skr.connections() == 3 }).await;
    await_closed(&skr, "three failed handshakes").await;
    assert_eq!((skr.handshakes(), skr.request_count()), (0, 0), "{skr:?}");
    assert_eq!(other.connections(), 0);
}

#[tokio::test]
async fn dropping_the_server_closes_its_port_and_every_connection() {
    let skr = start(77, Behaviour::EndlessBody);
    let addr = skr.addr();
    let client = client(&skr).await;
    let mut body = get(&client, "/").await.into_body();
    read_at_least(&mut body, 1).await;
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    testenv::await_condition(WAIT, "an endless body and an idle handshake to be open", || async {
        skr.open_connections() == 2
    })
    .await;

    let started = Instant::now();
    tokio::time::timeout(WAIT, tokio::task::spawn_blocking(move || drop(skr)))
        .await
        .expect("dropping the server returns within the bound")
        .expect("drop does not panic");
    eprintln!("drop took {:?}", started.elapsed());

    testenv::await_condition(WAIT, &format!("connecting to {addr} to fail"), || async {
        TcpStream::connect(addr).await.is_err()
    })
    .await;
    let drained = async {
        // Whatever was buffered still arrives, then the body ends (EOF or error).
        while let Some(Ok(_)) = body.frame().await {}
    };
    tokio::time::timeout(TRANSFER, drained).await.expect("the endless body ends once the server is gone");
    let read = tokio::time::timeout(WAIT, idle.read(&mut [0; 16])).await.expect("the idle connection is closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

#[test]
fn start_refuses_addresses_other_than_loopback() {
    for ip in ["10.0.0.1", "0.0.0.0", "192.168.1.1", "::"] {
        let err = HostileSkr::start(ip.parse().expect("an IP"), Behaviour::Record).expect_err(ip);
        assert!(err.to_string().contains("loopback"), "{ip}: {err}");
    }
}

#[test]
fn rss_kib_reads_a_running_process_and_fails_for_a_missing_one() {
    let (rss, hwm) = rss_kib(std::process::id()).expect("this process's memory");
    assert!(rss > 0 && hwm >= rss, "VmRSS {rss} KiB, VmHWM {hwm} KiB");
    assert!(rss_kib(u32::MAX).is_err());
}
