//! Certificates and keys of one test control plane, generated with rcgen: a CA, the
//! apiserver's serving certificate, client certificates (the Kubernetes x509 authenticator
//! reads the user from CN and the groups from O) and a service-account signing key.
//!
//! All keys are ECDSA P-256 (rcgen's default); kube-apiserver accepts them for serving,
//! client authentication and service-account token signing alike.

use anyhow::{Context as _, Result, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Group every authenticated user has: kube-apiserver adds it itself, so client
/// certificates need not (and [`Pki::issue_client`] does not) carry it.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The PKCS#8 private key, PEM.
    pub key_pem: String,
}

/// The PKI of one control plane.
pub struct Pki {
    ca: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The CA certificate, DER (what `kube::Config::root_cert` takes).
    pub ca_der: Vec<u8>,
    /// Serving certificate for `127.0.0.1`, `localhost` and any extra SANs asked for.
    pub serving: CertKey,
    /// Client certificate of `admin` in group `system:masters`.
    pub admin: CertKey,
    /// Service-account token signing key (PKCS#8 PEM), for `--service-account-signing-key-file`.
    pub sa_private_pem: String,
    /// Its public key (PKIX PEM), for `--service-account-key-file`.
    pub sa_public_pem: String,
}

impl Pki {
    /// Generates a fresh CA and the certificates signed by it. `name` goes into the CA's CN.
    ///
    /// # Errors
    /// Fails only if rcgen fails to generate a key or sign a certificate.
    pub fn generate(name: &str) -> Result<Self> {
        Self::generate_with_sans(name, &[])
    }

    /// [`Pki::generate`] with `extra_sans` on the serving certificate besides `127.0.0.1` and
    /// `localhost` (addresses a test node's pods reach the apiserver on).
    ///
    /// # Errors
    /// Fails if rcgen fails to generate a key or sign a certificate, or a SAN is invalid.
    pub fn generate_with_sans(name: &str, extra_sans: &[String]) -> Result<Self> {
        let ca_key = KeyPair::generate().context("failed to generate the CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("catalogsync-test-ca-{name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = params.self_signed(&ca_key).context("failed to self-sign the CA")?;
        let ca = Issuer::new(params, ca_key);

        let sa = KeyPair::generate().context("failed to generate the service-account key")?;
        let empty = CertKey { cert_pem: String::new(), key_pem: String::new() };
        let mut pki = Self {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().to_vec(),
            ca,
            serving: empty.clone(),
            admin: empty,
            sa_private_pem: sa.serialize_pem(),
            sa_public_pem: sa.public_key_pem(),
        };
        let mut sans = vec!["127.0.0.1", "localhost"];
        sans.extend(extra_sans.iter().map(String::as_str));
        pki.serving = pki.issue_serving(&sans)?;
        pki.admin = pki.issue_client("admin", &["system:masters"])?;
        Ok(pki)
    }

    /// Issues a serving certificate (CN `kube-apiserver`) for `names`: IP addresses (such as
    /// `127.0.0.2`) become IP SANs, anything else DNS SANs.
    ///
    /// # Errors
    /// Fails when a name is not a valid SAN or rcgen fails to sign.
    pub fn issue_serving(&self, names: &[&str]) -> Result<CertKey> {
        let key = KeyPair::generate().context("failed to generate the serving key")?;
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .context("failed to build the serving certificate parameters")?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.ca).context("failed to sign the serving certificate")?;
        Ok(CertKey { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Issues a client certificate for `user` (CN) in `groups` (one O each).
    ///
    /// `system:authenticated` is skipped: the apiserver adds it to every authenticated user.
    ///
    /// # Errors
    /// Fails when more than two other groups are given: rcgen keeps one value per attribute
    /// type, and the second O is smuggled in as a custom attribute with O's OID, so two is
    /// the limit. (ServiceAccount subjects in RBAC bindings match on the user name, so two
    /// groups cover every identity the tests need.)
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertKey> {
        let groups: Vec<&str> = groups.iter().copied().filter(|g| *g != AUTHENTICATED_GROUP).collect();
        if groups.len() > 2 {
            bail!("client certificates carry at most two groups besides {AUTHENTICATED_GROUP}, got {groups:?}");
        }
        let key = KeyPair::generate().context("failed to generate a client key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, user);
        if let Some(first) = groups.first() {
            params.distinguished_name.push(DnType::OrganizationName, *first);
        }
        if let Some(second) = groups.get(1) {
            // id-at-organizationName (2.5.4.10) again, under a different map key.
            params.distinguished_name.push(DnType::CustomDnType(vec![2, 5, 4, 10]), *second);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.ca)
            .with_context(|| format!("failed to sign the client certificate of {user}"))?;
        Ok(CertKey { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// Standard base64 with padding (kubeconfig `*-data` fields), to avoid a dependency for
/// twenty lines.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
