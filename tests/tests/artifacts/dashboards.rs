//! The Grafana dashboards and Prometheus rules in `dashboards/`: promtool checks and unit tests
//! for the rules, the generated PrometheusRule kept in step with the rules file, the kustomize
//! Component rendering, and every dashboard query run against a real Prometheus server scraping
//! a real manager that is reconciling a workload on devcluster.

use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::*;
use pb::reconcile_result::Outcome;
use serde_json::Value as Json;
use serde_json::Value as Yaml;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
// This suite keeps the names it was written with.
use ctrlhub_tests::{start_cluster as cluster, wait_for as wait_until};

const DASHBOARDS: [&str; 3] = ["ctrlhub-overview", "ctrlhub-tenant", "ctrlhub-traces"];
const RULE_VARIABLES: [&str; 4] = ["job", "namespace", "tenant", "controller"];
/// The `job` a ServiceMonitor on deploy/'s `ctrlhub-metrics` Service produces, and the
/// namespace deploy/ installs into; the real-Prometheus test scrapes with these labels.
const JOB: &str = "ctrlhub-metrics";
const NAMESPACE: &str = "ctrlhub-system";
/// Alerts whose condition the real-Prometheus workload meets (before `for:` elapses).
const PROVOKED: [&str; 2] = ["CtrlhubReconcileErrorRatioHigh", "CtrlhubDeadlineMisses"];
/// Grafana's built-in interval variables, fixed to windows that a 1 s scrape fills quickly.
const BUILTINS: [(&str, &str); 3] = [
    ("__rate_interval", "30s"),
    ("__interval", "5s"),
    ("__range", "2m"),
];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

fn rules_file() -> PathBuf {
    dir().join("rules/ctrlhub.rules.yaml")
}

fn yaml(path: &Path) -> Yaml {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

fn dashboard(name: &str) -> Json {
    let path = dir().join(format!("grafana/{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn run(cmd: &mut std::process::Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} could not start ({e}); tests/run.sh installs Debian's prometheus package (promtool) and kubectl must be on PATH"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every rule (recording and alerting) of the rules file, across its groups.
fn rules() -> Vec<Yaml> {
    let doc = yaml(&rules_file());
    doc["groups"]
        .as_array()
        .expect("groups is a list")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn alert_names() -> BTreeSet<String> {
    rules()
        .iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn rules_pass_promtool_check() {
    let (ok, out) = run(std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(rules_file()));
    assert!(ok, "promtool check rules failed:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_has_promtool_unit_tests() {
    let test_file = dir().join("rules/ctrlhub.rules.test.yaml");
    let (ok, out) = run(std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&test_file));
    assert!(ok, "promtool test rules failed:\n{out}");

    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in yaml(&test_file)["tests"].as_array().expect("tests list") {
        for t in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = t["alertname"].as_str().expect("alertname").to_string();
            let expected = t["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(name);
            } else {
                // A firing case pins labels and every annotation, so a template typo fails it.
                for a in t["exp_alerts"].as_array().into_iter().flatten() {
                    let ann = &a["exp_annotations"];
                    for key in ["summary", "description", "runbook"] {
                        assert!(
                            ann[key].is_string(),
                            "{name}: firing case must assert annotation {key}"
                        );
                    }
                    assert!(
                        a["exp_labels"]["severity"].is_string(),
                        "{name}: firing case must assert severity"
                    );
                }
                fires.insert(name);
            }
        }
    }
    let alerts = alert_names();
    for name in [
        "CtrlhubReconcileErrorRatioHigh",
        "CtrlhubWorkQueueNotDraining",
        "CtrlhubControllerWithoutSessions",
        "CtrlhubNoLeader",
        "CtrlhubManagerDown",
        "CtrlhubWatchRestarts",
        "CtrlhubDeadlineMisses",
    ] {
        assert!(alerts.contains(name), "alert {name} is missing: {alerts:?}");
    }
    let untested: Vec<_> = alerts.difference(&fires).collect();
    assert!(
        untested.is_empty(),
        "alerts without a firing unit test: {untested:?}"
    );
    let unquiet: Vec<_> = alerts.difference(&quiet).collect();
    assert!(
        unquiet.is_empty(),
        "alerts without a not-firing unit test: {unquiet:?}"
    );
}

#[test]
fn every_alert_has_for_severity_and_runbook() {
    for r in rules().iter().filter(|r| r["alert"].is_string()) {
        let name = r["alert"].as_str().unwrap_or_default();
        assert!(
            r["for"].is_string(),
            "{name}: needs a `for:` so a blip does not page"
        );
        let severity = r["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for key in ["summary", "description", "runbook"] {
            assert!(
                r["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: annotation {key} missing"
            );
        }
    }
}

#[test]
fn prometheusrule_manifest_matches_rules_file() {
    let manifest = yaml(&dir().join("prometheusrule.yaml"));
    assert_eq!(manifest["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(manifest["kind"], "PrometheusRule");
    assert!(
        manifest["spec"]["groups"] == yaml(&rules_file())["groups"],
        "dashboards/prometheusrule.yaml has drifted from dashboards/rules/ctrlhub.rules.yaml; \
         regenerate it with `bash dashboards/generate.sh` and commit both"
    );
}

/// (dashboard, panel title, expression) of every Prometheus target of every dashboard.
fn prometheus_targets() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for name in DASHBOARDS {
        for p in panels(&dashboard(name)) {
            for t in p["targets"].as_array().into_iter().flatten() {
                if t["datasource"]["type"] == "prometheus" {
                    out.push((
                        name.to_string(),
                        p["title"].as_str().unwrap_or_default().to_string(),
                        t["expr"].as_str().unwrap_or_default().to_string(),
                    ));
                }
            }
        }
    }
    out
}

/// Panels other than rows (rows nest their collapsed panels).
fn panels(d: &Json) -> Vec<Json> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(p.clone());
        }
    }
    out
}

fn variable<'a>(d: &'a Json, name: &str) -> Option<&'a Json> {
    d["templating"]["list"]
        .as_array()
        .and_then(|l| l.iter().find(|v| v["name"] == name))
}

#[test]
fn dashboards_are_well_formed() {
    let mut uids = BTreeSet::new();
    for name in DASHBOARDS {
        let d = dashboard(name);
        assert_eq!(
            d["uid"], name,
            "{name}: uid is stable and matches the file name"
        );
        assert!(uids.insert(name));
        assert!(
            d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
            "{name}: schemaVersion"
        );
        let ds = variable(&d, "datasource").expect("datasource variable");
        assert_eq!(
            (ds["type"].as_str(), ds["query"].as_str()),
            (Some("datasource"), Some("prometheus")),
            "{name}"
        );
        for v in RULE_VARIABLES {
            let var = variable(&d, v).unwrap_or_else(|| panic!("{name}: variable {v} missing"));
            assert_eq!(var["type"], "query", "{name}: {v}");
            assert!(
                label_values_query(var).is_some(),
                "{name}: {v} must be a label_values(...) query"
            );
        }
        let mut ids = BTreeSet::new();
        let all = panels(&d);
        assert!(!all.is_empty(), "{name}: no panels");
        for p in &all {
            let title = p["title"].as_str().unwrap_or_default();
            assert!(
                ids.insert(p["id"].as_u64().expect("panel id")),
                "{name}: duplicate panel id"
            );
            assert!(p["gridPos"]["w"].is_u64(), "{name}/{title}: gridPos");
            let pds = p["datasource"]["uid"].as_str().unwrap_or_default();
            assert!(
                pds.starts_with("${"),
                "{name}/{title}: panel datasource must be a variable, got {pds:?}"
            );
            if ["timeseries", "stat"].contains(&p["type"].as_str().unwrap_or_default()) {
                assert!(
                    p["fieldConfig"]["defaults"]["unit"].is_string(),
                    "{name}/{title}: unit"
                );
            }
            let targets = p["targets"].as_array().filter(|t| !t.is_empty());
            let targets = targets.unwrap_or_else(|| panic!("{name}/{title}: no targets"));
            for t in targets {
                let tds = t["datasource"]["uid"].as_str().unwrap_or_default();
                assert!(
                    tds.starts_with("${"),
                    "{name}/{title}: target datasource {tds:?}"
                );
                assert!(t["refId"].is_string(), "{name}/{title}: refId");
                if t["datasource"]["type"] == "prometheus" {
                    check_filters(name, title, t["expr"].as_str().unwrap_or_default());
                }
            }
        }
    }

    // The traces dashboard reads Tempo with TraceQL, filtered like the others.
    let d = dashboard("ctrlhub-traces");
    let service = variable(&d, "service").expect("service variable");
    assert_eq!(
        service["query"], "ctrlhub",
        "defaults to the manager's service name"
    );
    let tempo = variable(&d, "tempo").expect("tempo datasource variable");
    assert_eq!(
        (tempo["type"].as_str(), tempo["query"].as_str()),
        (Some("datasource"), Some("tempo"))
    );
    let traceql: Vec<String> = panels(&d)
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter(|t| t["datasource"]["type"] == "tempo")
        .map(|t| {
            assert_eq!(t["queryType"], "traceql", "{t}");
            t["query"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    for q in &traceql {
        // The manager's service is a variable (OTEL_SERVICE_NAME renames it), and EVENTS-mode
        // deliveries (`event`) count as reconciles.
        for needle in [
            r#"resource.service.name = "$service""#,
            r#"(name = "reconcile" || name = "event")"#,
            "span.ctrlhub.controller",
            "span.ctrlhub.tenant",
        ] {
            assert!(q.contains(needle), "TraceQL {q} lacks {needle}");
        }
        assert!(q.starts_with('{') && q.ends_with('}'), "TraceQL {q}");
    }
    assert!(
        traceql.iter().any(|q| q.contains("duration >")),
        "a slow-reconcile query"
    );
    assert!(
        traceql.iter().any(|q| q.contains("status = error")),
        "a failed-reconcile query"
    );
}

/// Every Prometheus expression is scoped to the selected installation, and to the selected
/// tenants and controllers wherever the series carries them.
fn check_filters(dash: &str, title: &str, expr: &str) {
    let mut need = vec![r#"job="$job""#, r#"namespace="$namespace""#];
    if expr.contains("controller_runtime_")
        || expr.contains("ctrlhub_sessions")
        || expr.contains("ctrlhub_deadline")
        || expr.contains("ctrlhub_dispatch_latency")
    {
        need.extend([r#"tenant=~"$tenant""#, r#"controller=~"$controller""#]);
    }
    // Dispatch seats are shared by a tenant's controllers: per tenant only.
    if expr.contains("ctrlhub_dispatch_seat") {
        need.push(r#"tenant=~"$tenant""#);
    }
    if expr.contains("workqueue_") {
        need.extend([r#"tenant=~"$tenant""#, r#"name=~"$controller""#]);
    }
    for n in need {
        // Every selector of the expression, not just one of them.
        let selectors = expr.matches('{').count();
        let filtered = expr.matches(n).count();
        assert!(
            filtered >= selectors,
            "{dash}/{title}: every selector must filter by {n}: {expr}"
        );
    }
}

/// (selector, label) of a `label_values(selector, label)` variable query.
fn label_values_query(var: &Json) -> Option<(String, String)> {
    let q = var["query"]["query"]
        .as_str()
        .or_else(|| var["query"].as_str())?;
    let inner = q.strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim().to_string(), label.trim().to_string()))
}

/// Grafana's interpolation of `$var`, `${var}` and `${var:format}` with single values.
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, format, len) = if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').unwrap_or(body.len());
            let (name, format) = body[..end].split_once(':').unwrap_or((&body[..end], ""));
            (name, format, end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], "", end)
        };
        let builtin = BUILTINS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        match builtin.or(vars.get(name).map(String::as_str)) {
            Some(v) if format == "regex" => out.push_str(&regex_escape(v)),
            Some(v) => out.push_str(v),
            None => out.push_str(&rest[i..i + 1 + len]),
        }
        rest = &rest[i + 1 + len..];
    }
    out.push_str(rest);
    out
}

fn regex_escape(v: &str) -> String {
    v.chars()
        .flat_map(|c| {
            let special = r"\^$.|?*+()[]{}".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

#[test]
fn grafana_substitution_covers_every_form() {
    let vars = BTreeMap::from([("job".to_string(), "a.b".to_string())]);
    assert_eq!(
        substitute(
            "x{job=\"$job\",j=\"${job}\",r=~\"${job:regex}\"}[$__rate_interval]",
            &vars
        ),
        r#"x{job="a.b",j="a.b",r=~"a\.b"}[30s]"#
    );
    assert_eq!(
        substitute("$unknown", &vars),
        "$unknown",
        "left for Prometheus to reject"
    );
}

#[test]
fn kustomize_component_renders_dashboards_and_rules() {
    // kustomize accepts components only by relative path; build a scratch overlay next to target/.
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboards-overlay");
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let component = relative(&scratch, &dir());
    std::fs::write(
        scratch.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {NAMESPACE}\ncomponents:\n  - {}\n",
            component.display()
        ),
    )
    .expect("scratch kustomization");
    let (ok, out) = run(std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&scratch));
    assert!(ok, "kubectl kustomize failed:\n{out}");
    let docs: Vec<Yaml> = serde_saphyr::from_multiple(&out).expect("rendered YAML");
    for name in DASHBOARDS {
        let cm_name = format!("ctrlhub-dashboard-{}", name.trim_start_matches("ctrlhub-"));
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == cm_name.as_str())
            .unwrap_or_else(|| panic!("ConfigMap {cm_name} (no name hash) missing:\n{out}"));
        assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
        assert_eq!(
            cm["metadata"]["labels"]["grafana_dashboard"], "1",
            "sidecar label"
        );
        let file = std::fs::read_to_string(dir().join(format!("grafana/{name}.json")))
            .expect("dashboard file");
        assert_eq!(
            cm["data"][format!("{name}.json").as_str()].as_str(),
            Some(file.as_str())
        );
    }
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("PrometheusRule rendered");
    assert!(rule["spec"]["groups"] == yaml(&rules_file())["groups"]);
}

fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().expect("from exists");
    let to = to.canonicalize().expect("to exists");
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut rel = PathBuf::new();
    for _ in from.components().skip(common) {
        rel.push("..");
    }
    rel.extend(to.components().skip(common));
    rel
}

/// A `prometheus` server child process, killed on drop.
struct Prometheus {
    _child: tokio::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(scrape: &str, settings: &str, rule_file: &Path) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        // `namespace` is the target label a ServiceMonitor adds; here the manager runs outside
        // Kubernetes, so the scrape config sets it the same way.
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: {JOB}\n{settings}    static_configs:\n      - targets: ['{scrape}']\n        labels:\n          namespace: {NAMESPACE}\n",
                rule_file.display()
            ),
        )
        .expect("prometheus.yml");
        let port = free_port();
        let log = std::env::temp_dir().join(format!("ctrlhub-test-prometheus-{port}.log"));
        println!("prometheus logs to {}", log.display());
        let child = tokio::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(&log)
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .kill_on_drop(true)
            .spawn()
            .expect("prometheus starts (tests/run.sh installs Debian's prometheus package)");
        let p = Prometheus {
            _child: child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let http = reqwest::Client::new();
        wait_until("prometheus /-/ready", || {
            let req = http.get(format!("{}/-/ready", p.url));
            async move { req.send().await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
        p
    }

    /// `/api/v1/query` at the current time: Ok(result vector) or Err(what went wrong).
    async fn query(&self, http: &reqwest::Client, expr: &str) -> Result<Vec<Json>, String> {
        let body: Json = http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        match body["data"]["result"].as_array() {
            Some(r) => Ok(r.clone()),
            None => Ok(vec![body["data"]["result"].clone()]),
        }
    }

    /// The values of `label` over the series matching `selector` (what Grafana's
    /// `label_values(selector, label)` shows).
    async fn label_values(
        &self,
        http: &reqwest::Client,
        selector: &str,
        label: &str,
    ) -> Result<BTreeSet<String>, String> {
        let body: Json = http
            .get(format!("{}/api/v1/series", self.url))
            .query(&[("match[]", selector)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        Ok(body["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s[label].as_str().map(str::to_string))
            .collect())
    }
}

/// Answers every request by key, so that all four results (and deadline misses and terminal
/// errors) keep being counted while Prometheus scrapes.
async fn drive(mut replica: Replica) {
    let mut later: Vec<(Instant, String, Outcome)> = Vec::new();
    loop {
        if let Some(req) = replica.next(Duration::from_millis(50)).await {
            let k = key(&req);
            let name = k.rsplit('/').next().unwrap_or_default().to_string();
            let error = |m: &str| {
                Outcome::Error(pb::reconcile_result::Error {
                    message: m.into(),
                    retry_after: None,
                })
            };
            let reply = match name.as_str() {
                "fail" => Some((Duration::ZERO, error("dependency unavailable"))),
                "terminal" => Some((
                    Duration::ZERO,
                    Outcome::Terminal(pb::reconcile_result::Terminal {
                        message: "invalid spec".into(),
                    }),
                )),
                "poll" => Some((
                    Duration::from_millis(100),
                    Outcome::RequeueAfter(pb::reconcile_result::RequeueAfter {
                        delay: Some(secs(1.0)),
                    }),
                )),
                // Requeue "as soon as possible", held 300 ms so it does not spin.
                "spin" => Some((
                    Duration::from_millis(300),
                    Outcome::RequeueAfter(pb::reconcile_result::RequeueAfter { delay: None }),
                )),
                // Never answered: its deadline passes and it is re-queued, over and over.
                "hang" => None,
                _ => Some((
                    Duration::from_millis(20),
                    Outcome::Done(pb::reconcile_result::Done {}),
                )),
            };
            if let Some((after, outcome)) = reply {
                later.push((Instant::now() + after, req.id.clone(), outcome));
            }
        }
        let now = Instant::now();
        let (due, rest): (Vec<_>, Vec<_>) = later.into_iter().partition(|(at, _, _)| *at <= now);
        later = rest;
        for (_, id, outcome) in due {
            replica.reply(&id, outcome).await;
        }
    }
}

/// One failed expectation of the real-Prometheus test.
fn describe(what: &str, expr: &str, problem: &str) -> String {
    format!("- {what}\n    {expr}\n    => {problem}")
}

/// How deploy/'s ServiceMonitor tells Prometheus to scrape the manager, as a `scrape_configs`
/// fragment: its scheme, a bearer token file (`token_file`, standing in for Prometheus' own
/// ServiceAccount token) and its TLS settings.
fn scrape_settings(token_file: &Path) -> String {
    let monitor = yaml(&dir().join("../deploy/monitoring/servicemonitor.yaml"));
    let endpoint = &monitor["spec"]["endpoints"][0];
    let scheme = endpoint["scheme"].as_str().unwrap_or("http");
    assert!(
        endpoint["bearerTokenFile"].is_string(),
        "the ServiceMonitor sends Prometheus' token: {endpoint}"
    );
    let skip_verify = endpoint["tlsConfig"]["insecureSkipVerify"] == true;
    format!(
        "    scheme: {scheme}\n    metrics_path: {}\n    authorization:\n      credentials_file: {}\n    tls_config:\n      insecure_skip_verify: {skip_verify}\n",
        endpoint["path"].as_str().unwrap_or("/metrics"),
        token_file.display()
    )
}

/// A token of ServiceAccount `monitoring/prometheus`, bound to deploy/'s `ctrlhub-metrics-reader`
/// ClusterRole as the README says to bind Prometheus.
async fn prometheus_token(c: &Cluster) -> String {
    let roles = dir().join("../deploy/base/clusterrole.yaml");
    // Not `run`: kubectl must not block the runtime devcluster answers it on.
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["apply", "-f"])
        .arg(&roles)
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl apply {}:\n{}",
        roles.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    rbac::prometheus_bound_to(c, "ctrlhub-metrics-reader")
        .await
        .expect("prometheus' token")
}

/// The manager runs as deploy/ runs it (`--auth kubernetes`: HTTPS, `/metrics` authorized) and
/// Prometheus scrapes it as deploy/'s ServiceMonitor and metrics-reader role say.
#[tokio::test]
async fn every_dashboard_query_returns_data_from_real_prometheus() {
    let c = cluster().await;
    let m = Manager::start(&c, "dash", &rbac::RBAC_ARGS).await;
    m.wait_leading().await;
    const CONTROLLER: &str = "dashboards";
    let auth = rbac::tenant(&c, "dash", "ctl").await;
    rbac::grant_configmaps(&c, "dash", "ctl", Some("dash")).await;
    for name in ["ok-1", "ok-2", "fail", "terminal", "poll", "spin", "hang"] {
        put_configmap(&c.client, "dash", name, &[("v", "0")]).await;
    }
    let mut reg = rbac::configmaps_in(CONTROLLER, &["dash"]);
    reg.max_in_flight = 16;
    reg.backoff = Some(pb::Backoff {
        base: Some(secs(0.5)),
        max: Some(secs(1.0)),
    });
    reg.request_deadline = Some(secs(1.0));
    let replica = Replica::connect_with(&m.grpc, reg, Some(&auth))
        .await
        .expect("registered");
    let driver = tokio::spawn(drive(replica));
    // A refused registration, so ctrlhub_rejected_registrations_total exists.
    let refused = Replica::connect_with(
        &m.grpc,
        rbac::configmaps_in("Not_A_DNS_Label", &["dash"]),
        Some(&auth),
    )
    .await;
    assert!(refused.is_err(), "an invalid controller name is refused");

    let token_file = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(token_file.path(), prometheus_token(&c).await).expect("token written");
    let scrape = m.http.split("://").nth(1).expect("host:port").to_string();
    let prom = Prometheus::start(
        &scrape,
        &scrape_settings(token_file.path()),
        &rules_file().canonicalize().expect("rules file"),
    )
    .await;
    let http = reqwest::Client::new();
    let up = format!(r#"up{{job="{JOB}", namespace="{NAMESPACE}"}} == 1"#);
    wait_until("prometheus scrapes the manager (up == 1)", || {
        let (prom, http, up) = (&prom, &http, &up);
        async move { prom.query(http, up).await.is_ok_and(|r| !r.is_empty()) }
    })
    .await;

    let expected = BTreeMap::from([
        ("job", JOB),
        ("namespace", NAMESPACE),
        // Series name the tenant as limits and seats count it: the namespace's ServiceAccounts.
        ("tenant", "system:serviceaccounts:dash"),
        ("controller", CONTROLLER),
    ]);
    let targets = prometheus_targets();
    let alerts: Vec<(String, String)> = rules()
        .iter()
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["expr"].as_str()?.to_string(),
            ))
        })
        .collect();
    let recording: Vec<(String, String)> = rules()
        .iter()
        .filter_map(|r| {
            Some((
                r["record"].as_str()?.to_string(),
                r["expr"].as_str()?.to_string(),
            ))
        })
        .collect();
    assert!(
        targets.len() > 30 && recording.len() >= 5,
        "{} targets, {} recording rules",
        targets.len(),
        recording.len()
    );

    // Rate windows fill and every series appears within seconds; wait for the whole set to pass,
    // then report everything still failing at the deadline.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (vars, failures) = loop {
        let mut failures = Vec::new();
        let mut vars: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for name in DASHBOARDS {
            let d = dashboard(name);
            let resolved = vars.entry(name.to_string()).or_default();
            for v in RULE_VARIABLES {
                let Some((selector, label)) = variable(&d, v).and_then(label_values_query) else {
                    failures.push(describe(
                        &format!("{name} variable ${v}"),
                        "",
                        "not a label_values query",
                    ));
                    continue;
                };
                let selector = substitute(&selector, resolved);
                match prom.label_values(&http, &selector, &label).await {
                    Ok(values) if values.contains(expected[v]) => {
                        resolved.insert(v.to_string(), expected[v].to_string());
                    }
                    Ok(values) => failures.push(describe(
                        &format!("{name} variable ${v}"),
                        &selector,
                        &format!("values {values:?} lack {:?}", expected[v]),
                    )),
                    Err(e) => {
                        failures.push(describe(&format!("{name} variable ${v}"), &selector, &e))
                    }
                }
            }
        }
        let mut queries: Vec<(String, String)> = targets
            .iter()
            .map(|(dash, title, expr)| {
                (
                    format!("{dash} / {title}"),
                    substitute(expr, &vars[dash.as_str()]),
                )
            })
            .collect();
        queries.extend(
            recording
                .iter()
                .map(|(record, expr)| (format!("recording rule {record}"), expr.clone())),
        );
        for (what, expr) in &queries {
            match prom.query(&http, expr).await {
                Ok(r) if r.is_empty() => failures.push(describe(what, expr, "empty result")),
                Ok(r) if r.iter().all(|s| s["value"][1] == "NaN") => {
                    failures.push(describe(what, expr, "only NaN"))
                }
                Ok(_) => {}
                Err(e) => failures.push(describe(what, expr, &e)),
            }
        }
        // Alert expressions match the live series: the workload provokes errors and deadline
        // misses, while the manager, its leadership, queues and watches are healthy.
        for (alert, expr) in &alerts {
            let provoked = PROVOKED.contains(&alert.as_str());
            match prom.query(&http, expr).await {
                Ok(r) if provoked && r.is_empty() => failures.push(describe(
                    &format!("alert {alert}"),
                    expr,
                    "no series although the workload provokes it",
                )),
                Ok(r) if !provoked && !r.is_empty() => failures.push(describe(
                    &format!("alert {alert}"),
                    expr,
                    &format!("fires on a healthy manager: {r:?}"),
                )),
                Ok(_) => {}
                Err(e) => failures.push(describe(&format!("alert {alert}"), expr, &e)),
            }
        }
        // Prometheus itself evaluated every rule (recording and alerting) without error.
        match http.get(format!("{}/api/v1/rules", prom.url)).send().await {
            Ok(resp) => {
                let body: Json = resp.json().await.unwrap_or_default();
                let loaded: Vec<Json> = body["data"]["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                    .collect();
                if loaded.len() != rules().len() {
                    failures.push(describe(
                        "rules loaded",
                        "",
                        &format!("{} of {}", loaded.len(), rules().len()),
                    ));
                }
                for r in loaded.iter().filter(|r| r["health"] != "ok") {
                    failures.push(describe(
                        &format!("rule {}", r["name"]),
                        r["query"].as_str().unwrap_or_default(),
                        &format!("health {} {}", r["health"], r["lastError"]),
                    ));
                }
            }
            Err(e) => failures.push(describe("rules API", "", &e.to_string())),
        }
        if failures.is_empty() || Instant::now() > deadline {
            break (vars, failures);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(
        failures.is_empty(),
        "{} dashboard/rule queries failed against Prometheus (logs above):\n{}",
        failures.len(),
        failures.join("\n")
    );

    // One panel's query and answer, for the README.
    let (dash, title, expr) = targets
        .iter()
        .find(|(d, t, _)| d == "ctrlhub-overview" && t == "Reconcile rate per controller")
        .expect("overview has the reconcile rate panel");
    let query = substitute(expr, &vars[dash.as_str()]);
    let result = prom.query(&http, &query).await.expect("sample query");
    let sample = format!(
        "# {dash} / {title}\n# panel expr: {expr}\n# query:      {query}\n{}\n",
        serde_json::to_string_pretty(&result).unwrap_or_default()
    );
    println!("{sample}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    std::fs::write(target.join("dashboard-query-sample.txt"), &sample).expect("sample written");
    driver.abort();
}
