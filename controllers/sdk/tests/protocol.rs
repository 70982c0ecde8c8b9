//! The SDK against the real manager (`target/debug/ctrlhub run`) and devcluster, one test per
//! protocol point of docs/protocol.md that the SDK keeps:
//!
//! 1. no dispatch before the caches know: each key once at startup, with its object, never a
//!    tombstone; a key without state is NotFound, not deleted;
//! 2. children in full unless registered metadata-only, typed accordingly;
//! 3. exclusive attempts: heartbeats, late results, one attempt of a key in the process, the
//!    session ended at half the hold of silence, the process exited at 80 %, shutdown waiting
//!    for handlers;
//! 4. revisions: SUPERSEDED and `Rejected.outdated` wait, `CTRLHUB_REVISION`, fatal refusals.
//!
//! Build the binaries first: `cargo build --bin ctrlhub --bin devcluster`.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctrlhub_sdk::{
    Action, CancellationToken, Config, Controller, Mapping, Reason, ReconcileError, Request, Scope,
    Selector, SessionInfo,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::{Cluster, Manager, ManagerOptions, PATIENCE, Proxy, config_for, eventually};
use tokio::task::JoinHandle;

/// The label every primary of these tests carries.
const SCOPE: (&str, &str) = ("sdk-test", "in");

/// One line of what a handler did.
#[derive(Clone, Debug)]
struct Seen {
    key: String,
    event: &'static str,
    at: Instant,
    session: String,
    attempt: u32,
    reasons: Vec<Reason>,
    object: bool,
    tombstone: bool,
    note: String,
}

/// What the handlers of one controller did, and its sessions.
#[derive(Default)]
struct Probe {
    seen: Mutex<Vec<Seen>>,
    sessions: Mutex<Vec<SessionInfo>>,
}

impl Probe {
    fn record<K>(&self, req: &Request<K>, event: &'static str, note: String) {
        self.seen.lock().unwrap().push(Seen {
            key: req.name().to_owned(),
            event,
            at: Instant::now(),
            session: req.reader().session_id().to_owned(),
            attempt: req.attempt,
            reasons: req.reasons.clone(),
            object: req.object.is_some(),
            tombstone: req.tombstone,
            note,
        });
    }

    /// Blocking work of `key` ended (recorded on the blocking thread itself).
    fn unblocked(&self, key: &str) {
        self.seen.lock().unwrap().push(Seen {
            key: key.to_owned(),
            event: "unblocked",
            at: Instant::now(),
            session: String::new(),
            attempt: 0,
            reasons: Vec::new(),
            object: false,
            tombstone: false,
            note: String::new(),
        });
    }

    fn of(&self, key: &str, event: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.key == key && s.event == event)
            .cloned()
            .collect()
    }

    /// The `end` line of the attempt that `start` began.
    fn end_of(&self, start: &Seen) -> Option<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .find(|s| {
                s.event == "end"
                    && s.key == start.key
                    && s.session == start.session
                    && s.attempt == start.attempt
                    && s.at >= start.at
            })
            .cloned()
    }

    fn sessions(&self) -> Vec<SessionInfo> {
        self.sessions.lock().unwrap().clone()
    }

    /// Waits until `key` has at least `n` lines of `event`, and returns them.
    async fn wait(&self, key: &str, event: &str, n: usize) -> Vec<Seen> {
        let what = format!("{n} {event} line(s) of {key}");
        eventually(&what, PATIENCE, || async {
            let lines = self.of(key, event);
            (lines.len() >= n).then_some(lines)
        })
        .await
    }
}

/// Writes the handler's `end` line when dropped: `cancelled` unless it finished.
struct End<'a> {
    probe: &'a Probe,
    req: &'a Request<ConfigMap>,
    note: String,
}

impl Drop for End<'_> {
    fn drop(&mut self) {
        let note = std::mem::take(&mut self.note);
        let note = if note.is_empty() {
            "cancelled".into()
        } else {
            note
        };
        self.probe.record(self.req, "end", note);
    }
}

/// The handler every controller here runs, directed by the ConfigMap's data: on the first
/// start of the key in this process, `sleep_ms` (cancellable) and then `block_ms` (blocking,
/// through `ctrlhub_sdk::blocking`); `read_child` reads that owned Lease through the cache.
async fn reconcile(req: Request<ConfigMap>, probe: Arc<Probe>) -> Result<Action, ReconcileError> {
    let first = probe.of(req.name(), "start").is_empty();
    probe.record(&req, "start", String::new());
    let mut end = End {
        probe: &probe,
        req: &req,
        note: String::new(),
    };
    let data = req
        .object
        .as_ref()
        .and_then(|c| c.data.clone())
        .unwrap_or_default();
    let millis =
        |k: &str| Duration::from_millis(data.get(k).and_then(|v| v.parse().ok()).unwrap_or(0));
    if first {
        tokio::time::sleep(millis("sleep_ms")).await;
        let block = millis("block_ms");
        if !block.is_zero() {
            let (probe, key) = (probe.clone(), req.name().to_owned());
            ctrlhub_sdk::blocking(move || {
                std::thread::sleep(block);
                probe.unblocked(&key);
            })
            .await?;
        }
    }
    end.note = match data.get("read_child") {
        Some(child) => read_child(&req, child).await,
        None => "done".into(),
    };
    Ok(Action::done())
}

/// Reads Lease `name` through the cache as the full kind and as metadata.
async fn read_child(req: &Request<ConfigMap>, name: &str) -> String {
    let ns = req.namespace().unwrap_or_default();
    let full = match req.reader().get::<Lease>(ns, name).await {
        Ok(Some(lease)) => lease
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default(),
        Ok(None) => "not found".into(),
        Err(ctrlhub_sdk::ReadError::MetadataOnly { .. }) => "metadata-only".into(),
        Err(e) => format!("error: {e}"),
    };
    let meta = match req.reader().get_metadata::<Lease>(ns, name).await {
        Ok(Some(m)) => m.metadata.name.unwrap_or_default(),
        Ok(None) => "not found".into(),
        Err(e) => format!("error: {e}"),
    };
    format!("full={full} meta={meta}")
}

/// A controller of ConfigMaps labelled `sdk-test=in` in `ns`, objects included.
fn controller(name: &str, ns: &str) -> Controller<ConfigMap> {
    Controller::new(name)
        .reconciles::<ConfigMap>()
        .namespaces(Scope::Names(vec![ns.into()]))
        .label_selector(Selector::labels([SCOPE]))
        .include_object(true)
        .max_concurrent_reconciles(4)
}

/// A controller running in this test.
struct Running {
    probe: Arc<Probe>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ctrlhub_sdk::Error>>,
}

impl Running {
    fn start(ctl: Controller<ConfigMap>, config: Config) -> Running {
        let probe = Arc::new(Probe::default());
        let shutdown = CancellationToken::new();
        let sessions = probe.clone();
        let ctl =
            ctl.on_registered(move |info| sessions.sessions.lock().unwrap().push(info.clone()));
        let task = tokio::spawn(ctl.run(config, reconcile, probe.clone(), shutdown.clone()));
        Running {
            probe,
            shutdown,
            task,
        }
    }

    /// Waits until `n` sessions have registered.
    async fn registered(&self, n: usize) -> Vec<SessionInfo> {
        eventually(&format!("{n} registered session(s)"), PATIENCE, || async {
            let s = self.probe.sessions();
            (s.len() >= n).then_some(s)
        })
        .await
    }

    /// Shuts it down (a drain) and returns what `run` returned, and when.
    async fn stop(self) -> (Result<(), ctrlhub_sdk::Error>, Instant) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("run did not return after the shutdown")
            .unwrap();
        (result, Instant::now())
    }
}

/// Creates ConfigMap `name` in scope with `data`; returns it as stored.
async fn configmap(cluster: &Cluster, ns: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let data: BTreeMap<&str, &str> = data.iter().copied().collect();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {SCOPE.0: SCOPE.1}},
        "data": data,
    }))
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ns);
    api.create(&PostParams::default(), &cm).await.unwrap()
}

/// Creates Lease `name` held by `holder`, owned (as its controller) by `owner` when given, and
/// labelled with `labels`.
async fn lease(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    owner: Option<&ConfigMap>,
    labels: &[(&str, &str)],
) {
    let owners: Vec<serde_json::Value> = owner
        .iter()
        .map(|o| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "controller": true,
                "name": o.metadata.name, "uid": o.metadata.uid})
        })
        .collect();
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "spec": {"holderIdentity": format!("holder-of-{name}")},
    }))
    .unwrap();
    let api: Api<Lease> = Api::namespaced(cluster.client.clone(), ns);
    api.create(&PostParams::default(), &lease).await.unwrap();
}

/// Point 1: the manager dispatches only once its caches know their objects, so a controller
/// that owns children and registers afresh gets each key once per session, as INITIAL_LIST
/// with its object, and never a tombstone for a primary that exists.
#[tokio::test]
async fn startup_sends_each_key_once_with_its_object_never_a_tombstone() {
    let cluster = Cluster::start("startup").await;
    // Each round a fresh registration: the controller goes with its last replica (by default
    // the manager keeps it, with its queue, for 15 minutes, and a new replica just takes up).
    let opts = ManagerOptions {
        controller_grace: Some("0s"),
        ..Default::default()
    };
    let manager = Manager::start(&cluster, opts).await;
    let ns = "startup";
    cluster.namespace(ns).await;
    let keys: Vec<String> = (0..6).map(|i| format!("cm-{i}")).collect();
    for key in &keys {
        let cm = configmap(&cluster, ns, key, &[]).await;
        lease(&cluster, ns, &format!("{key}-child"), Some(&cm), &[]).await;
    }
    for round in 0..3 {
        let running = Running::start(controller("startup", ns).owns::<Lease>(), manager.config());
        let session = running.registered(1).await[0].session_id.clone();
        for key in &keys {
            running.probe.wait(key, "end", 1).await;
        }
        let probe = running.probe.clone();
        let (result, _) = running.stop().await;
        assert!(result.is_ok(), "round {round}: {result:?}");
        for key in &keys {
            let starts = probe.of(key, "start");
            assert_eq!(starts.len(), 1, "round {round}: {key} started {starts:?}");
            let s = &starts[0];
            assert_eq!(s.session, session);
            assert!(s.object && !s.tombstone, "round {round}: {s:?}");
            assert!(
                s.reasons.contains(&Reason::InitialList) && !s.reasons.contains(&Reason::Deleted),
                "round {round}: {s:?}"
            );
        }
    }
}

/// Point 1: a request for a key the manager holds no state for (a watched object naming a
/// primary that does not exist) carries no object: the SDK hands it over as NotFound, not as
/// a deletion, and the handler's answer is what the manager gets (no Terminal).
#[tokio::test]
async fn a_key_without_state_is_not_found_not_deleted() {
    let cluster = Cluster::start("no-state").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let ns = "no-state";
    cluster.namespace(ns).await;
    let running = Running::start(
        controller("no-state", ns).watches::<Lease>(Mapping::Label("sdk-test/primary".into())),
        manager.config(),
    );
    running.registered(1).await;
    lease(
        &cluster,
        ns,
        "stray",
        None,
        &[("sdk-test/primary", "ghost")],
    )
    .await;
    let ends = running.probe.wait("ghost", "end", 1).await;
    let starts = running.probe.of("ghost", "start");
    assert!(!starts[0].object && !starts[0].tombstone, "{:?}", starts[0]);
    assert_eq!(ends[0].note, "done");
    let c = manager.controller("no-state").await.unwrap();
    assert_eq!(c["terminal"], 0, "{c}");
    let (result, _) = running.stop().await;
    assert!(result.is_ok(), "{result:?}");
}

/// Point 2: an owned kind is cached and read in full by default (the child's spec through
/// `get`), and as metadata only with `owns_metadata` (`get` refuses, `get_metadata` returns a
/// `PartialObjectMeta<Lease>`); `Registered.readable` says which.
#[tokio::test]
async fn children_are_read_in_full_unless_registered_as_metadata() {
    let cluster = Cluster::start("children").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let ns = "children";
    cluster.namespace(ns).await;
    let parent = configmap(&cluster, ns, "parent", &[("read_child", "child")]).await;
    lease(&cluster, ns, "child", Some(&parent), &[]).await;

    let full = Running::start(controller("full", ns).owns::<Lease>(), manager.config());
    let info = &full.registered(1).await[0];
    assert!(
        info.readable_summary()
            .contains("coordination.k8s.io/v1 Lease (full)"),
        "{}",
        info.readable_summary()
    );
    let ends = full.probe.wait("parent", "end", 1).await;
    assert_eq!(ends[0].note, "full=holder-of-child meta=child");
    assert!(full.stop().await.0.is_ok());

    let meta = Running::start(
        controller("meta", ns).owns_metadata::<Lease>(),
        manager.config(),
    );
    let info = &meta.registered(1).await[0];
    assert!(
        info.readable_summary()
            .contains("coordination.k8s.io/v1 Lease (metadata)"),
        "{}",
        info.readable_summary()
    );
    let ends = meta.probe.wait("parent", "end", 1).await;
    assert_eq!(ends[0].note, "full=metadata-only meta=child");
    assert!(meta.stop().await.0.is_ok());
}

/// Point 3: heartbeats keep an idle exclusive session alive: the manager ends a session that
/// sends nothing for the hold (1 s here), and this one lives through three holds.
#[tokio::test]
async fn heartbeats_keep_an_idle_session() {
    let cluster = Cluster::start("heartbeats").await;
    let opts = ManagerOptions {
        hold: Some("1s"),
        ..Default::default()
    };
    let manager = Manager::start(&cluster, opts).await;
    cluster.namespace("heartbeats").await;
    let running = Running::start(controller("heartbeats", "heartbeats"), manager.config());
    let info = running.registered(1).await[0].clone();
    assert_eq!(info.hold, Some(Duration::from_secs(1)));
    assert_eq!(info.heartbeat_interval, Some(Duration::from_millis(200)));
    // A window that proves something does not happen: three holds without a new session.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        running.probe.sessions().len(),
        1,
        "the session was replaced"
    );
    assert_eq!(manager.sessions("heartbeats").await, 1);
    assert!(running.stop().await.0.is_ok());
}

/// Point 3: a reconcile blocked past its deadline is cancelled, and its result goes to the
/// manager once it has really stopped; the manager discards it as an outcome and only then
/// re-delivers the key, so the two attempts never overlap.
#[tokio::test]
async fn a_late_result_releases_the_key_only_once_the_handler_stopped() {
    let cluster = Cluster::start("late").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let ns = "late";
    cluster.namespace(ns).await;
    let running = Running::start(
        controller("late", ns)
            .deadline(Duration::from_secs(1))
            .backoff(Duration::from_millis(100), Duration::from_secs(1)),
        manager.config(),
    );
    running.registered(1).await;
    configmap(&cluster, ns, "late", &[("block_ms", "2500")]).await;
    running.probe.wait("late", "end", 2).await;
    let starts = running.probe.of("late", "start");
    assert_eq!(starts.len(), 2, "{starts:?}");
    let end1 = running.probe.end_of(&starts[0]).unwrap();
    assert!(
        end1.at >= starts[0].at + Duration::from_millis(2500),
        "attempt 1 ended before its blocking work: {end1:?}"
    );
    let unblocked = running.probe.of("late", "unblocked");
    assert!(
        unblocked.first().is_some_and(|u| starts[1].at >= u.at) && starts[1].at >= end1.at,
        "attempt 2 overlapped attempt 1: {starts:?} {end1:?} {unblocked:?}"
    );
    assert_eq!(starts[1].attempt, 2);
    assert!(
        starts[1].reasons.contains(&Reason::Redelivery),
        "{:?}",
        starts[1]
    );
    assert_eq!(running.probe.end_of(&starts[1]).unwrap().note, "done");
    let c = manager.controller("late").await.unwrap();
    assert!(c["discarded"].as_u64().unwrap_or(0) >= 1, "{c}");
    assert!(running.stop().await.0.is_ok());
}

/// Point 3: a manager that knows nothing of the first attempt (the first manager SIGKILLed, a
/// second one that elects itself under another Lease name, as after a lost state) hands the
/// key out again while its first attempt still blocks in this process; the second attempt, on
/// the new session, waits for the first to end before it starts.
#[tokio::test]
async fn a_key_never_runs_twice_at_once_in_the_process() {
    let cluster = Cluster::start("twice").await;
    // A hold longer than the handover (lease 30 s less a 10 s renew deadline), so that the
    // watchdog leaves the blocked attempt alone.
    let opts = ManagerOptions {
        identity: "first".into(),
        lease: ("30s", "10s"),
        ..Default::default()
    };
    let mut first = Manager::start(&cluster, opts.clone()).await;
    let ns = "twice";
    cluster.namespace(ns).await;
    let running = Running::start(
        controller("twice", ns).deadline(Duration::from_secs(30)),
        first.config(),
    );
    assert_eq!(
        running.registered(1).await[0].hold,
        Some(Duration::from_secs(20))
    );
    configmap(&cluster, ns, "key", &[("block_ms", "6000")]).await;
    running.probe.wait("key", "start", 1).await;
    first.process.signal("KILL");
    first.process.exited(PATIENCE).await;
    let second = Manager::start(
        &cluster,
        ManagerOptions {
            identity: "second".into(),
            grpc_port: Some(first.grpc_port),
            lease_name: Some("sdk-test-second"),
            ..opts
        },
    )
    .await;
    running.probe.wait("key", "end", 2).await;
    let starts = running.probe.of("key", "start");
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_ne!(starts[0].session, starts[1].session);
    let (end1, end2) = (
        running.probe.end_of(&starts[0]),
        running.probe.end_of(&starts[1]),
    );
    let (end1, end2) = (end1.unwrap(), end2.unwrap());
    let unblocked = running.probe.of("key", "unblocked");
    assert!(
        unblocked.first().is_some_and(|u| starts[1].at >= u.at) && starts[1].at >= end1.at,
        "the second attempt started while the first still ran: {starts:?} {end1:?} {unblocked:?}"
    );
    assert_eq!(end2.note, "done");
    assert!(running.stop().await.0.is_ok());
    drop(second);
}

/// Point 3: connections frozen (a partition, nothing closed): the replica hears no heartbeat
/// answer, ends its session at half the hold and cancels its reconcile, which has stopped
/// before the manager hands the key to the replica's next session.
#[tokio::test]
async fn a_partitioned_replica_stops_before_its_key_moves() {
    let cluster = Cluster::start("partition").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let proxy = Proxy::start(manager.grpc_port).await;
    let ns = "partition";
    cluster.namespace(ns).await;
    let running = Running::start(
        controller("partition", ns).deadline(Duration::from_secs(60)),
        config_for(proxy.addr()),
    );
    let before = running.registered(1).await[0].session_id.clone();
    configmap(&cluster, ns, "key", &[("sleep_ms", "30000")]).await;
    running.probe.wait("key", "start", 1).await;
    proxy.freeze();
    running.probe.wait("key", "end", 2).await;
    let starts = running.probe.of("key", "start");
    let (end1, end2) = (
        running.probe.end_of(&starts[0]),
        running.probe.end_of(&starts[1]),
    );
    let (end1, end2) = (end1.unwrap(), end2.unwrap());
    assert_eq!(end1.note, "cancelled");
    assert_eq!(starts[0].session, before);
    assert_ne!(starts[1].session, before, "attempt 2 came on a new session");
    assert!(
        starts[1].at >= end1.at,
        "attempt 2 started before attempt 1 stopped"
    );
    assert_eq!(end2.note, "done");
    assert!(running.stop().await.0.is_ok());
}

/// Point 3: a shutdown drains: `run` returns only once no reconcile runs, also one that
/// blocks past its deadline (its late result is what lets the manager close the stream).
#[tokio::test]
async fn shutdown_returns_only_when_no_reconcile_runs() {
    let cluster = Cluster::start("shutdown").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let ns = "shutdown";
    cluster.namespace(ns).await;
    let running = Running::start(
        controller("shutdown", ns).deadline(Duration::from_secs(1)),
        manager.config(),
    );
    running.registered(1).await;
    configmap(&cluster, ns, "key", &[("block_ms", "2500")]).await;
    running.probe.wait("key", "start", 1).await;
    let probe = running.probe.clone();
    let (result, returned) = running.stop().await;
    assert!(result.is_ok(), "{result:?}");
    let ends = probe.of("key", "end");
    assert_eq!(ends.len(), 1, "{ends:?}");
    let unblocked = probe.of("key", "unblocked");
    assert_eq!(
        unblocked.len(),
        1,
        "run returned while the reconcile still blocked"
    );
    assert!(
        ends[0].at <= returned && unblocked[0].at <= returned,
        "run returned while a reconcile ran"
    );
}

/// Point 4: a definition with a higher revision supersedes the running one: the old replica's
/// reconcile is cancelled, `run` does not return, and it registers again only after
/// `outdated_wait` (refused as outdated while the newer definition runs, accepted once that
/// one's replicas are gone); the newer definition's session is never revoked meanwhile.
#[tokio::test]
async fn a_superseded_replica_waits_instead_of_exiting() {
    let cluster = Cluster::start("supersede").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let ns = "supersede";
    cluster.namespace(ns).await;
    let mut old_config = manager.config();
    old_config.outdated_wait = Duration::from_secs(2);
    let old = Running::start(
        controller("rollout", ns)
            .revision(1)
            .deadline(Duration::from_secs(10)),
        old_config,
    );
    old.registered(1).await;
    configmap(&cluster, ns, "key", &[("sleep_ms", "60000")]).await;
    old.probe.wait("key", "start", 1).await;

    let new = Running::start(
        controller("rollout", ns)
            .revision(2)
            .deadline(Duration::from_secs(9)),
        manager.config(),
    );
    new.registered(1).await;
    let ends = old.probe.wait("key", "end", 1).await;
    assert_eq!(ends[0].note, "cancelled");
    // Several outdated waits: the old replica keeps trying, is refused, and never exits.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !old.task.is_finished(),
        "a superseded replica must not exit"
    );
    assert_eq!(old.probe.sessions().len(), 1);
    assert_eq!(
        new.probe.sessions().len(),
        1,
        "the new definition's session was revoked"
    );
    assert_eq!(
        manager.sessions("rollout").await,
        1,
        "only the new replica's session"
    );

    assert!(new.stop().await.0.is_ok());
    old.registered(2).await;
    assert!(old.stop().await.0.is_ok());
}

/// Point 4: `CTRLHUB_REVISION` sets the revision when the definition does not: a process
/// started with `CTRLHUB_REVISION=3` supersedes this one's revision 2.
#[tokio::test]
async fn the_revision_comes_from_ctrlhub_revision() {
    let cluster = Cluster::start("revision-env").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let ns = "revision-env";
    cluster.namespace(ns).await;
    let old = Running::start(controller("env", ns).revision(2), manager.config());
    old.registered(1).await;
    let mut child = Child::start("env", &manager.addr(), ns, &[("CTRLHUB_REVISION", "3")]);
    // Accepted while revision 2 runs: only a higher revision is (a lower or equal one is
    // refused as outdated), so it replaced ours.
    let line = child.line("REGISTERED ").await;
    assert_eq!(line.split_once(' ').map(|(_, r)| r), Some("3"), "{line}");
    eventually(
        "the manager to hold the child's session alone",
        PATIENCE,
        || async { (manager.sessions("env").await == 1).then_some(()) },
    )
    .await;
    assert!(
        !old.task.is_finished(),
        "a superseded replica must not exit"
    );
    assert_eq!(old.probe.sessions().len(), 1);
    child.process.signal("TERM");
    assert!(child.process.exited(PATIENCE).await.success());
    assert!(old.stop().await.0.is_ok());
}

/// Point 4: refusals only a human can fix still end `run` with an error.
#[tokio::test]
async fn a_registration_only_a_human_can_fix_is_an_error() {
    let cluster = Cluster::start("refused").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let run = Controller::new("refused")
        .reconciles_dynamic(ctrlhub_sdk::dynamic_resource_type(
            "nope.example.com",
            "v1",
            "Nope",
        ))
        .run(
            manager.config(),
            |_: Request<kube::core::DynamicObject>, _: Arc<()>| async { Ok(Action::done()) },
            Arc::new(()),
            CancellationToken::new(),
        );
    let result = tokio::time::timeout(PATIENCE, run).await.unwrap();
    assert!(
        matches!(
            result,
            Err(ctrlhub_sdk::Error::Rejected { code, .. }) if code == tonic::Code::InvalidArgument
        ),
        "{result:?}"
    );
}

/// Point 3: a handler that ignores its cancellation (blocking code) still running at 80 % of
/// the hold after the last answered heartbeat makes the process exit with
/// `HOLD_EXIT_CODE` and one ERROR line, before the manager may hand its key to another replica.
#[tokio::test]
async fn a_stuck_handler_exits_the_process_before_the_hold_ends() {
    let cluster = Cluster::start("stuck").await;
    let opts = ManagerOptions {
        lease: ("4s", "2s"),
        ..Default::default()
    };
    let mut manager = Manager::start(&cluster, opts).await;
    let ns = "stuck";
    cluster.namespace(ns).await;
    configmap(&cluster, ns, "key", &[("block_ms", "60000")]).await;
    let mut child = Child::start("stuck", &manager.addr(), ns, &[]);
    child.line("REGISTERED ").await;
    child.line("START key").await;
    manager.process.signal("KILL");
    let killed = Instant::now();
    manager.process.exited(PATIENCE).await;
    let status = child.process.exited(PATIENCE).await;
    let took = killed.elapsed();
    assert_eq!(
        status.code(),
        Some(ctrlhub_sdk::HOLD_EXIT_CODE),
        "{status:?}"
    );
    // The hold is 2 s (lease 4 s less the 2 s renew deadline): 1.6 s after the last answer.
    assert!(
        took < Duration::from_secs(2),
        "exited {took:?} after the kill"
    );
    let log = std::fs::read_to_string(&child.process.log).unwrap();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("exiting the process"))
        .collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(errors[0].contains("key"), "{}", errors[0]);
}

/// A controller in a child process (this test binary again, running [`child_controller`]),
/// for what a test process cannot do to itself: exit, or read its environment.
struct Child {
    process: support::Process,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Child {
    fn start(mode: &str, addr: &str, ns: &str, env: &[(&str, &str)]) -> Child {
        let log = support::scratch("children").join(format!("{mode}-{}.log", support::free_port()));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "child_controller",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SDK_TEST_CHILD", mode)
            .env("SDK_TEST_ADDR", addr)
            .env("SDK_TEST_NS", ns)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        Child {
            process: support::Process { child, log },
            lines,
        }
    }

    /// What follows `prefix` in the first stdout line holding it (the test harness may have
    /// printed the test's name before it on the same line).
    async fn line(&mut self, prefix: &str) -> String {
        eventually(&format!("the child to print {prefix:?}"), PATIENCE, || {
            let found = self
                .lines
                .try_iter()
                .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest.to_owned()));
            async move { found }
        })
        .await
    }
}

/// The child process of [`Child`]; does nothing unless `SDK_TEST_CHILD` is set. Prints
/// `REGISTERED <session> <revision>` and `START <key>` lines, logs to stderr, and runs until
/// SIGTERM (or until the SDK exits the process).
#[tokio::test]
async fn child_controller() {
    let Ok(mode) = std::env::var("SDK_TEST_CHILD") else {
        return;
    };
    ctrlhub_sdk::traces::logs::init(ctrlhub_sdk::traces::logs::LogFormat::Text, "info");
    let addr = std::env::var("SDK_TEST_ADDR").unwrap();
    let ns = std::env::var("SDK_TEST_NS").unwrap();
    let shutdown = CancellationToken::new();
    let on_term = shutdown.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        term.recv().await;
        on_term.cancel();
    });
    // Another definition than the parent's (a different deadline), so that revisions decide.
    let ctl = controller(&mode, &ns)
        .deadline(Duration::from_secs(20))
        .on_registered(|info| println!("REGISTERED {} {}", info.session_id, info.revision));
    let result = ctl
        .run(config_for(addr), child_reconcile, Arc::new(()), shutdown)
        .await;
    assert!(result.is_ok(), "{result:?}");
}

/// The child's handler: `block_ms` on every attempt, whatever the cancellation says.
async fn child_reconcile(req: Request<ConfigMap>, _: Arc<()>) -> Result<Action, ReconcileError> {
    println!("START {}", req.name());
    let block = req
        .object
        .as_ref()
        .and_then(|c| c.data.as_ref()?.get("block_ms")?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    ctrlhub_sdk::blocking(move || std::thread::sleep(block)).await?;
    Ok(Action::done())
}
