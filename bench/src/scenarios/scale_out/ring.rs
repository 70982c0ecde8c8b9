//! The ring as the harness sees it: members started with the bench's fast leases, who owns what
//! by `/status` and by the manager's own assignment function, settling, per-member CPU and
//! reconcile counters, and the API server's Lease requests.

use crate::env::{Cluster, FAST_LEASE, Manager};
use anyhow::Result;
use ctrlhub::members::hrw::{Member, Unit, owner};
use ctrlhub_tests::{PATIENCE, poll_until};
use std::collections::{BTreeMap, BTreeSet};

/// The lease the members run with (FAST_LEASE).
pub const LEASE: std::time::Duration = std::time::Duration::from_secs(3);
/// The tenant group of the static token `dev` every replica registers with.
pub const TENANT: &str = "dev";
/// The weight every member runs with (the default).
const WEIGHT: u32 = 100;

/// Starts a ring member `identity` of ring `ring` with the fast leases and a 2 s handover drain.
pub async fn member(c: &Cluster, identity: &str, ring: &str) -> Result<Manager> {
    let mut args = vec![
        "--mode",
        "ring",
        "--ring-name",
        ring,
        "--handover-drain",
        "2s",
    ];
    args.extend(FAST_LEASE);
    Manager::start(c, identity, &args).await
}

/// A member's gRPC address as the ring publishes it (host:port).
pub fn addr(m: &Manager) -> String {
    m.grpc.trim_start_matches("http://").to_string()
}

/// Controller name → owning member's identity over `members`, by the manager's function.
pub fn expected(ring: &str, names: &[String], members: &[&Manager]) -> BTreeMap<String, String> {
    let ms: Vec<Member> = members
        .iter()
        .map(|m| Member {
            identity: m.identity.clone(),
            weight: WEIGHT,
        })
        .collect();
    names
        .iter()
        .map(|n| {
            let who = owner(ring, &Unit::new(TENANT, n), &ms)
                .map(|m| m.identity.clone())
                .unwrap_or_default();
            (n.clone(), who)
        })
        .collect()
}

/// Waits until every member holds its Lease and has published a view naming exactly `members`.
pub async fn settled(members: &[&Manager]) -> Result<()> {
    let mut ids: Vec<String> = members
        .iter()
        .map(|m| format!("{}={WEIGHT}", m.identity))
        .collect();
    ids.sort();
    let want = ids.join(",");
    for m in members {
        let what = format!("{} to publish view {want}", m.identity);
        poll_until(&what, PATIENCE, || async {
            let s = m.status().await;
            let r = &s["ring"];
            if r["held"] == true && r["view"] == want.as_str() && r["published"] == want.as_str() {
                Ok(())
            } else {
                Err(format!("view {} published {}", r["view"], r["published"]))
            }
        })
        .await?;
    }
    Ok(())
}

/// Controller name → identity of the member whose `/status` lists it `owned`, among `names`.
pub async fn owners(members: &[&Manager], names: &[String]) -> BTreeMap<String, String> {
    let wanted: BTreeSet<&String> = names.iter().collect();
    let mut out = BTreeMap::new();
    for m in members {
        let s = m.status().await;
        for u in s["ring"]["units"].as_array().into_iter().flatten() {
            if u["state"] != "owned" || u["tenant"] != TENANT {
                continue;
            }
            if let Some(name) = u["name"].as_str().map(str::to_string)
                && wanted.contains(&name)
            {
                out.insert(name, m.identity.clone());
            }
        }
    }
    out
}

/// Waits until `/status` shows every controller of `want` owned by the member it names.
pub async fn wait_owned(members: &[&Manager], want: &BTreeMap<String, String>) -> Result<()> {
    let names: Vec<String> = want.keys().cloned().collect();
    poll_until(
        "every controller owned where HRW says",
        PATIENCE,
        || async {
            let got = owners(members, &names).await;
            let wrong = want.iter().filter(|(n, m)| got.get(*n) != Some(m)).count();
            if wrong == 0 {
                Ok(())
            } else {
                Err(format!("{wrong} of {} elsewhere or not owned", want.len()))
            }
        },
    )
    .await?;
    Ok(())
}

/// The sum of every series of metric family `name` in the exposition `text`.
pub fn family_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A member's (process CPU seconds, reconciles) counters now.
pub async fn counters(m: &Manager) -> Result<(f64, f64)> {
    let text = m.try_metrics().await?;
    Ok((
        family_sum(&text, "process_cpu_seconds_total"),
        family_sum(&text, "controller_runtime_reconcile_total"),
    ))
}

/// Lease requests devcluster has served: (writes: create, update, patch; reads: get, list).
pub fn lease_requests(c: &Cluster) -> (u64, u64) {
    let s = c.dc.stats();
    let n = |verb: &str| s.request_count(verb, "leases");
    (n("create") + n("update") + n("patch"), n("get") + n("list"))
}

/// The mean JSON size of ring `ring`'s member Leases as served (what each list returns per
/// member), in bytes.
pub async fn lease_bytes(c: &Cluster, ring: &str) -> Result<usize> {
    use k8s_openapi::api::coordination::v1::Lease;
    let api: kube::Api<Lease> = kube::Api::all(c.client.clone());
    let selector = format!("ctrlhub.io/ring={ring}");
    let list = api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    let sizes: Vec<usize> = list
        .items
        .iter()
        .map(|l| serde_json::to_vec(l).map(|v| v.len()).unwrap_or(0))
        .collect();
    Ok(sizes.iter().sum::<usize>() / sizes.len().max(1))
}

/// Seconds of the latest `out` move of `name` in a member's `/status` (its seal time).
pub fn seal_seconds(status: &serde_json::Value, name: &str) -> Option<f64> {
    status["ring"]["moves"]
        .as_array()?
        .iter()
        .rev()
        .find(|m| m["name"] == name && m["direction"] == "out")
        .and_then(|m| m["seconds"].as_f64())
}

#[cfg(test)]
mod tests {
    use super::family_sum;

    #[test]
    fn a_family_sums_over_its_labels_and_not_over_longer_names() {
        let text = "# HELP x\nprocess_cpu_seconds_total 1.5\n\
            controller_runtime_reconcile_total{controller=\"a\",result=\"success\",tenant=\"dev\"} 3\n\
            controller_runtime_reconcile_total{controller=\"b\",result=\"error\",tenant=\"dev\"} 4\n\
            controller_runtime_reconcile_total_extra 100\n";
        assert_eq!(family_sum(text, "controller_runtime_reconcile_total"), 7.0);
        assert_eq!(family_sum(text, "process_cpu_seconds_total"), 1.5);
        assert_eq!(family_sum(text, "missing"), 0.0);
    }
}
