//! Drift in an SKR and its repair, for the drift-bound tests (`tests/drift_bound.rs`): the
//! things catalogsync manages in an SKR changed behind its back (the ModuleTemplate CRD, the
//! sync namespace's managed-by label, the sync namespace itself, a copy), a poll that times
//! each repair, what the repairs cost in SKR requests (read from a replica's
//! `catalogsync_skr_requests_total`), and the shard records (`catalogsync-shard-<n>-memory`,
//! key `skrs.json`) read, located and forged.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};

use super::controllers::ControllerManager;
use super::controlplane::ControlPlane;
use super::scenario::{MRM, MT, catalog_resource};

/// The label catalogsync puts on what it manages in an SKR, spelled out as the docs name it.
pub const MANAGED_BY: &str = "operator.kyma-project.io/managed-by";
/// The value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "kyma";
/// The SKR CRD [`SkrView::drift_crd`] edits.
pub const MT_CRD: &str = "moduletemplates.operator.kyma-project.io";
/// The field manager of the test's own edits in the SKR and the KCP.
pub const DRIFT_MANAGER: &str = "drift-test";
/// The metric of SKR requests (docs/metrics.md).
pub const SKR_REQUESTS: &str = "catalogsync_skr_requests_total";
/// The `verb` label values of [`SKR_REQUESTS`].
pub const VERBS: [&str; 5] = ["get", "list", "apply", "replace", "delete"];
/// The key of a shard record in its ConfigMap (docs/architecture.md, src/sync/recall.rs).
pub const RECORD_KEY: &str = "skrs.json";
/// A digest no memory has (32 hex digits of zero).
pub const ZERO_DIGEST: &str = "00000000000000000000000000000000";

/// How often [`SkrView::await_repaired`] looks.
const POLL: Duration = Duration::from_millis(150);

/// What catalogsync manages in one SKR for one sync namespace, seen with the SKR's admin
/// client.
pub struct SkrView {
    /// The SKR's CRDs.
    pub crds: Api<CustomResourceDefinition>,
    /// The SKR's namespaces.
    pub namespaces: Api<Namespace>,
    /// The sync namespace.
    pub sync_ns: String,
    client: Client,
}

/// One change made in an SKR behind catalogsync's back, with what its repair looks like.
#[derive(Clone, Debug)]
pub enum Drift {
    /// The ModuleTemplate CRD lost its managed-by label and its printer columns.
    Crd,
    /// The sync namespace lost its managed-by label.
    NamespaceLabel,
    /// The sync namespace was deleted (UID `uid`) with the copies it held (`copies`: plural
    /// and name); repaired once a new namespace of that name, labelled and not terminating,
    /// holds all of them again.
    NamespaceDeleted {
        /// The deleted namespace's UID.
        uid: String,
        /// The copies it held: (plural, name).
        copies: Vec<(&'static str, String)>,
    },
    /// The spec of copy `name` (plural `plural`) was edited; repaired once it is `spec` again.
    Copy {
        /// The copy's kind, by plural.
        plural: &'static str,
        /// The copy's name.
        name: String,
        /// Its spec before the edit.
        spec: Value,
    },
}

impl Drift {
    /// A short name for reports.
    pub fn what(&self) -> String {
        match self {
            Self::Crd => "CRD".to_owned(),
            Self::NamespaceLabel => "namespace label".to_owned(),
            Self::NamespaceDeleted { .. } => "namespace deletion".to_owned(),
            Self::Copy { name, .. } => format!("copy {name}"),
        }
    }
}

/// Whether a CRD is as catalogsync writes it: labelled managed-by and with printer columns in
/// every version.
pub fn crd_is_ours(crd: &CustomResourceDefinition) -> bool {
    let labelled = crd.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).is_some_and(|v| v == MANAGED_BY_VALUE);
    let columns =
        crd.spec.versions.iter().all(|v| v.additional_printer_columns.as_ref().is_some_and(|c| !c.is_empty()));
    labelled && columns
}

/// Whether a namespace carries the managed-by label.
pub fn ns_labelled(ns: &Namespace) -> bool {
    ns.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).is_some_and(|v| v == MANAGED_BY_VALUE)
}

impl SkrView {
    /// The view of `skr` for sync namespace `sync_ns`.
    pub fn new(skr: &ControlPlane, sync_ns: &str) -> Self {
        let client = skr.admin_client();
        Self {
            crds: Api::all(client.clone()),
            namespaces: Api::all(client.clone()),
            sync_ns: sync_ns.to_owned(),
            client,
        }
    }

    /// The copies of a catalog kind (by plural) in the sync namespace.
    pub fn copies(&self, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.sync_ns, &catalog_resource(plural))
    }

    /// Takes the managed-by label and the printer columns off the ModuleTemplate CRD, and
    /// checks that the change took.
    ///
    /// # Panics
    /// When the CRD cannot be read or written, or the change did not take.
    pub async fn drift_crd(&self) -> Drift {
        let crd = self.crds.get(MT_CRD).await.expect("the CRD");
        let versions: Vec<Value> = crd
            .spec
            .versions
            .iter()
            .map(|v| {
                let mut v = serde_json::to_value(v).expect("a version");
                if let Some(o) = v.as_object_mut() {
                    o.remove("additionalPrinterColumns");
                }
                v
            })
            .collect();
        let patch = json!({"metadata": {"labels": {MANAGED_BY: null}}, "spec": {"versions": versions}});
        self.crds.patch(MT_CRD, &drift_params(), &Patch::Merge(&patch)).await.expect("drift the CRD");
        let drifted = self.crds.get(MT_CRD).await.expect("the CRD");
        assert!(!crd_is_ours(&drifted), "the CRD drift did not take");
        Drift::Crd
    }

    /// Removes the sync namespace's managed-by label.
    ///
    /// # Panics
    /// When the namespace cannot be written, or the change did not take.
    pub async fn unlabel_namespace(&self) -> Drift {
        let patch = json!({"metadata": {"labels": {MANAGED_BY: null}}});
        let ns = self.namespaces.patch(&self.sync_ns, &drift_params(), &Patch::Merge(&patch)).await.expect("unlabel");
        assert!(!ns_labelled(&ns), "the namespace label drift did not take");
        Drift::NamespaceLabel
    }

    /// Deletes the sync namespace, remembering its UID and the copies it holds (there must
    /// be some: their return is part of the repair).
    ///
    /// # Panics
    /// When the namespace cannot be read or deleted, or holds no copy.
    pub async fn delete_namespace(&self) -> Drift {
        let ns = self.namespaces.get(&self.sync_ns).await.expect("the sync namespace");
        let uid = ns.metadata.uid.clone().expect("a namespace has a UID");
        let mut copies = Vec::new();
        for plural in [MT, MRM] {
            let list = self.copies(plural).list(&ListParams::default()).await.expect("list copies");
            copies.extend(list.items.iter().map(|o| (plural, o.name_any())));
        }
        assert!(!copies.is_empty(), "the sync namespace {} holds no copy to lose", self.sync_ns);
        self.namespaces.delete(&self.sync_ns, &DeleteParams::default()).await.expect("delete the sync namespace");
        Drift::NamespaceDeleted { uid, copies }
    }

    /// Waits until the namespace of a [`Drift::NamespaceDeleted`] is finalized (gone, or
    /// already recreated under another UID): only a namespace controller can do that here.
    /// Returns how long it took from `since`.
    ///
    /// # Panics
    /// On timeout (with the tail of the controller-manager's log), or for another drift.
    pub async fn await_namespace_gone(
        &self,
        drift: &Drift,
        since: Instant,
        timeout: Duration,
        controller: &ControllerManager,
    ) -> Duration {
        let Drift::NamespaceDeleted { uid, .. } = drift else { panic!("not a namespace deletion: {drift:?}") };
        let description = format!("namespace {} (UID {uid}) finalized by the namespace controller", self.sync_ns);
        let gone = super::wait_until(timeout, &description, || async {
            match self.namespaces.get_opt(&self.sync_ns).await {
                Ok(None) => true,
                Ok(Some(ns)) => ns.metadata.uid.as_deref() != Some(uid.as_str()),
                Err(_) => false,
            }
        })
        .await;
        if let Err(e) = gone {
            let ns = self.namespaces.get_opt(&self.sync_ns).await.ok().flatten();
            let status = ns.and_then(|n| n.status).map(|s| format!("{s:?}")).unwrap_or_default();
            panic!("{e}\nnamespace status: {status}\nkube-controller-manager log:\n{}", controller.log_tail(40));
        }
        since.elapsed()
    }

    /// Edits the spec of copy `name` of kind `plural` (its ModuleTemplate data's `spec.x`,
    /// or else a spec field of its own) under [`DRIFT_MANAGER`], and checks that the change
    /// took.
    ///
    /// # Panics
    /// When the copy cannot be read or written, or the change did not take.
    pub async fn edit_copy(&self, plural: &'static str, name: &str) -> Drift {
        let api = self.copies(plural);
        let copy = api.get(name).await.unwrap_or_else(|e| panic!("copy {name}: {e}"));
        let spec = copy.data.get("spec").cloned().unwrap_or_default();
        let patch = match spec.pointer("/data/spec/x").and_then(Value::as_i64) {
            Some(x) => json!({"spec": {"data": {"spec": {"x": x + 1}}}}),
            None => json!({"spec": {"driftTest": "edited"}}),
        };
        let edited = api.patch(name, &drift_params(), &Patch::Merge(&patch)).await.expect("edit the copy");
        assert_ne!(edited.data.get("spec"), Some(&spec), "the edit of copy {name} did not take");
        Drift::Copy { plural, name: name.to_owned(), spec }
    }

    /// Whether `drift` is repaired now.
    pub async fn repaired(&self, drift: &Drift) -> bool {
        match drift {
            Drift::Crd => self.crds.get(MT_CRD).await.is_ok_and(|c| crd_is_ours(&c)),
            Drift::NamespaceLabel => self.namespaces.get(&self.sync_ns).await.is_ok_and(|ns| ns_labelled(&ns)),
            Drift::NamespaceDeleted { uid, copies } => {
                let Ok(Some(ns)) = self.namespaces.get_opt(&self.sync_ns).await else { return false };
                if ns.metadata.uid.as_deref() == Some(uid.as_str())
                    || ns.metadata.deletion_timestamp.is_some()
                    || !ns_labelled(&ns)
                {
                    return false;
                }
                for (plural, name) in copies {
                    if !matches!(self.copies(plural).get_opt(name).await, Ok(Some(_))) {
                        return false;
                    }
                }
                true
            }
            Drift::Copy { plural, name, spec } => {
                self.copies(plural).get_opt(name).await.ok().flatten().is_some_and(|c| c.data.get("spec") == Some(spec))
            }
        }
    }

    /// Polls until every drift is repaired, noting when each was first seen repaired;
    /// returns each one's time from `since`, in the order given.
    ///
    /// # Panics
    /// When `bound` passes from `since` with a drift not repaired (naming each one).
    pub async fn await_repaired(
        &self,
        drifts: &[Drift],
        since: Instant,
        bound: Duration,
        situation: &str,
    ) -> Vec<Duration> {
        let mut took: Vec<Option<Duration>> = vec![None; drifts.len()];
        loop {
            for (drift, took) in drifts.iter().zip(took.iter_mut()) {
                if took.is_none() && self.repaired(drift).await {
                    *took = Some(since.elapsed());
                }
            }
            if took.iter().all(Option::is_some) {
                break;
            }
            if since.elapsed() > bound {
                let missing: Vec<String> =
                    drifts.iter().zip(&took).filter(|(_, t)| t.is_none()).map(|(d, _)| d.what()).collect();
                panic!("{situation}: not repaired within {:.0}s: {}", bound.as_secs_f64(), missing.join(", "));
            }
            tokio::time::sleep(POLL).await;
        }
        took.into_iter().flatten().collect()
    }
}

/// Patch parameters of the test's own edits.
fn drift_params() -> PatchParams {
    PatchParams { field_manager: Some(DRIFT_MANAGER.to_owned()), ..PatchParams::default() }
}

/// The `result` label values of [`SKR_REQUESTS`] other than `success`.
pub const UNSUCCESSFUL: [&str; 3] = ["not_found", "conflict", "error"];

/// A replica's SKR requests so far, by verb ([`SKR_REQUESTS`]), and those that did not
/// succeed by verb and result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SkrRequests {
    by_verb: BTreeMap<&'static str, f64>,
    unsuccessful: BTreeMap<(&'static str, &'static str), f64>,
}

impl SkrRequests {
    /// Reads them from a Prometheus text exposition.
    pub fn parse(exposition: &str) -> Self {
        let sum = |labels: &[&str]| super::fleet::metric_sum(exposition, SKR_REQUESTS, labels);
        let by_verb = VERBS.iter().map(|verb| (*verb, sum(&[&format!("verb=\"{verb}\"")]))).collect();
        let unsuccessful = VERBS
            .iter()
            .flat_map(|verb| UNSUCCESSFUL.iter().map(move |result| (*verb, *result)))
            .map(|(verb, result)| {
                ((verb, result), sum(&[&format!("verb=\"{verb}\""), &format!("result=\"{result}\"")]))
            })
            .collect();
        Self { by_verb, unsuccessful }
    }

    /// Reads them from the `/metrics` of the replica serving HTTP on loopback port `port`.
    ///
    /// # Errors
    /// When the metrics cannot be read.
    pub async fn read(port: u16) -> Result<Self> {
        let (status, body) = super::http::get_local(port, "/metrics").await?;
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        Ok(Self::parse(&body))
    }

    /// The requests made since `before`.
    pub fn since(&self, before: &Self) -> Self {
        let by_verb = self.by_verb.iter().map(|(verb, n)| (*verb, n - before.verb(verb))).collect();
        let unsuccessful = self
            .unsuccessful
            .iter()
            .map(|(key, n)| (*key, n - before.unsuccessful.get(key).copied().unwrap_or_default()))
            .collect();
        Self { by_verb, unsuccessful }
    }

    /// The requests of one verb.
    pub fn verb(&self, verb: &str) -> f64 {
        self.by_verb.get(verb).copied().unwrap_or_default()
    }

    /// All requests.
    pub fn total(&self) -> f64 {
        self.by_verb.values().sum()
    }

    /// The requests that did not succeed (any `result` but `success`).
    pub fn failed(&self) -> f64 {
        self.unsuccessful.values().sum()
    }

    /// The writes (`apply`, `replace` and `delete`).
    pub fn writes(&self) -> f64 {
        self.verb("apply") + self.verb("replace") + self.verb("delete")
    }
}

impl fmt::Display for SkrRequests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for verb in VERBS {
            write!(f, "{verb}={} ", self.verb(verb))?;
        }
        write!(f, "(total {}", self.total())?;
        for ((verb, result), n) in &self.unsuccessful {
            if *n != 0.0 {
                write!(f, ", {verb} {result}={n}")?;
            }
        }
        write!(f, ")")
    }
}

/// The one-line summary of a situation: the time to repair each drift and the SKR requests
/// it cost.
pub fn summary(
    situation: &str,
    drifts: &[Drift],
    took: &[Duration],
    bound: Duration,
    requests: &SkrRequests,
) -> String {
    let repairs: Vec<String> =
        drifts.iter().zip(took).map(|(d, t)| format!("{} {:.1}s", d.what(), t.as_secs_f64())).collect();
    format!(
        "SUMMARY {situation}: repaired {} (bound {:.0}s); SKR requests {requests}",
        repairs.join(", "),
        bound.as_secs_f64()
    )
}

/// The name of the shard record of `shard`, spelled out as the docs name it.
pub fn record_name(shard: u32) -> String {
    format!("catalogsync-shard-{shard}-memory")
}

/// The shard records in namespace `ns` of the KCP (the lease namespace), parsed, by shard.
///
/// # Errors
/// When the ConfigMaps cannot be listed or a record is not JSON.
pub async fn shard_records(kcp: &Client, ns: &str) -> Result<BTreeMap<u32, Value>> {
    let list = Api::<ConfigMap>::namespaced(kcp.clone(), ns).list(&ListParams::default()).await?;
    let mut records = BTreeMap::new();
    for cm in list.items {
        let name = cm.name_any();
        let Some(shard) = name.strip_prefix("catalogsync-shard-").and_then(|n| n.strip_suffix("-memory")) else {
            continue;
        };
        let shard: u32 = shard.parse().with_context(|| format!("shard number of {name}"))?;
        let Some(text) = cm.data.as_ref().and_then(|d| d.get(RECORD_KEY)) else { continue };
        records.insert(shard, serde_json::from_str(text).with_context(|| format!("record {name}"))?);
    }
    Ok(records)
}

/// The shard whose record holds an entry for Kyma `kyma`, with the whole record.
///
/// # Errors
/// As [`shard_records`]; also when no record or more than one holds the Kyma.
pub async fn record_of(kcp: &Client, ns: &str, kyma: &str) -> Result<(u32, Value)> {
    let records = shard_records(kcp, ns).await?;
    let mut holding = records.into_iter().filter(|(_, r)| r.pointer(&format!("/skrs/{kyma}")).is_some());
    let found = holding.next().with_context(|| format!("no shard record holds Kyma {kyma}"))?;
    anyhow::ensure!(holding.next().is_none(), "more than one shard record holds Kyma {kyma}");
    Ok(found)
}

/// Overwrites the record of `shard` in namespace `ns` with `record` (a merge patch under
/// [`DRIFT_MANAGER`]), and checks that it reads back.
///
/// # Errors
/// When the ConfigMap cannot be written or does not read back as written.
pub async fn write_record(kcp: &Client, ns: &str, shard: u32, record: &Value) -> Result<()> {
    let api = Api::<ConfigMap>::namespaced(kcp.clone(), ns);
    let text = serde_json::to_string(record)?;
    let patch = json!({"data": {RECORD_KEY: text}});
    api.patch(&record_name(shard), &drift_params(), &Patch::Merge(&patch)).await?;
    let stored = shard_records(kcp, ns).await?.remove(&shard);
    anyhow::ensure!(stored.as_ref() == Some(record), "the record of shard {shard} reads back as {stored:?}");
    Ok(())
}

/// A record (format 1) of one Kyma: its access Secret's version and a digest per kind.
pub fn record_for(kyma: &str, secret_version: &str, mt_digest: &str, mrm_digest: &str) -> Value {
    json!({
        "format": 1,
        "skrs": {kyma: {"secret": secret_version, "kinds": {"ModuleTemplate": mt_digest, "ModuleReleaseMeta": mrm_digest}}},
    })
}

/// `<uid>/<resourceVersion>` of Secret `name` in namespace `ns`: the version a record names.
///
/// # Errors
/// When the Secret cannot be read.
pub async fn secret_version(kcp: &Client, ns: &str, name: &str) -> Result<String> {
    let secret = Api::<Secret>::namespaced(kcp.clone(), ns).get(name).await?;
    Ok(format!("{}/{}", secret.uid().unwrap_or_default(), secret.resource_version().unwrap_or_default()))
}

/// Gives Secret `name` a new resourceVersion (a label of the test's), and returns its new
/// version as a record names it.
///
/// # Errors
/// When the Secret cannot be written.
pub async fn bump_secret(kcp: &Client, ns: &str, name: &str) -> Result<String> {
    let before = secret_version(kcp, ns, name).await?;
    let patch = json!({"metadata": {"labels": {"drift-test/bumped": format!("{}", rand::random::<u32>())}}});
    Api::<Secret>::namespaced(kcp.clone(), ns).patch(name, &drift_params(), &Patch::Merge(&patch)).await?;
    let after = secret_version(kcp, ns, name).await?;
    anyhow::ensure!(after != before, "the Secret's version did not change");
    Ok(after)
}

/// The digests (ModuleTemplate, ModuleReleaseMeta) a shard record would need for the copies
/// the SKR holds now to count as verified: per kind, the digest of a memory holding every
/// desired copy, at the resourceVersion the SKR shows for it now, with its desired content
/// hash. The desired set is computed with catalogsync's own functions from the catalog in KCP
/// namespace `kcp_ns`, for a Kyma without labels and no restricted modules, as anyone who can
/// read the KCP catalog and the SKR could.
///
/// # Errors
/// When the catalog or a desired copy cannot be read.
pub async fn digests_of_skr_as_it_is(kcp: &Client, kcp_ns: &str, view: &SkrView) -> Result<(String, String)> {
    use catalogsync::catalog::{CatalogKind, KindMemory, Snapshot, desired_set};

    let list = |plural: &str| {
        let api: Api<DynamicObject> = Api::namespaced_with(kcp.clone(), kcp_ns, &catalog_resource(plural));
        async move { api.list(&ListParams::default()).await.map(|l| l.items) }
    };
    let (templates, release_metas) = (list(MT).await?, list(MRM).await?);
    let snapshot = Snapshot::build(&templates, &release_metas, &view.sync_ns);
    let (desired, _) = desired_set(&snapshot, &BTreeMap::new(), &std::collections::BTreeSet::new());
    let mut digests = Vec::new();
    for kind in CatalogKind::ALL {
        let mut memory = KindMemory::new();
        for (name, object) in desired.of(kind) {
            let copy = view.copies(kind.plural()).get(name).await.with_context(|| format!("copy {name}"))?;
            memory.remember(name, &copy.resource_version().unwrap_or_default(), object.hash);
        }
        digests.push(format!("{:032x}", memory.digest()));
    }
    let [mt, mrm]: [String; 2] = digests.try_into().map_err(|_| anyhow::anyhow!("two catalog kinds"))?;
    Ok((mt, mrm))
}
