//! Storage: the objects, the one resourceVersion that orders every write, the bounded watch
//! history, and the write semantics kube-apiserver's registry applies (preconditions,
//! generation, the status split, finalizers and deletion, owner-reference garbage collection,
//! namespace termination, CRD registration).
//!
//! Owns:
//! - `handle`: the shared [`Store`] handle, and the default namespaces every store starts with;
//! - `store`: the synchronous [`State`] behind its lock — reads, lists with continue tokens,
//!   watch subscriptions, and the commit every write ends in;
//! - `write`: create, update, patch, apply and scale;
//! - `delete`: deletes, propagation and finalizers;
//! - `gc`: garbage collection and namespace termination, run inside the same lock;
//! - `clock`: where timestamps and continue-token ages come from (stopped by hand in tests).
//!
//! Its unit tests (`tests.rs`) drive the write semantics on the synchronous state.
//!
//! May call `admission` (every write is checked before it commits), `apply` (patches,
//! server-side apply, managed fields), `catalog` (the registry, which CRD writes change) and the
//! leaves; never `auth` or `http`, which call it.

mod clock;
mod delete;
mod gc;
mod handle;
pub(crate) mod store;
#[cfg(test)]
mod tests;
mod write;

pub(crate) use delete::{Delete, DeleteOptions, Deleted, Propagation};
pub use handle::Store;
pub use store::State;
pub(crate) use write::PatchType;
pub use write::{Write, WriteOptions};
