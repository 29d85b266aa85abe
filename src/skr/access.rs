//! Finds a Kyma's access Secret and turns its kubeconfig into a client (R1.4 in
//! docs/catalog-rules.md: the Secret in the Kyma's namespace labelled
//! `operator.kyma-project.io/kyma-name=<kyma>`, data key `config`; zero or several such
//! Secrets are an error for that Kyma only).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher;
use secrecy::SecretString;

use crate::api::{KUBECONFIG_KEY, KYMA_NAME_LABEL};
use crate::error::{Result, SyncError};
use crate::skr::destination::{Destinations, Rule};
use crate::skr::kubeconfig::{self, Credentials, InsecureTls, KubeconfigProblem, ServerHost, SkrKubeconfig};
use crate::skr::request::SkrClient;

/// How every SKR client is built.
#[derive(Debug, Clone)]
pub struct AccessSettings {
    /// User-Agent of every request, `catalogsync/<version> (<replica>) process/<nonce>`, so
    /// SKR audit logs tell replicas, and processes of one replica, apart.
    pub user_agent: String,
    /// TCP and TLS connect timeout; also bounds the DNS lookup of the server name.
    pub connect: Duration,
    /// Where SKR servers may be (`--skr-allowed-destinations`).
    pub destinations: Arc<Destinations>,
    /// Whether `insecure-skip-tls-verify` is accepted (`--allow-insecure-skr-tls`).
    pub insecure_tls: InsecureTls,
    /// Largest SKR answer in bytes (`--skr-max-response-size`).
    pub max_response: usize,
    /// Most bytes read from one SKR in one sync, all answers together (`--skr-sync-budget`).
    pub sync_budget: usize,
}

impl AccessSettings {
    /// Settings with the defaults of `catalogsync run`: public destinations, TLS verified,
    /// answers up to [`DEFAULT_MAX_RESPONSE`].
    pub fn new(user_agent: impl Into<String>, connect: Duration) -> Self {
        Self {
            user_agent: user_agent.into(),
            connect,
            destinations: Arc::new(Destinations::default()),
            insecure_tls: InsecureTls::Refuse,
            max_response: DEFAULT_MAX_RESPONSE,
            sync_budget: DEFAULT_SYNC_BUDGET,
        }
    }
}

/// SKR connect timeout: a reachable apiserver answers a TCP and TLS handshake well within it.
/// Also bounds the lookup of the KCP apiserver's addresses ([`kcp_addresses`]).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl AccessSettings {
    /// The settings of the SKR access flags of `run` and `explain`: SKR servers only where
    /// `rules` (`--skr-allowed-destinations`) allow and never at `kcp_addrs`, the KCP
    /// apiserver's own addresses ([`kcp_addresses`]); `insecure-skip-tls-verify` only with
    /// `--allow-insecure-skr-tls`; answers up to `max_response` bytes each, and up to
    /// `sync_budget` bytes all together in one sync.
    pub fn from_flags(
        user_agent: String,
        rules: Vec<Rule>,
        kcp_addrs: Vec<SocketAddr>,
        insecure_tls: InsecureTls,
        max_response: usize,
        sync_budget: usize,
    ) -> Self {
        Self {
            user_agent,
            connect: CONNECT_TIMEOUT,
            destinations: Arc::new(Destinations::new(rules).deny(kcp_addrs)),
            insecure_tls,
            max_response,
            sync_budget,
        }
    }
}

/// The addresses of the KCP apiserver at `url`, which no SKR kubeconfig may name: an access
/// Secret must not make catalogsync send requests, with an SKR's credentials, to its own KCP.
/// `None` when the name does not resolve within [`CONNECT_TIMEOUT`].
pub async fn kcp_addresses(url: &http::Uri) -> Option<Vec<SocketAddr>> {
    let host = url.host()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(443);
    let lookup = tokio::net::lookup_host((host, port));
    match tokio::time::timeout(CONNECT_TIMEOUT, lookup).await {
        Ok(Ok(addrs)) => Some(addrs.collect()),
        _ => None,
    }
}

/// Default of `--skr-max-response-size`: lists are read in pages of at most
/// [`crate::sync::executor::FULL_LIST_PAGE`] copies, so this fits a page of 50
/// ModuleTemplates of 160 KB each (real ones are 3-50 KB), and a CRD of the catalog kinds
/// (about 100 KB) 80 times over.
pub const DEFAULT_MAX_RESPONSE: usize = 8 * 1024 * 1024;

/// Default of `--skr-sync-budget`, everything one sync may read from its SKR. The most a
/// healthy SKR sends in one sync is a cold verification of a large catalog: 200
/// ModuleTemplates of 50 KB (real catalogs have 20-100 of 3-50 KB) listed in full twice (a
/// metadata list that finds an unknown copy is followed by a full one) is 20 MB, the
/// metadata-only lists, apply answers and the two CRDs read while they become established
/// (at most 100 reads of about 100 KB each, in practice a few) add up to a few MB more. 64
/// MiB leaves a margin of three over that; a sync over it is an SKR sending far more than
/// any catalog needs.
pub const DEFAULT_SYNC_BUDGET: usize = 64 * 1024 * 1024;

/// Picks the one access Secret of `kyma` among the Secret metadata of its namespace.
///
/// # Errors
/// [`SyncError::AccessSecretMissing`] when none matches, [`SyncError::AccessSecretAmbiguous`] when
/// several do.
pub fn find_access_secret<'a>(
    secrets: impl IntoIterator<Item = &'a PartialObjectMeta<Secret>>,
    kyma: &str,
    namespace: &str,
) -> Result<&'a PartialObjectMeta<Secret>> {
    let mut found: Vec<&PartialObjectMeta<Secret>> = secrets
        .into_iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata.labels.as_ref().and_then(|l| l.get(KYMA_NAME_LABEL)).map(String::as_str) == Some(kyma)
        })
        .collect();
    match found.len() {
        0 => Err(SyncError::AccessSecretMissing { kyma: kyma.to_owned(), namespace: namespace.to_owned() }),
        1 => Ok(found.remove(0)),
        count => {
            let mut names: Vec<String> = found.iter().filter_map(|s| s.metadata.name.clone()).collect();
            names.sort_unstable();
            Err(SyncError::AccessSecretAmbiguous { kyma: kyma.to_owned(), count, names })
        }
    }
}

/// An access Secret as a sync needs it: its name, and the version an access built from it
/// depends on (`uid/resourceVersion`, [`secret_version`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// The Secret's name in the Kymas' namespace.
    pub name: String,
    /// `uid/resourceVersion`.
    pub version: String,
}

impl SecretRef {
    /// The reference to the Secret `meta` describes.
    pub fn of(meta: &PartialObjectMeta<Secret>) -> Self {
        Self { name: meta.metadata.name.clone().unwrap_or_default(), version: secret_version(meta) }
    }
}

/// One access Secret in [`AccessSecrets`]: the Kyma its label names and its version.
struct Noted {
    kyma: Box<str>,
    version: Box<str>,
}

/// The Secrets of one list or watch, by name, and their names by Kyma.
#[derive(Default)]
struct Noting {
    by_name: HashMap<Box<str>, Noted>,
    by_kyma: HashMap<Box<str>, Vec<Box<str>>>,
}

impl Noting {
    fn insert(&mut self, name: &str, kyma: &str, version: &str) {
        let noted = Noted { kyma: kyma.into(), version: version.into() };
        match self.by_name.insert(name.into(), noted) {
            Some(old) if *old.kyma == *kyma => return,
            Some(old) => self.unindex(&old.kyma, name),
            None => {}
        }
        // A Kyma has one Secret, rarely two: a short vector costs a fraction of a set.
        self.by_kyma.entry(kyma.into()).or_default().push(name.into());
    }

    /// Whether Secret `name` is known with this Kyma label and version.
    fn holds(&self, name: &str, kyma: &str, version: &str) -> bool {
        self.by_name.get(name).is_some_and(|n| *n.kyma == *kyma && *n.version == *version)
    }

    /// Forgets Secret `name`; returns the Kyma it was noted for.
    fn remove(&mut self, name: &str) -> Option<Box<str>> {
        let old = self.by_name.remove(name)?;
        self.unindex(&old.kyma, name);
        Some(old.kyma)
    }

    fn unindex(&mut self, kyma: &str, name: &str) {
        if let Some(names) = self.by_kyma.get_mut(kyma) {
            names.retain(|n| **n != *name);
            if names.is_empty() {
                self.by_kyma.remove(kyma);
            }
        }
    }
}

/// What the replica knows of the access Secrets of the Kymas' namespace, filled by their
/// metadata watch ([`AccessSecrets::apply`]): per Secret its name, the Kyma its label names and
/// its version, nothing else (about 0.4 KB a Secret; the typed metadata in a reflector cache
/// and an index by Kyma took about 1.7 KB). A (re-)list replaces all of it when it ends, as a
/// reflector cache does, so a Secret deleted while the watch was down is forgotten.
#[derive(Clone)]
pub struct AccessSecrets {
    namespace: Arc<str>,
    inner: Arc<Mutex<SecretsInner>>,
    ready: Arc<tokio::sync::watch::Sender<bool>>,
}

#[derive(Default)]
struct SecretsInner {
    known: Noting,
    /// The Secrets of a list in progress, which replace `known` when it ends.
    listing: Option<Noting>,
}

impl AccessSecrets {
    /// Nothing known yet of the access Secrets of `namespace`; not ready until the first list
    /// ended.
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.into(),
            inner: Arc::default(),
            ready: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SecretsInner> {
        // Each critical section leaves the maps consistent, so a poisoned lock is harmless.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in one event of the Secrets' metadata watch. Returns the Kyma whose Secret is new,
    /// changed (another version or Kyma label) or deleted, to be reconciled. The first list
    /// names none: the controller starts after it and reconciles every Kyma anyway, so 5,000
    /// Secrets do not queue 5,000 extra reconciles. A later re-list names the Kymas whose
    /// Secret changed while the watch was down.
    pub fn apply(&self, event: &watcher::Event<PartialObjectMeta<Secret>>) -> Option<String> {
        let mut inner = self.lock();
        match event {
            watcher::Event::Init => {
                inner.listing = Some(Noting::default());
                None
            }
            watcher::Event::InitApply(secret) => {
                let (name, kyma, version) = self.read(secret)?;
                let changed = self.is_ready() && !inner.known.holds(name, kyma, &version);
                inner.listing.get_or_insert_default().insert(name, kyma, &version);
                changed.then(|| kyma.to_owned())
            }
            watcher::Event::InitDone => {
                if let Some(listed) = inner.listing.take() {
                    inner.known = listed;
                }
                drop(inner);
                self.ready.send_replace(true);
                None
            }
            watcher::Event::Apply(secret) => {
                let (name, kyma, version) = self.read(secret)?;
                let changed = !inner.known.holds(name, kyma, &version);
                inner.known.insert(name, kyma, &version);
                changed.then(|| kyma.to_owned())
            }
            watcher::Event::Delete(secret) => {
                // By name, and for the Kyma it was noted for, whatever labels the deleted
                // object shows (the apiserver reports a Secret that lost its label as the
                // deletion of its previous state, with the label).
                let meta = &secret.metadata;
                if meta.namespace.as_deref().is_some_and(|ns| *ns != *self.namespace) {
                    return None;
                }
                inner.known.remove(meta.name.as_deref()?).map(String::from)
            }
        }
    }

    /// Name, Kyma label and version of a Secret of the namespace, or `None` for anything else.
    fn read<'a>(&self, secret: &'a PartialObjectMeta<Secret>) -> Option<(&'a str, &'a str, String)> {
        let meta = &secret.metadata;
        if meta.namespace.as_deref().is_some_and(|ns| *ns != *self.namespace) {
            return None;
        }
        let kyma = meta.labels.as_ref()?.get(KYMA_NAME_LABEL)?;
        Some((meta.name.as_deref()?, kyma, secret_version(secret)))
    }

    /// Whether the first list ended.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the first list ended.
    pub async fn until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`, so this ends only when ready.
        let _ = ready.wait_for(|r| *r).await;
    }

    /// The one access Secret of `kyma` in `namespace`, as [`find_access_secret`] picks it.
    ///
    /// # Errors
    /// As [`find_access_secret`].
    pub fn find(&self, kyma: &str, namespace: &str) -> Result<SecretRef> {
        let missing = || SyncError::AccessSecretMissing { kyma: kyma.to_owned(), namespace: namespace.to_owned() };
        if namespace != &*self.namespace {
            return Err(missing());
        }
        let inner = self.lock();
        let known = &inner.known;
        match known.by_kyma.get(kyma).map(Vec::as_slice).unwrap_or_default() {
            [] => Err(missing()),
            [name] => {
                let version = known.by_name.get(name).map(|n| n.version.to_string()).unwrap_or_default();
                Ok(SecretRef { name: name.to_string(), version })
            }
            names => {
                let mut names: Vec<String> = names.iter().map(ToString::to_string).collect();
                names.sort_unstable();
                Err(SyncError::AccessSecretAmbiguous { kyma: kyma.to_owned(), count: names.len(), names })
            }
        }
    }
}

/// What a replica keeps of one SKR's access between syncs: the accepted kubeconfig as a
/// client configuration (a few KB), and its TLS client configuration with room for the SKR's
/// session tickets (a few KB). A [`Client`], with its connection pool and connection, is built
/// for each sync and dropped with it, so thousands of idle SKRs hold no connections or client
/// stacks (about 100 KB per SKR when clients were kept). The kept TLS configuration lets the
/// next sync resume the TLS session: no certificate chain to verify in the replica, no
/// signature to make in the SKR's apiserver.
#[derive(Clone)]
pub struct SkrAccess {
    secret: String,
    /// Where the server is; the credentials live in `config` only.
    server: Server,
    config: kube::Config,
    settings: AccessSettings,
    /// Built at the first sync that could build it.
    tls: std::sync::OnceLock<rustls::ClientConfig>,
}

impl SkrAccess {
    /// Reads the `config` key of an access Secret through the kubeconfig allowlist
    /// ([`crate::skr::kubeconfig`]). Nothing is read, run or contacted here.
    ///
    /// # Errors
    /// [`SyncError::AccessSecretInvalid`] when the key is missing or the kubeconfig is not
    /// accepted; its message names the field, never a value.
    pub fn from_secret(secret: &Secret, settings: &AccessSettings) -> Result<Self> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let invalid = |problem| SyncError::AccessSecretInvalid { name: name.clone(), problem };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .ok_or_else(|| invalid(KubeconfigProblem::MissingKey))?;
        let kubeconfig = kubeconfig::parse(&bytes.0, settings.insecure_tls).map_err(invalid)?;
        let config = client_config(&kubeconfig, settings);
        let server = Server { host: kubeconfig.host, port: kubeconfig.port, field: kubeconfig.server_field };
        Ok(Self { secret: name, server, config, settings: settings.clone(), tls: std::sync::OnceLock::new() })
    }

    /// The addresses of the SKR's server that `--skr-allowed-destinations` allows: an IP
    /// server as it is, a name resolved now (bounded by the connect timeout). The client of
    /// this sync connects to exactly these.
    ///
    /// # Errors
    /// [`SyncError::AccessSecretInvalid`] when any address is not allowed,
    /// [`SyncError::ResolveSkr`] when the name does not resolve.
    pub async fn addresses(&self) -> Result<Vec<SocketAddr>> {
        let kc = &self.server;
        let (addrs, trusted, is_or_resolves) = match &kc.host {
            ServerHost::Ip(ip) => (vec![SocketAddr::new(*ip, kc.port)], false, "is"),
            ServerHost::Name(name) => {
                let lookup = tokio::net::lookup_host((name.as_str(), kc.port));
                let addrs: Vec<SocketAddr> = match tokio::time::timeout(self.settings.connect, lookup).await {
                    Ok(Ok(addrs)) => addrs.collect(),
                    Ok(Err(source)) => return Err(SyncError::ResolveSkr { source }),
                    Err(_) => {
                        let source = std::io::Error::new(std::io::ErrorKind::TimedOut, "the DNS lookup timed out");
                        return Err(SyncError::ResolveSkr { source });
                    }
                };
                if addrs.is_empty() {
                    let source = std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address");
                    return Err(SyncError::ResolveSkr { source });
                }
                (addrs, self.settings.destinations.trusts_name(name), "resolves to")
            }
        };
        for addr in &addrs {
            if let Err(refusal) = self.settings.destinations.check(*addr, trusted) {
                return Err(SyncError::AccessSecretInvalid {
                    name: self.secret.clone(),
                    problem: KubeconfigProblem::Destination { field: kc.field.clone(), is_or_resolves, refusal },
                });
            }
        }
        Ok(addrs)
    }

    /// A client for one sync, connecting only to the allowed addresses of the server.
    ///
    /// # Errors
    /// As [`SkrAccess::addresses`]; [`SyncError::AccessSecretInvalid`] when no TLS client can
    /// be built from the certificate data.
    pub async fn client(&self) -> Result<SkrClient> {
        let addrs = self.addresses().await?;
        let invalid = || SyncError::AccessSecretInvalid { name: self.secret.clone(), problem: KubeconfigProblem::Tls };
        let tls = match self.tls.get() {
            Some(tls) => tls.clone(),
            None => {
                let tls = tls_config(&self.config).map_err(|_| invalid())?;
                let _ = self.tls.set(tls.clone());
                tls
            }
        };
        let client = build_client(&self.config, tls, addrs, &self.settings).map_err(|_| invalid())?;
        Ok(SkrClient::new(client, self.settings.max_response, self.settings.sync_budget))
    }
}

/// The host and port of an SKR server, and the path of the kubeconfig field that named it
/// (for messages).
#[derive(Debug, Clone)]
struct Server {
    host: ServerHost,
    port: u16,
    field: String,
}

/// kube's client configuration from an accepted kubeconfig: only the fields the allowlist
/// let through are set, so kube's client never reads a file or runs a command for it.
fn client_config(kc: &SkrKubeconfig, settings: &AccessSettings) -> kube::Config {
    let mut config = kube::Config::new(kc.server.clone());
    config.root_cert = kc.roots.clone();
    config.accept_invalid_certs = kc.insecure;
    config.tls_server_name = kc.tls_server_name.clone();
    config.connect_timeout = Some(settings.connect);
    match &kc.credentials {
        Credentials::Token(token) => config.auth_info.token = Some(SecretString::from(token.clone())),
        Credentials::Certificate { certificate, key } => {
            config.auth_info.client_certificate_data = Some(certificate.clone());
            config.auth_info.client_key_data = Some(SecretString::from(key.clone()));
        }
    }
    if let Ok(agent) = http::HeaderValue::from_str(&settings.user_agent) {
        config.headers.push((http::header::USER_AGENT, agent));
    }
    config
}

/// The TLS client configuration of an SKR, as kube builds it (trust anchors, client
/// certificate), remembering the session tickets of one server: an SKR is one apiserver.
fn tls_config(config: &kube::Config) -> std::result::Result<rustls::ClientConfig, kube::Error> {
    use kube::client::ConfigExt as _;
    let mut tls = config.rustls_client_config()?;
    // rustls's default store has room for 256 servers, allocated up front.
    tls.resumption = rustls::client::Resumption::in_memory_sessions(SESSIONS_PER_SKR);
    Ok(tls)
}

/// TLS 1.3 session tickets kept per SKR (a sync needs one; apiservers send one or two per
/// handshake).
const SESSIONS_PER_SKR: usize = 2;

/// A connection idle longer than this is not reused (checked when a request needs one; a
/// client lives for one sync, whose requests follow each other within milliseconds).
pub const SKR_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A resolver that answers every name with the addresses checked for this sync.
#[derive(Clone)]
struct Pinned(Vec<SocketAddr>);

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for Pinned {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<std::result::Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        std::future::ready(Ok(self.0.clone().into_iter()))
    }
}

/// Builds an SKR client: kube's stack (base URI, retries, credentials, headers) over a
/// connection pool that keeps at most one idle connection per SKR (kube's default client
/// would open up to `--skr-concurrency` connections per SKR and keep them all), connects
/// over `https://` only, to `addrs` only, and caps every answer's body at
/// `--skr-max-response-size` (see [`crate::skr::request`]).
fn build_client(
    config: &kube::Config,
    tls: rustls::ClientConfig,
    addrs: Vec<SocketAddr>,
    settings: &AccessSettings,
) -> std::result::Result<Client, kube::Error> {
    use kube::client::ConfigExt as _;
    use tower::ServiceBuilder;

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(Pinned(addrs));
    http.enforce_http(false);
    http.set_connect_timeout(Some(settings.connect));
    // As kube's `rustls_https_connector_with_connector`, with the kept TLS configuration.
    let mut https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().wrap_connector(http);
    let pool = hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(SKR_IDLE_TIMEOUT)
        .pool_max_idle_per_host(1)
        .build(https);
    let max_response = settings.max_response;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        // As kube's default client: 429, 503 and 504 are retried (an SKR answers 429 while the
        // storage of a CRD it just created initialises), within the executor's request timeout.
        .layer(tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .map_response(move |response: http::Response<hyper::body::Incoming>| {
            response.map(|body| http_body_util::Limited::new(body, max_response))
        })
        .service(pool);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// The version of a Secret that an access depends on: `uid/resourceVersion`.
pub fn secret_version(meta: &PartialObjectMeta<Secret>) -> String {
    format!(
        "{}/{}",
        meta.metadata.uid.as_deref().unwrap_or_default(),
        meta.metadata.resource_version.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;

    fn secret(name: &str, kyma: &str) -> PartialObjectMeta<Secret> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("kcp-system".into()),
                labels: Some([(KYMA_NAME_LABEL.to_owned(), kyma.to_owned())].into()),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    #[test]
    fn exactly_one_secret_is_required() {
        let secrets = [secret("a", "k1"), secret("b", "k2"), secret("c", "k2")];
        assert_eq!(
            find_access_secret(&secrets, "k1", "kcp-system").ok().and_then(|s| s.metadata.name.clone()),
            Some("a".into())
        );
        assert!(matches!(find_access_secret(&secrets, "k3", "kcp-system"), Err(SyncError::AccessSecretMissing { .. })));
        let err = find_access_secret(&secrets, "k2", "kcp-system").err();
        assert!(matches!(err, Some(SyncError::AccessSecretAmbiguous { count: 2, .. })), "{err:?}");
        assert!(matches!(find_access_secret(&secrets, "k1", "other"), Err(SyncError::AccessSecretMissing { .. })));
    }

    fn versioned(name: &str, kyma: &str, version: &str) -> PartialObjectMeta<Secret> {
        let mut s = secret(name, kyma);
        s.metadata.uid = Some(format!("uid-{name}"));
        s.metadata.resource_version = Some(version.into());
        s
    }

    #[test]
    fn the_secrets_are_found_by_kyma_with_their_version() {
        use kube::runtime::watcher::Event;
        let secrets = AccessSecrets::new("kcp-system");
        assert!(!secrets.is_ready());
        let listed = [Event::Init, Event::InitApply(versioned("a", "k1", "1")), Event::InitApply(secret("b", "k2"))];
        let kymas: Vec<_> = listed.iter().map(|e| secrets.apply(e)).collect();
        assert_eq!(kymas, [None, None, None], "the first list requeues nothing");
        // Nothing is known until the list ended.
        assert!(!secrets.is_ready());
        assert!(matches!(secrets.find("k1", "kcp-system"), Err(SyncError::AccessSecretMissing { .. })));
        assert_eq!(secrets.apply(&Event::InitDone), None);
        assert!(secrets.is_ready());
        let found = secrets.find("k1", "kcp-system").ok();
        assert_eq!(found, Some(SecretRef { name: "a".into(), version: "uid-a/1".into() }));
        assert!(matches!(secrets.find("k1", "other"), Err(SyncError::AccessSecretMissing { .. })));

        // A second Secret for k2: ambiguous, both named.
        assert_eq!(secrets.apply(&Event::Apply(secret("c", "k2"))), Some("k2".to_owned()));
        let err = secrets.find("k2", "kcp-system").err();
        assert!(
            matches!(&err, Some(SyncError::AccessSecretAmbiguous { count: 2, names, .. }) if names == &["b", "c"]),
            "{err:?}"
        );
        // Relabelled from k2 to k3: found under k3 only.
        assert_eq!(secrets.apply(&Event::Apply(secret("c", "k3"))), Some("k3".to_owned()));
        assert_eq!(secrets.find("k2", "kcp-system").ok().map(|s| s.name), Some("b".into()));
        assert_eq!(secrets.find("k3", "kcp-system").ok().map(|s| s.name), Some("c".into()));
        // A new version; the same one again (a watch may repeat it) requeues nothing.
        assert_eq!(secrets.apply(&Event::Apply(versioned("a", "k1", "2"))), Some("k1".to_owned()));
        assert_eq!(secrets.apply(&Event::Apply(versioned("a", "k1", "2"))), None);
        assert_eq!(secrets.find("k1", "kcp-system").ok().map(|s| s.version), Some("uid-a/2".into()));
        // Deleted: its Kyma is reconciled (and finds no Secret).
        assert_eq!(secrets.apply(&Event::Delete(secret("b", "k2"))), Some("k2".to_owned()));
        assert!(matches!(secrets.find("k2", "kcp-system"), Err(SyncError::AccessSecretMissing { .. })));
        // A deletion that shows no label still removes the Secret and reconciles the Kyma it
        // was noted for.
        assert_eq!(secrets.apply(&Event::Apply(secret("g", "k7"))), Some("k7".to_owned()));
        let mut delabelled = secret("g", "k7");
        delabelled.metadata.labels = None;
        assert_eq!(secrets.apply(&Event::Delete(delabelled)), Some("k7".to_owned()));
        assert!(matches!(secrets.find("k7", "kcp-system"), Err(SyncError::AccessSecretMissing { .. })));
        // A deletion of a Secret it never noted requeues nothing.
        assert_eq!(secrets.apply(&Event::Delete(secret("g", "k7"))), None);
        // A Secret of another namespace, or without the label, is no access Secret.
        let mut elsewhere = secret("d", "k4");
        elsewhere.metadata.namespace = Some("other".into());
        assert_eq!(secrets.apply(&Event::Apply(elsewhere)), None);
        let mut unlabelled = secret("e", "k5");
        unlabelled.metadata.labels = None;
        assert_eq!(secrets.apply(&Event::Apply(unlabelled)), None);
        assert!(matches!(secrets.find("k4", "kcp-system"), Err(SyncError::AccessSecretMissing { .. })));

        // A re-list replaces everything when it ends: k3's Secret was deleted meanwhile, k1's
        // changed (requeued); an unchanged one is not requeued.
        secrets.apply(&Event::Apply(versioned("f", "k6", "1")));
        let relisted =
            [Event::Init, Event::InitApply(versioned("a", "k1", "3")), Event::InitApply(versioned("f", "k6", "1"))];
        let kymas: Vec<_> = relisted.iter().map(|e| secrets.apply(e)).collect();
        assert_eq!(kymas, [None, Some("k1".to_owned()), None]);
        assert_eq!(secrets.find("k3", "kcp-system").ok().map(|s| s.name), Some("c".into()), "kept until the list ends");
        secrets.apply(&Event::InitDone);
        assert!(matches!(secrets.find("k3", "kcp-system"), Err(SyncError::AccessSecretMissing { .. })));
        assert_eq!(secrets.find("k1", "kcp-system").ok().map(|s| s.version), Some("uid-a/3".into()));
        assert!(secrets.is_ready());
    }

    #[tokio::test]
    async fn readiness_waits_for_the_first_list() {
        use kube::runtime::watcher::Event;
        let secrets = AccessSecrets::new("kcp-system");
        let waiting = tokio::spawn({
            let secrets = secrets.clone();
            async move { secrets.until_ready().await }
        });
        secrets.apply(&Event::Init);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        secrets.apply(&Event::InitDone);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("ready within 5 s").expect("no panic");
        // Ready stays ready, also during a later re-list.
        secrets.apply(&Event::Init);
        tokio::time::timeout(Duration::from_secs(5), secrets.until_ready()).await.expect("still ready");
    }

    fn settings() -> AccessSettings {
        let mut settings = AccessSettings::new("catalogsync/test", Duration::from_secs(1));
        settings.destinations = Arc::new(Destinations::new(vec!["127.0.0.1/32".parse().expect("a rule")]));
        settings
    }

    fn secret_with(kubeconfig: &str) -> Secret {
        Secret {
            metadata: ObjectMeta { name: Some("s".into()), ..ObjectMeta::default() },
            data: Some([(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(kubeconfig.as_bytes().to_vec()))].into()),
            ..Secret::default()
        }
    }

    fn kubeconfig(server: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: skr\n\
            clusters: [{{name: skr, cluster: {{server: '{server}'}}}}]\n\
            users: [{{name: skr, user: {{token: t}}}}]\n\
            contexts: [{{name: skr, context: {{cluster: skr, user: skr}}}}]\n"
        )
    }

    #[tokio::test]
    async fn the_tls_configuration_is_built_once_and_kept() {
        // Building a client connects nowhere: the first request would.
        let access = SkrAccess::from_secret(&secret_with(&kubeconfig("https://127.0.0.1:1")), &settings())
            .expect("an accepted kubeconfig");
        assert!(access.tls.get().is_none(), "nothing is built before the first sync");
        access.client().await.expect("a client");
        assert!(access.tls.get().is_some(), "the first client keeps its TLS configuration");
        access.client().await.expect("a second client from the kept configuration");
    }

    #[tokio::test]
    async fn servers_outside_the_allowed_destinations_get_no_client() {
        let access = SkrAccess::from_secret(&secret_with(&kubeconfig("https://127.0.0.2:6443")), &settings())
            .expect("the kubeconfig itself is fine");
        let err = access.client().await.err().expect("127.0.0.2 is not allowed");
        assert_eq!(
            err.to_string(),
            "access secret s holds no acceptable kubeconfig: clusters[0].cluster.server is a loopback address, \
             which --skr-allowed-destinations does not allow"
        );
        assert!(access.tls.get().is_none(), "refused before anything was built");
    }

    #[tokio::test]
    async fn malformed_kubeconfig_is_invalid_not_a_crash() {
        let mut s =
            Secret { metadata: ObjectMeta { name: Some("s".into()), ..ObjectMeta::default() }, ..Secret::default() };
        let problem = |s: &Secret| match SkrAccess::from_secret(s, &settings()) {
            Err(SyncError::AccessSecretInvalid { problem, .. }) => problem,
            other => panic!("not AccessSecretInvalid: {:?}", other.map(|_| ())),
        };
        assert_eq!(problem(&s), KubeconfigProblem::MissingKey);
        s.data = Some([(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(b"{not: [yaml".to_vec()))].into());
        assert!(matches!(problem(&s), KubeconfigProblem::NotYaml { .. }));
        s.data = Some(
            [(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(b"apiVersion: v1\nkind: Config\n".to_vec()))].into(),
        );
        assert!(matches!(problem(&s), KubeconfigProblem::NoContext { .. }));
    }
}
