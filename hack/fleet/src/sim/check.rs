//! `fleet sim-check`: a self-test of a running simulator with real kube-rs clients, making
//! the requests catalogsync's SKR executor and a lifecycle-manager-like baseline make, and
//! checking the admin API's view of them. Prints one `PASS`/`FAIL` line per check.
//!
//! With `--load-skrs N` it then fills N SKRs with the same `--load-objects` ModuleTemplates
//! of `--load-object-kb` KB each and runs `--load-lists` metadata lists over them, printing
//! timings (measure the simulator's RSS from outside).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use catalogsync::api::{
    Kyma, MANAGED_BY_LABEL, MANAGED_BY_VALUE, ModuleReleaseMeta, ModuleTemplate, SKR_FIELD_MANAGER,
};
use catalogsync::catalog::render::{copy_matches, is_subset};
use catalogsync::sync::executor::SkrCrds;
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, Client, CustomResourceExt as _, ResourceExt};
use serde_json::{Value, json};

use super::admin::SimAdmin;
use super::{Faults, MARK_ANNOTATION};

/// `fleet sim-check` flags.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// HTTPS URL of the simulator's SKR API, such as `https://127.0.0.1:6443`.
    #[arg(long, env = "FLEET_SIM_URL")]
    pub url: http::Uri,
    /// PEM file of the CA that signed the simulator's serving certificate.
    #[arg(long, env = "FLEET_SIM_CA")]
    pub ca: PathBuf,
    /// Address of the simulator's admin API.
    #[arg(long, env = "FLEET_SIM_ADMIN")]
    pub admin: SocketAddr,
    /// After the checks, fill this many SKRs with the same ModuleTemplates (namespace and CRDs
    /// first); 0 skips the load phase.
    #[arg(long, default_value_t = 0, help_heading = "Load")]
    pub load_skrs: usize,
    /// ModuleTemplates per SKR in the load phase.
    #[arg(long, default_value_t = 75, help_heading = "Load")]
    pub load_objects: usize,
    /// Approximate size of each load ModuleTemplate, in KB.
    #[arg(long, default_value_t = 30, help_heading = "Load")]
    pub load_object_kb: usize,
    /// Tokens of the load SKRs are `<prefix>-0`, `<prefix>-1`, ...
    #[arg(long, default_value = "load", help_heading = "Load")]
    pub load_token_prefix: String,
    /// Metadata lists of ModuleTemplates to run, round-robin over the first 200 load SKRs.
    #[arg(long, default_value_t = 0, help_heading = "Load")]
    pub load_lists: usize,
    /// Load requests in flight at once.
    #[arg(long, default_value_t = 32, help_heading = "Load")]
    pub load_concurrency: usize,
}

/// Namespace the checks write ModuleTemplates into (not `kyma-system`, so seeded copies do not
/// disturb the counts).
const CHECK_NS: &str = "fleet-check";
/// Namespace of the load phase (what catalogsync uses).
const LOAD_NS: &str = "kyma-system";

/// Runs every check against a running simulator.
///
/// # Errors
/// When a check fails (after all have run) or the CA cannot be read.
pub async fn check(args: CheckArgs) -> Result<()> {
    let ca = read_ca(&args.ca)?;
    let sim = Sim { url: args.url.clone(), ca, admin: SimAdmin::new(args.admin) };
    let mut report = Report::default();
    run_checks(&sim, &mut report).await;
    println!("{} passed, {} failed", report.passed, report.failed);
    if report.failed > 0 {
        bail!("{} simulator checks failed", report.failed);
    }
    if args.load_skrs > 0 {
        load(&sim, &args).await?;
    }
    Ok(())
}

struct Sim {
    url: http::Uri,
    ca: Vec<Vec<u8>>,
    admin: SimAdmin,
}

impl Sim {
    /// A kube client for the SKR of `token` (no token: anonymous). Retries are off, so every
    /// call is exactly one request.
    fn client(&self, token: Option<&str>) -> Result<Client> {
        let mut config = kube::Config::new(self.url.clone());
        config.root_cert = Some(self.ca.clone());
        config.auth_info.token = token.map(|t| t.to_owned().into());
        config.default_retry = false;
        Client::try_from(config).context("failed to build a kube client")
    }
}

fn read_ca(path: &std::path::Path) -> Result<Vec<Vec<u8>>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("failed to read {}", path.display()))?
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("failed to parse {}", path.display()))?;
    ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

#[derive(Default)]
struct Report {
    passed: usize,
    failed: usize,
}

impl Report {
    fn record(&mut self, name: &str, result: Result<()>) {
        match result {
            Ok(()) => {
                self.passed += 1;
                println!("PASS {name}");
            }
            Err(err) => {
                self.failed += 1;
                println!("FAIL {name}: {err:#}");
            }
        }
    }
}

/// Requests made through token A, counted by stats key, to compare with the simulator's.
#[derive(Default)]
struct Expected {
    requests: BTreeMap<&'static str, u64>,
    writes: u64,
    changed_writes: u64,
}

impl Expected {
    fn read(&mut self, key: &'static str) {
        *self.requests.entry(key).or_default() += 1;
    }

    fn write(&mut self, key: &'static str, changed: bool) {
        self.read(key);
        self.writes += 1;
        self.changed_writes += u64::from(changed);
    }
}

fn api_error(err: &kube::Error) -> Option<(u16, &str)> {
    match err {
        kube::Error::Api(s) => Some((s.code, s.reason.as_str())),
        _ => None,
    }
}

fn expect_error<T: std::fmt::Debug>(result: kube::Result<T>, code: u16, reason: &str) -> Result<()> {
    match result {
        Err(err) if api_error(&err) == Some((code, reason)) => Ok(()),
        other => Err(anyhow!("expected {code} {reason}, got {other:?}")),
    }
}

fn mt_resource() -> ApiResource {
    catalogsync::catalog::CatalogKind::ModuleTemplate.api_resource()
}

fn mrm_resource() -> ApiResource {
    catalogsync::catalog::CatalogKind::ModuleReleaseMeta.api_resource()
}

/// An SKR copy as catalogsync renders it, with a descriptor of about `kb` KB.
fn mt_payload(name: &str, namespace: &str, kb: usize, mark: Option<&str>) -> Value {
    let resources: Vec<Value> = (0..kb * 5)
        .map(|j| {
            json!({
                "name": format!("resource-{j:04}"),
                "version": "1.2.3",
                "access": {"type": "ociArtifact", "imageReference": format!("europe-docker.pkg.dev/kyma-project/prod/{name}/image-{j:04}:1.2.3")},
            })
        })
        .collect();
    let mut payload = json!({
        "apiVersion": "operator.kyma-project.io/v1beta2",
        "kind": "ModuleTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE, "operator.kyma-project.io/module-name": "check"},
        },
        "spec": {
            "moduleName": "check",
            "version": "1.2.3",
            "descriptor": {"component": {"name": format!("kyma-project.io/module/{name}"), "resources": resources}},
        },
    });
    if let Some(mark) = mark {
        payload["metadata"]["annotations"] = json!({MARK_ANNOTATION: mark});
    }
    payload
}

fn apply_params() -> PatchParams {
    PatchParams::apply(SKR_FIELD_MANAGER).force()
}

fn is_managed(obj: &DynamicObject) -> bool {
    obj.metadata.managed_fields.iter().flatten().any(|f| f.manager.as_deref() == Some(SKR_FIELD_MANAGER))
}

/// The namespace body the executor applies.
fn namespace_body(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
    })
}

/// Applies both catalog CRDs and the check namespace to an SKR.
async fn install(client: &Client, expected: &mut Expected) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [ModuleTemplate::crd(), ModuleReleaseMeta::crd()] {
        let body = SkrCrds::render(&crd);
        let name = crd.name_any();
        let applied = crds.patch(&name, &apply_params(), &Patch::Apply(&body)).await?;
        expected.write("apply customresourcedefinitions", true);
        ensure!(applied.name_any() == name, "applied CRD is named {}", applied.name_any());
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.patch(CHECK_NS, &apply_params(), &Patch::Apply(&namespace_body(CHECK_NS))).await?;
    expected.write("apply namespaces", true);
    Ok(())
}

async fn run_checks(sim: &Sim, report: &mut Report) {
    let tag = format!("{}-{}", std::process::id(), crate::stats::unix_ms() % 1_000_000);
    let token_a = format!("check-{tag}-a");
    let token_b = format!("check-{tag}-b");
    let setup = async {
        sim.admin.set_faults(&Faults::default()).await?;
        sim.admin.reset().await?;
        Ok::<_, anyhow::Error>((sim.client(Some(&token_a))?, sim.client(Some(&token_b))?))
    };
    let (a, b) = match setup.await {
        Ok(clients) => clients,
        Err(err) => return report.record("setup (admin reachable, clients built)", Err(err)),
    };
    let mut expected = Expected::default();
    let e = &mut expected;

    report.record("401 without a token", unauthorized(sim).await);
    report.record("namespace: get_metadata_opt, apply, get_metadata_opt", namespace(&a, e).await);
    report.record("catalog kinds are 404 before their CRDs exist", not_served(&a, e).await);
    report.record("CRDs: apply, await established, round trip, fieldSelector list", crds(&a, e).await);
    report.record("watch: ADDED event, stream ends at timeout", watch(&a).await);
    report.record("Kymas: served after their CRD; status and the rest written apart", kymas(&a, e).await);
    let mt = format!("check-mt-{tag}");
    let result = module_templates(&a, &mt, e).await;
    report.record("MTs: list, apply, no-op apply keeps rv, changes bump rv and generation", result);
    report.record("MTs: list and list_metadata show the copy as managed", lists(&a, &mt, e).await);
    report.record("MTs: replace with stale rv is 409, with current rv succeeds", replace(&a, &mt, e).await);
    report.record("MTs: create existing is 409 AlreadyExists, create new succeeds", create(&a, &mt, e).await);
    report.record("MTs: delete, then get is None and delete is 404", delete(&a, &mt, e).await);
    report.record("MTs and MRMs: list across namespaces", all_namespaces(&a, &mt, e).await);
    report.record("tokens see separate SKRs", separate(sim, &b, [&token_a, &token_b], &mt, e).await);
    report.record("stats count what was done", stats(sim, &token_a, e).await);
    report.record("marks: who holds which mark value since when", marks(sim, &a, &b, &tag).await);
    report.record("faults: error rate 1 gives 500 InternalError", error_rate(sim, &a).await);
    report.record("faults: a down SKR answers 503, others do not", down(sim, &a, &b, &token_a).await);
    report.record("faults: latency is added and excluded from service time", latency(sim, &b).await);
    if let Err(err) = sim.admin.set_faults(&Faults::default()).await {
        report.record("faults cleared", Err(err));
    }
}

async fn unauthorized(sim: &Sim) -> Result<()> {
    let api: Api<Namespace> = Api::all(sim.client(None)?);
    expect_error(api.get_opt(CHECK_NS).await, 401, "Unauthorized")
}

async fn namespace(a: &Client, e: &mut Expected) -> Result<()> {
    let api: Api<Namespace> = Api::all(a.clone());
    let before = api.get_metadata_opt(CHECK_NS).await?;
    e.read("get-meta namespaces");
    ensure!(before.is_none(), "a fresh SKR already holds namespace {CHECK_NS}");
    let applied = api.patch(CHECK_NS, &apply_params(), &Patch::Apply(&namespace_body(CHECK_NS))).await?;
    e.write("apply namespaces", true);
    ensure!(applied.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE), "label lost");
    let after = api.get_metadata_opt(CHECK_NS).await?.context("namespace absent after apply")?;
    e.read("get-meta namespaces");
    ensure!(after.metadata.resource_version == applied.metadata.resource_version, "rv differs between get and apply");
    let again = api.patch(CHECK_NS, &apply_params(), &Patch::Apply(&namespace_body(CHECK_NS))).await?;
    e.write("apply namespaces", false);
    ensure!(again.metadata.resource_version == applied.metadata.resource_version, "no-op apply changed rv");
    Ok(())
}

async fn not_served(a: &Client, e: &mut Expected) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(a.clone());
    if crds.get_opt(ModuleTemplate::crd_name()).await?.is_some() {
        e.read("get customresourcedefinitions");
        return Ok(()); // seeded: nothing to check
    }
    e.read("get customresourcedefinitions");
    let mts: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &mt_resource());
    let result = mts.list(&ListParams::default()).await;
    e.read("list moduletemplates");
    expect_error(result, 404, "NotFound")
}

async fn crds(a: &Client, e: &mut Expected) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(a.clone());
    for crd in [ModuleTemplate::crd(), ModuleReleaseMeta::crd()] {
        let name = crd.name_any();
        let body = SkrCrds::render(&crd);
        // A seed may already hold the same CRD; then the apply is a no-op.
        let before = api.get_opt(&name).await?;
        e.read("get customresourcedefinitions");
        let applied = api.patch(&name, &apply_params(), &Patch::Apply(&body)).await?;
        let changed = before.is_none_or(|b| b.resource_version() != applied.resource_version());
        e.write("apply customresourcedefinitions", changed);
        let cond = kube::runtime::conditions::is_crd_established();
        tokio::time::timeout(Duration::from_secs(10), kube::runtime::wait::await_condition(api.clone(), &name, cond))
            .await
            .context("CRD not established within 10 s")??;
        let have = api.get_opt(&name).await?.context("CRD absent after apply")?;
        e.read("get customresourcedefinitions");
        let have = serde_json::to_value(&have)?;
        ensure!(is_subset(&body["spec"], &have["spec"]), "CRD spec does not round-trip");
        ensure!(is_subset(&body["metadata"]["labels"], &have["metadata"]["labels"]), "CRD labels do not round-trip");
        // Not counted: await_condition lists the same way.
        let listed = api.list(&ListParams::default().fields(&format!("metadata.name={name}"))).await?;
        ensure!(listed.items.len() == 1, "fieldSelector list gave {} items", listed.items.len());
        api.patch(&name, &apply_params(), &Patch::Apply(&body)).await?;
        e.write("apply customresourcedefinitions", false);
    }
    Ok(())
}

async fn watch(a: &Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(a.clone());
    let name = ModuleTemplate::crd_name();
    let started = Instant::now();
    let wp = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(1);
    let events: Vec<WatchEvent<CustomResourceDefinition>> =
        tokio::time::timeout(Duration::from_secs(8), api.watch(&wp, "0").await?.try_collect()).await??;
    ensure!(events.len() == 1, "expected one event, got {}", events.len());
    ensure!(matches!(&events[0], WatchEvent::Added(crd) if crd.name_any() == name), "expected ADDED {name}");
    let took = started.elapsed();
    ensure!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "watch lasted {took:?}");
    Ok(())
}

/// What lifecycle-manager's Kyma reconcile does to the SKR Kyma: its CRD applied, then a
/// create, a get, a status replace (stale and current) and a metadata apply.
async fn kymas(a: &Client, e: &mut Expected) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &ApiResource::erase::<Kyma>(&()));
    let crds: Api<CustomResourceDefinition> = Api::all(a.clone());
    let before = crds.get_opt(Kyma::crd_name()).await?;
    e.read("get customresourcedefinitions");
    if before.is_none() {
        expect_error(api.get("default").await, 404, "NotFound")?;
        e.read("get kymas");
    }
    let applied = crds.patch(Kyma::crd_name(), &apply_params(), &Patch::Apply(SkrCrds::render(&Kyma::crd()))).await?;
    let changed = before.is_none_or(|b| b.resource_version() != applied.resource_version());
    e.write("apply customresourcedefinitions", changed);

    let body = json!({"apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Kyma",
                      "metadata": {"name": "default", "namespace": CHECK_NS},
                      "spec": {"channel": "regular"}, "status": {"state": "Processing"}});
    let created = api.create(&PostParams::default(), &serde_json::from_value(body)?).await?;
    e.write("create kymas", true);
    ensure!(created.data.get("status").is_none(), "a create kept the status");
    let mut got = api.get("default").await?;
    e.read("get kymas");
    let stale = got.clone();
    got.data["status"] = json!({"state": "Ready"});
    let replaced = api.replace_status("default", &PostParams::default(), &got).await?;
    e.write("replace-status kymas", true);
    ensure!(replaced.data["status"]["state"] == "Ready", "status not replaced");
    ensure!(replaced.resource_version() != got.resource_version(), "status replace kept the rv");
    let result = api.replace_status("default", &PostParams::default(), &stale).await;
    expect_error(result, 409, "Conflict")?;
    e.write("replace-status kymas", false);

    let metadata = json!({"apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Kyma",
                          "metadata": {"name": "default", "namespace": CHECK_NS, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}}});
    let params = PatchParams::apply("kyma-sync-context").force();
    let labelled = api.patch("default", &params, &Patch::Apply(&metadata)).await?;
    e.write("apply kymas", true);
    ensure!(labelled.labels().get(MANAGED_BY_LABEL).is_some(), "label not applied");
    ensure!(labelled.data["spec"]["channel"] == "regular", "a metadata apply dropped the spec");
    ensure!(labelled.data["status"]["state"] == "Ready", "a metadata apply dropped the status");
    let again = api.patch("default", &params, &Patch::Apply(&metadata)).await?;
    e.write("apply kymas", false);
    ensure!(again.resource_version() == labelled.resource_version(), "a no-op apply changed the rv");
    Ok(())
}

async fn module_templates(a: &Client, mt: &str, e: &mut Expected) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &mt_resource());
    let listed = api.list(&ListParams::default()).await?;
    e.read("list moduletemplates");
    ensure!(listed.items.is_empty(), "fresh namespace holds {} MTs", listed.items.len());
    ensure!(listed.metadata.resource_version.is_some_and(|rv| !rv.is_empty()), "list has no resourceVersion");
    let meta = api.list_metadata(&ListParams::default()).await?;
    e.read("list-meta moduletemplates");
    ensure!(meta.items.is_empty() && meta.metadata.resource_version.is_some(), "metadata list wrong");

    let payload = mt_payload(mt, CHECK_NS, 30, Some("v0"));
    let first = api.patch(mt, &apply_params(), &Patch::Apply(&payload)).await?;
    e.write("apply moduletemplates", true);
    ensure!(copy_matches(&payload, &serde_json::to_value(&first)?), "applied copy does not match the payload");
    ensure!(is_managed(&first), "no {SKR_FIELD_MANAGER} managedFields entry");
    ensure!(first.metadata.generation == Some(1), "generation {:?}", first.metadata.generation);
    let rv1 = first.resource_version().context("no resourceVersion")?;

    let again = api.patch(mt, &apply_params(), &Patch::Apply(&payload)).await?;
    e.write("apply moduletemplates", false);
    ensure!(again.resource_version().as_deref() == Some(rv1.as_str()), "no-op apply changed the rv");
    ensure!(again.metadata.managed_fields == first.metadata.managed_fields, "no-op apply changed managedFields");

    let marked = mt_payload(mt, CHECK_NS, 30, Some("v1"));
    let changed = api.patch(mt, &apply_params(), &Patch::Apply(&marked)).await?;
    e.write("apply moduletemplates", true);
    let rv2 = changed.resource_version().context("no resourceVersion")?;
    ensure!(rv2 != rv1, "annotation change kept the rv");
    ensure!(changed.metadata.generation == Some(1), "metadata change bumped the generation");
    ensure!(copy_matches(&marked, &serde_json::to_value(&changed)?), "changed copy does not match");

    let mut respec = marked.clone();
    respec["spec"]["version"] = json!("1.2.4");
    let respecced = api.patch(mt, &apply_params(), &Patch::Apply(&respec)).await?;
    e.write("apply moduletemplates", true);
    ensure!(
        respecced.metadata.generation == Some(2),
        "spec change gave generation {:?}",
        respecced.metadata.generation
    );
    let got = api.get(mt).await?;
    e.read("get moduletemplates");
    ensure!(copy_matches(&respec, &serde_json::to_value(&got)?), "get does not return the applied copy");
    Ok(())
}

async fn lists(a: &Client, mt: &str, e: &mut Expected) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &mt_resource());
    let listed = api.list(&ListParams::default()).await?;
    e.read("list moduletemplates");
    ensure!(listed.items.len() == 1 && listed.items[0].name_any() == mt, "list gave {} items", listed.items.len());
    ensure!(is_managed(&listed.items[0]), "listed copy is not managed");
    let meta = api.list_metadata(&ListParams::default()).await?;
    e.read("list-meta moduletemplates");
    ensure!(meta.items.len() == 1 && meta.items[0].metadata.name.as_deref() == Some(mt), "metadata list wrong");
    let managed =
        meta.items[0].metadata.managed_fields.iter().flatten().any(|f| f.manager.as_deref() == Some(SKR_FIELD_MANAGER));
    ensure!(managed, "metadata list lacks managedFields");
    ensure!(
        meta.items[0].metadata.resource_version == listed.items[0].metadata.resource_version,
        "list and metadata list disagree on the rv"
    );
    let single = api.get_metadata_opt(mt).await?.context("get_metadata_opt gave None")?;
    e.read("get-meta moduletemplates");
    ensure!(single.metadata.name.as_deref() == Some(mt), "get_metadata_opt wrong");
    Ok(())
}

async fn replace(a: &Client, mt: &str, e: &mut Expected) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &mt_resource());
    let current = api.get(mt).await?;
    e.read("get moduletemplates");
    let rv = current.resource_version().context("no rv")?;
    let mut body = mt_payload(mt, CHECK_NS, 30, Some("v1"));
    body["metadata"]["resourceVersion"] = json!("1");
    let stale: DynamicObject = serde_json::from_value(body.clone())?;
    let params = PostParams { field_manager: Some(SKR_FIELD_MANAGER.to_owned()), ..PostParams::default() };
    expect_error(api.replace(mt, &params, &stale).await, 409, "Conflict")?;
    e.write("replace moduletemplates", false);
    body["metadata"]["resourceVersion"] = json!(rv);
    let fresh: DynamicObject = serde_json::from_value(body.clone())?;
    let replaced = api.replace(mt, &params, &fresh).await?;
    e.write("replace moduletemplates", true);
    ensure!(replaced.resource_version() != Some(rv), "replace kept the rv");
    ensure!(copy_matches(&body, &serde_json::to_value(&replaced)?), "replaced copy does not match");
    let updated = replaced.metadata.managed_fields.iter().flatten().any(|f| f.operation.as_deref() == Some("Update"));
    ensure!(updated, "no Update managedFields entry after replace");
    Ok(())
}

async fn create(a: &Client, mt: &str, e: &mut Expected) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &mt_resource());
    let existing: DynamicObject = serde_json::from_value(mt_payload(mt, CHECK_NS, 1, None))?;
    expect_error(api.create(&PostParams::default(), &existing).await, 409, "AlreadyExists")?;
    e.write("create moduletemplates", false);
    let name = format!("{mt}-created");
    let fresh: DynamicObject = serde_json::from_value(mt_payload(&name, CHECK_NS, 1, None))?;
    let created = api.create(&PostParams::default(), &fresh).await?;
    e.write("create moduletemplates", true);
    ensure!(created.name_any() == name && created.resource_version().is_some(), "created object wrong");
    Ok(())
}

async fn delete(a: &Client, mt: &str, e: &mut Expected) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &mt_resource());
    let name = format!("{mt}-created");
    let deleted = api.delete(&name, &DeleteParams::default()).await?;
    e.write("delete moduletemplates", true);
    ensure!(deleted.left().is_some_and(|o| o.name_any() == name), "delete did not return the object");
    ensure!(api.get_opt(&name).await?.is_none(), "deleted object still there");
    e.read("get moduletemplates");
    expect_error(api.delete(&name, &DeleteParams::default()).await, 404, "NotFound")?;
    e.write("delete moduletemplates", false);
    Ok(())
}

async fn all_namespaces(a: &Client, mt: &str, e: &mut Expected) -> Result<()> {
    let mts: Api<DynamicObject> = Api::all_with(a.clone(), &mt_resource());
    let listed = mts.list(&ListParams::default()).await?;
    e.read("list moduletemplates");
    // Seeded copies live in other namespaces; only ours must be exactly the one MT.
    let ours: Vec<&DynamicObject> =
        listed.items.iter().filter(|o| o.namespace().as_deref() == Some(CHECK_NS)).collect();
    let names: Vec<String> = ours.iter().map(|o| o.name_any()).collect();
    ensure!(names == [mt], "MTs of {CHECK_NS} across namespaces: {names:?}");
    let mrms: Api<DynamicObject> = Api::all_with(a.clone(), &mrm_resource());
    let mrm_list = mrms.list_metadata(&ListParams::default()).await?;
    e.read("list-meta modulereleasemetas");
    ensure!(mrm_list.items.iter().all(|o| o.metadata.namespace.as_deref() != Some(CHECK_NS)), "MRMs present");
    Ok(())
}

async fn separate(sim: &Sim, b: &Client, [token_a, token_b]: [&str; 2], mt: &str, e: &mut Expected) -> Result<()> {
    let api: Api<Namespace> = Api::all(b.clone());
    let seen = api.get_metadata_opt(CHECK_NS).await?;
    e.read("get-meta namespaces");
    ensure!(seen.is_none(), "SKR B sees A's namespace");
    let of_a = sim.admin.objects(token_a, "moduletemplates").await?;
    ensure!(of_a.iter().any(|n| n == mt) && of_a.is_sorted(), "admin objects of A: {of_a:?}");
    ensure!(!sim.admin.objects(token_b, "moduletemplates").await?.iter().any(|n| n == mt), "B holds A's MT");
    ensure!(sim.admin.objects("no-such-token", "moduletemplates").await.is_err(), "unknown token not an error");
    Ok(())
}

async fn stats(sim: &Sim, token_a: &str, e: &Expected) -> Result<()> {
    let stats = sim.admin.stats(true).await?;
    for (key, want) in &e.requests {
        let have = stats.requests.get(*key).copied().unwrap_or_default();
        ensure!(have == *want, "{key}: {have} requests counted, {want} made");
        let timed = stats.service_us.get(*key).map(|p| p.count).unwrap_or_default();
        ensure!(timed == *want, "{key}: {timed} service times, {want} requests");
    }
    let per_skr = stats.per_skr.as_ref().context("no per_skr")?;
    let a = per_skr.get(token_a).context("SKR A missing from per_skr")?;
    ensure!(a.writes == e.writes, "SKR A: {} writes counted, {} made", a.writes, e.writes);
    ensure!(
        a.changed_writes == e.changed_writes,
        "SKR A: {} changed writes, {} expected",
        a.changed_writes,
        e.changed_writes
    );
    let made: u64 = e.requests.values().sum();
    ensure!(a.requests >= made, "SKR A: {} requests counted, at least {made} made", a.requests);
    ensure!(stats.writes == e.writes && stats.changed_writes == e.changed_writes, "global write counts differ");
    ensure!(stats.skrs >= 2 && stats.total_requests >= made, "totals too small");
    ensure!(stats.injected_errors == 0, "injected errors without faults");
    Ok(())
}

async fn marks(sim: &Sim, a: &Client, b: &Client, tag: &str) -> Result<()> {
    let name = format!("check-mark-{tag}");
    install(b, &mut Expected::default()).await?;
    let before = crate::stats::unix_ms();
    for client in [a, b] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), CHECK_NS, &mt_resource());
        api.patch(&name, &apply_params(), &Patch::Apply(&mt_payload(&name, CHECK_NS, 2, Some("v1")))).await?;
    }
    let after = crate::stats::unix_ms();
    let m = sim.admin.marks("moduletemplates", &name, Some("v1")).await?;
    ensure!(m.holding == 2 && m.skrs >= 2, "v1: {m:?}");
    ensure!(m.first_held_unix_ms.iter().all(|t| (before..=after).contains(t)), "v1 times outside the window: {m:?}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let api: Api<DynamicObject> = Api::namespaced_with(a.clone(), CHECK_NS, &mt_resource());
    let changed_at = crate::stats::unix_ms();
    api.patch(&name, &apply_params(), &Patch::Apply(&mt_payload(&name, CHECK_NS, 2, Some("v2")))).await?;
    let v2 = sim.admin.marks("moduletemplates", &name, Some("v2")).await?;
    ensure!(v2.holding == 1 && v2.first_held_unix_ms[0] >= changed_at, "v2: {v2:?}");
    let v1 = sim.admin.marks("moduletemplates", &name, Some("v1")).await?;
    ensure!(v1.holding == 1, "v1 after change: {v1:?}");
    let any = sim.admin.marks("moduletemplates", &name, None).await?;
    ensure!(any.holding == 2, "any: {any:?}");
    ensure!(sim.admin.marks("pods", &name, None).await.is_err(), "unknown resource not an error");
    Ok(())
}

async fn error_rate(sim: &Sim, a: &Client) -> Result<()> {
    sim.admin.set_faults(&Faults { error_rate: 1.0, ..Faults::default() }).await?;
    let api: Api<Namespace> = Api::all(a.clone());
    let result = expect_error(api.get_metadata_opt(CHECK_NS).await, 500, "InternalError");
    sim.admin.set_faults(&Faults::default()).await?;
    result?;
    ensure!(sim.admin.stats(false).await?.injected_errors >= 1, "injected error not counted");
    ensure!(api.get_metadata_opt(CHECK_NS).await?.is_some(), "error persists after clearing faults");
    Ok(())
}

async fn down(sim: &Sim, a: &Client, b: &Client, token_a: &str) -> Result<()> {
    sim.admin.set_faults(&Faults { down: vec![token_a.to_owned()], ..Faults::default() }).await?;
    let on_a = Api::<Namespace>::all(a.clone()).get_metadata_opt(CHECK_NS).await;
    let on_b = Api::<Namespace>::all(b.clone()).get_metadata_opt(CHECK_NS).await;
    sim.admin.set_faults(&Faults::default()).await?;
    expect_error(on_a, 503, "ServiceUnavailable")?;
    ensure!(on_b?.is_some(), "SKR B lost its namespace");
    Ok(())
}

async fn latency(sim: &Sim, b: &Client) -> Result<()> {
    let api: Api<Namespace> = Api::all(b.clone());
    api.get_metadata_opt(CHECK_NS).await?; // warm the connection
    sim.admin.set_faults(&Faults { latency_ms: 50.0, ..Faults::default() }).await?;
    sim.admin.reset().await?;
    let started = Instant::now();
    let result = api.get_metadata_opt(CHECK_NS).await;
    let took = started.elapsed();
    sim.admin.set_faults(&Faults::default()).await?;
    result?;
    ensure!(took >= Duration::from_millis(50), "request took {took:?}");
    let stats = sim.admin.stats(false).await?;
    let service = stats.service_us.get("get-meta namespaces").context("no service time")?;
    ensure!(service.count == 1 && service.max < 50_000.0, "service time includes the latency: {service:?}");
    Ok(())
}

/// Fills `--load-skrs` SKRs and lists them; prints timings.
async fn load(sim: &Sim, args: &CheckArgs) -> Result<()> {
    let payloads: Vec<Value> = (0..args.load_objects)
        .map(|i| mt_payload(&format!("load-{i:03}"), LOAD_NS, args.load_object_kb, None))
        .collect();
    let started = Instant::now();
    stream::iter(0..args.load_skrs)
        .map(|i| {
            let payloads = &payloads;
            async move {
                let client = sim.client(Some(&format!("{}-{i}", args.load_token_prefix)))?;
                let namespaces: Api<Namespace> = Api::all(client.clone());
                namespaces.patch(LOAD_NS, &apply_params(), &Patch::Apply(&namespace_body(LOAD_NS))).await?;
                let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
                for crd in [ModuleTemplate::crd(), ModuleReleaseMeta::crd()] {
                    crds.patch(&crd.name_any(), &apply_params(), &Patch::Apply(&SkrCrds::render(&crd))).await?;
                }
                let api: Api<DynamicObject> = Api::namespaced_with(client, LOAD_NS, &mt_resource());
                for payload in payloads {
                    let name = payload["metadata"]["name"].as_str().unwrap_or_default();
                    api.patch(name, &apply_params(), &Patch::Apply(payload)).await?;
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(args.load_concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    println!(
        "LOAD filled {} SKRs with {} MTs of ~{} KB in {:.1?}",
        args.load_skrs,
        args.load_objects,
        args.load_object_kb,
        started.elapsed()
    );
    if args.load_lists > 0 {
        let tokens = args.load_skrs.min(200);
        let clients: Vec<Client> =
            (0..tokens).map(|i| sim.client(Some(&format!("{}-{i}", args.load_token_prefix)))).collect::<Result<_>>()?;
        let started = Instant::now();
        let items: usize = stream::iter(0..args.load_lists)
            .map(|i| {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(clients[i % tokens].clone(), LOAD_NS, &mt_resource());
                async move { api.list_metadata(&ListParams::default()).await.map(|l| l.items.len()) }
            })
            .buffer_unordered(args.load_concurrency.max(1))
            .try_fold(0, |acc, n| async move { Ok(acc + n) })
            .await?;
        let took = started.elapsed();
        println!("LOAD {} metadata lists over {tokens} SKRs ({items} items) in {took:.1?}", args.load_lists);
    }
    let stats = sim.admin.stats(false).await?;
    println!("LOAD stats: {}", serde_json::to_string(&stats)?);
    Ok(())
}
