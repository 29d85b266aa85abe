//! `catalogsync explain <kyma>`: why one Kyma's SKR gets the catalog entries it gets, read from
//! the KCP, and with `--skr` what that SKR holds against it (docs/explain.md).
//!
//! ```text
//!  KCP: the Kyma's labels, the catalog ──Snapshot──▶ catalog::explain ──▶ verdicts + DesiredSet
//!  KCP: the access Secret ──SkrConnector──▶ SkrAccess ──client()──▶ SkrTarget::observe
//!                                                                        │
//!                               DesiredSet + what the SKR holds ──Comparison::build──▶ buckets
//! ```
//!
//! Every verdict comes from [`crate::catalog::explain()`], the walk [`crate::catalog::desired_set`]
//! makes. The SKR is reached exactly as the controller reaches it: the access Secret found by
//! [`find_access_secret`], the kubeconfig allowlist, `--skr-allowed-destinations` (never the
//! KCP apiserver), answers bounded in size and time; and it is only read. Nothing of the Secret
//! is printed: an SKR failure is reported as the controller's condition would report it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DynamicObject, ListParams, PartialObjectMeta};
use kube::{Api, Client};
use serde::Serialize;

use crate::api::{KYMA_NAME_LABEL, Kyma, SKIP_RECONCILIATION_LABEL, is_flag_on};
use crate::catalog::selector::{is_dns_subdomain, is_label_value};
use crate::catalog::{CatalogKind, Comparison, Explanation, KindComparison, Snapshot};
use crate::config::{ExplainArgs, OutputFormat};
use crate::error::SyncError;
use crate::skr::access::{AccessSettings, kcp_addresses};
use crate::skr::kubeconfig::InsecureTls;
use crate::skr::{SecretRef, SkrConnector, find_access_secret};
use crate::sync::executor::SkrTarget;

/// Catalog objects read per KCP list request: ModuleTemplates carry descriptors of tens of KB,
/// so a page stays within a few MB.
const CATALOG_PAGE: u32 = 100;

/// Longest SKR object name printed: an SKR is hostile, and a real object name is at most 253
/// characters.
const SKR_NAME_CHARS: usize = 253;

/// Exit status when the KCP part was printed but the SKR could not be read.
pub const EXIT_SKR_FAILED: u8 = 3;

/// Why `explain` could not explain the Kyma at all (nothing is printed then).
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// No KCP configuration was found (in-cluster, `KUBECONFIG`, `~/.kube/config`).
    #[error("failed to load the KCP configuration")]
    KcpConfig(#[source] kube::config::InferConfigError),
    /// No KCP client could be built from the configuration.
    #[error("failed to create the KCP client")]
    KcpClient(#[source] kube::Error),
    /// Reading the Kyma failed.
    #[error("failed to read kyma {name} in namespace {namespace}")]
    ReadKyma {
        /// The Kyma.
        name: String,
        /// `--kcp-namespace`.
        namespace: String,
        /// The KCP's answer.
        #[source]
        source: kube::Error,
    },
    /// The Kyma does not exist.
    #[error("kyma {name} does not exist in namespace {namespace} (--kcp-namespace)")]
    KymaNotFound {
        /// The Kyma.
        name: String,
        /// `--kcp-namespace`.
        namespace: String,
    },
    /// Listing a catalog kind failed.
    #[error("failed to list {}s in namespace {namespace}", kind.as_str())]
    ListCatalog {
        /// The kind.
        kind: CatalogKind,
        /// `--kcp-namespace`.
        namespace: String,
        /// The KCP's answer.
        #[source]
        source: kube::Error,
    },
}

/// What `explain` found: the KCP part always, the SKR part with `--skr`. Its JSON form is the
/// output of `-o json`, documented field by field in docs/explain.md.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The Kyma.
    pub kyma: KymaFacts,
    /// `--restricted-modules`.
    pub restricted_modules: BTreeSet<String>,
    /// Names of what the SKR should hold.
    pub desired: DesiredNames,
    /// The verdict on every catalog entry.
    #[serde(flatten)]
    pub explanation: Explanation,
    /// What the SKR holds against the desired catalog; `None` without `--skr`.
    pub skr: Option<SkrReport>,
}

/// What of the Kyma the filter reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KymaFacts {
    /// Its name.
    pub name: String,
    /// Its namespace (`--kcp-namespace`).
    pub namespace: String,
    /// Whether it may see beta versions.
    pub beta: bool,
    /// Whether it may see internal versions.
    pub internal: bool,
    /// Why the controller leaves it alone, if it does (R5.7): `deleting` or
    /// `skip_reconciliation`. Its SKR is then not synced at all.
    pub left_alone: Option<&'static str>,
}

/// Names of the desired objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DesiredNames {
    /// ModuleReleaseMetas.
    pub module_release_metas: Vec<String>,
    /// ModuleTemplates.
    pub module_templates: Vec<String>,
}

/// What the SKR holds, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkrReport {
    /// `--sync-namespace`, where the copies are.
    pub sync_namespace: String,
    /// Name of the access Secret, once found.
    pub access_secret: Option<String>,
    /// Whether the SKR holds exactly the desired catalog (user-owned objects aside); `None`
    /// when it could not be read.
    pub agrees: Option<bool>,
    /// ModuleTemplates by bucket; `None` when the SKR could not be read.
    pub module_templates: Option<KindBuckets>,
    /// ModuleReleaseMetas by bucket; `None` when the SKR could not be read.
    pub module_release_metas: Option<KindBuckets>,
    /// Why the SKR could not be read.
    pub error: Option<SkrFailure>,
}

/// One kind in the SKR, by bucket ([`KindComparison`]); names sorted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindBuckets {
    /// Desired and held as desired.
    pub in_agreement: Vec<String>,
    /// Desired, absent: a sync applies it.
    pub missing: Vec<String>,
    /// Desired, held with other content: a sync applies it.
    pub different: Vec<String>,
    /// Not desired, a managed copy: a sync prunes it.
    pub extra: Vec<String>,
    /// Not desired, not a managed copy: never touched.
    pub user_owned: Vec<String>,
}

impl KindBuckets {
    fn of(comparison: &KindComparison) -> Self {
        // Names come from the SKR: bounded and without control characters.
        let shown = |names: &[String]| names.iter().map(|n| crate::text::bounded(n, SKR_NAME_CHARS)).collect();
        Self {
            in_agreement: shown(&comparison.in_agreement),
            missing: shown(&comparison.missing),
            different: shown(&comparison.different),
            extra: shown(&comparison.extra),
            user_owned: shown(&comparison.user_owned),
        }
    }

    fn agrees(&self) -> bool {
        self.missing.is_empty() && self.different.is_empty() && self.extra.is_empty()
    }
}

/// Why the SKR could not be read: what the controller's `ModuleCatalog` condition would say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkrFailure {
    /// The condition reason (`AccessSecretMissing`, `AccessSecretInvalid`, `SkrUnreachable`,
    /// ...; docs/metrics.md lists them).
    pub reason: &'static str,
    /// The condition message: names the failed operation and its cause, never quotes the
    /// Secret, at most 1,024 characters.
    pub message: String,
}

impl Report {
    /// The report in `format`.
    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Json => {
                let mut json = serde_json::to_string_pretty(self).unwrap_or_default();
                json.push('\n');
                json
            }
            OutputFormat::Table => render_table(self),
        }
    }
}

/// Explains `args.kyma` from the KCP of the current kubeconfig and, with `--skr`, reads its SKR.
///
/// # Errors
/// An [`ExplainError`] when the KCP part cannot be computed. A failure to read the SKR is not
/// an error here: it is in [`SkrReport::error`].
pub async fn run(args: &ExplainArgs) -> Result<Report, ExplainError> {
    let config = kube::Config::infer().await.map_err(ExplainError::KcpConfig)?;
    let kcp_url = config.cluster_url.clone();
    let kcp = Client::try_from(config).map_err(ExplainError::KcpClient)?;
    let mut report = explain_kcp(&kcp, args).await?;
    if args.skr {
        let kcp_addrs = kcp_addresses(&kcp_url).await.unwrap_or_else(|| {
            tracing::warn!(
                "Failed to resolve the KCP apiserver's address; only --skr-allowed-destinations keeps SKRs off it"
            );
            Vec::new()
        });
        let settings = AccessSettings::from_flags(
            format!("catalogsync/{} (explain)", env!("CARGO_PKG_VERSION")),
            args.skr_access.skr_allowed_destinations.clone(),
            kcp_addrs,
            if args.skr_access.allow_insecure_skr_tls { InsecureTls::Allow } else { InsecureTls::Refuse },
            args.skr_access.skr_max_response_size,
            args.skr_access.skr_sync_budget,
        );
        report.skr = Some(read_skr(&kcp, args, settings, &report.explanation).await);
    }
    Ok(report)
}

/// The KCP part: the Kyma, the catalog, and the verdicts.
///
/// # Errors
/// As [`run`].
pub async fn explain_kcp(kcp: &Client, args: &ExplainArgs) -> Result<Report, ExplainError> {
    let namespace = &args.catalog.kcp_namespace;
    let kyma = read_kyma(kcp, namespace, &args.kyma, args.kcp_request_timeout).await?;
    let mts = list_catalog(kcp, namespace, CatalogKind::ModuleTemplate, args.kcp_request_timeout).await?;
    let mrms = list_catalog(kcp, namespace, CatalogKind::ModuleReleaseMeta, args.kcp_request_timeout).await?;
    let snapshot = Snapshot::build(&mts, &mrms, &args.catalog.sync_namespace);
    Ok(kcp_report(&kyma, namespace, &snapshot, args.catalog.restricted_set()))
}

/// The KCP part of the report on `kyma` (pure).
pub fn kcp_report(
    kyma: &PartialObjectMeta<Kyma>,
    namespace: &str,
    snapshot: &Snapshot,
    restricted_modules: BTreeSet<String>,
) -> Report {
    let labels = kyma.metadata.labels.clone().unwrap_or_default();
    let explanation = crate::catalog::explain(snapshot, &labels, &restricted_modules);
    Report {
        kyma: KymaFacts {
            name: kyma.metadata.name.clone().unwrap_or_default(),
            namespace: namespace.to_owned(),
            beta: explanation.beta,
            internal: explanation.internal,
            left_alone: left_alone(kyma),
        },
        restricted_modules,
        desired: DesiredNames {
            module_release_metas: explanation.desired.release_metas.keys().cloned().collect(),
            module_templates: explanation.desired.templates.keys().cloned().collect(),
        },
        explanation,
        skr: None,
    }
}

/// Why the controller leaves a Kyma alone (R5.7), as its reconciler decides: a deletion
/// timestamp first, then the skip-reconciliation label.
fn left_alone(kyma: &PartialObjectMeta<Kyma>) -> Option<&'static str> {
    if kyma.metadata.deletion_timestamp.is_some() {
        Some("deleting")
    } else if is_flag_on(kyma.metadata.labels.as_ref().and_then(|l| l.get(SKIP_RECONCILIATION_LABEL))) {
        Some("skip_reconciliation")
    } else {
        None
    }
}

/// The Kyma's metadata. Listed by name rather than read, because `list` is what the
/// controller's Role grants on Kymas.
async fn read_kyma(
    kcp: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<PartialObjectMeta<Kyma>, ExplainError> {
    let not_found = || ExplainError::KymaNotFound { name: name.to_owned(), namespace: namespace.to_owned() };
    // A name that is no object name names no Kyma (and must not reach a field selector).
    if !is_dns_subdomain(name) {
        return Err(not_found());
    }
    let api: Api<Kyma> = Api::namespaced(kcp.clone(), namespace);
    let lp = ListParams::default().fields(&format!("metadata.name={name}"));
    let list = crate::kcp::bounded(timeout, api.list_metadata(&lp)).await.map_err(|source| ExplainError::ReadKyma {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        source,
    })?;
    list.items.into_iter().find(|k| k.metadata.name.as_deref() == Some(name)).ok_or_else(not_found)
}

/// Every object of a catalog kind in `namespace`, page by page.
async fn list_catalog(
    kcp: &Client,
    namespace: &str,
    kind: CatalogKind,
    timeout: Duration,
) -> Result<Vec<DynamicObject>, ExplainError> {
    let api: Api<DynamicObject> = Api::namespaced_with(kcp.clone(), namespace, &kind.api_resource());
    let wrap = |source| ExplainError::ListCatalog { kind, namespace: namespace.to_owned(), source };
    let mut objects = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(CATALOG_PAGE);
        if let Some(token) = &token {
            lp = lp.continue_token(token);
        }
        let page = crate::kcp::bounded(timeout, api.list(&lp)).await.map_err(wrap)?;
        objects.extend(page.items.into_iter().map(|mut o| {
            o.metadata.managed_fields = None;
            o
        }));
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok(objects),
        }
    }
}

/// The SKR part: never fails, reports its failure instead.
async fn read_skr(kcp: &Client, args: &ExplainArgs, settings: AccessSettings, explanation: &Explanation) -> SkrReport {
    let mut report = SkrReport::new(&args.catalog.sync_namespace, None);
    match observe_skr(kcp, args, settings, &mut report.access_secret).await {
        Ok(observed) => report.compare(&Comparison::build(&explanation.desired, &observed)),
        Err(err) => report.fail(&err),
    }
    report
}

impl SkrReport {
    /// A report on the SKR behind `access_secret`, not read yet.
    pub fn new(sync_namespace: &str, access_secret: Option<String>) -> Self {
        Self {
            sync_namespace: sync_namespace.to_owned(),
            access_secret,
            agrees: None,
            module_templates: None,
            module_release_metas: None,
            error: None,
        }
    }

    /// Records what the SKR holds.
    pub fn compare(&mut self, comparison: &Comparison) {
        let (mts, mrms) = (KindBuckets::of(&comparison.templates), KindBuckets::of(&comparison.release_metas));
        self.agrees = Some(mts.agrees() && mrms.agrees());
        self.module_templates = Some(mts);
        self.module_release_metas = Some(mrms);
    }

    /// Records why the SKR could not be read, as the controller's condition would.
    pub fn fail(&mut self, err: &SyncError) {
        self.error = Some(SkrFailure { reason: err.reason().as_str(), message: err.condition_message() });
    }
}

/// Finds the access Secret, builds the SKR client as the controller does, and lists both kinds
/// in full. Records the Secret's name once found.
async fn observe_skr(
    kcp: &Client,
    args: &ExplainArgs,
    settings: AccessSettings,
    access_secret: &mut Option<String>,
) -> Result<BTreeMap<CatalogKind, Vec<crate::catalog::Observed>>, SyncError> {
    let namespace = &args.catalog.kcp_namespace;
    let secret = find_secret(kcp, namespace, &args.kyma, args.kcp_request_timeout).await?;
    access_secret.clone_from(&secret.metadata.name);
    let connector = SkrConnector::new(kcp.clone(), namespace.clone(), settings, args.kcp_request_timeout);
    let entry = connector.connect(&SecretRef::of(&secret)).await?;
    let client = entry.access.client().await?;
    // Counted into a registry of its own that nothing reads: explain is not the controller.
    let metrics = crate::metrics::SkrClientMetrics::register(&prometheus::Registry::new())
        .expect("a new registry holds no metric yet");
    let never_write = || false;
    let full_lists = tokio::sync::Semaphore::new(1);
    let applies = tokio::sync::Semaphore::new(1);
    let target = SkrTarget {
        client: &client,
        namespace: &args.catalog.sync_namespace,
        concurrency: 1,
        request_timeout: args.skr_request_timeout,
        metrics: &metrics,
        may_write: &never_write,
        full_lists: &full_lists,
        applies: &applies,
        trust_memory_for: Duration::ZERO,
    };
    tokio::time::timeout(args.sync_timeout, target.observe())
        .await
        .unwrap_or(Err(SyncError::SyncTimeout(args.sync_timeout)))
}

/// The one access Secret of `kyma`, picked by [`find_access_secret`] as the controller picks
/// it, from the metadata of the Secrets labelled with its name.
async fn find_secret(
    kcp: &Client,
    namespace: &str,
    kyma: &str,
    timeout: Duration,
) -> Result<PartialObjectMeta<Secret>, SyncError> {
    let selector = format!("{KYMA_NAME_LABEL}={kyma}");
    // A name that is no label value cannot be on any Secret's label.
    let secrets = if is_label_value(kyma) {
        let api: Api<Secret> = Api::namespaced(kcp.clone(), namespace);
        let lp = ListParams::default().labels(&selector);
        crate::kcp::bounded(timeout, api.list_metadata(&lp))
            .await
            .map_err(|source| SyncError::ReadAccessSecret {
                name: format!("labelled {selector}"),
                source: Box::new(source),
            })?
            .items
    } else {
        Vec::new()
    };
    find_access_secret(&secrets, kyma, namespace).cloned()
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// Writes `rows` under `headers`, columns padded to their widest cell (the last one not).
fn write_table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// The report as tables, for people.
fn render_table(report: &Report) -> String {
    let mut out = String::new();
    let e = &report.explanation;
    let k = &report.kyma;
    let _ = writeln!(out, "Kyma:        {}/{}", k.namespace, k.name);
    let _ = writeln!(out, "Flags:       beta {}, internal {}", yes_no(k.beta), yes_no(k.internal));
    let restricted: Vec<&str> = report.restricted_modules.iter().map(String::as_str).collect();
    let restricted = if restricted.is_empty() { "none".to_owned() } else { restricted.join(", ") };
    let _ = writeln!(out, "Restricted:  {restricted}");
    if let Some(reason) = k.left_alone {
        let _ = writeln!(out, "Note:        catalogsync leaves this Kyma alone ({reason}): its SKR is not synced");
    }
    let _ = writeln!(
        out,
        "Desired:     {} ModuleReleaseMetas, {} ModuleTemplates",
        report.desired.module_release_metas.len(),
        report.desired.module_templates.len()
    );

    let _ = writeln!(out, "\nMODULE RELEASE METAS");
    let rows: Vec<Vec<String>> = e
        .release_metas
        .iter()
        .map(|m| {
            let detail = match &m.detail {
                Some(detail) => detail.clone(),
                None => m
                    .channels
                    .iter()
                    .map(|c| match c.reason {
                        None => format!("{}={}", c.channel, c.version),
                        Some(cut) => format!("{}={} [cut: {}]", c.channel, c.version, cut.as_str()),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let reason = m.reason.map_or("", |r| r.as_str()).to_owned();
            vec![m.name.clone(), m.module.clone(), yes_no(m.desired).to_owned(), reason, detail]
        })
        .collect();
    write_table(&mut out, &["NAME", "MODULE", "DESIRED", "REASON", "CHANNELS / DETAIL"], &rows);

    let _ = writeln!(out, "\nMODULE TEMPLATES");
    let rows: Vec<Vec<String>> = e
        .templates
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.module.clone(),
                t.version.clone(),
                yes_no(t.desired).to_owned(),
                t.reason.map_or("", |r| r.as_str()).to_owned(),
                t.detail.clone().unwrap_or_default(),
            ]
        })
        .collect();
    write_table(&mut out, &["NAME", "MODULE", "VERSION", "DESIRED", "REASON", "DETAIL"], &rows);

    if !e.old_style_templates.is_empty() {
        let _ = writeln!(out, "\nOLD-STYLE MODULE TEMPLATES (no spec.moduleName, never synced)");
        for name in &e.old_style_templates {
            let _ = writeln!(out, "{name}");
        }
    }
    if !e.malformed.is_empty() {
        let _ = writeln!(out, "\nMALFORMED (left out of the catalog)");
        let rows: Vec<Vec<String>> =
            e.malformed.iter().map(|m| vec![m.kind.to_owned(), m.name.clone(), m.reason.clone()]).collect();
        write_table(&mut out, &["KIND", "NAME", "REASON"], &rows);
    }
    if let Some(skr) = &report.skr {
        render_skr(&mut out, skr, k.left_alone.is_some());
    }
    out
}

fn render_skr(out: &mut String, skr: &SkrReport, left_alone: bool) {
    let secret = skr.access_secret.as_deref().unwrap_or("<none>");
    let _ = writeln!(out, "\nSKR (namespace {}, access Secret {secret})", skr.sync_namespace);
    if let Some(error) = &skr.error {
        let _ = writeln!(out, "not read: {}: {}", error.reason, error.message);
        return;
    }
    let kinds = [
        (CatalogKind::ModuleTemplate.as_str(), skr.module_templates.as_ref()),
        (CatalogKind::ModuleReleaseMeta.as_str(), skr.module_release_metas.as_ref()),
    ];
    let rows: Vec<Vec<String>> = kinds
        .iter()
        .filter_map(|(kind, buckets)| Some((kind, (*buckets)?)))
        .map(|(kind, b)| {
            let count = |names: &Vec<String>| names.len().to_string();
            vec![
                (*kind).to_owned(),
                count(&b.in_agreement),
                count(&b.missing),
                count(&b.different),
                count(&b.extra),
                count(&b.user_owned),
            ]
        })
        .collect();
    write_table(out, &["KIND", "IN AGREEMENT", "MISSING", "DIFFERENT", "EXTRA", "USER-OWNED"], &rows);
    for (kind, buckets) in kinds {
        let Some(b) = buckets else { continue };
        for (bucket, names) in [
            ("missing (a sync applies it)", &b.missing),
            ("different (a sync applies it)", &b.different),
            ("extra (a sync prunes it)", &b.extra),
            ("user-owned (never touched)", &b.user_owned),
        ] {
            if !names.is_empty() {
                let _ = writeln!(out, "{kind} {bucket}: {}", names.join(", "));
            }
        }
    }
    let verdict = match (skr.agrees, left_alone) {
        (Some(true), _) => "the SKR holds the desired catalog",
        (_, false) => {
            "the SKR does not hold the desired catalog: the next sync of this Kyma repairs that (in active mode, within --resync-period)"
        }
        (_, true) => "the SKR does not hold the desired catalog, and catalogsync leaves this Kyma alone",
    };
    let _ = writeln!(out, "{verdict}");
}

#[cfg(test)]
mod tests;
