//! Headless Chromium driven over the DevTools protocol, for tests that act as a person does:
//! open a page, type into a form, press a button, read what the page shows and which cookies
//! the browser keeps. Needs Debian's `chromium` on PATH (`apt-get install chromium`).

use anyhow::{Context, Result, anyhow, bail};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Stdio;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::wait::{PATIENCE, poll_until};

/// `chromium` on PATH, or an error that says how to install it.
pub fn chromium() -> Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("chromium"))
        .find(|p| p.is_file())
        .context("the browser tests drive a real browser: `chromium` is not on PATH (install it with `apt-get install chromium`)")
}

/// A headless Chromium with a profile of its own; killed, with every process it started, on
/// drop.
pub struct Browser {
    child: tokio::process::Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium with its DevTools endpoint on a free loopback port. It trusts any
    /// certificate, as a person clicking through a self-signed certificate's warning does.
    pub async fn launch() -> Result<Browser> {
        let profile = tempfile::tempdir()?;
        let child = tokio::process::Command::new(chromium()?)
            .args([
                "--headless",
                // The tests run as root, where Chromium refuses its sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--ignore-certificate-errors",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so dropping it ends the renderer and GPU helpers too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .context("chromium starts")?;
        // Chromium writes the port it chose into the profile once it listens.
        let active = profile.path().join("DevToolsActivePort");
        let port = poll_until("chromium's DevTools port", PATIENCE, || async {
            let text = std::fs::read_to_string(&active).map_err(|e| e.to_string())?;
            text.lines()
                .next()
                .and_then(|l| l.trim().parse::<u16>().ok())
                .ok_or_else(|| format!("no port yet in {text:?}"))
        })
        .await?;
        Ok(Browser {
            child,
            port,
            _profile: profile,
        })
    }

    /// The browser's one tab.
    pub async fn page(&self) -> Result<Page> {
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{}/json/list", self.port))
            .await?
            .json()
            .await?;
        let url = targets
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .with_context(|| format!("no page among {targets}"))?;
        let (ws, _) = tokio_tungstenite::connect_async(url).await?;
        Ok(Page { ws, next: 0 })
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
    }
}

/// A tab, commanded over its DevTools WebSocket.
pub struct Page {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next: u64,
}

impl Page {
    /// Calls DevTools `method` and returns its result; events that arrive meanwhile are dropped.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        self.next += 1;
        let id = self.next;
        let request = json!({"id": id, "method": method, "params": params});
        self.ws.send(Message::text(request.to_string())).await?;
        let answer = tokio::time::timeout(PATIENCE, async {
            while let Some(msg) = self.ws.next().await {
                let Message::Text(text) = msg? else { continue };
                let v: Value = serde_json::from_str(text.as_str())?;
                if v["id"] == id {
                    return Ok(v);
                }
            }
            bail!("the browser closed the DevTools connection")
        })
        .await
        .map_err(|_| anyhow!("{method}: no answer within {PATIENCE:?}"))??;
        if !answer["error"].is_null() {
            bail!("{method}: {}", answer["error"]);
        }
        Ok(answer["result"].clone())
    }

    /// Opens `url` in the tab (as typing it into the address bar does).
    pub async fn goto(&mut self, url: &str) -> Result<()> {
        self.call("Page.navigate", json!({"url": url})).await?;
        Ok(())
    }

    /// The value of the JavaScript expression `js` in the page.
    pub async fn eval(&mut self, js: &str) -> Result<Value> {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": js, "returnByValue": true}),
            )
            .await?;
        if !r["exceptionDetails"].is_null() {
            bail!("{js}: {}", r["exceptionDetails"]);
        }
        Ok(r["result"]["value"].clone())
    }

    /// Waits until `js` is true in the page (errors while a navigation replaces the page count
    /// as not yet).
    pub async fn wait_for(&mut self, what: &str, js: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            match self.eval(js).await {
                Ok(Value::Bool(true)) => return Ok(()),
                Ok(_) | Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(crate::wait::POLL_INTERVAL).await
                }
                Ok(v) => bail!("{what}: `{js}` is {v} after {PATIENCE:?}"),
                Err(e) => bail!("{what}: {e}"),
            }
        }
    }

    /// The document as the browser built it.
    pub async fn html(&mut self) -> Result<String> {
        let v = self.eval("document.documentElement.outerHTML").await?;
        v.as_str().map(String::from).context("outerHTML")
    }

    /// Types `text` into the element `selector` names, as a keyboard would.
    pub async fn type_into(&mut self, selector: &str, text: &str) -> Result<()> {
        let focus = format!("document.querySelector({}).focus()", json!(selector));
        self.eval(&focus).await?;
        self.call("Input.insertText", json!({"text": text})).await?;
        Ok(())
    }

    /// Clicks the element `selector` names.
    pub async fn click(&mut self, selector: &str) -> Result<()> {
        let click = format!("document.querySelector({}).click()", json!(selector));
        self.eval(&click).await?;
        Ok(())
    }

    /// Every cookie the browser keeps, with its attributes (`httpOnly`, `secure`, `sameSite`).
    pub async fn cookies(&mut self) -> Result<Vec<Value>> {
        let r = self.call("Network.getCookies", json!({})).await?;
        Ok(r["cookies"].as_array().cloned().unwrap_or_default())
    }

    /// A PNG screenshot of the tab, saved to `path`.
    pub async fn screenshot(&mut self, path: &std::path::Path) -> Result<()> {
        use base64::Engine as _;
        let r = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await?;
        let data = r["data"].as_str().context("screenshot data")?;
        std::fs::write(
            path,
            base64::engine::general_purpose::STANDARD.decode(data)?,
        )?;
        Ok(())
    }
}
