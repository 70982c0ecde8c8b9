//! Tenant policies: per-tenant limits and weights from `TenantPolicy` objects
//! (`ctrlhub.io/v1alpha1`, cluster-scoped), applied without a restart over the defaults the
//! flags give (`--max-*`, `--tenant-limit`, `--tenant-weight`).
//!
//! A policy names one tenant and sets any of its limits (spelled as `--tenant-limit` spells
//! them) and its weight:
//!
//! ```yaml
//! apiVersion: ctrlhub.io/v1alpha1
//! kind: TenantPolicy
//! metadata: {name: team-a}
//! spec:
//!   tenant: system:serviceaccounts:team-a
//!   weight: 4
//!   limits: {sessions: 16, queued-keys: 50000, max-deadline: 1h}
//! ```
//!
//! A policy is taken whole or not at all. One that cannot be read keeps the generation last
//! taken from it in force (a typo never resets a tenant to the defaults), and says why on its
//! status (`Accepted` False, reason `Invalid`) and in the manager's log. Two policies naming one
//! tenant: the first by name is taken, the other is refused (reason `Conflict`). Cluster-scoped
//! because a tenant must not set its own limits: only who may write `tenantpolicies` can.
//!
//! Owns: reading policies into limits and weights ([`compile`], pure) and keeping them applied
//! ([`watch`]). May call: tenancy (limits, grouping), dispatch (the controller table and the
//! seat pool, to apply them), the Kubernetes client.

pub(crate) mod watch;

use crate::dispatch::seats::Weights;
use crate::tenancy::{Limits, TenantGrouping, TenantLimits, set_limit};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// The API group of `TenantPolicy`.
pub(crate) const GROUP: &str = "ctrlhub.io";
/// The served version of `TenantPolicy`.
pub(crate) const VERSION: &str = "v1alpha1";
/// The kind.
pub(crate) const KIND: &str = "TenantPolicy";
/// The resource (plural).
pub(crate) const PLURAL: &str = "tenantpolicies";

/// One `TenantPolicy` as the API server holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Policy {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.generation`: which spec a verdict is about.
    pub generation: i64,
    /// `spec`, as written.
    pub spec: Value,
}

/// What became of one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Taken: its tenant's limits and weight are the policy's.
    Accepted {
        /// The tenant it governs.
        tenant: String,
    },
    /// It could not be read; the generation last taken from it, if any, stays in force.
    Invalid {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Another policy, first by name, already governs its tenant.
    Conflict {
        /// Which one.
        message: String,
    },
}

impl Verdict {
    /// The `Accepted` condition's status, reason and message.
    pub(crate) fn condition(&self) -> (&'static str, &'static str, String) {
        match self {
            Verdict::Accepted { tenant } => (
                "True",
                "Accepted",
                format!("limits and weight of tenant {tenant} are this policy's"),
            ),
            Verdict::Invalid { message } => ("False", "Invalid", message.clone()),
            Verdict::Conflict { message } => ("False", "Conflict", message.clone()),
        }
    }
}

/// What policies are applied over: the flags' limits and weights, and how tenants are named.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    /// Defaults and `--tenant-limit` overrides.
    pub limits: TenantLimits,
    /// Default and `--tenant-weight` overrides.
    pub weights: Weights,
    /// Tenants are namespaces or identities (`--tenant-grouping`).
    pub grouping: TenantGrouping,
}

/// Policies read into what the manager applies.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    /// Every tenant's limits.
    pub limits: TenantLimits,
    /// Every tenant's weight.
    pub weights: Weights,
    /// What became of each policy, by name.
    pub verdicts: BTreeMap<String, Verdict>,
    /// The policies taken (or kept in force), by name: what to fall back on when one of them
    /// is next changed into something unreadable.
    pub in_force: BTreeMap<String, Policy>,
}

/// A policy read: its tenant, weight and that tenant's limits with the policy's applied.
struct Read {
    tenant: String,
    weight: Option<u32>,
    limits: Limits,
}

/// Reads `policies` over `base`. `in_force` is what [`Compiled::in_force`] said last time: a
/// policy that cannot be read now falls back on it. Pure; O(policies).
pub(crate) fn compile(
    policies: &[Policy],
    in_force: &BTreeMap<String, Policy>,
    base: &Base,
) -> Compiled {
    let mut sorted: Vec<&Policy> = policies.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = Compiled {
        limits: base.limits.clone(),
        weights: base.weights.clone(),
        verdicts: BTreeMap::new(),
        in_force: BTreeMap::new(),
    };
    let mut governed: HashMap<String, String> = HashMap::new();
    for policy in sorted {
        let (taken, verdict) = match read(policy, base) {
            Ok(read) => (Some((policy, read)), None),
            Err(message) => {
                let kept = in_force
                    .get(&policy.name)
                    .and_then(|old| read(old, base).ok().map(|r| (old, r)));
                let message = match &kept {
                    Some((old, _)) => format!(
                        "{message}; generation {} stays in force until this is fixed",
                        old.generation
                    ),
                    None => format!("{message}; the flags' limits apply to its tenant"),
                };
                (kept, Some(Verdict::Invalid { message }))
            }
        };
        let Some((source, read)) = taken else {
            out.verdicts
                .insert(policy.name.clone(), verdict.unwrap_or(invalid()));
            continue;
        };
        if let Some(first) = governed.get(&read.tenant) {
            let message = format!(
                "tenant {} is already governed by TenantPolicy {first} (the first by name); merge the two or delete one",
                read.tenant
            );
            out.verdicts
                .insert(policy.name.clone(), Verdict::Conflict { message });
            continue;
        }
        governed.insert(read.tenant.clone(), policy.name.clone());
        out.limits = out.limits.with_tenant(&read.tenant, read.limits);
        if let Some(weight) = read.weight {
            out.weights = out.weights.with(&read.tenant, weight);
        }
        out.in_force.insert(policy.name.clone(), source.clone());
        let verdict = verdict.unwrap_or(Verdict::Accepted {
            tenant: read.tenant,
        });
        out.verdicts.insert(policy.name.clone(), verdict);
    }
    out
}

fn invalid() -> Verdict {
    Verdict::Invalid {
        message: "unreadable".into(),
    }
}

/// The fields a policy's spec may have.
const FIELDS: [&str; 3] = ["tenant", "weight", "limits"];

/// Reads one policy, or says what is wrong with it.
fn read(policy: &Policy, base: &Base) -> Result<Read, String> {
    let spec = policy
        .spec
        .as_object()
        .ok_or("spec must be an object with tenant, and weight or limits")?;
    if let Some(unknown) = spec.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "spec.{unknown} is not a field ({})",
            FIELDS.join(", ")
        ));
    }
    let tenant = spec
        .get("tenant")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or("spec.tenant is required: the tenant's name as metrics and the status page show it (e.g. system:serviceaccounts:team-a)")?;
    base.grouping.check_configured(tenant, "spec.tenant")?;
    let weight = match spec.get("weight") {
        None | Some(Value::Null) => None,
        Some(w) => Some(
            w.as_u64()
                .and_then(|w| u32::try_from(w).ok())
                .filter(|w| (1..=1000).contains(w))
                .ok_or("spec.weight must be a whole number from 1 to 1000")?,
        ),
    };
    let mut limits = base.limits.for_tenant(tenant);
    if let Some(given) = spec.get("limits").filter(|l| !l.is_null()) {
        let given = given
            .as_object()
            .ok_or("spec.limits must be a map of limit names to values")?;
        for (name, value) in given {
            let value = match value {
                Value::String(s) => s.trim().to_string(),
                Value::Number(n) => n.to_string(),
                _ => return Err(format!("spec.limits.{name} must be a number or a string")),
            };
            set_limit(&mut limits, name, &value).map_err(|why| {
                format!("spec.limits.{name}: {why} (limits: sessions, controllers, queued-keys, in-flight, informers, cached-bytes, queued-bytes, registrations-per-second, min-deadline, max-deadline, min-resync)")
            })?;
        }
    }
    if limits.min_deadline > limits.max_deadline {
        return Err(format!(
            "min-deadline ({}) is longer than max-deadline ({})",
            humantime::format_duration(limits.min_deadline),
            humantime::format_duration(limits.max_deadline)
        ));
    }
    Ok(Read {
        tenant: tenant.to_string(),
        weight,
        limits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Base {
        Base {
            limits: TenantLimits::new(Limits::default()),
            weights: Weights::default(),
            grouping: TenantGrouping::Namespace,
        }
    }

    fn policy(name: &str, generation: i64, spec: Value) -> Policy {
        Policy {
            name: name.into(),
            generation,
            spec,
        }
    }

    const A: &str = "system:serviceaccounts:team-a";

    #[test]
    fn a_policy_sets_its_tenants_limits_and_weight_and_no_one_elses() {
        let p = policy(
            "a",
            1,
            json!({"tenant": A, "weight": 4, "limits": {"sessions": 3, "max-deadline": "1h", "queued-keys": "500"}}),
        );
        let c = compile(&[p], &BTreeMap::new(), &base());
        let a = c.limits.for_tenant(A);
        assert_eq!((a.sessions, a.queued_keys), (3, 500));
        assert_eq!(a.max_deadline, std::time::Duration::from_secs(3600));
        assert_eq!(a.controllers, Limits::default().controllers);
        assert_eq!(c.weights.of(A), 4);
        assert_eq!(c.weights.of("system:serviceaccounts:team-b"), 1);
        assert_eq!(
            c.limits.for_tenant("system:serviceaccounts:team-b"),
            Limits::default()
        );
        assert_eq!(c.verdicts["a"], Verdict::Accepted { tenant: A.into() });
    }

    #[test]
    fn an_unreadable_change_keeps_the_generation_in_force() {
        let good = policy("a", 1, json!({"tenant": A, "limits": {"sessions": 3}}));
        let first = compile(std::slice::from_ref(&good), &BTreeMap::new(), &base());
        let typo = policy("a", 2, json!({"tenant": A, "limits": {"sesions": 9}}));
        let second = compile(&[typo], &first.in_force, &base());
        assert_eq!(second.limits.for_tenant(A).sessions, 3, "generation 1 kept");
        let Verdict::Invalid { message } = &second.verdicts["a"] else {
            panic!("{:?}", second.verdicts["a"]);
        };
        assert!(
            message.contains("spec.limits.sesions: unknown limit"),
            "{message}"
        );
        assert!(message.contains("generation 1 stays in force"), "{message}");
        assert_eq!(second.in_force["a"].generation, 1);
    }

    #[test]
    fn an_unreadable_new_policy_leaves_the_flags_limits() {
        let cases = [
            (
                json!({"limits": {"sessions": 3}}),
                "spec.tenant is required",
            ),
            (json!({"tenant": A, "weight": 0}), "spec.weight"),
            (
                json!({"tenant": A, "limits": {"max-deadline": "soon"}}),
                "not a duration",
            ),
            (
                json!({"tenant": A, "limits": {"sessions": -1}}),
                "whole number",
            ),
            (
                json!({"tenant": A, "limit": {}}),
                "spec.limit is not a field",
            ),
            (
                json!({"tenant": A, "limits": {"min-deadline": "2h", "max-deadline": "1h"}}),
                "longer than max-deadline",
            ),
            (
                json!({"tenant": "system:serviceaccount:team-a:ctl"}),
                "use system:serviceaccounts:team-a",
            ),
        ];
        for (spec, says) in cases {
            let c = compile(&[policy("a", 1, spec.clone())], &BTreeMap::new(), &base());
            let Verdict::Invalid { message } = &c.verdicts["a"] else {
                panic!("{spec}: {:?}", c.verdicts["a"]);
            };
            assert!(message.contains(says), "{spec}: {message}");
            assert!(message.contains("the flags' limits apply"), "{message}");
            assert_eq!(c.limits.for_tenant(A), Limits::default(), "{spec}");
            assert!(c.in_force.is_empty());
        }
    }

    #[test]
    fn two_policies_for_one_tenant_the_first_by_name_wins() {
        let b = policy("b", 1, json!({"tenant": A, "limits": {"sessions": 9}}));
        let a = policy("a", 1, json!({"tenant": A, "limits": {"sessions": 3}}));
        let c = compile(&[b, a], &BTreeMap::new(), &base());
        assert_eq!(c.limits.for_tenant(A).sessions, 3);
        assert!(matches!(c.verdicts["b"], Verdict::Conflict { .. }));
        assert!(matches!(c.verdicts["a"], Verdict::Accepted { .. }));
    }

    #[test]
    fn a_deleted_policy_gives_its_tenant_back_to_the_flags() {
        let base = Base {
            limits: TenantLimits::new(Limits::default())
                .with_overrides([&*format!("{A}/sessions=7")])
                .expect("valid"),
            ..base()
        };
        let p = policy("a", 1, json!({"tenant": A, "limits": {"sessions": 3}}));
        let first = compile(&[p], &BTreeMap::new(), &base);
        assert_eq!(first.limits.for_tenant(A).sessions, 3);
        let gone = compile(&[], &first.in_force, &base);
        assert_eq!(gone.limits.for_tenant(A).sessions, 7, "the flag's override");
    }
}
