//! ServiceAccount tokens: JWTs signed with HS256 by a key made at start.
//!
//! kube-apiserver signs with an RSA/EC key so that outside parties can verify tokens offline
//! through OIDC discovery. devcluster serves no OIDC discovery, so every verifier goes through
//! TokenReview (or the API itself) and a symmetric key is enough; it keeps the dependency set to
//! `ring`, which TLS already builds. The claims are kube-apiserver's, so anything that decodes a
//! token's payload (e.g. to read `kubernetes.io.serviceaccount`) sees the familiar shape.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The audience (and issuer) of the API server itself: tokens for it authenticate API requests.
pub(crate) const API_AUDIENCE: &str = "https://kubernetes.default.svc";

/// Default lifetime of a TokenRequest token, as in Kubernetes.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(3600);

/// Shortest lifetime the TokenRequest API accepts, as in Kubernetes (the Rust handle may mint shorter).
pub(crate) const MIN_TTL: Duration = Duration::from_secs(600);

/// The `kubernetes.io` claim: which ServiceAccount the token is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct KubernetesClaim {
    /// The ServiceAccount's namespace.
    pub(crate) namespace: String,
    /// The ServiceAccount.
    pub(crate) serviceaccount: ObjectRef,
}

/// A name and uid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ObjectRef {
    /// Object name.
    pub(crate) name: String,
    /// Object uid; a token dies with the object it names.
    pub(crate) uid: String,
}

/// The payload of a ServiceAccount token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Claims {
    /// Issuer.
    pub(crate) iss: String,
    /// Subject: `system:serviceaccount:<namespace>:<name>`.
    pub(crate) sub: String,
    /// Audiences the token is valid for.
    pub(crate) aud: Vec<String>,
    /// Expiry, Unix seconds.
    pub(crate) exp: i64,
    /// Issued at, Unix seconds.
    pub(crate) iat: i64,
    /// Not before, Unix seconds.
    pub(crate) nbf: i64,
    /// Unique token id (reported in TokenReview's credential-id extra).
    pub(crate) jti: String,
    /// ServiceAccount identity.
    #[serde(rename = "kubernetes.io")]
    pub(crate) kubernetes: KubernetesClaim,
}

/// Why a token was not accepted. The messages follow kube-apiserver's wording.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum TokenError {
    /// Not three base64url parts with JSON header and payload.
    #[error("token is malformed")]
    Malformed,
    /// The signature does not match (tampered, or minted by another server).
    #[error("token signature is invalid")]
    BadSignature,
    /// Issued by another issuer.
    #[error("token issuer is invalid")]
    WrongIssuer,
    /// `exp` has passed.
    #[error("service account token has expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("service account token is not yet valid")]
    NotYetValid,
    /// None of the token's audiences is one the verifier accepts.
    #[error("token audiences {token:?} is invalid for the target audiences {target:?}")]
    Audience {
        /// The token's `aud`.
        token: Vec<String>,
        /// What the verifier accepts.
        target: Vec<String>,
    },
}

/// Mints and verifies tokens with one key.
pub(crate) struct Signer {
    key: hmac::Key,
    kid: String,
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: String,
    kid: String,
}

impl Signer {
    /// A signer with a fresh random key.
    pub(crate) fn generate() -> Self {
        let secret: [u8; 32] = rand::random();
        let kid = URL_SAFE_NO_PAD
            .encode(&ring::digest::digest(&ring::digest::SHA256, &secret).as_ref()[..12]);
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            kid,
        }
    }

    /// Claims for `namespace/name` (uid `uid`) valid from now for `ttl`.
    pub(crate) fn claims(
        namespace: &str,
        name: &str,
        uid: &str,
        audiences: Vec<String>,
        ttl: Duration,
    ) -> Claims {
        let now = jiff::Timestamp::now().as_second();
        let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
        Claims {
            iss: API_AUDIENCE.to_string(),
            sub: format!("system:serviceaccount:{namespace}:{name}"),
            aud: audiences,
            exp: now.saturating_add(ttl),
            iat: now,
            nbf: now,
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: KubernetesClaim {
                namespace: namespace.to_string(),
                serviceaccount: ObjectRef {
                    name: name.to_string(),
                    uid: uid.to_string(),
                },
            },
        }
    }

    /// Encode and sign.
    pub(crate) fn sign(&self, claims: &Claims) -> String {
        let header = Header {
            alg: "HS256".into(),
            typ: "JWT".into(),
            kid: self.kid.clone(),
        };
        // Serializing plain structs of strings and integers cannot fail.
        let header = serde_json::to_vec(&header).unwrap_or_default();
        let payload = serde_json::to_vec(claims).unwrap_or_default();
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let tag = hmac::sign(&self.key, signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// Check shape, signature, issuer and time; audiences and the ServiceAccount's existence are
    /// the caller's business (they depend on who asks and on the store).
    pub(crate) fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header: Header = URL_SAFE_NO_PAD
            .decode(header)
            .ok()
            .and_then(|h| serde_json::from_slice(&h).ok())
            .ok_or(TokenError::Malformed)?;
        if header.alg != "HS256" {
            return Err(TokenError::BadSignature);
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Malformed)?;
        let signed_len = token.len() - token.rsplit('.').next().map_or(0, str::len) - 1;
        hmac::verify(&self.key, &token.as_bytes()[..signed_len], &signature)
            .map_err(|_| TokenError::BadSignature)?;
        let claims: Claims = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .and_then(|p| serde_json::from_slice(&p).ok())
            .ok_or(TokenError::Malformed)?;
        if claims.iss != API_AUDIENCE {
            return Err(TokenError::WrongIssuer);
        }
        let now = jiff::Timestamp::now().as_second();
        if now >= claims.exp {
            return Err(TokenError::Expired);
        }
        if now < claims.nbf {
            return Err(TokenError::NotYetValid);
        }
        Ok(claims)
    }
}

/// The audiences both sides accept; an empty `wanted` means the API server's own audience.
pub(crate) fn intersect(token: &[String], wanted: &[String]) -> Result<Vec<String>, TokenError> {
    let target: Vec<String> = if wanted.is_empty() {
        vec![API_AUDIENCE.to_string()]
    } else {
        wanted.to_vec()
    };
    let both: Vec<String> = target
        .iter()
        .filter(|a| token.contains(a))
        .cloned()
        .collect();
    if both.is_empty() {
        Err(TokenError::Audience {
            token: token.to_vec(),
            target,
        })
    } else {
        Ok(both)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(ttl: Duration) -> Claims {
        Signer::claims("ns", "sa", "uid-1", vec!["aud".into()], ttl)
    }

    #[test]
    fn round_trip_and_tamper() {
        let s = Signer::generate();
        let c = claims(DEFAULT_TTL);
        let t = s.sign(&c);
        assert_eq!(s.verify(&t), Ok(c));
        // Flip one payload character: the signature no longer matches.
        let mut parts: Vec<String> = t.split('.').map(str::to_string).collect();
        let forged = Signer::claims("ns", "admin", "uid-1", vec!["aud".into()], DEFAULT_TTL);
        parts[1] = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).expect("json"));
        assert_eq!(s.verify(&parts.join(".")), Err(TokenError::BadSignature));
        assert_eq!(Signer::generate().verify(&t), Err(TokenError::BadSignature));
        assert_eq!(s.verify("a.b"), Err(TokenError::Malformed));
        assert_eq!(s.verify("devcluster-admin"), Err(TokenError::Malformed));
    }

    #[test]
    fn expiry() {
        let s = Signer::generate();
        assert_eq!(
            s.verify(&s.sign(&claims(Duration::ZERO))),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn audiences() {
        let aud = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            intersect(&aud, &["b".into(), "c".into()]),
            Ok(vec!["b".to_string()])
        );
        assert!(intersect(&aud, &["c".into()]).is_err());
        assert!(intersect(&aud, &[]).is_err());
        assert_eq!(
            intersect(&[API_AUDIENCE.to_string()], &[]),
            Ok(vec![API_AUDIENCE.to_string()])
        );
    }
}
