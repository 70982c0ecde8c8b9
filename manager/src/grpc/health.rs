//! The standard `grpc.health.v1` service on the gRPC port, following leadership: SERVING while
//! this manager leads (it accepts sessions), NOT_SERVING while it is a standby or shutting down,
//! for both the whole server (`""`, what Kubernetes gRPC probes ask) and
//! `ctrlhub.v1.ControllerManager`. A liveness probe should use HTTP `/healthz` instead: a
//! standby is alive, it only does not serve.

use ctrlhub_proto::v1::controller_manager_server::SERVICE_NAME;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// Keeps `reporter` in step with `leading` until `stop` fires, then reports NOT_SERVING.
pub(crate) fn follow_leadership(
    reporter: HealthReporter,
    mut leading: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let status = if *leading.borrow_and_update() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            set(&reporter, status).await;
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { break },
                _ = stop.cancelled() => break,
            }
        }
        set(&reporter, ServingStatus::NotServing).await;
    });
}

async fn set(reporter: &HealthReporter, status: ServingStatus) {
    for service in ["", SERVICE_NAME] {
        reporter.set_service_status(service, status).await;
    }
}
