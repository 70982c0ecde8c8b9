//! Ring members for the ring rows: real `ctrlhub run --mode ring` managers beside the world's
//! leader-mode ones (their own Leases, so neither disturbs the other), and which member owns a
//! controller, by the manager's own function. The test binary hands that function in
//! ([`OwnerFn`]): the harness library does not link the manager.

use serde_json::{Value, json};
use std::time::Instant;

use super::Failure;
use crate::manager::Manager;
use crate::wait::{PATIENCE, POLL_INTERVAL, TimedOut};

/// `ctrlhub::members::hrw::owner` for ring `ctrlhub` and weights 100: the identity among
/// `members` that owns controller `name` of tenant group `group` (None when `members` is empty).
pub type OwnerFn = fn(group: &str, name: &str, members: &[String]) -> Option<String>;

/// The tenant group of the conformance controllers: every ServiceAccount of their namespace
/// counts as one tenant (the manager's default grouping), and the group keys the ring's units.
pub const TENANT_GROUP: &str = "system:serviceaccounts:conformance";

/// The ring members' flags besides the world's: ring mode, and a short handover drain so a
/// move with nothing in flight takes well under a second more than the join.
pub const MEMBER_ARGS: [&str; 4] = ["--mode", "ring", "--handover-drain", "2s"];

/// The ring members of one SDK run and the function that places controllers on them.
pub struct Ring {
    owner: OwnerFn,
    /// The members running now, in the order they started.
    pub members: Vec<Manager>,
}

impl Ring {
    /// No members yet.
    pub fn new(owner: OwnerFn) -> Ring {
        Ring {
            owner,
            members: Vec::new(),
        }
    }

    /// The identity among `members` that owns controller `name`.
    pub fn owner_of(&self, name: &str, members: &[String]) -> Result<String, Failure> {
        (self.owner)(TENANT_GROUP, name, members)
            .ok_or_else(|| Failure::Setup(format!("no owner of {name} among {members:?}")))
    }

    /// The identities of the running members.
    pub fn identities(&self) -> Vec<String> {
        self.members.iter().map(|m| m.identity.clone()).collect()
    }

    /// The running member `identity`.
    pub fn member(&self, identity: &str) -> Result<&Manager, Failure> {
        self.members
            .iter()
            .find(|m| m.identity == identity)
            .ok_or_else(|| Failure::Setup(format!("no running ring member {identity}")))
    }

    /// `host:port` of member `identity`'s gRPC port: its `--member-address`, the address a
    /// redirect names.
    pub fn address(&self, identity: &str) -> Result<String, Failure> {
        Ok(address(self.member(identity)?))
    }

    /// Waits until every running member holds its Lease and has published a view naming
    /// exactly the running members: from then on they agree on every owner.
    pub async fn settled(&self) -> Result<(), Failure> {
        let mut want: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=100", m.identity))
            .collect();
        want.sort();
        let want = json!(want.join(","));
        for m in &self.members {
            let deadline = Instant::now() + PATIENCE;
            loop {
                let ring = m.try_status().await.map(|s| s["ring"].clone());
                let done = ring.as_ref().is_ok_and(|r| {
                    r["held"] == json!(true) && r["view"] == want && r["published"] == want
                });
                if done {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(TimedOut {
                        what: format!("{} to publish the view {want}", m.identity),
                        timeout: PATIENCE,
                        last: format!("{ring:?}"),
                    }
                    .into());
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
        Ok(())
    }

    /// Member `identity`'s `/status` entry of controller `name` (None when it lists none).
    pub async fn controller(&self, identity: &str, name: &str) -> Result<Option<Value>, Failure> {
        let status = self.member(identity)?.try_status().await?;
        Ok(status["controllers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == json!(name)))
            .cloned())
    }
}

/// `host:port` of `m`'s gRPC port.
pub fn address(m: &Manager) -> String {
    m.grpc.trim_start_matches("http://").to_string()
}
