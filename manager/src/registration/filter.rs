//! A predicate tree compiled for evaluation on every event.
//!
//! Registrations come from tenants, and a tree's *shape* says nothing about its cost: a tenant
//! once sent twelve `any_of`s of a thousand `annotations_changed` leaves (48 KB, under every
//! limit), and one update of an object with 2,000 annotations then cost 9 CPU-seconds, inside
//! the informer's synchronous fan-out. A [`Filter`] makes the cost a function of the *work*:
//!
//! - identical subtrees are one node (hash-consing), and the children of `all_of` / `any_of`
//!   are deduplicated, so a thousand copies of a leaf are one leaf;
//! - every node is evaluated at most once per event (memoized), so the work per event is
//!   bounded by the number of distinct nodes, which validation bounds per registration;
//! - leaves read the objects in place: the `*_changed` leaves compare the metadata maps by
//!   reference, without copying them, and finalizers are looked up in a set built once per event
//!   when a filter tests several of them.
//!
//! The result is always the tree's own [`Predicate::evaluate`] (unit-tested here and fuzzed).

use crate::registration::predicate::{EventKind, Predicate};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// A compiled predicate.
#[derive(Debug, Clone)]
pub struct Filter {
    nodes: Vec<Node>,
    root: usize,
    /// Distinct `has_finalizer` leaves: with more than a few, one set per event is cheaper
    /// than scanning the finalizers for each.
    finalizer_leaves: usize,
}

/// One distinct node; children are indices of earlier nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Node {
    /// A leaf (never a combinator).
    Leaf(Predicate),
    /// Every child passes (sorted, deduplicated).
    All(Vec<usize>),
    /// Some child passes (sorted, deduplicated).
    Any(Vec<usize>),
    /// The child does not pass.
    Not(usize),
}

/// Finalizer tests beyond which an event builds a set of the object's finalizers once.
const FINALIZER_SET_AFTER: usize = 4;

impl Filter {
    /// Compile `predicate` (assumed validated: its depth bounds the recursion here).
    pub fn compile(predicate: &Predicate) -> Filter {
        let mut builder = Builder::default();
        let root = builder.add(predicate);
        let finalizer_leaves = builder
            .nodes
            .iter()
            .filter(|n| matches!(n, Node::Leaf(Predicate::HasFinalizer(_))))
            .count();
        Filter {
            nodes: builder.nodes,
            root,
            finalizer_leaves,
        }
    }

    /// Distinct nodes: what one evaluation costs at most, in node visits.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the filter is empty (it never is: a predicate has at least one node).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether the event passes; the same answer as [`Predicate::evaluate`] on the source tree.
    pub fn evaluate(&self, kind: EventKind, old: Option<&Value>, new: &Value) -> bool {
        let subject = match kind {
            EventKind::Deleted => old.unwrap_or(new),
            _ => new,
        };
        let mut eval = Evaluation {
            filter: self,
            kind,
            old,
            new,
            subject,
            memo: vec![None; self.nodes.len()],
            finalizers: None,
            leaves: 0,
        };
        eval.node(self.root)
    }
}

/// Builds the node table, sharing identical subtrees.
#[derive(Default)]
struct Builder {
    nodes: Vec<Node>,
    index: HashMap<Node, usize>,
}

impl Builder {
    fn add(&mut self, p: &Predicate) -> usize {
        let node = match p {
            Predicate::AllOf(children) => Node::All(self.children(children)),
            Predicate::AnyOf(children) => Node::Any(self.children(children)),
            Predicate::Not(child) => Node::Not(self.add(child)),
            leaf => Node::Leaf(leaf.clone()),
        };
        if let Some(&i) = self.index.get(&node) {
            return i;
        }
        self.nodes.push(node.clone());
        self.index.insert(node, self.nodes.len() - 1);
        self.nodes.len() - 1
    }

    fn children(&mut self, children: &[Predicate]) -> Vec<usize> {
        let mut ids: Vec<usize> = children.iter().map(|c| self.add(c)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// One event's evaluation: each node's answer is kept, so a shared node costs once.
struct Evaluation<'a> {
    filter: &'a Filter,
    kind: EventKind,
    old: Option<&'a Value>,
    new: &'a Value,
    subject: &'a Value,
    memo: Vec<Option<bool>>,
    finalizers: Option<HashSet<&'a str>>,
    /// Leaves evaluated so far (the costly part), for the tests that bound it.
    leaves: usize,
}

impl<'a> Evaluation<'a> {
    fn node(&mut self, i: usize) -> bool {
        if let Some(known) = self.memo[i] {
            return known;
        }
        let filter = self.filter;
        let answer = match &filter.nodes[i] {
            Node::Leaf(leaf) => self.leaf(leaf),
            Node::All(children) => children.iter().all(|&c| self.node(c)),
            Node::Any(children) => children.iter().any(|&c| self.node(c)),
            Node::Not(child) => !self.node(*child),
        };
        self.memo[i] = Some(answer);
        answer
    }

    fn leaf(&mut self, leaf: &Predicate) -> bool {
        self.leaves += 1;
        match leaf {
            Predicate::LabelsChanged => self.changed(|o| string_map(o, "labels")),
            Predicate::AnnotationsChanged => self.changed(|o| string_map(o, "annotations")),
            Predicate::HasFinalizer(name) if self.filter.finalizer_leaves > FINALIZER_SET_AFTER => {
                let subject = self.subject;
                self.finalizers
                    .get_or_insert_with(|| finalizers(subject).collect())
                    .contains(name.as_str())
            }
            // The other leaves read a field or two: the tree's own evaluation is already cheap.
            other => other.evaluate(self.kind, self.old, self.new),
        }
    }

    /// The `*_changed` rule (see [`Predicate::evaluate`]), comparing borrowed fields.
    fn changed<T: PartialEq>(&self, field: impl Fn(&'a Value) -> T) -> bool {
        match self.kind {
            EventKind::Modified => self.old.is_some_and(|old| field(old) != field(self.new)),
            EventKind::Added | EventKind::Deleted | EventKind::Sync => true,
        }
    }
}

/// A metadata string map, borrowed; absent, `null`, a non-object and `{}` are all None, so they
/// compare equal, and map equality ignores key order.
fn string_map<'v>(object: &'v Value, field: &str) -> Option<&'v Map<String, Value>> {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .filter(|m| !m.is_empty())
}

fn finalizers(object: &Value) -> impl Iterator<Item = &str> {
    object
        .get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::predicate::{LabelSelector, Predicate as P};
    use EventKind::{Added, Deleted, Modified, Sync};
    use serde_json::json;

    fn annotated(n: usize, salt: &str) -> Value {
        let annotations: Map<String, Value> = (0..n)
            .map(|i| (format!("a{i}"), Value::String(format!("{salt}{i}"))))
            .collect();
        json!({"metadata": {"name": "x", "annotations": annotations, "generation": 1}})
    }

    #[test]
    fn a_thousand_copies_of_a_leaf_are_one_node() {
        let tree = P::AnyOf(vec![P::AnnotationsChanged; 1000]);
        let f = Filter::compile(&tree);
        assert_eq!(f.len(), 2, "one leaf and the any_of");
        let nested = P::AllOf(vec![tree.clone(), P::Not(Box::new(tree.clone())), tree]);
        assert_eq!(Filter::compile(&nested).len(), 4);
    }

    #[test]
    fn a_shared_node_is_evaluated_once_per_event() {
        // Three thousand references to one leaf: without memoizing, three thousand map
        // comparisons of 2,000 entries each.
        let leaf = P::AnyOf(vec![P::AnnotationsChanged; 1000]);
        let tree = P::AllOf(vec![
            leaf.clone(),
            P::Not(Box::new(P::Not(Box::new(leaf.clone())))),
            P::AnyOf(vec![leaf; 3]),
        ]);
        let f = Filter::compile(&tree);
        let (old, new) = (annotated(2000, "v"), annotated(2000, "w"));
        let mut eval = Evaluation {
            filter: &f,
            kind: Modified,
            old: Some(&old),
            new: &new,
            subject: &new,
            memo: vec![None; f.len()],
            finalizers: None,
            leaves: 0,
        };
        assert!(eval.node(f.root));
        assert_eq!(eval.leaves, 1, "the 2,000-entry maps were compared once");
        assert_eq!(
            f.len(),
            6,
            "leaf, any_of, two nots, the any_of of three, the all_of"
        );
    }

    #[test]
    fn labels_and_annotations_compare_without_regard_to_order_or_absence() {
        let f = Filter::compile(&P::LabelsChanged);
        let a = json!({"metadata": {"labels": {"x": "1", "y": "2"}}});
        let b = json!({"metadata": {"labels": {"y": "2", "x": "1"}}});
        let none = json!({"metadata": {}});
        let empty = json!({"metadata": {"labels": {}}});
        let null = json!({"metadata": {"labels": null}});
        assert!(
            !f.evaluate(Modified, Some(&a), &b),
            "key order does not matter"
        );
        assert!(!f.evaluate(Modified, Some(&none), &empty));
        assert!(!f.evaluate(Modified, Some(&null), &empty));
        assert!(f.evaluate(Modified, Some(&none), &a));
        assert!(
            !f.evaluate(Modified, None, &a),
            "an update without old fails"
        );
        assert!(f.evaluate(Added, None, &a) && f.evaluate(Sync, None, &a));
    }

    #[test]
    fn many_finalizer_tests_use_one_set_and_agree_with_the_tree() {
        let names: Vec<P> = (0..10)
            .map(|i| P::HasFinalizer(format!("example.com/f{i}")))
            .collect();
        let f = Filter::compile(&P::AnyOf(names.clone()));
        assert!(f.finalizer_leaves > FINALIZER_SET_AFTER);
        let with = json!({"metadata": {"finalizers": ["other", "example.com/f7"]}});
        let without = json!({"metadata": {"finalizers": ["other"]}});
        let deleted_with = json!({"metadata": {"finalizers": ["example.com/f3"]}});
        assert!(f.evaluate(Added, None, &with));
        assert!(!f.evaluate(Added, None, &without));
        assert!(
            f.evaluate(Deleted, Some(&deleted_with), &without),
            "a deletion tests the last known state"
        );
        let all = P::AllOf(names);
        assert!(!Filter::compile(&all).evaluate(Added, None, &with));
    }

    /// Every tree shape the combinators allow gives the tree's own answer, on every event kind.
    #[test]
    fn agrees_with_the_tree_on_every_event() {
        let web = P::LabelSelector(LabelSelector {
            match_labels: [("app".to_string(), "web".to_string())].into(),
            match_expressions: vec![],
        });
        let leaves = [
            P::GenerationChanged,
            P::LabelsChanged,
            P::AnnotationsChanged,
            P::ResourceVersionChanged,
            P::Deleting,
            P::HasFinalizer("example.com/f".into()),
            web,
            P::AllOf(vec![]),
            P::AnyOf(vec![]),
        ];
        let mut trees: Vec<P> = leaves.to_vec();
        for a in &leaves {
            for b in &leaves {
                trees.push(P::AllOf(vec![a.clone(), b.clone(), a.clone()]));
                trees.push(P::AnyOf(vec![P::Not(Box::new(a.clone())), b.clone()]));
            }
        }
        let objects = [
            json!({"metadata": {"generation": 1, "resourceVersion": "1", "labels": {"app": "web"}}}),
            json!({"metadata": {"generation": 2, "resourceVersion": "2", "labels": {"app": "db"},
                "annotations": {"k": "v"}, "finalizers": ["example.com/f"],
                "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            json!({"metadata": null}),
            json!("not an object"),
        ];
        for tree in &trees {
            let f = Filter::compile(tree);
            for old in &objects {
                for new in &objects {
                    for kind in [Added, Modified, Deleted, Sync] {
                        assert_eq!(
                            f.evaluate(kind, Some(old), new),
                            tree.evaluate(kind, Some(old), new),
                            "{tree:?} {kind:?} {old} -> {new}"
                        );
                    }
                    assert_eq!(
                        f.evaluate(Modified, None, new),
                        tree.evaluate(Modified, None, new)
                    );
                }
            }
        }
    }
}
