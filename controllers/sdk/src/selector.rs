//! Label selectors, structured as Kubernetes' `metav1.LabelSelector`.

use std::collections::BTreeMap;

use ctrlhub_proto::v1 as pb;
use pb::label_selector_requirement::Operator as PbOperator;

/// A Kubernetes label selector: every `match_labels` entry and every
/// requirement must hold. An empty selector matches every object.
///
/// ```
/// use ctrlhub_sdk::Selector;
/// let sel = Selector::labels([("team", "a")]).exists("tier").not_in("env", ["dev"]);
/// assert_eq!(sel.match_labels.get("team").map(String::as_str), Some("a"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    /// Label key → required exact value.
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements, all of which must hold.
    pub match_expressions: Vec<Requirement>,
}

/// One set-based requirement of a [`Selector`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// The label is present and its value is one of the values.
    In(String, Vec<String>),
    /// The label is absent or its value is none of the values.
    NotIn(String, Vec<String>),
    /// The label is present, whatever its value.
    Exists(String),
    /// The label is absent.
    DoesNotExist(String),
}

impl Selector {
    /// The empty selector (matches everything).
    pub fn new() -> Self {
        Self::default()
    }

    /// A selector requiring each `(key, value)` label.
    pub fn labels<K: Into<String>, V: Into<String>>(
        labels: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            match_labels: labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            match_expressions: Vec::new(),
        }
    }

    /// Also require label `key` to equal `value`.
    pub fn eq(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.match_labels.insert(key.into(), value.into());
        self
    }

    /// Also require label `key` to have one of `values`.
    pub fn in_<V: Into<String>>(
        mut self,
        key: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.match_expressions.push(Requirement::In(
            key.into(),
            values.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// Also require label `key` to be absent or have none of `values`.
    pub fn not_in<V: Into<String>>(
        mut self,
        key: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.match_expressions.push(Requirement::NotIn(
            key.into(),
            values.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// Also require label `key` to be present.
    pub fn exists(mut self, key: impl Into<String>) -> Self {
        self.match_expressions.push(Requirement::Exists(key.into()));
        self
    }

    /// Also require label `key` to be absent.
    pub fn does_not_exist(mut self, key: impl Into<String>) -> Self {
        self.match_expressions
            .push(Requirement::DoesNotExist(key.into()));
        self
    }

    /// The wire form.
    pub fn to_proto(&self) -> pb::LabelSelector {
        pb::LabelSelector {
            match_labels: self
                .match_labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            match_expressions: self
                .match_expressions
                .iter()
                .map(Requirement::to_proto)
                .collect(),
        }
    }
}

impl Requirement {
    /// The wire form.
    pub fn to_proto(&self) -> pb::LabelSelectorRequirement {
        let (key, op, values) = match self {
            Requirement::In(k, v) => (k, PbOperator::In, v.clone()),
            Requirement::NotIn(k, v) => (k, PbOperator::NotIn, v.clone()),
            Requirement::Exists(k) => (k, PbOperator::Exists, Vec::new()),
            Requirement::DoesNotExist(k) => (k, PbOperator::DoesNotExist, Vec::new()),
        };
        pb::LabelSelectorRequirement {
            key: key.clone(),
            operator: op.into(),
            values,
        }
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Selector {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        Self::labels(iter)
    }
}

impl From<BTreeMap<String, String>> for Selector {
    fn from(match_labels: BTreeMap<String, String>) -> Self {
        Self {
            match_labels,
            match_expressions: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_to_proto() {
        let sel = Selector::labels([("team", "a")])
            .in_("env", ["prod", "staging"])
            .does_not_exist("legacy");
        let pb = sel.to_proto();
        assert_eq!(pb.match_labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(pb.match_expressions.len(), 2);
        assert_eq!(pb.match_expressions[0].operator(), PbOperator::In);
        assert_eq!(pb.match_expressions[0].values, ["prod", "staging"]);
        assert_eq!(pb.match_expressions[1].operator(), PbOperator::DoesNotExist);
        assert!(pb.match_expressions[1].values.is_empty());
    }
}
