//! The SDK conformance suite: one table of guarantees, checked the same way for every SDK's
//! conformance controller, run as a real process against real managers and a real devcluster.
//! `tests/conformance/README.md` is the interface a controller implements and the table of
//! checks; this module is the harness:
//!
//! - [`interface`]: the controller's environment, the ConfigMap directives, its report lines;
//! - [`sdk`]: the SDK table (`tests/conformance/sdks.json`) and each SDK's command line;
//! - [`world`]: one SDK run's devcluster, managers, leader-routing proxy and controller processes;
//! - [`proxy`]: the TCP proxy that plays the Service selecting the leader, and counts connections;
//! - [`ring`]: ring members for the ring rows, and the manager's placement function;
//! - [`service`]: the TCP proxy that plays the Service spreading connections over ring members;
//! - [`fake_member`]: two fake ring members redirecting to each other for ever;
//! - [`otlp`]: a trace receiver, so the managers (and SDKs) trace for real;
//! - [`checks`]: the checks, one or more rows each;
//! - [`matrix`]: results per SDK as JSON, and the README's matrix rendered from them;
//! - [`run`]: runs every check for one SDK.

pub mod checks;
pub mod fake_member;
pub mod interface;
pub mod matrix;
pub mod otlp;
pub mod proxy;
pub mod ring;
pub mod run;
pub mod sdk;
pub mod service;
pub mod world;

use crate::wait::TimedOut;

/// Why a check is red.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The controller (its SDK) or the manager did something the contract rules out.
    #[error("{0}")]
    Violation(String),
    /// Something the contract promises did not happen in time.
    #[error(transparent)]
    TimedOut(#[from] TimedOut),
    /// The harness could not set the check up (cluster, manager, process, files).
    #[error("setup failed: {0}")]
    Setup(String),
}

impl Failure {
    /// A short, stable name of the kind of failure, for the results file.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Violation(_) => "violation",
            Failure::TimedOut(_) => "timed_out",
            Failure::Setup(_) => "setup",
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Setup(format!("{e:#}"))
    }
}

/// `Ok` when `holds`, else a [`Failure::Violation`] with the message `why` makes.
pub fn require(holds: bool, why: impl FnOnce() -> String) -> Result<(), Failure> {
    if holds {
        Ok(())
    } else {
        Err(Failure::Violation(why()))
    }
}
