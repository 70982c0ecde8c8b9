//! Auth: who is asking and what they may do — authentication of bearer tokens, RBAC
//! authorization, and the review APIs that expose both (TokenRequest, TokenReview,
//! SubjectAccessReview and its self and local forms).
//!
//! Owns:
//! - `token`: ServiceAccount JWTs — claims, HS256 signing and verification, audiences;
//! - `authn`: the authenticator (the admin token or a live ServiceAccount's token), the
//!   [`authn::Identity`] it yields, and the authentication and authorization counters;
//! - `rbac`: request attributes derived from the URL as kube-apiserver's RequestInfo does, and
//!   the RBAC decision over the stored Roles and bindings;
//! - `reviews`: the create-only review APIs, answered from the same authenticator and authorizer.
//!
//! May call `storage` (ServiceAccounts and RBAC objects are read live from the store), `catalog`
//! and the leaves; never `http`, which calls it.

pub(crate) mod authn;
pub(crate) mod rbac;
pub(crate) mod reviews;
pub(crate) mod token;
