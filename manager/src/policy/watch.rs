//! Keeps tenant policies applied: watches `TenantPolicy` objects, compiles them over the flags'
//! limits and weights after every change, hands the result to the controller table and the
//! seat pool, logs what changed, and (on the leader only, so replicas never race) writes each
//! policy's `Accepted` condition on its status when it differs from what is there.

use super::{Base, Compiled, GROUP, KIND, PLURAL, Policy, VERSION, Verdict, compile};
use crate::dispatch::controllers::ControllerTable;
use crate::dispatch::seats::SeatPool;
use futures::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch as signal;
use tokio_util::sync::CancellationToken;

/// Where policies are applied, and what they are applied over.
pub(crate) struct Applier {
    /// The manager's client (it reads policies and writes their status).
    pub client: kube::Client,
    /// Takes every tenant's limits.
    pub controllers: Arc<ControllerTable>,
    /// Takes every tenant's weight.
    pub seats: Arc<SeatPool>,
    /// The flags' limits and weights.
    pub base: Base,
    /// Whether this replica leads (only the leader writes status).
    pub leading: signal::Receiver<bool>,
}

/// The `TenantPolicy` resource.
pub(crate) fn resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

/// Watches policies until `stop`.
pub(crate) fn spawn(applier: Applier, stop: CancellationToken) {
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = applier.run() => {}
        }
    });
}

/// What the watch holds between events.
#[derive(Default)]
struct Seen {
    objects: BTreeMap<String, DynamicObject>,
    listing: BTreeMap<String, DynamicObject>,
    in_force: BTreeMap<String, Policy>,
    verdicts: BTreeMap<String, Verdict>,
    /// The last watch error reported, so a missing CRD is logged once, not every retry.
    reported: Option<String>,
}

impl Applier {
    async fn run(mut self) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource());
        let mut events = watch_stream(api.clone(), watcher::Config::default())
            // The watcher says Init before each (re)list, and the backoff starts again from its
            // shortest delay on any item: with Init passed on, a cluster without the CRD was
            // listed (a 404) and logged every 0.8 s forever. A failed list clears the partial
            // listing instead (in `report`).
            .filter(|event| std::future::ready(!matches!(event, Ok(Event::Init))))
            .default_backoff()
            .boxed();
        let mut seen = Seen::default();
        loop {
            tokio::select! {
                event = events.next() => match event {
                    None => return,
                    Some(Ok(event)) => {
                        seen.reported = None;
                        if take(&mut seen, event) {
                            self.apply(&api, &mut seen);
                        }
                    }
                    Some(Err(e)) => report(&mut seen, &e),
                },
                changed = self.leading.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // A new leader writes the status its predecessor may have left stale.
                    self.apply(&api, &mut seen);
                }
            }
        }
    }

    /// Compiles what is seen, applies it, logs verdicts that changed and writes status.
    fn apply(&self, api: &Api<DynamicObject>, seen: &mut Seen) {
        let policies: Vec<Policy> = seen.objects.values().map(policy_of).collect();
        let Compiled {
            limits,
            weights,
            verdicts,
            in_force,
        } = compile(&policies, &seen.in_force, &self.base);
        self.controllers.set_limits(limits);
        self.seats.set_weights(weights);
        for (name, verdict) in &verdicts {
            if seen.verdicts.get(name) != Some(verdict) {
                log_verdict(name, verdict);
            }
        }
        seen.in_force = in_force;
        seen.verdicts = verdicts;
        if *self.leading.borrow() {
            for object in seen.objects.values() {
                let name = object.metadata.name.clone().unwrap_or_default();
                if let Some(verdict) = seen.verdicts.get(&name) {
                    write_status(api, object, verdict);
                }
            }
        }
    }
}

/// Takes one watch event into `seen`; whether the set of policies is complete and changed.
fn take(seen: &mut Seen, event: Event<DynamicObject>) -> bool {
    let name = |o: &DynamicObject| o.metadata.name.clone().unwrap_or_default();
    match event {
        Event::Init => {
            seen.listing.clear();
            false
        }
        Event::InitApply(o) => {
            seen.listing.insert(name(&o), o);
            false
        }
        Event::InitDone => {
            seen.objects = std::mem::take(&mut seen.listing);
            true
        }
        Event::Apply(o) => {
            seen.objects.insert(name(&o), o);
            true
        }
        Event::Delete(o) => {
            seen.objects.remove(&name(&o));
            true
        }
    }
}

fn policy_of(object: &DynamicObject) -> Policy {
    Policy {
        name: object.metadata.name.clone().unwrap_or_default(),
        generation: object.metadata.generation.unwrap_or(0),
        spec: object.data.get("spec").cloned().unwrap_or(Value::Null),
    }
}

fn log_verdict(name: &str, verdict: &Verdict) {
    match verdict {
        Verdict::Accepted { tenant } => {
            tracing::info!(policy = name, %tenant, "tenant policy applied");
        }
        Verdict::Invalid { message } | Verdict::Conflict { message } => {
            tracing::warn!(policy = name, "tenant policy refused: {message}");
        }
    }
}

/// Logs a watch error once until the watch works again: a cluster without the CRD (or without
/// the RBAC to read it) runs on the flags' limits, which is worth one line, not one a second.
fn report(seen: &mut Seen, error: &watcher::Error) {
    // The list this error ended starts again from the beginning.
    seen.listing.clear();
    let text = error.to_string();
    if seen.reported.as_deref() == Some(text.as_str()) {
        return;
    }
    let code = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => 0,
    };
    match code {
        404 => tracing::info!(
            "TenantPolicy objects are not served (the CRD is not installed): tenant limits and weights come from the flags only; apply deploy/base/tenantpolicy-crd.yaml to change them without a restart"
        ),
        403 => tracing::warn!(
            "the manager may not list and watch tenantpolicies.ctrlhub.io: tenant limits and weights come from the flags only; grant it (deploy/base/clusterrole.yaml): {text}"
        ),
        _ => tracing::warn!("watching tenant policies failed, retrying with backoff: {text}"),
    }
    seen.reported = Some(text);
}

/// Patches the `Accepted` condition when the one on the object differs (status, reason,
/// message or generation), so its own status update does not write again.
fn write_status(api: &Api<DynamicObject>, object: &DynamicObject, verdict: &Verdict) {
    let (status, reason, message) = verdict.condition();
    let generation = object.metadata.generation.unwrap_or(0);
    let current = object
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Accepted"));
    let same = current.is_some_and(|c| {
        c["status"] == status
            && c["reason"] == reason
            && c["message"] == message.as_str()
            && c["observedGeneration"] == generation
    });
    if same {
        return;
    }
    // The transition time moves only when the status does (Kubernetes' condition convention).
    let since = current
        .filter(|c| c["status"] == status)
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now()));
    let patch = json!({"status": {
        "observedGeneration": generation,
        "conditions": [{
            "type": "Accepted",
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }],
    }});
    let (api, name) = (
        api.clone(),
        object.metadata.name.clone().unwrap_or_default(),
    );
    tokio::spawn(async move {
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(policy = %name, error = %e, "could not write the tenant policy's status");
        }
    });
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
