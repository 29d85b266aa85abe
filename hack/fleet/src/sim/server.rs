//! The SKR side: an HTTPS (HTTP/1.1 only) server that routes kube-apiserver paths to the
//! store of the SKR named by the bearer token, after injecting latency and faults.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::render::{Full as FullObject, List, Object, status, to_json, watch_event};
use super::state::{SharedSkr, Sim};
use super::stats::Verb;
use super::store::{ApiError, Entry, Interner, Res, WriteHead, WriteKind, lock};
use crate::stats::unix_ms;

/// Response body: a whole JSON document, or a watch stream.
type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Longest a watch stays open; kube clients ask for ~290 s and simply re-watch.
const WATCH_CAP: Duration = Duration::from_secs(5);
/// Longest a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until the listener fails for good.
///
/// # Errors
/// Never in practice: accept errors (such as running out of file descriptors) are logged and
/// retried.
pub(super) async fn run(listener: TcpListener, acceptor: TlsAcceptor, sim: Arc<Sim>) -> Result<()> {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                eprintln!("fleet sim: failed to accept a connection: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let sim = sim.clone();
        // Connections are independent and end with their client: nothing to join.
        tokio::spawn(async move {
            let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else { return };
            let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
            sim.stats.handshake(resumed);
            let service = hyper::service::service_fn(move |req| handle(sim.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
        });
    }
}

/// Builds the TLS acceptor from PEM files (HTTP/1.1 ALPN only, session tickets as an apiserver).
///
/// # Errors
/// When a file cannot be read or parsed.
pub(super) fn acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<TlsAcceptor> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("failed to read {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("failed to parse {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("failed to read {}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(go_like_provider())
        .with_safe_default_protocol_versions()
        .context("failed to set the TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("failed to load the serving certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Go's crypto/tls chooses the TLS 1.3 suite itself, whatever the client prefers.
    config.ignore_client_order = true;
    // As a kube-apiserver (Go's crypto/tls): stateless session tickets, one per handshake, so
    // clients can resume. rustls's default keeps sessions in a cache of 256 entries, which
    // 5,000 simulated SKRs would overflow.
    config.ticketer = rustls::crypto::ring::Ticketer::new().context("failed to make the session ticketer")?;
    config.send_tls13_tickets = 1;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// rustls's ring provider with the TLS 1.3 suites in the order a kube-apiserver (Go's
/// crypto/tls on a CPU with AES instructions) chooses them: AES-128-GCM with SHA-256 first.
/// rustls's own order (AES-256-GCM with SHA-384 first) would make every client's handshake
/// hash with SHA-384, which no apiserver asks of it.
fn go_like_provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    let mut provider = rustls::crypto::ring::default_provider();
    let go_order = [TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256];
    let rest = provider.cipher_suites.iter().filter(|s| !go_order.contains(s)).copied().collect::<Vec<_>>();
    provider.cipher_suites = go_order.into_iter().chain(rest).collect();
    Arc::new(provider)
}

/// What a request asks for.
struct Target<'a> {
    res: Res,
    /// Namespace of a namespaced request; `None` for cluster-scoped or all-namespace ones.
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    /// The request is to the object's `/status` subresource.
    status: bool,
}

fn parse_path(path: &str) -> Option<Target<'_>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let cluster = |res, name| Some(Target { res, namespace: None, name, status: false });
    let namespaced = |res, ns, name| Some(Target { res, namespace: Some(ns), name, status: false });
    let catalog = |plural: &str| Res::from_plural(plural).filter(|r| r.namespaced());
    match segments.as_slice() {
        ["api", "v1", "namespaces"] => cluster(Res::Namespaces, None),
        ["api", "v1", "namespaces", name] => cluster(Res::Namespaces, Some(*name)),
        ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions"] => cluster(Res::Crds, None),
        ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", name] => cluster(Res::Crds, Some(*name)),
        ["apis", "operator.kyma-project.io", "v1beta2", plural] => cluster(catalog(plural)?, None),
        ["apis", "operator.kyma-project.io", "v1beta2", "namespaces", ns, plural] => {
            namespaced(catalog(plural)?, *ns, None)
        }
        ["apis", "operator.kyma-project.io", "v1beta2", "namespaces", ns, plural, name] => {
            namespaced(catalog(plural)?, *ns, Some(*name))
        }
        ["apis", "operator.kyma-project.io", "v1beta2", "namespaces", ns, plural, name, "status"] => {
            let res = catalog(plural).filter(|r| r.has_status())?;
            Some(Target { res, namespace: Some(*ns), name: Some(*name), status: true })
        }
        _ => None,
    }
}

/// The query parameters the simulator honours.
#[derive(Default)]
struct Query {
    field_manager: Option<String>,
    field_selector: Option<String>,
    label_selector: Option<String>,
    watch: bool,
    timeout: Option<Duration>,
}

fn parse_query(query: Option<&str>) -> Query {
    let mut q = Query::default();
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "fieldManager" => q.field_manager = Some(v),
            "fieldSelector" => q.field_selector = Some(v),
            "labelSelector" => q.label_selector = Some(v),
            "watch" => q.watch = v == "true" || v == "1",
            "timeoutSeconds" => q.timeout = v.parse().ok().map(Duration::from_secs),
            _ => {}
        }
    }
    q
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))?.trim();
    (!token.is_empty()).then_some(token)
}

fn is_meta_only(headers: &HeaderMap) -> bool {
    headers.get_all(ACCEPT).iter().any(|v| v.to_str().is_ok_and(|v| v.contains("as=PartialObjectMetadata")))
}

fn verb(method: &Method, target: Option<&Target<'_>>, query: &Query, meta_only: bool) -> Verb {
    let Some(t) = target else { return Verb::Other };
    if t.status {
        return match *method {
            Method::GET => Verb::Get,
            Method::PUT => Verb::ReplaceStatus,
            _ => Verb::Other,
        };
    }
    match (method, t.name.is_some()) {
        (&Method::GET, true) if meta_only => Verb::GetMeta,
        (&Method::GET, true) => Verb::Get,
        (&Method::GET, false) if query.watch => Verb::Watch,
        (&Method::GET, false) if meta_only => Verb::ListMeta,
        (&Method::GET, false) => Verb::List,
        (&Method::PATCH, true) => Verb::Apply,
        (&Method::PUT, true) => Verb::Replace,
        (&Method::POST, false) => Verb::Create,
        (&Method::DELETE, true) => Verb::Delete,
        _ => Verb::Other,
    }
}

fn json_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *res.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    res.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

fn error_response(err: &ApiError) -> Response<Body> {
    json_response(err.code, status(err))
}

fn server_not_found() -> ApiError {
    ApiError::new(404, "NotFound", "the server could not find the requested resource")
}

/// Serves one request.
async fn handle(sim: Arc<Sim>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let Some(token) = bearer(req.headers()).map(str::to_owned) else {
        return Ok(error_response(&ApiError::new(401, "Unauthorized", "Unauthorized")));
    };
    let (parts, body) = req.into_parts();
    // Always read the body: an unread body makes hyper close the keep-alive connection.
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(error_response(&ApiError::bad_request("failed to read the body"))),
    };
    let target = parse_path(parts.uri.path());
    let query = parse_query(parts.uri.query());
    let meta_only = is_meta_only(&parts.headers);
    let verb = verb(&parts.method, target.as_ref(), &query, meta_only);
    let res = target.as_ref().map(|t| t.res);

    sim.stats.request(verb, res);
    let skr = sim.skr(&token);
    lock(&skr).counts.requests += 1;

    let faults = sim.faults();
    let mut delay = faults.latency;
    if !faults.jitter.is_zero() {
        delay += faults.jitter.mul_f64(sim.random());
    }
    let mut slept = Duration::ZERO;
    if !delay.is_zero() {
        let before = Instant::now();
        tokio::time::sleep(delay).await;
        slept = before.elapsed();
    }
    if faults.down.contains(&token) {
        sim.stats.injected_error();
        return Ok(error_response(&ApiError::new(503, "ServiceUnavailable", "the SKR is down (injected)")));
    }
    if faults.error_rate > 0.0 && sim.random() < faults.error_rate {
        sim.stats.injected_error();
        return Ok(error_response(&ApiError::new(500, "InternalError", "an error on the server (injected)")));
    }

    let response = match target {
        None => Err(server_not_found()),
        Some(target) => {
            let content_type = parts.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
            let is_apply = content_type.contains("apply-patch");
            let request = SkrRequest { verb, target, query, meta_only, is_apply, body, skr: &skr };
            serve_skr(&sim, request)
        }
    };
    sim.stats.service(verb, res, started.elapsed().saturating_sub(slept));
    Ok(response.unwrap_or_else(|err| error_response(&err)))
}

/// One classified SKR request.
struct SkrRequest<'a> {
    verb: Verb,
    target: Target<'a>,
    query: Query,
    meta_only: bool,
    is_apply: bool,
    body: Bytes,
    skr: &'a SharedSkr,
}

fn serve_skr(sim: &Sim, r: SkrRequest<'_>) -> Result<Response<Body>, ApiError> {
    let SkrRequest { verb, target, query, meta_only, is_apply, body, skr } = r;
    let res = target.res;
    if res.namespaced() && target.name.is_some() && target.namespace.is_none() {
        return Err(server_not_found());
    }
    let namespace = target.namespace.unwrap_or_default();
    let mut skr = lock(skr);
    if !skr.serves(res) {
        return Err(server_not_found());
    }
    let not_found = |name: &str| ApiError::not_found(&qualified(res), name);
    match (verb, target.name) {
        (Verb::Get | Verb::GetMeta, Some(name)) => {
            let entry = skr.get(res, namespace, name).cloned().ok_or_else(|| not_found(name))?;
            drop(skr);
            Ok(json_response(200, to_json(&Object { entry: &entry, meta_only })))
        }
        (Verb::List | Verb::ListMeta | Verb::Watch, None) => {
            let selectors = Selectors::new(&query);
            let items: Vec<Entry> = skr.list(res, target.namespace).filter(|e| selectors.matches(e)).cloned().collect();
            let resource_version = skr.resource_version();
            drop(skr);
            if verb == Verb::Watch {
                return Ok(watch_response(&items, meta_only, query.timeout));
            }
            Ok(json_response(200, to_json(&List { res, resource_version, items: &items, meta_only })))
        }
        (Verb::Apply | Verb::Replace | Verb::Create | Verb::ReplaceStatus, _) => {
            if verb == Verb::Apply && !is_apply {
                return Err(ApiError::new(415, "UnsupportedMediaType", "only server-side apply patches are served"));
            }
            let manager = match (&query.field_manager, verb) {
                (Some(m), _) => m.as_str(),
                (None, Verb::Apply) => return Err(ApiError::bad_request("fieldManager is required for apply")),
                (None, _) => "unknown",
            };
            let kind = match verb {
                Verb::Apply => WriteKind::Apply,
                Verb::Replace => WriteKind::Replace,
                Verb::ReplaceStatus => WriteKind::Status,
                _ => WriteKind::Create,
            };
            // An apply of catalog content this simulator was sent before, byte for byte.
            let key = match target.name {
                Some(name) if verb == Verb::Apply && res.is_catalog() => {
                    Some(Interner::apply_key(res, namespace, name, &body))
                }
                _ => None,
            };
            let result = match (target.name, key.and_then(|k| sim.interner.applied(k))) {
                (Some(name), Some(content)) => {
                    let head = WriteHead { kind, res, namespace, name, manager, now_ms: unix_ms() };
                    skr.apply_shared(&head, content, &sim.interner)
                }
                _ => {
                    let body: Value = serde_json::from_slice(&body)
                        .map_err(|e| ApiError::bad_request(format!("failed to decode the body: {e}")))?;
                    let body_name = body.pointer("/metadata/name").and_then(Value::as_str).map(str::to_owned);
                    let name = target.name.map(str::to_owned).or(body_name).ok_or_else(|| {
                        ApiError::new(
                            400,
                            "BadRequest",
                            "name or generateName is required (generateName is not simulated)",
                        )
                    })?;
                    let unconditional = body.pointer("/metadata/resourceVersion").is_none();
                    let head = WriteHead { kind, res, namespace, name: &name, manager, now_ms: unix_ms() };
                    let result = skr.write(&head, body, &sim.interner);
                    if let (Some(key), Ok(outcome), true) = (key, &result, unconditional) {
                        sim.interner.remember_applied(key, &outcome.entry.content);
                    }
                    result
                }
            };
            skr.counts.writes += 1;
            let changed = result.as_ref().is_ok_and(|o| o.changed);
            if changed {
                skr.counts.changed_writes += 1;
            }
            drop(skr);
            sim.stats.write(changed);
            let outcome = result?;
            let code = if outcome.created { 201 } else { 200 };
            // Like a real apiserver, a write answers with metadata only when asked to.
            Ok(json_response(code, to_json(&Object { entry: &outcome.entry, meta_only })))
        }
        (Verb::Delete, Some(name)) => {
            let result = skr.delete(res, namespace, name);
            skr.counts.writes += 1;
            if result.is_ok() {
                skr.counts.changed_writes += 1;
            }
            drop(skr);
            sim.stats.write(result.is_ok());
            let entry = result.map_err(|_| not_found(name))?;
            Ok(json_response(200, to_json(&FullObject(&entry))))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// The name a real apiserver uses in messages: `plural` for core and `plural.group` otherwise.
fn qualified(res: Res) -> String {
    match res.api_version().split_once('/') {
        Some((group, _)) => format!("{}.{group}", res.plural()),
        None => res.plural().to_owned(),
    }
}

/// A watch: one ADDED event per matching object, then the stream stays open until the
/// (capped) timeout and ends.
fn watch_response(items: &[Entry], meta_only: bool, timeout: Option<Duration>) -> Response<Body> {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = items
        .iter()
        .map(|entry| Ok(Frame::data(Bytes::from(watch_event("ADDED", &Object { entry, meta_only })))))
        .collect();
    let open_for = timeout.unwrap_or(WATCH_CAP).min(WATCH_CAP);
    let end = futures::stream::once(tokio::time::sleep(open_for)).filter_map(|()| std::future::ready(None));
    let stream = futures::stream::iter(frames).chain(end);
    let mut res = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream)));
    res.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// Field and label selectors, as far as the simulator evaluates them: `metadata.name` and
/// `metadata.namespace` equality; label equality, inequality, existence and absence.
struct Selectors {
    name: Option<String>,
    namespace: Option<String>,
    labels: Vec<LabelTerm>,
}

enum LabelTerm {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
}

impl Selectors {
    fn new(query: &Query) -> Self {
        let mut s = Self { name: None, namespace: None, labels: Vec::new() };
        for term in query.field_selector.iter().flat_map(|f| f.split(',')) {
            let (k, v) = term.split_once("==").or_else(|| term.split_once('=')).unwrap_or((term, ""));
            match k.trim() {
                "metadata.name" => s.name = Some(v.trim().to_owned()),
                "metadata.namespace" => s.namespace = Some(v.trim().to_owned()),
                _ => {}
            }
        }
        for term in query.label_selector.iter().flat_map(|l| l.split(',')).map(str::trim).filter(|t| !t.is_empty()) {
            let owned = |x: &str| x.trim().to_owned();
            s.labels.push(if let Some((k, v)) = term.split_once("!=") {
                LabelTerm::Ne(owned(k), owned(v))
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                LabelTerm::Eq(owned(k), owned(v))
            } else if let Some(k) = term.strip_prefix('!') {
                LabelTerm::Absent(owned(k))
            } else {
                LabelTerm::Exists(owned(term))
            });
        }
        s
    }

    fn matches(&self, entry: &Entry) -> bool {
        let meta = entry.content.get("metadata");
        let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str).unwrap_or_default();
        if self.name.as_deref().is_some_and(|n| n != field("name"))
            || self.namespace.as_deref().is_some_and(|n| n != field("namespace"))
        {
            return false;
        }
        let label = |k: &str| meta.and_then(|m| m.get("labels")).and_then(|l| l.get(k)).and_then(Value::as_str);
        self.labels.iter().all(|t| match t {
            LabelTerm::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelTerm::Ne(k, v) => label(k) != Some(v.as_str()),
            LabelTerm::Exists(k) => label(k).is_some(),
            LabelTerm::Absent(k) => label(k).is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_to_resources() {
        let t = parse_path("/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates/x").unwrap();
        assert_eq!((t.res, t.namespace, t.name), (Res::ModuleTemplates, Some("kyma-system"), Some("x")));
        let t = parse_path("/apis/operator.kyma-project.io/v1beta2/modulereleasemetas").unwrap();
        assert_eq!((t.res, t.namespace, t.name), (Res::ModuleReleaseMetas, None, None));
        let t =
            parse_path("/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/kymas/default/status").unwrap();
        assert_eq!((t.res, t.namespace, t.name, t.status), (Res::Kymas, Some("kyma-system"), Some("default"), true));
        assert!(parse_path("/apis/operator.kyma-project.io/v1beta2/namespaces/ns/moduletemplates/x/status").is_none());
        assert!(parse_path("/apis/operator.kyma-project.io/v1beta2/manifests").is_none());
        assert!(parse_path("/api/v1/namespaces/x/pods").is_none());
    }

    /// A client that prefers AES-256 (rustls's order, as catalogsync's) gets AES-128 with
    /// SHA-256, as from a kube-apiserver: `openssl s_client -ciphersuites
    /// TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256` against
    /// a Go `tls.Listen` server negotiates TLS_AES_128_GCM_SHA256.
    #[test]
    fn the_tls_suite_is_chosen_as_an_apiserver_chooses_it() {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let dir = std::env::temp_dir().join(format!("fleet-sim-tls-suite-{}", std::process::id()));
        let files = crate::sim::ensure_self_signed(&dir).unwrap();
        let acceptor = acceptor(&files.cert, &files.key);
        let ca = CertificateDer::from_pem_file(&files.ca);
        let _ = std::fs::remove_dir_all(&dir);
        let (acceptor, ca) = (acceptor.unwrap(), ca.unwrap());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        assert_eq!(provider.cipher_suites[0].suite(), rustls::CipherSuite::TLS13_AES_256_GCM_SHA384);
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut server = rustls::ServerConnection::new(acceptor.config().clone()).unwrap();
        while client.is_handshaking() || server.is_handshaking() {
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            server.read_tls(&mut wire.as_slice()).unwrap();
            server.process_new_packets().unwrap();
            let mut wire = Vec::new();
            server.write_tls(&mut wire).unwrap();
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets().unwrap();
        }
        let suite = client.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(suite, rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    }

    #[test]
    fn queries_are_decoded() {
        let q = parse_query(Some("fieldSelector=metadata.name%3Dmoduletemplates.operator.kyma-project.io&watch=1"));
        assert_eq!(q.field_selector.as_deref(), Some("metadata.name=moduletemplates.operator.kyma-project.io"));
        assert!(q.watch);
        assert_eq!(percent_decode("a%2"), "a%2");
    }
}
