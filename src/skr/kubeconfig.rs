//! The one boundary where an access Secret's kubeconfig enters catalogsync (pure).
//!
//! An access Secret is untrusted input: whoever can write one in the KCP namespace must not be
//! able to make a replica read a local file, run a command, send its credentials elsewhere or
//! print the Secret's content. So a kubeconfig is not handed to kube's loader (which reads
//! files, runs exec plugins and auth providers); it is parsed here, field by field, against an
//! allowlist, into a [`SkrKubeconfig`] that holds only what catalogsync uses:
//!
//! | where | accepted | rejected, naming the field |
//! | --- | --- | --- |
//! | cluster | `server` (`https://` only), `certificate-authority-data` (or none: the system roots), `tls-server-name`, `disable-compression`, `extensions` | `certificate-authority` (a file), `insecure-skip-tls-verify: true` (unless `--allow-insecure-skr-tls`), `proxy-url`, `http://` servers, anything else |
//! | user | `token`, or `client-certificate-data` with `client-key-data`; `extensions` | `exec`, `auth-provider`, `tokenFile`, `client-certificate`, `client-key` (files), `username`/`password`, `as*` (impersonation), anything else |
//! | context | `cluster`, `user`, `namespace`, `extensions` | anything else |
//!
//! Every entry of `clusters` and `users` is checked, used or not. The context is
//! `current-context`, else the only context, else (no contexts) the only cluster and user.
//!
//! A [`KubeconfigProblem`] names the offending field by its path (`users[0].user.exec`) and
//! never quotes a value, a name or a line of the Secret: its text goes into Kyma conditions,
//! Events and logs, which are read far more widely than Secrets.

use std::net::IpAddr;

use base64::Engine as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Map, Value};

/// Why a kubeconfig is not accepted. The text names fields by path and quotes nothing from
/// the Secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigProblem {
    /// The Secret has no `config` data key.
    #[error("the secret has no data key \"config\"")]
    MissingKey,
    /// The kubeconfig is not UTF-8.
    #[error("the kubeconfig is not UTF-8 text")]
    NotUtf8,
    /// The kubeconfig does not parse as YAML (or JSON).
    #[error("the kubeconfig is not valid YAML{}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    NotYaml {
        /// Line of the error, when the parser knows it.
        line: Option<u64>,
    },
    /// A required field is missing.
    #[error("{field} is missing")]
    Missing {
        /// Path of the field.
        field: String,
    },
    /// A field has the wrong type.
    #[error("{field} must be {expected}")]
    WrongType {
        /// Path of the field.
        field: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A field catalogsync refuses on principle.
    #[error("{field} is not allowed: {why}")]
    Forbidden {
        /// Path of the field.
        field: String,
        /// Why, and what to use instead.
        why: &'static str,
    },
    /// A field catalogsync does not know. Its name is not quoted: it comes from the Secret.
    #[error("{parent} has a field that is not allowed (allowed: {allowed})")]
    UnknownField {
        /// Path of the object holding it.
        parent: String,
        /// The fields allowed there.
        allowed: &'static str,
    },
    /// A field's value is not usable.
    #[error("{field} is not valid: {why}")]
    Invalid {
        /// Path of the field.
        field: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The kubeconfig does not say which cluster and user to use.
    #[error("the kubeconfig names no context to use: {why}")]
    NoContext {
        /// Why not.
        why: &'static str,
    },
    /// The server is, or resolves to, an address that `--skr-allowed-destinations` does not
    /// allow.
    #[error("{field} {is_or_resolves} {refusal}, which --skr-allowed-destinations does not allow")]
    Destination {
        /// Path of the server field.
        field: String,
        /// "is" for an IP address, "resolves to" for a name.
        is_or_resolves: &'static str,
        /// What kind of address it is.
        refusal: super::destination::Refusal,
    },
    /// A TLS client configuration cannot be built from the accepted data.
    #[error("no TLS client configuration can be built from the certificate data")]
    Tls,
}

/// The host of an SKR server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerHost {
    /// An IP address literal.
    Ip(IpAddr),
    /// A DNS name (lower-case, no trailing dot).
    Name(String),
}

/// How catalogsync authenticates to an SKR.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A bearer token.
    Token(String),
    /// A client certificate and key, as the base64 of their PEM (as in the kubeconfig).
    Certificate {
        /// base64 of the certificate PEM.
        certificate: String,
        /// base64 of the key PEM.
        key: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Token(_) => f.write_str("Token(<redacted>)"),
            Credentials::Certificate { .. } => f.write_str("Certificate(<redacted>)"),
        }
    }
}

/// An accepted SKR kubeconfig: what catalogsync uses of it, and nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkrKubeconfig {
    /// The server URL (`https://`).
    pub server: http::Uri,
    /// Path of the server field, for messages (`clusters[0].cluster.server`).
    pub server_field: String,
    /// Host of the server.
    pub host: ServerHost,
    /// Port of the server (443 when the URL names none).
    pub port: u16,
    /// Trust anchors (DER), or `None` for the system roots.
    pub roots: Option<Vec<Vec<u8>>>,
    /// Name to verify the server certificate against instead of the host.
    pub tls_server_name: Option<String>,
    /// Whether the server certificate is not verified (only with `--allow-insecure-skr-tls`).
    pub insecure: bool,
    /// Credentials.
    pub credentials: Credentials,
}

/// Whether a kubeconfig may switch TLS verification off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InsecureTls {
    /// `insecure-skip-tls-verify: true` is rejected (the default).
    #[default]
    Refuse,
    /// It is accepted: `--allow-insecure-skr-tls`, for local development only.
    Allow,
}

const TOP_FIELDS: &[&str] =
    &["apiVersion", "kind", "clusters", "users", "contexts", "current-context", "preferences", "extensions"];
const CLUSTER_FIELDS: &[&str] = &[
    "server",
    "certificate-authority-data",
    "tls-server-name",
    "disable-compression",
    "extensions",
    "insecure-skip-tls-verify",
];
const CLUSTER_ALLOWED: &str = "server, certificate-authority-data, tls-server-name, disable-compression, extensions";
const USER_FIELDS: &[&str] = &["token", "client-certificate-data", "client-key-data", "extensions"];
const USER_ALLOWED: &str = "token, client-certificate-data, client-key-data, extensions";
const CONTEXT_FIELDS: &[&str] = &["cluster", "user", "namespace", "extensions"];
const CONTEXT_ALLOWED: &str = "cluster, user, namespace, extensions";
const TOP_ALLOWED: &str = "apiVersion, kind, clusters, users, contexts, current-context, preferences, extensions";

/// Fields refused on principle, with the reason given.
const FORBIDDEN: &[(&str, &str)] = &[
    ("exec", "exec credential plugins are never run; use token or client-certificate-data"),
    ("auth-provider", "auth providers are not supported; use token or client-certificate-data"),
    ("tokenFile", "files are never read; put the token inline as token"),
    ("client-certificate", "files are never read; use client-certificate-data"),
    ("client-key", "files are never read; use client-key-data"),
    ("certificate-authority", "files are never read; use certificate-authority-data"),
    ("username", "basic authentication is not supported; use token or client-certificate-data"),
    ("password", "basic authentication is not supported; use token or client-certificate-data"),
    ("proxy-url", "proxies are not supported"),
    ("as", "impersonation is not supported"),
    ("as-uid", "impersonation is not supported"),
    ("as-groups", "impersonation is not supported"),
    ("as-user-extra", "impersonation is not supported"),
];

/// Longest accepted token: real ServiceAccount and OIDC tokens are a few KB.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Parses and checks a kubeconfig.
///
/// # Errors
/// The first [`KubeconfigProblem`] found.
pub fn parse(bytes: &[u8], insecure: InsecureTls) -> Result<SkrKubeconfig, KubeconfigProblem> {
    let text = std::str::from_utf8(bytes).map_err(|_| KubeconfigProblem::NotUtf8)?;
    // The parser's own error text quotes the lines around the error: only its line number
    // is kept. serde-saphyr bounds alias expansion, nesting and node counts by default, and
    // is built without `!include` support.
    let doc: Value = serde_saphyr::from_str(text)
        .map_err(|e| KubeconfigProblem::NotYaml { line: e.location().map(|l| l.line()) })?;
    let top = as_object(&doc, "the kubeconfig")?;
    check_fields(top, "kubeconfig", TOP_FIELDS, TOP_ALLOWED)?;

    let clusters = named_entries(top, "clusters", "cluster")?;
    let users = named_entries(top, "users", "user")?;
    let contexts = named_entries(top, "contexts", "context")?;
    for (i, (_, cluster)) in clusters.iter().enumerate() {
        check_cluster(cluster, &format!("clusters[{i}].cluster"), insecure)?;
    }
    for (i, (_, user)) in users.iter().enumerate() {
        check_user(user, &format!("users[{i}].user"))?;
    }
    for (i, (_, context)) in contexts.iter().enumerate() {
        check_fields(context, &format!("contexts[{i}].context"), CONTEXT_FIELDS, CONTEXT_ALLOWED)?;
    }

    let (cluster, user) = select(top, &clusters, &users, &contexts)?;
    let (path, cluster) = (format!("clusters[{cluster}].cluster"), clusters[cluster].1);
    let credentials = credentials(users[user].1, &format!("users[{user}].user"))?;
    server(cluster, &path, insecure, credentials)
}

fn as_object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, KubeconfigProblem> {
    value.as_object().ok_or_else(|| KubeconfigProblem::WrongType { field: field.to_owned(), expected: "a mapping" })
}

fn optional_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    parent: &str,
) -> Result<Option<&'a str>, KubeconfigProblem> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(KubeconfigProblem::WrongType { field: format!("{parent}.{key}"), expected: "a string" }),
    }
}

/// Refuses forbidden and unknown fields of `obj`.
fn check_fields(
    obj: &Map<String, Value>,
    path: &str,
    known: &[&str],
    allowed: &'static str,
) -> Result<(), KubeconfigProblem> {
    for key in obj.keys() {
        if let Some((name, why)) = FORBIDDEN.iter().find(|(name, _)| name == key) {
            return Err(KubeconfigProblem::Forbidden { field: format!("{path}.{name}"), why });
        }
        if !known.contains(&key.as_str()) {
            return Err(KubeconfigProblem::UnknownField { parent: path.to_owned(), allowed });
        }
    }
    Ok(())
}

/// A named entry of `clusters`, `users` or `contexts`: its name and its object.
type Entry<'a> = (&'a str, &'a Map<String, Value>);

/// The `(name, object)` entries of a list such as `clusters` (`- name: x\n  cluster: {..}`).
fn named_entries<'a>(
    top: &'a Map<String, Value>,
    list: &'static str,
    inner: &'static str,
) -> Result<Vec<Entry<'a>>, KubeconfigProblem> {
    let items = match top.get(list) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(KubeconfigProblem::WrongType { field: list.to_owned(), expected: "a list" }),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let path = format!("{list}[{i}]");
            let item = as_object(item, &path)?;
            for key in item.keys() {
                if key != "name" && key != inner {
                    return Err(KubeconfigProblem::UnknownField {
                        parent: path,
                        allowed: if inner == "cluster" {
                            "name, cluster"
                        } else if inner == "user" {
                            "name, user"
                        } else {
                            "name, context"
                        },
                    });
                }
            }
            let name = optional_str(item, "name", &path)?
                .ok_or_else(|| KubeconfigProblem::Missing { field: format!("{path}.name") })?;
            let field = format!("{path}.{inner}");
            let body = item.get(inner).ok_or_else(|| KubeconfigProblem::Missing { field: field.clone() })?;
            Ok((name, as_object(body, &field)?))
        })
        .collect()
}

fn check_cluster(cluster: &Map<String, Value>, path: &str, insecure: InsecureTls) -> Result<(), KubeconfigProblem> {
    check_fields(cluster, path, CLUSTER_FIELDS, CLUSTER_ALLOWED)?;
    match cluster.get("insecure-skip-tls-verify") {
        None | Some(Value::Null | Value::Bool(false)) => {}
        Some(Value::Bool(true)) if insecure == InsecureTls::Allow => {}
        Some(Value::Bool(true)) => {
            return Err(KubeconfigProblem::Forbidden {
                field: format!("{path}.insecure-skip-tls-verify"),
                why: "TLS verification is never switched off; give certificate-authority-data",
            });
        }
        Some(_) => {
            return Err(KubeconfigProblem::WrongType {
                field: format!("{path}.insecure-skip-tls-verify"),
                expected: "a boolean",
            });
        }
    }
    let server = optional_str(cluster, "server", path)?
        .ok_or_else(|| KubeconfigProblem::Missing { field: format!("{path}.server") })?;
    server_uri(server, &format!("{path}.server"))?;
    if let Some(ca) = optional_str(cluster, "certificate-authority-data", path)? {
        certificates(ca, &format!("{path}.certificate-authority-data"))?;
    }
    if let Some(name) = optional_str(cluster, "tls-server-name", path)? {
        rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|_| KubeconfigProblem::Invalid {
            field: format!("{path}.tls-server-name"),
            why: "not a DNS name or IP address",
        })?;
    }
    Ok(())
}

fn check_user(user: &Map<String, Value>, path: &str) -> Result<(), KubeconfigProblem> {
    check_fields(user, path, USER_FIELDS, USER_ALLOWED)?;
    credentials(user, path).map(|_| ())
}

fn credentials(user: &Map<String, Value>, path: &str) -> Result<Credentials, KubeconfigProblem> {
    let token = optional_str(user, "token", path)?;
    let certificate = optional_str(user, "client-certificate-data", path)?;
    let key = optional_str(user, "client-key-data", path)?;
    match (token, certificate, key) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(KubeconfigProblem::Invalid {
            field: path.to_owned(),
            why: "holds both a token and a client certificate; keep one",
        }),
        (Some(token), None, None) => {
            let field = format!("{path}.token");
            if token.is_empty() {
                return Err(KubeconfigProblem::Invalid { field, why: "empty" });
            }
            if token.len() > MAX_TOKEN_BYTES {
                return Err(KubeconfigProblem::Invalid { field, why: "longer than 16 KiB" });
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(KubeconfigProblem::Invalid { field, why: "not printable ASCII without spaces" });
            }
            Ok(Credentials::Token(token.to_owned()))
        }
        (None, Some(certificate), Some(key)) => {
            let cert_field = format!("{path}.client-certificate-data");
            if certificates(certificate, &cert_field)?.is_empty() {
                return Err(KubeconfigProblem::Invalid { field: cert_field, why: "holds no PEM certificate" });
            }
            let key_field = format!("{path}.client-key-data");
            let pem = base64_decode(key, &key_field)?;
            PrivateKeyDer::from_pem_slice(&pem)
                .map_err(|_| KubeconfigProblem::Invalid { field: key_field, why: "holds no PEM private key" })?;
            Ok(Credentials::Certificate { certificate: certificate.to_owned(), key: key.to_owned() })
        }
        (None, Some(_), None) => Err(KubeconfigProblem::Missing { field: format!("{path}.client-key-data") }),
        (None, None, Some(_)) => Err(KubeconfigProblem::Missing { field: format!("{path}.client-certificate-data") }),
        (None, None, None) => Err(KubeconfigProblem::Missing {
            field: format!("{path}.token (or client-certificate-data and client-key-data)"),
        }),
    }
}

fn base64_decode(data: &str, field: &str) -> Result<Vec<u8>, KubeconfigProblem> {
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|_| KubeconfigProblem::Invalid { field: field.to_owned(), why: "not base64" })
}

/// The DER certificates of a base64 PEM bundle.
fn certificates(data: &str, field: &str) -> Result<Vec<Vec<u8>>, KubeconfigProblem> {
    let pem = base64_decode(data, field)?;
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&pem)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|_| KubeconfigProblem::Invalid { field: field.to_owned(), why: "not PEM certificates" })?;
    if certs.is_empty() {
        return Err(KubeconfigProblem::Invalid { field: field.to_owned(), why: "holds no PEM certificate" });
    }
    Ok(certs)
}

/// The indices of the cluster and user to use.
fn select(
    top: &Map<String, Value>,
    clusters: &[Entry<'_>],
    users: &[Entry<'_>],
    contexts: &[Entry<'_>],
) -> Result<(usize, usize), KubeconfigProblem> {
    let current = optional_str(top, "current-context", "kubeconfig")?.filter(|c| !c.is_empty());
    let context = match (current, contexts) {
        (Some(name), _) => Some(
            contexts
                .iter()
                .position(|(n, _)| *n == name)
                .ok_or(KubeconfigProblem::NoContext { why: "current-context names no entry of contexts" })?,
        ),
        (None, [_]) => Some(0),
        (None, []) => None,
        (None, _) => return Err(KubeconfigProblem::NoContext { why: "several contexts and no current-context" }),
    };
    let Some(context) = context else {
        return match (clusters, users) {
            ([_], [_]) => Ok((0, 0)),
            _ => Err(KubeconfigProblem::NoContext { why: "no contexts, and not exactly one cluster and one user" }),
        };
    };
    let (_, ctx) = contexts[context];
    let path = format!("contexts[{context}].context");
    let pick = |key: &str, names: &[Entry<'_>], why| {
        let wanted = optional_str(ctx, key, &path)?
            .ok_or_else(|| KubeconfigProblem::Missing { field: format!("{path}.{key}") })?;
        names
            .iter()
            .position(|(n, _)| *n == wanted)
            .ok_or_else(|| KubeconfigProblem::Invalid { field: format!("{path}.{key}"), why })
    };
    Ok((pick("cluster", clusters, "names no entry of clusters")?, pick("user", users, "names no entry of users")?))
}

/// Parses a server URL: `https://host[:port][/path]`, no user info.
fn server_uri(server: &str, field: &str) -> Result<(http::Uri, ServerHost, u16), KubeconfigProblem> {
    let invalid = |why| KubeconfigProblem::Invalid { field: field.to_owned(), why };
    let uri: http::Uri = server.parse().map_err(|_| invalid("not a URL"))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") => {
            return Err(KubeconfigProblem::Forbidden {
                field: field.to_owned(),
                why: "plain http:// is never used; the server must be https://",
            });
        }
        _ => return Err(invalid("not an https:// URL")),
    }
    let authority = uri.authority().ok_or_else(|| invalid("names no host"))?;
    if authority.as_str().contains('@') {
        return Err(KubeconfigProblem::Forbidden {
            field: field.to_owned(),
            why: "credentials in the URL are not supported",
        });
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid("names no host"));
    }
    let host = match host.parse::<IpAddr>() {
        Ok(ip) => ServerHost::Ip(ip),
        Err(_) => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            rustls::pki_types::DnsName::try_from(name.clone()).map_err(|_| invalid("the host is not a DNS name"))?;
            ServerHost::Name(name)
        }
    };
    Ok((uri.clone(), host, uri.port_u16().unwrap_or(443)))
}

fn server(
    cluster: &Map<String, Value>,
    path: &str,
    insecure: InsecureTls,
    credentials: Credentials,
) -> Result<SkrKubeconfig, KubeconfigProblem> {
    let server_field = format!("{path}.server");
    let server = optional_str(cluster, "server", path)?
        .ok_or_else(|| KubeconfigProblem::Missing { field: server_field.clone() })?;
    let (server, host, port) = server_uri(server, &server_field)?;
    let roots = optional_str(cluster, "certificate-authority-data", path)?
        .map(|ca| certificates(ca, &format!("{path}.certificate-authority-data")))
        .transpose()?;
    let tls_server_name = optional_str(cluster, "tls-server-name", path)?.map(str::to_owned);
    let skip_verify = cluster.get("insecure-skip-tls-verify").and_then(Value::as_bool).unwrap_or(false);
    Ok(SkrKubeconfig {
        server,
        server_field,
        host,
        port,
        roots,
        tls_server_name,
        insecure: skip_verify && insecure == InsecureTls::Allow,
        credentials,
    })
}

#[cfg(test)]
mod tests;
