//! Finds a Kyma's access Secret and turns its kubeconfig into a client (spec section 1: the
//! Secret in the Kyma's namespace labelled `operator.kyma-project.io/kyma-name=<kyma>`, data
//! key `config`; zero or several such Secrets are an error for that Kyma only).

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::config::{KubeConfigOptions, Kubeconfig};

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

/// Builds an SKR client from the `config` key of an access Secret.
///
/// # Errors
/// [`Error::AccessSecretInvalid`] when the key is missing, is not a kubeconfig, or names no
/// usable cluster and credentials.
pub async fn client_from_secret(secret: &Secret, timeouts: &AccessTimeouts) -> Result<Client> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let invalid = |reason: String| Error::AccessSecretInvalid { name: name.clone(), reason };
    let bytes =
        secret.data.as_ref().and_then(|d| d.get(KUBECONFIG_KEY)).ok_or_else(|| invalid("the key is missing".into()))?;
    let text = std::str::from_utf8(&bytes.0).map_err(|_| invalid("the kubeconfig is not UTF-8".into()))?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| invalid(format!("the kubeconfig does not parse: {e}")))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(format!("the kubeconfig is not usable: {e}")))?;
    if let Ok(agent) = http::HeaderValue::from_str(&timeouts.user_agent) {
        config.headers.push((http::header::USER_AGENT, agent));
    }
    build_client(&config, timeouts.connect).map_err(|e| invalid(format!("no client can be built from it: {e}")))
}

/// How long an idle connection to an SKR is kept. A replica syncs an SKR about once per
/// resync period (minutes), so a connection kept much longer than a burst of syncs is only
/// memory (its TLS and read buffers); 30 s keeps it for the syncs of one catalog release.
pub const SKR_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds an SKR client: kube's stack (base URI, retries, credentials, headers) over a
/// connection pool that keeps at most one idle connection per SKR, for [`SKR_IDLE_TIMEOUT`].
/// kube's default client keeps every connection it opened (up to `--skr-concurrency` per SKR)
/// for 90 s: with one client per SKR and thousands of SKRs per replica, a catalog release
/// leaves thousands of idle TLS connections behind. Every request is bounded by the
/// executor's request timeout.
fn build_client(config: &kube::Config, connect_timeout: Duration) -> std::result::Result<Client, kube::Error> {
    use kube::client::ConfigExt as _;
    use tower::ServiceBuilder;

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    let https = config.rustls_https_connector_with_connector(http)?;
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

    #[tokio::test]
    async fn malformed_kubeconfig_is_invalid_not_a_crash() {
        let timeouts = &AccessTimeouts {
            user_agent: "catalogsync/test".into(),
            connect: Duration::from_secs(1),
            request: Duration::from_secs(1),
        };
        let mut s =
            Secret { metadata: ObjectMeta { name: Some("s".into()), ..ObjectMeta::default() }, ..Secret::default() };
        assert!(matches!(client_from_secret(&s, timeouts).await, Err(Error::AccessSecretInvalid { .. })));
        s.data = Some([(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(b"{not: [yaml".to_vec()))].into());
        assert!(matches!(client_from_secret(&s, timeouts).await, Err(Error::AccessSecretInvalid { .. })));
        s.data = Some(
            [(KUBECONFIG_KEY.to_owned(), k8s_openapi::ByteString(b"apiVersion: v1\nkind: Config\n".to_vec()))].into(),
        );
        assert!(matches!(client_from_secret(&s, timeouts).await, Err(Error::AccessSecretInvalid { .. })));
    }
}
