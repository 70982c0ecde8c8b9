//! devcluster, the in-memory API server every other suite runs against, held to what
//! kube-apiserver does: one test binary, a module per subject. Each test starts its own
//! devcluster and drives it the way controllers and people do (kube-rs, `kubectl`, raw HTTPS).

mod api;
mod auth;
mod events;
mod kubectl;
mod kubectl_typed;
mod lease;
mod tricky;
mod validation;
