//! The namespace scope of one registration: which keys it may deliver, decided here and nowhere
//! else. Routing asks it before keeping anything for an event, the controller before it queues a
//! key, and the outbox before a waiting message leaves the manager (a namespace can leave a
//! selector scope while its keys wait).
//!
//! A scope is up to three parts, every one of which must admit a key:
//! - the kind of the primary: a namespaced primary's keys have a namespace, a cluster-scoped
//!   primary's keys have none;
//! - a fixed list of namespaces (the registration's, or the manager's ceiling), which also names
//!   the namespaces its informers open;
//! - a namespace label selector, whose admitted namespaces change as namespaces' labels do, and,
//!   for an identity without a cluster-wide grant, only after a gate (an RBAC check) allows each.
//!
//! Plain data behind a lock: no task, no clock. The gate's asynchronous check runs in
//! `dispatch::admission`, which reports its answers back through [`Scope::admit`].
//!
//! Owns: [`Scope`]. May call `key`, `registration` (the label selector) and `tenancy` (the gate
//! trait); nothing else of `dispatch`.

use crate::key::ObjectKey;
use crate::registration::predicate::LabelSelector;
use crate::tenancy::NamespaceGate;
use parking_lot::RwLock;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;

/// Which keys one registration may deliver. Cheap to clone: clones share the selector part, so
/// every reader sees a namespace enter or leave at once.
#[derive(Clone)]
pub(crate) struct Scope(Arc<Inner>);

struct Inner {
    /// The primary is namespaced: its keys need a namespace (and a cluster-scoped one none).
    namespaced: bool,
    /// The namespaces the informers open, in the order given; None: one cluster-wide informer.
    names: Option<Vec<String>>,
    /// `names` as a set, for lookups.
    fixed: Option<HashSet<String>>,
    /// A namespace label selector, when the registration has one.
    selector: Option<Selected>,
}

/// The selector part of a scope.
struct Selected {
    selector: LabelSelector,
    /// Checks each matching namespace before it enters; None: a matching namespace enters at
    /// once (an identity allowed cluster-wide).
    gate: Option<Arc<dyn NamespaceGate>>,
    namespaces: RwLock<Namespaces>,
}

/// The namespaces matching a selector now, and those of them admitted.
#[derive(Default)]
struct Namespaces {
    matching: HashSet<String>,
    /// A subset of `matching`: a namespace is admitted only while it still matches, so one
    /// that stops matching while its check is in flight does not slip in when the answer comes.
    admitted: HashSet<String>,
}

/// What a change of a namespace did to a selector scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// It entered the scope now: its objects are to be delivered.
    Entered,
    /// It started matching a gated scope: the gate must allow it before it enters.
    NeedsCheck,
    /// Nothing that needs doing (still in, still out, or it left).
    Unchanged,
}

impl Scope {
    /// A scope by namespace list alone: `names` (None: every namespace) for a primary that is
    /// `namespaced` or not.
    pub(crate) fn new(namespaced: bool, names: Option<Vec<String>>) -> Self {
        Self::build(namespaced, names, None)
    }

    /// A scope of the namespaces (within `names`, when set) whose labels match `selector`,
    /// each entering only once `gate` allows it when there is a gate.
    pub(crate) fn selecting(
        namespaced: bool,
        names: Option<Vec<String>>,
        selector: LabelSelector,
        gate: Option<Arc<dyn NamespaceGate>>,
    ) -> Self {
        let selected = Selected {
            selector,
            gate,
            namespaces: RwLock::new(Namespaces::default()),
        };
        Self::build(namespaced, names, Some(selected))
    }

    fn build(namespaced: bool, names: Option<Vec<String>>, selector: Option<Selected>) -> Self {
        let fixed = names.as_ref().map(|n| n.iter().cloned().collect());
        Scope(Arc::new(Inner {
            namespaced,
            names,
            fixed,
            selector,
        }))
    }

    /// Whether `key` is in the scope now: its namespace listed (when there is a list) and
    /// admitted (when there is a selector), or no namespace for a cluster-scoped primary.
    pub(crate) fn admits(&self, key: &ObjectKey) -> bool {
        if !self.0.namespaced {
            return key.namespace.is_empty();
        }
        !key.namespace.is_empty()
            && self.is_listed(&key.namespace)
            && self
                .0
                .selector
                .as_ref()
                .is_none_or(|s| s.namespaces.read().admitted.contains(&key.namespace))
    }

    /// The namespaces to open informers in (None: every namespace, one informer).
    pub(crate) fn namespaces(&self) -> Option<&[String]> {
        self.0.names.as_deref()
    }

    /// Whether the scope follows a namespace label selector.
    pub(crate) fn is_selecting(&self) -> bool {
        self.0.selector.is_some()
    }

    /// Whether each namespace enters only after the gate's check.
    pub(crate) fn is_gated(&self) -> bool {
        self.gate().is_some()
    }

    /// The gate a matching namespace must pass, if any.
    pub(crate) fn gate(&self) -> Option<&Arc<dyn NamespaceGate>> {
        self.0.selector.as_ref().and_then(|s| s.gate.as_ref())
    }

    /// Every namespace a selector scope admits now, sorted (empty without a selector).
    pub(crate) fn admitted(&self) -> Vec<String> {
        let mut all: Vec<String> = self.0.selector.as_ref().map_or_else(Vec::new, |s| {
            s.namespaces.read().admitted.iter().cloned().collect()
        });
        all.sort();
        all
    }

    /// A namespace named `name` was added or changed (`object`, with its labels) or deleted
    /// (None). It enters a selector scope when it starts matching (at once, or after the gate),
    /// and leaves it at once when it stops matching, is deleted, or is outside the list.
    pub(crate) fn namespace_changed(&self, name: &str, object: Option<&Value>) -> Entry {
        let Some(selected) = &self.0.selector else {
            return Entry::Unchanged;
        };
        // The list (the manager's ceiling) bounds every scope: a namespace outside it is never
        // even checked.
        let matches =
            self.is_listed(name) && object.is_some_and(|o| selected.selector.matches_object(o));
        let mut ns = selected.namespaces.write();
        if !matches {
            ns.matching.remove(name);
            ns.admitted.remove(name);
            return Entry::Unchanged;
        }
        if !ns.matching.insert(name.to_string()) {
            // A relabel that still matches asks nothing new.
            return Entry::Unchanged;
        }
        if selected.gate.is_some() {
            return Entry::NeedsCheck;
        }
        ns.admitted.insert(name.to_string());
        Entry::Entered
    }

    /// Whether `namespace` matches the selector now (a check for it is still wanted).
    pub(crate) fn is_matching(&self, namespace: &str) -> bool {
        self.0
            .selector
            .as_ref()
            .is_some_and(|s| s.namespaces.read().matching.contains(namespace))
    }

    /// The gate allowed `namespace`: true if it entered the scope now (it still matches and was
    /// not in already), so its objects are delivered exactly once.
    pub(crate) fn admit(&self, namespace: &str) -> bool {
        let Some(selected) = &self.0.selector else {
            return false;
        };
        let mut ns = selected.namespaces.write();
        ns.matching.contains(namespace) && ns.admitted.insert(namespace.to_string())
    }

    fn is_listed(&self, namespace: &str) -> bool {
        self.0.fixed.as_ref().is_none_or(|f| f.contains(namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::{AuthzError, BoxFuture};
    use serde_json::json;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn key(ns: &str) -> ObjectKey {
        ObjectKey::new(ns, "x")
    }

    fn team(value: &str) -> LabelSelector {
        LabelSelector {
            match_labels: BTreeMap::from([("team".to_string(), value.to_string())]),
            match_expressions: Vec::new(),
        }
    }

    fn namespace(name: &str, team: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"team": team}}})
    }

    /// A gate never asked in these tests: the scope only needs to know there is one.
    struct Gate;

    impl NamespaceGate for Gate {
        fn admit<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<bool, AuthzError>> {
            Box::pin(async { Ok(true) })
        }

        fn retry_after(&self) -> Duration {
            Duration::from_secs(30)
        }
    }

    #[test]
    fn a_list_admits_its_namespaces_only() {
        let scope = Scope::new(true, Some(vec!["a".into(), "b".into()]));
        assert!(scope.admits(&key("a")));
        assert!(scope.admits(&key("b")));
        assert!(!scope.admits(&key("c")), "another tenant's namespace");
        assert!(
            !scope.admits(&key("")),
            "a cluster-scoped name for a namespaced primary"
        );
        assert_eq!(scope.namespaces(), Some(&["a".to_string(), "b".into()][..]));
        assert!(!scope.is_selecting() && !scope.is_gated());
    }

    #[test]
    fn every_namespace_or_none_by_the_primarys_kind() {
        let all = Scope::new(true, None);
        assert!(all.admits(&key("anything")));
        assert!(!all.admits(&key("")));
        assert_eq!(all.namespaces(), None);
        let cluster = Scope::new(false, None);
        assert!(cluster.admits(&key("")));
        assert!(
            !cluster.admits(&key("a")),
            "a cluster-scoped primary's keys have no namespace"
        );
    }

    #[test]
    fn a_selector_admits_namespaces_while_their_labels_match() {
        let scope = Scope::selecting(true, None, team("x"), None);
        assert!(!scope.admits(&key("a")), "nothing seen yet");
        let a = namespace("a", "x");
        assert_eq!(scope.namespace_changed("a", Some(&a)), Entry::Entered);
        assert!(scope.admits(&key("a")));
        assert_eq!(
            scope.namespace_changed("a", Some(&a)),
            Entry::Unchanged,
            "a relabel that still matches delivers nothing again"
        );
        assert_eq!(
            scope.namespace_changed("b", Some(&namespace("b", "y"))),
            Entry::Unchanged
        );
        assert!(!scope.admits(&key("b")));
        assert_eq!(scope.admitted(), ["a"]);

        // Its label changes: out at once; back: in again, delivered again.
        assert_eq!(
            scope.namespace_changed("a", Some(&namespace("a", "y"))),
            Entry::Unchanged
        );
        assert!(!scope.admits(&key("a")));
        assert_eq!(scope.namespace_changed("a", Some(&a)), Entry::Entered);
        assert_eq!(
            scope.namespace_changed("a", None),
            Entry::Unchanged,
            "deleted"
        );
        assert!(!scope.admits(&key("a")));
        assert!(scope.admitted().is_empty());
    }

    #[test]
    fn a_selector_never_reaches_past_the_list() {
        let scope = Scope::selecting(true, Some(vec!["a".into()]), team("x"), None);
        assert_eq!(
            scope.namespace_changed("a", Some(&namespace("a", "x"))),
            Entry::Entered
        );
        assert_eq!(
            scope.namespace_changed("b", Some(&namespace("b", "x"))),
            Entry::Unchanged,
            "outside the manager's ceiling: never even checked"
        );
        assert!(!scope.admits(&key("b")));
    }

    #[test]
    fn a_gated_namespace_enters_only_once_allowed_while_it_matches_and_only_once() {
        let scope = Scope::selecting(true, None, team("x"), Some(Arc::new(Gate)));
        assert!(scope.is_gated());
        assert!(!scope.admit("a"), "never matched: not admitted");
        let a = namespace("a", "x");
        assert_eq!(scope.namespace_changed("a", Some(&a)), Entry::NeedsCheck);
        assert!(
            !scope.admits(&key("a")),
            "matching is not enough: the gate decides"
        );
        assert!(scope.is_matching("a"));
        assert_eq!(
            scope.namespace_changed("a", Some(&a)),
            Entry::Unchanged,
            "a relabel that still matches does not ask again"
        );
        assert!(scope.admit("a"));
        assert!(scope.admits(&key("a")));
        assert!(!scope.admit("a"), "entering twice would deliver twice");
        assert_eq!(
            scope.namespace_changed("a", Some(&namespace("a", "y"))),
            Entry::Unchanged
        );
        assert!(!scope.admits(&key("a")) && !scope.is_matching("a"));
        assert!(
            !scope.admit("a"),
            "an answer arriving after the label was removed does not admit it"
        );
        assert_eq!(
            scope.namespace_changed("a", Some(&a)),
            Entry::NeedsCheck,
            "matching again asks for a new check"
        );
    }

    #[test]
    fn clones_share_what_the_selector_admits() {
        let scope = Scope::selecting(true, None, team("x"), None);
        let seen_elsewhere = scope.clone();
        scope.namespace_changed("a", Some(&namespace("a", "x")));
        assert!(seen_elsewhere.admits(&key("a")));
    }
}
