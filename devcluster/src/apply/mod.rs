//! Apply: every way a request changes an existing object's fields — the three PATCH flavours,
//! server-side apply, and the field ownership both record in `metadata.managedFields`.
//!
//! Owns:
//! - `patch`: JSON merge patch, JSON patch and strategic merge patch on plain JSON, with the
//!   patch-merge-key table of the built-in kinds;
//! - `fieldmanager`: `managedFields` (structured-merge-diff `FieldsV1` sets), apply merges and
//!   their conflicts;
//! - `lists`: how a list at a path merges, from the merge-key table or a CRD's
//!   `x-kubernetes-list-type`.
//!
//! May call `catalog` (a resource's kind and schema); nothing that stores or serves. The store
//! calls into it while it writes.

pub(crate) mod fieldmanager;
pub(crate) mod lists;
pub(crate) mod patch;
