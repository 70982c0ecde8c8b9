//! `/login` and `/logout`: how a person opens the status page in a browser under `--auth
//! kubernetes`. The form takes a token (what `kubectl create token` prints); the gate reviews
//! it and opens a session ([`super::session`]) whose cookie the browser then sends. The page is
//! one static form: no script, nothing loaded from elsewhere.

use super::access::{Gate, Refusal};
use super::session;
use super::status_page::Esc;
use super::{HttpState, Peer};
use axum::Form;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The largest login body read: a ServiceAccount token is a couple of KiB.
pub(crate) const MAX_LOGIN_BYTES: usize = 16 * 1024;

/// The login form's fields.
#[derive(Debug, serde::Deserialize)]
pub(super) struct LoginForm {
    token: String,
}

/// `GET /login`: the form, and who is logged in when the session cookie names a live session.
pub(super) async fn form(
    State(s): State<Arc<HttpState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Response {
    if matches!(s.gate, Gate::Open) {
        return see_other("/");
    }
    let who = s.gate.session_user(&headers, peer).await;
    page(StatusCode::OK, who.as_deref(), None)
}

/// `POST /login`: review the token, open a session, and go to the status page; the form again,
/// with the reason, when the token is not accepted.
pub(super) async fn submit(
    State(s): State<Arc<HttpState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return cross_site();
    }
    match s.gate.login(&f.token, peer).await {
        Ok(login) => {
            let mut r = see_other("/");
            if let Some(cookie) = session::set_cookie(&login.session, login.lifetime) {
                r.headers_mut().insert(header::SET_COOKIE, cookie);
            }
            r
        }
        Err(refusal) => {
            let status = refusal.status();
            page(status, None, Some(&why(&refusal)))
        }
    }
}

/// `POST /logout`: end the session and forget the cookie.
pub(super) async fn logout(State(s): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if !same_origin(&headers) {
        return cross_site();
    }
    s.gate.logout(&headers);
    let mut r = see_other("/login");
    r.headers_mut()
        .insert(header::SET_COOKIE, session::clear_cookie());
    r
}

/// Where a browser without credentials is sent from the status page.
pub(super) fn to_login() -> Response {
    see_other("/login")
}

/// Whether an unauthenticated request is a browser's (no bearer header, and it asks for HTML),
/// which gets the login form; scripts and scrapers keep getting a plain 401.
pub(super) fn wants_login(headers: &HeaderMap) -> bool {
    let html = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"));
    html && !headers.contains_key(header::AUTHORIZATION)
}

fn see_other(to: &'static str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, HeaderValue::from_static(to)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
    )
        .into_response()
}

/// Browsers say where a request comes from (`Sec-Fetch-Site`): a form posted from another site
/// must not log anyone in or out (the cookie is `SameSite=Strict`, this covers the login itself).
fn same_origin(headers: &HeaderMap) -> bool {
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none");
    matches!(site, "same-origin" | "none")
}

/// The answer to a login or logout posted from another site.
fn cross_site() -> Response {
    (
        StatusCode::FORBIDDEN,
        "a login or logout must come from this page itself\n",
    )
        .into_response()
}

/// What the person is told when the token is not accepted.
fn why(refusal: &Refusal) -> String {
    match refusal {
        Refusal::Unauthenticated(msg) => format!(
            "The API server did not accept this token ({msg}). Paste the whole token, as kubectl create token prints it, before it expires."
        ),
        Refusal::TooMany(msg) => format!("Too many failed logins from your address: {msg}"),
        Refusal::Unavailable(msg) => format!("The token cannot be checked right now: {msg}"),
        Refusal::Forbidden(msg) => msg.clone(),
    }
}

const STYLE: &str = "body{font:15px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}\
main{max-width:40rem;margin:4rem auto;padding:2rem;background:#fff;border:1px solid #d8dce3;border-radius:8px}\
h1{margin:0 0 1rem;font-size:1.4rem}textarea{width:100%;box-sizing:border-box;font:13px ui-monospace,monospace}\
button{margin-top:.8rem;padding:.45rem 1.2rem;font-size:1rem}.error{background:#fdecec;border:1px solid #e3a1a1;padding:.6rem .8rem;border-radius:6px}\
.hint{color:#5b6475;font-size:.9rem}code{font:13px ui-monospace,monospace}";

/// The login page as a response.
fn page(status: StatusCode, who: Option<&str>, error: Option<&str>) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html(who, error),
    )
        .into_response()
}

/// The login page: the form, who is logged in, and what went wrong, all escaped.
fn html(who: Option<&str>, error: Option<&str>) -> String {
    let mut html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>ctrlhub · log in</title>\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{STYLE}</style></head><body><main>\
<h1>ctrlhub status page</h1>"
    );
    if let Some(error) = error {
        html.push_str(&format!(
            "<p class=\"error\" id=\"login-error\" role=\"alert\">{}</p>",
            Esc(error)
        ));
    }
    if let Some(who) = who {
        html.push_str(&format!(
            "<p id=\"signed-in\">Logged in as <b>{}</b>. <a href=\"/\">Open the status page</a>.</p>\
<form method=\"post\" action=\"/logout\"><button type=\"submit\" id=\"logout\">Log out</button></form><hr>",
            Esc(who)
        ));
    }
    html.push_str(
        "<form method=\"post\" action=\"/login\" id=\"login\"><label for=\"token\">Token</label>\
<textarea id=\"token\" name=\"token\" rows=\"6\" autocomplete=\"off\" spellcheck=\"false\" required \
placeholder=\"kubectl create token &lt;serviceaccount&gt;\"></textarea>\
<p class=\"hint\">A token the cluster's API server accepts, e.g. <code>kubectl -n ctrlhub-system create token oncall</code>. \
You see what its identity may see. The token stays on this manager; the browser keeps only a session cookie, \
which ends with the token, at <b>Log out</b>, or after 8 hours.</p>\
<button type=\"submit\" id=\"submit\">Log in</button></form></main></body></html>",
    );
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_browser_without_a_bearer_header_is_sent_to_the_login() {
        let mut h = HeaderMap::new();
        assert!(!wants_login(&h), "curl and scrapers get a 401");
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html,application/xhtml+xml,*/*;q=0.8"),
        );
        assert!(wants_login(&h));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert!(!wants_login(&h), "a rejected bearer token is answered 401");
    }

    #[test]
    fn a_form_from_another_site_is_refused() {
        let mut h = HeaderMap::new();
        assert!(same_origin(&h), "curl sends no Sec-Fetch-Site");
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn the_reason_and_the_user_are_shown_as_text() {
        let text = why(&Refusal::Unauthenticated("expired".into()));
        assert!(
            text.starts_with("The API server did not accept this token (expired)"),
            "{text}"
        );
        let page = html(Some("<b>eve</b>"), Some("bad <script>x</script>"));
        assert!(
            page.contains("bad &lt;script&gt;x&lt;/script&gt;"),
            "{page}"
        );
        assert!(page.contains("&lt;b&gt;eve&lt;/b&gt;"), "{page}");
        assert!(!page.contains("<script"), "{page}");
    }
}
