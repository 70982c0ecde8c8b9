//! Browser sessions of the HTTP port under `--auth kubernetes`. A browser cannot send a bearer
//! header, so a person logs in with a token once ([`super::login`]) and the browser keeps a
//! cookie naming a session. The session holds the token, not a decision: every request is
//! authenticated again with that token (through the review cache) and authorized as its
//! identity, so the cookie carries no more than the token does, and a revoked token ends it.
//!
//! Bounded where it enters: only a token TokenReview accepted opens a session (strangers cannot
//! fill memory), at most [`PER_IDENTITY`] per identity and [`MAX_SESSIONS`] in all, each for
//! at most [`SESSION_TTL`] and never past its token's own expiry.

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine as _;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

/// The cookie's name. `__Host-` makes browsers accept it only `Secure`, for `Path=/` and
/// without `Domain`: no other host or plain-HTTP page can set or shadow it.
pub(crate) const COOKIE: &str = "__Host-ctrlhub-session";
/// The longest a session lives.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Sessions one identity may hold; a new one ends its oldest.
pub(crate) const PER_IDENTITY: usize = 8;
/// Sessions in all; a new one ends the oldest.
pub(crate) const MAX_SESSIONS: usize = 1024;

/// One logged-in browser.
struct Session {
    token: String,
    username: String,
    opened: Instant,
    expires: Instant,
}

/// The sessions of one manager (they do not survive a restart or follow a failover).
#[derive(Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Session>>,
}

/// Why no session id could be made.
#[derive(Debug, thiserror::Error)]
#[error("no random session id: {0}")]
pub(crate) struct NoRandom(String);

impl Sessions {
    /// Opens a session for `token`, whose identity is `username` and which expires at
    /// `token_expiry` (if it says); returns its id and how long it lives.
    pub(crate) fn open(
        &self,
        token: &str,
        username: &str,
        token_expiry: Option<SystemTime>,
        now: Instant,
    ) -> Result<(String, Duration), NoRandom> {
        let left = token_expiry
            .map(|at| at.duration_since(SystemTime::now()).unwrap_or_default())
            .unwrap_or(SESSION_TTL)
            .min(SESSION_TTL);
        let id = random_id()?;
        let mut open = self.open.lock();
        open.retain(|_, s| s.expires > now);
        let mine: Vec<(String, Instant)> = open
            .iter()
            .filter(|(_, s)| s.username == username)
            .map(|(id, s)| (id.clone(), s.opened))
            .collect();
        if mine.len() >= PER_IDENTITY {
            evict_oldest(&mut open, mine);
        }
        if open.len() >= MAX_SESSIONS {
            let all = open.iter().map(|(id, s)| (id.clone(), s.opened)).collect();
            evict_oldest(&mut open, all);
        }
        open.insert(
            id.clone(),
            Session {
                token: token.to_string(),
                username: username.to_string(),
                opened: now,
                expires: now + left,
            },
        );
        Ok((id, left))
    }

    /// The token of live session `id`; an expired one is ended.
    pub(crate) fn token(&self, id: &str, now: Instant) -> Option<String> {
        let mut open = self.open.lock();
        match open.get(id) {
            Some(s) if s.expires > now => Some(s.token.clone()),
            Some(_) => {
                open.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends session `id` (log out, or its token was rejected).
    pub(crate) fn close(&self, id: &str) {
        self.open.lock().remove(id);
    }

    /// How many sessions are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().len()
    }
}

/// Removes the session opened first among `candidates`.
fn evict_oldest(open: &mut HashMap<String, Session>, candidates: Vec<(String, Instant)>) {
    if let Some((id, _)) = candidates.into_iter().min_by_key(|(_, opened)| *opened) {
        open.remove(&id);
    }
}

/// 256 random bits from the operating system, URL-safe.
fn random_id() -> Result<String, NoRandom> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|e| NoRandom(e.to_string()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The session id the request's `Cookie` header names, if any.
pub(crate) fn from_cookies(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|v| !v.is_empty())
}

/// `Set-Cookie` for session `id`, kept by the browser for `max_age`.
pub(crate) fn set_cookie(id: &str, max_age: Duration) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "{COOKIE}={id}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={}",
        max_age.as_secs()
    ))
    .ok()
}

/// `Set-Cookie` that makes the browser forget the session.
pub(crate) fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static(
        "__Host-ctrlhub-session=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_bounded_per_identity_and_in_all_and_expire() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let mut alice = Vec::new();
        for i in 0..=PER_IDENTITY {
            let at = t0 + Duration::from_secs(u64::try_from(i).unwrap_or(0));
            alice.push(s.open("a-token", "alice", None, at).expect("opened").0);
        }
        assert_eq!(s.len(), PER_IDENTITY, "a ninth session ends alice's oldest");
        assert!(s.token(&alice[0], t0).is_none());
        assert_eq!(s.token(&alice[1], t0).as_deref(), Some("a-token"));
        for i in 0..MAX_SESSIONS {
            let at = t0 + Duration::from_secs(100 + u64::try_from(i).unwrap_or(0));
            s.open("b-token", &format!("user-{i}"), None, at)
                .expect("opened");
        }
        assert_eq!(s.len(), MAX_SESSIONS, "never more in all");
        assert!(s.token(&alice[1], t0).is_none(), "the oldest went first");
        let late = t0 + SESSION_TTL + Duration::from_secs(2000);
        assert!(s.token(&alice[PER_IDENTITY], late).is_none(), "expired");
    }

    #[test]
    fn a_session_ends_with_its_token() {
        let s = Sessions::default();
        let now = Instant::now();
        let expiry = SystemTime::now() + Duration::from_secs(600);
        let (id, left) = s.open("t", "bob", Some(expiry), now).expect("opened");
        assert!(left <= Duration::from_secs(600), "{left:?}");
        assert!(s.token(&id, now + Duration::from_secs(601)).is_none());
        let (other, _) = s.open("t", "bob", None, now).expect("opened");
        assert_ne!(id, other, "ids are random");
        assert_eq!(other.len(), 43, "256 bits, base64url");
        s.close(&other);
        assert!(s.token(&other, now).is_none());
    }

    #[test]
    fn the_cookie_is_found_among_others_and_is_host_only_and_secure() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("theme=dark; __Host-ctrlhub-session=abc; x=y"),
        );
        assert_eq!(from_cookies(&h), Some("abc"));
        let set = set_cookie("abc", Duration::from_secs(60)).expect("header");
        let set = set.to_str().expect("ascii");
        for attr in [
            "Secure",
            "HttpOnly",
            "SameSite=Strict",
            "Path=/",
            "Max-Age=60",
        ] {
            assert!(set.contains(attr), "{set}");
        }
        assert!(!set.contains("Domain"), "{set}");
    }
}
