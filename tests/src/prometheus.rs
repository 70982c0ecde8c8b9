//! A real Prometheus server (Debian's `prometheus` package) as a child process, started from a
//! configuration the test writes, and the two questions the suites ask it: which targets it
//! scrapes, and what a query returns.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::process::Stdio;

use crate::process::try_free_port;
use crate::wait::{PATIENCE, poll_until};

/// A `prometheus` server, killed on drop.
pub struct Prometheus {
    _child: tokio::process::Child,
    /// Its HTTP API, e.g. `http://127.0.0.1:PORT`.
    pub url: String,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Prometheus {
    /// Starts Prometheus with `config` (YAML, or JSON, which YAML includes) and waits until it
    /// is ready.
    pub async fn start(config: &str) -> Result<Prometheus> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config)?;
        let port = try_free_port()?;
        let log = std::env::temp_dir().join(format!("ctrlhub-test-prometheus-{port}.log"));
        println!("prometheus logs to {}", log.display());
        let child = tokio::process::Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map(Stdio::from)?)
            .kill_on_drop(true)
            .spawn()
            .context("prometheus starts (tests/run.sh installs Debian's prometheus package)")?;
        let p = Prometheus {
            _child: child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
            http: reqwest::Client::new(),
        };
        poll_until("prometheus /-/ready", PATIENCE, || async {
            match p.http.get(format!("{}/-/ready", p.url)).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(r.status().to_string()),
                Err(e) => Err(format!("{e} (log: {})", log.display())),
            }
        })
        .await?;
        Ok(p)
    }

    /// `/api/v1/targets`: the active targets (with their labels and health) and the dropped ones.
    pub async fn targets(&self) -> Result<(Vec<Value>, Vec<Value>)> {
        let data = self.api("targets", &[]).await?;
        let list = |k: &str| data[k].as_array().cloned().unwrap_or_default();
        Ok((list("activeTargets"), list("droppedTargets")))
    }

    /// `/api/v1/query` now: the result vector.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let data = self.api("query", &[("query", expr)]).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Result<Value> {
        let body: Value = self
            .http
            .get(format!("{}/api/v1/{path}", self.url))
            .query(query)
            .send()
            .await?
            .json()
            .await?;
        if body["status"] != "success" {
            bail!("{}: {}", body["errorType"], body["error"]);
        }
        Ok(body["data"].clone())
    }
}
