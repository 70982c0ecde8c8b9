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
        "CtrlhubMemberStoppedRenewing",
        "CtrlhubUnitsWaitingForRelease",
        "CtrlhubRedirectStorm",
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
    // Dispatch seats are shared by a tenant's controllers, and a redirect answers a tenant's
    // session before it names a controller: per tenant only.
    if expr.contains("ctrlhub_dispatch_seat") || expr.contains("ctrlhub_ring_redirects") {
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
    async fn start(targets: &[String], settings: &str, rule_file: &Path) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        // `namespace` is the target label a ServiceMonitor adds; here the manager runs outside
        // Kubernetes, so the scrape config sets it the same way.
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: {JOB}\n{settings}    static_configs:\n      - targets: [{}]\n        labels:\n          namespace: {NAMESPACE}\n",
                rule_file.display(),
                targets
                    .iter()
                    .map(|t| format!("'{t}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
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
/// ClusterRole as docs/multi-tenancy.md says to bind Prometheus.
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

/// The rules file with the `for:` of the alerts this test provokes shortened to seconds, written
/// to `dir`. The shipped durations stay realistic (2 minutes: a blip does not page); the test
/// proves the expressions fire on a real killed controller and a real killed leader, not how
/// long Prometheus waits, so it loads this copy.
fn rules_with_short_for(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(rules_file()).expect("rules file");
    let mut out = String::new();
    let mut shorten = false;
    for line in text.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            shorten = FIRED.contains(&name);
        }
        if shorten && line.trim().starts_with("for: ") {
            let indent = &line[..line.len() - line.trim_start().len()];
            out.push_str(&format!("{indent}for: {FIRED_FOR}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    let path = dir.join("ctrlhub.rules.yaml");
    std::fs::write(&path, out).expect("rules copy written");
    path
}

/// Alerts the real-Prometheus tests fire for real (a killed controller, a killed leader, a
/// killed ring member), and the `for:` of their copy of the rules.
const FIRED: [&str; 3] = [
    "CtrlhubControllerWithoutSessions",
    "CtrlhubNoLeader",
    "CtrlhubMemberStoppedRenewing",
];
const FIRED_FOR: &str = "5s";

/// Every dashboard variable resolved to `expected`'s value, or what went wrong.
async fn resolve_variables(
    prom: &Prometheus,
    http: &reqwest::Client,
    expected: &BTreeMap<&str, &str>,
    failures: &mut Vec<String>,
) -> BTreeMap<String, BTreeMap<String, String>> {
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
            match prom.label_values(http, &selector, &label).await {
                Ok(values) if values.contains(expected[v]) => {
                    resolved.insert(v.to_string(), expected[v].to_string());
                }
                Ok(values) => failures.push(describe(
                    &format!("{name} variable ${v}"),
                    &selector,
                    &format!("values {values:?} lack {:?}", expected[v]),
                )),
                Err(e) => failures.push(describe(&format!("{name} variable ${v}"), &selector, &e)),
            }
        }
    }
    vars
}

/// Which managers a real-Prometheus test runs, and so which panels must show data.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `--mode leader`: every panel but the Ring row's, whose series a leader does not report
    /// (its queries must still be valid PromQL that Prometheus runs).
    Leader,
    /// `--mode ring`: the Ring row's panels.
    Ring,
}

/// Whether a panel query reads ring-mode series (the overview's Ring row).
fn is_ring(expr: &str) -> bool {
    expr.contains("ctrlhub_ring_")
}

/// Runs every panel query with `vars` that `mode` covers: each must return a series; with
/// `values`, not only NaN and never `-0` (an idle controller's percentiles and ratios are NaN,
/// 0 / 0, but exist).
async fn check_panels(
    prom: &Prometheus,
    http: &reqwest::Client,
    vars: &BTreeMap<String, BTreeMap<String, String>>,
    mode: Mode,
    values: bool,
    failures: &mut Vec<String>,
) {
    for (dash, title, expr) in prometheus_targets() {
        let what = format!("{dash} / {title}");
        let query = substitute(&expr, &vars[dash.as_str()]);
        let ring = is_ring(&expr);
        if mode == Mode::Ring && !ring {
            continue;
        }
        match prom.query(http, &query).await {
            Ok(_) if mode == Mode::Leader && ring => {}
            Ok(r) if r.is_empty() => failures.push(describe(&what, &query, "empty result")),
            Ok(r) if values && r.iter().all(|s| s["value"][1] == "NaN") => {
                failures.push(describe(&what, &query, "only NaN"))
            }
            Ok(r) if values && r.iter().any(|s| s["value"][1] == "-0") => {
                failures.push(describe(&what, &query, &format!("reads -0: {r:?}")))
            }
            Ok(_) => {}
            Err(e) => failures.push(describe(&what, &query, &e)),
        }
    }
}

/// Recording rules return data, alert expressions match exactly the provoked alerts, and
/// Prometheus evaluated every rule without error.
async fn check_rules(prom: &Prometheus, http: &reqwest::Client, failures: &mut Vec<String>) {
    for r in rules() {
        let (Some(record), Some(expr)) = (r["record"].as_str(), r["expr"].as_str()) else {
            continue;
        };
        match prom.query(http, expr).await {
            Ok(res) if res.is_empty() => failures.push(describe(
                &format!("recording rule {record}"),
                expr,
                "empty result",
            )),
            Ok(_) => {}
            Err(e) => failures.push(describe(&format!("recording rule {record}"), expr, &e)),
        }
    }
    // Alert expressions match the live series: the workload provokes errors and deadline
    // misses, while the manager, its leadership, queues and watches are healthy.
    for r in rules() {
        let (Some(alert), Some(expr)) = (r["alert"].as_str(), r["expr"].as_str()) else {
            continue;
        };
        let provoked = PROVOKED.contains(&alert);
        match prom.query(http, expr).await {
            Ok(res) if provoked && res.is_empty() => failures.push(describe(
                &format!("alert {alert}"),
                expr,
                "no series although the workload provokes it",
            )),
            Ok(res) if !provoked && !res.is_empty() => failures.push(describe(
                &format!("alert {alert}"),
                expr,
                &format!("fires on a healthy manager: {res:?}"),
            )),
            Ok(_) => {}
            Err(e) => failures.push(describe(&format!("alert {alert}"), expr, &e)),
        }
    }
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
}

/// Retries `check` (which collects failures) every second until it finds none or `within`
/// passes, then fails with everything it still found.
async fn settle<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let failures = check().await;
        if failures.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: {} queries failed against Prometheus (logs above):\n{}",
                failures.len(),
                failures.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until Prometheus' `ALERTS` has `alert` firing with `labels`; returns how long that took.
async fn wait_firing(
    prom: &Prometheus,
    http: &reqwest::Client,
    alert: &str,
    labels: &str,
) -> Duration {
    let started = Instant::now();
    let query = format!(r#"ALERTS{{alertname="{alert}", alertstate="firing"{labels}}}"#);
    ctrlhub_tests::wait::wait_until(
        &format!("{alert} firing in Prometheus ({query})"),
        PATIENCE,
        || async {
            match prom.query(http, &query).await {
                Ok(r) if !r.is_empty() => Ok(()),
                Ok(_) => Err(format!(
                    "not yet; ALERTS: {:?}",
                    prom.query(http, "ALERTS").await
                )),
                Err(e) => Err(e),
            }
        },
    )
    .await;
    started.elapsed()
}

/// The manager runs as deploy/ runs it (`--auth kubernetes`: HTTPS, `/metrics` authorized) and
/// Prometheus scrapes it as deploy/'s ServiceMonitor and metrics-reader role say. Every panel
/// returns data for a busy controller, and series (0, or NaN for ratios) for an idle one; then
/// the alerts fire on the real thing: every replica of a controller gone, the leader killed.
#[tokio::test]
async fn every_dashboard_query_returns_data_from_real_prometheus() {
    let c = cluster().await;
    // A long Lease: after the leader is killed, the standby waits it out, so the test sees
    // "no leader" for as long as that lasts (the alert's copy fires after 5 s).
    let mut args: Vec<&str> = rbac::RBAC_ARGS.to_vec();
    args.extend(["--lease-duration", "60s", "--renew-deadline", "40s"]);
    let mut m = Manager::start(&c, "dash", &args).await;
    m.wait_leading().await;
    let standby = Manager::start(&c, "dash-standby", &args).await;
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
    // A refused registration, so ctrlhub_rejected_registrations_total moves.
    let refused = Replica::connect_with(
        &m.grpc,
        rbac::configmaps_in("Not_A_DNS_Label", &["dash"]),
        Some(&auth),
    )
    .await;
    assert!(refused.is_err(), "an invalid controller name is refused");
    let quiet = idle_controller(&c, &m).await;

    let token_file = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(token_file.path(), prometheus_token(&c).await).expect("token written");
    let targets: Vec<String> = [&m, &standby]
        .iter()
        .map(|m| m.http.split("://").nth(1).expect("host:port").to_string())
        .collect();
    let rules_dir = tempfile::tempdir().expect("rules dir");
    let prom = Prometheus::start(
        &targets,
        &scrape_settings(token_file.path()),
        &rules_with_short_for(rules_dir.path()),
    )
    .await;
    let http = reqwest::Client::new();
    let up = format!(r#"sum(up{{job="{JOB}", namespace="{NAMESPACE}"}}) == 2"#);
    wait_until("prometheus scrapes both replicas (up == 1)", || {
        let (prom, http, up) = (&prom, &http, &up);
        async move { prom.query(http, up).await.is_ok_and(|r| !r.is_empty()) }
    })
    .await;
    assert!(prometheus_targets().len() > 40, "panels with targets");

    // Rate windows fill and every series appears within seconds; wait for the whole set to pass,
    // then report everything still failing at the deadline.
    let busy = BTreeMap::from([
        ("job", JOB),
        ("namespace", NAMESPACE),
        // Series name the tenant as limits and seats count it: the namespace's ServiceAccounts.
        ("tenant", "system:serviceaccounts:dash"),
        ("controller", CONTROLLER),
    ]);
    settle(
        "the busy controller's panels",
        Duration::from_secs(120),
        || async {
            let mut failures = Vec::new();
            let vars = resolve_variables(&prom, &http, &busy, &mut failures).await;
            if failures.is_empty() {
                check_panels(&prom, &http, &vars, Mode::Leader, true, &mut failures).await;
            }
            check_rules(&prom, &http, &mut failures).await;
            failures
        },
    )
    .await;
    // An idle controller (registered, nothing to reconcile) has every series at 0.
    let idle = BTreeMap::from([
        ("job", JOB),
        ("namespace", NAMESPACE),
        ("tenant", "system:serviceaccounts:calm"),
        ("controller", "quiet"),
    ]);
    settle(
        "the idle controller's panels",
        Duration::from_secs(60),
        || async {
            let mut failures = Vec::new();
            let vars = resolve_variables(&prom, &http, &idle, &mut failures).await;
            if failures.is_empty() {
                check_panels(&prom, &http, &vars, Mode::Leader, false, &mut failures).await;
            }
            failures
        },
    )
    .await;
    write_sample(&prom, &http, &busy).await;

    // Every replica of the busy controller gone (its only replica's connection dropped, as a
    // SIGKILL drops it): the controller stays for --controller-grace and the alert fires.
    driver.abort();
    let _ = driver.await;
    let took = wait_firing(
        &prom,
        &http,
        "CtrlhubControllerWithoutSessions",
        &format!(r#", controller="{CONTROLLER}", tenant="system:serviceaccounts:dash""#),
    )
    .await;
    println!(
        "CtrlhubControllerWithoutSessions fired {took:?} after the controller's replicas died (for: {FIRED_FOR})"
    );

    // The leader SIGKILLed: the standby reports 0 until the Lease runs out, and the alert fires.
    m.kill().await;
    let took = wait_firing(
        &prom,
        &http,
        "CtrlhubNoLeader",
        r#", name="ctrlhub-leader""#,
    )
    .await;
    println!("CtrlhubNoLeader fired {took:?} after the leader was killed (for: {FIRED_FOR})");
    quiet.abort();
}

/// The Ring row and the ring alerts on real members (`--mode ring`) scraped by a real
/// Prometheus: member `ring-a` takes four controllers alone, `ring-b` joins with a thousand
/// times its weight, so units move to it (sealed on `ring-a`, acquired on `ring-b`), and every
/// controller registers again through `ring-a`, as through the `ctrlhub` Service, so the moved
/// ones are redirected. Every Ring panel then has series, no ring alert fires on the healthy
/// ring, and once `ring-b` is SIGKILLed `CtrlhubMemberStoppedRenewing` fires for it.
#[tokio::test]
async fn ring_panels_return_data_from_real_members() {
    let c = cluster().await;
    let member = |weight: &'static str| {
        let mut args: Vec<&str> = rbac::RBAC_ARGS.to_vec();
        args.extend(["--mode", "ring", "--member-weight", weight]);
        args
    };
    let a = Manager::start(&c, "ring-a", &member("1")).await;
    let auth = rbac::tenant(&c, "ring", "ctl").await;
    rbac::grant_configmaps(&c, "ring", "ctl", Some("ring")).await;
    put_configmap(&c.client, "ring", "one", &[("v", "0")]).await;
    const CONTROLLERS: [&str; 4] = ["ring-0", "ring-1", "ring-2", "ring-3"];
    let mut first = Vec::new();
    for name in CONTROLLERS {
        let replica =
            Replica::connect_with(&a.grpc, rbac::configmaps_in(name, &["ring"]), Some(&auth))
                .await
                .expect("the only member owns every controller");
        first.push(tokio::spawn(serve(replica)));
    }
    let mut b = Manager::start(&c, "ring-b", &member("1000")).await;
    wait_until(
        "a controller's session on ring-a ends as its unit moves",
        || {
            let done = first.iter().any(|h| h.is_finished());
            async move { done }
        },
    )
    .await;
    // Every controller again, first through ring-a: a moved one is redirected to ring-b.
    let mut redirected = 0;
    let mut served = Vec::new();
    for name in CONTROLLERS {
        let register = || rbac::configmaps_in(name, &["ring"]);
        let replica = match Replica::connect_with(&a.grpc, register(), Some(&auth)).await {
            Ok(r) => r,
            Err(_) => {
                redirected += 1;
                Replica::connect_with(&b.grpc, register(), Some(&auth))
                    .await
                    .expect("the owner accepts")
            }
        };
        served.push(tokio::spawn(serve(replica)));
    }
    assert!(redirected > 0, "a moved controller is redirected by ring-a");

    let token_file = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(token_file.path(), prometheus_token(&c).await).expect("token written");
    let targets: Vec<String> = [&a, &b]
        .iter()
        .map(|m| m.http.split("://").nth(1).expect("host:port").to_string())
        .collect();
    let rules_dir = tempfile::tempdir().expect("rules dir");
    let prom = Prometheus::start(
        &targets,
        &scrape_settings(token_file.path()),
        &rules_with_short_for(rules_dir.path()),
    )
    .await;
    let http = reqwest::Client::new();
    let expected = BTreeMap::from([
        ("job", JOB),
        ("namespace", NAMESPACE),
        ("tenant", "system:serviceaccounts:ring"),
        ("controller", CONTROLLERS[0]),
    ]);
    settle(
        "the Ring row's panels",
        Duration::from_secs(120),
        || async {
            let mut failures = Vec::new();
            let vars = resolve_variables(&prom, &http, &expected, &mut failures).await;
            if failures.is_empty() {
                // Series, not values: a handover's rate is 0 (its quantile NaN) once the move is
                // older than the rate window.
                check_panels(&prom, &http, &vars, Mode::Ring, false, &mut failures).await;
            }
            for (what, query) in [
                (
                    "units moved in",
                    r#"sum(ctrlhub_ring_unit_moves_total{direction="in"}) > 0"#,
                ),
                (
                    "units moved out",
                    r#"sum(ctrlhub_ring_unit_moves_total{direction="out"}) > 0"#,
                ),
                ("redirects", "sum(ctrlhub_ring_redirects_total) > 0"),
                (
                    "handovers sealed",
                    r#"sum(ctrlhub_ring_handover_seconds_count{phase="seal"}) > 0"#,
                ),
                (
                    "handovers acquired",
                    r#"sum(ctrlhub_ring_handover_seconds_count{phase="acquire"}) > 0"#,
                ),
                (
                    "both members in each view",
                    "min(ctrlhub_ring_members) == 2",
                ),
            ] {
                match prom.query(&http, query).await {
                    Ok(r) if r.is_empty() => failures.push(describe(what, query, "empty result")),
                    Ok(_) => {}
                    Err(e) => failures.push(describe(what, query, &e)),
                }
            }
            for r in ring_alerts() {
                let (alert, expr) = (
                    r["alert"].as_str().unwrap_or_default(),
                    r["expr"].as_str().unwrap_or_default(),
                );
                match prom.query(&http, expr).await {
                    Ok(res) if !res.is_empty() => failures.push(describe(
                        &format!("alert {alert}"),
                        expr,
                        &format!("fires on a healthy ring: {res:?}"),
                    )),
                    Ok(_) => {}
                    Err(e) => failures.push(describe(&format!("alert {alert}"), expr, &e)),
                }
            }
            failures
        },
    )
    .await;

    // ring-b SIGKILLed while it owns units: ring-a sees its Lease age past twice the lease.
    b.kill().await;
    let took = wait_firing(
        &prom,
        &http,
        "CtrlhubMemberStoppedRenewing",
        r#", peer="ring-b""#,
    )
    .await;
    println!(
        "CtrlhubMemberStoppedRenewing fired {took:?} after ring-b was killed (for: {FIRED_FOR})"
    );
    for h in first.into_iter().chain(served) {
        h.abort();
    }
}

/// The alerting rules of the `ctrlhub.ring` group.
fn ring_alerts() -> Vec<Yaml> {
    let doc = yaml(&rules_file());
    doc["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["name"] == "ctrlhub.ring")
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["alert"].is_string())
        .collect()
}

/// Answers every request Done until the session ends (revoked, e.g. as its unit moves, or
/// closed).
async fn serve(mut replica: Replica) {
    while let Ok(request) = replica.recv().await {
        if let Some(req) = request {
            replica
                .reply(&req.id, Outcome::Done(pb::reconcile_result::Done {}))
                .await;
        }
    }
}

/// Tenant `calm`'s controller `quiet`: registered over namespace `calm`, which holds nothing,
/// so it never reconciles; a cached List every second (a unary gRPC call) is all it does.
async fn idle_controller(c: &Cluster, m: &Manager) -> tokio::task::JoinHandle<()> {
    let auth = rbac::tenant(c, "calm", "ctl").await;
    rbac::grant_configmaps(c, "calm", "ctl", Some("calm")).await;
    let quiet = Replica::connect_with(
        &m.grpc,
        rbac::configmaps_in("quiet", &["calm"]),
        Some(&auth),
    )
    .await
    .expect("the idle controller registers");
    tokio::spawn(async move {
        // The whole replica, not only the fields the loop reads: its stream must stay open.
        let mut quiet = quiet;
        loop {
            let list = with_authorization(
                pb::ListRequest {
                    session_id: quiet.session_id.clone(),
                    resource: Some(pb::ResourceType {
                        group: String::new(),
                        version: "v1".into(),
                        kind: "ConfigMap".into(),
                        plural: String::new(),
                    }),
                    namespace: "calm".into(),
                    ..Default::default()
                },
                Some(&auth),
            );
            // Until the leader is killed at the end; a List that fails before shows as NaN in
            // the unary latency panel.
            if let Err(e) = quiet.client.list(list).await {
                println!("the idle controller stops listing: {e}");
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// One panel's query and answer, for the README.
async fn write_sample(prom: &Prometheus, http: &reqwest::Client, expected: &BTreeMap<&str, &str>) {
    let mut failures = Vec::new();
    let vars = resolve_variables(prom, http, expected, &mut failures).await;
    let (dash, title, expr) = prometheus_targets()
        .into_iter()
        .find(|(d, t, _)| d == "ctrlhub-overview" && t == "Reconcile rate per controller")
        .expect("overview has the reconcile rate panel");
    let query = substitute(&expr, &vars[dash.as_str()]);
    let result = prom.query(http, &query).await.expect("sample query");
    let sample = format!(
        "# {dash} / {title}\n# panel expr: {expr}\n# query:      {query}\n{}\n",
        serde_json::to_string_pretty(&result).unwrap_or_default()
    );
    println!("{sample}");
    std::fs::write(target_dir().join("dashboard-query-sample.txt"), &sample)
        .expect("sample written");
}
