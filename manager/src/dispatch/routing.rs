//! Routing: from an informer's event to a controller's queue. Each subscriber a controller
//! holds decides, in this order, whether the event concerns it: its scope (see
//! [`crate::dispatch::scope`]), its predicate, and, for owned and watched kinds, the mapping to
//! primary keys; then it enqueues (or, in EVENTS mode, pushes the event). A selector scope also
//! follows namespaces: one that enters has its primaries enqueued as initial-list work.
//!
//! Owns: which informers a registration needs, and the subscribers that feed a controller.
//! May call `dispatch::scope`, `dispatch::admission`, `dispatch::dispatcher` (the controller
//! enqueued into), `dispatch::queue` (reasons), `dispatch::event_queue` (event types),
//! `informer` and `registration`.

use crate::dispatch::admission::{self, Admission};
use crate::dispatch::dispatcher::Controller;
use crate::dispatch::event_queue::EventType;
use crate::dispatch::queue::Reason;
use crate::dispatch::scope::Entry;
use crate::informer::{Cache, CacheEvent, InformerKey, ListBudget, ObjectKey, Subscriber};
use crate::registration::filter::Filter;
use crate::registration::mapping;
use crate::registration::predicate::{EventKind, Predicate};
use crate::registration::{Mode, NamespaceScope, Registration, ResourceRef, selector_query};
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn event_kind(event: &CacheEvent) -> (EventKind, Option<&Value>, &Value) {
    match event {
        CacheEvent::Added { object, .. } => (EventKind::Added, None, object),
        CacheEvent::Modified { old, new } => (EventKind::Modified, Some(old), new),
        CacheEvent::Deleted { object, .. } => (EventKind::Deleted, Some(object), object),
    }
}

fn passes(filter: &Option<Filter>, event: &CacheEvent) -> bool {
    let (kind, old, new) = event_kind(event);
    filter.as_ref().is_none_or(|f| f.evaluate(kind, old, new))
}

/// A registration's predicate, compiled once for the events it will filter.
fn compiled(predicate: &Option<Predicate>) -> Option<Filter> {
    predicate.as_ref().map(Filter::compile)
}

/// EVENTS mode: a list-time Added is a SYNC (it may have changed while nobody watched).
fn event_type(event: &CacheEvent) -> EventType {
    match event {
        CacheEvent::Added { initial: true, .. } => EventType::Sync,
        CacheEvent::Added { .. } => EventType::Added,
        CacheEvent::Modified { .. } => EventType::Modified,
        CacheEvent::Deleted { .. } => EventType::Deleted,
    }
}

fn is_initial(event: &CacheEvent) -> bool {
    matches!(event, CacheEvent::Added { initial: true, .. })
}

/// The server-side label selector of a registration's primary informer.
fn primary_labels(reg: &Registration) -> Option<String> {
    reg.label_selector
        .as_ref()
        .map(selector_query)
        .filter(|s| !s.is_empty())
}

/// The informer that follows namespaces for label-selector scopes.
fn namespaces_informer_key() -> InformerKey {
    InformerKey {
        group: String::new(),
        version: "v1".into(),
        kind: "Namespace".into(),
        plural: "namespaces".into(),
        namespaced: false,
        namespace: None,
        label_selector: None,
        metadata_only: true,
    }
}

/// The informers of `resource` in `namespaces` (None: one cluster-wide informer).
fn informer_keys(
    resource: &ResourceRef,
    namespaces: Option<&[String]>,
    labels: Option<String>,
    metadata_only: bool,
) -> Vec<InformerKey> {
    let key = |ns: Option<String>| InformerKey {
        group: resource.group.clone(),
        version: resource.version.clone(),
        kind: resource.kind.clone(),
        plural: resource.plural.clone(),
        namespaced: resource.namespaced,
        namespace: ns,
        label_selector: labels.clone(),
        metadata_only,
    };
    match namespaces {
        Some(list) if resource.namespaced => list.iter().map(|n| key(Some(n.clone()))).collect(),
        _ => vec![key(None)],
    }
}

/// Every informer `reg` would subscribe to in `namespaces` (the same keys [`wire`] uses).
pub(crate) fn needed_informers(
    reg: &Registration,
    namespaces: Option<&[String]>,
) -> HashSet<InformerKey> {
    let mut keys: HashSet<InformerKey> =
        informer_keys(&reg.primary, namespaces, primary_labels(reg), false)
            .into_iter()
            .collect();
    for owned in &reg.owns {
        let form = reg.metadata_only(&owned.resource);
        keys.extend(informer_keys(&owned.resource, namespaces, None, form));
    }
    for watched in &reg.watches {
        let form = reg.metadata_only(&watched.resource);
        keys.extend(informer_keys(&watched.resource, namespaces, None, form));
    }
    if matches!(reg.namespaces, NamespaceScope::Selector(_)) {
        keys.insert(namespaces_informer_key());
    }
    keys
}

/// Subscribe a new controller to everything its registration needs, in the namespaces of its
/// scope; the informers it starts list within `budget`. A gated selector scope gets its
/// admission task, stopped by `stop` or when the controller retires.
pub(crate) fn wire(
    cache: &Arc<Cache>,
    controller: &Arc<Controller>,
    budget: &Arc<ListBudget>,
    stop: &CancellationToken,
) {
    let subscribe = |key, sub| cache.subscribe_within(key, sub, Some(budget.clone()));
    let reg = &controller.registration;
    let namespaces = controller.scope().namespaces();
    if controller.scope().is_selecting() {
        let sub = namespace_subscriber(controller, stop);
        controller.hold(cache.subscribe(namespaces_informer_key(), sub), false);
    }
    for key in informer_keys(&reg.primary, namespaces, primary_labels(reg), false) {
        let sub = primary_subscriber(controller, reg.predicate.clone());
        controller.hold(subscribe(key, sub), true);
    }
    for owned in &reg.owns {
        let primary = reg.primary.clone();
        let controller_only = owned.controller_only;
        let map = move |obj: &Value| mapping::owner_keys(obj, &primary, controller_only);
        let form = reg.metadata_only(&owned.resource);
        for key in informer_keys(&owned.resource, namespaces, None, form) {
            let sub = related_subscriber(
                controller,
                owned.predicate.clone(),
                Reason::OwnedChanged,
                map.clone(),
            );
            controller.hold(subscribe(key, sub), false);
        }
    }
    for watched in &reg.watches {
        let metadata_only = reg.metadata_only(&watched.resource);
        let mapping = watched.mapping.clone();
        let primary_namespaced = reg.primary.namespaced;
        let map = move |obj: &Value| {
            mapping::mapped_key(obj, &mapping, primary_namespaced)
                .into_iter()
                .collect::<Vec<_>>()
        };
        for key in informer_keys(&watched.resource, namespaces, None, metadata_only) {
            let sub = related_subscriber(
                controller,
                watched.predicate.clone(),
                Reason::WatchedChanged,
                map.clone(),
            );
            controller.hold(subscribe(key, sub), false);
        }
    }
}

/// The subscriber for a primary informer: remember tombstones, then (in scope and past the
/// predicate) push the event in EVENTS mode, or enqueue the object's own key.
fn primary_subscriber(controller: &Arc<Controller>, predicate: Option<Predicate>) -> Subscriber {
    let c = Arc::downgrade(controller);
    let predicate = compiled(&predicate);
    Arc::new(move |event: &CacheEvent| {
        let Some(c) = c.upgrade() else { return };
        let object = match event {
            CacheEvent::Added { object, .. } | CacheEvent::Deleted { object, .. } => object,
            CacheEvent::Modified { new, .. } => new,
        };
        let key = mapping::own_key(object);
        // Scope, then predicate, before anything is kept for the event: an object this
        // controller will never hear of costs it nothing.
        let wanted = c.admits(&key) && passes(&predicate, event);
        if c.registration.mode == Mode::Events {
            if wanted {
                c.push_event(event_type(event), object);
            }
            return;
        }
        if !matches!(event, CacheEvent::Deleted { .. }) || wanted {
            c.settle_tombstone(event);
        }
        if wanted {
            c.enqueue([key], c.primary_reason(event));
        }
    })
}

/// A subscriber for an owned or watched kind: filter by its predicate, map old and new states
/// to primary keys, keep those in scope, enqueue.
fn related_subscriber(
    controller: &Arc<Controller>,
    predicate: Option<Predicate>,
    reason: Reason,
    map: impl Fn(&Value) -> Vec<ObjectKey> + Send + Sync + 'static,
) -> Subscriber {
    let c = Arc::downgrade(controller);
    let predicate = compiled(&predicate);
    Arc::new(move |event: &CacheEvent| {
        let Some(c) = c.upgrade() else { return };
        if !passes(&predicate, event) {
            return;
        }
        let mut keys: Vec<ObjectKey> = Vec::new();
        // An update can move an object from one primary to another: both need a look.
        if let CacheEvent::Modified { old, .. } = event {
            keys.extend(map(old));
        }
        let (_, _, obj) = event_kind(event);
        keys.extend(map(obj));
        // Out of scope is the normal case in a shared informer: dropped here, silently.
        keys.retain(|k| c.admits(k));
        keys.sort();
        keys.dedup();
        let reason = if is_initial(event) {
            Reason::InitialList
        } else {
            reason
        };
        c.enqueue(keys, reason);
    })
}

/// The subscriber to namespaces for a selector scope: a namespace that starts matching enters
/// the scope (after the gate's check, in the admission task, when gated) and its objects are
/// enqueued; one that stops matching leaves it at once. The gate's check is asynchronous (a
/// SubjectAccessReview) and this runs in the cache's synchronous fan-out, so a per-controller
/// task makes the decisions, in the order namespaces matched.
fn namespace_subscriber(controller: &Arc<Controller>, stop: &CancellationToken) -> Subscriber {
    let checks = controller
        .scope()
        .is_gated()
        .then(|| spawn_admission(controller, stop));
    let c = Arc::downgrade(controller);
    Arc::new(move |event: &CacheEvent| {
        let Some(c) = c.upgrade() else { return };
        let (_, _, ns) = event_kind(event);
        let name = ns
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let object = (!matches!(event, CacheEvent::Deleted { .. })).then_some(ns);
        match c.scope().namespace_changed(name, object) {
            Entry::Entered => enqueue_namespace(&c, name),
            Entry::NeedsCheck => {
                if let Some(checks) = &checks {
                    // The task ends only with the controller, and then nothing waits for this.
                    let _ = checks.send(name.to_string());
                }
            }
            Entry::Unchanged => {}
        }
    })
}

/// Starts the admission task of `controller`'s gated scope; returns where to send each
/// namespace that starts matching.
fn spawn_admission(
    controller: &Arc<Controller>,
    stop: &CancellationToken,
) -> mpsc::UnboundedSender<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = Admission {
        scope: controller.scope().clone(),
        matched: rx,
        stop: [stop.child_token(), controller.retirement()],
        controller: controller.id.to_string(),
    };
    let c = Arc::downgrade(controller);
    tokio::spawn(admission::run(task, move |namespace| {
        c.upgrade()
            .map(|c| enqueue_namespace(&c, namespace))
            .is_some()
    }));
    tx
}

/// Objects of a namespace that just came into scope: deliver them as initial-list work (the
/// proto: "the objects in it are delivered as INITIAL_LIST work").
fn enqueue_namespace(c: &Controller, namespace: &str) {
    c.enqueue(c.primary_keys_in(namespace), Reason::InitialList);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::dispatcher::{ControllerId, Outbound, Outbox};
    use crate::dispatch::scope::Scope;
    use crate::metrics::Metrics;
    use crate::registration::predicate::LabelSelector;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn registration() -> Registration {
        Registration::config_maps("c", 10)
    }

    /// A controller named `name` within `scope`, with one session to read what it delivers.
    fn controller(name: &str, scope: Scope) -> (Arc<Controller>, Outbox) {
        let id = ControllerId {
            tenant: "t".into(),
            name: name.into(),
        };
        let c = Controller::scoped(id, registration(), scope, Arc::new(Metrics::new()));
        let outbox = c.add_session(1, 100, false);
        (c, outbox)
    }

    /// What `c` hands out now: (key, reasons) of each request.
    fn delivered(c: &Controller, outbox: &mut Outbox) -> Vec<(String, Vec<Reason>)> {
        c.dispatch_round();
        let mut got = Vec::new();
        while let Some(m) = outbox.work.try_next() {
            if let Outbound::Reconcile(r) = m {
                c.complete(1, &r.id, crate::dispatch::queue::Outcome::Done, "");
                got.push((r.key.to_string(), r.reasons));
            }
        }
        got.sort_by(|a, b| a.0.cmp(&b.0));
        got
    }

    fn team(value: &str) -> LabelSelector {
        LabelSelector {
            match_labels: BTreeMap::from([("team".to_string(), value.to_string())]),
            match_expressions: Vec::new(),
        }
    }

    fn object(ns: &str, name: &str, team: &str) -> Arc<Value> {
        Arc::new(json!({"metadata": {"namespace": ns, "name": name, "labels": {"team": team}}}))
    }

    fn added(object: Arc<Value>) -> CacheEvent {
        CacheEvent::Added {
            object,
            initial: false,
        }
    }

    #[test]
    fn a_primary_event_reaches_the_queues_whose_scope_and_predicate_take_it() {
        let (a, mut a_out) = controller("a", Scope::new(true, Some(vec!["team-a".into()])));
        let (all, mut all_out) = controller("all", Scope::new(true, None));
        // One informer's fan-out to both controllers' subscribers.
        let subscribers = [
            primary_subscriber(&a, Some(Predicate::LabelSelector(team("x")))),
            primary_subscriber(&all, None),
        ];
        let fan_out = |event: CacheEvent| subscribers.iter().for_each(|s| s(&event));

        fan_out(added(object("team-a", "mine", "x")));
        fan_out(added(object("team-b", "theirs", "x")));
        fan_out(added(object("team-a", "filtered", "y")));

        let created = |k: &str| (k.to_string(), vec![Reason::Created]);
        assert_eq!(delivered(&a, &mut a_out), [created("team-a/mine")]);
        assert_eq!(
            delivered(&all, &mut all_out),
            [
                created("team-a/filtered"),
                created("team-a/mine"),
                created("team-b/theirs")
            ]
        );
    }

    #[test]
    fn a_related_change_maps_to_primaries_in_scope_past_its_predicate() {
        let (c, mut out) = controller("c", Scope::new(true, Some(vec!["team-a".into()])));
        // A field mapping can name any namespace: only the scope's reach the queue.
        let map = |obj: &Value| {
            let target = obj.pointer("/metadata/labels/team").and_then(Value::as_str);
            vec![
                ObjectKey::new("team-a", target.unwrap_or_default()),
                ObjectKey::new("team-b", "escape"),
            ]
        };
        let sub = related_subscriber(
            &c,
            Some(Predicate::LabelsChanged),
            Reason::WatchedChanged,
            map,
        );
        sub(&CacheEvent::Modified {
            old: object("team-a", "w", "x"),
            new: object("team-a", "w", "x"),
        });
        assert!(
            delivered(&c, &mut out).is_empty(),
            "labels unchanged: filtered"
        );

        // Relabelled from x to y: the primary it mapped to before and the one it maps to now.
        sub(&CacheEvent::Modified {
            old: object("team-a", "w", "x"),
            new: object("team-a", "w", "y"),
        });
        let watched = |k: &str| (k.to_string(), vec![Reason::WatchedChanged]);
        assert_eq!(
            delivered(&c, &mut out),
            [watched("team-a/x"), watched("team-a/y")]
        );

        sub(&CacheEvent::Added {
            object: object("team-a", "w2", "z"),
            initial: true,
        });
        assert_eq!(
            delivered(&c, &mut out),
            [("team-a/z".to_string(), vec![Reason::InitialList])],
            "a listed object is initial-list work"
        );
    }

    #[test]
    fn a_selector_scope_routes_only_namespaces_whose_labels_match_now() {
        let (c, mut out) = controller("c", Scope::selecting(true, None, team("x"), None));
        let stop = CancellationToken::new();
        let namespaces = namespace_subscriber(&c, &stop);
        let primaries = primary_subscriber(&c, None);
        let ns = |name: &str, team: &str| {
            Arc::new(json!({"metadata": {"name": name, "labels": {"team": team}}}))
        };

        primaries(&added(object("a", "before", "any")));
        assert!(
            delivered(&c, &mut out).is_empty(),
            "a is not in the scope yet"
        );

        namespaces(&added(ns("a", "x")));
        namespaces(&added(ns("b", "y")));
        primaries(&added(object("a", "in", "any")));
        primaries(&added(object("b", "out", "any")));
        assert_eq!(
            delivered(&c, &mut out),
            [("a/in".to_string(), vec![Reason::Created])]
        );

        // a's label changes: it leaves at once, and its objects with it.
        namespaces(&CacheEvent::Modified {
            old: ns("a", "x"),
            new: ns("a", "y"),
        });
        primaries(&added(object("a", "after", "any")));
        assert!(delivered(&c, &mut out).is_empty());
    }
}
