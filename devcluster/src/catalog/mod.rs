//! Catalog: what the server serves — the resources a URL can name, their discovery entries, the
//! CRDs that add to them, their schemas and the OpenAPI documents.
//!
//! Owns:
//! - `resources`: the registry of served resource versions (built-in kinds plus CRD versions),
//!   looked up by a URL's group, version and plural, and the discovery documents built from it;
//! - `schema`: CRD structural schemas — pruning, defaulting and validating custom resources;
//! - `openapi`: the built-in kinds' OpenAPI definitions (from k8s-openapi) and the `/openapi/v2`
//!   and `/openapi/v3` documents.
//!
//! May call nothing else of the crate: every room above reads the catalog, the catalog reads
//! nobody.

pub(crate) mod openapi;
pub mod resources;
pub(crate) mod schema;
