//! One end-to-end scenario: its own KCP namespace (with catalogsync's Role from
//! `deploy/rbac/` bound there), its own SKR sync namespace, Kymas with access Secrets that
//! reach the shared SKRs under their own client identity, and a catalogsync process running
//! under its ServiceAccount identity. Scenarios share the apiservers, not their objects, so
//! test files may run them in parallel.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use catalogsync::catalog::CatalogKind;
use catalogsync::fixtures::{MODULE_NAME_LABEL, MrmBuilder, MtBuilder};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::controlplane::ControlPlane;
use super::process::{TestDir, free_port};
use super::runner::Catalogsync;
use super::{
    apply_docs, catalogsync_kubeconfig, create_namespace, env, install_catalogsync_crds, parse_yaml_docs, rbac_dir,
    unique_name,
};

/// Field manager of catalog objects the tests write into the KCP.
pub const CATALOG_AUTHOR: &str = "catalog-author";

/// The label that names an access Secret's Kyma, spelled out as lifecycle-manager writes it
/// (not taken from the crate under test).
const ACCESS_SECRET_LABEL: &str = "operator.kyma-project.io/kyma-name";

/// The two catalog kinds, by plural.
pub const MT: &str = "moduletemplates";
/// See [`MT`].
pub const MRM: &str = "modulereleasemetas";

/// ApiResource of a catalog kind by plural.
pub fn catalog_resource(plural: &str) -> ApiResource {
    CatalogKind::from_plural(plural).unwrap_or_else(|| panic!("not a catalog kind: {plural}")).api_resource()
}

/// A KCP ModuleTemplate body: `<module>-<version>` with a small descriptor and data object
/// ([`MtBuilder`]), labelled with its module name, for any namespace.
pub fn mt(module: &str, version: &str) -> Value {
    let data = json!({"apiVersion": "operator.kyma-project.io/v1alpha1", "kind": "Sample", "metadata": {"name": "default"}, "spec": {"x": 1}});
    let obj = MtBuilder::new(module, version).label(MODULE_NAME_LABEL, module).data(data).build();
    body_for_any_namespace(&obj)
}

/// A KCP ModuleReleaseMeta body for `module` with `(channel, version)` entries
/// ([`MrmBuilder`]), for any namespace.
pub fn mrm(module: &str, channels: &[(&str, &str)]) -> Value {
    let obj =
        channels.iter().fold(MrmBuilder::new(module), |b, (channel, version)| b.channel(channel, version)).build();
    body_for_any_namespace(&obj)
}

/// The apply body of a fixture object, without the namespace the builders give it (the
/// scenario applies it into its own).
fn body_for_any_namespace(obj: &DynamicObject) -> Value {
    let mut body = serde_json::to_value(obj).unwrap_or_else(|e| panic!("a fixture object serialises: {e}"));
    if let Some(meta) = body["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    body
}

/// Sets a label on a body.
pub fn labelled(mut body: Value, key: &str, value: &str) -> Value {
    body["metadata"]["labels"][key] = json!(value);
    body
}

/// The timings of every catalogsync the tests run, faster than the defaults: catalog debounce,
/// backoff and the bound of one sync.
pub const FAST_TIMINGS: &[&str] =
    &["--catalog-debounce", "200ms", "--backoff-min", "500ms", "--backoff-max", "3s", "--sync-timeout", "15s"];

/// A running scenario.
pub struct Scenario {
    /// KCP namespace of Kymas, Secrets and catalog.
    pub ns: String,
    /// SKR sync namespace.
    pub sync_ns: String,
    /// Admin client of the KCP.
    pub kcp: Client,
    /// Where the scenario writes kubeconfigs and logs.
    pub dir: TestDir,
    /// The controller, once started.
    pub catalogsync: Option<Catalogsync>,
    /// Port of the controller's HTTP server.
    pub http_port: u16,
    /// Where the access Secrets point the controller at the SKRs, when not at their
    /// loopback URLs: an address at which a test node relays them to its pods.
    pub skr_address: Option<std::net::IpAddr>,
}

impl Scenario {
    /// Creates the namespaces and RBAC of a new scenario (the CRDs go into the KCP only,
    /// once per test binary).
    pub async fn new(prefix: &str) -> Result<Self> {
        let env = env();
        install_catalogsync_crds(&env.kcp).await?;
        let kcp = env.kcp.admin_client();
        let ns = unique_name(prefix);
        create_namespace(&kcp, &ns).await?;
        let mut docs = Vec::new();
        for file in super::apply::yaml_files(&rbac_dir())? {
            let text = std::fs::read_to_string(&file)?;
            for mut doc in parse_yaml_docs(&text)? {
                // The Role and RoleBinding belong in the namespace of the Kymas.
                if matches!(doc["kind"].as_str(), Some("Role" | "RoleBinding")) {
                    doc["metadata"]["namespace"] = json!(ns);
                }
                docs.push(doc);
            }
        }
        apply_docs(&kcp, docs).await.context("failed to apply deploy/rbac")?;
        let dir = TestDir::new(&ns, Some(env.dir()))?;
        Ok(Self {
            sync_ns: format!("{ns}-sync"),
            ns,
            kcp,
            dir,
            catalogsync: None,
            http_port: free_port()?,
            skr_address: None,
        })
    }

    /// A scenario in KCP namespace `ns` (created if missing) syncing into `sync_ns`, with no
    /// RBAC of its own: for tests that install `deploy/` as it is, whose Role names its
    /// namespace (`kcp-system`) and whose controller syncs into its default namespace.
    pub async fn in_namespace(ns: &str, sync_ns: &str) -> Result<Self> {
        let env = env();
        install_catalogsync_crds(&env.kcp).await?;
        let kcp = env.kcp.admin_client();
        create_namespace(&kcp, ns).await?;
        let dir = TestDir::new(ns, Some(env.dir()))?;
        Ok(Self {
            ns: ns.to_owned(),
            sync_ns: sync_ns.to_owned(),
            kcp,
            dir,
            catalogsync: None,
            http_port: free_port()?,
            skr_address: None,
        })
    }

    /// The user name a Kyma's access Secret authenticates as in its SKR.
    pub fn skr_user(&self, kyma: &str) -> String {
        format!("skr-writer-{}-{kyma}", self.ns)
    }

    /// Writes (creates or replaces) the access Secret of `kyma` for `skr`, named `name`.
    pub async fn put_secret(&self, name: &str, kyma: &str, kubeconfig: &str) -> Result<()> {
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": self.ns, "labels": {ACCESS_SECRET_LABEL: kyma}},
            "stringData": {"config": kubeconfig},
        });
        // Replace `data` entirely: delete-free SSA of stringData would keep old keys only, fine.
        Api::<Secret>::namespaced(self.kcp.clone(), &self.ns)
            .patch(name, &PatchParams::apply(CATALOG_AUTHOR).force(), &Patch::Apply(&body))
            .await
            .with_context(|| format!("failed to write secret {name}"))?;
        Ok(())
    }

    /// A kubeconfig for `skr` under the identity of `kyma`'s writer (admin in the SKR).
    pub fn skr_kubeconfig(&self, kyma: &str, skr: &ControlPlane) -> String {
        let user = self.skr_user(kyma);
        match self.skr_address {
            None => skr.kubeconfig_yaml(&user, &["system:masters"]),
            Some(address) => {
                let server = format!("https://{}", std::net::SocketAddr::new(address, skr.port()));
                skr.kubeconfig_yaml_at(&server, &user, &["system:masters"]).expect("issue a client certificate")
            }
        }
    }

    /// Creates Kyma `name` with `labels` and its access Secret reaching `skr`.
    pub async fn add_kyma(&self, name: &str, skr: &ControlPlane, labels: &[(&str, &str)]) -> Result<()> {
        self.put_secret(name, name, &self.skr_kubeconfig(name, skr)).await?;
        self.add_kyma_without_secret(name, labels).await
    }

    /// Creates Kyma `name` with `labels` and no Secret.
    pub async fn add_kyma_without_secret(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        self.apply_kyma(name, labels, &[]).await
    }

    /// Writes Kyma `name` with `labels` and `finalizers` (server-side apply).
    async fn apply_kyma(&self, name: &str, labels: &[(&str, &str)], finalizers: &[&str]) -> Result<()> {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let mut body = json!({
            "apiVersion": "operator.kyma-project.io/v1beta2",
            "kind": "Kyma",
            "metadata": {"name": name, "namespace": self.ns, "labels": labels},
            "spec": {"channel": "regular"},
        });
        if !finalizers.is_empty() {
            body["metadata"]["finalizers"] = json!(finalizers);
        }
        self.kymas()
            .patch(name, &PatchParams::apply(CATALOG_AUTHOR).force(), &Patch::Apply(&body))
            .await
            .with_context(|| format!("failed to create kyma {name}"))?;
        Ok(())
    }

    /// Sets (or with `None` removes) a label of a Kyma, through a merge patch.
    pub async fn set_kyma_label(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"labels": {key: value}}});
        self.kymas().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }

    /// The KCP Kyma API of this scenario.
    pub fn kymas(&self) -> Api<DynamicObject> {
        let ar = ApiResource::erase::<catalogsync::api::Kyma>(&());
        Api::namespaced_with(self.kcp.clone(), &self.ns, &ar)
    }

    /// Writes catalog objects into the KCP namespace (server-side apply).
    pub async fn apply_catalog(&self, objects: &[Value]) -> Result<()> {
        for obj in objects {
            let plural = match obj["kind"].as_str() {
                Some("ModuleTemplate") => MT,
                Some("ModuleReleaseMeta") => MRM,
                other => anyhow::bail!("not a catalog kind: {other:?}"),
            };
            let name = obj["metadata"]["name"].as_str().context("catalog object without name")?;
            let mut obj = obj.clone();
            obj["metadata"]["namespace"] = json!(self.ns);
            self.catalog_api(plural)
                .patch(name, &PatchParams::apply(CATALOG_AUTHOR).force(), &Patch::Apply(&obj))
                .await
                .with_context(|| format!("failed to apply {plural} {name}"))?;
        }
        Ok(())
    }

    /// Deletes a catalog object from the KCP.
    pub async fn delete_catalog(&self, plural: &str, name: &str) -> Result<()> {
        self.catalog_api(plural).delete(name, &DeleteParams::default()).await?;
        Ok(())
    }

    /// Deletes the catalog objects of a kind whose fields match `field_selector` (empty: all)
    /// in one request, as `kubectl delete --all` does: the deletions reach the watches as
    /// one burst.
    pub async fn delete_catalog_collection(&self, plural: &str, field_selector: &str) -> Result<()> {
        let lp = ListParams::default().fields(field_selector);
        self.catalog_api(plural).delete_collection(&DeleteParams::default(), &lp).await?;
        Ok(())
    }

    /// The KCP API of a catalog kind in this scenario's namespace.
    pub fn catalog_api(&self, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.kcp.clone(), &self.ns, &catalog_resource(plural))
    }

    /// The SKR API of a catalog kind in the sync namespace.
    pub fn skr_api(&self, skr: &ControlPlane, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(skr.admin_client(), &self.sync_ns, &catalog_resource(plural))
    }

    /// Names of the copies of a kind in `skr`'s sync namespace (empty when the CRD is missing).
    pub async fn skr_names(&self, skr: &ControlPlane, plural: &str) -> BTreeSet<String> {
        match self.skr_api(skr, plural).list(&ListParams::default()).await {
            Ok(list) => list.items.iter().map(ResourceExt::name_any).collect(),
            Err(_) => BTreeSet::new(),
        }
    }

    /// Waits until `skr` holds exactly `names` of a kind.
    pub async fn await_skr_names(&self, skr: &ControlPlane, plural: &str, names: &[&str], timeout: Duration) {
        let want: BTreeSet<String> = names.iter().map(|s| (*s).to_owned()).collect();
        super::await_condition(timeout, &format!("{plural} in {} to be exactly {want:?}", skr.name()), || async {
            self.skr_names(skr, plural).await == want
        })
        .await;
    }

    /// The `ModuleCatalog` condition of a Kyma.
    pub async fn condition(&self, kyma: &str) -> Option<Condition> {
        let obj = self.kymas().get(kyma).await.ok()?;
        let conditions = obj.data.pointer("/status/conditions")?.as_array()?.clone();
        conditions
            .into_iter()
            .filter_map(|c| serde_json::from_value::<Condition>(c).ok())
            .find(|c| c.type_ == "ModuleCatalog")
    }

    /// Waits until the Kyma's `ModuleCatalog` condition has `status` and `reason`.
    pub async fn await_condition(&self, kyma: &str, status: &str, reason: &str, timeout: Duration) -> Condition {
        super::await_condition(timeout, &format!("kyma {kyma} ModuleCatalog={status} ({reason})"), || async {
            self.condition(kyma).await.filter(|c| c.status == status && c.reason == reason)
        })
        .await
    }

    /// Starts catalogsync for this scenario with `extra` flags (fast test timings by default).
    pub fn start(&mut self, extra: &[&str]) -> Result<()> {
        let env = env();
        let kubeconfig: PathBuf = catalogsync_kubeconfig(&env.kcp, self.dir.path());
        let addr = format!("127.0.0.1:{}", self.http_port);
        let mut args = vec![
            "run",
            "--kcp-namespace",
            &self.ns,
            "--sync-namespace",
            &self.sync_ns,
            "--http-addr",
            &addr,
            "--identity",
            &self.ns,
            "--skr-request-timeout",
            "3s",
            "--lease-namespace",
            &self.ns,
            "--shards",
            "4",
            "--lease-duration",
            "8s",
            "--renew-deadline",
            "4s",
            "--retry-period",
            "500ms",
            "--drain-timeout",
            "3s",
        ];
        args.extend_from_slice(FAST_TIMINGS);
        // The test SKRs listen on loopback, which the default (`public`) refuses; a test may
        // give its own list instead.
        if !extra.iter().any(|a| a.starts_with("--skr-allowed-destinations")) {
            args.extend_from_slice(&["--skr-allowed-destinations", super::SKR_DESTINATIONS]);
        }
        args.extend_from_slice(extra);
        let cs = Catalogsync::spawn_bin(
            &super::catalogsync_bin(),
            &args,
            &[("CATALOGSYNC_LOG", "info,catalogsync=debug,kube_runtime=debug")],
            &kubeconfig,
            Some(self.dir.path()),
        )?;
        self.catalogsync = Some(cs);
        Ok(())
    }

    /// GETs a path of the controller's HTTP server; returns status code and body.
    pub async fn http_get(&self, path: &str) -> Result<(u16, String)> {
        super::http::get_local(self.http_port, path).await
    }

    /// Waits until the controller reports ready.
    pub async fn await_ready(&self, timeout: Duration) {
        super::await_condition(timeout, "catalogsync /readyz to be 200", || async {
            matches!(self.http_get("/readyz").await, Ok((200, _)))
        })
        .await;
    }

    /// The controller log so far (for failure messages).
    pub fn log(&self) -> String {
        self.catalogsync.as_ref().map(Catalogsync::log).unwrap_or_default()
    }

    /// The controller's log lines longer than `bound` bytes, each cut to its first 200
    /// characters behind its length.
    pub fn long_log_lines(&self, bound: usize) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.len() > bound)
            .map(|l| format!("{} bytes: {}...", l.len(), l.chars().take(200).collect::<String>()))
            .collect()
    }

    /// Peak RSS (VmHWM) of the running controller, in MiB.
    ///
    /// # Panics
    /// When no controller runs or its `/proc` status cannot be read.
    pub fn peak_rss_mib(&self) -> u64 {
        let pid = self.catalogsync.as_ref().expect("catalogsync runs").pid();
        let (_, hwm_kib) = super::process::rss_kib(pid).expect("read /proc status");
        hwm_kib / 1024
    }

    /// The text of every shard record (the `catalogsync-shard-<n>-memory` ConfigMaps of the
    /// scenario's namespace, its lease namespace), concatenated.
    ///
    /// # Errors
    /// Fails when the ConfigMaps cannot be listed.
    pub async fn shard_records_text(&self) -> Result<String> {
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(self.kcp.clone(), &self.ns);
        let list = config_maps.list(&ListParams::default()).await.context("failed to list the shard records")?;
        Ok(list
            .items
            .into_iter()
            .filter(|cm| cm.metadata.name.as_deref().is_some_and(|n| n.ends_with("-memory")))
            .flat_map(|cm| cm.data.unwrap_or_default().into_values())
            .collect())
    }

    /// Sum of the values of a metric's series whose labels contain all of `labels`
    /// (`key="value"` fragments).
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let Ok((_, body)) = self.http_get("/metrics").await else { return 0.0 };
        super::fleet::metric_sum(&body, name, labels)
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- catalogsync log of scenario {} (last 60 lines) ---", self.ns);
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

// Helpers of the failure-isolation tests (tests/sync_isolation.rs).
impl Scenario {
    /// Creates Kyma `name` with `labels` and `finalizers` in `metadata.finalizers`, and its
    /// access Secret reaching `skr`. A finalizer nobody removes keeps the Kyma around with a
    /// `deletionTimestamp` after [`Scenario::delete_kyma`].
    pub async fn add_kyma_with_finalizers(
        &self,
        name: &str,
        skr: &ControlPlane,
        labels: &[(&str, &str)],
        finalizers: &[&str],
    ) -> Result<()> {
        self.put_secret(name, name, &self.skr_kubeconfig(name, skr)).await?;
        self.apply_kyma(name, labels, finalizers).await
    }

    /// Deletes Kyma `name` (with a finalizer left it stays, with a `deletionTimestamp`).
    pub async fn delete_kyma(&self, name: &str) -> Result<()> {
        self.kymas()
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("failed to delete {name}"))?;
        Ok(())
    }

    /// Removes the `kyma-name` label of Secret `name`: it is no access Secret any more.
    pub async fn unlabel_secret(&self, name: &str) -> Result<()> {
        let patch = json!({"metadata": {"labels": {ACCESS_SECRET_LABEL: null}}});
        Api::<Secret>::namespaced(self.kcp.clone(), &self.ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("failed to unlabel secret {name}"))?;
        Ok(())
    }

    /// Deletes Secret `name` from the scenario namespace.
    pub async fn delete_secret(&self, name: &str) -> Result<()> {
        Api::<Secret>::namespaced(self.kcp.clone(), &self.ns)
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("failed to delete secret {name}"))?;
        Ok(())
    }

    /// The Events (`events.k8s.io/v1`) in the scenario namespace whose `regarding` is Kyma
    /// `kyma` (listed with the admin client; empty on error).
    pub async fn kyma_events(&self, kyma: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        let api = Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.kcp.clone(), &self.ns);
        let Ok(list) = api.list(&ListParams::default()).await else { return Vec::new() };
        list.items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Kyma")
                        && r.name.as_deref() == Some(kyma)
                        && r.namespace.as_deref() == Some(self.ns.as_str())
                })
            })
            .collect()
    }

    /// Waits until an Event about Kyma `kyma` with `reason` exists, and returns it.
    pub async fn await_kyma_event(
        &self,
        kyma: &str,
        reason: &str,
        timeout: Duration,
    ) -> k8s_openapi::api::events::v1::Event {
        super::await_condition(timeout, &format!("an Event with reason {reason} on kyma {kyma}"), || async {
            self.kyma_events(kyma).await.into_iter().find(|e| e.reason.as_deref() == Some(reason))
        })
        .await
    }

    /// Whether catalogsync was started and still runs.
    pub fn catalogsync_running(&mut self) -> bool {
        self.catalogsync.as_mut().is_some_and(Catalogsync::is_running)
    }
}
