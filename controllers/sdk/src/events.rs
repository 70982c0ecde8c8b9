//! Kubernetes Events (events.k8s.io/v1) about objects.

use kube::runtime::events::{Event, Recorder, Reporter};
use kube::{Client, Resource};

pub use kube::runtime::events::EventType;

/// Records Events about objects on behalf of one controller, with
/// client-go-style deduplication into event series.
///
/// ```no_run
/// # async fn f(client: kube::Client, cm: k8s_openapi::api::core::v1::ConfigMap) -> Result<(), kube::Error> {
/// use ctrlhub_sdk::events::{EventRecorder, EventType};
/// let recorder = EventRecorder::new(client, "memcached");
/// recorder.record(&cm, EventType::Normal, "Reconciled", "all good").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder").finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder reporting as `controller` (the Event's
    /// `reportingController`); the reporting instance is `$POD_NAME`, else
    /// `$HOSTNAME`, else the controller name.
    pub fn new(client: Client, controller: impl Into<String>) -> Self {
        let instance = ["POD_NAME", "HOSTNAME"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
        let reporter = Reporter {
            controller: controller.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Records an Event about `obj`: `type_` Normal or Warning, a PascalCase
    /// `reason` (also used as the action) and a human-readable `note`.
    pub async fn record<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: impl Into<String>,
    ) -> Result<(), kube::Error>
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(obj, type_, reason, reason, note).await
    }

    /// Like [`EventRecorder::record`], with a separate `action`.
    pub async fn publish<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) -> Result<(), kube::Error>
    where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.into()),
            action: action.into(),
            secondary: None,
        };
        let reference = obj.object_ref(&());
        let namespace = reference.namespace.clone().unwrap_or_default();
        let name = reference.name.clone().unwrap_or_default();
        let call = self.recorder.publish(&event, &reference);
        crate::traces::k8s_call("POST", "events", &namespace, &name, call).await
    }
}
