//! Server-side apply of YAML manifests (CRDs, RBAC, sample catalogs) with the admin client,
//! the way `kubectl apply --server-side` would.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Client, ResourceExt as _};

use super::controlplane::ControlPlane;
use super::wait::wait_until;

/// Field manager of everything the harness applies.
pub const HARNESS_FIELD_MANAGER: &str = "test-harness";

/// How long a CRD may take to become `Established` (normally well under a second).
pub const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a kind may take to appear in discovery after its CRD is established.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(15);

/// Parses a multi-document YAML stream into JSON values, skipping empty documents.
///
/// # Errors
/// Fails when the YAML does not parse.
pub fn parse_yaml_docs(yaml: &str) -> Result<Vec<serde_json::Value>> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).context("failed to parse YAML")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The `*.yaml` and `*.yml` files in `dir`, sorted by name, without `kustomization.yaml`
/// (kustomize's own file, not a manifest; `deploy/*/` have one).
///
/// # Errors
/// Fails when the directory cannot be read.
pub fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("failed to read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .filter(|p| p.file_stem().is_none_or(|stem| stem != "kustomization"))
        .collect();
    files.sort();
    Ok(files)
}

fn read_docs_in(dir: &Path) -> Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for file in yaml_files(dir)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("failed to read {}", file.display()))?;
        docs.extend(parse_yaml_docs(&text).with_context(|| format!("in {}", file.display()))?);
    }
    Ok(docs)
}

/// Applies every CRD in the YAML files of `dir` (e.g. `deploy/crds/`) and waits until each
/// is `Established`. Returns the CRD names.
///
/// # Errors
/// Fails when a file does not parse, holds something other than CRDs, an apply fails, or
/// a CRD is not established in time.
pub async fn install_crds(cp: &ControlPlane, dir: &Path) -> Result<Vec<String>> {
    let docs = read_docs_in(dir)?;
    if docs.is_empty() {
        bail!("no CRDs found in {}", dir.display());
    }
    install_crd_docs(cp, docs).await
}

/// Applies the CRDs in a YAML stream (e.g. `catalogsync::api::crds_yaml()`) and waits until
/// each is `Established`.
///
/// # Errors
/// As [`install_crds`].
pub async fn install_crds_yaml(cp: &ControlPlane, yaml: &str) -> Result<Vec<String>> {
    install_crd_docs(cp, parse_yaml_docs(yaml)?).await
}

async fn install_crd_docs(cp: &ControlPlane, docs: Vec<serde_json::Value>) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(cp.admin_client());
    let params = PatchParams::apply(HARNESS_FIELD_MANAGER).force();
    let mut names = Vec::new();
    for doc in docs {
        let crd: CustomResourceDefinition =
            serde_json::from_value(doc).context("a document is not a CustomResourceDefinition")?;
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(&crd)).await.with_context(|| format!("failed to apply CRD {name}"))?;
        names.push(name);
    }
    for name in &names {
        wait_until(CRD_ESTABLISHED_TIMEOUT, &format!("CRD {name} to be Established in {}", cp.name()), || async {
            let crd = api.get(name).await.ok()?;
            let established = crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        })
        .await?;
    }
    Ok(names)
}

/// Applies every document in the YAML files of `dir` (e.g. `deploy/rbac/`). Returns the
/// number of objects applied.
///
/// # Errors
/// As [`apply_yaml`].
pub async fn apply_yaml_dir(cp: &ControlPlane, dir: &Path) -> Result<usize> {
    apply_docs(&cp.admin_client(), read_docs_in(dir)?).await
}

/// Applies every document of a YAML stream with the admin client.
///
/// # Errors
/// As [`apply_docs`].
pub async fn apply_yaml(cp: &ControlPlane, yaml: &str) -> Result<usize> {
    apply_docs(&cp.admin_client(), parse_yaml_docs(yaml)?).await
}

/// Applies objects of any kind (server-side apply, field manager [`HARNESS_FIELD_MANAGER`],
/// forced), finding each kind through discovery. Namespaces and CRDs go first; namespaced
/// objects without a namespace go to `default`. Returns the number applied.
///
/// # Errors
/// Fails on the first object without apiVersion/kind/name, of an unknown kind, or whose
/// apply fails.
pub async fn apply_docs(client: &Client, mut docs: Vec<serde_json::Value>) -> Result<usize> {
    let rank = |d: &serde_json::Value| match d.get("kind").and_then(|k| k.as_str()) {
        Some("Namespace") => 0,
        Some("CustomResourceDefinition") => 1,
        _ => 2,
    };
    docs.sort_by_key(rank);
    let params = PatchParams::apply(HARNESS_FIELD_MANAGER).force();
    let mut kinds: HashMap<GroupVersionKind, (ApiResource, ApiCapabilities)> = HashMap::new();
    let count = docs.len();
    for doc in docs {
        let obj: DynamicObject = serde_json::from_value(doc).context("a document is not a Kubernetes object")?;
        let types = obj.types.clone().ok_or_else(|| anyhow!("object {} has no apiVersion/kind", obj.name_any()))?;
        let gvk =
            GroupVersionKind::try_from(&types).with_context(|| format!("bad apiVersion {}", types.api_version))?;
        let name = obj.metadata.name.clone().ok_or_else(|| anyhow!("a {} has no name", types.kind))?;
        if !kinds.contains_key(&gvk) {
            let found = wait_until(
                DISCOVERY_TIMEOUT,
                &format!("{} {} to be served", types.api_version, types.kind),
                || async { kube::discovery::pinned_kind(client, &gvk).await.ok() },
            )
            .await?;
            kinds.insert(gvk.clone(), found);
        }
        let (resource, caps) = &kinds[&gvk];
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = obj.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned());
                Api::namespaced_with(client.clone(), &ns, resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), resource),
        };
        api.patch(&name, &params, &Patch::Apply(&obj))
            .await
            .with_context(|| format!("failed to apply {} {name}", types.kind))?;
    }
    Ok(count)
}
