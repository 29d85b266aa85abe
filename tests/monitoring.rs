//! `deploy/monitoring` checked by the tools that consume it:
//!
//! - `promtool check rules` on the PrometheusRule's rule groups, and `promtool test rules` on
//!   the unit tests of `tests/monitoring/`, which must cover every alert: firing (after its
//!   `for:`) with its rendered annotations, and staying silent below each threshold and when
//!   series are missing;
//! - the unit tests' input series, the alerts and the dashboard select only documented metrics
//!   and labels, with documented label values (`tests/deploy.rs` checks the metric names);
//! - the dashboard against Grafana's schema (`hack/dashboard-check/`), and every dashboard
//!   query, Grafana's variables filled in, through Prometheus' parser (`promtool check rules`);
//! - a real Prometheus scraping a catalogsync replica that syncs two SKRs, with the
//!   PrometheusRule's rules loaded: the target is up, every dashboard query returns series
//!   (or is listed in `testenv::monitoring::MAY_BE_EMPTY` with the reason), and no alert is pending or firing.
//!
//! promtool and prometheus come from `hack/prometheus.sh` (`hack/test.sh` runs it), the dashboard checker from `hack/dashboard-check.sh`. Outside CI a missing tool skips
//! its test with a note; in CI (`CI` set) it fails.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use testenv::docs::{DocRow, Matcher, documented_metrics, grouping_labels, read, repo_path, selectors};
use testenv::monitoring::{
    ALERT_TESTS_DIR, AlertsExpected, DASHBOARD, RULE_FILE, SCRAPE_LABELS, alerts, check_live, dashboard,
    dashboard_check_bin, dashboard_queries, prometheus_rule, recording_rules, rule_file,
};
use testenv::process::free_port;
use testenv::prometheus::{Prometheus, PrometheusOptions, prometheus_bin, promtool_bin, static_scrape_config};
use testenv::scenario::{Scenario, mrm, mt};
use testenv::{TestDir, parse_yaml_docs, tool_or_skip};

/// Runs `tool` with `args` in `dir`; panics with its output unless it succeeds.
fn run_ok(tool: &Path, args: &[&str], dir: &Path, what: &str) -> String {
    let out = Command::new(tool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("failed to run {}: {e}", tool.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what}: `{} {}` failed ({}):\n{text}", tool.display(), args.join(" "), out.status);
    text
}

/// The unit-test files of the alerts, by file name.
fn alert_test_files() -> BTreeMap<String, String> {
    let dir = repo_path(ALERT_TESTS_DIR);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("failed to read {}: {e}", dir.display()));
    let files: BTreeMap<String, String> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .map(|p| {
            let name = p.file_name().expect("file name").to_string_lossy().into_owned();
            (name.clone(), read(&format!("{ALERT_TESTS_DIR}/{name}")))
        })
        .collect();
    assert!(!files.is_empty(), "{ALERT_TESTS_DIR} has no *.test.yaml files");
    files
}

/// The one YAML document of a unit-test file.
fn test_doc(name: &str, text: &str) -> Value {
    let mut docs = parse_yaml_docs(text).unwrap_or_else(|e| panic!("{ALERT_TESTS_DIR}/{name}: {e:#}"));
    assert_eq!(docs.len(), 1, "{ALERT_TESTS_DIR}/{name}: one YAML document");
    docs.remove(0)
}

fn array(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

#[test]
fn the_rule_groups_pass_promtool_check() {
    let Some(promtool) = tool_or_skip("the_rule_groups_pass_promtool_check", promtool_bin()) else { return };
    let dir = TestDir::new("promtool", None).expect("temp dir");
    std::fs::write(dir.path().join(RULE_FILE), rule_file(&prometheus_rule())).expect("write the rule file");
    let out = run_ok(&promtool, &["check", "rules", RULE_FILE], dir.path(), "the PrometheusRule's groups");
    eprintln!("{out}");
}

#[test]
fn every_alert_passes_its_promtool_unit_tests() {
    let Some(promtool) = tool_or_skip("every_alert_passes_its_promtool_unit_tests", promtool_bin()) else { return };
    let dir = TestDir::new("promtool", None).expect("temp dir");
    std::fs::write(dir.path().join(RULE_FILE), rule_file(&prometheus_rule())).expect("write the rule file");
    let files = alert_test_files();
    for (name, text) in &files {
        std::fs::write(dir.path().join(name), text).expect("copy a unit-test file");
    }
    let mut args = vec!["test", "rules"];
    args.extend(files.keys().map(String::as_str));
    let out = run_ok(&promtool, &args, dir.path(), "the alerts' unit tests");
    eprintln!("{out}");
}

#[test]
fn every_alert_has_unit_tests_that_fire_and_stay_silent() {
    let alerts = alerts(&prometheus_rule());
    assert!(!alerts.is_empty(), "the PrometheusRule has no alerts");
    // alert -> (firing expectations, silent expectations)
    let mut seen: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (name, text) in alert_test_files() {
        let doc = test_doc(&name, &text);
        assert_eq!(doc["rule_files"], serde_json::json!([RULE_FILE]), "{name}: rule_files must be [{RULE_FILE}]");
        for test in array(&doc["tests"]) {
            for case in array(&test["alert_rule_test"]) {
                let alert = case["alertname"].as_str().unwrap_or_default();
                let rule = alerts.get(alert).unwrap_or_else(|| panic!("{name} tests {alert}, which is no alert"));
                let expected = array(&case["exp_alerts"]);
                let counts = seen.entry(alert.to_owned()).or_default();
                if expected.is_empty() {
                    counts.1 += 1;
                }
                for exp in expected {
                    counts.0 += 1;
                    // A firing expectation states every annotation, so each template is tested.
                    let want: BTreeSet<&String> =
                        rule["annotations"].as_object().expect("annotations").keys().collect();
                    let have: BTreeSet<&String> =
                        exp["exp_annotations"].as_object().map(|a| a.keys().collect()).unwrap_or_default();
                    assert_eq!(have, want, "{name}: {alert} at {}: exp_annotations must cover", case["eval_time"]);
                    assert_eq!(exp["exp_labels"]["severity"], rule["labels"]["severity"], "{name}: {alert}'s severity");
                }
            }
        }
    }
    for alert in alerts.keys() {
        let (firing, silent) = seen.get(alert).copied().unwrap_or_default();
        assert!(firing > 0, "{ALERT_TESTS_DIR}: no unit test expects {alert} to fire");
        assert!(silent > 0, "{ALERT_TESTS_DIR}: no unit test expects {alert} to stay silent");
    }
}

/// Problems of the selectors in `text`: metrics not documented, labels the metric does not
/// have, `=`/`!=` values outside the documented ones. Labels a scrape adds are allowed, and
/// `le` on a histogram's `_bucket` series.
fn selector_problems(source: &str, text: &str, doc: &BTreeMap<String, DocRow>) -> Vec<String> {
    let found = selectors(text).unwrap_or_else(|e| panic!("{source}: {e:#}"));
    let mut problems = Vec::new();
    let mut labels_here: BTreeSet<String> = SCRAPE_LABELS.iter().map(|l| (*l).to_owned()).collect();
    for (name, matchers) in found {
        let (base, bucket) = match name.strip_suffix("_bucket") {
            Some(base) => (base, true),
            None => (["_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name), false),
        };
        let Some(row) = doc.get(base).or_else(|| doc.get(name.as_str())) else {
            problems.push(format!("{source}: {name} is not documented in docs/metrics.md"));
            continue;
        };
        labels_here.extend(row.labels.iter().cloned());
        if bucket {
            labels_here.insert("le".to_owned());
        }
        for Matcher { label, op, value } in matchers {
            let exact = op == "=" || op == "!=";
            if SCRAPE_LABELS.contains(&label.as_str()) {
                continue;
            }
            if label == "le" && bucket {
                if exact && value != "+Inf" && value.parse::<f64>().is_err() {
                    problems.push(format!("{source}: {name}{{le=\"{value}\"}} is no bucket bound"));
                }
            } else if !row.labels.contains(&label) {
                problems.push(format!("{source}: {name} has no label {label} (docs/metrics.md: {:?})", row.labels));
            } else if exact && label == "shard" {
                if value.parse::<u32>().is_err() {
                    problems.push(format!("{source}: {name}{{shard=\"{value}\"}} is no shard number"));
                }
            } else if exact && !row.values.get(&label).is_some_and(|v| v.contains(&value)) {
                problems.push(format!("{source}: {name}{{{label}=\"{value}\"}}: not a documented value of {label}"));
            }
        }
    }
    for label in grouping_labels(text) {
        if !labels_here.contains(&label) {
            problems.push(format!("{source}: groups by {label}, which none of its metrics has"));
        }
    }
    problems
}

#[test]
fn unit_test_series_are_shaped_like_served_series() {
    let doc = documented_metrics();
    let mut problems = Vec::new();
    let mut series = 0;
    for (name, text) in alert_test_files() {
        for test in array(&test_doc(&name, &text)["tests"]) {
            for input in array(&test["input_series"]) {
                let selector = input["series"].as_str().unwrap_or_default();
                series += 1;
                problems.extend(selector_problems(&format!("{name}: {selector}"), selector, &doc));
            }
        }
    }
    assert!(series > 10, "found too few input series: {series}");
    assert!(problems.is_empty(), "unit-test series unlike what catalogsync serves:\n  {}", problems.join("\n  "));
}

#[test]
fn alerts_and_dashboard_select_documented_labels_and_values() {
    let doc = documented_metrics();
    let mut problems = Vec::new();
    for (alert, rule) in alerts(&prometheus_rule()) {
        problems.extend(selector_problems(&alert, rule["expr"].as_str().expect("expr"), &doc));
        for (key, text) in rule["annotations"].as_object().expect("annotations") {
            problems.extend(selector_problems(&format!("{alert} {key}"), text.as_str().unwrap_or_default(), &doc));
        }
    }
    let queries = dashboard_queries(&dashboard()).unwrap_or_else(|e| panic!("{DASHBOARD}: {e:#}"));
    for q in &queries {
        problems.extend(selector_problems(&q.source, &q.promql, &doc));
    }
    assert!(problems.is_empty(), "undocumented labels or values:\n  {}", problems.join("\n  "));
}

#[test]
fn the_dashboard_matches_grafanas_schema() {
    let Some(check) = tool_or_skip("the_dashboard_matches_grafanas_schema", dashboard_check_bin()) else { return };
    let out = run_ok(&check, &[DASHBOARD], &testenv::repo_root(), "hack/dashboard-check");
    eprintln!("{out}");
}

#[test]
fn every_dashboard_query_parses() {
    let Some(promtool) = tool_or_skip("every_dashboard_query_parses", promtool_bin()) else { return };
    let queries = dashboard_queries(&dashboard()).unwrap_or_else(|e| panic!("{DASHBOARD}: {e:#}"));
    assert!(queries.len() > 20, "found too few dashboard queries: {}", queries.len());
    let dir = TestDir::new("promtool", None).expect("temp dir");
    std::fs::write(dir.path().join("dashboard.rules.yaml"), recording_rules(&queries)).expect("write the rules");
    let listing: Vec<String> =
        queries.iter().enumerate().map(|(i, q)| format!("dashboard_query_{i}: {}: {}", q.source, q.promql)).collect();
    let out = Command::new(&promtool)
        .args(["check", "rules", "dashboard.rules.yaml"])
        .current_dir(dir.path())
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "a dashboard query does not parse:\n{}{}\nthe queries:\n  {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        listing.join("\n  ")
    );
}

/// How long the live test waits for each step once everything runs.
const STEP: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_real_prometheus_scrapes_a_replica_evaluates_the_rules_and_fills_every_panel() {
    const TEST: &str = "a_real_prometheus_scrapes_a_replica_evaluates_the_rules_and_fills_every_panel";
    if tool_or_skip(TEST, prometheus_bin()).is_none() {
        return;
    }
    let rule = prometheus_rule();

    // Prometheus first: it applies new scrape targets only every 5 s, which passes while the
    // test environment starts. Until catalogsync listens, its target is down. Its port is held
    // until then, so that no apiserver of the environment takes it meanwhile.
    let started = Instant::now();
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port for catalogsync");
    let target = held.local_addr().expect("the bound address");
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port().expect("a free port")));
    // With the `pod` and `namespace` labels a ServiceMonitor's scrape adds in a cluster.
    let labels = [("pod", "catalogsync-0"), ("namespace", testenv::CATALOGSYNC_NAMESPACE)];
    let options = PrometheusOptions::new(listen)
        .scrape(static_scrape_config("catalogsync", &[target], &labels))
        .rule_file(RULE_FILE, &rule_file(&rule));
    let prometheus = Prometheus::start(options, None).await.expect("start prometheus");
    eprintln!("prometheus ready after {:.1}s", started.elapsed().as_secs_f64());

    let env = testenv::env();
    let mut s = Scenario::new("monitoring").await.expect("scenario");
    s.http_port = target.port();
    s.apply_catalog(&[mt("api-gateway", "2.10.0"), mrm("api-gateway", &[("regular", "2.10.0")])])
        .await
        .expect("catalog");
    s.add_kyma("kyma-a", &env.skr_a, &[]).await.expect("kyma");
    s.add_kyma("kyma-b", &env.skr_b, &[]).await.expect("kyma");
    let started = Instant::now();
    drop(held);
    s.start(&[]).expect("start catalogsync");
    for kyma in ["kyma-a", "kyma-b"] {
        s.await_condition(kyma, "True", "CatalogSynced", STEP).await;
    }
    eprintln!("both SKRs synced {:.1}s after catalogsync started", started.elapsed().as_secs_f64());

    let summary = check_live(&prometheus, "catalogsync", 1, AlertsExpected::None, STEP).await;
    let summary = summary.unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("{summary}, {:.1}s after catalogsync started", started.elapsed().as_secs_f64());
}
