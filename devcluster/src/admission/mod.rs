//! Admission: what a write must pass before it is stored, in kube-apiserver's order — decoding
//! checks against the kind's schema (`fieldValidation`), defaulting, then semantic validation.
//!
//! Owns:
//! - `fieldcheck`: JSON types against the built-in kinds' OpenAPI schemas, unknown fields and
//!   `?fieldValidation=` (`Strict`, `Warn`, `Ignore`);
//! - `defaults`: what kube-apiserver fills in on create (Namespace finalizer and phase, replicas,
//!   Job selectors, CRD conditions and accepted names);
//! - `validation`: kube-apiserver's semantic validation of the built-in kinds (422 `Invalid`
//!   with one cause per problem) and the labels Jobs get.
//!
//! May call `catalog` (kinds, OpenAPI definitions, CRD schemas) and the leaves (`meta`,
//! `selector`, `status`); never `storage`, which calls it on every write, nor anything above.

pub(crate) mod defaults;
pub mod fieldcheck;
pub mod validation;
