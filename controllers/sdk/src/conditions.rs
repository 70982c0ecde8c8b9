//! `metav1.Condition` helpers with apimachinery's `meta.SetStatusCondition`
//! semantics: `lastTransitionTime` changes only when `status` changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl ConditionStatus {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// A new condition with an unset (zero) `lastTransitionTime`, which
/// [`set_condition`] fills in.
///
/// ```
/// use ctrlhub_sdk::conditions::{condition, set_condition, ConditionStatus};
/// let mut conditions = Vec::new();
/// let changed = set_condition(
///     &mut conditions,
///     condition("Available", ConditionStatus::True, "Reconciled", "all good", Some(3)),
/// );
/// assert!(changed);
/// assert_eq!(conditions[0].observed_generation, Some(3));
/// ```
pub fn condition(
    type_: impl Into<String>,
    status: impl Into<ConditionStatus>,
    reason: impl Into<String>,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into().as_str().into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// Sets `new` in `conditions` (matched by type) and reports whether anything
/// changed. A new condition, or one whose status changed, gets `new`'s
/// `lastTransitionTime` if set (non-zero) or now; otherwise the existing
/// transition time is kept while reason, message and observedGeneration are
/// updated.
pub fn set_condition(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    set_condition_at(conditions, new, now_seconds())
}

/// [`set_condition`] with an explicit "now" (for tests).
pub fn set_condition_at(
    conditions: &mut Vec<Condition>,
    mut new: Condition,
    now: Timestamp,
) -> bool {
    let transition = if is_zero(&new.last_transition_time) {
        Time(now)
    } else {
        new.last_transition_time.clone()
    };
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        new.last_transition_time = transition;
        conditions.push(new);
        return true;
    };
    let mut changed = false;
    if existing.status != new.status {
        existing.status = new.status;
        existing.last_transition_time = transition;
        changed = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason;
        changed = true;
    }
    if existing.message != new.message {
        existing.message = new.message;
        changed = true;
    }
    if existing.observed_generation != new.observed_generation {
        existing.observed_generation = new.observed_generation;
        changed = true;
    }
    changed
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Removes the condition of `type_`; reports whether it was present.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

/// Whether the condition of `type_` is present with status `"True"`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

fn is_zero(t: &Time) -> bool {
    t.0 == Timestamp::UNIX_EPOCH
}

/// Now, truncated to whole seconds as Kubernetes serializes `metav1.Time`,
/// so that a written and re-read condition compares equal.
fn now_seconds() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

// The shared semantics (transition times, observedGeneration, remove) are cases of
// tests/conformance/helpers.json, run by `crate::shared_cases`; these are Rust's own.
#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn explicit_transition_time_is_used() {
        let mut cs = vec![];
        let mut c = condition("Ready", false, "No", "", None);
        c.last_transition_time = Time(at(42));
        set_condition_at(&mut cs, c, at(100));
        assert_eq!(cs[0].last_transition_time, Time(at(42)));
    }

    #[test]
    fn find_remove_is_true() {
        let mut cs = vec![];
        set_condition(&mut cs, condition("Ready", true, "Ok", "", None));
        assert!(is_condition_true(&cs, "Ready"));
        assert!(!is_condition_true(&cs, "Degraded"));
        assert!(find_condition(&cs, "Ready").is_some());
        assert!(remove_condition(&mut cs, "Ready"));
        assert!(!remove_condition(&mut cs, "Ready"));
        assert!(cs.is_empty());
    }
}
