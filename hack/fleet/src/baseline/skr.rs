//! The SKR client of a pass as KLM gets it: the access Secret found in the KCP cache, the
//! client built per pass (or kept per Secret version), client-go's per-client token bucket,
//! and the bound of requests in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use catalogsync::api::{KYMA_NAME_LABEL, Kyma};
use catalogsync::skr::access::{AccessSettings, SkrAccess, find_access_secret};
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;

use super::error::PassError;
use super::lock;

/// How SKR clients are built and bounded.
pub(super) struct SkrSettings {
    /// How a client is built from an access Secret.
    pub access: AccessSettings,
    /// Requests per second of one client; 0 disables the limit.
    pub qps: f64,
    /// Token-bucket size of one client.
    pub burst: u32,
    /// Most requests in flight to one SKR; 0 means unbounded.
    pub max_in_flight: u32,
    /// Keep each client between passes, per access-Secret version.
    pub keep_connections: bool,
}

/// The SKR client of one pass and its request bounds.
pub(super) struct Skr {
    /// The client.
    pub client: Client,
    /// client-go's per-client QPS limit; kept per Kyma across client rebuilds.
    pub limiter: Option<Arc<TokenBucket>>,
    /// The bound of concurrent requests (per pass: one pass per Kyma runs at a time).
    pub in_flight: Option<Semaphore>,
}

/// Builds (or reuses) the SKR client of each pass.
pub(super) struct SkrClients {
    settings: SkrSettings,
    /// The access Secrets in the KCP.
    secrets: Store<Secret>,
    /// Cached clients by Kyma key and Secret version (`--skr-keep-connections`).
    clients: Mutex<HashMap<String, (String, Client)>>,
    /// Token buckets by Kyma key.
    limiters: Mutex<HashMap<String, Arc<TokenBucket>>>,
}

impl SkrClients {
    /// No client yet; Secrets are read from `secrets`.
    pub fn new(settings: SkrSettings, secrets: Store<Secret>) -> SkrClients {
        SkrClients { settings, secrets, clients: Mutex::new(HashMap::new()), limiters: Mutex::new(HashMap::new()) }
    }

    /// The access Secrets' store.
    pub fn secrets(&self) -> &Store<Secret> {
        &self.secrets
    }

    /// The SKR client of `kyma`: built per pass, or once per access-Secret version with
    /// `--skr-keep-connections`.
    pub async fn client_for(&self, kyma: &Kyma) -> Result<Skr, PassError> {
        let name = kyma.name_any();
        let namespace = kyma.namespace().unwrap_or_default();
        let secret = self.access_secret(&name, &namespace)?;
        let version = format!(
            "{}/{}",
            secret.metadata.uid.as_deref().unwrap_or_default(),
            secret.metadata.resource_version.as_deref().unwrap_or_default()
        );
        let key = format!("{namespace}/{name}");
        let limiter = (self.settings.qps > 0.0).then(|| {
            let (qps, burst) = (self.settings.qps, self.settings.burst);
            lock(&self.limiters).entry(key.clone()).or_insert_with(|| Arc::new(TokenBucket::new(qps, burst))).clone()
        });
        let in_flight = usize::try_from(self.settings.max_in_flight)
            .ok()
            .filter(|n| *n > 0)
            .map(|n| Semaphore::new(n.min(Semaphore::MAX_PERMITS)));
        let cached = lock(&self.clients).get(&key).filter(|(v, _)| *v == version).map(|(_, c)| c.clone());
        let client = match cached {
            Some(client) => client,
            None => {
                let access = SkrAccess::from_secret(&secret, &self.settings.access).map_err(PassError::Access)?;
                let client = access.client().await.map_err(PassError::Access)?.kube().clone();
                if self.settings.keep_connections {
                    lock(&self.clients).insert(key, (version.clone(), client.clone()));
                }
                client
            }
        };
        Ok(Skr { client, limiter, in_flight })
    }

    /// KLM's lookup: the one Secret in the Kyma's namespace labelled with the Kyma's name.
    fn access_secret(&self, kyma: &str, namespace: &str) -> Result<Arc<Secret>, PassError> {
        let candidates: Vec<Arc<Secret>> = self
            .secrets
            .state()
            .into_iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.metadata.labels.as_ref().and_then(|l| l.get(KYMA_NAME_LABEL)).map(String::as_str) == Some(kyma)
            })
            .collect();
        let metas: Vec<PartialObjectMeta<Secret>> = candidates
            .iter()
            .map(|s| PartialObjectMeta {
                types: None,
                metadata: s.metadata.clone(),
                _phantom: std::marker::PhantomData,
            })
            .collect();
        let found = find_access_secret(&metas, kyma, namespace).map_err(PassError::Access)?;
        let index = metas.iter().position(|m| std::ptr::eq(m, found)).unwrap_or_default();
        candidates.get(index).cloned().ok_or(PassError::Access(catalogsync::error::SyncError::AccessSecretMissing {
            kyma: kyma.to_owned(),
            namespace: namespace.to_owned(),
        }))
    }
}

/// client-go's token bucket (`flowcontrol.NewTokenBucketRateLimiter`): `qps` refill, `burst`
/// capacity, waiting callers reserve a token ahead (as `rate.Limiter.Wait` does).
pub(super) struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Tokens (negative: reserved ahead) and when they were last refilled.
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    fn new(qps: f64, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps, burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let wait = {
            let mut state = lock(&self.state);
            let now = Instant::now();
            let (tokens, last) = *state;
            let refilled =
                (tokens + now.saturating_duration_since(last).as_secs_f64() * self.qps).min(self.burst) - 1.0;
            *state = (refilled, now);
            if refilled < 0.0 { Duration::from_secs_f64(-refilled / self.qps) } else { Duration::ZERO }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}
