//! End-to-end sync against real apiservers: one KCP and two SKRs, catalogsync as a process
//! under the ServiceAccount identity and RBAC of `deploy/rbac/`.

mod common;

use std::time::Duration;

use common::scenario::{MRM, MT, Scenario, labelled, mrm, mt};

/// Catalog changes must arrive well within this, without a periodic resync.
const PROMPT: Duration = Duration::from_secs(15);
const BETA: &str = "operator.kyma-project.io/beta";
const INTERNAL: &str = "operator.kyma-project.io/internal";

/// A catalog with a plain, a beta, an internal and a mandatory module version.
fn sample_catalog() -> Vec<serde_json::Value> {
    vec![
        mt("api-gateway", "2.10.0"),
        mt("api-gateway", "2.11.0"),
        mrm("api-gateway", &[("regular", "2.10.0"), ("fast", "2.11.0")]),
        mt("btp-operator", "1.1.0"),
        labelled(mt("btp-operator", "1.2.0"), BETA, "true"),
        mrm("btp-operator", &[("regular", "1.1.0"), ("fast", "1.2.0")]),
        labelled(mt("serverless", "1.6.0"), INTERNAL, "true"),
        mrm("serverless", &[("experimental", "1.6.0")]),
        {
            let mut m = mt("istio", "1.20.0");
            m["spec"]["mandatory"] = serde_json::json!(true);
            m
        },
        {
            let mut m = mrm("istio", &[]);
            m["spec"].as_object_mut().map(|s| s.remove("channels"));
            m["spec"]["mandatory"] = serde_json::json!({"version": "1.20.0"});
            m
        },
    ]
}

#[tokio::test]
async fn new_kymas_get_their_filtered_catalog() {
    let env = common::env();
    let mut s = Scenario::new("filter").await.expect("scenario");
    s.apply_catalog(&sample_catalog()).await.expect("catalog");
    s.add_kyma("plain", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("beta", &env.skr_b, &[(BETA, "true")]).await.expect("kyma");
    s.start(&[]).expect("start");

    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "api-gateway-2.11.0", "btp-operator-1.1.0"], PROMPT)
        .await;
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "btp-operator"], PROMPT).await;
    s.await_skr_names(
        &env.skr_b,
        MT,
        &["api-gateway-2.10.0", "api-gateway-2.11.0", "btp-operator-1.1.0", "btp-operator-1.2.0"],
        PROMPT,
    )
    .await;
    s.await_skr_names(&env.skr_b, MRM, &["api-gateway", "btp-operator"], PROMPT).await;
    s.await_condition("plain", "True", "CatalogSynced", PROMPT).await;
    s.await_condition("beta", "True", "CatalogSynced", PROMPT).await;

    // The plain Kyma's btp-operator MRM lost its beta channel; the beta Kyma's kept it.
    let channels = |obj: kube::api::DynamicObject| obj.data["spec"]["channels"].clone();
    let plain = s.skr_api(&env.skr_a, MRM).get("btp-operator").await.expect("mrm");
    assert_eq!(channels(plain.clone()), serde_json::json!([{"channel": "regular", "version": "1.1.0"}]));
    let beta = s.skr_api(&env.skr_b, MRM).get("btp-operator").await.expect("mrm");
    assert_eq!(
        channels(beta),
        serde_json::json!([{"channel": "regular", "version": "1.1.0"}, {"channel": "fast", "version": "1.2.0"}])
    );
    assert_eq!(plain.labels().get("operator.kyma-project.io/managed-by").map(String::as_str), Some("kyma"));
    s.await_ready(PROMPT).await;
}

use kube::ResourceExt as _;
