//! Storage: the objects, the one resourceVersion that orders every write, the bounded watch
//! history, and the write semantics kube-apiserver's registry applies (preconditions,
//! generation, the status split, finalizers and deletion, owner-reference garbage collection,
//! namespace termination, CRD registration).
//!
//! Owns:
//! - `store`: the shared [`store::Store`] handle and the synchronous [`store::State`] behind its
//!   lock — reads, lists with continue tokens, watch subscriptions, and the commit every write
//!   ends in;
//! - `write`: create, update, patch, apply and scale;
//! - `delete`: deletes, propagation and finalizers;
//! - `gc`: garbage collection and namespace termination, run inside the same lock.
//!
//! May call `admission` (every write is checked before it commits), `apply` (patches,
//! server-side apply, managed fields), `catalog` (the registry, which CRD writes change) and the
//! leaves; never `auth` or `http`, which call it.

mod clock;
mod delete;
mod gc;
pub mod store;
mod write;

pub(crate) use delete::{Delete, DeleteOptions, Deleted, Propagation};
pub use store::{State, Store};
pub(crate) use write::PatchType;
pub use write::{Write, WriteOptions};
