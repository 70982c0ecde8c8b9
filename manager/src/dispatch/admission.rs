//! The admission task of a gated selector scope: asks the scope's gate (an RBAC check) about
//! each namespace that starts matching, admits it when allowed, and asks again about a denied
//! one later, so a RoleBinding created afterwards admits it. A denial is invisible to the
//! tenant: a denied namespace and one that does not exist both simply deliver nothing.
//!
//! Owns: the task and its [`RetrySchedule`]. May call `dispatch::scope` (what it admits into)
//! and `tenancy` (the gate); what an admitted namespace delivers is the caller's `entered`.

use crate::dispatch::scope::Scope;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// When each denied namespace is asked about again: at most one entry per namespace, earliest
/// first. Plain data with the time passed in, so it is tested without a runtime.
#[derive(Debug, Default)]
pub(crate) struct RetrySchedule {
    due: BTreeSet<(Instant, String)>,
    at: HashMap<String, Instant>,
}

impl RetrySchedule {
    /// Ask about `namespace` again at `when` (replacing an earlier plan for it).
    pub(crate) fn schedule(&mut self, namespace: String, when: Instant) {
        if let Some(old) = self.at.insert(namespace.clone(), when) {
            self.due.remove(&(old, namespace.clone()));
        }
        self.due.insert((when, namespace));
    }

    /// The earliest planned re-check.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|(when, _)| *when)
    }

    /// One namespace whose re-check is due at `now`, if any.
    pub(crate) fn take_due(&mut self, now: Instant) -> Option<String> {
        let first = self.due.first().filter(|(when, _)| *when <= now)?.clone();
        self.due.remove(&first);
        self.at.remove(&first.1);
        Some(first.1)
    }

    /// How many re-checks are planned.
    pub(crate) fn len(&self) -> usize {
        self.due.len()
    }
}

/// What the admission task of one controller's scope works with.
pub(crate) struct Admission {
    /// The scope namespaces are admitted into (it holds the gate).
    pub scope: Scope,
    /// Namespaces that started matching, in the order they did.
    pub matched: mpsc::UnboundedReceiver<String>,
    /// The manager stopping, or the controller going away.
    pub stop: [CancellationToken; 2],
    /// For logs: the controller.
    pub controller: String,
}

/// Runs the admission of one gated scope until it is stopped or nothing can send to it any
/// more; `entered` delivers the objects of a namespace that just entered (false: the
/// controller is gone, and the task ends).
pub(crate) async fn run(mut a: Admission, entered: impl Fn(&str) -> bool) {
    let Some(gate) = a.scope.gate().cloned() else {
        return;
    };
    let mut retry = RetrySchedule::default();
    while let Some(namespace) = next(&mut a, &mut retry).await {
        if !a.scope.is_matching(&namespace) {
            continue;
        }
        let decision = tokio::select! {
            _ = stopped(&a.stop) => return,
            d = gate.admit(&namespace) => d,
        };
        let controller = &a.controller;
        match decision {
            Ok(true) => {
                if a.scope.admit(&namespace) {
                    tracing::debug!(%controller, %namespace, "namespace admitted into the selector scope");
                    if !entered(&namespace) {
                        return;
                    }
                }
            }
            Ok(false) => {
                tracing::debug!(%controller, %namespace, "namespace matches the selector but access is denied; asking again later");
                retry.schedule(namespace, Instant::now() + gate.retry_after());
            }
            Err(e) => {
                tracing::warn!(%controller, %namespace, error = %e, "cannot check access to a namespace entering the selector scope; asking again later");
                retry.schedule(namespace, Instant::now() + gate.retry_after());
            }
        }
        tracing::trace!(%controller, waiting = retry.len(), "namespace admissions pending a re-check");
    }
}

/// The next namespace to ask about: a due re-check, else the next one to match, else wait for
/// the earliest re-check. None when stopped.
async fn next(a: &mut Admission, retry: &mut RetrySchedule) -> Option<String> {
    loop {
        if let Some(namespace) = retry.take_due(Instant::now()) {
            return Some(namespace);
        }
        let wake = retry.next_due();
        tokio::select! {
            _ = stopped(&a.stop) => return None,
            got = a.matched.recv() => return got,
            _ = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// Either token cancelled.
async fn stopped(stop: &[CancellationToken; 2]) {
    tokio::select! {
        _ = stop[0].cancelled() => {}
        _ = stop[1].cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_come_due_in_order_once_per_namespace() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut r = RetrySchedule::default();
        assert_eq!(r.take_due(t0), None);
        r.schedule("b".into(), t0 + 2 * s);
        r.schedule("a".into(), t0 + s);
        r.schedule("b".into(), t0 + 3 * s);
        assert_eq!(r.len(), 2, "one plan per namespace");
        assert_eq!(r.next_due(), Some(t0 + s));
        assert_eq!(r.take_due(t0), None, "nothing before its time");
        assert_eq!(r.take_due(t0 + 2 * s).as_deref(), Some("a"));
        assert_eq!(r.take_due(t0 + 2 * s), None, "b was moved to 3 s");
        assert_eq!(r.take_due(t0 + 3 * s).as_deref(), Some("b"));
        assert_eq!(r.next_due(), None);
    }
}
