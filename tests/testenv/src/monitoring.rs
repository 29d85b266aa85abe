//! What `deploy/monitoring` holds, in the forms the tools that check it read: the
//! PrometheusRule's rule groups as a Prometheus rule file, its alerts, and the Grafana
//! dashboard's queries as plain PromQL (Grafana's variables replaced by values), so that
//! `promtool` and a real Prometheus ([`super::prometheus`]) can evaluate them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::docs::read;
use super::kustomize::{kustomize_build, the};

/// The Grafana dashboard.
pub const DASHBOARD: &str = "deploy/monitoring/dashboard.json";
/// The `promtool test rules` unit tests of the alerts, one file per alert. They read the rule
/// file as [`RULE_FILE`] from their own directory.
pub const ALERT_TESTS_DIR: &str = "tests/monitoring";
/// The name the unit tests give the rule file made of the PrometheusRule's `spec`.
pub const RULE_FILE: &str = "catalogsync-rules.yaml";
/// Environment variable naming the dashboard checker of `hack/dashboard-check/`
/// (`eval "$(hack/dashboard-check.sh)"` sets it).
pub const DASHBOARD_CHECK_ENV: &str = "DASHBOARD_CHECK";
/// Labels a scrape adds to every series: Prometheus' `job` and `instance`, and what the
/// Prometheus Operator adds for a ServiceMonitor's targets.
pub const SCRAPE_LABELS: &[&str] = &["job", "instance", "namespace", "pod", "service", "container", "endpoint"];

/// The PrometheusRule of `deploy/monitoring`, as kustomize renders it.
///
/// # Panics
/// When it does not render (see [`kustomize_build`]) or holds no single PrometheusRule.
pub fn prometheus_rule() -> Value {
    the(&kustomize_build("deploy/monitoring"), "PrometheusRule").clone()
}

/// A PrometheusRule's `spec` (its `groups:`) as a Prometheus rule file. JSON, which
/// Prometheus and promtool read as the YAML it is a subset of.
pub fn rule_file(prometheus_rule: &Value) -> String {
    serde_json::to_string_pretty(&prometheus_rule["spec"]).unwrap_or_else(|e| panic!("a JSON value serialises: {e}"))
}

/// Every rule of a PrometheusRule, over all groups.
pub fn rules(prometheus_rule: &Value) -> Vec<Value> {
    let groups = prometheus_rule["spec"]["groups"].as_array().map_or(&[][..], Vec::as_slice);
    groups.iter().flat_map(|g| g["rules"].as_array().map_or(&[][..], Vec::as_slice)).cloned().collect()
}

/// The alerting rules of a PrometheusRule, by alert name.
pub fn alerts(prometheus_rule: &Value) -> BTreeMap<String, Value> {
    rules(prometheus_rule).into_iter().filter_map(|r| Some((r["alert"].as_str()?.to_owned(), r))).collect()
}

/// The dashboard JSON.
///
/// # Panics
/// When it cannot be read or is not JSON.
pub fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// The dashboard checker of `hack/dashboard-check/`: `$DASHBOARD_CHECK`.
///
/// # Errors
/// When it is not set or names no file; the message says how to build it.
pub fn dashboard_check_bin() -> Result<PathBuf> {
    let hint = "run `eval \"$(hack/dashboard-check.sh)\"` to build it (hack/test.sh does)";
    let path = std::env::var_os(DASHBOARD_CHECK_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .with_context(|| format!("{DASHBOARD_CHECK_ENV} is not set: {hint}"))?;
    anyhow::ensure!(path.is_file(), "{} (from {DASHBOARD_CHECK_ENV}) does not exist: {hint}", path.display());
    Ok(path)
}

/// One query of the dashboard: a panel target's `expr` or a query variable's query.
#[derive(Debug, Clone, PartialEq)]
pub struct DashboardQuery {
    /// Where it is: `panel 3 "Coordinator" A`, or `variable shard`.
    pub source: String,
    /// As written in the dashboard.
    pub expr: String,
    /// As Prometheus gets it: Grafana's variables replaced by values.
    pub promql: String,
}

/// Values for Grafana's built-in variables that can appear in a Prometheus query, as Grafana
/// would fill them in for a dashboard over the last hour at a one-minute step.
pub const BUILTIN_VARIABLES: &[(&str, &str)] = &[
    ("__rate_interval", "1m"),
    ("__interval", "1m"),
    ("__interval_ms", "60000"),
    ("__range", "1h"),
    ("__range_s", "3600"),
    ("__range_ms", "3600000"),
];

/// The value each variable of the dashboard gets in [`dashboard_queries`]: the built-ins of
/// [`BUILTIN_VARIABLES`], and for each templating variable its "All" value (`allValue`, else
/// `.*`) when it offers one, else its first option or current value.
pub fn dashboard_variables(dashboard: &Value) -> BTreeMap<String, String> {
    let mut values: BTreeMap<String, String> =
        BUILTIN_VARIABLES.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let list = dashboard["templating"]["list"].as_array().map_or(&[][..], Vec::as_slice);
    for var in list {
        let Some(name) = var["name"].as_str() else { continue };
        let value = if var["includeAll"] == true {
            var["allValue"].as_str().unwrap_or(".*").to_owned()
        } else if let Some(first) = var["options"].get(0) {
            first["value"].as_str().unwrap_or_default().to_owned()
        } else {
            var["current"]["value"].as_str().unwrap_or_default().to_owned()
        };
        values.insert(name.to_owned(), value);
    }
    values
}

/// `expr` with every Grafana variable reference (`$name`, `${name}`, `${name:format}`,
/// `[[name]]`) replaced by its value in `values`.
///
/// # Errors
/// When it references a variable `values` does not have.
pub fn substitute_variables(expr: &str, values: &BTreeMap<String, String>) -> Result<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(at) = rest.find(['$', '[']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let (name, len) = if let Some(braced) = tail.strip_prefix("${") {
            let end = braced.find('}').with_context(|| format!("unclosed ${{ in {expr}"))?;
            (braced[..end].split(':').next().unwrap_or_default(), end + 3)
        } else if let Some(bracketed) = tail.strip_prefix("[[") {
            let end = bracketed.find("]]").with_context(|| format!("unclosed [[ in {expr}"))?;
            (bracketed[..end].split(':').next().unwrap_or_default(), end + 4)
        } else if tail.starts_with('$') && tail[1..].starts_with(is_name) {
            let end = tail[1..].find(|c: char| !is_name(c)).unwrap_or(tail.len() - 1);
            (&tail[1..=end], end + 1)
        } else {
            // A `$` anchor in a regex, a range `[5m]`: not a variable.
            out.push_str(&tail[..1]);
            rest = &tail[1..];
            continue;
        };
        let value = values.get(name).with_context(|| format!("{expr} uses the unknown variable {name}"))?;
        out.push_str(value);
        rest = &tail[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The PromQL of a Grafana query variable: the series query of `label_values(<expr>,
/// <label>)` or `query_result(<expr>)`; `None` for `label_values(<label>)`, which queries no
/// series.
///
/// # Errors
/// For other functions of the Prometheus data source (`label_names()`, `metrics()`).
fn variable_promql(query: &str) -> Result<Option<String>> {
    let query = query.trim();
    if let Some(args) = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')) {
        return Ok(args.rsplit_once(',').map(|(expr, _label)| expr.trim().to_owned()));
    }
    if let Some(expr) = query.strip_prefix("query_result(").and_then(|q| q.strip_suffix(')')) {
        return Ok(Some(expr.trim().to_owned()));
    }
    bail!("query variable {query}: only label_values() and query_result() are understood")
}

/// Every query of the dashboard: each target's `expr` of each panel (rows' collapsed panels
/// included) and each query variable's series query, with [`dashboard_variables`]
/// substituted.
///
/// # Errors
/// When a query uses an unknown variable or a variable query is not understood.
pub fn dashboard_queries(dashboard: &Value) -> Result<Vec<DashboardQuery>> {
    let values = dashboard_variables(dashboard);
    let mut out = Vec::new();
    let list = dashboard["templating"]["list"].as_array().map_or(&[][..], Vec::as_slice);
    for var in list.iter().filter(|v| v["type"] == "query") {
        let name = var["name"].as_str().unwrap_or_default();
        let query = var["query"]["query"].as_str().or_else(|| var["query"].as_str()).unwrap_or_default();
        if let Some(expr) = variable_promql(query)? {
            let promql = substitute_variables(&expr, &values)?;
            out.push(DashboardQuery { source: format!("variable {name}"), expr, promql });
        }
    }
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().map_or(Vec::new(), |p| p.iter().collect());
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().map_or(&[][..], Vec::as_slice));
        for target in panel["targets"].as_array().map_or(&[][..], Vec::as_slice) {
            let Some(expr) = target["expr"].as_str() else { continue };
            let source =
                format!("panel {} {} {}", panel["id"], panel["title"], target["refId"].as_str().unwrap_or("?"));
            let promql = substitute_variables(expr, &values).with_context(|| source.clone())?;
            out.push(DashboardQuery { source, expr: expr.to_owned(), promql });
        }
    }
    out.sort_by(|a, b| a.source.cmp(&b.source));
    Ok(out)
}

/// A rule file with one recording rule per query (`dashboard_query_<i>`, in the order of
/// `queries`), for `promtool check rules` to parse each.
pub fn recording_rules(queries: &[DashboardQuery]) -> String {
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| json!({"record": format!("dashboard_query_{i}"), "expr": q.promql}))
        .collect();
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    serde_json::to_string_pretty(&file).unwrap_or_else(|e| panic!("a JSON value serialises: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> BTreeMap<String, String> {
        BTreeMap::from([("shard".to_owned(), ".*".to_owned()), ("__rate_interval".to_owned(), "1m".to_owned())])
    }

    #[test]
    fn every_form_of_a_variable_is_replaced_and_nothing_else() {
        let expr = r#"rate(x{shard=~"$shard", a=~"${shard}", b=~"${shard:regex}", c=~"[[shard]]", d=~"a$"}[$__rate_interval])[5m:]"#;
        assert_eq!(
            substitute_variables(expr, &vars()).expect("known variables"),
            r#"rate(x{shard=~".*", a=~".*", b=~".*", c=~".*", d=~"a$"}[1m])[5m:]"#
        );
        let err = substitute_variables("x{a=\"$shards\"}", &vars()).expect_err("unknown variable");
        assert!(format!("{err:#}").contains("shards"), "{err:#}");
    }

    #[test]
    fn variable_queries_yield_their_series_query() {
        let q = variable_promql("label_values(catalogsync_sync_runs_total{a=\"b\"}, shard)").expect("understood");
        assert_eq!(q.as_deref(), Some("catalogsync_sync_runs_total{a=\"b\"}"));
        assert_eq!(variable_promql("label_values(shard)").expect("understood"), None);
        assert_eq!(variable_promql("query_result(up)").expect("understood").as_deref(), Some("up"));
        assert!(variable_promql("metrics(catalogsync_.*)").is_err());
    }

    #[test]
    fn all_values_stand_for_multi_value_variables() {
        let dashboard = json!({"templating": {"list": [
            {"name": "shard", "type": "query", "includeAll": true, "allValue": ".+"},
            {"name": "pod", "type": "custom", "options": [{"value": "a"}, {"value": "b"}]},
        ]}});
        let values = dashboard_variables(&dashboard);
        assert_eq!(values["shard"], ".+");
        assert_eq!(values["pod"], "a");
        assert_eq!(values["__rate_interval"], "1m");
    }
}

/// Dashboard queries that may have no series while healthy replicas sync healthy SKRs, by
/// source (as [`dashboard_queries`] names them), with the reason.
pub const MAY_BE_EMPTY: &[(&str, &str)] = &[(
    "panel 17 \"Sync errors by shard\" A",
    "catalogsync_sync_errors_total has a series per reason only after that reason's first error (docs/metrics.md)",
)];

/// What [`check_live`] expects of the alerts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertsExpected {
    /// None pending or firing (a healthy installation).
    None,
    /// Any (the workload has a broken Kyma on purpose; the alerts' own tests are promtool's).
    Any,
}

/// Checks `deploy/monitoring` against a live Prometheus that scrapes the replicas in scrape
/// pool `job` with the PrometheusRule's rules loaded: waits (each wait bounded by `step`)
/// until at least `targets` targets of `job` are up and all of them have been scraped twice
/// from now on, and every rule group evaluated after that; then every rule of the
/// PrometheusRule must be loaded and evaluate without error, the alerts be as `expected`
/// says, and every dashboard query return series unless [`MAY_BE_EMPTY`] names it. Returns a
/// one-line summary.
///
/// # Errors
/// What is wrong, with what Prometheus answered.
pub async fn check_live(
    prometheus: &super::prometheus::Prometheus,
    job: &str,
    targets: usize,
    expected: AlertsExpected,
    step: std::time::Duration,
) -> Result<String> {
    let queries = dashboard_queries(&dashboard())?;
    for (source, _) in MAY_BE_EMPTY {
        anyhow::ensure!(
            queries.iter().any(|q| q.source == *source),
            "MAY_BE_EMPTY names {source}, which the dashboard lacks"
        );
    }
    let rule = prometheus_rule();

    // Two good scrapes of every target from now on, so that every rate over series created
    // recently (a shard's, when a replica takes it) has its two samples. Prometheus' clock.
    let now =
        || async { Ok::<_, anyhow::Error>(prometheus.query("time()").await?.first().context("no time()")?.time()) };
    let scraped_after = |after| async move {
        let all = prometheus.targets().await.ok()?;
        let pool: Vec<_> = all.iter().filter(|t| t.scrape_pool == job).collect();
        let oldest = pool.iter().map(|t| t.last_scrape_time()).min()??;
        (pool.len() >= targets && pool.iter().all(|t| t.health == "up") && oldest > after).then_some(oldest)
    };
    let what = format!("{targets} targets of {job} up and scraped");
    let start = now().await?;
    let first = match super::wait_until(step, &what, || scraped_after(start)).await {
        Ok(at) => at,
        Err(e) => bail!("{e:#}; targets: {:#?}", prometheus.targets().await),
    };
    super::wait_until(step, "a second scrape of each", || scraped_after(first)).await?;

    let evaluated_after = now().await?;
    let groups = super::wait_until(step, "every rule group to be evaluated with the scraped data", || async {
        let groups = prometheus.rule_groups().await.ok()?;
        groups.iter().all(|g| g.last_evaluation_time().is_some_and(|at| at > evaluated_after)).then_some(groups)
    })
    .await?;
    let want: std::collections::BTreeSet<&str> = rule["spec"]["groups"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    let loaded: std::collections::BTreeSet<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    anyhow::ensure!(loaded == want, "Prometheus loaded the rule groups {loaded:?}, the PrometheusRule has {want:?}");
    let loaded_alerts: std::collections::BTreeSet<&str> =
        groups.iter().flat_map(|g| &g.rules).map(|r| r.name.as_str()).collect();
    let alert_names = alerts(&rule);
    let want_alerts: std::collections::BTreeSet<&str> = alert_names.keys().map(String::as_str).collect();
    anyhow::ensure!(
        loaded_alerts == want_alerts,
        "Prometheus loaded the alerts {loaded_alerts:?}, want {want_alerts:?}"
    );
    for r in groups.iter().flat_map(|g| &g.rules) {
        anyhow::ensure!(
            r.health == "ok" && r.last_error.is_empty(),
            "{} does not evaluate: {} {}",
            r.name,
            r.health,
            r.last_error
        );
    }
    let active = prometheus.alerts().await?;
    if expected == AlertsExpected::None {
        anyhow::ensure!(active.is_empty(), "alerts in a healthy state: {active:#?}");
    }

    let allowed: BTreeMap<&str, &str> = MAY_BE_EMPTY.iter().copied().collect();
    let mut empty = Vec::new();
    let mut allowed_empty = Vec::new();
    for q in &queries {
        let series = prometheus.query(&q.promql).await.with_context(|| format!("{}: {}", q.source, q.promql))?;
        match (series.is_empty(), allowed.get(q.source.as_str())) {
            (true, Some(reason)) => allowed_empty.push(format!("{} (may be empty: {reason})", q.source)),
            (true, None) => empty.push(format!("{}: {}", q.source, q.promql)),
            (false, _) => {}
        }
    }
    if !empty.is_empty() {
        bail!(
            "dashboard queries without series:\n  {}\nseries scraped: {:?}",
            empty.join("\n  "),
            prometheus.query("count by (__name__) ({__name__=~\"catalogsync_.*\"})").await
        );
    }
    Ok(format!(
        "{} targets of {job} up; {} rule groups evaluate; {} alerts active; {} dashboard queries answered{}",
        targets,
        groups.len(),
        active.len(),
        queries.len() - allowed_empty.len(),
        if allowed_empty.is_empty() { String::new() } else { format!(", empty: {}", allowed_empty.join(", ")) }
    ))
}
