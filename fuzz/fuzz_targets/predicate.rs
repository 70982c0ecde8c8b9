//! Predicate evaluation: arbitrary predicate trees over arbitrary objects (structured ones and
//! raw JSON with mistyped metadata). Validation and evaluation must never panic, and the
//! combinators must obey their laws (see `ctrlhub_fuzz::evaluate_everywhere`).
#![no_main]

use arbitrary::Arbitrary;
use ctrlhub::registration::predicate::{LabelSelector, LabelSelectorRequirement, Predicate, SelectorOperator};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use std::collections::BTreeMap;

#[derive(Arbitrary, Debug)]
enum P {
    Generation,
    Labels,
    Annotations,
    ResourceVersion,
    Selector(BTreeMap<String, String>, Vec<(String, u8, Vec<String>)>),
    Deleting,
    HasFinalizer(String),
    All(Vec<P>),
    Any(Vec<P>),
    Not(Box<P>),
}

impl P {
    fn build(&self) -> Predicate {
        match self {
            P::Generation => Predicate::GenerationChanged,
            P::Labels => Predicate::LabelsChanged,
            P::Annotations => Predicate::AnnotationsChanged,
            P::ResourceVersion => Predicate::ResourceVersionChanged,
            P::Selector(labels, exprs) => Predicate::LabelSelector(LabelSelector {
                match_labels: labels.clone(),
                match_expressions: exprs
                    .iter()
                    .map(|(key, op, values)| LabelSelectorRequirement {
                        key: key.clone(),
                        operator: match op % 4 {
                            0 => SelectorOperator::In,
                            1 => SelectorOperator::NotIn,
                            2 => SelectorOperator::Exists,
                            _ => SelectorOperator::DoesNotExist,
                        },
                        values: values.clone(),
                    })
                    .collect(),
            }),
            P::Deleting => Predicate::Deleting,
            P::HasFinalizer(f) => Predicate::HasFinalizer(f.clone()),
            P::All(c) => Predicate::AllOf(c.iter().map(P::build).collect()),
            P::Any(c) => Predicate::AnyOf(c.iter().map(P::build).collect()),
            P::Not(c) => Predicate::Not(Box::new(c.build())),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Obj {
    generation: Option<i64>,
    resource_version: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    deleting: bool,
    finalizers: Vec<String>,
    /// Raw JSON instead of the fields above, when it parses: mistyped metadata.
    raw: Option<String>,
}

impl Obj {
    fn to_json(&self) -> Value {
        if let Some(v) = self
            .raw
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok())
        {
            return v;
        }
        let mut meta = json!({"name": "x", "labels": self.labels, "annotations": self.annotations,
            "finalizers": self.finalizers});
        if let Some(g) = self.generation {
            meta["generation"] = json!(g);
        }
        if let Some(rv) = &self.resource_version {
            meta["resourceVersion"] = json!(rv);
        }
        if self.deleting {
            meta["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        }
        json!({"metadata": meta})
    }
}

fuzz_target!(|input: (P, Vec<Obj>)| {
    let (p, objects) = input;
    let tree = p.build();
    // Validation is total: it returns Ok or an error naming a path, for any tree.
    if let Err(e) = tree.validate() {
        assert!(!e.path().is_empty(), "validation error without a path: {e}");
    }
    let mut objects: Vec<Value> = objects.iter().take(4).map(Obj::to_json).collect();
    objects.extend(ctrlhub_fuzz::sample_objects(&BTreeMap::new()));
    ctrlhub_fuzz::evaluate_everywhere(&tree, &objects);
});
