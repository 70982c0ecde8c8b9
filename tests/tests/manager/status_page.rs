//! The manager's status page at `/`, read the way a person reads it: in a real browser (headless
//! Chromium) against the real `ctrlhub` binary, with a controller that has a key in flight, keys
//! queued behind it and a recent failure. Saves a screenshot to `target/status-page.png`.
//!
//! Needs Debian's `chromium` on PATH (`apt-get install chromium`).

use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::process::Command;

/// A controller message with markup in it: the page must show it as text, never run it.
const ERROR_MESSAGE: &str =
    "bucket quota exceeded (ref 7f3a-status) <script>document.title=42</script>";
/// How Chromium serializes that message back out of the DOM when it stayed text.
const ERROR_MESSAGE_IN_DOM: &str =
    "bucket quota exceeded (ref 7f3a-status) &lt;script&gt;document.title=42&lt;/script&gt;";

const IDENTITY: &str = "status-page-a";
const CONTROLLER: &str = "pager";

/// `chromium` on PATH, or a failure that says how to install it.
fn chromium() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("chromium"))
        .find(|p| p.is_file())
        .expect(
            "the status page test drives a real browser: `chromium` is not on PATH \
             (install it with `apt-get install chromium`)",
        )
}

/// Run headless Chromium with `args` and return its stdout; killed (with everything it
/// started) and failed after [`PATIENCE`].
async fn run_chromium(args: &[String]) -> String {
    let profile = tempfile::tempdir().expect("chromium profile dir");
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        // The test runs as root, where Chromium refuses its sandbox.
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    // Its own process group, so a timeout can end the renderer and GPU helpers too.
    .process_group(0)
    .kill_on_drop(true);
    let child = cmd.spawn().expect("chromium starts");
    let pid = child.id();
    match tokio::time::timeout(PATIENCE, child.wait_with_output()).await {
        Ok(out) => {
            let out = out.expect("chromium output");
            assert!(
                out.status.success(),
                "chromium {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).expect("chromium prints UTF-8")
        }
        Err(_) => {
            if let Some(pid) = pid {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
            panic!("chromium {args:?} did not finish within {PATIENCE:?}");
        }
    }
}

/// The part of `html` from `start` (which must occur) to the first `end` after it.
fn part<'a>(html: &'a str, start: &str, end: &str) -> &'a str {
    let from = html
        .find(start)
        .unwrap_or_else(|| panic!("the page has no {start:?}:\n{html}"));
    let rest = &html[from..];
    let to = rest.find(end).map_or(rest.len(), |i| i + end.len());
    &rest[..to]
}

/// Answer Done to every request until the one for `want` arrives, and return that one.
async fn answer_until(r: &mut Replica, want: &str) -> pb::ReconcileRequest {
    loop {
        let req = r.expect().await;
        if key(&req) == want {
            return req;
        }
        r.done(&req.id).await;
    }
}

fn controller(status: &serde_json::Value) -> serde_json::Value {
    status["controllers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == CONTROLLER))
        .cloned()
        .unwrap_or_default()
}

fn lists_key(list: &serde_json::Value, key: &str) -> bool {
    list.as_array()
        .is_some_and(|l| l.iter().any(|e| e["key"] == key))
}

/// A person on call opens `/` in a browser and finds: who leads, the controller and its tenant,
/// its session, the key stuck in flight, the keys waiting behind it, the failure with its
/// message, and the informer with the cluster's object count.
#[tokio::test]
async fn status_page_shows_what_a_person_on_call_looks_for() {
    let browser = chromium();
    println!("browser: {}", browser.display());
    let c = start_cluster().await;
    let m = Manager::start(&c, IDENTITY, &[]).await;
    m.wait_leading().await;

    // One replica with one credit: while it holds a request, everything else queues.
    let mut reg = register_configmaps(CONTROLLER, 1);
    reg.request_deadline = Some(secs(600.0));
    let mut r = Replica::connect(&m.grpc, reg)
        .await
        .expect("replica registers");

    // A failure, retried only much later so it stays out of the way.
    put_configmap(&c.client, "default", "st-fails", &[("v", "1")]).await;
    let failing = answer_until(&mut r, "default/st-fails").await;
    r.reply(
        &failing.id,
        pb::reconcile_result::Outcome::Error(pb::reconcile_result::Error {
            message: ERROR_MESSAGE.into(),
            retry_after: Some(secs(3600.0)),
        }),
    )
    .await;

    // A key polled every 5 minutes: scheduled, not failing and not queued.
    put_configmap(&c.client, "default", "st-polled", &[("v", "1")]).await;
    let polled = answer_until(&mut r, "default/st-polled").await;
    r.reply(
        &polled.id,
        pb::reconcile_result::Outcome::RequeueAfter(pb::reconcile_result::RequeueAfter {
            delay: Some(secs(300.0)),
        }),
    )
    .await;

    // A key held in flight: never answered while the test looks.
    put_configmap(&c.client, "default", "st-held", &[("v", "1")]).await;
    let held = answer_until(&mut r, "default/st-held").await;

    // Keys that queue behind it.
    for i in 0..3 {
        put_configmap(
            &c.client,
            "default",
            &format!("st-queued-{i}"),
            &[("v", "1")],
        )
        .await;
    }
    let objects = Api::<ConfigMap>::all(c.client.clone())
        .list(&ListParams::default())
        .await
        .expect("list configmaps")
        .items
        .len();

    // The JSON carries the same facts; wait on it so the browser sees a settled page.
    wait_for(
        "status shows held, queued, failed keys and the full cache",
        || async {
            let s = m.status().await;
            let ctl = controller(&s);
            lists_key(&ctl["inFlightKeys"], "default/st-held")
                && lists_key(&ctl["queuedKeys"], "default/st-queued-2")
                && ctl["recentErrors"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e["message"] == ERROR_MESSAGE))
                && s["informers"].as_array().is_some_and(|i| {
                    i.iter()
                        .any(|i| i["informer"] == "v1/configmaps" && i["objects"] == objects)
                })
        },
    )
    .await;
    let status = m.status().await;
    assert_eq!(status["lease"]["holder"], IDENTITY);
    assert_eq!(controller(&status)["sessionList"][0]["credits"], 1);
    // Keys on a timer are told apart: the requeue-after one is scheduled, the failed one is
    // failing, and neither is counted with the three keys queued behind the held one.
    let ctl = controller(&status);
    assert_eq!(
        (&ctl["queued"], &ctl["scheduled"], &ctl["failing"]),
        (
            &serde_json::json!(3),
            &serde_json::json!(1),
            &serde_json::json!(1)
        ),
        "{ctl}"
    );
    let lane_of = |key: &str| {
        ctl["queuedKeys"]
            .as_array()
            .and_then(|l| l.iter().find(|e| e["key"] == key))
            .map(|e| (e["lane"].clone(), e["dueInSeconds"].as_f64().unwrap_or(0.0)))
    };
    let (lane, due) = lane_of("default/st-polled").expect("the polled key is listed");
    assert_eq!(lane, "scheduled");
    assert!(due > 250.0 && due <= 300.0, "due in {due} s");
    assert_eq!(
        lane_of("default/st-fails").map(|l| l.0),
        Some("retry".into())
    );
    assert_eq!(status["tenants"][0]["scheduled"], 1, "{status}");

    let resp = reqwest::get(format!("{}/", m.http))
        .await
        .expect("status page reachable");
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/html; charset=utf-8")
    );

    // The rendered DOM, as the browser built it (so a script that ran would show).
    let url = format!("{}/?refresh=0", m.http);
    let dom = run_chromium(&["--dump-dom".to_owned(), url]).await;
    let out = target_dir();
    std::fs::create_dir_all(&out).expect("target dir");
    std::fs::write(out.join("status-page.html"), &dom).expect("DOM saved");

    assert!(
        dom.contains(&format!("<title>ctrlhub · {IDENTITY} · leader</title>")),
        "the title names this manager as leader and no script rewrote it:\n{dom}"
    );

    let banner = part(&dom, "id=\"leadership\"", "</section>");
    assert!(banner.contains("data-leading=\"true\""), "{banner}");
    assert!(
        banner.contains("LEADER"),
        "the banner says leader: {banner}"
    );
    assert!(
        banner.contains(&format!("id=\"lease-holder\">{IDENTITY}</b>")),
        "the banner names the holder: {banner}"
    );

    let tenants = part(&dom, "id=\"tenants\"", "</section>");
    assert!(
        tenants.contains("<tr data-tenant=\"dev\"><td>dev</td><td class=\"num\">1</td>"),
        "tenant dev with one controller: {tenants}"
    );

    let ctl = part(
        &dom,
        &format!("data-tenant=\"dev\" data-name=\"{CONTROLLER}\""),
        "</article>",
    );
    assert!(
        ctl.contains(&format!("<span class=\"name\">{CONTROLLER}</span>")),
        "{ctl}"
    );
    assert!(ctl.contains("v1/ConfigMap"), "primary kind shown: {ctl}");
    assert!(
        ctl.contains("data-stat=\"sessions\"><span class=\"n\">1</span>"),
        "one session: {ctl}"
    );
    let sessions = part(ctl, "data-list=\"sessions\"", "</table>");
    assert_eq!(
        sessions.matches("<tr data-session=").count(),
        1,
        "{sessions}"
    );
    assert!(
        sessions.contains("<td class=\"num\">1</td><td class=\"num\">1</td>"),
        "credits 1, in flight 1: {sessions}"
    );

    let in_flight = part(ctl, "data-list=\"in-flight\"", "</table>");
    assert!(
        in_flight.contains("<td class=\"key\">default/st-held</td><td class=\"num\">1</td>"),
        "the held key in flight on attempt 1: {in_flight}"
    );
    let queued = part(ctl, "data-list=\"queued\"", "</table>");
    for i in 0..3 {
        assert!(
            queued.contains(&format!("<td class=\"key\">default/st-queued-{i}</td>")),
            "st-queued-{i} waits: {queued}"
        );
    }
    assert!(
        queued.contains("<td class=\"key\">default/st-fails</td><td>failing, retry in"),
        "the failed key waits on its retry: {queued}"
    );
    assert!(
        queued.contains("<td class=\"key\">default/st-polled</td><td>scheduled, due in 4m"),
        "the polled key is scheduled, not failing: {queued}"
    );
    assert!(
        ctl.contains("data-stat=\"scheduled\"><span class=\"n\">1</span>")
            && ctl.contains("data-stat=\"queued\"><span class=\"n\">3</span>"),
        "one scheduled key, three queued: {ctl}"
    );

    let errors = part(ctl, "data-list=\"recent-errors\"", "</table>");
    assert!(
        errors.contains(ERROR_MESSAGE_IN_DOM),
        "the error message, as text: {errors}"
    );
    assert!(
        errors.contains("<td class=\"key\">default/st-fails</td>"),
        "{errors}"
    );
    assert!(
        errors.contains("<span class=\"kind\">error</span>"),
        "{errors}"
    );
    assert!(
        !dom.contains("<script"),
        "no script element in the page at all"
    );

    assert!(
        ctl.contains("<span class=\"stat bad\" data-stat=\"errors\"><span class=\"n\">1</span>"),
        "the error count is highlighted: {ctl}"
    );
    // Air-gapped: nothing is loaded from anywhere else.
    for external in ["http://", "https://", "<link", "src=", "@import", "url("] {
        assert!(!dom.contains(external), "the page refers to {external}");
    }

    let informers = part(&dom, "id=\"informers\"", "</section>");
    assert!(
        informers.contains(&format!(
            "<tr data-informer=\"v1/configmaps\"><td class=\"mono\">v1/configmaps</td><td class=\"num\" data-objects=\"{objects}\">{objects}</td><td><span class=\"pill ok\">synced</span>"
        )),
        "the ConfigMap informer holds all {objects} objects and is synced: {informers}"
    );

    // What a person sees.
    let png = out.join("status-page.png");
    let _ = std::fs::remove_file(&png);
    run_chromium(&[
        format!("--screenshot={}", png.display()),
        "--window-size=1280,1600".to_owned(),
        format!("{}/", m.http),
    ])
    .await;
    check_png(&png);
    println!(
        "status page screenshot: {}",
        std::fs::canonicalize(&png).unwrap_or(png).display()
    );

    // A second manager on the same Lease: its page says standby and who leads instead.
    let standby = Manager::start(&c, "status-page-b", &[]).await;
    wait_for("the standby has seen the holder", || async {
        standby.status().await["leader"] == IDENTITY
    })
    .await;
    let dom = run_chromium(&[
        "--dump-dom".to_owned(),
        format!("{}/?refresh=0", standby.http),
    ])
    .await;
    let banner = part(&dom, "id=\"leadership\"", "</section>");
    assert!(banner.contains("data-leading=\"false\""), "{banner}");
    assert!(
        banner.contains("STANDBY"),
        "the banner says standby: {banner}"
    );
    assert!(
        banner.contains(&format!("id=\"lease-holder\">{IDENTITY}</b>")),
        "the standby names the leader: {banner}"
    );
    let png = out.join("status-page-standby.png");
    let _ = std::fs::remove_file(&png);
    run_chromium(&[
        format!("--screenshot={}", png.display()),
        "--window-size=1280,900".to_owned(),
        format!("{}/", standby.http),
    ])
    .await;
    check_png(&png);
    println!(
        "standby screenshot: {}",
        std::fs::canonicalize(&png).unwrap_or(png).display()
    );

    // The held request is still ours to answer: the page only looked.
    r.done(&held.id).await;
}

fn check_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
    assert!(
        bytes.len() > 20_000,
        "{} is only {} bytes: a blank page?",
        path.display(),
        bytes.len()
    );
}

/// Under `--auth kubernetes` a person opens the page in a real browser, which cannot send a
/// bearer header: `/` leads to the login form; a wrong token gets the form again with a clear
/// reason and no cookie; team-a's ServiceAccount token opens a session whose cookie is
/// `Secure`, `HttpOnly` (no script reads it) and `SameSite=Strict`, and the page then shows
/// only what that identity may see (its tenant's controller, not team-b's); logging out ends
/// it. On main `/` answered 401 to the browser and nothing let a person log in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_logs_in_with_a_token_and_sees_what_its_identity_may() {
    use ctrlhub_tests::browser::Browser;
    use ctrlhub_tests::rbac;
    let c = start_cluster().await;
    let m = rbac::rbac_manager(&c, "login-a").await;
    let mut replicas = Vec::new();
    for (ns, name) in [("team-a", "pager-a"), ("team-b", "pager-b")] {
        let auth = rbac::tenant(&c, ns, "ctl").await;
        rbac::grant_configmaps(&c, ns, "ctl", Some(ns)).await;
        let reg = rbac::configmaps_in(name, &[ns]);
        let r = Replica::connect_with(&m.grpc, reg, Some(&auth))
            .await
            .expect("registers");
        replicas.push(r);
    }
    // What `kubectl -n team-a create token ctl` prints: a token for the API server's audience.
    let token =
        c.dc.issue_token("team-a", "ctl", &[], std::time::Duration::from_secs(3600))
            .expect("token");

    let browser = Browser::launch().await.expect("chromium starts");
    let mut page = browser.page().await.expect("a tab");
    page.goto(&format!("{}/", m.http)).await.expect("navigates");
    page.wait_for(
        "the page sends a browser without credentials to the login form",
        "location.pathname === '/login' && !!document.querySelector('#token')",
    )
    .await
    .expect("login form");

    page.type_into("#token", "not-a-token")
        .await
        .expect("typed");
    page.click("#submit").await.expect("clicked");
    page.wait_for("the refusal", "!!document.querySelector('#login-error')")
        .await
        .expect("refusal shown");
    let refused = page.html().await.expect("html");
    assert!(
        refused.contains("The API server did not accept this token"),
        "a clear message: {refused}"
    );
    page.screenshot(&target_dir().join("status-page-login-refused.png"))
        .await
        .expect("screenshot");
    let session = |cookies: &[serde_json::Value]| {
        cookies
            .iter()
            .find(|c| c["name"] == "__Host-ctrlhub-session")
            .cloned()
    };
    assert!(session(&page.cookies().await.expect("cookies")).is_none());

    page.type_into("#token", &token).await.expect("typed");
    page.click("#submit").await.expect("clicked");
    page.wait_for(
        "the status page after the login",
        "location.pathname === '/' && !!document.querySelector('#leadership')",
    )
    .await
    .expect("status page");
    let dom = page.html().await.expect("html");
    assert!(
        dom.contains("data-name=\"pager-a\""),
        "team-a's controller: {dom}"
    );
    assert!(
        !dom.contains("pager-b") && !dom.contains("team-b"),
        "nothing of team-b: {dom}"
    );
    let shot = target_dir().join("status-page-login.png");
    page.screenshot(&shot).await.expect("screenshot");
    println!("logged-in page: {}", shot.display());
    let cookie = session(&page.cookies().await.expect("cookies")).expect("a session cookie");
    assert_eq!(cookie["secure"], true, "{cookie}");
    assert_eq!(cookie["httpOnly"], true, "{cookie}");
    assert_eq!(cookie["sameSite"], "Strict", "{cookie}");
    assert_eq!(cookie["path"], "/", "{cookie}");
    assert!(
        cookie["value"]
            .as_str()
            .is_some_and(|v| v.len() == 43 && v != token),
        "a random id, not the token: {cookie}"
    );
    assert_eq!(
        page.eval("document.cookie").await.expect("eval"),
        "",
        "no script can read the session"
    );

    page.goto(&format!("{}/status", m.http))
        .await
        .expect("navigates");
    page.wait_for("JSON", "document.body.innerText.startsWith('{')")
        .await
        .expect("status JSON");
    let text = page.eval("document.body.innerText").await.expect("eval");
    let status: serde_json::Value =
        serde_json::from_str(text.as_str().unwrap_or_default()).expect("JSON");
    assert_eq!(status["view"]["scope"], "tenant", "{status}");

    page.goto(&format!("{}/login", m.http))
        .await
        .expect("navigates");
    page.wait_for("who is logged in", "!!document.querySelector('#signed-in')")
        .await
        .expect("signed in");
    let signed = page.html().await.expect("html");
    assert!(
        signed.contains("system:serviceaccount:team-a:ctl"),
        "{signed}"
    );
    page.click("#logout").await.expect("clicked");
    page.wait_for(
        "logged out",
        "location.pathname === '/login' && !document.querySelector('#signed-in')",
    )
    .await
    .expect("logged out");
    assert!(session(&page.cookies().await.expect("cookies")).is_none());
    page.goto(&format!("{}/", m.http)).await.expect("navigates");
    page.wait_for(
        "the page asks for a login again",
        "location.pathname === '/login' && !!document.querySelector('#token')",
    )
    .await
    .expect("login again");
    drop(replicas);
}
