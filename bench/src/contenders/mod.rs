//! What ctrlhub is measured against, and ctrlhub's own SDK controllers in other languages, each
//! named for what it runs: `kube_runtime` (kube-rs' `kube::runtime::Controller`, in process or
//! as `bench-kube-controller` processes), `kopf` (kopf's reference operator in Python),
//! `python_sdk` and `typescript_sdk` (ctrlhub's SDKs, as controller processes).

pub mod kopf;
pub mod kube_runtime;
pub mod python_sdk;
pub mod typescript_sdk;
