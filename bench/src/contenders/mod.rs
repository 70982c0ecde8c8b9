//! What ctrlhub is measured against, and ctrlhub's own SDK controllers in other languages, each
//! named for what it runs: `kube_runtime` (kube-rs' `kube::runtime::Controller`, in process or
//! as `bench-kube-controller` processes), `kopf` (kopf's reference operator in Python),
//! `python_sdk` and `typescript_sdk` (ctrlhub's SDKs, as controller processes).

pub mod kopf;
pub mod kube_runtime;
pub mod python_sdk;
pub mod typescript_sdk;

use std::time::Duration;

/// One measured run.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Objects reconciled (distinct keys).
    pub objects: usize,
    /// Until the last object's first reconcile.
    pub elapsed: Duration,
    /// How long creating the objects took (live runs: the load generator's own pace).
    pub create: Duration,
}

impl Run {
    /// Objects per second.
    pub fn rate(&self) -> f64 {
        self.objects as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The run as the results file records it.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({"objects": self.objects, "seconds": self.elapsed.as_secs_f64(),
            "objectsPerSecond": self.rate(), "createSeconds": self.create.as_secs_f64()})
    }
}
