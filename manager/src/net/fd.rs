//! The process' open-file limit. Many container runtimes start processes with a soft limit of
//! 1024 and a far higher hard limit: the manager raises the soft limit to the hard one at start
//! (as Go's runtime does since 1.19) and sizes its connection caps below it, so a flood of
//! connections is refused by a cap before `accept` ever sees EMFILE.

/// The open-file limit before and after raising it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FdLimit {
    /// The soft limit the process started with.
    pub started: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; on failure, says why (the manager then
/// runs with the limit it has).
pub(crate) fn raise() -> std::io::Result<FdLimit> {
    let (started, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    let soft = rlimit::increase_nofile_limit(hard)?;
    Ok(FdLimit {
        started,
        soft,
        hard,
    })
}

/// Descriptors always kept out of the connection budget: the runtime, listeners, log files,
/// the API server connections of informers, reviews and leader election.
const RESERVED: u64 = 128;

/// How many connections the two ports may hold together under a soft limit of `soft`, at most
/// `wanted` (the `--max-connections` flag): the limit less [`RESERVED`] and an eighth more for
/// what grows with tenants (informers' watches), never less than 16.
pub(crate) fn connection_budget(soft: u64, wanted: usize) -> usize {
    let usable = soft.saturating_sub(RESERVED + soft / 8);
    usize::try_from(usable)
        .unwrap_or(usize::MAX)
        .min(wanted)
        .max(16)
}

/// How the budget is split: the HTTP port (probes, metrics, people) gets its own quarter, at
/// most 256, so a flood of the gRPC port can never take the kubelet's probes with it; the gRPC
/// port gets the rest.
pub(crate) fn split(budget: usize) -> (usize, usize) {
    let http = (budget / 4).clamp(4, 256);
    (budget.saturating_sub(http).max(4), http)
}

/// The per-peer cap actually applied under a port total of `total`: the flag, but never more
/// than a quarter of the port, so one address can never fill it.
pub(crate) fn per_peer(total: usize, wanted: usize) -> usize {
    wanted.min((total / 4).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_stays_below_the_limit_with_room_to_spare() {
        assert_eq!(
            connection_budget(1_048_576, 4096),
            4096,
            "the flag caps a large limit"
        );
        let at_1024 = connection_budget(1024, 4096);
        assert!(at_1024 <= 1024 - 128 - 128, "{at_1024}");
        assert!(at_1024 >= 512, "{at_1024}");
        let at_256 = connection_budget(256, 4096);
        assert!(at_256 < 256 / 2, "{at_256}");
        assert_eq!(connection_budget(100, 4096), 16, "never nothing");
    }

    #[test]
    fn the_http_port_keeps_its_own_share_and_one_peer_at_most_a_quarter() {
        let (grpc, http) = split(connection_budget(256, 4096));
        assert!(http >= 4 && grpc >= 4, "{grpc} {http}");
        assert_eq!(split(4096), (3840, 256));
        assert_eq!(per_peer(3840, 128), 128);
        assert_eq!(per_peer(72, 128), 18);
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let limit = raise().expect("getrlimit works here");
        assert!(limit.soft >= limit.started);
        assert!(limit.soft <= limit.hard);
    }
}
