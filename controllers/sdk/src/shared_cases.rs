//! The helper semantics every ctrlhub SDK shares, run from the one table all three read:
//! `tests/conformance/helpers.json` at the repository's root (its `about` says what each
//! section means). Every case runs; one this SDK cannot run fails.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use rand::RngCore;
use serde_json::Value;

use crate::Backoff;
use crate::conditions::{
    ConditionStatus, condition, is_condition_true, remove_condition, set_condition_at,
};
use crate::finalizers::{self, Step};
use crate::request::safety_margin;

fn table() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/conformance/helpers.json"
    );
    let text = std::fs::read_to_string(path).expect("tests/conformance/helpers.json");
    serde_json::from_str(&text).expect("helpers.json is JSON")
}

fn cases(section: &str) -> Vec<Value> {
    let cases = table()[section].as_array().cloned().unwrap_or_default();
    assert!(!cases.is_empty(), "helpers.json has {section} cases");
    cases
}

fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_default()
}

fn status(s: &str) -> ConditionStatus {
    match s {
        "True" => ConditionStatus::True,
        "False" => ConditionStatus::False,
        "Unknown" => ConditionStatus::Unknown,
        other => panic!("not a condition status: {other}"),
    }
}

/// One `steps` entry of a conditions case; returns what the helper reported.
fn condition_step(conditions: &mut Vec<Condition>, step: &Value) -> bool {
    if let Some(kind) = step["remove"].as_str() {
        return remove_condition(conditions, kind);
    }
    let set = &step["set"];
    let new = condition(
        text(set, "type"),
        status(text(set, "status")),
        text(set, "reason"),
        text(set, "message"),
        set["observedGeneration"].as_i64(),
    );
    let now: Timestamp = text(step, "now").parse().expect("an RFC 3339 time");
    set_condition_at(conditions, new, now)
}

#[test]
fn conditions() {
    for case in cases("conditions") {
        let name = text(&case, "name");
        let mut conditions: Vec<Condition> =
            serde_json::from_value(case["given"].clone()).expect("given conditions");
        for (i, step) in case["steps"].as_array().into_iter().flatten().enumerate() {
            let changed = condition_step(&mut conditions, step);
            assert_eq!(Some(changed), step["changed"].as_bool(), "{name}: step {i}");
        }
        let got = serde_json::to_value(&conditions).expect("conditions serialize");
        assert_eq!(got, case["want"], "{name}");
        let want_true: Vec<&str> = case["true"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let got_true: Vec<&str> = conditions
            .iter()
            .map(|c| c.type_.as_str())
            .filter(|t| is_condition_true(&conditions, t))
            .collect();
        assert_eq!(got_true, want_true, "{name}: the True conditions");
    }
}

fn step_name(step: Step) -> &'static str {
    match step {
        Step::Add => "add",
        Step::Apply => "apply",
        Step::Cleanup => "cleanup",
        Step::None => "none",
    }
}

#[test]
fn finalizers() {
    for case in cases("finalizers") {
        let name = text(&case, "name");
        let obj: ConfigMap = serde_json::from_value(case["object"].clone()).expect("an object");
        let f = text(&case, "finalizer");
        assert_eq!(
            Some(finalizers::has_finalizer(&obj, f)),
            case["has"].as_bool(),
            "{name}: has"
        );
        assert_eq!(
            Some(finalizers::is_deleting(&obj)),
            case["deleting"].as_bool(),
            "{name}: deleting"
        );
        assert_eq!(
            step_name(finalizers::step(&obj, f)),
            text(&case, "step"),
            "{name}: step"
        );
        let patch = |p: Option<Value>| p.unwrap_or(Value::Null);
        assert_eq!(
            patch(finalizers::add_patch(&obj, f)),
            case["add_patch"],
            "{name}: add_patch"
        );
        assert_eq!(
            patch(finalizers::remove_patch(&obj, f)),
            case["remove_patch"],
            "{name}: remove_patch"
        );
    }
}

/// A random source fixed at one end of its range: every word all zeros or all ones.
struct Fixed(u64);

impl RngCore for Fixed {
    fn next_u32(&mut self) -> u32 {
        self.0 as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        dst.fill(self.0 as u8);
    }
}

fn ms(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is a number of milliseconds"))
}

#[test]
fn backoff() {
    let within = |got: Duration, want_ms: u64| {
        got.abs_diff(Duration::from_millis(want_ms)) <= Duration::from_millis(1)
    };
    for case in cases("backoff") {
        let name = text(&case, "name");
        let (initial, max) = (
            Duration::from_millis(ms(&case, "initial_ms")),
            Duration::from_millis(ms(&case, "max_ms")),
        );
        // No session lasts long enough here to reset it by its length (a Rust-only rule).
        let mut low = Backoff::new(initial, max, Duration::MAX);
        let mut high = low.clone();
        for (i, session) in case["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let registered = session["registered"].as_bool().expect("registered");
            let least = low.next_delay(Duration::ZERO, registered, &mut Fixed(0));
            let most = high.next_delay(Duration::ZERO, registered, &mut Fixed(u64::MAX));
            assert!(
                within(least, ms(session, "min_ms")),
                "{name}: session {i}: least {least:?}"
            );
            assert!(
                within(most, ms(session, "max_ms")),
                "{name}: session {i}: most {most:?}"
            );
        }
    }
}

#[test]
fn deadline() {
    for case in cases("deadline") {
        let remaining = Duration::from_millis(ms(&case, "remaining_ms"));
        let run = remaining - safety_margin(remaining);
        assert_eq!(
            run,
            Duration::from_millis(ms(&case, "run_ms")),
            "{remaining:?} left"
        );
    }
}
