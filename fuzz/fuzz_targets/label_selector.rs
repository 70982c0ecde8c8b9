//! Label-selector parsing: devcluster's parser of the `labelSelector=` syntax (what the
//! manager's informers send) on arbitrary strings and label sets, and the manager's own
//! selectors rendered to that syntax, which must parse and mean the same on both sides.
#![no_main]

use arbitrary::Arbitrary;
use ctrlhub::registration::predicate::{LabelSelector, LabelSelectorRequirement, SelectorOperator};
use devcluster::selector::LabelSelector as ServerSelector;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::collections::BTreeMap;

/// Keys and values from a small alphabet that includes the label syntax's special characters,
/// so generated selectors are often valid and often collide with the label sets.
fn word(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ab1-_./ =!(),";
    bytes
        .iter()
        .take(12)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

#[derive(Arbitrary, Debug)]
struct Input {
    text: String,
    labels: Vec<(Vec<u8>, Vec<u8>)>,
    match_labels: Vec<(Vec<u8>, Vec<u8>)>,
    exprs: Vec<(Vec<u8>, u8, Vec<Vec<u8>>)>,
}

fuzz_target!(|input: Input| {
    let labels: BTreeMap<String, String> = input
        .labels
        .iter()
        .map(|(k, v)| (word(k), word(v)))
        .collect();
    let json: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    // Arbitrary text: parses or is rejected; a parsed selector matches without panicking.
    if let Ok(sel) = ServerSelector::parse(&input.text) {
        let _ = sel.matches(Some(&json));
        let _ = sel.matches(None);
    }
    // The manager's selectors, rendered and parsed back, agree with the manager's matcher.
    let sel = LabelSelector {
        match_labels: input
            .match_labels
            .iter()
            .map(|(k, v)| (word(k), word(v)))
            .collect(),
        match_expressions: input
            .exprs
            .iter()
            .map(|(k, op, values)| LabelSelectorRequirement {
                key: word(k),
                operator: match op % 4 {
                    0 => SelectorOperator::In,
                    1 => SelectorOperator::NotIn,
                    2 => SelectorOperator::Exists,
                    _ => SelectorOperator::DoesNotExist,
                },
                values: values.iter().map(|v| word(v)).collect(),
            })
            .collect(),
    };
    ctrlhub_fuzz::check_selector_agrees(&sel, &[labels]);
});
