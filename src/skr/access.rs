//! Finds a Kyma's access Secret and turns its kubeconfig into a client (spec section 1: the
//! Secret in the Kyma's namespace labelled `operator.kyma-project.io/kyma-name=<kyma>`, data
//! key `config`; zero or several such Secrets are an error for that Kyma only).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{KUBECONFIG_KEY, KYMA_NAME_LABEL};
use crate::error::{Error, Result};

/// Settings applied to every SKR client.
#[derive(Debug, Clone)]
pub struct AccessTimeouts {
    /// User-Agent of every request, `catalogsync/<version> (<replica>)`, so SKR audit logs
    /// tell replicas apart.
    pub user_agent: String,
    /// TCP and TLS connect timeout.
    pub connect: Duration,
    /// Read and write timeout of one request.
    pub request: Duration,
}

/// Picks the one access Secret of `kyma` among the Secret metadata of its namespace.
///
/// # Errors
/// [`Error::AccessSecretMissing`] when none matches, [`Error::AccessSecretAmbiguous`] when
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
        0 => Err(Error::AccessSecretMissing { kyma: kyma.to_owned(), namespace: namespace.to_owned() }),
        1 => Ok(found.remove(0)),
        count => {
            let mut names: Vec<&str> = found.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
            names.sort_unstable();
            Err(Error::AccessSecretAmbiguous { kyma: kyma.to_owned(), count, names: names.join(", ") })
        }
    }
}

/// The access Secrets' metadata (the reflector cache) with an index from Kyma name to Secret
/// names, so a sync looks its Secret up by name instead of scanning every Secret of the
/// namespace (at 5,000 Kymas a scan per sync made a propagation quadratic).
///
/// The index may name Secrets the cache no longer holds, or that carry another Kyma's label
/// by now; lookups check every candidate against the cache, which stays the truth.
#[derive(Clone)]
pub struct AccessSecrets {
    store: Store<PartialObjectMeta<Secret>>,
    by_kyma: Arc<Mutex<HashMap<String, BTreeSet<String>>>>,
}

impl AccessSecrets {
    /// An index over `store`; feed it every Secret the watch sees with [`AccessSecrets::note`].
    pub fn new(store: Store<PartialObjectMeta<Secret>>) -> Self {
        Self { store, by_kyma: Arc::default() }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeSet<String>>> {
        // Each critical section is a single map operation, so a poisoned map is consistent.
        self.by_kyma.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a Secret the watch delivers. Called before the cache stores it, so whatever
    /// the cache holds is indexed.
    pub fn note(&self, secret: &PartialObjectMeta<Secret>) {
        let kyma = secret.metadata.labels.as_ref().and_then(|l| l.get(KYMA_NAME_LABEL));
        if let (Some(kyma), Some(name)) = (kyma, secret.metadata.name.as_ref()) {
            self.index().entry(kyma.clone()).or_default().insert(name.clone());
        }
    }

    /// Forgets a deleted Secret (called after the cache dropped it).
    pub fn forget(&self, secret: &PartialObjectMeta<Secret>) {
        let kyma = secret.metadata.labels.as_ref().and_then(|l| l.get(KYMA_NAME_LABEL));
        if let (Some(kyma), Some(name)) = (kyma, secret.metadata.name.as_ref()) {
            let mut index = self.index();
            if let Some(names) = index.get_mut(kyma) {
                names.remove(name);
                if names.is_empty() {
                    index.remove(kyma);
                }
            }
        }
    }

    /// The one access Secret of `kyma` in `namespace`, as [`find_access_secret`] picks it.
    ///
    /// # Errors
    /// As [`find_access_secret`].
    pub fn find(&self, kyma: &str, namespace: &str) -> Result<PartialObjectMeta<Secret>> {
        let names: Vec<String> = self.index().get(kyma).into_iter().flatten().cloned().collect();
        let candidates: Vec<Arc<PartialObjectMeta<Secret>>> =
            names.iter().filter_map(|name| self.store.get(&ObjectRef::new(name).within(namespace))).collect();
        find_access_secret(candidates.iter().map(AsRef::as_ref), kyma, namespace).cloned()
    }
}

/// What a replica keeps of one SKR's access between syncs: the kubeconfig of its access
/// Secret, parsed (a few KB), and its TLS client configuration with room for the SKR's
/// session tickets (a few KB). A [`Client`], with its connection pool and connection, is built
/// for each sync and dropped with it, so thousands of idle SKRs hold no connections or client
/// stacks (about 100 KB per SKR when clients were kept). The kept TLS configuration lets the
/// next sync resume the TLS session: no certificate chain to verify in the replica, no
/// signature to make in the SKR's apiserver.
#[derive(Clone)]
pub struct SkrAccess {
    secret: String,
    config: kube::Config,
    connect_timeout: Duration,
    /// Built at the first sync that could build it.
    tls: std::sync::OnceLock<rustls::ClientConfig>,
}

impl SkrAccess {
    /// Reads the `config` key of an access Secret. Whether a client can be built from it
    /// shows in [`SkrAccess::client`], at the sync that needs one.
    ///
    /// # Errors
    /// [`Error::AccessSecretInvalid`] when the key is missing, is not a kubeconfig, or names
    /// no usable cluster and credentials.
    pub async fn from_secret(secret: &Secret, timeouts: &AccessTimeouts) -> Result<Self> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let invalid = |reason: String| Error::AccessSecretInvalid { name: name.clone(), reason };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .ok_or_else(|| invalid("the key is missing".into()))?;
        let text = std::str::from_utf8(&bytes.0).map_err(|_| invalid("the kubeconfig is not UTF-8".into()))?;
        let kubeconfig =
            Kubeconfig::from_yaml(text).map_err(|e| invalid(format!("the kubeconfig does not parse: {e}")))?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| invalid(format!("the kubeconfig is not usable: {e}")))?;
        if let Ok(agent) = http::HeaderValue::from_str(&timeouts.user_agent) {
            config.headers.push((http::header::USER_AGENT, agent));
        }
        Ok(Self { secret: name, config, connect_timeout: timeouts.connect, tls: std::sync::OnceLock::new() })
    }

    /// A client for one sync.
    ///
    /// # Errors
    /// [`Error::AccessSecretInvalid`] when no client can be built from the kubeconfig (for
    /// example unreadable certificate data); the failed sync drops the cached access.
    pub fn client(&self) -> Result<Client> {
        let invalid = |e: kube::Error| Error::AccessSecretInvalid {
            name: self.secret.clone(),
            reason: format!("no client can be built from it: {e}"),
        };
        let tls = match self.tls.get() {
            Some(tls) => tls.clone(),
            None => {
                let tls = tls_config(&self.config).map_err(invalid)?;
                // Only a configuration that depends on the Secret alone is kept: an exec
                // plugin may hand out a new client certificate at any time.
                if self.config.auth_info.exec.is_none() {
                    let _ = self.tls.set(tls.clone());
                }
                tls
            }
        };
        build_client(&self.config, tls, self.connect_timeout).map_err(invalid)
    }
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

/// Builds an SKR client: kube's stack (base URI, retries, credentials, headers) over a
/// connection pool that keeps at most one idle connection per SKR. kube's default client
/// would open up to `--skr-concurrency` connections per SKR and keep them all.
fn build_client(
    config: &kube::Config,
    tls: rustls::ClientConfig,
    connect_timeout: Duration,
) -> std::result::Result<Client, kube::Error> {
    use kube::client::ConfigExt as _;
    use tower::ServiceBuilder;

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    // As kube's `rustls_https_connector_with_connector`, with the kept TLS configuration.
    let mut https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
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
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        // As kube's default client: 429, 503 and 504 are retried (an SKR answers 429 while the
        // storage of a CRD it just created initialises), within the executor's request timeout.
        .layer(tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(pool);
    Ok(Client::new(service, config.default_namespace.clone()))
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
        assert!(matches!(find_access_secret(&secrets, "k3", "kcp-system"), Err(Error::AccessSecretMissing { .. })));
        let err = find_access_secret(&secrets, "k2", "kcp-system").err();
        assert!(matches!(err, Some(Error::AccessSecretAmbiguous { count: 2, .. })), "{err:?}");
        assert!(matches!(find_access_secret(&secrets, "k1", "other"), Err(Error::AccessSecretMissing { .. })));
    }

    #[test]
    fn the_index_finds_what_the_cache_holds() {
        use kube::runtime::watcher::Event;
        let (store, mut writer) = kube::runtime::reflector::store();
        let secrets = AccessSecrets::new(store);
        let mut apply = |s: PartialObjectMeta<Secret>| {
            secrets.note(&s);
            writer.apply_watcher_event(&Event::Apply(s));
        };
        apply(secret("a", "k1"));
        apply(secret("b", "k2"));
        apply(secret("c", "k2"));
        let name = |r: Result<PartialObjectMeta<Secret>>| r.ok().and_then(|s| s.metadata.name);
        assert_eq!(name(secrets.find("k1", "kcp-system")), Some("a".into()));
        assert!(matches!(secrets.find("k2", "kcp-system"), Err(Error::AccessSecretAmbiguous { count: 2, .. })));
        assert!(matches!(secrets.find("k1", "other"), Err(Error::AccessSecretMissing { .. })));
        // Relabelled from k2 to k3: found under k3 only, although the index still names it
        // under k2.
        apply(secret("c", "k3"));
        assert_eq!(name(secrets.find("k2", "kcp-system")), Some("b".into()));
        assert_eq!(name(secrets.find("k3", "kcp-system")), Some("c".into()));
        // Deleted: gone from the cache first, then from the index.
        let b = secret("b", "k2");
        writer.apply_watcher_event(&Event::Delete(b.clone()));
        assert!(matches!(secrets.find("k2", "kcp-system"), Err(Error::AccessSecretMissing { .. })));
        secrets.forget(&b);
        assert!(matches!(secrets.find("k2", "kcp-system"), Err(Error::AccessSecretMissing { .. })));
    }

    #[tokio::test]
    async fn the_tls_configuration_is_built_once_and_kept() {
        let timeouts = &AccessTimeouts {
            user_agent: "catalogsync/test".into(),
            connect: Duration::from_secs(1),
            request: Duration::from_secs(1),
        };
        let kubeconfig = "apiVersion: v1\nkind: Config\ncurrent-context: skr\n\
            clusters: [{name: skr, cluster: {server: 'https://skr.example:6443', insecure-skip-tls-verify: true}}]\n\
            users: [{name: skr, user: {token: t}}]\n\
            contexts: [{name: skr, context: {cluster: skr, user: skr}}]\n";
        let secret = Secret {
            metadata: ObjectMeta { name: Some("s".into()), ..ObjectMeta::default() },
            data: Some([(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(kubeconfig.as_bytes().to_vec()))].into()),
            ..Secret::default()
        };
        let access = SkrAccess::from_secret(&secret, timeouts).await.expect("a usable kubeconfig");
        assert!(access.tls.get().is_none(), "nothing is built before the first sync");
        access.client().expect("a client");
        assert!(access.tls.get().is_some(), "the first client keeps its TLS configuration");
        access.client().expect("a second client from the kept configuration");
    }

    #[tokio::test]
    async fn malformed_kubeconfig_is_invalid_not_a_crash() {
        let timeouts = &AccessTimeouts {
            user_agent: "catalogsync/test".into(),
            connect: Duration::from_secs(1),
            request: Duration::from_secs(1),
        };
        let mut s =
            Secret { metadata: ObjectMeta { name: Some("s".into()), ..ObjectMeta::default() }, ..Secret::default() };
        assert!(matches!(
            SkrAccess::from_secret(&s, timeouts).await.map(|_| ()),
            Err(Error::AccessSecretInvalid { .. })
        ));
        s.data = Some([(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(b"{not: [yaml".to_vec()))].into());
        assert!(matches!(
            SkrAccess::from_secret(&s, timeouts).await.map(|_| ()),
            Err(Error::AccessSecretInvalid { .. })
        ));
        s.data = Some(
            [(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(b"apiVersion: v1\nkind: Config\n".to_vec()))].into(),
        );
        assert!(matches!(
            SkrAccess::from_secret(&s, timeouts).await.map(|_| ()),
            Err(Error::AccessSecretInvalid { .. })
        ));
    }
}
