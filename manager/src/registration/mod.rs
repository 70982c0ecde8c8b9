//! What a controller registered, as domain types free of protobuf and Kubernetes client types.
//! The gRPC edge translates `ctrlhub.v1.Register` into a [`Registration`] and reports problems
//! as [`Invalid`] naming the offending field.
//!
//! Owns: the registration rules and defaults, predicates, mapping an event to primary keys, and
//! retry backoff. May call: `key` only — these are pure functions and plain data, unit-tested
//! without a cluster, and fuzzed.

mod backoff;
pub mod filter;
pub mod mapping;
pub mod predicate;

use crate::registration::predicate::{LabelSelector, Predicate, SelectorOperator};
pub use backoff::Backoff;
use std::time::Duration;

/// A Kubernetes resource type, resolved through discovery.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceRef {
    /// API group, empty for core.
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name.
    pub plural: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

impl ResourceRef {
    /// `group/version` or `version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// How a watched object names the primary it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping {
    /// The value of this label is the primary's name (same namespace).
    Label(String),
    /// The value of this annotation is the primary's name (same namespace).
    Annotation(String),
    /// This dotted field holds `namespace/name` or `name`.
    Field(String),
}

/// A kind the controller owns: its events map to the controller owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Owned {
    /// The owned kind.
    pub resource: ResourceRef,
    /// Only the ownerReference with `controller: true` counts.
    pub controller_only: bool,
    /// Extra filter on the owned objects' events.
    pub predicate: Option<Predicate>,
    /// Asked to cache only metadata of this kind.
    pub metadata_only: bool,
}

/// Another kind the controller watches, mapped to primaries.
#[derive(Debug, Clone, PartialEq)]
pub struct Watched {
    /// The watched kind.
    pub resource: ResourceRef,
    /// How an object names its primary.
    pub mapping: Mapping,
    /// Extra filter on the watched objects' events.
    pub predicate: Option<Predicate>,
    /// Asked to cache only metadata of this kind (ignored for a field mapping).
    pub metadata_only: bool,
}

/// Which namespaces a registration covers.
#[derive(Debug, Clone, PartialEq)]
pub enum NamespaceScope {
    /// Every namespace (within the manager's ceiling).
    All,
    /// These namespaces.
    Names(Vec<String>),
    /// Namespaces whose labels match, followed live as labels change.
    Selector(LabelSelector),
}

/// How requests are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Level-triggered reconcile requests by key.
    Reconcile,
    /// Ordered per-key events (watcher-style controllers).
    Events,
}

/// A validated registration.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// Controller name, unique per tenant.
    pub name: String,
    /// Delivery mode.
    pub mode: Mode,
    /// The primary kind.
    pub primary: ResourceRef,
    /// Owned kinds.
    pub owns: Vec<Owned>,
    /// Watched kinds.
    pub watches: Vec<Watched>,
    /// Namespace scope.
    pub namespaces: NamespaceScope,
    /// Label selector on primaries (applied by the API server).
    pub label_selector: Option<LabelSelector>,
    /// Predicate on primary events.
    pub predicate: Option<Predicate>,
    /// Most requests in flight across all replicas; 0 = no bound beyond the sessions' credits.
    pub max_concurrent: u32,
    /// Per-request deadline.
    pub deadline: Duration,
    /// Resync period; None disables resync.
    pub resync: Option<Duration>,
    /// Per-key error backoff.
    pub backoff: Backoff,
    /// Whether requests carry the object.
    pub include_object: bool,
}

#[cfg(test)]
impl Registration {
    /// A test registration named `name` on namespaced ConfigMaps in every namespace, with the
    /// defaults and `max_concurrent`: the fixture dispatch's unit tests start from.
    pub(crate) fn config_maps(name: &str, max_concurrent: u32) -> Registration {
        Registration {
            name: name.into(),
            mode: Mode::Reconcile,
            primary: ResourceRef {
                group: "".into(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
                namespaced: true,
            },
            owns: vec![],
            watches: vec![],
            namespaces: NamespaceScope::All,
            label_selector: None,
            predicate: None,
            max_concurrent,
            deadline: Duration::from_secs(30),
            resync: None,
            backoff: Backoff::default(),
            include_object: false,
        }
    }
}

impl Registration {
    /// Whether `resource` is cached metadata-only for this registration: one form per kind,
    /// full unless every entry of the kind asks for metadata only (the primary, and a watch
    /// mapped by a field, always need the full object).
    pub fn metadata_only(&self, resource: &ResourceRef) -> bool {
        let same = |r: &ResourceRef| r.group == resource.group && r.kind == resource.kind;
        let mut entries = 0;
        let primary = same(&self.primary);
        let owned_full = self
            .owns
            .iter()
            .filter(|o| same(&o.resource))
            .inspect(|_| entries += 1)
            .any(|o| !o.metadata_only);
        let watched_full = self
            .watches
            .iter()
            .filter(|w| same(&w.resource))
            .inspect(|_| entries += 1)
            .any(|w| !w.metadata_only || matches!(w.mapping, Mapping::Field(_)));
        entries > 0 && !primary && !owned_full && !watched_full
    }

    /// Every kind the registration reads, each once: the primary, then owned and watched kinds
    /// in the order registered.
    pub fn kinds(&self) -> Vec<&ResourceRef> {
        let mut out: Vec<&ResourceRef> = Vec::new();
        let all = std::iter::once(&self.primary)
            .chain(self.owns.iter().map(|o| &o.resource))
            .chain(self.watches.iter().map(|w| &w.resource));
        for r in all {
            if !out.iter().any(|o| o.group == r.group && o.kind == r.kind) {
                out.push(r);
            }
        }
        out
    }

    /// The fields in which `other` differs from this registration's definition, by their proto
    /// names, for the message that refuses a conflicting definition.
    pub fn differences(&self, other: &Registration) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut differ = |same: bool, name: &'static str| {
            if !same {
                out.push(name);
            }
        };
        differ(self.mode == other.mode, "mode");
        differ(self.primary == other.primary, "primary");
        differ(self.owns == other.owns, "owns");
        differ(self.watches == other.watches, "watches");
        differ(self.namespaces == other.namespaces, "namespaces");
        differ(
            self.label_selector == other.label_selector,
            "label_selector",
        );
        differ(self.predicate == other.predicate, "predicate");
        differ(
            self.max_concurrent == other.max_concurrent,
            "max_concurrent_reconciles",
        );
        differ(self.deadline == other.deadline, "request_deadline");
        differ(self.resync == other.resync, "resync_period");
        differ(self.backoff == other.backoff, "backoff");
        differ(
            self.include_object == other.include_object,
            "include_object",
        );
        out
    }
}

/// A registration field that is wrong, and how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Invalid {
    /// Path of the field, e.g. `register.primary.kind`.
    pub field: String,
    /// What to change.
    pub message: String,
    /// Set when the field names a (group, kind) the API server does not serve. Under RBAC the
    /// session layer answers this exactly like a denial, so tenants cannot probe what exists.
    pub unserved: Option<(String, String)>,
}

impl Invalid {
    /// Build from parts.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid {
            field: field.into(),
            message: message.into(),
            unserved: None,
        }
    }

    /// The field names `kind` in `group`, which is not served.
    pub fn unserved(mut self, group: &str, kind: &str) -> Self {
        self.unserved = Some((group.to_string(), kind.to_string()));
        self
    }
}

/// Defaults applied when a registration leaves a setting at zero.
pub mod defaults {
    use std::time::Duration;
    /// Credits of a session that advertises none and registers no controller-wide bound.
    pub const MAX_IN_FLIGHT: u32 = 1;
    /// Per-request deadline.
    pub const DEADLINE: Duration = Duration::from_secs(60);
    /// Resync period (controller-runtime's default is 10 h).
    pub const RESYNC: Duration = Duration::from_secs(10 * 3600);
}

/// How much one registration may ask for. Each entry costs an informer subscription per
/// namespace and a discovery lookup, and every event of those kinds is mapped and filtered for
/// it, so the counts are bounded where the Register message enters (far above what a real
/// controller uses: controller-runtime controllers own and watch a handful of kinds).
pub mod bounds {
    /// Entries of `owns`.
    pub const OWNS: usize = 32;
    /// Entries of `watches`.
    pub const WATCHES: usize = 32;
    /// Namespaces in a `names` scope.
    pub const NAMESPACE_NAMES: usize = 256;
    /// Encoded size of a Register message, in bytes.
    pub const REGISTER_BYTES: usize = 64 * 1024;
    /// Shortest per-key backoff base: a key that keeps failing is retried no more often than
    /// this (then doubling), however small a base the registration asks for.
    pub const MIN_BACKOFF_BASE: std::time::Duration = std::time::Duration::from_millis(1);
    /// Nodes of every predicate of one registration together (primary, owns and watches): each
    /// event of a subscribed kind evaluates them, so this bounds the work per event per
    /// registration, whatever the shape of the trees.
    pub const PREDICATE_NODES: usize = 1024;
}

/// A list field with more entries than its bound.
pub fn check_count(field: &str, len: usize, max: usize) -> Result<(), Invalid> {
    if len > max {
        return Err(Invalid::new(
            field,
            format!(
                "has {len} entries; the limit is {max}: list each kind once (entries that differ only in predicate can be combined with any_of)"
            ),
        ));
    }
    Ok(())
}

/// `items` with exact repeats removed, first occurrence kept: two identical owns or watches
/// entries would only subscribe the same filter twice.
pub fn without_repeats<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// A controller name must be usable as a metric label and a Kubernetes-style name.
pub fn validate_name(name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            "register.controller_name",
            format!(
                "{name:?} is not a valid controller name: use 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"
            ),
        ))
    }
}

/// The label selector as the API server's `labelSelector` query parameter.
pub fn selector_query(sel: &LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in &sel.match_expressions {
        parts.push(match e.operator {
            SelectorOperator::In => format!("{} in ({})", e.key, e.values.join(",")),
            SelectorOperator::NotIn => format!("{} notin ({})", e.key, e.values.join(",")),
            SelectorOperator::Exists => e.key.clone(),
            SelectorOperator::DoesNotExist => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::predicate::LabelSelectorRequirement;

    #[test]
    fn selector_query_matches_kubernetes_syntax() {
        let mut sel = LabelSelector::default();
        sel.match_labels.insert("app".into(), "web".into());
        sel.match_expressions.push(LabelSelectorRequirement {
            key: "tier".into(),
            operator: SelectorOperator::In,
            values: vec!["a".into(), "b".into()],
        });
        sel.match_expressions.push(LabelSelectorRequirement {
            key: "old".into(),
            operator: SelectorOperator::DoesNotExist,
            values: vec![],
        });
        assert_eq!(selector_query(&sel), "app=web,tier in (a,b),!old");
    }

    #[test]
    fn counts_past_their_bound_name_the_field_and_the_limit() {
        assert!(check_count("register.owns", bounds::OWNS, bounds::OWNS).is_ok());
        let e = check_count("register.owns", 100_000, bounds::OWNS).expect_err("too many");
        assert_eq!(e.field, "register.owns");
        assert!(e.message.contains("100000 entries; the limit is 32"), "{e}");
        assert_eq!(without_repeats(vec![1, 2, 1, 3, 2]), vec![1, 2, 3]);
    }

    #[test]
    fn controller_names_are_checked() {
        assert!(validate_name("memcached").is_ok());
        let err = validate_name("Bad_Name").expect_err("uppercase and underscore are invalid");
        assert_eq!(err.field, "register.controller_name");
        assert!(validate_name("").is_err());
    }
}
