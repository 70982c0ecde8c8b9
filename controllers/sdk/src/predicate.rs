//! Event predicates: a builder for the `ctrlhub.v1.Predicate` tree that the
//! manager evaluates before an event may enqueue anything.

use std::ops::Not;

use ctrlhub_proto::v1 as pb;
use pb::predicate::Predicate as P;

use crate::Selector;

/// An event filter, evaluated by the manager (not in this process).
///
/// Combine leaves with [`Predicate::or`], [`Predicate::and`] and `!`:
///
/// ```
/// use ctrlhub_sdk::Predicate;
/// let p = Predicate::generation_changed()
///     .or(Predicate::deleting())
///     .or(!Predicate::has_finalizer("example.com/cleanup"));
/// let proto = p.to_proto();
/// assert!(proto.predicate.is_some());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Predicate {
    /// Updates where `metadata.generation` changed (creations, deletions and
    /// resyncs pass).
    GenerationChanged,
    /// Updates where `metadata.labels` changed.
    LabelsChanged,
    /// Updates where `metadata.annotations` changed.
    AnnotationsChanged,
    /// Updates where `metadata.resourceVersion` changed.
    ResourceVersionChanged,
    /// Objects whose labels match the selector.
    LabelSelector(Selector),
    /// Objects with `metadata.deletionTimestamp` set.
    Deleting,
    /// Objects whose finalizers contain the name.
    HasFinalizer(String),
    /// Every child passes.
    AllOf(Vec<Predicate>),
    /// At least one child passes.
    AnyOf(Vec<Predicate>),
    /// The inner predicate does not pass.
    Not(Box<Predicate>),
}

impl Predicate {
    /// See [`Predicate::GenerationChanged`].
    pub fn generation_changed() -> Self {
        Self::GenerationChanged
    }
    /// See [`Predicate::LabelsChanged`].
    pub fn labels_changed() -> Self {
        Self::LabelsChanged
    }
    /// See [`Predicate::AnnotationsChanged`].
    pub fn annotations_changed() -> Self {
        Self::AnnotationsChanged
    }
    /// See [`Predicate::ResourceVersionChanged`].
    pub fn resource_version_changed() -> Self {
        Self::ResourceVersionChanged
    }
    /// See [`Predicate::LabelSelector`].
    pub fn label_selector(selector: impl Into<Selector>) -> Self {
        Self::LabelSelector(selector.into())
    }
    /// See [`Predicate::Deleting`].
    pub fn deleting() -> Self {
        Self::Deleting
    }
    /// See [`Predicate::HasFinalizer`].
    pub fn has_finalizer(name: impl Into<String>) -> Self {
        Self::HasFinalizer(name.into())
    }
    /// Passes when every predicate passes.
    pub fn all_of(predicates: impl IntoIterator<Item = Predicate>) -> Self {
        Self::AllOf(predicates.into_iter().collect())
    }
    /// Passes when at least one predicate passes.
    pub fn any_of(predicates: impl IntoIterator<Item = Predicate>) -> Self {
        Self::AnyOf(predicates.into_iter().collect())
    }

    /// `self OR other`; chains flatten into one `any_of`.
    pub fn or(self, other: Predicate) -> Self {
        match self {
            Self::AnyOf(mut children) => {
                children.push(other);
                Self::AnyOf(children)
            }
            first => Self::AnyOf(vec![first, other]),
        }
    }

    /// `self AND other`; chains flatten into one `all_of`.
    pub fn and(self, other: Predicate) -> Self {
        match self {
            Self::AllOf(mut children) => {
                children.push(other);
                Self::AllOf(children)
            }
            first => Self::AllOf(vec![first, other]),
        }
    }

    /// The wire form.
    pub fn to_proto(&self) -> pb::Predicate {
        let p = match self {
            Self::GenerationChanged => P::GenerationChanged(pb::predicate::GenerationChanged {}),
            Self::LabelsChanged => P::LabelsChanged(pb::predicate::LabelsChanged {}),
            Self::AnnotationsChanged => P::AnnotationsChanged(pb::predicate::AnnotationsChanged {}),
            Self::ResourceVersionChanged => {
                P::ResourceVersionChanged(pb::predicate::ResourceVersionChanged {})
            }
            Self::LabelSelector(sel) => P::LabelSelector(sel.to_proto()),
            Self::Deleting => P::Deleting(pb::predicate::Deleting {}),
            Self::HasFinalizer(name) => {
                P::HasFinalizer(pb::predicate::HasFinalizer { name: name.clone() })
            }
            Self::AllOf(children) => P::AllOf(pb::predicate::AllOf {
                predicates: children.iter().map(Predicate::to_proto).collect(),
            }),
            Self::AnyOf(children) => P::AnyOf(pb::predicate::AnyOf {
                predicates: children.iter().map(Predicate::to_proto).collect(),
            }),
            Self::Not(inner) => P::Negate(Box::new(inner.to_proto())),
        };
        pb::Predicate { predicate: Some(p) }
    }
}

impl Not for Predicate {
    type Output = Predicate;
    fn not(self) -> Predicate {
        match self {
            Self::Not(inner) => *inner,
            other => Self::Not(Box::new(other)),
        }
    }
}

impl From<&Predicate> for pb::Predicate {
    fn from(p: &Predicate) -> Self {
        p.to_proto()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(p: P) -> pb::Predicate {
        pb::Predicate { predicate: Some(p) }
    }

    #[test]
    fn or_chain_flattens_into_any_of() {
        let p = Predicate::generation_changed()
            .or(Predicate::deleting())
            .or(Predicate::has_finalizer("x/y"));
        assert_eq!(
            p.to_proto(),
            leaf(P::AnyOf(pb::predicate::AnyOf {
                predicates: vec![
                    leaf(P::GenerationChanged(pb::predicate::GenerationChanged {})),
                    leaf(P::Deleting(pb::predicate::Deleting {})),
                    leaf(P::HasFinalizer(pb::predicate::HasFinalizer {
                        name: "x/y".into()
                    })),
                ]
            }))
        );
    }

    #[test]
    fn and_not_nesting() {
        let p = Predicate::labels_changed()
            .and(!Predicate::label_selector(Selector::labels([("a", "b")])));
        let pb::Predicate {
            predicate: Some(P::AllOf(all)),
        } = p.to_proto()
        else {
            panic!("expected all_of");
        };
        assert_eq!(all.predicates.len(), 2);
        let Some(P::Negate(inner)) = &all.predicates[1].predicate else {
            panic!("expected negate");
        };
        let Some(P::LabelSelector(sel)) = &inner.predicate else {
            panic!("expected label selector");
        };
        assert_eq!(sel.match_labels.get("a").map(String::as_str), Some("b"));
    }

    #[test]
    fn double_negation_cancels() {
        assert_eq!(!!Predicate::deleting(), Predicate::deleting());
    }

    #[test]
    fn or_after_and_nests() {
        let p = Predicate::deleting()
            .and(Predicate::generation_changed())
            .or(Predicate::annotations_changed());
        let Predicate::AnyOf(children) = &p else {
            panic!("expected any_of");
        };
        assert!(matches!(children[0], Predicate::AllOf(_)));
        assert_eq!(children[1], Predicate::AnnotationsChanged);
    }
}
