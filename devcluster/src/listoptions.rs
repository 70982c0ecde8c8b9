//! kube-apiserver's validation of list and watch options (`ValidateListOptions` in
//! apimachinery's `internalversion/validation`), with the WatchList feature on: a watch that
//! asks for initial events must also say `resourceVersionMatch=NotOlderThan`, and the
//! list-only and watch-only options are refused where they do not apply.

use crate::status::{ApiError, Cause};
use std::collections::HashMap;

fn forbidden(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden".into(),
        message: format!("Forbidden: {detail}"),
        field: field.into(),
    }
}

fn not_supported(field: &str, value: &str, supported: &[&str]) -> Cause {
    let supported: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
    Cause {
        reason: "FieldValueNotSupported".into(),
        message: format!(
            "Unsupported value: \"{value}\": supported values: {}",
            supported.join(", ")
        ),
        field: field.into(),
    }
}

const MATCH: &str = "resourceVersionMatch";

fn watch_causes(send_initial: bool, rv_match: &str, cont: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    if send_initial && rv_match != "NotOlderThan" {
        causes.push(forbidden(
            MATCH,
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if !rv_match.is_empty() {
        if !send_initial {
            causes.push(forbidden(
                MATCH,
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if rv_match != "NotOlderThan" {
            causes.push(not_supported(MATCH, rv_match, &["NotOlderThan"]));
        }
        if !cont.is_empty() {
            causes.push(forbidden(
                MATCH,
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    causes
}

fn list_causes(send_initial: bool, rv_match: &str, rv: &str, cont: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    if !rv_match.is_empty() {
        if rv.is_empty() {
            causes.push(forbidden(
                MATCH,
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if !cont.is_empty() {
            causes.push(forbidden(
                MATCH,
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if rv_match != "Exact" && rv_match != "NotOlderThan" {
            causes.push(not_supported(
                MATCH,
                rv_match,
                &["Exact", "NotOlderThan", ""],
            ));
        }
        if rv_match == "Exact" && rv == "0" {
            causes.push(forbidden(
                MATCH,
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if send_initial {
        causes.push(forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    causes
}

/// Validates a list (`watch == false`) or watch request's options: 422 `ListOptions.meta.k8s.io
/// "" is invalid` with one cause per problem, as kube-apiserver answers.
pub(crate) fn validate(query: &HashMap<String, String>, watch: bool) -> Result<(), ApiError> {
    let get = |k: &str| query.get(k).map(String::as_str).unwrap_or_default();
    // Presence, not truth: `sendInitialEvents=false` counts as set, as the Go pointer does.
    let send_initial = query.contains_key("sendInitialEvents");
    let causes = if watch {
        watch_causes(send_initial, get(MATCH), get("continue"))
    } else {
        list_causes(
            send_initial,
            get(MATCH),
            get("resourceVersion"),
            get("continue"),
        )
    };
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid("ListOptions", "meta.k8s.io", "", causes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn watch_list_needs_not_older_than() {
        let err = validate(&q(&[("sendInitialEvents", "true")]), true).expect_err("refused");
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        );
        validate(
            &q(&[("sendInitialEvents", "true"), (MATCH, "NotOlderThan")]),
            true,
        )
        .expect("the watch-list form");
        assert!(validate(&q(&[(MATCH, "NotOlderThan")]), true).is_err());
    }

    #[test]
    fn lists_refuse_watch_options() {
        assert!(validate(&q(&[("sendInitialEvents", "true")]), false).is_err());
        assert!(validate(&q(&[(MATCH, "NotOlderThan")]), false).is_err());
        validate(
            &q(&[(MATCH, "NotOlderThan"), ("resourceVersion", "0")]),
            false,
        )
        .expect("kube-rs's match_any");
    }
}
