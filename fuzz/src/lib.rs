//! Shared checks for the fuzz targets in `fuzz_targets/`.
//!
//! The manager's proto-to-domain translation (`session::translate`) is private to the gRPC
//! edge and async (it resolves resources through discovery), so the targets map the wire
//! selector and predicate messages to the manager's domain types here, field for field, and
//! then run the manager's own validation, evaluation and query rendering on them.

use std::collections::BTreeMap;

use ctrlhub::registration::predicate::{
    EventKind, LabelSelector, LabelSelectorRequirement, Predicate, SelectorOperator,
};
use ctrlhub::registration;
use ctrlhub_proto::v1 as pb;
use serde_json::{Value, json};

/// Every event kind a predicate is evaluated for.
pub const KINDS: [EventKind; 4] = [
    EventKind::Added,
    EventKind::Modified,
    EventKind::Deleted,
    EventKind::Sync,
];

/// The wire selector as the manager's type; `None` for an operator the manager rejects.
pub fn selector_from_pb(sel: &pb::LabelSelector) -> Option<LabelSelector> {
    use pb::label_selector_requirement::Operator as O;
    let mut out = LabelSelector {
        match_labels: sel.match_labels.clone().into_iter().collect(),
        match_expressions: Vec::new(),
    };
    for e in &sel.match_expressions {
        let operator = match O::try_from(e.operator).ok()? {
            O::In => SelectorOperator::In,
            O::NotIn => SelectorOperator::NotIn,
            O::Exists => SelectorOperator::Exists,
            O::DoesNotExist => SelectorOperator::DoesNotExist,
            _ => return None,
        };
        out.match_expressions.push(LabelSelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone(),
        });
    }
    Some(out)
}

/// The wire predicate as the manager's type; `None` where the manager would reject it
/// structurally (unset oneof, bad operator, nesting beyond `MAX_DEPTH`).
pub fn predicate_from_pb(p: &pb::Predicate, depth: usize) -> Option<Predicate> {
    use pb::predicate::Predicate as P;
    if depth > ctrlhub::registration::predicate::MAX_DEPTH {
        return None;
    }
    let list = |ps: &[pb::Predicate]| -> Option<Vec<Predicate>> {
        ps.iter().map(|p| predicate_from_pb(p, depth + 1)).collect()
    };
    Some(match p.predicate.as_ref()? {
        P::GenerationChanged(_) => Predicate::GenerationChanged,
        P::LabelsChanged(_) => Predicate::LabelsChanged,
        P::AnnotationsChanged(_) => Predicate::AnnotationsChanged,
        P::ResourceVersionChanged(_) => Predicate::ResourceVersionChanged,
        P::LabelSelector(sel) => Predicate::LabelSelector(selector_from_pb(sel)?),
        P::Deleting(_) => Predicate::Deleting,
        P::HasFinalizer(f) => Predicate::HasFinalizer(f.name.clone()),
        P::AllOf(a) => Predicate::AllOf(list(&a.predicates)?),
        P::AnyOf(a) => Predicate::AnyOf(list(&a.predicates)?),
        P::Negate(n) => Predicate::Not(Box::new(predicate_from_pb(n, depth + 1)?)),
    })
}

/// A few objects that exercise every predicate: labels and annotations from `sel`, with and
/// without a deletion timestamp, generations that differ, and malformed metadata.
pub fn sample_objects(labels: &BTreeMap<String, String>) -> Vec<Value> {
    vec![
        json!({"metadata": {"name": "a", "generation": 1, "resourceVersion": "1", "labels": labels}}),
        json!({"metadata": {"name": "a", "generation": 2, "resourceVersion": "2",
            "annotations": labels, "deletionTimestamp": "2024-01-01T00:00:00Z",
            "finalizers": ["example.com/f", 7]}}),
        json!({"metadata": {"labels": [1, 2], "generation": "x", "finalizers": "f"}}),
        json!({"metadata": null}),
        json!(42),
    ]
}

/// Evaluate `p` on every pair of `objects` for every event kind, checking the combinators'
/// laws against the children's results; evaluation must never panic, valid tree or not.
pub fn evaluate_everywhere(p: &Predicate, objects: &[Value]) {
    // The compiled filter the manager evaluates on every event answers as the tree does.
    let filter = ctrlhub::registration::filter::Filter::compile(p);
    for kind in KINDS {
        for new in objects {
            for old in std::iter::once(None).chain(objects.iter().map(Some)) {
                let got = p.evaluate(kind, old, new);
                assert_eq!(
                    filter.evaluate(kind, old, new),
                    got,
                    "compiled {kind:?} {p:?} on old={old:?} new={new:?}"
                );
                let want = match p {
                    Predicate::AllOf(c) => Some(c.iter().all(|c| c.evaluate(kind, old, new))),
                    Predicate::AnyOf(c) => Some(c.iter().any(|c| c.evaluate(kind, old, new))),
                    Predicate::Not(c) => Some(!c.evaluate(kind, old, new)),
                    Predicate::LabelSelector(s) => Some(s.matches_object(match kind {
                        EventKind::Deleted => old.unwrap_or(new),
                        _ => new,
                    })),
                    _ => None,
                };
                if let Some(want) = want {
                    assert_eq!(got, want, "{kind:?} {p:?} on old={old:?} new={new:?}");
                }
            }
        }
    }
}

/// A selector the manager accepted must mean the same on the API server: its query string
/// (what the informer sends as `labelSelector=`) parses with devcluster's Kubernetes-syntax
/// parser, and both agree on `label_sets` and on label sets built from the selector itself.
pub fn check_selector_agrees(sel: &LabelSelector, label_sets: &[BTreeMap<String, String>]) {
    if sel.validate().is_err() {
        return;
    }
    let query = registration::selector_query(sel);
    let parsed = devcluster::selector::LabelSelector::parse(&query).unwrap_or_else(|e| {
        panic!("manager accepted {sel:?} but the API server rejects its query {query:?}: {e}")
    });
    let mut sets: Vec<BTreeMap<String, String>> = label_sets.to_vec();
    // Sets built from the selector's own keys and values, so matches are actually exercised.
    let mut all_first = BTreeMap::new();
    let mut all_other = BTreeMap::new();
    for (k, v) in &sel.match_labels {
        all_first.insert(k.clone(), v.clone());
        all_other.insert(k.clone(), format!("{v}x"));
    }
    for r in &sel.match_expressions {
        all_first.insert(r.key.clone(), r.values.first().cloned().unwrap_or_default());
        all_other.insert(r.key.clone(), "other".to_string());
    }
    sets.push(all_first);
    sets.push(all_other);
    sets.push(BTreeMap::new());
    for labels in &sets {
        let json: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        assert_eq!(
            sel.matches(labels),
            parsed.matches(Some(&json)),
            "manager and API server disagree: selector {sel:?} (query {query:?}) on labels {labels:?}"
        );
    }
}

/// What the manager checks in a Register, minus discovery: the controller name, every label
/// selector (scope, primary, inside predicates) and every predicate tree (owns and watches
/// included). Valid trees are also evaluated.
pub fn check_register(r: &pb::Register) {
    let _ = registration::validate_name(&r.controller_name);
    let mut selectors: Vec<&pb::LabelSelector> = r.label_selector.iter().collect();
    if let Some(pb::namespace_scope::Scope::LabelSelector(s)) =
        r.namespaces.as_ref().and_then(|n| n.scope.as_ref())
    {
        selectors.push(s);
    }
    for s in selectors {
        if let Some(sel) = selector_from_pb(s) {
            let _ = sel.validate_at("register.label_selector");
            check_selector_agrees(&sel, &[]);
        }
    }
    let predicates = r
        .predicate
        .iter()
        .chain(r.owns.iter().filter_map(|o| o.predicate.as_ref()))
        .chain(r.watches.iter().filter_map(|w| w.predicate.as_ref()));
    for p in predicates {
        if let Some(tree) = predicate_from_pb(p, 0)
            && tree.validate_at("register.predicate").is_ok()
        {
            evaluate_everywhere(&tree, &sample_objects(&BTreeMap::new()));
        }
    }
}
