//! The peer: an in-process `kube::runtime::Controller` on Widgets with a no-op reconciler that
//! reports each reconcile start (used in the harness' own process and by
//! `bench-kube-controller`).

use crate::env::{Reconciled, latency_of, widget_resource};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::watcher;
use std::sync::Arc;

/// The reconciler never fails; the error type only satisfies the Controller's bounds.
#[derive(Debug)]
pub struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

impl std::error::Error for Never {}

/// Run a Controller on Widgets in `ns` with `concurrency` until the task is dropped; every
/// reconcile start goes to `report`.
pub async fn run(
    client: kube::Client,
    ns: &str,
    concurrency: u16,
    report: Arc<dyn Fn(Reconciled) + Send + Sync>,
) {
    let ar = widget_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &ar);
    Controller::new_with(api, watcher::Config::default(), ar)
        .with_config(Config::default().concurrency(concurrency))
        .run(
            |obj: Arc<DynamicObject>, report: Arc<Arc<dyn Fn(Reconciled) + Send + Sync>>| async move {
                let latency_us = latency_of(obj.metadata.annotations.as_ref());
                let key = format!(
                    "{}/{}",
                    obj.metadata.namespace.as_deref().unwrap_or_default(),
                    obj.metadata.name.as_deref().unwrap_or_default()
                );
                report(Reconciled { key, latency_us });
                Ok::<_, Never>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            Arc::new(report),
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Spawn [`run`] reporting into `sink`; abort the handle to stop it.
pub fn spawn(
    client: kube::Client,
    ns: &str,
    concurrency: u16,
    sink: tokio::sync::mpsc::UnboundedSender<Reconciled>,
) -> tokio::task::JoinHandle<()> {
    let ns = ns.to_string();
    tokio::spawn(async move {
        run(
            client,
            &ns,
            concurrency,
            Arc::new(move |r| {
                let _ = sink.send(r);
            }),
        )
        .await
    })
}
