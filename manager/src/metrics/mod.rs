//! Prometheus metrics with controller-runtime's names, types and labels, so existing
//! controller-runtime dashboards and alerts work unchanged, plus ctrlhub's own `ctrlhub_` series.
//! Labels are bounded (controller, tenant, resource); never an object name.
//!
//! The manager observes itself too: its Kubernetes API traffic ([`api`]), its gRPC server
//! ([`grpc`]), its authentication and authorization reviews ([`auth`]), leader transitions,
//! its build, and process metrics with fractional CPU seconds ([`process`]). Every counter and
//! histogram a dashboard or an alert reads exists at 0 as soon as its controller registers, so
//! an idle controller reads 0, not "No data".

pub(crate) mod api;
pub(crate) mod auth;
pub(crate) mod grpc;
pub(crate) mod process;
pub(crate) mod ring;

use prometheus::{
    Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::time::Duration;

/// controller-runtime's `controller_runtime_reconcile_time_seconds` buckets (5 ms to 60 s).
const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// client-go's workqueue duration buckets: 10 ns to 10^3 s, exponential by 10.
fn workqueue_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(10e-9, 10.0, 12)
        .unwrap_or_else(|_| vec![1e-8, 1e-6, 1e-3, 1.0, 10.0, 100.0])
}

/// The reconcile result label, as controller-runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResultLabel {
    /// Done.
    Success,
    /// Error or terminal error.
    Error,
    /// Requeue as soon as possible.
    Requeue,
    /// Requeue after a delay.
    RequeueAfter,
}

impl ResultLabel {
    const ALL: [ResultLabel; 4] = [
        ResultLabel::Success,
        ResultLabel::Error,
        ResultLabel::Requeue,
        ResultLabel::RequeueAfter,
    ];

    fn as_str(self) -> &'static str {
        match self {
            ResultLabel::Success => "success",
            ResultLabel::Error => "error",
            ResultLabel::Requeue => "requeue",
            ResultLabel::RequeueAfter => "requeue_after",
        }
    }
}

/// Every metric the manager exports.
pub(crate) struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    terminal_errors: IntCounterVec,
    reconcile_time: HistogramVec,
    /// `controller_runtime_max_concurrent_reconciles`.
    pub max_concurrent: IntGaugeVec,
    /// `controller_runtime_active_workers`.
    pub active_workers: IntGaugeVec,
    /// `workqueue_depth`.
    pub depth: IntGaugeVec,
    /// `workqueue_adds_total`.
    pub adds: IntCounterVec,
    queue_duration: HistogramVec,
    work_duration: HistogramVec,
    /// `workqueue_unfinished_work_seconds`.
    pub unfinished: GaugeVec,
    /// `workqueue_longest_running_processor_seconds`.
    pub longest: GaugeVec,
    /// `workqueue_retries_total`.
    pub retries: IntCounterVec,
    /// `leader_election_master_status`.
    pub leader: IntGaugeVec,
    /// `ctrlhub_sessions`.
    pub sessions: IntGaugeVec,
    /// `ctrlhub_queued_bytes`.
    pub queued_bytes: IntGaugeVec,
    /// `ctrlhub_informer_objects`.
    pub informer_objects: IntGaugeVec,
    /// `ctrlhub_informer_relists`.
    pub informer_relists: IntGaugeVec,
    /// `ctrlhub_informer_watch_restarts`.
    pub informer_watch_restarts: IntGaugeVec,
    /// `ctrlhub_informers`.
    pub informers: Gauge,
    /// `ctrlhub_dispatch_seats`.
    pub dispatch_seats: Gauge,
    /// `ctrlhub_dispatch_seats_in_use`.
    pub seats_in_use: IntGaugeVec,
    /// `ctrlhub_dispatch_waiting_controllers`.
    pub seats_waiting: IntGaugeVec,
    /// `ctrlhub_dispatch_seat_grants_total`.
    pub seat_grants: IntCounterVec,
    /// `ctrlhub_dispatch_seat_waits_total`.
    pub seat_waits: IntCounterVec,
    deadline_misses: IntCounterVec,
    discarded_results: IntCounterVec,
    dispatch_latency: HistogramVec,
    rejected: IntCounterVec,
    limit_hits: IntCounterVec,
    connections_open: IntGaugeVec,
    connections_refused: IntCounterVec,
    connections_closed: IntCounterVec,
    accept_failures: IntCounterVec,
    auth_throttled: IntCounterVec,
    leader_transitions: IntCounterVec,
    /// `rest_client_*`: the manager's own Kubernetes API requests.
    pub api: api::ApiClientMetrics,
    /// `grpc_server_*`: calls on the gRPC port.
    pub grpc: grpc::GrpcServerMetrics,
    /// `ctrlhub_auth_*`: TokenReview and SubjectAccessReview latency and cache hits.
    pub auth: auth::AuthMetrics,
    /// Ring mode's series.
    pub ring: ring::RingMetrics,
}

/// The labels of the per-informer gauges: one series per informer, so two informers on one
/// resource that differ by label selector or form (full objects or metadata) are not one series.
const INFORMER_LABELS: [&str; 5] = ["group", "resource", "namespace", "selector", "form"];

/// What `ctrlhub_build_info` reports: the release, the commit and the compiler it was built
/// from (set by `build.rs`; `unknown` when the build had no git checkout).
pub(crate) const BUILD: [(&str, &str); 3] = [
    ("version", env!("CARGO_PKG_VERSION")),
    ("revision", env!("CTRLHUB_COMMIT")),
    ("rustc", env!("CTRLHUB_RUSTC_VERSION")),
];

/// `ctrlhub_build_info` (always 1), so a dashboard can say which build each replica runs.
fn build_info(registry: &Registry) {
    let labels: Vec<&str> = BUILD.iter().map(|(k, _)| *k).collect();
    let values: Vec<&str> = BUILD.iter().map(|(_, v)| *v).collect();
    gauge(
        registry,
        "ctrlhub_build_info",
        "Always 1; the labels say which release (version), commit (revision) and compiler (rustc) built this manager",
        &labels,
    )
    .with_label_values(&values)
    .set(1);
}

/// Registers `metric` (built by the static definitions below) under `name`.
///
/// Panics only on a programming error in those definitions (an invalid name or a duplicate).
fn register<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    name: &str,
    metric: Result<M, prometheus::Error>,
) -> M {
    let m = metric.unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(m.clone()))
        .unwrap_or_else(|e| panic!("registering {name}: {e}"));
    m
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        name,
        IntCounterVec::new(Opts::new(name, help), labels),
    )
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        registry,
        name,
        IntGaugeVec::new(Opts::new(name, help), labels),
    )
}

fn fgauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    register(registry, name, GaugeVec::new(Opts::new(name, help), labels))
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(registry, name, HistogramVec::new(opts, labels))
}

/// A single unlabelled gauge.
fn plain_gauge(registry: &Registry, name: &str, help: &str) -> Gauge {
    register(registry, name, Gauge::new(name, help))
}

impl Metrics {
    /// All metrics registered in a fresh registry (with process metrics).
    ///
    /// A table of metric definitions (names, help and labels follow controller-runtime), so it is
    /// long by nature. Panics only on a programming error in those definitions.
    pub(crate) fn new() -> Self {
        let r = Registry::new();
        #[cfg(target_os = "linux")]
        if let Ok(process) = process::ProcessMetrics::for_self() {
            // Process metrics are best effort: a registry without them still serves.
            let _ = r.register(Box::new(process));
        }
        build_info(&r);
        let api = api::ApiClientMetrics::register(&r);
        api.preinitialise();
        let rejected = counter(
            &r,
            "ctrlhub_rejected_registrations_total",
            "Registrations refused, by tenant (`unauthenticated` before a token was accepted) and gRPC status code",
            &["tenant", "reason"],
        );
        // At 0 from the start: "no refusals" reads 0 on the dashboard, not "No data".
        rejected.with_label_values(&["unauthenticated", "Unauthenticated"]);
        let cr = ["controller", "tenant"];
        let wq = ["name", "tenant"];
        let informers = plain_gauge(
            &r,
            "ctrlhub_informers",
            "Informers running (one list/watch each).",
        );
        let dispatch_seats = plain_gauge(
            &r,
            "ctrlhub_dispatch_seats",
            "Requests the manager keeps in flight across all tenants (0 = unlimited).",
        );
        Metrics {
            reconcile_total: counter(
                &r,
                "controller_runtime_reconcile_total",
                "Total number of reconciliations per controller",
                &["controller", "tenant", "result"],
            ),
            reconcile_errors: counter(
                &r,
                "controller_runtime_reconcile_errors_total",
                "Total number of reconciliation errors per controller",
                &cr,
            ),
            terminal_errors: counter(
                &r,
                "controller_runtime_terminal_reconcile_errors_total",
                "Total number of terminal reconciliation errors per controller",
                &cr,
            ),
            reconcile_time: histogram(
                &r,
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller",
                &cr,
                RECONCILE_BUCKETS.to_vec(),
            ),
            max_concurrent: gauge(
                &r,
                "controller_runtime_max_concurrent_reconciles",
                "Maximum number of concurrent reconciles per controller",
                &cr,
            ),
            active_workers: gauge(
                &r,
                "controller_runtime_active_workers",
                "Number of currently used workers per controller",
                &cr,
            ),
            depth: gauge(&r, "workqueue_depth", "Current depth of workqueue", &wq),
            adds: counter(
                &r,
                "workqueue_adds_total",
                "Total number of adds handled by workqueue",
                &wq,
            ),
            queue_duration: histogram(
                &r,
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested",
                &wq,
                workqueue_buckets(),
            ),
            work_duration: histogram(
                &r,
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes",
                &wq,
                workqueue_buckets(),
            ),
            unfinished: fgauge(
                &r,
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
                &wq,
            ),
            longest: fgauge(
                &r,
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running",
                &wq,
            ),
            retries: counter(
                &r,
                "workqueue_retries_total",
                "Total number of retries handled by workqueue",
                &wq,
            ),
            leader: gauge(
                &r,
                "leader_election_master_status",
                "Gauge of if the reporter is master of the relevant lease, 0 indicates backup, 1 indicates master",
                &["name"],
            ),
            sessions: gauge(
                &r,
                "ctrlhub_sessions",
                "Connected controller sessions (replicas) per controller",
                &cr,
            ),
            queued_bytes: gauge(
                &r,
                "ctrlhub_queued_bytes",
                "Bytes of EVENTS-mode events and tombstones a controller holds waiting for delivery (counted against its tenant's queued-bytes limit)",
                &cr,
            ),
            informer_objects: gauge(
                &r,
                "ctrlhub_informer_objects",
                "Objects cached per informer",
                &INFORMER_LABELS,
            ),
            informer_relists: gauge(
                &r,
                "ctrlhub_informer_relists",
                "Lists performed by an informer since it started (1 = only the initial list)",
                &INFORMER_LABELS,
            ),
            informer_watch_restarts: gauge(
                &r,
                "ctrlhub_informer_watch_restarts",
                "List or watch requests of an informer that failed since it started; the watcher restarts after each with backoff",
                &INFORMER_LABELS,
            ),
            informers,
            dispatch_seats,
            seats_in_use: gauge(
                &r,
                "ctrlhub_dispatch_seats_in_use",
                "Dispatch seats held by a tenant's requests in flight",
                &["tenant", "weight"],
            ),
            seats_waiting: gauge(
                &r,
                "ctrlhub_dispatch_waiting_controllers",
                "A tenant's controllers with ready work waiting for a dispatch seat",
                &["tenant", "weight"],
            ),
            seat_grants: counter(
                &r,
                "ctrlhub_dispatch_seat_grants_total",
                "Dispatch seats granted to a tenant",
                &["tenant"],
            ),
            seat_waits: counter(
                &r,
                "ctrlhub_dispatch_seat_waits_total",
                "Dispatch seats granted to a tenant after waiting for one to be freed (the fair queue decided)",
                &["tenant"],
            ),
            deadline_misses: counter(
                &r,
                "ctrlhub_deadline_misses_total",
                "Requests whose deadline passed without a result (re-queued)",
                &cr,
            ),
            discarded_results: counter(
                &r,
                "ctrlhub_discarded_results_total",
                "Results and event acks discarded because their id was not in flight on the session (late, duplicate or unknown)",
                &cr,
            ),
            dispatch_latency: histogram(
                &r,
                "ctrlhub_dispatch_latency_seconds",
                "Time from a key becoming ready to its request being sent to a session",
                &cr,
                RECONCILE_BUCKETS.to_vec(),
            ),
            rejected,
            limit_hits: counter(
                &r,
                "ctrlhub_tenant_limit_hits_total",
                "Requests refused or registrations revoked because a tenant limit was reached",
                &["tenant", "limit"],
            ),
            connections_open: gauge(
                &r,
                "ctrlhub_connections_open",
                "Connections open on a port (grpc or http)",
                &["port"],
            ),
            connections_refused: counter(
                &r,
                "ctrlhub_connections_refused_total",
                "Connections closed as soon as they were accepted because a cap was reached (peer_cap or total_cap)",
                &["port", "reason"],
            ),
            connections_closed: counter(
                &r,
                "ctrlhub_connections_timed_out_total",
                "Connections the manager closed at a deadline: first_bytes_timeout (no preface or ClientHello), first_call_timeout, tls_handshake_timeout, idle (no call in progress)",
                &["port", "reason"],
            ),
            accept_failures: counter(
                &r,
                "ctrlhub_accept_failures_total",
                "Failed accepts on a port: exhausted (EMFILE, ENFILE, out of memory: the loop paused) or connection (one connection failed on its way in)",
                &["port", "kind"],
            ),
            auth_throttled: counter(
                &r,
                "ctrlhub_authentications_throttled_total",
                "Authentications refused before their token was reviewed: failures (the peer's failed-authentication budget is spent), peer_in_flight or total_in_flight (reviews in flight capped)",
                &["port", "reason"],
            ),
            leader_transitions: counter(
                &r,
                "ctrlhub_leader_transitions_total",
                "Times this replica became the holder of the leader-election Lease (name)",
                &["name"],
            ),
            api,
            grpc: grpc::GrpcServerMetrics::register(&r),
            auth: auth::AuthMetrics::register(&r),
            ring: ring::RingMetrics::register(&r),
            registry: r,
        }
    }

    /// Every counter and histogram of a controller at 0, as soon as it registers: a dashboard
    /// shows an idle controller as 0 and an alert can compare it, instead of "No data".
    pub(crate) fn preinitialise_controller(&self, controller: &str, tenant: &str) {
        let labels = [controller, tenant];
        for result in ResultLabel::ALL {
            self.reconcile_total
                .with_label_values(&[controller, tenant, result.as_str()]);
        }
        for counter in [
            &self.reconcile_errors,
            &self.terminal_errors,
            &self.adds,
            &self.retries,
            &self.deadline_misses,
            &self.discarded_results,
        ] {
            counter.with_label_values(&labels);
        }
        for histogram in [
            &self.reconcile_time,
            &self.queue_duration,
            &self.work_duration,
            &self.dispatch_latency,
        ] {
            histogram.with_label_values(&labels);
        }
    }

    /// The series of Lease `name` at 0, before any transition.
    pub(crate) fn preinitialise_leader(&self, name: &str) {
        self.leader_transitions.with_label_values(&[name]);
    }

    /// This replica became the holder of Lease `name`.
    pub(crate) fn leader_transition(&self, name: &str) {
        self.leader_transitions.with_label_values(&[name]).inc();
    }

    /// A finished reconcile.
    pub(crate) fn reconciled(
        &self,
        controller: &str,
        tenant: &str,
        result: ResultLabel,
        terminal: bool,
        took: Duration,
    ) {
        self.reconcile_total
            .with_label_values(&[controller, tenant, result.as_str()])
            .inc();
        if result == ResultLabel::Error {
            self.reconcile_errors
                .with_label_values(&[controller, tenant])
                .inc();
        }
        if terminal {
            self.terminal_errors
                .with_label_values(&[controller, tenant])
                .inc();
        }
        self.reconcile_time
            .with_label_values(&[controller, tenant])
            .observe(took.as_secs_f64());
        self.work_duration
            .with_label_values(&[controller, tenant])
            .observe(took.as_secs_f64());
    }

    /// A request handed to a session after waiting `queued` in the queue.
    pub(crate) fn dispatched(&self, controller: &str, tenant: &str, queued: Duration) {
        self.queue_duration
            .with_label_values(&[controller, tenant])
            .observe(queued.as_secs_f64());
        self.dispatch_latency
            .with_label_values(&[controller, tenant])
            .observe(queued.as_secs_f64());
    }

    /// A request missed its deadline.
    pub(crate) fn deadline_missed(&self, controller: &str, tenant: &str) {
        self.deadline_misses
            .with_label_values(&[controller, tenant])
            .inc();
    }

    /// A result or ack for an id not in flight was discarded.
    pub(crate) fn discarded(&self, controller: &str, tenant: &str) {
        self.discarded_results
            .with_label_values(&[controller, tenant])
            .inc();
    }

    /// Drop every series of a controller that went away, so tenants registering ever new
    /// controller names cannot grow `/metrics` (and the manager's memory) without bound.
    pub(crate) fn forget_controller(&self, controller: &str, tenant: &str) {
        let labels = [controller, tenant];
        for result in ResultLabel::ALL {
            let _ =
                self.reconcile_total
                    .remove_label_values(&[controller, tenant, result.as_str()]);
        }
        for counter in [
            &self.reconcile_errors,
            &self.terminal_errors,
            &self.adds,
            &self.retries,
            &self.deadline_misses,
            &self.discarded_results,
        ] {
            let _ = counter.remove_label_values(&labels);
        }
        for histogram in [
            &self.reconcile_time,
            &self.queue_duration,
            &self.work_duration,
            &self.dispatch_latency,
        ] {
            let _ = histogram.remove_label_values(&labels);
        }
    }

    /// A tenant reached `limit` (sessions, controllers, in_flight, queued_keys, message_bytes).
    pub(crate) fn limit_hit(&self, tenant: &str, limit: &str) {
        self.limit_hits.with_label_values(&[tenant, limit]).inc();
    }

    /// A connection was admitted on `port`.
    pub(crate) fn connection_opened(&self, port: &str) {
        self.connections_open.with_label_values(&[port]).inc();
    }

    /// A connection of `port` is gone.
    pub(crate) fn connection_dropped(&self, port: &str) {
        self.connections_open.with_label_values(&[port]).dec();
    }

    /// A connection was closed at once because `reason` (peer_cap, total_cap) was reached.
    pub(crate) fn connection_refused(&self, port: &str, reason: &str) {
        self.connections_refused
            .with_label_values(&[port, reason])
            .inc();
    }

    /// The manager closed a connection of `port` at a deadline (`reason`).
    pub(crate) fn connection_closed(&self, port: &str, reason: &str) {
        self.connections_closed
            .with_label_values(&[port, reason])
            .inc();
    }

    /// An accept failed on `port`.
    pub(crate) fn accept_failed(&self, port: &str, kind: &str) {
        self.accept_failures.with_label_values(&[port, kind]).inc();
    }

    /// An authentication on `port` was refused before its review (`reason`).
    pub(crate) fn auth_throttled(&self, port: &str, reason: &str) {
        self.auth_throttled.with_label_values(&[port, reason]).inc();
    }

    /// A registration of `tenant` was refused with `code` (a gRPC status code name).
    pub(crate) fn rejected(&self, tenant: &str, code: &str) {
        self.rejected.with_label_values(&[tenant, code]).inc();
    }

    /// Raise a counter to a cumulative value read from elsewhere (queues keep their own totals).
    pub(crate) fn advance(counter: &IntCounterVec, labels: &[&str], total: u64) {
        let c = counter.with_label_values(labels);
        let now = c.get();
        if total > now {
            c.inc_by(total - now);
        }
    }

    /// The text exposition of every metric.
    pub(crate) fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_controller_runtime_names() {
        let m = Metrics::new();
        m.reconciled(
            "memcached",
            "dev",
            ResultLabel::Success,
            false,
            Duration::from_millis(7),
        );
        m.reconciled(
            "memcached",
            "dev",
            ResultLabel::Error,
            true,
            Duration::from_millis(3),
        );
        let text = m.render();
        assert!(text.contains(r#"controller_runtime_reconcile_total{controller="memcached",result="success",tenant="dev"} 1"#), "{text}");
        assert!(text.contains(
            r#"controller_runtime_reconcile_errors_total{controller="memcached",tenant="dev"} 1"#
        ));
        assert!(text.contains(r#"controller_runtime_terminal_reconcile_errors_total{controller="memcached",tenant="dev"} 1"#));
        assert!(text.contains(r#"controller_runtime_reconcile_time_seconds_bucket{controller="memcached",tenant="dev",le="0.005"} 1"#), "7 ms is above the first bucket, 3 ms below it");
    }

    #[test]
    fn a_forgotten_controller_leaves_no_series() {
        let m = Metrics::new();
        m.reconciled(
            "gone",
            "t",
            ResultLabel::Success,
            false,
            Duration::from_millis(1),
        );
        m.dispatched("gone", "t", Duration::from_millis(1));
        m.deadline_missed("gone", "t");
        m.reconciled(
            "kept",
            "t",
            ResultLabel::Success,
            false,
            Duration::from_millis(1),
        );
        m.forget_controller("gone", "t");
        let text = m.render();
        assert!(!text.contains("controller=\"gone\""), "{text}");
        assert!(text.contains("controller=\"kept\""));
    }

    /// A controller that registered and did nothing has every counter and histogram at 0, so a
    /// dashboard shows 0 and an alert can compare it; forgetting it removes them again.
    #[test]
    fn a_registered_controller_has_its_series_at_zero() {
        let m = Metrics::new();
        m.preinitialise_controller("idle", "system:serviceaccounts:calm");
        let text = m.render();
        for series in [
            r#"controller_runtime_reconcile_total{controller="idle",result="error",tenant="system:serviceaccounts:calm"} 0"#,
            r#"controller_runtime_terminal_reconcile_errors_total{controller="idle",tenant="system:serviceaccounts:calm"} 0"#,
            r#"ctrlhub_deadline_misses_total{controller="idle",tenant="system:serviceaccounts:calm"} 0"#,
            r#"workqueue_retries_total{name="idle",tenant="system:serviceaccounts:calm"} 0"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="idle",tenant="system:serviceaccounts:calm"} 0"#,
            r#"ctrlhub_rejected_registrations_total{reason="Unauthenticated",tenant="unauthenticated"} 0"#,
        ] {
            assert!(text.contains(series), "missing {series} in\n{text}");
        }
        m.forget_controller("idle", "system:serviceaccounts:calm");
        assert!(!m.render().contains("controller=\"idle\""));
    }

    #[test]
    fn build_info_names_the_release() {
        let text = Metrics::new().render();
        let line = text
            .lines()
            .find(|l| l.starts_with("ctrlhub_build_info{"))
            .expect("build info");
        assert!(line.ends_with(" 1"), "{line}");
        assert!(
            line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
            "{line}"
        );
        assert!(!line.contains("rustc=\"\""), "{line}");
    }

    #[test]
    fn advance_never_goes_backwards() {
        let m = Metrics::new();
        Metrics::advance(&m.adds, &["c", "t"], 5);
        Metrics::advance(&m.adds, &["c", "t"], 3);
        assert_eq!(m.adds.with_label_values(&["c", "t"]).get(), 5);
    }
}
