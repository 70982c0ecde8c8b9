//! Fault suite: a real manager, a real SDK controller (`fault-controller`,
//! several replica processes) and 1,000+ ConfigMaps, under one fault per test:
//!
//! - `replica_sigkill_repeatedly`: controller replicas are SIGKILLed and restarted, round after
//!   round, while reconciles are in flight;
//! - `grpc_connections_cut_mid_stream`: a TCP proxy between replicas and the manager severs
//!   every connection while work flows;
//! - `leader_manager_sigkill`: the leading manager is SIGKILLed (twice); a standby takes over;
//! - `devcluster_closes_every_watch`: every watch stream ends, again and again;
//! - `devcluster_forces_410_on_resume`: watch history is compacted and watches closed, so every
//!   resume gets 410 Gone and the informer must relist (deletions included);
//! - `leader_lease_partition`: the leader's Lease writes are frozen; it must stop dispatching
//!   before its renew deadline ends.
//!
//! Every replica logs each reconcile start and end with a wall-clock timestamp; after each
//! fault the logs must show that every object's last change was reconciled (a start that saw
//! its final resourceVersion, or a tombstone for a deleted object) and that no key ever had two
//! overlapping reconciles. [`reconcile_log`] holds that check and its own unit tests.
//!
//! Randomness (which objects change, which replica dies) comes from `StdRng` with a fixed seed
//! per test. The tests take turns (one lock) because they measure timing on a 2-core machine.

use ctrlhub_tests::*;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::process::Child;
use tokio::sync::watch;

/// Parsing and checking the controller's reconcile log; pure functions, unit-tested below.
pub(crate) mod reconcile_log {
    use std::collections::{BTreeMap, HashMap};

    /// Start or end of one reconcile.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Kind {
        /// The reconcile function was entered.
        Start,
        /// It returned, or its future was dropped (session ended / deadline).
        End,
    }

    /// One line of a replica's log.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct Entry {
        /// Unix time in microseconds.
        pub ts: u64,
        /// The replica process (unique per process incarnation).
        pub replica: String,
        /// Start or end.
        pub kind: Kind,
        /// `namespace/name`.
        pub key: String,
        /// The resourceVersion the request carried; `-` when it carried no object (deleted).
        pub rv: String,
        /// The manager's request id.
        pub id: String,
    }

    /// Parse a log (the format documented in `tests/src/bin/fault-controller.rs`). A last line
    /// without its newline is dropped: a SIGKILL can cut the final write short.
    pub(crate) fn parse(text: &str) -> Result<Vec<Entry>, String> {
        let complete = match text.rfind('\n') {
            Some(i) => &text[..=i],
            None => "",
        };
        complete
            .lines()
            .enumerate()
            .map(|(n, line)| {
                let f: Vec<&str> = line.split(' ').collect();
                let bad = || format!("line {}: malformed reconcile log line {line:?}", n + 1);
                let kind = match f.get(2) {
                    Some(&"start") if f.len() == 6 => Kind::Start,
                    Some(&"end") if f.len() == 7 => Kind::End,
                    _ => return Err(bad()),
                };
                Ok(Entry {
                    ts: f[0].parse().map_err(|_| bad())?,
                    replica: f[1].to_string(),
                    kind,
                    key: f[3].to_string(),
                    rv: f[4].to_string(),
                    id: f[5].to_string(),
                })
            })
            .collect()
    }

    /// One reconcile: from its start to its end, or to when its replica was killed, or open.
    #[derive(Debug, Clone)]
    pub(crate) struct Interval {
        /// Replica.
        pub replica: String,
        /// Request id.
        pub id: String,
        /// resourceVersion seen at start.
        pub rv: String,
        /// Start, unix micros.
        pub start: u64,
        /// End, unix micros; `None`: never ended.
        pub end: Option<u64>,
    }

    /// Pair starts with ends per key. `killed` maps a replica to a time (unix micros) taken just
    /// before it was SIGKILLed: a reconcile it never finished ended no later than its death, and
    /// is taken to end at the later of that time and the replica's last log line (both precede
    /// the death, and the manager cannot re-dispatch before it notices the death).
    pub(crate) fn intervals(
        entries: &[Entry],
        killed: &HashMap<String, u64>,
    ) -> Result<BTreeMap<String, Vec<Interval>>, Vec<String>> {
        let mut last_line: HashMap<&str, u64> = HashMap::new();
        for e in entries {
            let t = last_line.entry(e.replica.as_str()).or_default();
            *t = (*t).max(e.ts);
        }
        let mut out: BTreeMap<String, Vec<Interval>> = BTreeMap::new();
        let mut open: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut errors = Vec::new();
        // Per replica the file order is the order of events; sort only by time within that.
        let mut sorted: Vec<&Entry> = entries.iter().collect();
        sorted.sort_by_key(|e| e.ts);
        for e in sorted {
            let slot = (e.replica.as_str(), e.key.as_str(), e.id.as_str());
            match e.kind {
                Kind::Start => {
                    let list = out.entry(e.key.clone()).or_default();
                    if open.insert(slot, list.len()).is_some() {
                        errors.push(format!(
                            "key {}: request {} started twice on replica {} without ending",
                            e.key, e.id, e.replica
                        ));
                    }
                    list.push(Interval {
                        replica: e.replica.clone(),
                        id: e.id.clone(),
                        rv: e.rv.clone(),
                        start: e.ts,
                        end: None,
                    });
                }
                Kind::End => match open.remove(&slot) {
                    Some(i) => {
                        if let Some(iv) = out.get_mut(&e.key).and_then(|l| l.get_mut(i)) {
                            iv.end = Some(e.ts);
                        }
                    }
                    None => errors.push(format!(
                        "key {}: request {} ended on replica {} at {} without a start",
                        e.key, e.id, e.replica, e.ts
                    )),
                },
            }
        }
        for list in out.values_mut() {
            for iv in list.iter_mut().filter(|iv| iv.end.is_none()) {
                if let Some(k) = killed.get(&iv.replica) {
                    let last = last_line.get(iv.replica.as_str()).copied().unwrap_or(0);
                    iv.end = Some((*k).max(last));
                }
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors)
        }
    }

    /// Rule "exclusive": no key has two reconciles whose intervals overlap (an end at the same
    /// microsecond as the next start is fine: the first answered before the second began).
    pub(crate) fn overlaps(by_key: &BTreeMap<String, Vec<Interval>>) -> Vec<String> {
        let mut out = Vec::new();
        for (key, list) in by_key {
            let mut list: Vec<&Interval> = list.iter().collect();
            list.sort_by_key(|iv| iv.start);
            let mut running: Option<&Interval> = None;
            for iv in list {
                if let Some(prev) = running
                    && prev.end.is_none_or(|end| end > iv.start)
                {
                    out.push(format!(
                        "key {key}: two overlapping reconciles: request {} on replica {} started at {} \
                         while request {} on replica {} (started at {}) was still running (ended {})",
                        iv.id,
                        iv.replica,
                        iv.start,
                        prev.id,
                        prev.replica,
                        prev.start,
                        prev.end.map_or("never".to_string(), |e| e.to_string()),
                    ));
                }
                // Keep the one that runs longest as the reference for the next start.
                if running.is_none_or(|p| match (p.end, iv.end) {
                    (None, _) => false,
                    (Some(_), None) => true,
                    (Some(a), Some(b)) => b > a,
                }) {
                    running = Some(iv);
                }
            }
        }
        out
    }

    /// Rule "no lost keys": for every object, its final state was seen by some reconcile start
    /// (`Some(rv)`: a start with that resourceVersion; `None`, deleted: the key's last start
    /// carried no object, or the key was never reconciled at all).
    pub(crate) fn lost_keys(
        by_key: &BTreeMap<String, Vec<Interval>>,
        final_state: &BTreeMap<String, Option<String>>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for (key, want) in final_state {
            let list = by_key.get(key).map(Vec::as_slice).unwrap_or_default();
            let last = list.iter().max_by_key(|iv| iv.start);
            let describe = || match last {
                Some(l) => format!(
                    "its last reconcile (request {} on {} at {}) saw resourceVersion {}",
                    l.id, l.replica, l.start, l.rv
                ),
                None => "it was never reconciled".to_string(),
            };
            match want {
                Some(rv) => {
                    if !list.iter().any(|iv| &iv.rv == rv) {
                        out.push(format!(
                            "key {key}: lost: its final resourceVersion {rv} was never reconciled; {}",
                            describe()
                        ));
                    }
                }
                // Created and deleted while the informer was relisting after a 410, an object
                // is never observed at all; the controller then has nothing to clean up. But
                // one it saw must be seen gone.
                None => {
                    if last.is_some_and(|l| l.rv != "-") {
                        out.push(format!(
                            "key {key}: lost: it was deleted but no reconcile saw the deletion; {}",
                            describe()
                        ));
                    }
                }
            }
        }
        out
    }

    /// Both rules over a whole run; empty when the run is clean.
    pub(crate) fn check(
        entries: &[Entry],
        killed: &HashMap<String, u64>,
        final_state: &BTreeMap<String, Option<String>>,
    ) -> Vec<String> {
        match intervals(entries, killed) {
            Err(errors) => errors,
            Ok(by_key) => {
                let mut v = overlaps(&by_key);
                v.extend(lost_keys(&by_key, final_state));
                v
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn log(lines: &[&str]) -> Vec<Entry> {
            let mut text = lines.join("\n");
            text.push('\n');
            parse(&text).expect("well-formed")
        }

        fn state(s: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
            s.iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect()
        }

        #[test]
        fn clean_run_passes() {
            let e = log(&[
                "10 r1 start ns/a 5 c-1",
                "20 r1 end ns/a 5 c-1 done",
                "20 r2 start ns/a 7 c-2",
                "30 r2 end ns/a 7 c-2 done",
                "31 r2 start ns/b - c-3",
                "32 r2 end ns/b - c-3 done",
            ]);
            let v = check(
                &e,
                &HashMap::new(),
                &state(&[("ns/a", Some("7")), ("ns/b", None)]),
            );
            assert!(v.is_empty(), "{v:?}");
        }

        #[test]
        fn overlap_names_key_and_both_requests() {
            let e = log(&[
                "10 r1 start ns/a 5 c-1",
                "15 r2 start ns/a 5 c-2",
                "20 r1 end ns/a 5 c-1 done",
                "25 r2 end ns/a 5 c-2 done",
            ]);
            let v = check(&e, &HashMap::new(), &state(&[("ns/a", Some("5"))]));
            assert_eq!(v.len(), 1, "{v:?}");
            assert!(v[0].starts_with("key ns/a: two overlapping"), "{}", v[0]);
            assert!(v[0].contains("c-1") && v[0].contains("c-2"), "{}", v[0]);
        }

        #[test]
        fn open_reconcile_of_a_live_replica_overlaps_everything_after() {
            let e = log(&["10 r1 start ns/a 5 c-1", "50 r2 start ns/a 5 c-2"]);
            let v = check(&e, &HashMap::new(), &state(&[]));
            assert_eq!(v.len(), 1, "{v:?}");
            assert!(v[0].contains("ended never"), "{}", v[0]);
        }

        #[test]
        fn killed_replica_ends_its_open_reconciles_at_death() {
            let e = log(&[
                "10 r1 start ns/a 5 c-1",
                "12 r1 start ns/b 5 c-2",
                "40 r2 start ns/a 5 c-3",
                "41 r2 end ns/a 5 c-3 done",
            ]);
            let killed = HashMap::from([("r1".to_string(), 30)]);
            assert!(check(&e, &killed, &state(&[("ns/a", Some("5"))])).is_empty());
            // Killed only after the second replica started: a real overlap.
            let killed = HashMap::from([("r1".to_string(), 45)]);
            let v = check(&e, &killed, &state(&[]));
            assert_eq!(v.len(), 1, "{v:?}");
        }

        #[test]
        fn lost_update_and_lost_delete_are_reported() {
            let e = log(&[
                "10 r1 start ns/a 5 c-1",
                "20 r1 end ns/a 5 c-1 done",
                "21 r1 start ns/b 3 c-2",
                "22 r1 end ns/b 3 c-2 done",
            ]);
            let v = check(
                &e,
                &HashMap::new(),
                &state(&[
                    ("ns/a", Some("6")),
                    ("ns/b", None),
                    ("ns/c", Some("1")),
                    // Never seen, now gone: nothing to reconcile.
                    ("ns/d", None),
                ]),
            );
            assert_eq!(v.len(), 3, "{v:?}");
            assert!(v[0].starts_with("key ns/a: lost") && v[0].contains("saw resourceVersion 5"));
            assert!(v[1].starts_with("key ns/b: lost: it was deleted"));
            assert!(v[2].starts_with("key ns/c: lost") && v[2].contains("never reconciled"));
        }

        #[test]
        fn truncated_last_line_is_ignored_and_garbage_is_an_error() {
            assert_eq!(
                parse("10 r1 start ns/a 5 c-1\n11 r1 end ns/a").map(|v| v.len()),
                Ok(1)
            );
            assert!(parse("10 r1 begin ns/a 5 c-1\n").is_err());
        }

        #[test]
        fn end_without_start_is_reported() {
            let e = log(&["10 r1 end ns/a 5 c-1 done"]);
            let v = check(&e, &HashMap::new(), &state(&[]));
            assert!(v[0].contains("without a start"), "{v:?}");
        }
    }
}

/// The tests take turns: each measures timing (deadlines, handovers) on a small machine.
use ctrlhub_tests::SERIAL;

const NS: &str = "faults";
const OBJECTS: usize = 1000;

fn now_micros() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros(),
    )
    .unwrap_or(u64::MAX)
}

/// A TCP proxy for gRPC: forwards each connection to a fixed target, or to whichever manager
/// leads (like a Service selecting the leader pod); [`Proxy::cut`] severs every open connection.
struct Proxy {
    port: u16,
    cut: watch::Sender<u64>,
    managers: Arc<parking_lot::Mutex<Vec<(String, String)>>>,
}

impl Proxy {
    /// `managers`: (http, grpc) pairs; with one, no leadership check is made.
    async fn start(managers: Vec<(String, String)>) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy binds");
        let port = listener.local_addr().expect("addr").port();
        let (cut, _) = watch::channel(0u64);
        let cut_tx = cut.clone();
        let managers = Arc::new(parking_lot::Mutex::new(managers));
        let shared = managers.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let managers = shared.lock().clone();
                let mut cut_rx = cut_tx.subscribe();
                tokio::spawn(async move {
                    let Some(addr) = target(&managers).await else {
                        // No leader: closing makes the SDK back off and retry.
                        return;
                    };
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(addr).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        // Dropping both sockets mid-stream is the cut.
                        _ = cut_rx.changed() => {}
                    }
                });
            }
        });
        Proxy {
            port,
            cut,
            managers,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Route to `m` too (a new manager replica behind the same "Service").
    fn add(&self, m: &Manager) {
        self.managers.lock().push((m.http.clone(), m.grpc.clone()));
    }
}

/// Where a new connection goes: the only manager, or the one whose `/status` says it leads.
async fn target(managers: &[(String, String)]) -> Option<String> {
    if let [(_, grpc)] = managers {
        return Some(grpc.trim_start_matches("http://").to_string());
    }
    for (http, grpc) in managers {
        if is_leading(http).await {
            return Some(grpc.trim_start_matches("http://").to_string());
        }
    }
    None
}

/// One test's world: devcluster, the objects, and the controller replicas with their logs.
struct Scenario {
    c: Cluster,
    api: Api<ConfigMap>,
    rng: StdRng,
    logs: tempfile::TempDir,
    replicas: Vec<(String, Child)>,
    incarnations: usize,
    killed: HashMap<String, u64>,
    /// Names that exist (deleted ones are removed, never reused).
    live: Vec<String>,
    deleted: Vec<String>,
    next_name: usize,
}

impl Scenario {
    async fn new(seed: u64) -> Scenario {
        let c = start_cluster().await;
        namespace(&c.client, NS, &[]).await;
        let api = Api::namespaced(c.client.clone(), NS);
        let logs = tempfile::Builder::new()
            .prefix("ctrlhub-faults-")
            .tempdir()
            .expect("log dir");
        println!("reconcile logs in {}", logs.path().display());
        let mut s = Scenario {
            c,
            api,
            rng: StdRng::seed_from_u64(seed),
            logs,
            replicas: Vec::new(),
            incarnations: 0,
            killed: HashMap::new(),
            live: Vec::new(),
            deleted: Vec::new(),
            next_name: 0,
        };
        s.create(OBJECTS).await;
        s
    }

    fn log_path(&self, replica: &str) -> PathBuf {
        self.logs.path().join(format!("{replica}.log"))
    }

    /// Start one more replica process connected to `endpoint`.
    fn spawn_replica(&mut self, endpoint: &str) {
        self.incarnations += 1;
        let name = format!("r{}", self.incarnations);
        let child = tokio::process::Command::new(bin("fault-controller"))
            .args(["--manager", endpoint, "--name", &name, "--namespace", NS])
            .args(["--concurrency", "8", "--work-ms", "5", "--log"])
            .arg(self.log_path(&name))
            .env("RUST_LOG", "info,ctrlhub_sdk=debug")
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.logs.path().join(format!("{name}.stderr")))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .kill_on_drop(true)
            .spawn()
            .expect("fault-controller starts");
        self.replicas.push((name, child));
    }

    /// SIGKILL the replica at `index` and note when, for the overlap rule.
    async fn kill_replica(&mut self, index: usize) -> String {
        let (name, mut child) = self.replicas.remove(index);
        self.killed.insert(name.clone(), now_micros());
        let _ = child.kill().await;
        name
    }

    async fn create(&mut self, n: usize) {
        let names: Vec<String> = (0..n)
            .map(|_| {
                self.next_name += 1;
                format!("obj-{:05}", self.next_name)
            })
            .collect();
        let api = self.api.clone();
        futures::stream::iter(names.clone())
            .for_each_concurrent(16, |name| {
                let api = api.clone();
                async move {
                    let cm = ConfigMap {
                        metadata: kube::api::ObjectMeta {
                            name: Some(name.clone()),
                            ..Default::default()
                        },
                        data: Some(BTreeMap::from([("v".to_string(), "0".to_string())])),
                        ..Default::default()
                    };
                    api.create(&PostParams::default(), &cm)
                        .await
                        .unwrap_or_else(|e| panic!("create {name}: {e}"));
                }
            })
            .await;
        self.live.extend(names);
    }

    /// Update `n` random live objects (with repeats: several changes to one key collapse).
    async fn update(&mut self, n: usize) {
        let picks: Vec<(String, u64)> = (0..n)
            .map(|_| {
                let i = self.rng.random_range(0..self.live.len());
                (self.live[i].clone(), self.rng.random::<u64>())
            })
            .collect();
        let api = self.api.clone();
        futures::stream::iter(picks)
            .for_each_concurrent(16, |(name, v)| {
                let api = api.clone();
                async move {
                    let patch = serde_json::json!({"data": {"v": v.to_string()}});
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap_or_else(|e| panic!("update {name}: {e}"));
                }
            })
            .await;
    }

    /// Delete `n` random live objects.
    async fn delete(&mut self, n: usize) {
        for _ in 0..n {
            let i = self.rng.random_range(0..self.live.len());
            let name = self.live.swap_remove(i);
            self.api
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("delete {name}: {e}"));
            self.deleted.push(name);
        }
    }

    /// Every ConfigMap in the namespace (including any the cluster made itself) at its current
    /// resourceVersion, plus the deleted ones.
    async fn final_state(&self) -> BTreeMap<String, Option<String>> {
        let list = self
            .api
            .list(&ListParams::default())
            .await
            .expect("list configmaps");
        let mut out: BTreeMap<String, Option<String>> = list
            .items
            .into_iter()
            .filter_map(|cm| {
                let name = cm.metadata.name?;
                Some((format!("{NS}/{name}"), cm.metadata.resource_version))
            })
            .collect();
        for name in &self.deleted {
            out.insert(format!("{NS}/{name}"), None);
        }
        out
    }

    fn entries(&self) -> Vec<reconcile_log::Entry> {
        let mut all = Vec::new();
        let Ok(dir) = std::fs::read_dir(self.logs.path()) else {
            return all;
        };
        for f in dir.flatten() {
            if f.path().extension().is_none_or(|e| e != "log") {
                continue;
            }
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            match reconcile_log::parse(&text) {
                Ok(mut e) => all.append(&mut e),
                Err(err) => panic!("{}: {err}", f.path().display()),
            }
        }
        all
    }

    /// Wait until no key is lost any more, then assert both rules over the whole run.
    async fn settle_and_check(&self) {
        let started = Instant::now();
        let state = self.final_state().await;
        assert!(
            state.len() >= OBJECTS,
            "the scenario covers {} objects",
            state.len()
        );
        let mut last = Vec::new();
        while started.elapsed() < PATIENCE {
            let entries = self.entries();
            last = match reconcile_log::intervals(&entries, &self.killed) {
                Ok(by_key) => reconcile_log::lost_keys(&by_key, &state),
                Err(errors) => errors,
            };
            if last.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            last.is_empty(),
            "after {PATIENCE:?}, {} keys were not reconciled at their final state, e.g.:\n{}",
            last.len(),
            last.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
        );
        // In-flight reconciles at this point are repeats; let them end so that the overlap
        // check does not see them as open (an open one counts as overlapping anything later).
        let quiet = || {
            let entries = self.entries();
            let ok = reconcile_log::intervals(&entries, &self.killed)
                .map(|m| m.values().flatten().all(|iv| iv.end.is_some()))
                .unwrap_or(true);
            async move { ok }
        };
        wait_for("every reconcile has ended", quiet).await;
        let entries = self.entries();
        let violations = reconcile_log::check(&entries, &self.killed, &state);
        assert!(
            violations.is_empty(),
            "{} violations in {} log lines:\n{}",
            violations.len(),
            entries.len(),
            violations
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
        let starts = entries
            .iter()
            .filter(|e| e.kind == reconcile_log::Kind::Start)
            .count();
        println!(
            "{} keys checked, {starts} reconciles, {} replicas killed, settled in {:?}",
            state.len(),
            self.killed.len(),
            started.elapsed()
        );
    }

    /// Wait until replicas have started at least `n` reconciles after `since`, so the next
    /// fault lands while work is in flight.
    async fn wait_for_starts_after(&self, since: u64, n: usize) {
        wait_for("reconciles after the last change", || {
            let count = self
                .entries()
                .iter()
                .filter(|e| e.kind == reconcile_log::Kind::Start && e.ts > since)
                .count();
            async move { count >= n }
        })
        .await;
    }
}

impl Drop for Scenario {
    /// Keep the reconcile logs (and the replicas' stderr) of a failed test for diagnosis.
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Ok(empty) = tempfile::tempdir()
        {
            let kept = std::mem::replace(&mut self.logs, empty).keep();
            println!("reconcile logs kept in {}", kept.display());
        }
    }
}

#[tokio::test]
async fn replica_sigkill_repeatedly() {
    let _turn = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut s = Scenario::new(0x5eed_0001).await;
    let mut m = Manager::start(&s.c, "faults-kill", &[]).await;
    m.wait_leading().await;
    for _ in 0..3 {
        s.spawn_replica(&m.grpc);
    }
    for round in 0..8 {
        let since = now_micros();
        s.update(150).await;
        s.wait_for_starts_after(since, 20).await;
        let victim = s.rng.random_range(0..s.replicas.len());
        let name = s.kill_replica(victim).await;
        println!("round {round}: SIGKILLed {name}");
        s.spawn_replica(&m.grpc);
    }
    s.update(150).await;
    s.settle_and_check().await;
    m.stop().await;
    println!("replica_sigkill_repeatedly took {:?}", t0.elapsed());
}

#[tokio::test]
async fn grpc_connections_cut_mid_stream() {
    let _turn = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut s = Scenario::new(0x5eed_0002).await;
    let mut m = Manager::start(&s.c, "faults-cut", &[]).await;
    m.wait_leading().await;
    let proxy = Proxy::start(vec![(m.http.clone(), m.grpc.clone())]).await;
    for _ in 0..3 {
        s.spawn_replica(&proxy.endpoint());
    }
    for round in 0..8 {
        let since = now_micros();
        s.update(150).await;
        s.wait_for_starts_after(since, 20).await;
        proxy.cut();
        println!("round {round}: cut every gRPC connection");
    }
    s.update(150).await;
    s.settle_and_check().await;
    m.stop().await;
    println!("grpc_connections_cut_mid_stream took {:?}", t0.elapsed());
}

#[tokio::test]
async fn leader_manager_sigkill() {
    let _turn = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut s = Scenario::new(0x5eed_0003).await;
    let mut leader = Manager::start(&s.c, "faults-m1", &FAST_LEASE).await;
    leader.wait_leading().await;
    let mut standby = Manager::start(&s.c, "faults-m2", &FAST_LEASE).await;
    let proxy = Proxy::start(vec![
        (leader.http.clone(), leader.grpc.clone()),
        (standby.http.clone(), standby.grpc.clone()),
    ])
    .await;
    for _ in 0..3 {
        s.spawn_replica(&proxy.endpoint());
    }
    // Two handovers: m1 dies and m2 takes over, then a fresh m3 stands by and m2 dies.
    for round in 0..2 {
        let since = now_micros();
        s.update(300).await;
        s.wait_for_starts_after(since, 20).await;
        leader.kill().await;
        println!("round {round}: SIGKILLed leader {}", leader.identity);
        // Changes while nobody leads must not be lost.
        s.update(150).await;
        s.create(20).await;
        standby.wait_leading().await;
        let next = Manager::start(&s.c, &format!("faults-m{}", round + 3), &FAST_LEASE).await;
        proxy.add(&next);
        leader = std::mem::replace(&mut standby, next);
    }
    s.update(150).await;
    s.settle_and_check().await;
    standby.stop().await;
    leader.stop().await;
    println!("leader_manager_sigkill took {:?}", t0.elapsed());
}

#[tokio::test]
async fn devcluster_closes_every_watch() {
    let _turn = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut s = Scenario::new(0x5eed_0004).await;
    let mut m = Manager::start(&s.c, "faults-watch", &[]).await;
    m.wait_leading().await;
    for _ in 0..3 {
        s.spawn_replica(&m.grpc);
    }
    // Reconciled once: the informer's first watch is open, so later watches are re-watches.
    s.settle_and_check().await;
    let stats = s.c.dc.stats();
    let watches_before = stats.request_count("watch", "configmaps");
    let faults = s.c.dc.faults();
    for round in 0..10 {
        s.update(100).await;
        faults.close_watches();
        // Changes while the informer is reconnecting.
        s.update(50).await;
        s.delete(5).await;
        s.create(5).await;
        faults.close_watches();
        println!("round {round}: closed every watch twice");
    }
    wait_for("the informer watched again after the closes", || {
        let n = stats.request_count("watch", "configmaps");
        async move { n > watches_before }
    })
    .await;
    println!(
        "{} configmap re-watches during the faults",
        stats.request_count("watch", "configmaps") - watches_before
    );
    s.settle_and_check().await;
    m.stop().await;
    println!("devcluster_closes_every_watch took {:?}", t0.elapsed());
}

#[tokio::test]
async fn devcluster_forces_410_on_resume() {
    let _turn = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut s = Scenario::new(0x5eed_0005).await;
    let mut m = Manager::start(&s.c, "faults-410", &[]).await;
    m.wait_leading().await;
    for _ in 0..3 {
        s.spawn_replica(&m.grpc);
    }
    // Everything reconciled once: the informer's initial list is behind us, so every list
    // counted from here on is a relist.
    s.settle_and_check().await;
    namespace(&s.c.client, "elsewhere", &[]).await;
    let faults = s.c.dc.faults();
    let relists_before = s.c.dc.stats().request_count("list", "configmaps");
    for round in 0..8 {
        s.update(100).await;
        // A write the informer (scoped to NS) never sees moves the cluster's resourceVersion
        // past the informer's last one; compact, then end the watches: the resume from that
        // resourceVersion gets 410 Gone and the informer must relist. What changes meanwhile
        // (deletions too) must still reach the controller.
        put_configmap(
            &s.c.client,
            "elsewhere",
            "bump",
            &[("round", &round.to_string())],
        )
        .await;
        faults.compact();
        faults.close_watches();
        s.update(50).await;
        s.delete(10).await;
        s.create(5).await;
        println!("round {round}: compacted and closed every watch");
    }
    // Our own list calls come later (in settle_and_check), so every list so far is the
    // manager's informer recovering from a 410.
    let stats = s.c.dc.stats();
    wait_for("the 410s forced the informer to relist configmaps", || {
        let n = stats.request_count("list", "configmaps");
        async move { n > relists_before }
    })
    .await;
    let relists = stats.request_count("list", "configmaps") - relists_before;
    println!("{relists} configmap relists during the faults");
    s.settle_and_check().await;
    m.stop().await;
    println!("devcluster_forces_410_on_resume took {:?}", t0.elapsed());
}

/// FAST_LEASE's renew deadline.
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
/// FAST_LEASE's lease duration.
const LEASE_DURATION: Duration = Duration::from_secs(3);

#[tokio::test]
async fn leader_lease_partition() {
    partition(false).await;
}

/// The same partition with a standby that takes the lease once writes work again, while the
/// old leader stays up as a standby. The old leader is paused (SIGSTOP) over the heal so that the
/// standby is the one to take the lease, then resumed: it must stay a standby.
///
/// This once lost every change from the partition on: the SDK re-opened its stream on the same
/// HTTP/2 connection, which the Service/proxy had pinned to the old leader's pod, and the old
/// leader (now a standby) answered each attempt UNAVAILABLE without closing the connection. The
/// SDK now dials a new connection for every session.
#[tokio::test]
async fn leader_lease_partition_standby_takes_over() {
    partition(true).await;
}

/// Freeze the Lease, check the leader stopped dispatching by its renew deadline, heal, and
/// check every change was reconciled by whoever leads then (the standby, when there is one:
/// the old leader is paused over the heal, so the standby wins the lease).
async fn partition(with_standby: bool) {
    let _turn = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut s = Scenario::new(0x5eed_0006).await;
    let slow_retry = [
        "--lease-duration",
        "3s",
        "--renew-deadline",
        "2s",
        "--retry-period",
        "1500ms",
    ];
    let mut m1 = Manager::start(
        &s.c,
        "faults-p1",
        if with_standby {
            &slow_retry
        } else {
            &FAST_LEASE
        },
    )
    .await;
    m1.wait_leading().await;
    let mut m2 = if with_standby {
        Some(Manager::start(&s.c, "faults-p2", &FAST_LEASE).await)
    } else {
        None
    };
    let mut routes = vec![(m1.http.clone(), m1.grpc.clone())];
    routes.extend(m2.iter().map(|m| (m.http.clone(), m.grpc.clone())));
    let proxy = Proxy::start(routes).await;
    for _ in 0..3 {
        s.spawn_replica(&proxy.endpoint());
    }
    // Everything reconciled once, so that what follows is live work.
    s.settle_and_check().await;

    let faults = s.c.dc.faults();
    let since = now_micros();
    s.update(300).await;
    s.wait_for_starts_after(since, 20).await;
    faults.freeze_lease("default", "ctrlhub-leader");
    let frozen_at = now_micros();
    // Reads still work: the last renewTime that was written is the leader's last renewal.
    let leases: Api<Lease> = Api::namespaced(s.c.client.clone(), "default");
    // Keep changing objects during the partition: a leader that kept dispatching would
    // start reconciles for them.
    let writer_api = s.api.clone();
    let writer_names = s.live.clone();
    let stop_writing = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop_writing.clone();
        let mut rng = StdRng::seed_from_u64(0x5eed_0066);
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = &writer_names[rng.random_range(0..writer_names.len())];
                let patch = serde_json::json!({"data": {"v": format!("p{n}")}});
                n += 1;
                let _ = writer_api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    wait_for("the partitioned leader steps down", || async {
        m1.status().await["leading"] == serde_json::json!(false)
    })
    .await;
    let stepped_down_seen = now_micros();
    let lease = leases.get("ctrlhub-leader").await.expect("lease readable");
    let spec = lease.spec.unwrap_or_default();
    assert_eq!(
        spec.holder_identity.as_deref(),
        Some("faults-p1"),
        "nobody can write the frozen lease, so it still names the old leader"
    );
    let renewed = spec.renew_time.expect("renewTime").0;
    let renewed_micros = u64::try_from(renewed.as_microsecond()).unwrap_or(0);
    assert!(
        renewed_micros <= frozen_at + 1_000_000,
        "renewTime {renewed} should predate the freeze"
    );
    let renew_deadline = renewed_micros + RENEW_DEADLINE.as_micros() as u64;
    let lease_expiry = renewed_micros + LEASE_DURATION.as_micros() as u64;
    // Stay partitioned well past the lease expiry, so a leader that kept dispatching would show.
    let until = lease_expiry + 1_500_000;
    while now_micros() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if with_standby {
        // Both would race for the expired lease at the heal; the old leader must lose, so it
        // sleeps through it.
        m1.signal("STOP");
    }
    let unfrozen_at = now_micros();
    faults.unfreeze_lease("default", "ctrlhub-leader");
    stop_writing.store(true, Ordering::Relaxed);
    writer.await.expect("writer task");

    // Tolerance: the leader starts its renew-deadline clock when the renew *response* arrives
    // (after renewTime was stamped) and the controller logs a start when the request arrives;
    // both are loopback-short. The lease could be taken over only after the full lease
    // duration, a second later still.
    let tolerance = 250_000;
    let late: Vec<String> = s
        .entries()
        .iter()
        .filter(|e| {
            e.kind == reconcile_log::Kind::Start
                && e.ts > renew_deadline + tolerance
                && e.ts < unfrozen_at
        })
        .map(|e| {
            format!(
                "key {}: request {} started on {} at {} ({} ms after the renew deadline)",
                e.key,
                e.id,
                e.replica,
                e.ts,
                (e.ts - renew_deadline) / 1000
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "the partitioned leader kept dispatching after its renew deadline \
         (last renewal {renewed}, step-down observed {} ms after it):\n{}",
        (stepped_down_seen.saturating_sub(renewed_micros)) / 1000,
        late.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    let during = s
        .entries()
        .iter()
        .filter(|e| {
            e.kind == reconcile_log::Kind::Start && e.ts > frozen_at && e.ts <= renew_deadline
        })
        .count();
    println!(
        "partition: {during} reconciles started between the freeze and the renew deadline, none after"
    );

    // Healed: someone leads again and every change made during the partition is reconciled.
    match &m2 {
        Some(m2) => {
            m2.wait_leading().await;
            m1.signal("CONT");
        }
        None => m1.wait_leading().await,
    }
    s.settle_and_check().await;
    if with_standby {
        assert_eq!(
            m1.status().await["leading"],
            serde_json::json!(false),
            "the resumed old leader stays a standby"
        );
    }
    if let Some(m2) = m2.as_mut() {
        m2.stop().await;
    }
    m1.stop().await;
    println!(
        "partition (standby: {with_standby}) took {:?}",
        t0.elapsed()
    );
}

/// Hostile input rather than a fault: durations a registration may legally carry (any
/// non-negative protobuf Duration) must not stop dispatch. `Instant + Duration` panics on
/// overflow, and the dispatch loop computes `Instant::now() + resync_period`, so a resync period
/// of i64::MAX seconds once panicked the dispatch task. The manager caps resync periods at a
/// century; a request deadline that long is refused outright (tenants' deadlines are bounded).
#[tokio::test]
async fn huge_registration_durations_keep_dispatching() {
    let _turn = SERIAL.lock().await;
    let c = start_cluster().await;
    let mut m = Manager::start(&c, "faults-durations", &[]).await;
    m.wait_leading().await;
    put_configmap(&c.client, "default", "huge", &[("v", "0")]).await;
    let huge = prost_types::Duration {
        seconds: i64::MAX,
        nanos: 999_999_999,
    };
    let mut reg = register_configmaps("huge-resync", 1);
    reg.resync_period = Some(huge);
    let mut r = Replica::connect(&m.grpc, reg)
        .await
        .unwrap_or_else(|e| panic!("the manager accepts a huge resync period: {e}"));
    assert!(
        r.next(PATIENCE).await.is_some(),
        "with resync = i64::MAX seconds the controller never got a request"
    );
    let mut reg = register_configmaps("huge-deadline", 1);
    reg.request_deadline = Some(huge);
    match Replica::connect(&m.grpc, reg).await {
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
            assert!(s.message().contains("register.request_deadline"), "{s:?}");
        }
        Ok(_) => panic!("a century-long request deadline was accepted"),
    }
    m.stop().await;
}
