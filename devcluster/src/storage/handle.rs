//! The shared handle to the store: one [`State`] behind one lock, so that a resourceVersion
//! totally orders all writes.

use super::store::State;
use super::write::{Write, WriteOptions};
use parking_lot::{Mutex, MutexGuard};
use serde_json::json;
use std::sync::Arc;

/// The shared store handle. Cheap to clone; every clone is the same store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Mutex<State>>,
}

impl Store {
    /// A store with the built-in kinds and the default namespaces.
    pub fn new(history_limit: usize) -> Self {
        let store = Store {
            inner: Arc::new(Mutex::new(State::new(history_limit))),
        };
        {
            let mut st = store.lock();
            let ns_info = st.registry.get("", "v1", "namespaces").cloned();
            if let Some(info) = ns_info {
                for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                    let obj =
                        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                    let opts = WriteOptions::new("devcluster");
                    if let Err(e) = st.create(&Write::create(&info, "", &opts), obj) {
                        tracing::error!(error = %e, "creating default namespace");
                    }
                }
            }
        }
        store
    }

    /// Take the lock. parking_lot locks do not poison: every write commits atomically at its
    /// end, so a panic mid-request leaves the state structurally valid and serving goes on.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }
}
