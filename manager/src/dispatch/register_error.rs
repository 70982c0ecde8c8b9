//! Why a registration was refused by the controller table: a field, the namespace ceiling, a
//! tenant limit, a name or revision another replica holds, or the manager closing. The gRPC
//! edge turns each into its status code (`grpc/convert.rs`).

use crate::registration::Invalid;

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    /// A field is wrong.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// Outside the manager's namespace ceiling (`--watch-namespace`).
    #[error("{0}")]
    OutsideCeiling(String),
    /// A tenant limit is reached (RESOURCE_EXHAUSTED).
    #[error("tenant {tenant} is at its {limit} limit of {max}: {hint}")]
    Limit {
        /// The tenant.
        tenant: String,
        /// Which limit.
        limit: &'static str,
        /// Its value.
        max: u64,
        /// What to do about it.
        hint: &'static str,
    },
    /// Another identity of the same tenant already runs a controller of this name
    /// (ALREADY_EXISTS): series and pages name a controller by tenant and name, so the name
    /// must be unique within the tenant.
    #[error(
        "controller {name:?} is already registered by {owner}, another identity of your tenant {tenant}: choose another name"
    )]
    NameTaken {
        /// The name.
        name: String,
        /// The identity that holds it.
        owner: String,
        /// The tenant both belong to.
        tenant: String,
    },
    /// Another definition of this controller runs under a higher or equal revision
    /// (FAILED_PRECONDITION, `Rejected.outdated`): the replica waits instead of superseding it.
    #[error(
        "controller {name:?} runs another definition at revision {running} (this replica: revision {asked}; {what}): {hint}"
    )]
    Outdated {
        /// The controller.
        name: String,
        /// The running definition's revision.
        running: u64,
        /// This replica's revision.
        asked: u64,
        /// Which fields differ.
        what: String,
        /// What to do.
        hint: &'static str,
    },
    /// The manager is shutting down (UNAVAILABLE): the controller should reconnect to the next
    /// leader instead of attaching to a manager that is about to close.
    #[error(
        "this ctrlhub manager is shutting down; reconnect (through the Service) to the next leader"
    )]
    ShuttingDown,
}
